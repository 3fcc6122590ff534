"""Lower bounds on iteration time, and the memory-efficiency (ME) index (a plan's model FLOPs
utilisation is :mod:`planner.simulation.predict`'s).

Two bounds, named for what they bound:

- the **machine bound** (:func:`machine_bound_ms`) bounds every plan of any partition,
  replication, schedule or recomputation on these devices: every sample of the global batch
  needs one forward and one backward through every layer, at best at the profile's fastest
  per-sample rate, spread perfectly over all ``N`` devices, with no bubble, no recomputation
  and no communication: ``G x min_b sum_l (f_l(b) + b_l(b)) / b / N``. The minimum runs over
  the profiled micro-batch sizes and every size a plan of this batch can use (the fitted
  lines extrapolate), so no plan the cost model prices can beat it. ``machine bound / time``
  is the fraction of the machine a plan uses ("limit/time" in the plan table).
- the **partition bound** (:func:`partition_bounds`) bounds only schedules of one plan's own
  stages, recomputation and communication; a plan at its partition bound can still be far
  from the machine bound.

Notation (DESIGN.md section 5): ``M`` micro-batches, ``R`` pipeline ranks, stage ``s`` does
``w_s = F_s + RC_s + B_s`` of compute per micro-batch.

- average work: ``M x sum_s w_s / R`` -- the total work of one data-parallel replica spread
  over its ``R`` devices (all replicas are identical, so this is total work / devices);
- busiest rank: ``M x sum_{s on r} w_s`` (= the stage's work when ``v = 1``);
- critical path through stage ``s``: micro-batch 0 must cross the stages before ``s``
  forward (``sum_{s'<s} F + send``) before ``s`` can start, ``s`` then works ``M x w_s``, and
  after its last backward that micro-batch's gradient must still cross the stages before it
  (``sum_{s'<s} RC + B + send``) -- or ``s``'s own all-reduce must run, whichever is longer
  (of the all-reduce, what the stack cannot run before the backward's end: ``allreduce_ms -
  sync_early_ms - gather_ahead_ms``).
  With the backward split (zero bubble), the gradient's path upstream runs only the
  input-gradient passes ``I = B - W``: the bound is ``sum_{s'<s} (F + send) + max(M w_s +
  all-reduce, M (w_s - W_s) + sum_{s'<s} (RC + I + send))`` (stage ``s``'s last I ends after
  its M forwards and M I passes; its W passes may trail it).
  Without communication and split this is DESIGN's ``max_s [sum_{s'<s} (F + B) + M (F_s + B_s)]``;
  communication and the all-reduce only tighten it. (Alpa, Zheng et al. 2022, uses the same
  ``M x`` bottleneck argument in its stage construction.)

The simulator can never beat the largest of these (tests check it on random stages).

ME index (the seed, TPDS 35(4) 2024): ``(throughput / reference throughput) /
(peak memory / reference peak memory)``; +80% throughput at -57% memory gives 1.80/0.43 = 4.19.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.artifacts.cluster import Cluster
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ChunkPlacement
from planner.artifacts.layout import Layout
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile

__all__ = [
    "LowerBounds",
    "machine_bound_ms",
    "me_index_of",
    "partition_bound_ms",
    "partition_bounds",
    "partition_bounds_from_arrays",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class LowerBounds:
    average_work_ms: float
    busiest_rank_ms: float
    critical_path_ms: float
    critical_stage_idx: int  # the stage that attains ``critical_path_ms``

    @property
    def lower_bound_ms(self) -> float:
        return max(self.average_work_ms, self.busiest_rank_ms, self.critical_path_ms)


def partition_bounds_from_arrays(
    num_microbatches: int,
    fwd_ms: Sequence[float],
    bwd_ms: Sequence[float],
    recompute_ms: Sequence[float] | None = None,
    send_fwd_ms: Sequence[float] | None = None,
    send_bwd_ms: Sequence[float] | None = None,
    allreduce_ms: Sequence[float] | None = None,
    virtual_stages_per_rank: int = 1,
    wgrad_ms: Sequence[float] | None = None,
    placement: ChunkPlacement = ChunkPlacement.LOOP,
) -> LowerBounds:
    """The bounds over per-stage arrays (``bwd_ms`` excludes ``recompute_ms``; ``wgrad_ms``:
    the part of it a zero-bubble schedule runs apart, off the gradient's path; ``placement``:
    which rank holds each chunk, :meth:`Layout.pipeline_rank`)."""
    n = len(fwd_ms)
    if n == 0 or num_microbatches < 1 or virtual_stages_per_rank < 1 or n % virtual_stages_per_rank:
        raise PlannerInputError(
            f"bounds need >= 1 stage, M >= 1 and stages divisible by v "
            f"(got {n} stages, M={num_microbatches}, v={virtual_stages_per_rank})"
        )
    zeros = [0.0] * n
    rc = recompute_ms if recompute_ms is not None else zeros
    sf = send_fwd_ms if send_fwd_ms is not None else zeros
    sb = send_bwd_ms if send_bwd_ms is not None else zeros
    ar = allreduce_ms if allreduce_ms is not None else zeros
    m = num_microbatches
    ranks = n // virtual_stages_per_rank
    work = [fwd_ms[s] + rc[s] + bwd_ms[s] for s in range(n)]
    rank_work = [0.0] * ranks
    layout = Layout(num_stages=n, virtual_stages_per_rank=virtual_stages_per_rank, placement=placement,
                    dp_degree=2 if placement is ChunkPlacement.MIRROR else 1)  # (DualPipe's copies: a pair)
    for s in range(n):
        rank_work[layout.pipeline_rank(s)] += work[s]
    best, best_s = -1.0, 0
    fwd_prefix = bwd_prefix = 0.0  # over stages < s, with the transfers between them and s
    for s in range(n):
        if wgrad_ms is None:
            path = fwd_prefix + m * work[s] + max(bwd_prefix, ar[s])
        else:
            path = fwd_prefix + max(m * work[s] + ar[s], m * (work[s] - wgrad_ms[s]) + bwd_prefix)
        if path > best:
            best, best_s = path, s
        fwd_prefix += fwd_ms[s] + sf[s]
        bwd_prefix += rc[s] + bwd_ms[s] - (wgrad_ms[s] if wgrad_ms is not None else 0.0) + (sb[s + 1] if s + 1 < n else 0.0)
    return LowerBounds(
        average_work_ms=m * sum(work) / ranks,
        busiest_rank_ms=m * max(rank_work),
        critical_path_ms=best,
        critical_stage_idx=best_s,
    )


def partition_bounds(plan: Plan) -> LowerBounds:
    """The bounds of ``plan``'s own stages (a stage replicated R times inside the pipeline does
    1/R of the micro-batches per device)."""
    st = plan.stages
    if plan.layout.replicated_per_stage:
        return _replicated_bounds(plan)
    return partition_bounds_from_arrays(
        plan.num_microbatches,
        [s.fwd_ms for s in st],
        [s.bwd_ms for s in st],
        [s.recompute_ms for s in st],
        [s.send_fwd_ms for s in st],
        [s.send_bwd_ms for s in st],
        [s.allreduce_ms - s.gather_ahead_ms - s.sync_early_ms for s in st],
        plan.layout.virtual_stages_per_rank,
        [s.wgrad_ms for s in st] if plan.schedule.splits_backward else None,
        plan.layout.placement,
    )


def _replicated_bounds(plan: Plan) -> LowerBounds:
    """Bounds of a pipeline replicated per stage: the busiest device does ``M / R_s`` micro-batches
    of its stage; the total work is spread over every device; micro-batch 0 crosses the stages
    before the busiest one forward first, and the last backward crosses them back after it."""
    st, m = plan.stages, plan.num_microbatches
    work = [s.fwd_ms + s.recompute_ms + s.bwd_ms for s in st]
    busiest = [m // s.replicas * w for s, w in zip(st, work)]
    best, best_s, fwd_prefix, bwd_prefix = -1.0, 0, 0.0, 0.0
    for idx, stage in enumerate(st):
        path = fwd_prefix + busiest[idx] + max(bwd_prefix, stage.allreduce_ms - stage.gather_ahead_ms - stage.sync_early_ms)
        if path > best:
            best, best_s = path, idx
        fwd_prefix += stage.fwd_ms + stage.send_fwd_ms
        bwd_prefix += stage.recompute_ms + stage.bwd_ms + (st[idx + 1].send_bwd_ms if idx + 1 < len(st) else 0.0)
    return LowerBounds(
        average_work_ms=m * sum(work) / plan.num_devices,
        busiest_rank_ms=max(busiest),
        critical_path_ms=best,
        critical_stage_idx=best_s,
    )


def partition_bound_ms(plan: Plan) -> float:
    return partition_bounds(plan).lower_bound_ms


def machine_bound_ms(profile: Profile, cluster: Cluster, global_batch: int, num_devices: int) -> float:
    """No plan on ``num_devices`` devices of ``cluster`` trains ``global_batch`` samples faster
    (see the module docstring)."""
    if global_batch < 1 or num_devices < 1:
        raise PlannerInputError(f"machine bound needs a batch and devices >= 1 (got {global_batch}, {num_devices})")
    sizes = set(profile.microbatch_sizes) | {b for b in range(1, global_batch + 1) if global_batch % b == 0}
    per_sample = min(
        sum(layer.fwd_ms(b) + layer.bwd_ms(b) for layer in profile.layers) / b for b in sorted(sizes)
    )
    return global_batch * per_sample / cluster.relative_speed / num_devices


def me_index_of(
    throughput: float, peak_memory_bytes: float, reference_throughput: float, reference_peak_memory_bytes: float
) -> float:
    """``(throughput / reference throughput) / (peak memory / reference peak memory)``."""
    if min(throughput, peak_memory_bytes, reference_throughput, reference_peak_memory_bytes) <= 0:
        raise PlannerInputError(
            "ME index needs positive throughputs and peak memories (got "
            f"{throughput}, {peak_memory_bytes}, {reference_throughput}, {reference_peak_memory_bytes})"
        )
    return (throughput / reference_throughput) / (peak_memory_bytes / reference_peak_memory_bytes)
