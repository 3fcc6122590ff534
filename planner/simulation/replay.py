"""The replay at the simulator's core: a schedule's per-rank action orders over its stages' priced
terms (:class:`~planner.cost.stage.StageTerms`), with their dependencies.

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

:func:`simulate_iteration_ms` is the fast entry the solver re-scores candidates with; the Plan
path (:mod:`planner.simulation.simulator`) runs the same replay over a plan's stages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from operator import itemgetter

from planner.artifacts.caches import register_function
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ScheduleKind
from planner.cost.stage import StageTerms
from planner.schedule.build import encoded_orders

__all__ = ["CompiledSchedule", "compiled_schedule", "run_replay", "simulate_iteration_ms"]


@dataclass(frozen=True, slots=True)
class CompiledSchedule:
    """A schedule as the replay walks it: each rank's orders
    (:func:`~planner.schedule.build.encoded_orders`), every action in one order the replay can
    follow (:func:`_flat_order`), and each stage's first rank (the ranks holding a copy: the
    first, whose stream runs its synchronisation)."""

    orders: tuple[tuple[tuple[int, int, int], ...], ...]
    flat: tuple[tuple[int, int, int, int], ...]
    first_rank: tuple[int, ...]


@lru_cache(maxsize=128)
def compiled_schedule(
    kind: ScheduleKind, num_stages: int, num_microbatches: int, v: int, replicas: tuple[int, ...] = ()
) -> CompiledSchedule:
    orders = encoded_orders(kind, num_stages, num_microbatches, v, replicas)
    first_rank = [-1] * num_stages
    for r, ops in enumerate(orders):
        for s in set(map(itemgetter(0), ops)):  # the stages the rank runs (one pass in C, not per action)
            if first_rank[s] < 0:
                first_rank[s] = r
    return CompiledSchedule(orders, _flat_order(orders, num_stages, num_microbatches), tuple(first_rank))


register_function("simulation.replay.compiled_schedule", compiled_schedule,
                  key="(schedule, stages, micro-batches, chunks per rank, replicas per stage)")


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
    stage after its own ``sF m``), ``sW m`` when its rank is free. A whole backward in a split
    schedule (code 3) waits as ``sI m`` and runs I's time plus W's, its W ending with it.
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
            if code == 3:  # whole: I and W in one pass, its gradients complete at its end
                t += wtime[s]
                wstart[k] = t
                wend[k] = t
            bend[k] = t
        free[r] = t
    return fstart, fend, bstart, bend, wstart, wend, free


def _finish(
    schedule: CompiledSchedule,
    m: int,
    bend: list[float],
    free: list[float],
    allreduce: Sequence[float],
    optimizer: Sequence[float],
    early: Sequence[float],
    gather_ahead: Sequence[float],
) -> tuple[list[float], list[float], list[float], float]:
    """All-reduce start/end per stage (serialised per rank, by readiness), and iteration end.
    A stage on several ranks (copies) has its collective on its first rank's stream. A stage's
    synchronisation may start ``early[s]`` before its last backward ends; ``gather_ahead[s]``
    of it ran at the start of the iteration instead (see the module docstring)."""
    n = len(allreduce)
    orders, rank_of = schedule.orders, schedule.first_rank
    last_b = [max(bend[s * m : (s + 1) * m]) for s in range(n)]
    ready = [last_b[s] - early[s] for s in range(n)]
    post = [allreduce[s] - gather_ahead[s] for s in range(n)]
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


def simulate_iteration_ms(
    schedule_kind: ScheduleKind,
    num_microbatches: int,
    stages: Sequence[StageTerms],
    *,
    virtual_stages_per_rank: int = 1,
    replicas: Sequence[int] = (),
) -> float:
    """Iteration time of one schedule over its stages' priced terms (one
    :class:`~planner.cost.stage.StageTerms` per stage), without building a Plan or a Timeline.

    Same model as :func:`planner.simulation.simulate` (which calls the same replay); for the
    solver's re-scoring. ``replicas``: each stage's copies when replicated per stage
    (``num_microbatches`` is then global); a stage's ``wgrad_ms`` is run apart only when the
    schedule splits the backward."""
    if not stages:
        raise PlannerInputError("a schedule needs at least one stage (got none)")
    reps = tuple(replicas) if replicas and max(replicas) > 1 else ()
    schedule = compiled_schedule(schedule_kind, len(stages), num_microbatches, virtual_stages_per_rank, reps)
    _, _, finished = run_replay(schedule_kind, schedule, num_microbatches, stages,
                                [t.optimizer_ms for t in stages])
    return finished[3]


def run_replay(
    kind: ScheduleKind, schedule: CompiledSchedule, m: int, stages: Sequence[StageTerms], optimizer: Sequence[float],
) -> tuple[tuple[list[float], ...], bool, tuple[list[float], list[float], list[float], float]]:
    """The replay (:func:`_replay`: its seven lists) of the stages' terms (``optimizer``: each
    stage's optimizer step, as the caller adds to it), whether W ran apart, and the
    synchronisation pass (:func:`_finish`)."""
    fwd = [t.fwd_ms for t in stages]
    first, second = _split_backward(kind, stages)
    ahead = [t.gather_ahead_ms for t in stages]
    gate = _gather_gate(schedule.orders, m, ahead, [t.gather_bound_ms for t in stages])
    times = _replay(schedule.flat, len(schedule.orders), m, fwd, first, [t.send_fwd_ms for t in stages],
                    [t.send_bwd_ms for t in stages], gate, second)
    finished = _finish(schedule, m, _grads_done(times[3], times[5]), times[6], [t.allreduce_ms for t in stages],
                       optimizer, [t.sync_early_ms for t in stages], ahead)
    return times, second is not None, finished


def _split_backward(kind: ScheduleKind, stages: Sequence[StageTerms]) -> tuple[list[float], list[float] | None]:
    """(the pass that sends the gradient: B, or I with recomputation; W or None) per stage."""
    if not kind.splits_backward:
        return [t.bwd_ms + t.recompute_ms for t in stages], None
    for s, t in enumerate(stages):
        if t.wgrad_ms > t.bwd_ms + 1e-9:
            raise PlannerInputError(f"stage {s}: wgrad_ms must not exceed bwd_ms (got {t.wgrad_ms} > {t.bwd_ms})")
    return [max(0.0, t.bwd_ms - t.wgrad_ms) + t.recompute_ms for t in stages], [t.wgrad_ms for t in stages]


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
