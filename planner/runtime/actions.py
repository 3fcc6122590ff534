"""The plan's per-rank action lists, run by torch's action-list runtime.

One truth for a schedule's order: ``planner.schedule.layout_schedule`` of the plan's kind and
Layout, the per-rank lists the simulator replays and ``planner export`` writes as torch's CSV
(``2F0``: stage 2, forward, micro-batch 0). :func:`action_schedule` hands those lists, parsed by
torch's own ``_Action.from_str`` from the same text, to ``torch.distributed.pipelining``'s
``_PipelineScheduleRuntime`` (torch 2.13, ``schedules.py``), which

- infers the stage-to-rank map from them (``_validate_schedule``: each stage on one rank, F
  before I/B before W, every micro-batch once);
- lowers them to the schedule it runs (``_prepare_schedule_with_comms``): the compute actions in
  the given order, with ``UNSHARD``/``RESHARD`` around each chunk's actions and a ``REDUCE_GRAD``
  after its last backward (no-ops on our stage modules, which are not FSDP modules: ZeRO is
  ours, ``planner.runtime.zero``), and ``SEND_F``/``RECV_F``/``SEND_B``/``RECV_B`` placed by a
  lock-step pass over all ranks (``_add_send_recv``: a rank's receive is posted at the step its
  peer's compute ran in that pass, and waited for just before the compute that needs it;
  adjacent chunks on one rank, the turn of ZBV's V, hand over in memory, without a message).

Before the first step :func:`action_schedule` checks the lowering against the plan: torch's map
of stages to ranks is the Layout's (``Layout.pipeline_rank``), every rank's compute actions are
the plan's, in the plan's order, and torch's dry run of the lowered schedule with its messages
(``_simulate_comms_compute``) finishes; any difference is a :class:`PlannerInputError` naming the
rank and the first differing step. The compute order alone was dry-run before launch
(``planner.schedule.validate_schedule`` in ``planner.runtime.check.check_schedule``).

Sends: torch's runtime waits for the sends of a step only at its end, and a send's work holds
its tensor until waited for (gloo's ``is_completed`` stays False until ``wait``), so every
output copy a stage sent (``planner.runtime.engine.TimedStage``) would live to the end of the
step. :class:`SendQueue` waits for a stage's previous send in one direction before posting the
next, as torch's ``Schedule1F1B`` did, so a stage holds at most one unwaited send per direction.
Deadlock-free: the receive of the send waited for was placed, by the lock-step lowering, at an
earlier step of that pass than the action posting the next send, and receives never wait on
sends.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Sequence
from typing import Any

import torch.distributed as dist
from torch.distributed.pipelining.schedules import (
    _Action,
    _batch_p2p,
    _PipelineScheduleRuntime,
    _simulate_comms_compute,
    _wait_batch_p2p,
)

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.layout import Layout
from planner.artifacts.plan import Plan
from planner.runtime.torch_order import check_torch_order
from planner.schedule import Schedule, layout_schedule

__all__ = ["SendQueue", "action_schedule", "check_lowering", "torch_actions"]

_NO_MESSAGES = ("UNSHARD", "RESHARD", "REDUCE_GRAD")


def torch_actions(schedule: Schedule) -> dict[int, list[_Action | None]]:
    """The per-rank lists as torch's actions, each parsed from its text (``2F0``) by
    ``_Action.from_str``: the CSV cell torch would read."""
    return {rank: [_Action.from_str(str(a)) for a in actions] for rank, actions in enumerate(schedule)}


def action_schedule(stages: Sequence[Any], plan: Plan, loss_fn: Callable[..., Any]) -> _PipelineScheduleRuntime:
    """torch's ``_PipelineScheduleRuntime`` over this rank's ``stages`` running the plan's
    per-rank action lists, ``scale_grads=False`` (the loss is already ``/ M``), lowered and
    checked against the plan (module docstring)."""
    order = layout_schedule(plan.schedule, plan.layout, plan.num_microbatches)
    check_torch_order(stages, plan.schedule, order, plan.num_microbatches, loss_fn)  # DualPipe-V: torch's class's
    sched = _PipelineScheduleRuntime(list(stages), plan.num_microbatches, loss_fn=loss_fn, scale_grads=False)
    sched.pipeline_order = torch_actions(order)
    try:
        sched._prepare_schedule_with_comms(sched.pipeline_order)
    except (AssertionError, ValueError) as exc:  # torch's validation and lowering raise these
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PlannerInputError(f"torch's action runtime refuses the plan's {plan.schedule.value} order: {first}") from None
    check_lowering(order, sched.pipeline_order_with_comms, sched.stage_index_to_group_rank, plan.schedule, plan.layout)
    return sched


def check_lowering(
    order: Schedule, lowered: dict[int, list[_Action]], stage_to_rank: dict[int, int], kind: ScheduleKind, layout: Layout
) -> None:
    """The lowered schedule against the plan (module docstring): the stage map, each rank's
    compute order, and torch's dry run of the lowered schedule with its messages."""
    for stage_idx in range(layout.num_stages):
        want = layout.pipeline_rank(stage_idx)
        if stage_to_rank.get(stage_idx) != want:
            raise PlannerInputError(
                f"torch places stage {stage_idx} of the plan's {kind.value} order on pipeline rank "
                f"{stage_to_rank.get(stage_idx)}, the plan's layout on rank {want}"
            )
    for rank, actions in enumerate(order):
        ran = [str(a) for a in lowered.get(rank, []) if a.is_compute_op]
        planned = [str(a) for a in actions]
        if ran != planned:
            step = next((i for i, (x, y) in enumerate(zip(ran, planned)) if x != y), min(len(ran), len(planned)))
            got = ran[step] if step < len(ran) else "nothing"
            raise PlannerInputError(
                f"torch's action runtime would run {got} at compute step {step} of rank {rank}, "
                f"the plan's {kind.value} order {planned[step] if step < len(planned) else 'nothing'}"
            )
    messages = {r: [a for a in acts if a.computation_type.value not in _NO_MESSAGES] for r, acts in lowered.items()}
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            _simulate_comms_compute(messages, lambda s: stage_to_rank[s], layout.num_stages)
    except ValueError as exc:
        stuck = "; ".join(line.strip() for line in printed.getvalue().splitlines() if line.startswith("rank="))
        raise PlannerInputError(f"the plan's {kind.value} order with torch's messages does not finish: {exc} ({stuck})") from None


class SendQueue:
    """The unwaited sends of one stage in one direction (forward activations, or input
    gradients): posting a send first waits for the previous one (module docstring); :meth:`drain`
    waits for the last, at the end of the step."""

    def __init__(self) -> None:
        self._pending: list[dist.Work] = []

    def post(self, ops: list[dist.P2POp]) -> None:
        if not ops:
            return
        self.drain()
        self._pending = _batch_p2p(ops)

    def drain(self) -> None:
        _wait_batch_p2p(self._pending)
        self._pending = []
