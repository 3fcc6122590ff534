"""Analytic profiles of GPT-style decoders for devices you do not have (no torch).

Layers: ``embed`` (token + position embedding), ``block_0 .. block_{L-1}``, ``head`` (final
layer norm + LM head, its weight tied to the token embedding).

Formulas, per sample of ``s`` tokens, hidden size ``h``, ``a`` heads, vocabulary ``V``:

- forward FLOPs of one transformer block: ``24 s h^2 + 4 s^2 h`` (Narayanan et al. 2021,
  "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", eq. 3:
  72 B s l h^2 (1 + s/6h + V/12hl) counts forward + backward + recompute = 4 x forward, with
  matmuls at 2 FLOPs per multiply-add; without recompute the backward is 2 x forward);
- forward FLOPs of the LM head: ``2 s h V`` (same source); the embedding is a lookup (0 FLOPs);
- time = FLOPs / (peak dense bf16 FLOP/s x achieved efficiency) + the memory-bound work: the
  element-wise kernels around the matmuls (layer norms, dropout, GeLU, softmax, residual adds)
  are bound by memory bandwidth (roofline, Williams et al. 2009), and the bytes they write in
  forward are the activations the layer saves for backward (below), which backward reads back
  and answers with gradients of the same size: ``saved / HBM bandwidth`` in forward, twice that
  in backward (device datasheet bandwidth). This is what makes small hidden sizes run below
  large ones (s h bytes against s h^2 FLOPs). The efficiency is recorded in the profile's
  metadata (default 0.5: Megatron-LM reports 52% of peak for GPT-3 175B on A100s, Narayanan et
  al. 2021 table 1; ``benchmarks/narayanan_table.py`` fits it to that table). Intercepts are 0
  (no launch overhead modelled);
- activations saved for backward by one block in 16-bit training without tensor/sequence
  parallelism: ``s h (34 + 5 a s / h)`` bytes (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", eq. 1); a recomputed block keeps its input
  ``2 s h`` bytes; the head keeps its input (2 s h), the norm output (2 s h) and fp32 logits
  for the softmax cross-entropy (4 s V);
- parameters: ``12 h^2 + 13 h`` per block (Narayanan et al. 2021), ``V h + s h`` for the
  embeddings, ``2 h`` for the final norm plus the tied ``V h`` head; 2 bytes each (bf16).

Tensor parallelism (``Layer.tp``, Megatron-LM's split, Shoeybi et al. 2019): a block's QKV
and first MLP matmuls split by columns, its projection and second MLP matmuls by rows, so
every counted FLOP divides by t, and so does the memory-bound work on the split activations
(the rest, on the ``10 s h`` replicated bytes, runs whole on each device unless sequence
parallel); its parameters but the two layer norms and the two
row-parallel biases (``6 h``) split, ``12 h^2 + 7 h``; of its saved activations
``24 s h + 5 a s^2`` bytes split (Korthikanti et al. 2022 eq. 2: ``s h (10 + 24/t + 5 a s /
h t)``); two all-reduces of the block's ``2 s h`` output in forward (after attention and
after the MLP) and two in backward (Megatron's f/g operators). The embedding and the head
are vocabulary-parallel (Megatron): the embedding's ``V h`` word table splits and its output
is all-reduced in forward; the head's ``V h`` matmul and its fp32 logits ``4 s V`` split,
its input's gradient is all-reduced in backward (the cross entropy's per-token all-reduces of
``O(s)`` bytes are not priced). Heads must divide by t.
"""

from __future__ import annotations

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.profile import Layer, Profile, TensorSplit
from planner.models.flops import block_fwd_flops, gpt_model_flops_per_sample, head_fwd_flops
from planner.profiling.analytic.common import (
    BYTES_PER_ACT,
    analytic_layer,
    assemble,
    device_rates,
    megatron_split,
)

