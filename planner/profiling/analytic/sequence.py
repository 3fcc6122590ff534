"""What an analytic GPT or Llama profile records that scales with its sequence.

The analytic profiles (:mod:`planner.profiling.analytic.gpt`, :mod:`~planner.profiling.analytic.llama`)
record their generator's parameters in their metadata: the sequence length ``seq``, the width
``hidden``, the head counts (``heads``; Llama's ``kv_heads`` and ``head_dim``) and the GEMM model's
constants (:meth:`GemmModel.of_metadata`). :func:`sequence_shape` reads them back as one
:class:`SequenceShape`, what context parallelism needs to split the sequence: which degrees cut it
(:mod:`planner.cost.context_degrees`) and the per-device view (:mod:`planner.cost.context`). A
measured or imported profile records none of them (None): it does not say which of its time is
token-wise and which is attention, nor its key/value bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from planner.artifacts.profile import Profile
from planner.profiling.analytic.attention import ANALYTIC_ATTENTION
from planner.profiling.analytic.gemm import GemmModel

__all__ = ["KV_BYTES_PER_VALUE", "SequenceShape", "sequence_shape"]

KV_BYTES_PER_VALUE = 2  # 16-bit keys and values, as the analytic profiles' activations


@dataclass(frozen=True, slots=True)
class SequenceShape:
    """What an analytic profile says scales with its sequence: ``seq`` tokens per sample, width
    ``hidden``, ``kv_heads`` key/value heads of ``head_dim``, its GEMM model, and one layer's keys
    and values for one sample (``2 seq kv_heads head_dim`` x :data:`KV_BYTES_PER_VALUE` bytes, on one
    device without tensor parallelism)."""

    seq: int
    hidden: int
    kv_heads: int
    head_dim: int
    gemm: GemmModel
    kv_bytes_per_sample: float


def _int(meta: Mapping[str, object], key: str, default: int = 0) -> int:
    value = meta.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def sequence_shape(profile: Profile) -> SequenceShape | None:
    """The sequence shape an analytic GPT or Llama profile records, or None (no declaration, or
    blocks whose selective unit is not the attention core)."""
    meta = dict(profile.metadata)
    if meta.get("selective_unit", "attention-core") != "attention-core":
        return None  # its blocks' selective unit is not the attention core the view splits
    seq, hidden, heads = _int(meta, "seq"), _int(meta, "hidden"), _int(meta, "heads")
    if min(seq, hidden, heads) < 1 or not any(layer.attention_core for layer in profile.layers):
        return None
    if profile.attention not in ANALYTIC_ATTENTION:
        return None
    gemm = GemmModel.of_metadata(meta)
    if gemm is None:
        return None
    kv_heads = _int(meta, "kv_heads", heads) or heads
    head_dim = _int(meta, "head_dim", hidden // heads) or hidden // heads
    return SequenceShape(seq=seq, hidden=hidden, kv_heads=kv_heads, head_dim=head_dim, gemm=gemm,
                         kv_bytes_per_sample=2.0 * seq * kv_heads * head_dim * KV_BYTES_PER_VALUE)
