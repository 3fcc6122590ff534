"""How a layer splits over tensor-parallel devices: :class:`TensorSplit` and its per-degree
refinements :class:`SplitDegree` (part of the Profile artifact, :mod:`planner.artifacts.profile`;
a module of its own so the profile module stays one job: the layer list and its file)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner.artifacts.kinds import SequenceParallelRuntime
from planner.artifacts.limits import MAX_BYTES, MAX_COUNT, check_count, check_nonneg, check_ranges


@dataclass(frozen=True, slots=True, kw_only=True)
class SplitDegree:
    """A layer's split work on one of ``degree`` tensor-parallel devices, where whoever built the
    profile knows it better than ``1/t`` of the whole (GEMMs whose achieved throughput depends on
    their per-device shape, :mod:`planner.profiling.analytic.gemm`).

    ``time_scale``: the split work takes ``time_scale x split_time_fraction x time / degree``
    (1 = the ``1/t`` rule). ``fwd_overlap`` / ``bwd_overlap``: per forward / backward collective
    of the layer, the time of the GEMMs that may run beside it, as a fraction of the split
    work's forward / backward time at this degree (a stack that overlaps tensor-parallel
    communication hides at most that much of each collective; empty: nothing).

    ``split_saved_bytes_per_sample``: what one of the ``degree`` devices saves of the layer's
    split bytes, where that is not ``1/t`` of them (measured profiles run the layer's shard at
    each degree its heads allow: with grouped-query attention and one key/value head per device,
    transformers' ``repeat_kv`` is a view, so the attention keeps one head's keys and values
    where the whole layer keeps a copy per query head); None = ``1/t``."""

    degree: int
    time_scale: float
    fwd_overlap: tuple[float, ...] = ()
    bwd_overlap: tuple[float, ...] = ()
    split_saved_bytes_per_sample: float | None = field(
        default=None, metadata={"doc": "what one device saves of the split bytes at this degree; null = 1/t of them",
                                "omit_if_default": True})

    def __post_init__(self) -> None:
        if self.degree < 2:
            raise ValueError(f"SplitDegree.degree must be >= 2 (got {self.degree})")
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ValueError(f"SplitDegree.time_scale must be > 0 (got {self.time_scale!r})")
        if any(not 0.0 <= f <= 1.0 for f in (*self.fwd_overlap, *self.bwd_overlap)):
            raise ValueError("SplitDegree overlap fractions must be in [0, 1]")
        if self.split_saved_bytes_per_sample is not None:
            check_ranges(0, MAX_BYTES, split_saved_bytes_per_sample=self.split_saved_bytes_per_sample)


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorSplit:
    """How a layer splits over ``t`` tensor-parallel devices (Megatron-LM: Shoeybi et al. 2019
    column/row split of attention and MLP; activations per Korthikanti et al. 2022).

    On each of the ``t`` devices, without sequence parallelism: ``split_time_fraction`` of the
    forward and backward time runs on 1/t of the work (the rest, e.g. layer norms and dropout,
    runs whole on every device); ``split_param_count`` parameters are divided by ``t`` (the rest
    is replicated); ``split_saved_bytes_per_sample`` of the saved activations are divided by
    ``t`` (the rest is replicated); the layer's input and output are whole. It runs
    ``collectives_fwd`` all-reduces of ``collective_bytes_per_sample`` in forward and
    ``collectives_bwd`` in backward, on the critical path.

    With sequence parallelism (Korthikanti et al. 2022 section 4.2.2) every all-reduce becomes
    a reduce-scatter + all-gather of the same bytes (the same ring time), and the remaining
    work, input and output are divided by ``t`` along the sequence. Saved activations depend on
    the runtime (``sequence_runtime``, :class:`~planner.artifacts.kinds.SequenceParallelRuntime`):
    Megatron-LM's divides all of them by ``t``; torch's DTensor split divides
    ``split_saved_bytes_per_sample + sequence_saved_bytes_per_sample`` by ``t`` and keeps the
    rest whole on every device (the all-gathered inputs of the column splits, masks).
    """

    must_divide: tuple[int, ...] = field(
        default=(), metadata={"doc": "sizes t must divide (attention heads, key/value heads)"}
    )
    split_time_fraction: float
    split_param_count: int
    split_saved_bytes_per_sample: float
    collective_bytes_per_sample: float
    collectives_fwd: int
    collectives_bwd: int
    sequence_runtime: SequenceParallelRuntime = field(
        default=SequenceParallelRuntime.MEGATRON,
        metadata={"doc": "whose sequence parallelism the saved bytes describe: megatron-lm (everything saved divides "
                         "by t) or torch-dtensor (split + sequence bytes divide by t, the rest stays whole)",
                  "omit_if_default": True},
    )
    sequence_saved_bytes_per_sample: float = field(
        default=0.0,
        metadata={"doc": "torch-dtensor: saved bytes outside the split ones that sequence parallelism divides by t "
                         "(those from the hidden stream: norm inputs, residuals); 0 for megatron-lm",
                  "omit_if_default": True},
    )
    degrees: tuple[SplitDegree, ...] = field(
        default=(), metadata={"doc": "per tensor-parallel degree, the split work's time and the GEMMs beside each "
                                     "collective (SplitDegree); a degree not listed follows the 1/t rule, nothing hidden"},
    )

    def degree(self, t: int) -> SplitDegree | None:
        """The entry of degree ``t``, if listed."""
        return next((d for d in self.degrees if d.degree == t), None)

    def __post_init__(self) -> None:
        for d in self.degrees:
            if len(d.fwd_overlap) not in (0, self.collectives_fwd) or len(d.bwd_overlap) not in (0, self.collectives_bwd):
                raise ValueError(
                    f"TensorSplit.degrees[t={d.degree}]: one overlap fraction per collective "
                    f"({self.collectives_fwd} forward, {self.collectives_bwd} backward)"
                )
        check_nonneg(
            "TensorSplit",
            split_param_count=self.split_param_count,
            split_saved_bytes_per_sample=self.split_saved_bytes_per_sample,
            sequence_saved_bytes_per_sample=self.sequence_saved_bytes_per_sample,
            collective_bytes_per_sample=self.collective_bytes_per_sample,
            collectives_fwd=self.collectives_fwd,
            collectives_bwd=self.collectives_bwd,
        )
        if not 0.0 <= self.split_time_fraction <= 1.0:
            raise ValueError(f"split_time_fraction must be in [0, 1] (got {self.split_time_fraction!r})")
        if any(n < 1 for n in self.must_divide):
            raise ValueError(f"must_divide sizes must be >= 1 (got {list(self.must_divide)})")
        for i, n in enumerate(self.must_divide):
            check_count(f"must_divide[{i}]", n, 1, MAX_COUNT)
        check_count("split_param_count", self.split_param_count)
        if self.sequence_runtime is SequenceParallelRuntime.MEGATRON and self.sequence_saved_bytes_per_sample:
            raise ValueError("TensorSplit.sequence_saved_bytes_per_sample must be 0 for sequence_runtime megatron-lm "
                             f"(everything saved divides by t; got {self.sequence_saved_bytes_per_sample!r})")
        check_ranges(0, MAX_BYTES, split_saved_bytes_per_sample=self.split_saved_bytes_per_sample,
                     sequence_saved_bytes_per_sample=self.sequence_saved_bytes_per_sample,
                     collective_bytes_per_sample=self.collective_bytes_per_sample)
        check_count("collectives_fwd", self.collectives_fwd, 0, 1000)
        check_count("collectives_bwd", self.collectives_bwd, 0, 1000)

    def sp_divided_bytes_per_sample(self, saved_bytes_per_sample: float) -> float:
        """Of a layer's ``saved_bytes_per_sample``, what sequence parallelism divides by t on this
        runtime: all of it (Megatron-LM), or the split and sequence bytes (torch's DTensor)."""
        if self.sequence_runtime is SequenceParallelRuntime.MEGATRON:
            return saved_bytes_per_sample
        return min(saved_bytes_per_sample, self.split_saved_bytes_per_sample + self.sequence_saved_bytes_per_sample)

    def device_split_bytes_per_sample(self, t: int) -> float:
        """What one of ``t`` devices saves of the split bytes per sample: the degree's measured
        figure where the profile lists one (:class:`SplitDegree`), else ``1/t`` of them."""
        entry = self.degree(t)
        if entry is not None and entry.split_saved_bytes_per_sample is not None:
            return entry.split_saved_bytes_per_sample
        return self.split_saved_bytes_per_sample / t
