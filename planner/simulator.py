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

All data-parallel replicas of a stage are identical, so one replica is simulated.

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

from functools import lru_cache
from typing import Sequence

from planner.artifacts.cluster import Cluster
from planner.artifacts.plan import Plan, Prediction
from planner.artifacts.profile import Profile
from planner.artifacts.request import ScheduleKind
from planner.errors import PlannerInputError
from planner.schedule import ActionKind, build_schedule, validate_schedule
from planner.timeline import ActionTiming, MemoryTrace, Segment, SegmentKind, StageTimeline, Timeline

__all__ = [
    "ActionTiming",
    "MemoryTrace",
    "Segment",
    "SegmentKind",
    "StageTimeline",
    "Timeline",
    "check_schedule",
    "predict",
    "simulate",
    "simulate_iteration_ms",
]


# ---------------------------------------------------------------- the core replay


@lru_cache(maxsize=256)
def _encoded(kind: ScheduleKind, num_stages: int, num_microbatches: int, v: int) -> tuple[tuple[tuple[int, int, int], ...], ...]:
    """The schedule as (stage, is_backward, mb) integer triples, for the tight loop.

    GPipe and 1F1B are generated directly as integers (the same orders as
    :mod:`planner.schedule.build`, a test checks it); interleaved goes through the Actions."""
    m = num_microbatches
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
    """All-reduce start/end per stage (serialised per rank, by readiness), and iteration end."""
    n = len(allreduce)
    rank_of = [0] * n
    for r, ops in enumerate(orders):
        for s, _, _ in ops:
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
) -> float:
    """Iteration time of one schedule over per-stage times, without building a Plan or a Timeline.

    Same model as :func:`simulate` (which calls the same replay); for the solver's re-scoring.
    ``bwd_ms`` excludes ``recompute_ms``; ``send_fwd_ms[s]`` is stage s -> s+1,
    ``send_bwd_ms[s]`` is stage s -> s-1 (the last and first entries are unused).
    """
    n = len(fwd_ms)
    opt = optimizer_ms if optimizer_ms is not None else [0.0] * n
    _check_lengths(
        n, bwd_ms=bwd_ms, recompute_ms=recompute_ms, send_fwd_ms=send_fwd_ms, send_bwd_ms=send_bwd_ms,
        allreduce_ms=allreduce_ms, optimizer_ms=opt, fwd_ms=fwd_ms,
    )
    orders = _encoded(schedule_kind, n, num_microbatches, virtual_stages_per_rank)
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
    kind, n, m, v = plan.schedule, plan.num_stages, plan.num_microbatches, plan.virtual_stages_per_rank
    schedule = build_schedule(kind, n, m, v)
    orders = _encoded(kind, n, m, v)
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
    busy_stage = [m * (fwd[s] + full_bwd[s]) for s in range(n)]
    rank_of = [s % num_ranks for s in range(n)]
    rank_busy = [0.0] * num_ranks
    for s in range(n):
        rank_busy[rank_of[s]] += busy_stage[s]
    rank_idle = [compute_end - b for b in rank_busy]
    traces = tuple(_memory_trace(plan, s, rank_of[s], fstart, bstart, bend) for s in range(n))
    rank_peak = _rank_peaks(traces, num_ranks)
    stages = tuple(
        StageTimeline(
            stage_idx=s, rank=rank_of[s], fwd_ms=fwd[s], bwd_ms=st[s].bwd_ms, recompute_ms=rc[s],
            send_fwd_ms=sf[s], send_bwd_ms=sb[s], busy_ms=busy_stage[s], idle_ms=rank_idle[rank_of[s]],
            last_backward_end_ms=last_b[s], allreduce_start_ms=ar_start[s], allreduce_end_ms=ar_end[s],
            peak_memory_bytes=traces[s].peak_bytes, peak_inflight_microbatches=traces[s].peak_inflight_microbatches,
        )
        for s in range(n)
    )
    return Timeline(
        schedule=kind, num_stages=n, num_ranks=num_ranks, num_microbatches=m, virtual_stages_per_rank=v,
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
    plan: Plan, s: int, rank: int, fstart: list[float], bstart: list[float], bend: list[float]
) -> MemoryTrace:
    stage = plan.stages[s]
    m = plan.num_microbatches
    mem = stage.memory
    static = mem.param_bytes + mem.grad_bytes + mem.optimizer_bytes + mem.buffer_bytes
    act = stage.activation_bytes_per_microbatch
    work = mem.recompute_workspace_bytes if (stage.recompute or stage.recompute_ms > 0) else 0
    # (time, order, d_bytes, d_inflight): at equal times frees (order 0) precede allocations.
    events: list[tuple[float, int, int, int]] = []
    for mb in range(s * m, (s + 1) * m):
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


def _rank_peaks(traces: tuple[MemoryTrace, ...], num_ranks: int) -> list[int]:
    """Peak of the summed memory of each rank's stages."""
    peaks = [0] * num_ranks
    by_rank: dict[int, list[MemoryTrace]] = {}
    for tr in traces:
        by_rank.setdefault(tr.rank, []).append(tr)
    for r, trs in by_rank.items():
        if len(trs) == 1:
            peaks[r] = trs[0].peak_bytes
            continue
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
        peaks[r] = peak
    return peaks


def check_schedule(plan: Plan) -> None:
    """Dry-run ``plan``'s schedule (raises :class:`planner.schedule.ScheduleError`)."""
    validate_schedule(build_schedule(plan.schedule, plan.num_stages, plan.num_microbatches, plan.virtual_stages_per_rank),
                      plan.num_stages, plan.num_microbatches)


def predict(plan: Plan, *, optimizer_ms: float = 0.0, timeline: Timeline | None = None) -> Prediction:
    """``plan.predicted`` from the simulator and :mod:`planner.bounds` (ME index left as in the plan:
    it needs a reference plan, see :func:`planner.bounds.me_index`)."""
    from planner.bounds import lower_bound_ms

    t = timeline if timeline is not None else simulate(plan, optimizer_ms=optimizer_ms)
    return Prediction(
        iteration_ms=t.iteration_ms,
        throughput_samples_per_s=plan.global_batch / t.iteration_ms * 1e3 if t.iteration_ms > 0 else 0.0,
        peak_memory_bytes=t.peak_memory_bytes,
        bubble_fraction=t.bubble_fraction,
        exposed_allreduce_ms=t.exposed_allreduce_ms,
        lower_bound_ms=lower_bound_ms(plan),
        me_index=plan.predicted.me_index,
        me_reference=plan.predicted.me_reference,
    )
