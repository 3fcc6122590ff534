"""Analytic profiles of Llama-style decoders from Hugging Face configs (no torch).

For models too big to build here (Llama-3-8B, Llama-3-70B): the shape is read from the same
``config.json`` that ``--model hf:CONFIG`` builds, and every layer's FLOPs, parameters and
saved activations come from the formulas below; time is priced on a device preset exactly as
:mod:`planner.profiling.analytic.gpt` prices GPT (each GEMM at the throughput its shape achieves,
:mod:`planner.profiling.analytic.gemm`, plus the memory-bound time of the bytes saved for
backward, via its ``analytic_layer``). The block's GEMMs per sample: Q ``s x h . h x a d``, K and
V ``s x h . h x k d``, the attention core as FlashAttention runs it (one fused causal kernel,
:func:`planner.profiling.analytic.gpt.attention_gemms`), O ``s x a d . a d x h``, gate and up
``s x h . h x I``, down ``s x I . I x h``.

Layers: ``embed`` (token embedding, no position embedding: rotary), ``block_0 ..
block_{L-1}``, ``head`` (final RMSNorm + LM head; untied unless ``tie_word_embeddings``).

Notation, per sample of ``s`` tokens: hidden ``h``, ``a`` query heads and ``k`` key/value
heads of width ``d`` (``head_dim``, default ``h / a``), MLP width ``I``
(``intermediate_size``), vocabulary ``V``, ``L`` blocks. A Llama block (Touvron et al.
2023) is ``x + attn(rmsnorm(x))`` then ``x + mlp(rmsnorm(x))`` with grouped-query attention
(Ainslie et al. 2023: ``k`` heads of keys and values shared by ``a / k`` query heads each),
rotary positions (Su et al. 2021) and a SwiGLU MLP (Shazeer 2020:
``down(silu(gate(x)) * up(x))``).

- Forward FLOPs of a block, 2 FLOPs per multiply-add, matmuls only (the counting of Narayanan
  et al. 2021 eq. 3, whose ``24 s h^2 + 4 s^2 h`` this becomes for ``k = a``, ``d a = h`` and a
  two-matrix ``4h`` MLP): Q and O projections ``2 x 2 s h a d``, K and V ``2 x 2 s h k d``,
  scores and values ``2 x 2 s^2 a d`` (the whole ``s x s`` square, as Narayanan et al. count
  it; a causal kernel skips half), SwiGLU ``3 x 2 s h I``::

      block_fwd = 4 s h a d + 4 s h k d + 4 s^2 a d + 6 s h I

  backward is 2 x forward plus FlashAttention's recomputation of the scores, ``2 s^2 a d``
  (:mod:`planner.profiling.analytic.attention`); the LM head ``2 s h V``; the embedding is a lookup (0). RMSNorm,
  rotary and SiLU are memory-bound (priced by bytes, see :mod:`planner.profiling.analytic.gpt`).
- Parameters of a block: ``h a d + 2 h k d + a d h`` (Q, K, V, O) ``+ 3 h I`` (gate, up,
  down) ``+ 2 h`` (two RMSNorm weights), plus biases where the config has them
  (``attention_bias``: Q, K, V, O; qwen2: Q, K, V; ``mlp_bias``); embedding ``V h``; head
  ``h + V h`` (the ``V h`` tied to the embedding when ``tie_word_embeddings``). 2 bytes each.
- Activations saved for backward by a block in bf16 training, counted tensor by tensor as
  Korthikanti et al. 2022 (sec. 4.1) count them, for the kernels Llama-3 is trained with:
  fused RMSNorm (saves its input; its per-token fp32 statistic, ``O(s)``, is not counted),
  FlashAttention (Dao et al. 2022, sec. 3.1: keeps Q, K, V, its output O and the fp32
  log-sum-exp per head and token, recomputes the ``s x s`` scores in backward), no dropout::

      block_saved = 8 s h          (inputs of the two RMSNorms, = the block input and the
                                    residual, and their outputs, the inputs of QKV and gate/up)
                  + 4 s a d        (Q after rotary; O, also the input of the O projection)
                  + 4 s k d        (K after rotary, V)
                  + 4 a s          (log-sum-exp, fp32)
                  + 8 s I          (gate output = SiLU input, SiLU output, up output,
                                    their product = input of down)

  (the ``5 a s^2`` of Korthikanti's eq. 1 is the materialised softmax of non-flash attention:
  at Llama-3's ``s = 8192`` it would be 10x everything else). A fully recomputed block keeps its
  input ``2 s h``; a selectively recomputed one (Korthikanti et al. 2022 sec. 4: the
  attention core re-run, ``4 s^2 a d`` FLOPs) frees only the log-sum-exp ``4 a s``. The head
  keeps its input (2 s h), the norm output (2 s h) and fp32 logits for the cross entropy
  (4 s V); the embedding keeps its int64 token ids (8 s). The head's memory-bound bytes: the
  final norm's, and torch's fp32 cross entropy counted kernel by kernel (``F.cross_entropy`` on
  the logits cast to fp32, as torchtitan and Hugging Face train: the cast, 2 + 4 V bytes per
  token, log-softmax's max, sum and write, 4 + 4 + 4 + 4, forward 22 V; backward, log-softmax's
  gradient, 4 + 4, and the cast back, 4 + 2, 14 V: :data:`CE_FWD_BYTES`). With
  ``fused_cross_entropy`` (Megatron-Bridge's Llama recipes set ``cross_entropy_fusion_impl =
  "te"``: Transformer Engine's ``parallel_cross_entropy`` Triton kernel on the bf16 logits) the
  forward reads the logits twice (the online max and sum, then the softmax gradient) and writes
  that gradient in place, 2 + 2 + 2 = 6 V; the backward scales it in place, 2 + 2 = 4 V
  (:data:`TE_CE_BYTES`); the head keeps the bf16 gradient buffer (2 s V) in place of fp32 logits.

The selective level (``selective``, :class:`~planner.artifacts.kinds.SelectiveUnit`): the
attention core, as above; or torchtitan's op-level selective activation checkpointing
(``ops``: its policy keeps the outputs of the attention kernel and of every other matmul of a
block, ``mm`` calls 1, 3, 5, 7 -- Q, V, gate, down -- and re-runs the rest: the K, O and up
projections and every element-wise op). A block so recomputed keeps its input ``2 s h``, Q's and
V's outputs ``2 s a d + 2 s k d``, the attention output and its log-sum-exp ``2 s a d + 4 a s``,
gate's output ``2 s I`` and down's ``2 s h``: it frees ``4 s h + 2 s k d + 6 s I`` of the
bytes above, and its backward re-runs the three GEMMs (``2 s h k d + 2 s a d h + 2 s h I``
FLOPs) and the element-wise work on the freed bytes. This unit is not the attention core:
context parallelism is not priced for such a profile (:func:`planner.profiling.analytic.sequence.sequence_shape`).

Tensor parallelism (``Layer.tp``, Megatron-LM's split, Shoeybi et al. 2019): Q, K, V, gate
and up split by columns (heads: ``t`` must divide ``a`` and ``k``), O and down by rows, so
every counted FLOP divides by ``t``; the split parameters are all the block's matmul weights
(``h a d + 2 h k d + a d h + 3 h I``; the two RMSNorm weights are replicated); of the saved
activations all but the ``8 s h`` of the norms' inputs and outputs (which include the block
input) split: ``4 s a d + 4 s k d + 4 a s + 8 s I``; two all-reduces of the block's ``2 s h``
output in forward and two in backward (Megatron's f/g). The embedding is vocabulary-parallel
(its ``V h`` table splits, its output is all-reduced in forward); the head's ``V h`` matmul
and fp32 logits split and its input gradient is all-reduced in backward.

Rule of thumb (Kaplan et al. 2020 sec. 2.1; Chowdhery et al. 2022 appendix B): training
FLOPs per token ~ ``6 N + 12 L s a d``; :func:`flops_per_token` gives the count above and the
ratio, which is below 1 by the embedding's ``6 V h`` (a lookup, not a matmul).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import AttentionKind, SelectiveUnit
from planner.artifacts.profile import Profile
from planner.models.flops import MODEL_FLOPS_CONVENTION, AttentionFlops, attention_fwd_flops
from planner.models.hf_spec import SIZE_LIMITS, read_config_file
from planner.profiling.analytic.attention import attention_core_cost
from planner.profiling.analytic.common import BYTES_PER_ACT, LayerSpec, MegatronSplit, analytic_profile
from planner.profiling.analytic.gemm import Gemm, GemmModel
from planner.profiling.analytic.gpt import attention_gemms, head_moved

#: memory-bound bytes per token and vocabulary entry of torch's fp32 cross entropy (module docstring)
CE_FWD_BYTES, CE_BWD_BYTES = 22.0, 14.0
#: the same of Transformer Engine's fused cross entropy on bf16 logits, forward and backward (module docstring)
TE_CE_BYTES = (6.0, 4.0)

__all__ = ["LLAMA_TYPES", "LlamaShape", "flops_per_token", "llama_profile", "llama_shape", "read_config"]

LLAMA_TYPES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True, slots=True, kw_only=True)
class LlamaShape:
    """The numbers of a Llama-style config the formulas use (module docstring notation)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    seq: int
    tied: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "seq"):
            if getattr(self, name) < 1:
                raise PlannerInputError(f"llama config: {name} must be >= 1 (got {getattr(self, name)})")
        if self.heads % self.kv_heads:
            raise PlannerInputError(f"llama config: num_key_value_heads {self.kv_heads} must divide num_attention_heads {self.heads}")

    def block_params(self) -> tuple[int, int]:
        """(all parameters of a block, its matmul weights)."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        matmul = h * q + 2 * h * kv + q * h + 3 * h * i
        bias = (q + 2 * kv if self.qkv_bias else 0) + (h if self.o_bias else 0) + (2 * i + h if self.mlp_bias else 0)
        return matmul + bias + 2 * h, matmul

    def param_count(self) -> int:
        """Parameters of the model (a tied head counted once)."""
        v_h = self.vocab * self.hidden
        return v_h + self.layers * self.block_params()[0] + self.hidden + (0 if self.tied else v_h)

    def block_fwd_flops(self, convention: AttentionFlops = MODEL_FLOPS_CONVENTION) -> float:
        """Forward FLOPs of a block per sample, attention counted by ``convention``
        (:mod:`planner.models.flops`; the planner's own: the whole ``s x s`` square)."""
        s, h, q, kv = self.seq, self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 4.0 * s * h * q + 4.0 * s * h * kv + attention_fwd_flops(s, q, convention) + 6.0 * s * h * self.intermediate

    def head_fwd_flops(self) -> float:
        return 2.0 * self.seq * self.hidden * self.vocab

    def block_gemms(self) -> tuple[Gemm, ...]:
        """The block's GEMMs per sample (module docstring): their FLOPs are :meth:`block_fwd_flops`."""
        s, h, a, d, i = self.seq, self.hidden, self.heads, self.head_dim, self.intermediate
        return (
            Gemm(name="q", m=s, n=a * d, k=h, split="n", window=0, bwd_window=0),
            Gemm(name="kv", m=s, n=self.kv_heads * d, k=h, count=2, split="n", window=0, bwd_window=0),
            *attention_gemms(s, a, d, flash=True),
            Gemm(name="o", m=s, n=h, k=a * d, split="k", window=0),
            Gemm(name="gate_up", m=s, n=i, k=h, count=2, split="n", window=1, bwd_window=1),
            Gemm(name="down", m=s, n=h, k=i, split="k", window=1),
        )

    def op_sac_unit(self) -> tuple[tuple[Gemm, ...], float]:
        """torchtitan's op-level selective checkpointing of a block (module docstring): the GEMMs
        it re-runs (K, O, up) and the bytes per sample it frees."""
        s, h, kd, i = self.seq, self.hidden, self.kv_heads * self.head_dim, self.intermediate
        gemms = {g.name: g for g in self.block_gemms()}
        k = Gemm(name="k", m=s, n=kd, k=h, split="n")
        up = Gemm(name="up", m=s, n=i, k=h, split="n")
        return (k, gemms["o"], up), 4.0 * s * h + 2.0 * s * kd + 6.0 * s * i

    def head_gemms(self) -> tuple[Gemm, ...]:
        return (Gemm(name="logits", m=self.seq, n=self.vocab, k=self.hidden, split="n", bwd_window=0),)

    def block_saved_bytes(self) -> tuple[float, float]:
        """(bytes a block saves for backward per sample, the part tensor parallelism splits)."""
        s, q, kv = self.seq, self.heads * self.head_dim, self.kv_heads * self.head_dim
        split = 4.0 * s * q + 4.0 * s * kv + 4.0 * self.heads * s + 8.0 * s * self.intermediate
        return 8.0 * s * self.hidden + split, split

    def model_flops_per_sample(self, convention: AttentionFlops = MODEL_FLOPS_CONVENTION) -> float:
        """Forward + backward FLOPs of one sample, no recomputation (MFU's model FLOPs)."""
        return 3.0 * (self.layers * self.block_fwd_flops(convention) + self.head_fwd_flops())


def read_config(path: str | Path) -> dict[str, Any]:
    """A Hugging Face ``config.json`` (or a directory holding one) as a dict (a regular UTF-8
    JSON file of bounded size: :func:`planner.models.hf_spec.read_config_file`)."""
    return read_config_file(path, f"--config {path}")


def _rope_theta(config: dict[str, Any], where: str) -> float:
    """The rotary base (``rope_theta``, or transformers 5's ``rope_parameters.rope_theta``); 0 if none."""
    params = config.get("rope_parameters")
    value = config.get("rope_theta") or (params.get("rope_theta") if isinstance(params, dict) else None) or 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1e30:
        raise PlannerInputError(f"{where}: rope_theta must be a number in [0, 1e30] (got {str(value)[:40]!r})")
    return float(value)


def _int(config: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlannerInputError(f"{where}: {key!r} must be an integer (got {str(value)[:40]!r})")
    limit = SIZE_LIMITS.get(key, 2**24)
    if not 1 <= value <= limit:
        raise PlannerInputError(f"{where}: {key!r} must be in [1, {limit:,}] (got {value})")
    return value


def llama_shape(config: dict[str, Any], seq: int | None = None, where: str = "llama config") -> LlamaShape:
    """The shape of a Llama-style (llama, mistral, qwen2) config dict; ``seq`` defaults to
    ``max_position_embeddings``."""
    model_type = config.get("model_type")
    if model_type not in LLAMA_TYPES:
        raise PlannerInputError(
            f"{where}: model_type {model_type!r} has no analytic profile (Llama-style only: {', '.join(LLAMA_TYPES)})"
        )
    heads = _int(config, "num_attention_heads", where)
    hidden = _int(config, "hidden_size", where)
    head_dim = _int(config, "head_dim", where) if config.get("head_dim") is not None else hidden // heads
    tokens = seq if seq is not None else _int(config, "max_position_embeddings", where)
    return LlamaShape(
        layers=_int(config, "num_hidden_layers", where),
        hidden=hidden,
        heads=heads,
        kv_heads=heads if config.get("num_key_value_heads") is None else _int(config, "num_key_value_heads", where),
        head_dim=int(head_dim),
        intermediate=_int(config, "intermediate_size", where),
        vocab=_int(config, "vocab_size", where),
        seq=tokens,
        tied=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
        o_bias=model_type != "qwen2" and bool(config.get("attention_bias", False)),
        mlp_bias=bool(config.get("mlp_bias", False)),
    )


def flops_per_token(shape: LlamaShape) -> tuple[float, float, float]:
    """(training FLOPs per token by the formulas above, ``6 N + 12 L s a d``, their ratio)."""
    ours = shape.model_flops_per_sample() / shape.seq
    rule = 6.0 * shape.param_count() + 12.0 * shape.layers * shape.seq * shape.heads * shape.head_dim
    return ours, rule, ours / rule


def llama_profile(
    config: dict[str, Any],
    *,
    seq: int | None = None,
    device_preset: str = "a100-80gb",
    gemm: GemmModel | None = None,
    model: str = "",
    source: str = "",
    selective: SelectiveUnit = SelectiveUnit.ATTENTION_CORE,
    fused_cross_entropy: bool = False,
) -> Profile:
    """An analytic Profile of a Llama-style config on a device preset (module docstring);
    ``source`` (the config's path) names it in refusals; ``gemm``: the device's GEMM model
    (default: the preset's fitted constants); ``selective``: what the blocks' selective level
    re-runs; ``fused_cross_entropy``: Transformer Engine's cross entropy in place of torch's fp32 one."""
    where = f"--config {source}" if source else "llama config"
    shape = llama_shape(config, seq, where)
    s, h, V = shape.seq, shape.hidden, shape.vocab
    act = BYTES_PER_ACT * s * h
    block_params, block_matmul = shape.block_params()
    block_saved, block_split = shape.block_saved_bytes()
    block = shape.block_gemms()
    core = attention_core_cost(AttentionKind.FLASH, seq=s, heads=shape.heads, head_dim=shape.head_dim)
    unit = ((attention_gemms(s, shape.heads, shape.head_dim, flash=True), core.saved_bytes)
            if selective is SelectiveUnit.ATTENTION_CORE else shape.op_sac_unit())

    def split(params: int, saved: float, fwd: int, bwd: int, divide: tuple[int, ...] = ()) -> MegatronSplit:
        return MegatronSplit(act_bytes_per_sample=act, params=params, saved_bytes_per_sample=saved,
                             collectives_fwd=fwd, collectives_bwd=bwd, must_divide=divide)

    layers: list[LayerSpec] = [
        LayerSpec(name="embed", kind="Embedding", gemms=(), split=split(V * h, 0.0, 1, 0), param_count=V * h,
                  saved_bytes_per_sample=8.0 * s, input_bytes_per_sample=8.0 * s, output_bytes_per_sample=act)
    ]
    for i in range(shape.layers):
        layers.append(
            LayerSpec(name=f"block_{i}", kind="LlamaDecoderLayer", gemms=block,
                      split=split(block_matmul, block_split, 2, 2, (shape.heads, shape.kv_heads)),
                      core=unit, param_count=block_params, saved_bytes_per_sample=block_saved,
                      input_bytes_per_sample=act, output_bytes_per_sample=act,
                      # W's inputs: q/kv's and gate_up's (the norms' outputs), o's, down's
                      wsaved_bytes_per_sample=2.0 * s * (2 * h + shape.heads * shape.head_dim + shape.intermediate))
        )
    ce_fwd, ce_bwd = TE_CE_BYTES if fused_cross_entropy else (CE_FWD_BYTES, CE_BWD_BYTES)
    logits = (2.0 if fused_cross_entropy else 4.0) * s * V  # what the cross entropy keeps for backward
    moved, bwd_moved = head_moved(act, s, V, ce_fwd, ce_bwd)
    layers.append(
        LayerSpec(name="head", kind="RMSNorm+Linear", gemms=shape.head_gemms(), split=split(V * h, logits, 0, 1),
                  moved=moved, bwd_moved=bwd_moved, param_count=V * h + h, saved_bytes_per_sample=2.0 * act + logits,
                  input_bytes_per_sample=act, output_bytes_per_sample=4.0, wsaved_bytes_per_sample=act)
    )
    ours, rule, ratio = flops_per_token(shape)
    return analytic_profile(
        model=model or f"llama-l{shape.layers}-h{h}-a{shape.heads}-k{shape.kv_heads}-i{shape.intermediate}-s{s}-v{V}",
        device_preset=device_preset,
        gemm=gemm,
        layers=layers,
        tied_params=V * h if shape.tied else 0,
        model_flops_per_sample=shape.model_flops_per_sample(),
        attention=AttentionKind.FLASH,
        about={
            "architecture": "llama",
            "model_type": str(config.get("model_type")),
            "selective_unit": selective.value,
            **({"cross_entropy": "te-fused"} if fused_cross_entropy else {}),
            "config_source": source,
        },
        formulas={
            "flops_source": "Narayanan et al. 2021 eq. 3 counting, with GQA (Ainslie et al. 2023) and SwiGLU (Shazeer 2020)",
            "activation_source": "Korthikanti et al. 2022 sec. 4.1 counting with FlashAttention (Dao et al. 2022) and fused RMSNorm",
            "layers": shape.layers,
            "hidden": h,
            "heads": shape.heads,
            "kv_heads": shape.kv_heads,
            "head_dim": shape.head_dim,
            "intermediate": shape.intermediate,
            "vocab": V,
            "seq": s,
            "tie_word_embeddings": shape.tied,
            "rope_theta": _rope_theta(config, where),
            "max_position_embeddings": (
                _int(config, "max_position_embeddings", where) if config.get("max_position_embeddings") is not None else 0
            ),
            "param_count": shape.param_count(),
            "train_flops_per_token": ours,
            "train_flops_per_token_6n_rule": rule,
            "flops_ratio_to_6n_rule": ratio,
        },
    )
