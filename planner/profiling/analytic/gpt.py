"""Analytic profiles of GPT-style decoders for devices you do not have (no torch).

Layers: ``embed`` (token + position embedding), ``block_0 .. block_{L-1}``, ``head`` (final
layer norm + LM head, its weight tied to the token embedding).

Formulas, per sample of ``s`` tokens, hidden size ``h``, ``a`` heads, vocabulary ``V``:

- forward FLOPs of one transformer block: ``24 s h^2 + 4 s^2 h`` (Narayanan et al. 2021,
  "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", eq. 3:
  72 B s l h^2 (1 + s/6h + V/12hl) counts forward + backward + recompute = 4 x forward, with
  matmuls at 2 FLOPs per multiply-add; without recompute the backward is 2 x forward);
- forward FLOPs of the LM head: ``2 s h V`` (same source); the embedding is a lookup (0 FLOPs);
- the block's matmuls one by one (per sample, ``d = h / a``): QKV ``s x h . h x 3h``, attention
  scores ``a`` products ``s x d . d x s``, values ``a`` products ``s x s . s x d``, projection
  ``s x h . h x h``, MLP ``s x h . h x 4h`` and ``s x 4h . 4h x h``; the head ``s x h . h x V``.
  Their FLOPs add up to the counts above;
- time = each GEMM's FLOPs at the throughput its shape achieves on the device
  (:mod:`planner.profiling.analytic.gemm`: a saturating roofline on the GEMM's arithmetic
  intensity, at most three constants per device, fitted on published runs and recorded in the
  profile's metadata) + the memory-bound work: the element-wise kernels around the matmuls
  (layer norms, dropout, GeLU, softmax, residual adds) are bound by memory bandwidth
  (roofline, Williams et al. 2009), and the bytes they write in forward are the activations the
  layer saves for backward (below), which backward reads back and answers with gradients of
  the same size: ``saved / achieved HBM bandwidth`` in forward, twice that in backward. This is
  what makes small hidden sizes run below large ones (s h bytes against s h^2 FLOPs, and GEMMs
  of smaller intensity). The time at micro-batch ``b`` (the GEMMs' ``s`` becomes ``b s``) is
  fitted as a line through ``b`` = 1 and 8 (no launch overhead modelled);
- activations saved for backward by one block in 16-bit training without tensor/sequence
  parallelism, by the attention kind (``attention=``, :mod:`planner.profiling.analytic.attention`):
  materialised ``s h (34 + 5 a s / h)`` bytes (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", eq. 1), FlashAttention (the default: what current
  stacks run) ``34 s h + 4 a s`` (no ``s x s`` tensor; the fp32 log-sum-exp instead, Dao et al.
  2022), whose backward recomputes the scores (``2 s^2 h`` FLOPs more);
- the three recompute levels of a block (Korthikanti et al. 2022 Table 2 and sec. 4): none
  keeps the above; selective re-runs the attention core (``4 s^2 h`` FLOPs and its saved bytes
  at HBM bandwidth) and keeps ``34 s h``; full re-runs the block and keeps its input ``2 s h``;
  the head keeps its input (2 s h), the norm output (2 s h) and fp32 logits
  for the softmax cross-entropy (4 s V);
- parameters: ``12 h^2 + 13 h`` per block (Narayanan et al. 2021), ``V h + s h`` for the
  embeddings, ``2 h`` for the final norm plus the tied ``V h`` head; 2 bytes each (bf16).

Tensor parallelism (``Layer.tp``, Megatron-LM's split, Shoeybi et al. 2019): a block's QKV
and first MLP matmuls split by columns, its projection and second MLP matmuls by rows, so
every counted FLOP divides by t, and so does the memory-bound work on the split activations
(the rest, on the ``10 s h`` replicated bytes, runs whole on each device unless sequence
parallel); its parameters but the two layer norms and the two
row-parallel biases (``6 h``) split, ``12 h^2 + 7 h``; of its saved activations
``24 s h`` plus the attention core's (``5 a s^2`` materialised, ``4 a s`` flash) split
(Korthikanti et al. 2022 eq. 2: ``s h (10 + 24/t + 5 a s / h t)``; Table 2: selective
``s h (10 + 24/t)``, with sequence parallelism everything ``/ t``);
two all-reduces of the block's ``2 s h`` output in forward (after attention and
after the MLP) and two in backward (Megatron's f/g operators). The embedding and the head
are vocabulary-parallel (Megatron): the embedding's ``V h`` word table splits and its output
is all-reduced in forward; the head's ``V h`` matmul and its fp32 logits ``4 s V`` split,
its input's gradient is all-reduced in backward (the cross entropy's per-token all-reduces of
``O(s)`` bytes are not priced). Heads must divide by t. On one of ``t`` devices each split GEMM
has its per-device shape (``3h / t`` columns, ``h / t`` rows, ``a / t`` heads, ...), hence its own
efficiency: the split records, per degree, that time against ``1/t`` of the whole and the GEMMs
beside each collective (QKV and projection beside the attention's, the MLP's two beside the
MLP's, forward; the weight gradients of QKV and of the first MLP matmul beside the backward
all-reduces of their inputs' gradients, Korthikanti et al. 2022 sec. 6.2; the head's weight
gradient beside its input gradient's), which a stack overlapping tensor-parallel communication
hides behind (``planner.cost.tensor_parallel``).
"""

