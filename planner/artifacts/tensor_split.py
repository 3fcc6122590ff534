"""How a layer splits over tensor-parallel devices: :class:`TensorSplit` and its per-degree
refinements :class:`SplitDegree` (part of the Profile artifact, :mod:`planner.artifacts.profile`;
a module of its own so the profile module stays one job: the layer list and its file)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
    communication hides at most that much of each collective; empty: nothing)."""

    degree: int
    time_scale: float
    fwd_overlap: tuple[float, ...] = ()
    bwd_overlap: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.degree < 2:
            raise ValueError(f"SplitDegree.degree must be >= 2 (got {self.degree})")
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ValueError(f"SplitDegree.time_scale must be > 0 (got {self.time_scale!r})")
        if any(not 0.0 <= f <= 1.0 for f in (*self.fwd_overlap, *self.bwd_overlap)):
            raise ValueError("SplitDegree overlap fractions must be in [0, 1]")


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
    work, saved activations, input and output are all divided by ``t`` along the sequence.
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
        check_ranges(0, MAX_BYTES, split_saved_bytes_per_sample=self.split_saved_bytes_per_sample,
                     collective_bytes_per_sample=self.collective_bytes_per_sample)
        check_count("collectives_fwd", self.collectives_fwd, 0, 1000)
        check_count("collectives_bwd", self.collectives_bwd, 0, 1000)
