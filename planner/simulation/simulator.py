"""Event simulator: replay a plan's per-rank action orders with their dependencies.

Model (DESIGN.md section 5; the seed's gradient hiding, Hippie / TPDS 35(4) 2024):

- each pipeline rank runs its actions in the schedule's order (:mod:`planner.schedule`), one
  at a time; an action starts when the rank is free and its input has arrived:
  ``sF m`` after ``(s-1)F m`` ends plus stage ``s-1``'s ``send_fwd_ms``; ``sB m`` after
  ``(s+1)B m`` ends plus stage ``s+1``'s ``send_bwd_ms`` (the last stage after its own ``sF m``);
- a zero-bubble schedule splits each backward into ``sI m`` (input gradient: it waits for the
  gradient like ``sB m`` and sends it upstream; recomputation runs in it) and ``sW m`` (weight
  gradient, ``wgrad_ms`` of the stage's ``bwd_ms``), which waits only for its rank; a stage's
  gradients are complete, and its synchronisation may start, when its last W ends;
- a backward of a stage with recomputation first re-runs the checkpointed forward
  (``recompute_ms``, as ``torch.utils.checkpoint`` does once the gradient arrives), then the
  backward (``bwd_ms``); the two are separate segments of one action;
- transfers overlap compute (they occupy no compute time) and do not contend with each other;
- each stage's gradient all-reduce (``allreduce_ms``) starts when its last backward ends and
  overlaps the other stages' remaining work; all-reduces of stages sharing a rank (interleaved)
  run one after another on that rank's communication stream;
- what the plan's training stack overlaps (:mod:`planner.cost.overlap`): a stage's
  synchronisation may start ``sync_early_ms`` before its last backward ends (buckets reduced
  during that backward), so it ends at ``max(stream free, last backward end - sync_early_ms)``
  plus its duration; of ``allreduce_ms``, ``gather_ahead_ms`` (ZeRO's all-gather of the
  weights) runs instead at the start of the iteration, the rank's stages' gathers one after
  another in the order of their first forwards, and the stage's first forward on the rank
  ends no earlier than ``gather_bound_ms`` after its gather starts;
- the optimizer step of a rank (the sum of its stages' ``optimizer_ms``, priced by the cost
  model: :mod:`planner.cost.sharding`) runs once its compute and all-reduces are done; the
  iteration ends when every rank's step does.

All data-parallel pipelines (``dp_degree``) are identical, so one is simulated. A pipeline
replicated per stage is simulated rank by rank: copy ``r`` of stage ``s`` is one rank running
its share of the micro-batches (:func:`planner.schedule.build_replicated_schedule`); a stage's
gradient synchronisation starts when its last backward on any copy ends.

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

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from planner.artifacts.cluster import Cluster
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile
from planner.schedule import ActionKind, build_schedule, layout_schedule, validate_schedule
from planner.schedule.build import (
    check_replicated_rules,
    check_schedule_rules,
    interleaved_schedule_triples,
    replicated_triples,
)
from planner.simulation.memory import memory_trace, rank_peak, summed_peak
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
    "simulate_iteration_ms",
    "simulate_summary",
]


# ---------------------------------------------------------------- the core replay


@lru_cache(maxsize=256)
def _encoded(
    kind: ScheduleKind, num_stages: int, num_microbatches: int, v: int, replicas: tuple[int, ...] = ()
) -> tuple[tuple[tuple[int, int, int], ...], ...]:
    """The schedule as (stage, is_backward, mb) integer triples, for the tight loop.

    GPipe and 1F1B are generated directly as integers (the same orders as
    :mod:`planner.schedule.build`, a test checks it), interleaved ones from the integers its
    Actions are made of; zero-bubble orders go through the Actions."""
    m = num_microbatches
    if replicas:
        check_replicated_rules(kind, replicas, m)
        return replicated_triples(kind, replicas, m)
    if kind is ScheduleKind.GPIPE and v == 1:
        return tuple(
            tuple((s, False, i) for i in range(m)) + tuple((s, True, i) for i in range(m)) for s in range(num_stages)
        )
    if kind is ScheduleKind.ONE_F_ONE_B and v == 1 and m >= num_stages:
        orders = []
        for s in range(num_stages):
            warmup = min(m, num_stages - s)
            ops = [(s, False, i) for i in range(warmup)]
            for i in range(m):
                ops.append((s, True, i))
                if warmup + i < m:
                    ops.append((s, False, warmup + i))
            orders.append(tuple(ops))
        return tuple(orders)
    if kind is ScheduleKind.INTERLEAVED_1F1B:
        return interleaved_schedule_triples(num_stages, m, v)
    schedule = build_schedule(kind, num_stages, num_microbatches, v)
    return tuple(tuple((a.stage_idx, _CODE[a.kind], a.mb_idx) for a in acts) for acts in schedule)


#: the tight loop's action codes: 0 forward, 1 the pass that sends the input's gradient (B or
#: I), 2 the weight-gradient pass W
_CODE = {ActionKind.FORWARD: 0, ActionKind.BACKWARD: 1, ActionKind.BACKWARD_INPUT: 1, ActionKind.BACKWARD_WEIGHT: 2}


@dataclass(frozen=True, slots=True)
class _Compiled:
    """A schedule as the replay walks it: each rank's orders (:func:`_encoded`), every action
    in one order the replay can follow (:func:`_flat_order`), and each stage's first rank (the
    ranks holding a copy: the first, whose stream runs its synchronisation)."""

    orders: tuple[tuple[tuple[int, int, int], ...], ...]
    flat: tuple[tuple[int, int, int, int], ...]
    first_rank: tuple[int, ...]


@lru_cache(maxsize=128)
def _compiled(
    kind: ScheduleKind, num_stages: int, num_microbatches: int, v: int, replicas: tuple[int, ...] = ()
) -> _Compiled:
    orders = _encoded(kind, num_stages, num_microbatches, v, replicas)
    first_rank = [-1] * num_stages
    for r, ops in enumerate(orders):
        for s, _, _ in ops:
            if first_rank[s] < 0:
                first_rank[s] = r
    return _Compiled(orders, _flat_order(orders, num_stages, num_microbatches), tuple(first_rank))


def _flat_order(
    orders: tuple[tuple[tuple[int, int, int], ...], ...], num_stages: int, num_microbatches: int
) -> tuple[tuple[int, int, int, int], ...]:
    """Every action of ``orders`` as ``(rank, stage, code, stage x M + mb)``, in an order where
    each comes after its rank's previous action and after the action whose output it waits
    for: the ranks advanced round-robin as far as their inputs allow (what the replay needs is
    known from the orders alone, not the times). A full pass without progress is a deadlock
    (impossible for orders that pass ``validate_schedule``)."""
    m, last = num_microbatches, num_stages - 1
    done_f = [False] * (num_stages * m)
    done_b = [False] * (num_stages * m)
    heads = [0] * len(orders)
    out: list[tuple[int, int, int, int]] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progress = 0
        for r, ops in enumerate(orders):
            i = heads[r]
            while i < len(ops):
                s, code, mb = ops[i]
                k = s * m + mb
                if code == 2:
                    if not done_b[k]:
                        break
                elif not code:
                    if s and not done_f[k - m]:
                        break
                    done_f[k] = True
                else:
                    if not (done_b[k + m] if s < last else done_f[k]):
                        break
                    done_b[k] = True
                out.append((r, s, code, k))
                i += 1
            progress += i - heads[r]
            heads[r] = i
        if not progress:
            raise PlannerInputError("schedule deadlocks; run planner.schedule.validate_schedule for the step and rank")
        remaining -= progress
    return tuple(out)


def _replay(
    flat: tuple[tuple[int, int, int, int], ...],
    num_ranks: int,
    m: int,
    fwd: Sequence[float],
    bwd: Sequence[float],
    send_fwd: Sequence[float],
    send_bwd: Sequence[float],
    fwd_min_end: Sequence[float] | None = None,
    wgrad: Sequence[float] | None = None,
) -> tuple[list[float], list[float], list[float], list[float], list[float], list[float], list[float]]:
    """Start/end of every forward, backward (B or I) and W (flat ``stage x M + mb``), and each
    rank's free time, one pass over ``flat`` (:func:`_flat_order`).

    ``bwd`` includes recompute (for a split backward: the I pass, recompute included; ``wgrad``
    the W pass, which waits only for its rank); ``fwd_min_end`` (flat, optional) the earliest end of each
    forward (a stage's first forward waiting for its weights' gather). An action starts when its
    rank is free and its input has arrived: ``sF m`` after ``(s-1)F m`` ends plus
    ``send_fwd[s - 1]``, ``sB m`` after ``(s+1)B m`` ends plus ``send_bwd[s + 1]`` (the last
    stage after its own ``sF m``), ``sW m`` when its rank is free.
    """
    n = len(fwd)
    last = n - 1
    gate = fwd_min_end if fwd_min_end is not None else [0.0] * (n * m)
    fstart = [0.0] * (n * m)
    fend = [-1.0] * (n * m)
    bstart = [0.0] * (n * m)
    bend = [-1.0] * (n * m)
    wstart = [0.0] * (n * m)
    wend = [-1.0] * (n * m)
    wtime = wgrad if wgrad is not None else [0.0] * n
    free = [0.0] * num_ranks
    for r, s, code, k in flat:
        t = free[r]
        if code == 2:
            wstart[k] = t
            t += wtime[s]
            wend[k] = t
        elif not code:
            if s:
                d = fend[k - m] + send_fwd[s - 1]
                if d > t:
                    t = d
            fstart[k] = t
            t += fwd[s]
            if t < gate[k]:
                t = gate[k]
            fend[k] = t
        else:
            d = bend[k + m] + send_bwd[s + 1] if s < last else fend[k]
            if d > t:
                t = d
            bstart[k] = t
            t += bwd[s]
            bend[k] = t
        free[r] = t
    return fstart, fend, bstart, bend, wstart, wend, free


def _finish(
    schedule: _Compiled,
    m: int,
    bend: list[float],
    free: list[float],
    allreduce: Sequence[float],
    optimizer: Sequence[float],
    early: Sequence[float] | None = None,
    gather_ahead: Sequence[float] | None = None,
) -> tuple[list[float], list[float], list[float], float]:
    """All-reduce start/end per stage (serialised per rank, by readiness), and iteration end.
    A stage on several ranks (copies) has its collective on its first rank's stream. A stage's
    synchronisation may start ``early[s]`` before its last backward ends; ``gather_ahead[s]``
    of it ran at the start of the iteration instead (see the module docstring)."""
    n = len(allreduce)
    orders, rank_of = schedule.orders, schedule.first_rank
    last_b = [max(bend[s * m : (s + 1) * m]) for s in range(n)]
    ready = [last_b[s] - early[s] for s in range(n)] if early is not None else last_b
    post = [allreduce[s] - gather_ahead[s] for s in range(n)] if gather_ahead is not None else allreduce
    ar_start = [0.0] * n
    ar_end = [0.0] * n
    comm_free = [0.0] * len(orders)
    for s in sorted(range(n), key=lambda s: (ready[s], s)):
        r = rank_of[s]
        ar_start[s] = max(ready[s], comm_free[r])
        ar_end[s] = ar_start[s] + post[s]
        comm_free[r] = ar_end[s]
    rank_opt = [0.0] * len(orders)
    for s in range(n):
        rank_opt[rank_of[s]] += optimizer[s]
    iteration = max(max(free[r], comm_free[r]) + rank_opt[r] for r in range(len(orders)))
    return last_b, ar_start, ar_end, iteration


def _check_lengths(num_stages: int, **arrays: Sequence[float]) -> None:
    for name, arr in arrays.items():
        if len(arr) != num_stages:
            raise PlannerInputError(f"{name} has {len(arr)} entries, expected one per stage ({num_stages})")
        if any(not (x >= 0.0) for x in arr):  # also rejects NaN
            raise PlannerInputError(f"{name} must be >= 0 (got {list(arr)})")


def simulate_iteration_ms(
    schedule_kind: ScheduleKind,
    num_microbatches: int,
    fwd_ms: Sequence[float],
    bwd_ms: Sequence[float],
    recompute_ms: Sequence[float],
    send_fwd_ms: Sequence[float],
    send_bwd_ms: Sequence[float],
    allreduce_ms: Sequence[float],
    virtual_stages_per_rank: int = 1,
    optimizer_ms: Sequence[float] | None = None,
    replicas: Sequence[int] = (),
    sync_early_ms: Sequence[float] | None = None,
    gather_ahead_ms: Sequence[float] | None = None,
    gather_bound_ms: Sequence[float] | None = None,
    wgrad_ms: Sequence[float] | None = None,
) -> float:
    """Iteration time of one schedule over per-stage times, without building a Plan or a Timeline.

    Same model as :func:`simulate` (which calls the same replay); for the solver's re-scoring.
    ``bwd_ms`` excludes ``recompute_ms``; ``send_fwd_ms[s]`` is stage s -> s+1,
    ``send_bwd_ms[s]`` is stage s -> s-1 (the last and first entries are unused); ``replicas``:
    each stage's copies when replicated per stage (``num_microbatches`` is then global); the
    next three: what the stack overlaps (:class:`~planner.artifacts.plan.PlanStage`'s fields
    of the same names; None: nothing); ``wgrad_ms``: the part of ``bwd_ms`` that is the
    weight-gradient pass W, run apart when the schedule splits the backward (ignored otherwise).
    """
    n = len(fwd_ms)
    opt = optimizer_ms if optimizer_ms is not None else [0.0] * n
    zeros = [0.0] * n
    early = sync_early_ms if sync_early_ms is not None else zeros
    ahead = gather_ahead_ms if gather_ahead_ms is not None else zeros
    bound = gather_bound_ms if gather_bound_ms is not None else zeros
    _check_lengths(
        n, bwd_ms=bwd_ms, recompute_ms=recompute_ms, send_fwd_ms=send_fwd_ms, send_bwd_ms=send_bwd_ms,
        allreduce_ms=allreduce_ms, optimizer_ms=opt, fwd_ms=fwd_ms, sync_early_ms=early, gather_ahead_ms=ahead,
        gather_bound_ms=bound,
    )
    reps = tuple(replicas) if replicas and max(replicas) > 1 else ()
    schedule = _compiled(schedule_kind, n, num_microbatches, virtual_stages_per_rank, reps)
    _, _, finished = _run(schedule_kind, schedule, num_microbatches, fwd_ms, bwd_ms, recompute_ms, send_fwd_ms,
                          send_bwd_ms, allreduce_ms, opt, early, ahead, bound, wgrad_ms)
    return finished[3]


def _run(
    kind: ScheduleKind, schedule: _Compiled, m: int, fwd: Sequence[float], bwd: Sequence[float],
    recompute: Sequence[float], send_fwd: Sequence[float], send_bwd: Sequence[float], allreduce: Sequence[float],
    optimizer: Sequence[float], early: Sequence[float], ahead: Sequence[float], bound: Sequence[float],
    wgrad: Sequence[float] | None,
) -> tuple[tuple[list[float], ...], bool, tuple[list[float], list[float], list[float], float]]:
    """The replay (:func:`_replay`: its seven lists) of per-stage times (``bwd`` without
    recomputation), whether W ran apart, and the synchronisation pass (:func:`_finish`)."""
    first, second = _split_backward(kind, bwd, recompute, wgrad)
    gate = _gather_gate(schedule.orders, m, ahead, bound)
    times = _replay(schedule.flat, len(schedule.orders), m, fwd, first, send_fwd, send_bwd, gate, second)
    finished = _finish(schedule, m, _grads_done(times[3], times[5]), times[6], allreduce, optimizer, early, ahead)
    return times, second is not None, finished


def _split_backward(
    kind: ScheduleKind, bwd_ms: Sequence[float], recompute_ms: Sequence[float], wgrad_ms: Sequence[float] | None
) -> tuple[list[float], list[float] | None]:
    """(the pass that sends the gradient: B, or I with recomputation; W or None) per stage."""
    if not kind.splits_backward or wgrad_ms is None:
        return [b + rc for b, rc in zip(bwd_ms, recompute_ms)], None
    _check_lengths(len(bwd_ms), wgrad_ms=wgrad_ms)
    if any(w > b + 1e-9 for w, b in zip(wgrad_ms, bwd_ms)):
        raise PlannerInputError(f"wgrad_ms must not exceed bwd_ms (got {list(wgrad_ms)} > {list(bwd_ms)})")
    return [max(0.0, b - w) + rc for b, w, rc in zip(bwd_ms, wgrad_ms, recompute_ms)], list(wgrad_ms)


def _grads_done(bend: list[float], wend: list[float]) -> list[float]:
    """When each micro-batch's gradients are complete: its backward, or its W when split."""
    return [w if w > b else b for b, w in zip(bend, wend)]