from __future__ import annotations

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import AttentionKind
from planner.artifacts.profile import Profile
from planner.models.flops import gpt_model_flops_per_sample
from planner.profiling.analytic.attention import attention_core_cost
from planner.profiling.analytic.common import BYTES_PER_ACT, LayerSpec, MegatronSplit, analytic_profile
from planner.profiling.analytic.gemm import Gemm, GemmModel

# GPT-3 family, Brown et al. 2020 ("Language Models are Few-Shot Learners"), table 2.1.
GPT3_SIZES: dict[str, dict[str, int]] = {
    # GPT-3 XL lists 24 heads of 128 with d_model 2048 (24 x 128 != 2048); 16 heads of 128 fit.
    "gpt3-1.3b": dict(layers=24, hidden=2048, heads=16, seq=2048, vocab=50257),
    "gpt3-2.7b": dict(layers=32, hidden=2560, heads=32, seq=2048, vocab=50257),
    "gpt3-6.7b": dict(layers=32, hidden=4096, heads=32, seq=2048, vocab=50257),
    "gpt3-13b": dict(layers=40, hidden=5120, heads=40, seq=2048, vocab=50257),
    "gpt3-175b": dict(layers=96, hidden=12288, heads=96, seq=2048, vocab=50257),
}

#: memory-bound bytes per token and vocabulary entry of the LM head's fp32 cross entropy, forward and
#: backward, as Megatron-LM's vocabulary-parallel cross entropy runs it (module docstring)
CE_FWD_BYTES, CE_BWD_BYTES = 38.0, 14.0


def head_moved(act_bytes: float, seq: int, vocab: int, fwd_per_v: float, bwd_per_v: float) -> tuple[tuple[float, float], float]:
    """The LM head's memory-bound bytes per sample as :class:`LayerSpec` takes them: (forward
    (all, split by vocabulary parallelism), backward / forward): the final norm's input and output
    (``act_bytes`` each way; its backward twice) and the cross entropy's ``fwd_per_v`` / ``bwd_per_v``
    bytes per token per vocabulary entry."""
    fwd = 2.0 * act_bytes + fwd_per_v * seq * vocab
    bwd = 4.0 * act_bytes + bwd_per_v * seq * vocab
    return (fwd, fwd_per_v * seq * vocab), bwd / fwd


def attention_gemms(s: int, a: int, d: int, flash: bool) -> tuple[Gemm, ...]:
    """The attention core of ``a`` heads of width ``d``: the scores and values products, or
    with FlashAttention one fused causal pair (:class:`Gemm`: its intensity without the ``s x
    s`` scores, half the counted work executed, backward 2.5 x forward)."""
    if flash:
        return (Gemm(name="flash_attention", m=s, n=s, k=d, count=2 * a, batch="count", split="count", fused=True,
                     work_fraction=0.5, bwd_factor=2.5, weighted=False),)
    return (
        Gemm(name="scores", m=s, n=s, k=d, count=a, batch="count", split="count", weighted=False),
        Gemm(name="values", m=s, n=d, k=s, count=a, batch="count", split="count", weighted=False),
    )


