"""DualPipe-V's per-rank order (DeepSeek-V3 technical report, arXiv 2412.19437, sec. 3.2.1, folded
into a V as DeepSeek's ``dualpipe/dualpipev.py``; torch 2.13 ``ScheduleDualPipeV``).

``2P`` chunks in a V, as ZBV (:class:`~planner.artifacts.kinds.ChunkPlacement` ``v``): rank ``r``
holds chunk ``r`` (its "first") and chunk ``2P - 1 - r`` (its "second"), so every micro-batch
goes down the ranks on the first chunks and back up on the second, the loss on rank 0. The order
is torch's ``ScheduleDualPipeV._calculate_single_rank_operations``, step by step (each step one
action, or two run as one ``OVERLAP_F_B``: a forward of one chunk and the full backward ``B`` of
the other, of different micro-batches):

1. ``2 (P - 1 - r)`` forwards of the first chunk;
2. ``r + 1`` pairs: a first-chunk forward, a second-chunk forward;
3. ``P - 1 - r`` of (second-chunk ``I``, the oldest pending ``W``, second-chunk ``F``);
4. the steady phase, ``M - 2P + r + 1`` times: (first-chunk F with second-chunk B) overlapped,
   then (second-chunk F with first-chunk B) overlapped; on the last rank the first of these
   pairs runs as two single actions;
5. ``P - 1 - r`` of (second-chunk B; second-chunk F with first-chunk B, overlapped);
6. ``r + 1`` pairs of backwards (second, first chunk), whole until the middle pair and split
   (``I``, its ``W`` queued) from there;
7. ``P - 1 - r`` of (the oldest pending W; a first-chunk backward, split or whole as step 6 left it);
8. the remaining W passes, oldest first.

Micro-batch numbers are counters per (chunk, pass), so each chunk forwards ``0..M-1`` in turn. A
chunk's backwards mix whole ``B`` (in the overlapped steady phase) and split ``I``/``W`` (at the
warm-up's turn and in the cooldown): each micro-batch's backward is one or the other. torch
requires ``M >= 2P`` (its number of stages).

DualPipe itself (the report's Fig. 5: two copies of the parameters, ``N`` devices, device ``r``
holding stage ``r`` of the first copy and stage ``N - 1 - r`` of the second, half the
micro-batches fed to each end) runs on device ``r`` exactly this order of rank ``min(r, N - 1 -
r)`` with ``P = N / 2`` and ``M`` the micro-batches per copy (DeepSeek's ``dualpipe/dualpipe.py``:
its ``step`` is this function with ``half_rank``, ``num_half_ranks`` and ``num_chunks / 2``, and
``phase ^ is_in_second_half`` naming the copy). So the planner writes a DualPipe plan as the V of
``P`` ranks whose two copies are a data-parallel pair (:class:`~planner.artifacts.kinds.
ChunkPlacement` ``mirror``: DeepSeek's ``rank_mapping`` that puts devices ``r`` and ``N - 1 - r``
side by side), the same orders and held counts per device; what differs from DualPipe-V on that
layout is the turn: it crosses from device ``P - 1`` to device ``P`` (the other copy's), priced as
a transfer (:meth:`~planner.artifacts.layout.Layout.downstream_rank`), where DualPipe-V's two
chunks share the device. torch has no DualPipe; ``planner run`` refuses it.

An ``OVERLAP_F_B`` step runs its two sub-actions one after the other (torch's
``_PipelineScheduleRuntime`` calls ``_perform_action`` on each, forward first, on one stream), so
the planner's order is the flat sequence of the steps' actions (:func:`dualpipe_v_rank`), the one
the simulator replays and the runtime hands to torch; :func:`dualpipe_v_steps` keeps the steps,
and a test checks both against torch's own ``pipeline_order``.
"""

from __future__ import annotations

from planner.schedule.actions import Action, ActionKind, Op, as_actions

F = ActionKind.FORWARD
B = ActionKind.BACKWARD
I = ActionKind.BACKWARD_INPUT
W = ActionKind.BACKWARD_WEIGHT

#: one step of a rank: one action, or a forward and a whole backward run as torch's OVERLAP_F_B
Step = tuple[Action, ...]


def dualpipe_v_steps(rank: int, p: int, m: int) -> tuple[Step, ...]:
    """Rank ``rank``'s DualPipe-V steps on ``p`` ranks and ``m >= 2p`` micro-batches (module docstring)."""
    return tuple(as_actions(step) for step in dualpipe_v_step_ops(rank, p, m))


def dualpipe_v_step_ops(rank: int, p: int, m: int) -> tuple[tuple[Op, ...], ...]:
    """:func:`dualpipe_v_steps` as plain values, ``(stage, kind, micro-batch)`` per action."""
    first, second = rank, 2 * p - 1 - rank
    steps: list[tuple[Op, ...]] = []
    forwards: dict[int, int] = {}  # per chunk, forwards made; backwards (B or I) likewise
    backwards: dict[int, int] = {}
    weights: list[tuple[int, int]] = []  # (chunk, micro-batch) of the I passes whose W waits

    def act(stage: int, kind: ActionKind) -> Op:
        count = forwards if kind is F else backwards
        mb = count.get(stage, 0)
        count[stage] = mb + 1
        if kind is I:
            weights.append((stage, mb))
        return (stage, kind, mb)

    def one(stage: int, kind: ActionKind) -> None:
        steps.append((act(stage, kind),))

    def overlap(forward: int, backward: int) -> None:
        steps.append((act(forward, F), act(backward, B)))

    def weight() -> None:
        if weights:
            stage, mb = weights.pop(0)
            steps.append(((stage, W, mb),))

    for _ in range(2 * (p - rank - 1)):
        one(first, F)
    for _ in range(rank + 1):
        one(first, F)
        one(second, F)
    for _ in range(p - rank - 1):
        one(second, I)
        weight()
        one(second, F)
    for i in range(m - 2 * p + rank + 1):
        if i == 0 and rank == p - 1:
            one(first, F)
            one(second, B)
        else:
            overlap(first, second)
        overlap(second, first)
    for _ in range(p - rank - 1):
        one(second, B)
        overlap(second, first)
    split = False
    for i in range(rank + 1):
        if i == (rank + 1) // 2 and rank % 2 == 1:
            split = True
        one(second, I if split else B)
        if i == (rank + 1) // 2 and rank % 2 == 0:
            split = True
        one(first, I if split else B)
    for _ in range(p - rank - 1):
        weight()
        one(first, I if split else B)
    for _ in range(rank + 1):
        weight()
    return tuple(steps)


def dualpipe_v_rank(rank: int, p: int, m: int) -> tuple[Action, ...]:
    """Rank ``rank``'s order: its steps' actions in sequence (an overlapped pair forward first)."""
    return as_actions(dualpipe_v_ops(rank, p, m))


def dualpipe_v_ops(rank: int, p: int, m: int) -> tuple[Op, ...]:
    """:func:`dualpipe_v_rank` as plain values."""
    return tuple(op for step in dualpipe_v_step_ops(rank, p, m) for op in step)
