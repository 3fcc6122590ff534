"""Event simulator: replay a plan's per-rank action orders with their dependencies.

Model (DESIGN.md section 5; the seed's gradient hiding, Hippie / TPDS 35(4) 2024):

- each pipeline rank runs its actions in the schedule's order (:mod:`planner.schedule`), one
  at a time; an action starts when the rank is free and its input has arrived:
  ``sF m`` after ``(s-1)F m`` ends plus stage ``s-1``'s ``send_fwd_ms``; ``sB m`` after
  ``(s+1)B m`` ends plus stage ``s+1``'s ``send_bwd_ms`` (the last stage after its own ``sF m``);
- a backward of a stage with recomputation first re-runs the checkpointed forward
  (``recompute_ms``, as ``torch.utils.checkpoint`` does once the gradient arrives), then the
  backward (``bwd_ms``); the two are separate segments of one action;
- transfers overlap compute (they occupy no compute time) and do not contend with each other;
- each stage's gradient all-reduce (``allreduce_ms``) starts when its last backward ends and
  overlaps the other stages' remaining work; all-reduces of stages sharing a rank (interleaved)
  run one after another on that rank's communication stream;
- the optimizer step of a rank (``optimizer_ms``, 0 unless given: a Plan has no field for it)
  runs once its compute and all-reduces are done; the iteration ends when every rank's step
  does.

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
from functools import lru_cache

from planner.artifacts.cluster import Cluster
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile
from planner.schedule import ActionKind, build_schedule, layout_schedule, validate_schedule
from planner.schedule.build import check_replicated_rules, replicated_triples
from planner.simulation.timeline import ActionTiming, MemoryTrace, Segment, SegmentKind, StageTimeline, Timeline

__all__ = [
    "ActionTiming",
    "MemoryTrace",
    "Segment",
    "SegmentKind",
    "StageTimeline",
    "Timeline",
    "check_schedule",
    "simulate",
    "simulate_iteration_ms",
]


# ---------------------------------------------------------------- the core replay


@lru_cache(maxsize=256)
def _encoded(
    kind: ScheduleKind, num_stages: int, num_microbatches: int, v: int, replicas: tuple[int, ...] = ()
) -> tuple[tuple[tuple[int, int, int], ...], ...]:
    """The schedule as (stage, is_backward, mb) integer triples, for the tight loop.

    GPipe and 1F1B are generated directly as integers (the same orders as
    :mod:`planner.schedule.build`, a test checks it); interleaved and replicated orders go
    through the Actions."""
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
    schedule = build_schedule(kind, num_stages, num_microbatches, v)
    return tuple(tuple((a.stage_idx, a.kind is ActionKind.BACKWARD, a.mb_idx) for a in acts) for acts in schedule)


def _replay(
    orders: tuple[tuple[tuple[int, int, int], ...], ...],
    m: int,
    fwd: Sequence[float],
    bwd: Sequence[float],
    send_fwd: Sequence[float],
    send_bwd: Sequence[float],
) -> tuple[list[float], list[float], list[float], list[float], list[float]]:
    """Start/end of every action (flat ``stage x M + mb``) and each rank's free time.

    ``bwd`` includes recompute. Ranks advance round-robin as far as their inputs allow; a full
    pass without progress is a deadlock (impossible for orders that pass ``validate_schedule``).
    """
    n = len(fwd)
    last = n - 1
    fstart = [0.0] * (n * m)
    fend = [-1.0] * (n * m)
    bstart = [0.0] * (n * m)
    bend = [-1.0] * (n * m)
    heads = [0] * len(orders)
    free = [0.0] * len(orders)
    remaining = sum(len(o) for o in orders)
    while remaining:
        progress = 0
        for r, ops in enumerate(orders):
            i = heads[r]
            t = free[r]
            size = len(ops)
            while i < size:
                s, is_bwd, mb = ops[i]
                k = s * m + mb
                if not is_bwd:
                    if s:
                        d = fend[k - m]
                        if d < 0.0:
                            break
                        d += send_fwd[s - 1]
                        if d > t:
                            t = d
                    fstart[k] = t
                    t += fwd[s]
                    fend[k] = t
                else:
                    if s < last:
                        d = bend[k + m]
                        if d < 0.0:
                            break
                        d += send_bwd[s + 1]
                    else:
                        d = fend[k]
                        if d < 0.0:
                            break
                    if d > t:
                        t = d
                    bstart[k] = t
                    t += bwd[s]
                    bend[k] = t
                i += 1
            progress += i - heads[r]
            heads[r] = i
            free[r] = t
        if not progress:
            raise PlannerInputError("schedule deadlocks; run planner.schedule.validate_schedule for the step and rank")
        remaining -= progress
    return fstart, fend, bstart, bend, free


def _finish(
    orders: tuple[tuple[tuple[int, int, int], ...], ...],
    m: int,
    bend: list[float],
    free: list[float],
    allreduce: Sequence[float],
    optimizer: Sequence[float],
) -> tuple[list[float], list[float], list[float], float]:
    """All-reduce start/end per stage (serialised per rank, by readiness), and iteration end.
    A stage on several ranks (copies) has its collective on its first rank's stream."""
    n = len(allreduce)
    rank_of = [-1] * n
    for r, ops in enumerate(orders):
        for s, _, _ in ops:
            if rank_of[s] < 0:
                rank_of[s] = r
    last_b = [max(bend[s * m : (s + 1) * m]) for s in range(n)]
    ar_start = [0.0] * n
    ar_end = [0.0] * n
    comm_free = [0.0] * len(orders)
    for s in sorted(range(n), key=lambda s: (last_b[s], s)):
        r = rank_of[s]
        ar_start[s] = max(last_b[s], comm_free[r])
        ar_end[s] = ar_start[s] + allreduce[s]
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
) -> float:
    """Iteration time of one schedule over per-stage times, without building a Plan or a Timeline.

    Same model as :func:`simulate` (which calls the same replay); for the solver's re-scoring.
    ``bwd_ms`` excludes ``recompute_ms``; ``send_fwd_ms[s]`` is stage s -> s+1,
    ``send_bwd_ms[s]`` is stage s -> s-1 (the last and first entries are unused); ``replicas``:
    each stage's copies when replicated per stage (``num_microbatches`` is then global).
    """
    n = len(fwd_ms)
    opt = optimizer_ms if optimizer_ms is not None else [0.0] * n
    _check_lengths(
        n, bwd_ms=bwd_ms, recompute_ms=recompute_ms, send_fwd_ms=send_fwd_ms, send_bwd_ms=send_bwd_ms,
        allreduce_ms=allreduce_ms, optimizer_ms=opt, fwd_ms=fwd_ms,
    )
    reps = tuple(replicas) if replicas and max(replicas) > 1 else ()
    orders = _encoded(schedule_kind, n, num_microbatches, virtual_stages_per_rank, reps)
    full_bwd = [b + rc for b, rc in zip(bwd_ms, recompute_ms)]
    _, _, _, bend, free = _replay(orders, num_microbatches, fwd_ms, full_bwd, send_fwd_ms, send_bwd_ms)
    return _finish(orders, num_microbatches, bend, free, allreduce_ms, opt)[3]


