"""Event simulator: replay a plan's per-rank action orders with their dependencies.

The model (each rank's actions in the schedule's order, transfers, recomputation, the split
backward, the gradient synchronisation and what the stack overlaps, the optimizer step) is
the replay's, :mod:`planner.simulation.replay`; this module runs it over a Plan's stages (each
read into a :class:`~planner.cost.stage.StageTerms`) and builds the Timeline.

Definitions: ``compute_end_ms`` is the end of the last compute action; a rank's ``idle_ms``
is ``compute_end_ms - busy_ms`` (its bubble); ``bubble_fraction`` is
``sum(idle) / (ranks x compute_end_ms)`` -- ``(P-1)/(M+P-1)`` for uniform 1F1B;
``exposed_allreduce_ms`` is ``max(0, last all-reduce end - compute_end_ms)``, the part of the
gradient communication the pipeline does not hide.

Memory of a stage over time: static (params + grads + optimizer state + buffers, from
``PlanStage.memory``) + ``activation_bytes_per_microbatch`` x micro-batches in flight (a
micro-batch enters at its forward's start and leaves at its backward's end) + the recompute
workspace while a recomputed backward runs. A device's memory is the sum over its stages.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.artifacts.cluster import Cluster
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.plan import Plan, PlanStage
from planner.artifacts.profile import Profile
from planner.cost.stage import StageTerms
from planner.schedule import layout_schedule, validate_schedule
from planner.schedule.rules import check_schedule_rules
from planner.simulation.memory import memory_trace, rank_peak, summed_peak
from planner.simulation.replay import compiled_schedule, run_replay
from planner.simulation.timeline import ActionTiming, MemoryTrace, Segment, SegmentKind, StageTimeline, Timeline

__all__ = [
    "ActionTiming",
    "MemoryTrace",
    "Replayed",
    "Segment",
    "SegmentKind",
    "StageTimeline",
    "Summary",
    "Timeline",
    "check_schedule",
    "replay_plan",
    "simulate",
    "simulate_summary",
    "stage_terms_of",
]


# ---------------------------------------------------------------- the Plan path


@dataclass(frozen=True, slots=True)
class Replayed:
    """What a plan's replay gives :func:`simulate` and :func:`simulate_summary` alike: each
    action's start and end (flat ``stage x M + mb``; the W lists all 0 / -1 unless the
    schedule splits the backward), each rank's stages and the micro-batches it runs of each,
    its busy time, and the synchronisation and iteration end (:func:`_finish`)."""

    orders: tuple[tuple[tuple[int, int, int], ...], ...]
    fwd: list[float]
    full_bwd: list[float]
    fstart: list[float]
    fend: list[float]
    bstart: list[float]
    bend: list[float]
    wstart: list[float]
    wend: list[float]
    split: bool  # the schedule runs W apart
    free: list[float]
    last_b: list[float]
    ar_start: list[float]
    ar_end: list[float]
    iteration: float
    opt_stage: list[float]
    rank_stage_mbs: list[dict[int, list[int]]]
    stage_ranks: list[list[int]]
    rank_busy: list[float]

    @property
    def compute_end(self) -> float:
        return max(self.free)

    @property
    def rank_idle(self) -> list[float]:
        return [self.compute_end - b for b in self.rank_busy]

    @property
    def bubble_fraction(self) -> float:
        end = self.compute_end
        return (sum(self.rank_idle) / (len(self.orders) * end)) if end > 0 else 0.0

    @property
    def exposed_allreduce_ms(self) -> float:
        return max(0.0, max(self.ar_end) - self.compute_end)


def stage_terms_of(stage: PlanStage) -> StageTerms:
    """The terms a Plan's stage records (which :class:`PlanStage` has checked), as the replay reads
    them (the records the plan's stages were built from: :func:`planner.cost.stage.price_stage`)."""
    return StageTerms(fwd_ms=stage.fwd_ms, bwd_ms=stage.bwd_ms, recompute_ms=stage.recompute_ms,
                      wgrad_ms=stage.wgrad_ms, send_fwd_ms=stage.send_fwd_ms, send_bwd_ms=stage.send_bwd_ms,
                      allreduce_ms=stage.allreduce_ms, sync_early_ms=stage.sync_early_ms,
                      gather_ahead_ms=stage.gather_ahead_ms, gather_bound_ms=stage.gather_bound_ms,
                      optimizer_ms=stage.optimizer_ms, alltoall_ms=stage.alltoall_ms)


def replay_plan(plan: Plan, optimizer_ms: float = 0.0) -> Replayed:
    """Replay ``plan``'s schedule (its rules checked as :func:`simulate` checks them)."""
    kind, n, m, v = plan.schedule, plan.layout.num_stages, plan.num_microbatches, plan.layout.virtual_stages_per_rank
    reps = plan.layout.stage_replicas
    if not reps:
        check_schedule_rules(kind, n, m, v)
    schedule = compiled_schedule(kind, n, m, v, reps)
    orders = schedule.orders
    if len(plan.stages) != n:
        raise PlannerInputError(f"the plan has {len(plan.stages)} stages, its layout {n}")
    terms = [stage_terms_of(s) for s in plan.stages]
    fwd = [t.fwd_ms for t in terms]
    full_bwd = [t.bwd_ms + t.recompute_ms for t in terms]
    opt_stage = [t.optimizer_ms + optimizer_ms / v for t in terms]
    times, split, (last_b, ar_start, ar_end, iteration) = run_replay(kind, schedule, m, terms, opt_stage)
    fstart, fend, bstart, bend, wstart, wend, free = times
    # each rank's stages, and the micro-batches it runs of each (all of them unless a copy)
    rank_stage_mbs: list[dict[int, list[int]]] = [{} for _ in range(len(orders))]
    for r, ops in enumerate(orders):
        for s, code, mb in ops:
            if not code:
                rank_stage_mbs[r].setdefault(s, []).append(mb)
    stage_ranks: list[list[int]] = [[] for _ in range(n)]
    for r, by_stage in enumerate(rank_stage_mbs):
        for s in by_stage:
            stage_ranks[s].append(r)
    rank_busy = [sum(len(mbs) * (fwd[s] + full_bwd[s]) for s, mbs in by_stage.items()) for by_stage in rank_stage_mbs]
    return Replayed(orders, fwd, full_bwd, fstart, fend, bstart, bend, wstart, wend, split, free, last_b,
                    ar_start, ar_end, iteration, opt_stage, rank_stage_mbs, stage_ranks, rank_busy)


@dataclass(frozen=True, slots=True)
class Summary:
    """The figures of a replay a plan's prediction needs (:func:`simulate_summary`), each the
    same number :func:`simulate`'s :class:`Timeline` holds."""

    iteration_ms: float
    peak_memory_bytes: int
    bubble_fraction: float
    exposed_allreduce_ms: float


def simulate_summary(plan: Plan, *, optimizer_ms: float = 0.0) -> Summary:
    """:func:`simulate`'s iteration time, peak memory, bubble and exposed synchronisation,
    without the Timeline (no action list, no per-stage traces; each rank's peak by
    :func:`planner.simulation.memory.rank_peak`)."""
    r = replay_plan(plan, optimizer_ms)
    arrays = {name: np.asarray(getattr(r, name)) for name in ("fstart", "bstart", "bend", "wend")}
    peak = max(rank_peak(plan, by_stage, arrays, r.split) for by_stage in r.rank_stage_mbs)
    return Summary(iteration_ms=r.iteration, peak_memory_bytes=peak, bubble_fraction=r.bubble_fraction,
                   exposed_allreduce_ms=r.exposed_allreduce_ms)


def simulate(
    plan: Plan, profile: Profile | None = None, cluster: Cluster | None = None, *, optimizer_ms: float = 0.0
) -> Timeline:
    """Replay ``plan``'s schedule and return its :class:`Timeline`. Deterministic.

    The Plan carries every per-stage cost (from :mod:`planner.cost`); ``profile`` and
    ``cluster``, if given, are only checked against it (layer count, device count).
    ``optimizer_ms``: an optimizer step of one rank added to the one the plan prices (its
    stages' ``optimizer_ms``).
    """
    _check_context(plan, profile, cluster)
    kind, n, m = plan.schedule, plan.layout.num_stages, plan.num_microbatches
    schedule = layout_schedule(kind, plan.layout, m)
    r = replay_plan(plan, optimizer_ms)
    orders, fwd, full_bwd, st = r.orders, r.fwd, r.full_bwd, plan.stages
    fstart, bstart, bend = r.fstart, r.bstart, r.bend
    wend = r.wend if r.split else None
    by_code = ((r.fstart, r.fend), (r.bstart, r.bend), (r.wstart, r.wend), (r.bstart, r.bend))
    starts = tuple(tuple(by_code[c][0][s * m + mb] for s, c, mb in ops) for ops in orders)
    ends = tuple(tuple(by_code[c][1][s * m + mb] for s, c, mb in ops) for ops in orders)
    compute_end = r.compute_end
    rank_stage_mbs, stage_ranks, rank_busy, rank_idle = r.rank_stage_mbs, r.stage_ranks, r.rank_busy, r.rank_idle
    rank_traces = [
        [memory_trace(plan, s, rank, mbs, fstart, bstart, bend, wend) for s, mbs in by_stage.items()]
        for rank, by_stage in enumerate(rank_stage_mbs)
    ]
    rank_peaks = [summed_peak(trs) for trs in rank_traces]
    opt_stage = r.opt_stage
    opt_rank = [sum(opt_stage[s] for s in by_stage if stage_ranks[s][0] == rank)
                for rank, by_stage in enumerate(rank_stage_mbs)]
    # a stage's trace: its copy with the highest peak
    traces = tuple(
        max((tr for trs in rank_traces for tr in trs if tr.stage_idx == s), key=lambda tr: (tr.peak_bytes, -tr.rank))
        for s in range(n)
    )
    stages = tuple(
        StageTimeline(
            stage_idx=s, rank=stage_ranks[s][0], fwd_ms=fwd[s], bwd_ms=st[s].bwd_ms, recompute_ms=st[s].recompute_ms,
            wgrad_ms=st[s].wgrad_ms if r.split else 0.0,
            send_fwd_ms=st[s].send_fwd_ms, send_bwd_ms=st[s].send_bwd_ms,
            busy_ms=len(rank_stage_mbs[stage_ranks[s][0]][s]) * (fwd[s] + full_bwd[s]),
            idle_ms=rank_idle[stage_ranks[s][0]],
            last_backward_end_ms=r.last_b[s], allreduce_start_ms=r.ar_start[s], allreduce_end_ms=r.ar_end[s],
            peak_memory_bytes=traces[s].peak_bytes, peak_inflight_microbatches=traces[s].peak_inflight_microbatches,
            ranks=tuple(stage_ranks[s]) if len(stage_ranks[s]) > 1 else (),
        )
        for s in range(n)
    )
    return Timeline(
        schedule=kind, layout=plan.layout, num_ranks=len(orders), num_microbatches=m,
        orders=schedule, start_ms=starts, end_ms=ends, stages=stages, memory=traces,
        rank_busy_ms=tuple(rank_busy), rank_idle_ms=tuple(rank_idle), rank_peak_memory_bytes=tuple(rank_peaks),
        optimizer_ms=tuple(opt_rank), compute_end_ms=compute_end, iteration_ms=r.iteration,
        bubble_fraction=r.bubble_fraction, exposed_allreduce_ms=r.exposed_allreduce_ms,
        peak_memory_bytes=max(rank_peaks),
    )


def _check_context(plan: Plan, profile: Profile | None, cluster: Cluster | None) -> None:
    if profile is not None and len(profile.layers) != plan.num_layers:
        raise PlannerInputError(f"the profile has {len(profile.layers)} layers but the plan covers {plan.num_layers}")
    if cluster is not None and cluster.num_devices < plan.num_devices:
        raise PlannerInputError(f"the plan needs {plan.num_devices} devices but the cluster has {cluster.num_devices}")


def check_schedule(plan: Plan) -> None:
    """Dry-run ``plan``'s schedule (raises :class:`planner.schedule.ScheduleError`)."""
    validate_schedule(layout_schedule(plan.schedule, plan.layout, plan.num_microbatches),
                      plan.layout.num_stages, plan.num_microbatches, replicated=plan.layout.replicated_per_stage)
