"""Pipeline actions as plain data: ``2F0`` is stage 2, forward, micro-batch 0.

The text form is the one ``torch.distributed.pipelining`` prints and parses
(``_Action.__repr__`` / ``_Action.from_str`` in ``torch/distributed/pipelining/schedules.py``):
``[stage][kind][micro-batch]``. The compute kinds: ``F`` (forward), ``B`` (full backward, which
includes any recomputation of checkpointed layers, as ``torch.utils.checkpoint`` runs it inside
the backward), and for zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism",
ICLR 2024) the backward split in two: ``I``, the input-gradient pass (the paper's B: on the
critical path, it sends the gradient upstream; recomputation runs in it), and ``W``, the
weight-gradient pass. The letters are torch's (``BACKWARD_INPUT = "I"``, ``BACKWARD_WEIGHT =
"W"``), so that the same text loads in ``torch.distributed.pipelining``; ``B`` keeps torch's
meaning, the full backward.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from planner.artifacts.errors import PlannerInputError

__all__ = ["Action", "ActionKind", "Op", "Schedule", "as_actions", "parse_action"]


class ActionKind(enum.Enum):
    """Compute kinds, valued as torch's ``_ComputationType`` letters."""

    FORWARD = "F"
    BACKWARD = "B"
    BACKWARD_INPUT = "I"
    BACKWARD_WEIGHT = "W"

    @property
    def sends_grad(self) -> bool:
        """The pass that produces the gradient of the stage's input (B or I)."""
        return self in (ActionKind.BACKWARD, ActionKind.BACKWARD_INPUT)


_ACTION_RE = re.compile(r"^(\d+)([FBIW])(\d+)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """One compute step of one stage on one micro-batch."""

    stage_idx: int
    kind: ActionKind
    mb_idx: int

    def __post_init__(self) -> None:
        if self.stage_idx < 0 or self.mb_idx < 0:
            raise PlannerInputError(f"action indices must be >= 0 (got stage {self.stage_idx}, mb {self.mb_idx})")

    def __str__(self) -> str:
        return f"{self.stage_idx}{self.kind.value}{self.mb_idx}"

    @classmethod
    def parse(cls, text: str) -> Action:
        return parse_action(text)


def parse_action(text: str) -> Action:
    """Inverse of ``str(action)``: ``"1B3"`` -> ``Action(stage_idx=1, kind=BACKWARD, mb_idx=3)``."""
    match = _ACTION_RE.match(text.strip())
    if match is None:
        raise PlannerInputError(f"invalid action {text!r}: expected [stage][F|B|I|W][micro-batch], e.g. 2F0")
    stage, kind, mb = match.groups()
    return Action(stage_idx=int(stage), kind=ActionKind(kind), mb_idx=int(mb))


# One ordered tuple of actions per pipeline rank.
Schedule = tuple[tuple[Action, ...], ...]


#: one action as plain values, ``(stage, kind, micro-batch)``: what the orders are built of (an
#: :class:`Action` each for the schedule; walked as they are by the in-flight counts and the
#: simulator, which need no objects)
Op = tuple[int, ActionKind, int]


def as_actions(ops: tuple[Op, ...] | list[Op]) -> tuple[Action, ...]:
    """``ops`` as :class:`Action` values."""
    return tuple(Action(stage_idx=s, kind=k, mb_idx=i) for s, k, i in ops)
