"""Dry run of a schedule: reject orders that deadlock or run a backward before its forward.

After torch's ``_validate_schedule`` and ``_simulate_comms_compute`` (torch/distributed/
pipelining/schedules.py): every rank is stepped in lock step; at each step a rank runs its
next action if that action's inputs were produced at an earlier step:

- ``sF m`` needs ``(s-1)F m`` (stage 0 reads the batch);
- ``sB m`` (and the input-gradient pass ``sI m``) needs ``sF m`` (its saved activations) and
  the gradient from ``(s+1)B m`` or ``(s+1)I m`` (the last stage's loss gradient is local);
- ``sW m`` (the weight-gradient pass) needs ``sI m``, earlier on the same rank.

Each micro-batch's backward on a stage runs either whole (``B``) or split (``I`` and ``W``);
a stage may mix the two over its micro-batches (DualPipe-V does: whole in its overlapped steady
phase, split at the ends).

A step at which no rank can move while actions remain is a deadlock. Errors name the rank
and the step and carry a step x rank grid (``ScheduleError.grid``) in torch's format, with
``<-- ERROR HERE`` on the offending step.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.artifacts.errors import PlannerInputError
from planner.schedule.actions import Action, ActionKind, Schedule

__all__ = ["ScheduleError", "format_grid", "validate_schedule"]

Grid = tuple[tuple[Action | None, ...], ...]  # steps x ranks


class ScheduleError(PlannerInputError):
    """An invalid action order. ``rank`` and ``step`` locate it; ``grid`` shows the schedule."""

    def __init__(self, message: str, *, rank: int, step: int, grid: str) -> None:
        self.rank = rank
        self.step = step
        self.grid = grid
        super().__init__(message)


def format_grid(rows: Sequence[Sequence[Action | None]], error_step: int | None = None) -> str:
    """A step (row) x rank (column) table, as torch's ``_format_pipeline_order``."""
    num_steps = len(rows)
    num_ranks = max((len(r) for r in rows), default=0)
    width = len(str(max(num_steps - 1, 0)))
    labels = [f"Step {i:0{width}d}" for i in range(num_steps)]
    cells = [[str(a) if a is not None else "" for a in row] + [""] * (num_ranks - len(row)) for row in rows]
    heads = [f"Rank {r}" for r in range(num_ranks)]
    widths = [max([len(heads[r])] + [len(c[r]) for c in cells]) for r in range(num_ranks)]
    lines = [" " * (len(labels[0]) + 2 if labels else 8) + " ".join(h.ljust(w) for h, w in zip(heads, widths))]
    for i, (label, row) in enumerate(zip(labels, cells)):
        mark = " <-- ERROR HERE" if i == error_step else ""
        lines.append(f"{label}: " + " ".join(c.ljust(w) for c, w in zip(row, widths)) + mark)
    return "\n".join(lines) + "\n"


def _as_rows(schedule: Schedule) -> list[list[Action | None]]:
    """The per-rank lists as a grid whose row ``i`` is each rank's ``i``-th action."""
    steps = max((len(r) for r in schedule), default=0)
    return [[r[i] if i < len(r) else None for r in schedule] for i in range(steps)]


def _check_structure(schedule: Schedule, num_stages: int, num_microbatches: int, replicated: bool = False) -> None:
    owner: dict[int | tuple[int, int], int] = {}
    seen: set[tuple[int, ActionKind, int]] = set()
    for rank, actions in enumerate(schedule):
        forwards_done: set[tuple[int, int]] = set()
        for step, a in enumerate(actions):

            def fail(msg: str) -> None:
                raise ScheduleError(
                    f"rank {rank}, step {step}: {msg}",
                    rank=rank,
                    step=step,
                    grid=format_grid(_as_rows(schedule), error_step=step),
                )

            if not (0 <= a.stage_idx < num_stages and 0 <= a.mb_idx < num_microbatches):
                fail(f"{a} is outside {num_stages} stages x {num_microbatches} micro-batches")
            # one rank per stage; replicated per stage: one rank per (stage, micro-batch)
            where: int | tuple[int, int] = (a.stage_idx, a.mb_idx) if replicated else a.stage_idx
            if owner.setdefault(where, rank) != rank:
                what = f"micro-batch {a.mb_idx} of stage {a.stage_idx}" if replicated else f"stage {a.stage_idx}"
                fail(f"{a}: {what} already runs on rank {owner[where]}")
            key = (a.stage_idx, a.kind, a.mb_idx)
            if key in seen:
                fail(f"{a} appears twice")
            seen.add(key)
            if a.kind is ActionKind.FORWARD:
                forwards_done.add((a.stage_idx, a.mb_idx))
            elif a.kind is ActionKind.BACKWARD_WEIGHT:
                if (a.stage_idx, ActionKind.BACKWARD_INPUT, a.mb_idx) not in seen:
                    fail(f"weight gradient {a} runs before its input gradient {a.stage_idx}I{a.mb_idx}")
            elif (a.stage_idx, a.mb_idx) not in forwards_done:
                fail(f"backward {a} runs before its forward {a.stage_idx}F{a.mb_idx}")
    split = {(s, m) for s, k, m in seen if k in (ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT)}
    whole = {(s, m) for s, k, m in seen if k is ActionKind.BACKWARD}
    if split & whole:
        s, m = min(split & whole)
        raise PlannerInputError(
            f"stage {s} runs micro-batch {m}'s backward both whole (B) and split (I, W): use one or the other"
        )
    kinds = {key: (ActionKind.FORWARD, ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT) if key in split
             else (ActionKind.FORWARD, ActionKind.BACKWARD)
             for key in ((s, m) for s in range(num_stages) for m in range(num_microbatches))}
    missing = [
        f"{s}{k.value}{m}"
        for (s, m), want in kinds.items()
        for k in want
        if (s, k, m) not in seen
    ]
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise PlannerInputError(f"schedule is missing {len(missing)} action(s): {shown}")