def _gather_gate(
    orders: tuple[tuple[tuple[int, int, int], ...], ...], m: int, ahead: Sequence[float], bound: Sequence[float]
) -> list[float] | None:
    """Earliest end of each forward (flat ``stage x M + mb``) when the stack gathers ZeRO's
    weights ahead of the forward: a rank gathers its stages one after another from the start of
    the iteration, in the order of their first forwards, and each stage's first forward on the
    rank ends no earlier than ``bound`` after its own gather starts (None: no gather ahead)."""
    if not any(ahead):
        return None
    gate = [0.0] * (len(ahead) * m)
    for ops in orders:
        started = 0.0
        seen: set[int] = set()
        for s, code, mb in ops:
            if code or s in seen:
                continue
            seen.add(s)
            if ahead[s] > 0.0:
                gate[s * m + mb] = started + bound[s]
                started += ahead[s]
    return gate


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


def replay_plan(plan: Plan, optimizer_ms: float = 0.0) -> Replayed:
    """Replay ``plan``'s schedule (its rules checked as :func:`simulate` checks them)."""
    kind, n, m, v = plan.schedule, plan.layout.num_stages, plan.num_microbatches, plan.layout.virtual_stages_per_rank
    reps = plan.layout.stage_replicas
    if not reps:
        check_schedule_rules(kind, n, m, v)
    schedule = _compiled(kind, n, m, v, reps)
    orders = schedule.orders
    st = plan.stages
    fwd = [s.fwd_ms for s in st]
    full_bwd = [s.bwd_ms + s.recompute_ms for s in st]
    sf = [s.send_fwd_ms for s in st]
    sb = [s.send_bwd_ms for s in st]
    ar = [s.allreduce_ms for s in st]
    _check_lengths(n, fwd_ms=fwd, bwd_ms=full_bwd, send_fwd_ms=sf, send_bwd_ms=sb, allreduce_ms=ar)
    opt_stage = [s.optimizer_ms + optimizer_ms / v for s in st]
    times, split, (last_b, ar_start, ar_end, iteration) = _run(
        kind, schedule, m, fwd, [s.bwd_ms for s in st], [s.recompute_ms for s in st], sf, sb, ar, opt_stage,
        [s.sync_early_ms for s in st], [s.gather_ahead_ms for s in st], [s.gather_bound_ms for s in st],
        [s.wgrad_ms for s in st])
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
    by_code = ((r.fstart, r.fend), (r.bstart, r.bend), (r.wstart, r.wend))
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