def block_gemms(s: int, h: int, a: int, flash: bool = False) -> tuple[Gemm, ...]:
    """The GEMMs of one GPT block's forward per sample (module docstring), with their
    tensor-parallel split and the collective each may run beside."""
    return (
        Gemm(name="qkv", m=s, n=3 * h, k=h, split="n", window=0, bwd_window=0),
        *attention_gemms(s, a, h // a, flash),
        Gemm(name="proj", m=s, n=h, k=h, split="k", window=0),
        Gemm(name="fc1", m=s, n=4 * h, k=h, split="n", window=1, bwd_window=1),
        Gemm(name="fc2", m=s, n=h, k=4 * h, split="k", window=1),
    )


def head_gemms(s: int, h: int, vocab: int) -> tuple[Gemm, ...]:
    """The LM head's GEMM (vocabulary-parallel; its weight gradient beside the backward all-reduce)."""
    return (Gemm(name="logits", m=s, n=vocab, k=h, split="n", bwd_window=0),)


def gpt_profile(
    *,
    layers: int,
    hidden: int,
    heads: int,
    seq: int,
    vocab: int,
    device_preset: str = "a100-80gb",
    gemm: GemmModel | None = None,
    model: str = "",
    attention: AttentionKind | str = AttentionKind.FLASH,
) -> Profile:
    """An analytic Profile of a GPT-style decoder on a device preset (see module docstring):
    ``attention``: FlashAttention (default: the attention core one fused causal kernel, no ``s x
    s`` tensor saved or moved, :func:`attention_gemms`) or materialised scores (Korthikanti et
    al. 2022 eq. 1); ``gemm``: the device's GEMM model (default: the preset's fitted constants)."""
    if min(layers, hidden, heads, seq, vocab) < 1:
        raise PlannerInputError("--layers, --hidden, --heads, --seq and --vocab must all be >= 1")
    if hidden % heads:
        raise PlannerInputError(f"--hidden {hidden} is not divisible by --heads {heads}")
    core = attention_core_cost(attention, seq=seq, heads=heads, head_dim=hidden // heads)
    kind = core.kind
    flash = kind is AttentionKind.FLASH
    s, h, a, V = seq, hidden, heads, vocab
    act_in = BYTES_PER_ACT * s * h

    def split(params: int, saved: float, fwd: int, bwd: int, divide: tuple[int, ...] = ()) -> MegatronSplit:
        return MegatronSplit(act_bytes_per_sample=act_in, params=params, saved_bytes_per_sample=saved,
                             collectives_fwd=fwd, collectives_bwd=bwd, must_divide=divide)

    out: list[LayerSpec] = [
        LayerSpec(name="embed", kind="Embedding", gemms=(), split=split(V * h, 0.0, 1, 0), param_count=V * h + s * h,
                  saved_bytes_per_sample=8.0 * s, input_bytes_per_sample=8.0 * s, output_bytes_per_sample=act_in)
    ]
    block = block_gemms(s, h, a, flash)
    # bytes the element-wise kernels move: the saved activations; FlashAttention moves no s x s ones
    moved = (34.0 * s * h, 24.0 * s * h) if flash else None
    for i in range(layers):
        out.append(
            LayerSpec(
                name=f"block_{i}", kind="TransformerBlock", gemms=block,
                split=split(12 * h * h + 7 * h, 24.0 * s * h + core.saved_bytes, 2, 2, (a,)), moved=moved,
                core=(attention_gemms(s, a, h // a, flash), core.saved_bytes),
                param_count=12 * h * h + 13 * h, saved_bytes_per_sample=34.0 * s * h + core.saved_bytes,
                input_bytes_per_sample=act_in, output_bytes_per_sample=act_in,
                # W's inputs (Korthikanti et al. 2022 sec. 4.1): QKV's and fc1's (the layer norms'
                # outputs, 2sh each), the projection's (2sh) and fc2's (the GeLU's output, 8sh)
                wsaved_bytes_per_sample=14.0 * s * h,
            )
        )
    head_bytes, bwd_moved = head_moved(act_in, s, V, CE_FWD_BYTES, CE_BWD_BYTES)
    out.append(
        LayerSpec(
            name="head", kind="LayerNorm+Linear", gemms=head_gemms(s, h, V), split=split(V * h, 4.0 * s * V, 0, 1),
            moved=head_bytes, bwd_moved=bwd_moved, param_count=V * h + 2 * h,
            saved_bytes_per_sample=2.0 * act_in + 4.0 * s * V, input_bytes_per_sample=act_in,
            output_bytes_per_sample=4.0, wsaved_bytes_per_sample=act_in,
        )
    )
    return analytic_profile(
        model=model or f"gpt-l{layers}-h{hidden}-a{heads}-s{s}-v{V}",
        device_preset=device_preset,
        gemm=gemm,
        layers=out,
        tied_params=V * h,
        model_flops_per_sample=gpt_model_flops_per_sample(layers=layers, hidden=hidden, seq=seq, vocab=vocab),
        attention=kind,
        about={},
        formulas={
            "flops_source": "Narayanan et al. 2021 (Megatron-LM), eq. 3",
            "activation_source": (
                "Korthikanti et al. 2022, eq. 1 and Table 2"
                + (" with FlashAttention (Dao et al. 2022): no s x s tensor" if kind is AttentionKind.FLASH else "")
            ),
            "attention": kind.value,
            "layers": layers,
            "hidden": hidden,
            "heads": heads,
            "seq": seq,
            "vocab": vocab,
        },
    )


def gpt3_profile(
    size: str, device_preset: str = "a100-80gb", gemm: GemmModel | None = None,
    attention: AttentionKind | str = AttentionKind.FLASH,
) -> Profile:
    """A GPT-3 family member by name (``gpt3-1.3b``, ``gpt3-13b``, ``gpt3-175b``, ...)."""
    if size not in GPT3_SIZES:
        raise PlannerInputError(f"unknown GPT-3 size {size!r} (known: {', '.join(GPT3_SIZES)})")
    return gpt_profile(**GPT3_SIZES[size], device_preset=device_preset, gemm=gemm, model=size, attention=attention)