# GPT-3 family, Brown et al. 2020 ("Language Models are Few-Shot Learners"), table 2.1.
GPT3_SIZES: dict[str, dict[str, int]] = {
    # GPT-3 XL lists 24 heads of 128 with d_model 2048 (24 x 128 != 2048); 16 heads of 128 fit.
    "gpt3-1.3b": dict(layers=24, hidden=2048, heads=16, seq=2048, vocab=50257),
    "gpt3-2.7b": dict(layers=32, hidden=2560, heads=32, seq=2048, vocab=50257),
    "gpt3-6.7b": dict(layers=32, hidden=4096, heads=32, seq=2048, vocab=50257),
    "gpt3-13b": dict(layers=40, hidden=5120, heads=40, seq=2048, vocab=50257),
    "gpt3-175b": dict(layers=96, hidden=12288, heads=96, seq=2048, vocab=50257),
}

def gpt_profile(
    *,
    layers: int,
    hidden: int,
    heads: int,
    seq: int,
    vocab: int,
    device_preset: str = "a100-80gb",
    efficiency: float = 0.5,
    model: str = "",
) -> Profile:
    """An analytic Profile of a GPT-style decoder on a device preset (see module docstring)."""
    if min(layers, hidden, heads, seq, vocab) < 1:
        raise PlannerInputError("--layers, --hidden, --heads, --seq and --vocab must all be >= 1")
    if hidden % heads:
        raise PlannerInputError(f"--hidden {hidden} is not divisible by --heads {heads}")
    device, flops_per_ms, bytes_per_ms = device_rates(device_preset, efficiency)
    s, h, a, V = seq, hidden, heads, vocab
    act_in = BYTES_PER_ACT * s * h
    block_fwd, head_fwd = block_fwd_flops(s, h), head_fwd_flops(s, h, V)

    def split(params: int, saved: float, fwd: int, bwd: int, divide: tuple[int, ...] = ()) -> TensorSplit:
        return megatron_split(act_in, params, saved, fwd, bwd, divide)

    out: list[Layer] = [
        analytic_layer(
            "embed", "Embedding", 0.0, 0.0, flops_per_ms, split(V * h, 0.0, 1, 0), bytes_per_ms,
            param_count=V * h + s * h, saved=8.0 * s, inp=8.0 * s, out=act_in,
        )
    ]
    for i in range(layers):
        out.append(
            analytic_layer(
                f"block_{i}", "TransformerBlock", block_fwd, 2 * block_fwd, flops_per_ms,
                split(12 * h * h + 7 * h, 24.0 * s * h + 5.0 * a * s * s, 2, 2, (a,)), bytes_per_ms,
                param_count=12 * h * h + 13 * h, saved=s * h * (34.0 + 5.0 * a * s / h), inp=act_in, out=act_in,
            )
        )
    out.append(
        analytic_layer(
            "head", "LayerNorm+Linear", head_fwd, 2 * head_fwd, flops_per_ms, split(V * h, 4.0 * s * V, 0, 1), bytes_per_ms,
            param_count=V * h + 2 * h, saved=2.0 * act_in + 4.0 * s * V, inp=act_in, out=4.0,
        )
    )
    return assemble(
        model=model or f"gpt-l{layers}-h{hidden}-a{heads}-s{s}-v{V}",
        device=device,
        layers=out,
        tied_params=V * h,
        model_flops_per_sample=gpt_model_flops_per_sample(layers=layers, hidden=hidden, seq=seq, vocab=vocab),
        metadata={
            "efficiency": efficiency,
            "peak_bf16_tflops": device.peak_bf16_tflops,
            "hbm_gb_per_s": device.hbm_gb_per_s,
            "peak_source": device.source,
            "flops_source": "Narayanan et al. 2021 (Megatron-LM), eq. 3",
            "activation_source": "Korthikanti et al. 2022, eq. 1 (no tensor/sequence parallelism)",
            "layers": layers,
            "hidden": hidden,
            "heads": heads,
            "seq": seq,
            "vocab": vocab,
        },
    )


def gpt3_profile(size: str, device_preset: str = "a100-80gb", efficiency: float = 0.5) -> Profile:
    """A GPT-3 family member by name (``gpt3-1.3b``, ``gpt3-13b``, ``gpt3-175b``, ...)."""
    if size not in GPT3_SIZES:
        raise PlannerInputError(f"unknown GPT-3 size {size!r} (known: {', '.join(GPT3_SIZES)})")
    return gpt_profile(**GPT3_SIZES[size], device_preset=device_preset, efficiency=efficiency, model=size)
