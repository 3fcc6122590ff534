"""Checks of a plan against the model and the world, run on every rank before any compute.

Each refusal is a :class:`PlannerInputError` with one line naming what differs.

Plans replicated per stage (``plan.layout.replicated_per_stage``) run on ``planner.runtime.replicated``:
world size = ``plan.num_devices``, GPipe or 1F1B (``check_replicated_rules``), one pipeline
(``dp_degree`` 1), each stage's copies on the consecutive ranks the plan lays out; ZeRO shards
over a stage's copies.
"""

from __future__ import annotations

from planner.artifacts.plan import Plan
from planner.artifacts.request import ScheduleKind
from planner.cost import replicated_ranks
from planner.artifacts.errors import PlannerInputError
from planner.runtime.model import workload_fingerprint
from planner.schedule.build import check_replicated_rules, check_schedule_rules
from planner.models.workload import Workload

SUPPORTED_SCHEDULES = (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED_1F1B)


def check_plan(plan: Plan, workload: Workload, world_size: int, source: str = "plan") -> None:
    """Refuse a plan that does not match the model (layers, fingerprint) or the world size, or
    that torch's schedule cannot run (``planner.schedule.build.check_schedule_rules``), or
    whose tensor parallelism the model or the runtime cannot do
    (``planner.runtime.tensor.tensor_parallel_refusal``)."""
    if plan.layout.tp_degree > 1:  # torch.distributed.tensor takes seconds to import: only for tensor parallelism
        from planner.runtime.tensor import tensor_parallel_refusal

        why = tensor_parallel_refusal(plan, workload)
        if why:
            raise PlannerInputError(f"{source}: {why}")
    replicated = plan.layout.replicated_per_stage
    if replicated:
        _check_replicated(plan, world_size, source)
    if plan.num_devices != world_size:
        v = plan.layout.virtual_stages_per_rank
        stages = f"{plan.layout.num_stages} stages" if v == 1 else f"{plan.layout.num_stages} stages on {plan.layout.num_stages // v} pipeline ranks"
        raise PlannerInputError(
            f"{source}: plan needs {plan.num_devices} processes ({stages} x {plan.layout.dp_degree} replicas"
            f"{f' x tp {plan.layout.tp_degree}' if plan.layout.tp_degree > 1 else ''}) "
            f"but the world size is {world_size}"
        )
    if plan.schedule not in SUPPORTED_SCHEDULES:
        raise PlannerInputError(
            f"{source}: schedule {plan.schedule.value!r} is not supported by the runtime "
            f"(supported: {', '.join(s.value for s in SUPPORTED_SCHEDULES)})"
        )
    v = plan.layout.virtual_stages_per_rank
    if v < 1 or plan.layout.num_stages % v:
        raise PlannerInputError(
            f"{source}: {plan.layout.num_stages} stages cannot be spread {v} per rank (virtual_stages_per_rank)"
        )
    try:
        if not replicated:
            check_schedule_rules(plan.schedule, plan.layout.num_stages, plan.num_microbatches, v)
    except PlannerInputError as exc:
        raise PlannerInputError(f"{source}: {exc}") from None
    pipeline_size = plan.layout.num_stages // v
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
        t = plan.layout.tp_degree
        expected_ranks = tuple((p * plan.layout.dp_degree + r) * t + k for r in range(plan.layout.dp_degree) for k in range(t))
        if not replicated and tuple(stage.ranks) != expected_ranks:
            layout = "(stage mod P) x D + replica" if t == 1 else "((stage mod P) x D + replica) x t + tp index"
            raise PlannerInputError(
                f"{source}: stage {stage.stage_idx} ranks {list(stage.ranks)} differ from the placement "
                f"rank = {layout} {list(expected_ranks)}"
            )
    expected = plan.provenance.fingerprint_sha256
    if expected:
        got = workload_fingerprint(workload)
        if got != expected:
            raise PlannerInputError(
                f"{source}: model fingerprint (layer names and parameter shapes) {got[:12]} "
                f"does not match the plan's {expected[:12]} (model {workload.name!r})"
            )


def _check_replicated(plan: Plan, world_size: int, source: str) -> None:
    """World size, schedule, and rank layout of a plan replicated per stage."""
    replicas = list(plan.layout.stage_replicas)
    if plan.num_devices != world_size:
        raise PlannerInputError(
            f"{source}: plan needs {plan.num_devices} processes ({plan.layout.num_stages} stages with replicas {replicas}) "
            f"but the world size is {world_size}"
        )
    if plan.layout.dp_degree != 1:
        raise PlannerInputError(
            f"{source}: per-stage replication (replicas {replicas}) inside dp_degree {plan.layout.dp_degree} pipelines "
            "is not supported by the runtime; use dp_degree 1"
        )
    try:
        check_replicated_rules(plan.schedule, plan.layout.stage_replicas, plan.num_microbatches)
    except PlannerInputError as exc:
        raise PlannerInputError(f"{source}: {exc}") from None
    for stage, expected in zip(plan.stages, replicated_ranks(plan.layout.stage_replicas)):
        if tuple(stage.ranks) != expected:
            raise PlannerInputError(
                f"{source}: stage {stage.stage_idx} ranks {list(stage.ranks)} differ from the replicated placement "
                f"(consecutive blocks, stage 0's copies first) {list(expected)}"
            )
