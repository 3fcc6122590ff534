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

from planner.schedule.actions import Action, ActionKind

F = ActionKind.FORWARD
I = ActionKind.BACKWARD_INPUT
W = ActionKind.BACKWARD_WEIGHT


def zb_h1_rank(stage: int, p: int, m: int) -> tuple[Action, ...]:
    """torch ``_get_1f1b_rank_ops`` with ``enable_zero_bubble=True``, one stage per rank
    (warm-up ``_get_warmup_ops(multiply_factor=1)``, ``num_1f1b_microbatches = rank``)."""
    return _split_1f1b(stage, min(p - 1 - stage, m), m)


def zb_h2_warmup(stage: int, p: int, m: int) -> int:
    """ZB-H2's warm-up forwards on rank ``stage`` (module docstring): ``min(M, 2 (P - r) - 1)``."""
    return min(m, 2 * (p - stage) - 1)


def zb_h2_rank(stage: int, p: int, m: int) -> tuple[Action, ...]:
    """Rank ``stage``'s ZB-H2 order: ZB-H1's steps after ZB-H2's longer warm-up."""
    return _split_1f1b(stage, zb_h2_warmup(stage, p, m), m)


def _split_1f1b(stage: int, warmup: int, m: int) -> tuple[Action, ...]:
    """``warmup`` forwards, then per step one forward (while any remain) and one ``I``, and from
    step ``stage`` on one ``W`` of the oldest pending micro-batch; then the remaining ``W``."""
    ops = [Action(stage_idx=stage, kind=F, mb_idx=i) for i in range(warmup)]
    next_w = 0
    for step in range(m):
        if warmup + step < m:
            ops.append(Action(stage_idx=stage, kind=F, mb_idx=warmup + step))
        ops.append(Action(stage_idx=stage, kind=I, mb_idx=step))
        if step >= stage:
            ops.append(Action(stage_idx=stage, kind=W, mb_idx=next_w))
            next_w += 1
    ops.extend(Action(stage_idx=stage, kind=W, mb_idx=i) for i in range(next_w, m))
    return tuple(ops)


def zbv_rank(rank: int, p: int, m: int) -> tuple[Action, ...]:
    """Rank ``rank``'s ZBV order: torch ``ScheduleZBVZeroBubble._calculate_single_rank_operations``
    (module docstring), the actions of micro-batches ``>= M`` and the padding dropped."""
    n = max(2 * p - 1, m)
    first, second = rank, 2 * p - 1 - rank
    ops: list[tuple[int, ActionKind, int]] = []
    cnt = {(first, F): 0, (second, F): 0, (first, I): 0, (second, I): 0, (first, W): 0, (second, W): 0}

    def run(stage: int, kind: ActionKind) -> None:
        ops.append((stage, kind, cnt[stage, kind]))
        cnt[stage, kind] += 1

    for _ in range(2 * (p - rank) - 1):
        run(first, F)
    for _ in range(rank):
        run(second, F)
        run(first, F)
    for _ in range(p - rank):
        run(second, F)
        run(second, I)
        run(second, W)
    while cnt[second, F] < cnt[first, F] or cnt[first, F] < n:
        if cnt[first, F] < n:
            run(first, F)
        run(first, I)
        run(first, W)
        run(second, F)
        run(second, I)
        run(second, W)
    for _ in range(rank):
        run(first, I)
        run(second, I)
    for _ in range(p - rank):
        run(first, I)
        run(first, W)
    while cnt[second, W] < cnt[second, I]:
        run(second, W)
    while cnt[first, W] < cnt[first, I]:
        run(first, W)
    return tuple(Action(stage_idx=s, kind=k, mb_idx=i) for s, k, i in ops if i < m)
