"""Checks of a plan against the model and the world, run on every rank before any compute.

Each refusal is a :class:`PlannerInputError` with one line naming what differs.
"""

from __future__ import annotations

from planner.artifacts.plan import Plan
from planner.artifacts.request import ScheduleKind
from planner.errors import PlannerInputError
from planner.runtime.model import workload_fingerprint
from planner.schedule.build import check_schedule_rules
from planner.workload import Workload

SUPPORTED_SCHEDULES = (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED_1F1B)


def check_plan(plan: Plan, workload: Workload, world_size: int, source: str = "plan") -> None:
    """Refuse a plan that does not match the model (layers, fingerprint) or the world size, or
    that torch's schedule cannot run (``planner.schedule.build.check_schedule_rules``)."""
    if plan.num_devices != world_size:
        v = plan.virtual_stages_per_rank
        stages = f"{plan.num_stages} stages" if v == 1 else f"{plan.num_stages} stages on {plan.num_stages // v} pipeline ranks"
        raise PlannerInputError(
            f"{source}: plan needs {plan.num_devices} processes ({stages} x {plan.dp_degree} replicas) "
            f"but the world size is {world_size}"
        )
    if plan.schedule not in SUPPORTED_SCHEDULES:
        raise PlannerInputError(
            f"{source}: schedule {plan.schedule.value!r} is not supported by the runtime "
            f"(supported: {', '.join(s.value for s in SUPPORTED_SCHEDULES)})"
        )
    v = plan.virtual_stages_per_rank
    if v < 1 or plan.num_stages % v:
        raise PlannerInputError(
            f"{source}: {plan.num_stages} stages cannot be spread {v} per rank (virtual_stages_per_rank)"
        )
    try:
        check_schedule_rules(plan.schedule, plan.num_stages, plan.num_microbatches, v)
    except PlannerInputError as exc:
        raise PlannerInputError(f"{source}: {exc}") from None
    pipeline_size = plan.num_stages // v
    num_layers = len(workload.layers)
    if plan.num_layers != num_layers:
        raise PlannerInputError(
            f"{source}: plan covers {plan.num_layers} layers but model {workload.name!r} has {num_layers}"
        )
    for stage in plan.stages:
        names = workload.layer_names[stage.layer_start : stage.layer_stop]
        if tuple(stage.layer_names) != names:
            bad = next(i for i, (a, b) in enumerate(zip(stage.layer_names, names)) if a != b)
            raise PlannerInputError(
                f"{source}: stage {stage.stage_idx} layer {stage.layer_start + bad} is "
                f"{stage.layer_names[bad]!r} in the plan but {names[bad]!r} in model {workload.name!r}"
            )
        p = stage.stage_idx % pipeline_size
        expected_ranks = tuple(p * plan.dp_degree + r for r in range(plan.dp_degree))
        if tuple(stage.ranks) != expected_ranks:
            raise PlannerInputError(
                f"{source}: stage {stage.stage_idx} ranks {list(stage.ranks)} differ from the placement "
                f"rank = (stage mod P) x D + replica {list(expected_ranks)}"
            )
    expected = plan.provenance.fingerprint_sha256
    if expected:
        got = workload_fingerprint(workload)
        if got != expected:
            raise PlannerInputError(
                f"{source}: model fingerprint (layer names and parameter shapes) {got[:12]} "
                f"does not match the plan's {expected[:12]} (model {workload.name!r})"
            )
