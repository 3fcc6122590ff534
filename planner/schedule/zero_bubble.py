"""Per-rank orders of the zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism",
ICLR 2024): each backward split into ``I`` (the input-gradient pass, on the critical path) and
``W`` (the weight-gradient pass, which waits only for its rank and fills the bubbles).

- ZB-H1 (sec. 3.1; torch ``ScheduleInterleavedZeroBubble`` with one stage per rank, its "ZB1P"):
  rank ``r`` runs ``min(M, P - 1 - r)`` warm-up forwards, then per step one forward and one
  ``I``, and from its ``r``-th step on one ``W`` of the oldest pending micro-batch; the
  remaining ``W`` passes end the iteration. torch's ``_get_1f1b_rank_ops(...,
  enable_zero_bubble=True)`` without its ``None`` padding (a test compares the two). In flight
  (forwarded, not yet ``W``-ed): at most ``min(M, P)`` micro-batches on every stage.
- ZB-H2 (sec. 3.2, Fig. 3 bottom): the warm-up grows until the first ``I`` arrives, so the
  start of the pipeline has no bubble: with ``T_F = T_I = T_W`` the first gradient reaches rank
  ``r`` after ``2 (P - 1 - r) + 1`` forwards, so rank ``r`` warms up with
  ``min(M, 2 (P - r) - 1)`` forwards; then ZB-H1's steps (one forward while any remain, one
  ``I``, and from step ``r`` on one ``W``), and the remaining ``W`` passes end the iteration.
  In flight (counted on the order, :mod:`planner.schedule.inflight`): ``min(M, 2P - r)``
  micro-batches on rank ``r``, ``2P`` on stage 0 (the paper's ``(2p - 1) M_B`` plus the one being
  forwarded), against ZB-H1's ``min(M, P)``: the ``W`` passes delayed ``r`` steps, as ZB-H1's.
  The paper's near-zero bubble also needs its "post-update validation" (sec. 4): the optimizer
  step runs without the iteration's synchronisation, so the next iteration's warm-up fills this
  one's tail. The planner prices a synchronous step, under which the tail after the last stage's
  last ``I`` (``(P - 1) T_I`` of upstream ``I`` passes) stays: simulated, ZB-H2 then ties ZB-H1
  with uniform ``F = I = W`` and never beats it on the shapes tried (tests/test_zero_bubble_v.py),
  at more memory. torch has no ZB-H2 class: the runtime runs this order, as every other, through
  torch's action-list runtime (:mod:`planner.runtime.actions`), with a synchronous step.
- ZBV (sec. 6, "V-shape"; torch ``ScheduleZBVZeroBubble``): ``2P`` chunks, rank ``r`` holds
  chunk ``r`` and chunk ``2P - 1 - r`` (:class:`~planner.artifacts.kinds.ChunkPlacement` ``v``),
  so the forward goes down the ranks on the first chunks and back up on the second, and the
  last chunk (with the loss) is on rank 0. The order is torch's
  ``ScheduleZBVZeroBubble._calculate_single_rank_operations`` without its ``None`` padding: a
  warm-up of ``2 (P - r) - 1`` forwards of the first chunk, ``r`` pairs of forwards of the
  second and first chunks, ``P - r`` of (second-chunk F, I, W); a steady state of (first-chunk
  F, I, W; second-chunk F, I, W); a cooldown of ``r`` pairs of ``I`` (first, second chunk),
  ``P - r`` of (first-chunk I, W), then the remaining ``W`` passes, second chunk first. torch
  builds it for ``max(M, 2P - 1)`` micro-batches and drops the actions of those ``>= M``; so
  does this. In flight (counted on the order): chunk ``s`` holds ``min(M, 2P - s)``
  micro-batches at its peak once ``M >= 2P``, so rank ``r``'s two chunks hold ``2P + 1`` together,
  each about half a 1F1B stage: about 1F1B's ``P`` stage-micro-batches on every rank (the
  paper's claim, sec. 6), where 1F1B's stage 0 holds ``P`` and its last stage 1.
"""

from __future__ import annotations

from planner.artifacts.kinds import ScheduleKind
from planner.schedule.actions import Action, ActionKind, Op, as_actions
from planner.schedule.dualpipe import dualpipe_v_ops

__all__ = ["split_ops", "zb_h1_ops", "zb_h1_rank", "zb_h2_ops", "zb_h2_rank", "zb_h2_warmup", "zbv_ops", "zbv_rank"]

F = ActionKind.FORWARD
I = ActionKind.BACKWARD_INPUT
W = ActionKind.BACKWARD_WEIGHT


