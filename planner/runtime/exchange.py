"""Who sends what to whom in a pipeline replicated per stage, and a dry run of the exchanges.

Plain data, no torch: ``planner.runtime.replicated`` executes what this module lays out.

Routing (PipeDream's round-robin, Narayanan et al. 2019, section 3.3): micro-batch ``m`` runs
on copy ``m mod R_s`` of stage ``s``, the rank ``copies[s][m mod R_s]`` (``copies[s]`` is
``Layout.stage_ranks(s)``, stage 0's copies first). So ``sF m`` receives its input from
copy ``m mod R_{s-1}`` of stage ``s - 1`` and sends its output to copy ``m mod R_{s+1}`` of
stage ``s + 1``; ``sB m`` receives the output gradient from copy ``m mod R_{s+1}`` and sends
the input gradient to copy ``m mod R_{s-1}``. Each transfer is one :class:`Message`.

Grouping (what NCCL needs): before action ``i`` of its order a rank posts, as one group
(``batch_isend_irecv``, i.e. ``ncclGroupStart/End``), the sends of action ``i - 1`` and the
receives of action ``i``, then waits for the group; after its last action it posts the last
sends. This is the general form of torch's ``Schedule1F1B``, which fuses "send forward
output" with "receive backward gradient" so that two neighbours sending to each other do
not each block in a send the other has not reached. :func:`dry_run_exchanges` checks an
order under the strictest semantics a backend may have (a send completes only once the
receiver has posted the matching receive; ops of one group progress together; groups of one
rank run one after the other) and that every directed pair of ranks posts its messages in
the same order on both sides (NCCL ignores tags and matches in order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.schedule.actions import Action, ActionKind

__all__ = ["ExchangeError", "Message", "copy_rank", "dry_run_exchanges", "exchange_groups", "receives", "sends"]

CopyRanks = Sequence[Sequence[int]]  # per stage, its copies' ranks (copy r is copies[s][r]): Layout.all_stage_ranks()


class ExchangeError(RuntimeError):
    """A schedule whose exchanges would hang or mismatch; names the ranks and messages."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One transfer: ``kind`` F carries micro-batch ``mb_idx``'s activation from stage
    ``stage_idx`` to ``stage_idx + 1``; ``kind`` B its gradient from ``stage_idx`` to
    ``stage_idx - 1``."""

    kind: ActionKind
    stage_idx: int  # the sending stage
    mb_idx: int
    src: int
    dst: int

    @property
    def tag(self) -> int:
        """Distinct per micro-batch and direction (gloo matches tags; NCCL ignores them)."""
        return 2 * self.mb_idx + (0 if self.kind is ActionKind.FORWARD else 1)

    def __str__(self) -> str:
        return f"{self.stage_idx}{self.kind.value}{self.mb_idx} {self.src}->{self.dst}"


def copy_rank(copies: CopyRanks, stage_idx: int, mb_idx: int) -> int:
    """The rank running micro-batch ``mb_idx`` on stage ``stage_idx``: copy ``mb_idx mod R_s``."""
    ranks = copies[stage_idx]
    return ranks[mb_idx % len(ranks)]


def _message(copies: CopyRanks, kind: ActionKind, src_stage: int, dst_stage: int, mb_idx: int) -> Message:
    return Message(
        kind=kind,
        stage_idx=src_stage,
        mb_idx=mb_idx,
        src=copy_rank(copies, src_stage, mb_idx),
        dst=copy_rank(copies, dst_stage, mb_idx),
    )


def receives(copies: CopyRanks, action: Action) -> tuple[Message, ...]:
    """What ``action`` must receive before it runs (nothing on stage 0's forward and the last
    stage's backward, which read the batch and the loss)."""
    s, m = action.stage_idx, action.mb_idx
    if action.kind is ActionKind.FORWARD:
        return (_message(copies, ActionKind.FORWARD, s - 1, s, m),) if s > 0 else ()
    return (_message(copies, ActionKind.BACKWARD, s + 1, s, m),) if s < len(copies) - 1 else ()


def sends(copies: CopyRanks, action: Action) -> tuple[Message, ...]:
    """What ``action`` sends once it has run."""
    s, m = action.stage_idx, action.mb_idx
    if action.kind is ActionKind.FORWARD:
        return (_message(copies, ActionKind.FORWARD, s, s + 1, m),) if s < len(copies) - 1 else ()
    return (_message(copies, ActionKind.BACKWARD, s, s - 1, m),) if s > 0 else ()


def exchange_groups(copies: CopyRanks, order: Sequence[Action]) -> tuple[tuple[Message, ...], ...]:
    """``len(order) + 1`` groups: group ``i`` is the sends of ``order[i - 1]`` then the
    receives of ``order[i]``; the last group is the sends of the last action."""
    groups = []
    previous: tuple[Message, ...] = ()
    for action in order:
        groups.append(previous + receives(copies, action))
        previous = sends(copies, action)
    groups.append(previous)
    return tuple(groups)


def dry_run_exchanges(copies: CopyRanks, schedule: Sequence[Sequence[Action]]) -> None:
    """Raise :class:`ExchangeError` if the ranks' orders (``schedule[rank]``) would hang
    under rendezvous semantics, or post a pair's messages in different orders."""
    groups = [exchange_groups(copies, order) for order in schedule]
    posted_at: dict[tuple[Message, int], int] = {}  # (message, rank) -> the rank's group holding it
    per_pair: dict[tuple[int, int, int], list[Message]] = {}  # (src, dst, side rank) -> order
    for rank, rank_groups in enumerate(groups):
        for group_idx, group in enumerate(rank_groups):
            for msg in group:
                if rank not in (msg.src, msg.dst):
                    raise ExchangeError(f"rank {rank} posts message {msg} it neither sends nor receives")
                posted_at[(msg, rank)] = group_idx
                per_pair.setdefault((msg.src, msg.dst, rank), []).append(msg)
    for msg, rank in posted_at:
        peer = msg.dst if rank == msg.src else msg.src
        if (msg, peer) not in posted_at:
            raise ExchangeError(f"message {msg}: rank {rank} posts it but rank {peer} never does")
    for (src, dst, side), msgs in per_pair.items():
        if side == src and per_pair.get((src, dst, dst)) != msgs:
            theirs = [str(m) for m in per_pair.get((src, dst, dst), [])]
            raise ExchangeError(
                f"ranks {src}->{dst} post their messages in different orders: sender {[str(m) for m in msgs]}, "
                f"receiver {theirs}"
            )
    _run_rendezvous(schedule, groups, posted_at)


def _run_rendezvous(
    schedule: Sequence[Sequence[Action]],
    groups: list[tuple[tuple[Message, ...], ...]],
    posted_at: dict[tuple[Message, int], int],
) -> None:
    """Advance every rank whose current group has all its counterparts posted, until all are
    done or none can move (a hang: name each stuck rank's next action and what it waits for)."""
    current = [0] * len(groups)  # index of the group each rank has posted and waits for

    def missing(rank: int) -> list[Message]:
        out = []
        for msg in groups[rank][current[rank]]:
            peer = msg.dst if rank == msg.src else msg.src
            if current[peer] < posted_at[(msg, peer)]:
                out.append(msg)
        return out

    moved = True
    while moved:
        moved = False
        for rank in range(len(groups)):
            while current[rank] < len(groups[rank]) and not missing(rank):
                current[rank] += 1
                moved = True
    stuck = [r for r in range(len(groups)) if current[r] < len(groups[r])]
    if stuck:
        waits = "; ".join(
            f"rank {r} before {schedule[r][current[r]] if current[r] < len(schedule[r]) else 'its last sends'} "
            f"waits on {', '.join(str(m) for m in missing(r))}"
            for r in stuck
        )
        raise ExchangeError(f"the exchanges hang: {waits}")