def _needs(a: Action, num_stages: int, grad_kind: dict[tuple[int, int], ActionKind]) -> tuple[Action, ...]:
    """What ``a`` waits for; ``grad_kind[s, m]``: the pass of stage ``s`` that sends micro-batch
    ``m``'s input gradient (B, or I where that backward is split)."""
    if a.kind is ActionKind.FORWARD:
        return () if a.stage_idx == 0 else (Action(stage_idx=a.stage_idx - 1, kind=ActionKind.FORWARD, mb_idx=a.mb_idx),)
    if a.kind is ActionKind.BACKWARD_WEIGHT:
        return (Action(stage_idx=a.stage_idx, kind=ActionKind.BACKWARD_INPUT, mb_idx=a.mb_idx),)
    own = Action(stage_idx=a.stage_idx, kind=ActionKind.FORWARD, mb_idx=a.mb_idx)
    if a.stage_idx == num_stages - 1:
        return (own,)
    nxt = a.stage_idx + 1
    return (own, Action(stage_idx=nxt, kind=grad_kind.get((nxt, a.mb_idx), ActionKind.BACKWARD), mb_idx=a.mb_idx))


def validate_schedule(schedule: Schedule, num_stages: int, num_microbatches: int, *, replicated: bool = False) -> Grid:
    """Check ``schedule`` and return its lock-step dry run (steps x ranks; ``None`` = idle).

    Raises :class:`ScheduleError` (a :class:`PlannerInputError`) naming the rank and step of a
    misplaced, duplicated or out-of-range action, a backward before its forward, or a deadlock.
    ``replicated``: a stage may run on several ranks (copies), each micro-batch on one of them.
    """
    _check_structure(schedule, num_stages, num_microbatches, replicated)
    grad_kind = {(a.stage_idx, a.mb_idx): a.kind for acts in schedule for a in acts if a.kind.sends_grad}
    heads = [0] * len(schedule)
    done: set[Action] = set()
    rows: list[tuple[Action | None, ...]] = []
    remaining = sum(len(r) for r in schedule)
    while remaining:
        row: list[Action | None] = []
        for rank, actions in enumerate(schedule):
            a = actions[heads[rank]] if heads[rank] < len(actions) else None
            if a is not None and all(n in done for n in _needs(a, num_stages, grad_kind)):
                row.append(a)
                heads[rank] += 1
            else:
                row.append(None)
        if all(a is None for a in row):
            step = len(rows)
            rank = next(r for r, acts in enumerate(schedule) if heads[r] < len(acts))
            stuck = [
                f"rank {r} waits at {acts[heads[r]]} for "
                + ", ".join(str(n) for n in _needs(acts[heads[r]], num_stages, grad_kind) if n not in done)
                for r, acts in enumerate(schedule)
                if heads[r] < len(acts)
            ]
            pending = [
                tuple(acts[heads[r]] if heads[r] < len(acts) else None for r, acts in enumerate(schedule))
            ]
            raise ScheduleError(
                f"rank {rank}, step {step}: deadlock ({'; '.join(stuck)})",
                rank=rank,
                step=step,
                grid=format_grid(rows + pending, error_step=step),
            )
        done.update(a for a in row if a is not None)
        remaining -= sum(a is not None for a in row)
        rows.append(tuple(row))
    return tuple(rows)