# ---------------------------------------------------------------- the Plan path


def simulate(
    plan: Plan, profile: Profile | None = None, cluster: Cluster | None = None, *, optimizer_ms: float = 0.0
) -> Timeline:
    """Replay ``plan``'s schedule and return its :class:`Timeline`. Deterministic.

    The Plan carries every per-stage cost (from :mod:`planner.cost`); ``profile`` and
    ``cluster``, if given, are only checked against it (layer count, device count).
    ``optimizer_ms`` is the optimizer step of one rank (0: the Plan has no such field).
    """
    _check_context(plan, profile, cluster)
    kind, n, m, v = plan.schedule, plan.layout.num_stages, plan.num_microbatches, plan.layout.virtual_stages_per_rank
    reps = plan.layout.stage_replicas
    schedule = layout_schedule(kind, plan.layout, m)
    orders = _encoded(kind, n, m, v, reps)
    st = plan.stages
    fwd = [s.fwd_ms for s in st]
    rc = [s.recompute_ms for s in st]
    full_bwd = [s.bwd_ms + s.recompute_ms for s in st]
    sf = [s.send_fwd_ms for s in st]
    sb = [s.send_bwd_ms for s in st]
    ar = [s.allreduce_ms for s in st]
    _check_lengths(n, fwd_ms=fwd, bwd_ms=full_bwd, send_fwd_ms=sf, send_bwd_ms=sb, allreduce_ms=ar)
    num_ranks = len(orders)
    opt_rank = [optimizer_ms] * num_ranks
    opt_stage = [optimizer_ms / v] * n
    fstart, fend, bstart, bend, free = _replay(orders, m, fwd, full_bwd, sf, sb)
    last_b, ar_start, ar_end, iteration = _finish(orders, m, bend, free, ar, opt_stage)

    starts = tuple(tuple(bstart[s * m + mb] if b else fstart[s * m + mb] for s, b, mb in ops) for ops in orders)
    ends = tuple(tuple(bend[s * m + mb] if b else fend[s * m + mb] for s, b, mb in ops) for ops in orders)
    compute_end = max(free)
    # each rank's stages, and the micro-batches it runs of each (all of them unless a copy)
    rank_stage_mbs: list[dict[int, list[int]]] = [{} for _ in range(num_ranks)]
    for r, ops in enumerate(orders):
        for s, is_bwd, mb in ops:
            if not is_bwd:
                rank_stage_mbs[r].setdefault(s, []).append(mb)
    stage_ranks: list[list[int]] = [[] for _ in range(n)]
    for r, by_stage in enumerate(rank_stage_mbs):
        for s in by_stage:
            stage_ranks[s].append(r)
    rank_busy = [sum(len(mbs) * (fwd[s] + full_bwd[s]) for s, mbs in by_stage.items()) for by_stage in rank_stage_mbs]
    rank_idle = [compute_end - b for b in rank_busy]
    rank_traces = [
        [_memory_trace(plan, s, r, mbs, fstart, bstart, bend) for s, mbs in by_stage.items()]
        for r, by_stage in enumerate(rank_stage_mbs)
    ]
    rank_peak = [_summed_peak(trs) for trs in rank_traces]
    # a stage's trace: its copy with the highest peak
    traces = tuple(
        max((tr for trs in rank_traces for tr in trs if tr.stage_idx == s), key=lambda tr: (tr.peak_bytes, -tr.rank))
        for s in range(n)
    )
    stages = tuple(
        StageTimeline(
            stage_idx=s, rank=stage_ranks[s][0], fwd_ms=fwd[s], bwd_ms=st[s].bwd_ms, recompute_ms=rc[s],
            send_fwd_ms=sf[s], send_bwd_ms=sb[s], busy_ms=len(rank_stage_mbs[stage_ranks[s][0]][s]) * (fwd[s] + full_bwd[s]),
            idle_ms=rank_idle[stage_ranks[s][0]],
            last_backward_end_ms=last_b[s], allreduce_start_ms=ar_start[s], allreduce_end_ms=ar_end[s],
            peak_memory_bytes=traces[s].peak_bytes, peak_inflight_microbatches=traces[s].peak_inflight_microbatches,
            ranks=tuple(stage_ranks[s]) if len(stage_ranks[s]) > 1 else (),
        )
        for s in range(n)
    )
    return Timeline(
        schedule=kind, layout=plan.layout, num_ranks=num_ranks, num_microbatches=m,
        orders=schedule, start_ms=starts, end_ms=ends, stages=stages, memory=traces,
        rank_busy_ms=tuple(rank_busy), rank_idle_ms=tuple(rank_idle), rank_peak_memory_bytes=tuple(rank_peak),
        optimizer_ms=tuple(opt_rank), compute_end_ms=compute_end, iteration_ms=iteration,
        bubble_fraction=(sum(rank_idle) / (num_ranks * compute_end)) if compute_end > 0 else 0.0,
        exposed_allreduce_ms=max(0.0, max(ar_end) - compute_end),
        peak_memory_bytes=max(rank_peak),
    )


