"""Checks of a plan against the model and the world, run on every rank before any compute.

Each refusal is a :class:`PlannerInputError` with one line naming what differs. The plan's own
consistency -- every stage's ranks and copies are its :class:`~planner.artifacts.layout.Layout`'s,
the layout's axes combine (per-stage replication only with one stage per rank, dp_degree 1 and
tp_degree 1) -- is checked when the plan is built or loaded (``Plan.__post_init__``,
``load_plan``), so a bad plan file is refused there, before this.

Plans replicated per stage (``plan.layout.replicated_per_stage``) run on
``planner.runtime.replicated``: world size = ``plan.num_devices`` and GPipe or 1F1B
(``check_replicated_rules``); ZeRO shards over a stage's copies.
"""

from __future__ import annotations

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.plan import Plan
from planner.models.workload import Workload
from planner.runtime.model import workload_fingerprint
from planner.schedule.build import check_replicated_rules, check_schedule_rules

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
    check_world_size(plan, world_size, source)
    check_schedule(plan, source)
    check_layers(plan, workload, source)


def check_world_size(plan: Plan, world_size: int, source: str = "plan") -> None:
    """The processes against the devices the plan's layout occupies."""
    if plan.num_devices == world_size:
        return
    lay = plan.layout
    if lay.replicated_per_stage:
        shape = f"{lay.num_stages} stages with replicas {list(lay.stage_replicas)}"
    else:
        v = lay.virtual_stages_per_rank
        stages = f"{lay.num_stages} stages" if v == 1 else f"{lay.num_stages} stages on {lay.pipeline_size} pipeline ranks"
        shape = f"{stages} x {lay.dp_degree} replicas{f' x tp {lay.tp_degree}' if lay.tp_degree > 1 else ''}"
    raise PlannerInputError(f"{source}: plan needs {plan.num_devices} processes ({shape}) but the world size is {world_size}")


def check_schedule(plan: Plan, source: str = "plan") -> None:
    """The plan's schedule is one the runtime runs, in a shape torch's schedule (or, replicated
    per stage, the runtime's own executor) can run."""
    if plan.schedule not in SUPPORTED_SCHEDULES:
        raise PlannerInputError(
            f"{source}: schedule {plan.schedule.value!r} is not supported by the runtime "
            f"(supported: {', '.join(s.value for s in SUPPORTED_SCHEDULES)})"
        )
    lay = plan.layout
    try:
        if lay.replicated_per_stage:
            check_replicated_rules(plan.schedule, lay.stage_replicas, plan.num_microbatches)
        else:
            check_schedule_rules(plan.schedule, lay.num_stages, plan.num_microbatches, lay.virtual_stages_per_rank)
    except PlannerInputError as exc:
        raise PlannerInputError(f"{source}: {exc}") from None


def check_layers(plan: Plan, workload: Workload, source: str = "plan") -> None:
    """The plan's layer count, each stage's layer names, and the fingerprint (layer names and
    parameter shapes), against the model."""
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
    expected = plan.provenance.fingerprint_sha256
    if expected:
        got = workload_fingerprint(workload)
        if got != expected:
            raise PlannerInputError(
                f"{source}: model fingerprint (layer names and parameter shapes) {got[:12]} "
                f"does not match the plan's {expected[:12]} (model {workload.name!r})"
            )
