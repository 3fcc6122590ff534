"""The attention core of an analytic transformer block: what it saves for backward, what its
forward costs, and what a FlashAttention backward adds (no torch).

The *attention core* is what Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models", sec. 4, selective activation recomputation) recompute: QK^T,
softmax, softmax dropout and attention over V. Its inputs Q, K, V and its output (the input
of the output projection) are kept by a selectively recomputed block; what the core saves
beyond them is freed and re-made in backward. Per sample of ``s`` tokens with ``a`` query
heads of width ``d`` (``q = a d``; ``q = h`` for GPT), 16-bit activations:

- forward FLOPs of the core: ``QK^T`` ``2 s^2 q`` + attention over V ``2 s^2 q`` =
  ``4 s^2 q`` (the ``4 s^2 h`` of Narayanan et al. 2021 eq. 3, the whole ``s x s`` square as
  they count it);
- materialised attention (:attr:`AttentionKind.MATERIALISED`) saves the softmax output
  (``2 a s^2`` bytes), the dropout mask (``a s^2``) and the dropout output (``2 a s^2``):
  ``5 a s^2`` bytes (Korthikanti et al. 2022 eq. 1's ``5 a s / h`` term); its backward is
  twice its forward in FLOPs;
- FlashAttention (:attr:`AttentionKind.FLASH`; Dao et al. 2022 sec. 3.1, alg. 2 and 4) saves
  no ``s x s`` tensor: beyond Q, K, V and the output only the fp32 log-sum-exp per head and
  token, ``4 a s`` bytes (the dropout mask is regenerated from the RNG state); its backward
  recomputes the scores ``QK^T`` from Q and K: ``2 s^2 q`` FLOPs more than a materialised
  backward (``10 s^2 q`` against ``8 s^2 q``, 2.5 x its forward, as Dao et al. count it).

The core's recompute time (the selective level's cost) is its forward priced like any
analytic layer: its GEMMs (:func:`planner.profiling.analytic.gpt.attention_gemms`, FlashAttention
one fused causal pair) at the GEMM model's throughput for their shapes plus its saved bytes at
the achieved HBM rate (:func:`planner.profiling.analytic.common.analytic_layer`). The flash
backward's extra work is priced there too (``Gemm.bwd_factor`` 2.5).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import AttentionKind

__all__ = ["ANALYTIC_ATTENTION", "AttentionCoreCost", "attention_core_cost", "parse_attention"]

#: the attention kinds an analytic profile can be built for
ANALYTIC_ATTENTION = (AttentionKind.FLASH, AttentionKind.MATERIALISED)


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionCoreCost:
    """One block's attention core per sample (see the module docstring)."""

    kind: AttentionKind
    fwd_flops: float
    saved_bytes: float  # what the core saves beyond Q, K, V and its output: freed by selective recomputation


def attention_core_cost(kind: AttentionKind | str, *, seq: int, heads: int, head_dim: int) -> AttentionCoreCost:
    """The attention core of a block for ``kind`` (module docstring; a name is read by
    :func:`parse_attention`)."""
    kind = parse_attention(kind)
    s, a, q = float(seq), float(heads), float(heads * head_dim)
    if kind is AttentionKind.MATERIALISED:
        return AttentionCoreCost(kind=kind, fwd_flops=4.0 * s * s * q, saved_bytes=5.0 * a * s * s)
    if kind is AttentionKind.FLASH:
        return AttentionCoreCost(kind=kind, fwd_flops=4.0 * s * s * q, saved_bytes=4.0 * a * s)
    raise PlannerInputError(f"--attention must be one of {[k.value for k in ANALYTIC_ATTENTION]} (got {kind.value!r})")


def parse_attention(value: str | AttentionKind) -> AttentionKind:
    """``flash`` or ``materialised`` as an :class:`AttentionKind` (one line naming the value if not)."""
    if isinstance(value, AttentionKind):
        kind = value
    else:
        try:
            kind = AttentionKind(value)
        except ValueError:
            kind = AttentionKind.UNKNOWN
    if kind not in ANALYTIC_ATTENTION:
        raise PlannerInputError(f"--attention must be one of {[k.value for k in ANALYTIC_ATTENTION]} (got {value!r})")
    return kind