def _check_context(plan: Plan, profile: Profile | None, cluster: Cluster | None) -> None:
    if profile is not None and len(profile.layers) != plan.num_layers:
        raise PlannerInputError(f"the profile has {len(profile.layers)} layers but the plan covers {plan.num_layers}")
    if cluster is not None and cluster.num_devices < plan.num_devices:
        raise PlannerInputError(f"the plan needs {plan.num_devices} devices but the cluster has {cluster.num_devices}")


def _memory_trace(
    plan: Plan, s: int, rank: int, mbs: Sequence[int], fstart: list[float], bstart: list[float], bend: list[float]
) -> MemoryTrace:
    """Memory of stage ``s`` on ``rank``, which runs micro-batches ``mbs`` of it."""
    stage = plan.stages[s]
    m = plan.num_microbatches
    mem = stage.memory
    static = mem.param_bytes + mem.grad_bytes + mem.optimizer_bytes + mem.buffer_bytes
    act = stage.activation_bytes_per_microbatch
    work = mem.recompute_workspace_bytes if (stage.recompute or stage.recompute_ms > 0) else 0
    # (time, order, d_bytes, d_inflight): at equal times frees (order 0) precede allocations.
    events: list[tuple[float, int, int, int]] = []
    for mb in (s * m + i for i in mbs):
        events.append((fstart[mb], 1, act, 1))
        events.append((bend[mb], 0, -act - work, -1))
        if work:
            events.append((bstart[mb], 1, work, 0))
    events.sort()
    times = [0.0]
    values = [static]
    cur, inflight, peak_inflight = static, 0, 0
    for t, _, d_bytes, d_inflight in events:
        cur += d_bytes
        inflight += d_inflight
        peak_inflight = max(peak_inflight, inflight)
        if t == times[-1]:
            values[-1] = cur
        else:
            times.append(t)
            values.append(cur)
    return MemoryTrace(
        stage_idx=s, rank=rank, static_bytes=static, times_ms=tuple(times), bytes_=tuple(values),
        peak_bytes=max(values), peak_inflight_microbatches=peak_inflight,
    )


def _summed_peak(trs: list[MemoryTrace]) -> int:
    """Peak of the summed memory of one rank's stages."""
    if len(trs) == 1:
        return trs[0].peak_bytes
    deltas: list[tuple[float, int]] = []
    for tr in trs:
        prev = 0
        for t, b in zip(tr.times_ms, tr.bytes_):
            deltas.append((t, b - prev))
            prev = b
    deltas.sort()
    cur = peak = 0
    i = 0
    while i < len(deltas):  # apply all changes at one instant before reading the level
        t = deltas[i][0]
        while i < len(deltas) and deltas[i][0] == t:
            cur += deltas[i][1]
            i += 1
        peak = max(peak, cur)
    return peak


def check_schedule(plan: Plan) -> None:
    """Dry-run ``plan``'s schedule (raises :class:`planner.schedule.ScheduleError`)."""
    validate_schedule(layout_schedule(plan.schedule, plan.layout, plan.num_microbatches),
                      plan.layout.num_stages, plan.num_microbatches, replicated=plan.layout.replicated_per_stage)
