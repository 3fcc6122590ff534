"""Per-rank action orders for GPipe, 1F1B, interleaved 1F1B and the zero-bubble schedules (each
schedule's rules, which shapes it runs, are :mod:`planner.schedule.rules`').

Placement: with ``P`` pipeline ranks and ``v`` virtual stages per rank (``num_stages = P x v``),
rank ``p`` holds stages ``p, p + P, p + 2P, ...`` (torch's ``ScheduleInterleaved1F1B``; for
``v = 1`` stage ``s`` is rank ``s``); under ZBV (``v = 2``) rank ``p`` holds stages ``p`` and
``2P - 1 - p`` (:meth:`planner.artifacts.layout.Layout.pipeline_rank`).

- GPipe (Huang et al. 2019; torch ``ScheduleGPipe``): all forwards ``0..M-1``, then all
  backwards ``0..M-1``. Stage ``s`` holds up to ``M`` micro-batches of activations.
- 1F1B (PipeDream-Flush, Narayanan et al. 2021; torch ``Schedule1F1B``): stage ``s`` runs
  ``min(M, P - s)`` warm-up forwards, then alternates one backward, one forward, and drains
  the remaining backwards. Holds at most ``min(P - s, M)`` micro-batches. Like torch, it
  requires ``M >= P`` (torch raises "Number of microbatches must be greater than or equal to
  the number of stages"); with ``M < P`` use GPipe, whose order is then the same.
- Interleaved 1F1B (Narayanan et al. 2021, section 2.2; torch ``ScheduleInterleaved1F1B``,
  the "flex" variant): ``rounds = max(1, M // P)``, ``M`` must be a multiple of ``rounds``;
  the order is torch's ``_get_warmup_ops`` / ``_get_1f1b_rank_ops`` without their ``None``
  padding (padding only aligns torch's lock-step grid; an event simulator does not need it).
- zero bubble (Qi et al., ICLR 2024): ZB-H1 (``ScheduleInterleavedZeroBubble``, one stage per
  rank), ZB-H2 (more warm-up, one stage per rank) and ZBV (two chunks per rank in a V,
  ``ScheduleZBVZeroBubble``), each backward split into ``I`` and ``W``: their orders and
  in-flight counts are in :mod:`planner.schedule.zero_bubble`. DualPipe-V (ZBV's chunks, a
  forward and a whole backward of other micro-batches paired in its steady phase; torch
  ``ScheduleDualPipeV``, ``M >= 2P``): :mod:`planner.schedule.dualpipe`, which also gives
  DualPipe's (two copies of the parameters; per copy of ``N / 2`` pipeline ranks the same orders,
  ``M`` per copy: :class:`~planner.artifacts.kinds.ChunkPlacement` ``mirror``).
- Per-stage replication (PipeDream's round-robin, Narayanan et al. 2019, section 3.3; flushed
  as PipeDream-Flush): stage ``s`` has ``R_s`` copies, one rank each (ranks stage-major:
  stage 0's copies first), and micro-batch ``m`` (of ``M``, global) runs on copy
  ``m mod R_s``. Each copy runs GPipe or 1F1B over its own micro-batches. Under 1F1B, copy
  ``r`` of stage ``s`` warms up with ``ceil(K_s / R_s)`` forwards (at most its own count), where
  ``K_s = min(M, R_s + R_{s+1} + ... + R_{P-1})`` is the number of micro-batches the devices
  from ``s`` to the end keep busy (with one copy per stage: ``P - s``, plain 1F1B).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from planner.artifacts.caches import register_function
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ScheduleKind
from planner.schedule.actions import Action, ActionKind, Schedule, as_actions
from planner.schedule.rules import check_schedule_rules
from planner.schedule.zero_bubble import split_ops

__all__ = [
    "build_replicated_schedule",
    "build_schedule",
    "encoded_orders",
    "replicated_warmup",
]

F = ActionKind.FORWARD
B = ActionKind.BACKWARD


def build_schedule(
    kind: ScheduleKind, num_stages: int, num_microbatches: int, virtual_stages_per_rank: int = 1
) -> Schedule:
    """One ordered tuple of actions per pipeline rank. Cached: schedules are immutable."""
    check_schedule_rules(kind, num_stages, num_microbatches, virtual_stages_per_rank)
    return _build(kind, num_stages, num_microbatches, virtual_stages_per_rank)


@lru_cache(maxsize=256)
def _build(kind: ScheduleKind, num_stages: int, num_microbatches: int, v: int) -> Schedule:
    if kind is ScheduleKind.GPIPE:
        return tuple(_gpipe_rank(s, num_microbatches) for s in range(num_stages))
    if kind is ScheduleKind.ONE_F_ONE_B:
        return tuple(_one_f_one_b_rank(s, num_stages, num_microbatches) for s in range(num_stages))
    if kind.splits_backward:
        return tuple(as_actions(ops) for ops in split_ops(kind, num_stages, num_microbatches))
    ranks = num_stages // v
    return tuple(_interleaved_rank(p, ranks, v, num_microbatches) for p in range(ranks))


register_function("schedule.build.build", _build, key="(schedule, stages, micro-batches, chunks per rank)")


def _gpipe_rank(stage: int, m: int) -> tuple[Action, ...]:
    fwd = [Action(stage_idx=stage, kind=F, mb_idx=i) for i in range(m)]
    bwd = [Action(stage_idx=stage, kind=B, mb_idx=i) for i in range(m)]
    return tuple(fwd + bwd)


def _one_f_one_b_rank(stage: int, p: int, m: int) -> tuple[Action, ...]:
    """torch ``Schedule1F1B._step_microbatches``: warm-up ``min(M, P - s)`` forwards, then B, F, B, F..."""
    warmup = min(m, p - stage)
    ops = [Action(stage_idx=stage, kind=F, mb_idx=i) for i in range(warmup)]
    next_fwd = warmup
    for bwd in range(m):
        ops.append(Action(stage_idx=stage, kind=B, mb_idx=bwd))
        if next_fwd < m:
            ops.append(Action(stage_idx=stage, kind=F, mb_idx=next_fwd))
            next_fwd += 1
    return tuple(ops)


def interleaved_ops(ranks: np.ndarray, p: int, v: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The interleaved 1F1B orders of the pipeline ranks ``ranks`` (a column), the order of torch
    ``ScheduleInterleaved1F1B._calculate_single_rank_operations`` (compute only): op ``i`` of a
    rank runs a forward while ``i < v M`` and then a backward from ``i = warm-up`` on. Per rank
    and op (columns up to the longest rank's), the chunk of its forward and of its backward (-1:
    none)."""
    rounds = max(1, m // p)
    per_round = m // rounds
    total = v * m
    # _get_warmup_ops(multiply_factor=2)
    warmup = np.minimum((v - 1) * per_round + 2 * (p - 1 - ranks), total)
    op = np.arange(total + int(warmup.max()))[None, :]
    forward = np.where(op < total, (op // per_round) % v, -1)
    backward = np.where((op >= warmup) & (op < total + warmup), v - 1 - ((op - warmup) // per_round) % v, -1)
    return np.broadcast_to(forward, backward.shape), backward


def interleaved_events(rank: int, p: int, v: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """One rank's interleaved 1F1B order (:func:`interleaved_ops`) as (chunk, +1 forward / -1
    backward) per action, each op's forward before its backward."""
    forward, backward = (a[0] for a in interleaved_ops(np.array([[rank]]), p, v, m))
    chunk = np.stack([forward, backward], axis=1).reshape(-1)
    delta = np.stack([(forward >= 0).astype(np.int64), -(backward >= 0).astype(np.int64)], axis=1).reshape(-1)
    keep = delta != 0
    return chunk[keep], delta[keep]


def interleaved_triples(rank: int, p: int, v: int, m: int) -> tuple[tuple[int, int, int], ...]:
    """One rank's interleaved order as (stage ``chunk x P + rank``, 0 forward / 1 backward,
    micro-batch) triples: each stage's forwards and its backwards take the micro-batches in turn."""
    chunks, deltas = interleaved_events(rank, p, v, m)
    back = (deltas < 0).astype(np.int64)
    key = chunks * 2 + back
    mb = np.zeros_like(key)
    for k in range(2 * v):
        idx = np.flatnonzero(key == k)
        mb[idx] = np.arange(len(idx))
    return tuple(zip((chunks * p + rank).tolist(), back.tolist(), mb.tolist()))


def interleaved_schedule_triples(num_stages: int, num_microbatches: int, v: int) -> tuple[tuple[tuple[int, int, int], ...], ...]:
    """:func:`interleaved_triples` of every rank, after the schedule's rules (as :func:`build_schedule`)."""
    check_schedule_rules(ScheduleKind.INTERLEAVED_1F1B, num_stages, num_microbatches, v)
    return tuple(interleaved_triples(r, num_stages // v, v, num_microbatches) for r in range(num_stages // v))


def _interleaved_rank(rank: int, p: int, v: int, m: int) -> tuple[Action, ...]:
    """The Actions of :func:`interleaved_triples`."""
    return tuple(Action(stage_idx=s, kind=B if b else F, mb_idx=i) for s, b, i in interleaved_triples(rank, p, v, m))


def replicated_warmup(replicas: tuple[int, ...], stage_idx: int, num_microbatches: int) -> int:
    """1F1B warm-up forwards of each copy of stage ``stage_idx`` (see the module docstring);
    also the micro-batches of activations a copy holds at its peak."""
    d = replicas[stage_idx]
    busy = min(num_microbatches, sum(replicas[stage_idx:]))
    return min(num_microbatches // d, -(-busy // d))


def build_replicated_schedule(kind: ScheduleKind, replicas: tuple[int, ...], num_microbatches: int) -> Schedule:
    """One ordered tuple of actions per rank (stage-major: stage 0's copies first) of a
    pipeline replicated per stage; micro-batch indices are global."""
    if not replicas:
        raise PlannerInputError("replicas must be >= 1 per stage (got [])")
    check_schedule_rules(kind, len(replicas), num_microbatches, replicas=tuple(replicas))
    return _build_replicated(kind, tuple(replicas), num_microbatches)


@lru_cache(maxsize=256)
def _build_replicated(kind: ScheduleKind, replicas: tuple[int, ...], m: int) -> Schedule:
    return tuple(
        tuple(Action(stage_idx=s, kind=B if is_bwd else F, mb_idx=i) for s, is_bwd, i in ops)
        for ops in replicated_triples(kind, replicas, m)
    )


register_function("schedule.build.build_replicated", _build_replicated, key="(schedule, replicas per stage, micro-batches)")


@lru_cache(maxsize=256)
def replicated_triples(kind: ScheduleKind, replicas: tuple[int, ...], m: int) -> tuple[tuple[tuple[int, bool, int], ...], ...]:
    """The replicated orders as (stage, is_backward, micro-batch) triples (the simulator's
    tight loop reads these; :func:`build_replicated_schedule` wraps them in Actions)."""
    out: list[tuple[tuple[int, bool, int], ...]] = []
    for s, d in enumerate(replicas):
        warmup = replicated_warmup(replicas, s, m)
        for r in range(d):
            mine = range(r, m, d)
            if kind is ScheduleKind.GPIPE:
                ops = [(s, False, i) for i in mine] + [(s, True, i) for i in mine]
            else:
                ops = [(s, False, i) for i in mine[:warmup]]
                for k, i in enumerate(mine):
                    ops.append((s, True, i))
                    if warmup + k < len(mine):
                        ops.append((s, False, mine[warmup + k]))
            out.append(tuple(ops))
    return tuple(out)


register_function("schedule.build.replicated_triples", replicated_triples, key="(schedule, replicas per stage, micro-batches)")


#: the encoded orders' action codes: 0 forward, 1 the pass that sends the input's gradient (B or
#: I), 2 the weight-gradient pass W, 3 a whole backward (I and W in one) in a schedule that
#: splits the others (DualPipe-V's steady phase)
_CODE = {F: 0, B: 1, ActionKind.BACKWARD_INPUT: 1, ActionKind.BACKWARD_WEIGHT: 2}
_SPLIT_CODE = {**_CODE, B: 3}


@lru_cache(maxsize=256)
def encoded_orders(
    kind: ScheduleKind, num_stages: int, num_microbatches: int, v: int, replicas: tuple[int, ...] = ()
) -> tuple[tuple[tuple[int, int, int], ...], ...]:
    """Each rank's order as (stage, action code, micro-batch) integer triples (codes: ``_CODE``,
    ``_SPLIT_CODE``), after the schedule's rules: the form the simulator's replay walks
    (:mod:`planner.simulation.replay`). ``replicas``: each stage's copies (a rank per copy, as
    :func:`build_replicated_schedule`), or () for one.

    GPipe and 1F1B are generated directly as integers (the same orders as their Actions, a test
    checks it), interleaved ones from the integers its Actions are made of, zero-bubble ones from
    their plain values (:func:`~planner.schedule.zero_bubble.split_ops`)."""
    m = num_microbatches
    if replicas:
        check_schedule_rules(kind, num_stages, m, v, replicas)
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
    if kind.splits_backward:  # their orders as plain values (the ones their Actions are made of)
        check_schedule_rules(kind, num_stages, m, v)
        # _SPLIT_CODE by identity (an enum member's hash is a Python call, one per action)
        f, i_, w = ActionKind.FORWARD, ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT
        return tuple(tuple((s, 0 if k is f else 1 if k is i_ else 2 if k is w else 3, i) for s, k, i in ops)
                     for ops in split_ops(kind, num_stages, m))
    schedule = build_schedule(kind, num_stages, num_microbatches, v)
    return tuple(tuple((a.stage_idx, _CODE[a.kind], a.mb_idx) for a in acts) for acts in schedule)


register_function("schedule.build.encoded_orders", encoded_orders,
                  key="(schedule, stages, micro-batches, chunks per rank, replicas per stage)")