def split_ops(kind: ScheduleKind, num_stages: int, num_microbatches: int) -> tuple[tuple[Op, ...], ...]:
    """The per-rank orders of a schedule that splits the backward (ZB-H1, ZB-H2, ZBV, DualPipe-V,
    DualPipe; ``num_stages``: ``2P`` for the V ones) as plain ``(stage, kind, micro-batch)``
    values, the orders :func:`planner.schedule.build.build_schedule` makes its actions of (the
    schedule's rules are the caller's to check). Not cached: the in-flight counts and the
    simulator each keep what they derive of it."""
    m = num_microbatches
    if kind is ScheduleKind.ZB_H1:
        return tuple(zb_h1_ops(s, num_stages, m) for s in range(num_stages))
    if kind is ScheduleKind.ZB_H2:
        return tuple(zb_h2_ops(s, num_stages, m) for s in range(num_stages))
    if kind is ScheduleKind.ZBV:
        return tuple(zbv_ops(r, num_stages // 2, m) for r in range(num_stages // 2))
    if kind in (ScheduleKind.DUALPIPE_V, ScheduleKind.DUALPIPE):  # DualPipe: each copy's devices (ChunkPlacement.MIRROR)
        return tuple(dualpipe_v_ops(r, num_stages // 2, m) for r in range(num_stages // 2))
    raise ValueError(f"{kind.value} does not split the backward")


def zb_h1_rank(stage: int, p: int, m: int) -> tuple[Action, ...]:
    """torch ``_get_1f1b_rank_ops`` with ``enable_zero_bubble=True``, one stage per rank
    (warm-up ``_get_warmup_ops(multiply_factor=1)``, ``num_1f1b_microbatches = rank``)."""
    return as_actions(zb_h1_ops(stage, p, m))


def zb_h1_ops(stage: int, p: int, m: int) -> tuple[Op, ...]:
    """:func:`zb_h1_rank` as plain values."""
    return _split_1f1b(stage, min(p - 1 - stage, m), m)


def zb_h2_warmup(stage: int, p: int, m: int) -> int:
    """ZB-H2's warm-up forwards on rank ``stage`` (module docstring): ``min(M, 2 (P - r) - 1)``."""
    return min(m, 2 * (p - stage) - 1)


def zb_h2_rank(stage: int, p: int, m: int) -> tuple[Action, ...]:
    """Rank ``stage``'s ZB-H2 order: ZB-H1's steps after ZB-H2's longer warm-up."""
    return as_actions(zb_h2_ops(stage, p, m))


def zb_h2_ops(stage: int, p: int, m: int) -> tuple[Op, ...]:
    """:func:`zb_h2_rank` as plain values."""
    return _split_1f1b(stage, zb_h2_warmup(stage, p, m), m)


def _split_1f1b(stage: int, warmup: int, m: int) -> tuple[Op, ...]:
    """``warmup`` forwards, then per step one forward (while any remain) and one ``I``, and from
    step ``stage`` on one ``W`` of the oldest pending micro-batch; then the remaining ``W``."""
    ops = [(stage, F, i) for i in range(warmup)]
    next_w = 0
    for step in range(m):
        if warmup + step < m:
            ops.append((stage, F, warmup + step))
        ops.append((stage, I, step))
        if step >= stage:
            ops.append((stage, W, next_w))
            next_w += 1
    ops.extend((stage, W, i) for i in range(next_w, m))
    return tuple(ops)


def zbv_rank(rank: int, p: int, m: int) -> tuple[Action, ...]:
    """Rank ``rank``'s ZBV order: torch ``ScheduleZBVZeroBubble._calculate_single_rank_operations``
    (module docstring), the actions of micro-batches ``>= M`` and the padding dropped."""
    return as_actions(zbv_ops(rank, p, m))


def zbv_ops(rank: int, p: int, m: int) -> tuple[Op, ...]:
    """:func:`zbv_rank` as plain values."""
    n = max(2 * p - 1, m)
    first, second = rank, 2 * p - 1 - rank
    ops: list[Op] = []
    fwd, inp, wgt = ({first: 0, second: 0} for _ in range(3))  # passes run per chunk, by kind

    def run(stage: int, kind: ActionKind, done: dict[int, int]) -> None:
        ops.append((stage, kind, done[stage]))
        done[stage] += 1

    for _ in range(2 * (p - rank) - 1):
        run(first, F, fwd)
    for _ in range(rank):
        run(second, F, fwd)
        run(first, F, fwd)
    for _ in range(p - rank):
        run(second, F, fwd)
        run(second, I, inp)
        run(second, W, wgt)
    while fwd[second] < fwd[first] or fwd[first] < n:
        if fwd[first] < n:
            run(first, F, fwd)
        run(first, I, inp)
        run(first, W, wgt)
        run(second, F, fwd)
        run(second, I, inp)
        run(second, W, wgt)
    for _ in range(rank):
        run(first, I, inp)
        run(second, I, inp)
    for _ in range(p - rank):
        run(first, I, inp)
        run(first, W, wgt)
    while wgt[second] < inp[second]:
        run(second, W, wgt)
    while wgt[first] < inp[first]:
        run(first, W, wgt)
    return tuple(op for op in ops if op[2] < m)
