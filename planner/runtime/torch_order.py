"""The plan's order against the one torch's own schedule class builds on the run's live stages.

DualPipe-V (:mod:`planner.schedule.dualpipe`) is the order of torch 2.13's ``ScheduleDualPipeV``,
which the runtime does not run (it runs the plan's action lists, ``planner.runtime.actions``).
Before the first step, :func:`check_torch_order` builds torch's class over this rank's stages
(its ``pipeline_order``: every rank's, as its ``__init__`` makes it; nothing runs) and compares
it, each ``OVERLAP_F_B`` read as its two sub-actions in turn (the order torch runs them), with
the plan's: a difference is a :class:`PlannerInputError` naming the rank and the step. The class
sets the stages' stage-to-rank map (the V's), which the action runtime then sets again from the
plan's lists, to the same map. A torch without the class has nothing to compare with.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch.distributed.pipelining import schedules

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ScheduleKind
from planner.schedule import Schedule

__all__ = ["check_torch_order", "torch_order"]

#: the plan's schedules a torch class builds the same order for
_CLASSES = {ScheduleKind.DUALPIPE_V: "ScheduleDualPipeV"}


def torch_order(stages: Sequence[Any], kind: ScheduleKind, num_microbatches: int,
                loss_fn: Callable[..., Any]) -> list[list[str]] | None:
    """Every rank's compute order as torch's class for ``kind`` builds it over ``stages`` (this
    rank's), overlapped pairs as their sub-actions; None where torch has no such class."""
    cls = getattr(schedules, _CLASSES.get(kind, ""), None)
    if cls is None:
        return None
    sched = cls(list(stages), num_microbatches, loss_fn=loss_fn, scale_grads=False)
    return [[str(a) for act in sched.pipeline_order[rank] if act is not None for a in (act.sub_actions or (act,))]
            for rank in sorted(sched.pipeline_order)]


def check_torch_order(stages: Sequence[Any], kind: ScheduleKind, order: Schedule, num_microbatches: int,
                      loss_fn: Callable[..., Any]) -> None:
    """Refuse a plan whose order is not the one torch's own class builds (module docstring)."""
    theirs = torch_order(stages, kind, num_microbatches, loss_fn)
    if theirs is None:
        return
    ours = [[str(a) for a in actions] for actions in order]
    for rank, (mine, torchs) in enumerate(zip(ours, theirs, strict=True)):
        if mine != torchs:
            step = next((i for i, (x, y) in enumerate(zip(mine, torchs)) if x != y), min(len(mine), len(torchs)))
            got = torchs[step] if step < len(torchs) else "nothing"
            want = mine[step] if step < len(mine) else "nothing"
            raise PlannerInputError(f"torch's {_CLASSES[kind]} runs {got} at compute step {step} of rank {rank}, "
                                    f"the plan's {kind.value} order {want}")
