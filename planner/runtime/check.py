"""Checks of a plan against the model and the world, run on every rank before any compute.

Each refusal is a :class:`PlannerInputError` with one line naming what differs. The plan's own
consistency -- every stage's ranks and copies are its :class:`~planner.artifacts.layout.Layout`'s,
the layout's axes combine (per-stage replication only with one stage per rank, dp_degree 1 and
tp_degree 1) -- is checked when the plan is built or loaded (``Plan.__post_init__``,
``load_plan``), so a bad plan file is refused there, before this.

Plans replicated per stage (``plan.layout.replicated_per_stage``) run on
``planner.runtime.replicated``: world size = ``plan.num_devices`` and GPipe or 1F1B
(``planner.schedule.rules.check_schedule_rules`` with its copies per stage); ZeRO shards over a
stage's copies.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import torch

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import DType, ScheduleKind
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile, profile_fingerprint
from planner.graph.cuts import cut_bytes_per_sample
from planner.models import layer_param_shapes
from planner.models.workload import Workload
from planner.profiling.measured.memory import layer_edges
from planner.runtime.context import context_parallel_refusal
from planner.runtime.expert_check import expert_parallel_refusal
from planner.runtime.model import workload_fingerprint
from planner.schedule.inflight import layout_schedule
from planner.schedule.rules import check_schedule_rules
from planner.schedule.validate import validate_schedule

SUPPORTED_SCHEDULES = (
    ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED_1F1B, ScheduleKind.ZB_H1, ScheduleKind.ZB_H2,
    ScheduleKind.ZBV, ScheduleKind.DUALPIPE_V,
)
#: why ``planner run`` refuses DualPipe (bidirectional, two copies of the parameters)
DUALPIPE_REFUSAL = (
    "schedule 'dualpipe' is not run: its devices hold a stage of each of two copies of the model, half the "
    "micro-batches fed to each end, and torch 2.13 has no DualPipe schedule (its action runtime sends every "
    "micro-batch through one chain of stages); plan with --schedules dualpipe-v, its folded form, which runs"
)
#: what of torch.distributed.pipelining.schedules the runtime runs every schedule on (``planner.runtime.actions``):
#: the action-list runtime, its lowering to messages and its dry run (torch 2.13 has them all)
ACTION_RUNTIME = ("_PipelineScheduleRuntime", "_Action", "_simulate_comms_compute", "_batch_p2p", "_wait_batch_p2p")


def missing_action_runtime() -> str:
    """The first of :data:`ACTION_RUNTIME` the installed torch's ``schedules.py`` does not define
    ("" when it defines them all), read off its source: importing ``torch.distributed.pipelining``
    takes seconds (it imports ``torch.distributed.tensor`` and FSDP), which the launcher's
    preflight does not spend. An unreadable source names the file."""
    path = Path(torch.__file__).parent / "distributed" / "pipelining" / "schedules.py"
    try:
        source = path.read_text()
    except OSError:
        return str(path)
    return next((name for name in ACTION_RUNTIME if not re.search(rf"^(class|def) {name}\b", source, re.M)), "")


def check_plan(plan: Plan, workload: Workload, world_size: int, source: str = "plan", profile: Profile | None = None) -> None:
    """Refuse a plan that does not match the model (layers, fingerprint) or the world size, or
    whose schedule the runtime cannot run (:func:`check_schedule`), or
    whose tensor parallelism the model or the runtime cannot do
    (``planner.runtime.tensor.tensor_parallel_refusal``), or whose context parallelism
    (``planner.runtime.context.context_parallel_refusal``), or whose experts' layout
    (``planner.runtime.expert_check.expert_parallel_refusal``)."""
    why = context_parallel_refusal(plan, workload) or expert_parallel_refusal(plan, workload) or precision_refusal(plan)
    if why:
        raise PlannerInputError(f"{source}: {why}")
    if plan.layout.tp_degree > 1:  # torch.distributed.tensor takes seconds to import: only for tensor parallelism
        from planner.runtime.tensor import tensor_parallel_refusal

        why = tensor_parallel_refusal(plan, workload)
        if why:
            raise PlannerInputError(f"{source}: {why}")
    check_world_size(plan, world_size, source)
    check_schedule(plan, source)
    check_layers(plan, workload, source, profile)
    check_plan_batch(plan, workload, source)
    check_boundaries(plan, workload, source)


def precision_refusal(plan: Plan) -> str:
    """Why the runtime cannot run a plan's precision or HSDP sharding ("" if it can): FP8 and HSDP
    are planned and priced (``planner.cost.precision``, ``Layout.shard_group_size``), not run here."""
    if plan.precision.fp8:
        return (f"precision {plan.precision.value}: FP8 needs an FP8 GPU and Transformer Engine; this runtime runs "
                "bf16/float32 plans only (replan with --precision bf16)")
    if plan.layout.shard_group_size:
        return (f"HSDP (shard_group_size {plan.layout.shard_group_size}): this runtime shards ZeRO 3 over the whole "
                "group only (replan with --zero 0,1)")
    return ""


def check_plan_batch(plan: Plan, workload: Workload, source: str = "plan") -> None:
    """``make_batch(global_batch, 0)`` returns the plan's global batch along dim 0
    (:func:`planner.profiling.measured.contract.check_batch`: a factory whose ``make_batch`` takes
    ``(seed, batch_size)`` is named as such), with the RNG state restored."""
    from planner.profiling.measured.contract import check_batch

    with torch.random.fork_rng(devices=[]):
        try:
            batch = workload.make_batch(plan.global_batch, 0)
        except Exception as exc:  # a user's factory: one line, not a traceback per rank
            detail = " ".join(str(exc).split())[:300]
            raise PlannerInputError(f"{source}: model {workload.name!r}: make_batch({plan.global_batch}, 0) raised "
                                    f"{type(exc).__name__}: {detail}") from None
    try:
        check_batch(workload, plan.global_batch, 0, batch)
    except PlannerInputError as exc:
        raise PlannerInputError(f"{source}: {exc}") from None


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
        shape = f"{stages} x {lay.dp_degree} replicas{f' x cp {lay.cp_degree}' if lay.cp_degree > 1 else ''}"
        shape += f"{f' x tp {lay.tp_degree}' if lay.tp_degree > 1 else ''}"
    raise PlannerInputError(f"{source}: plan needs {plan.num_devices} processes ({shape}) but the world size is {world_size}")


def check_schedule(plan: Plan, source: str = "plan") -> None:
    """The plan's schedule is one the runtime runs, in a shape its order is built for
    (``planner.schedule.rules.check_schedule_rules``; replicated per stage, the runtime's own
    executor's rules), on a torch with the action-list runtime, and its per-rank action lists
    pass the dry run (``planner.schedule.validate_schedule``: a deadlock or a misplaced action
    named by rank and step)."""
    if plan.schedule is ScheduleKind.DUALPIPE:
        raise PlannerInputError(f"{source}: {DUALPIPE_REFUSAL}")
    if plan.schedule not in SUPPORTED_SCHEDULES:
        raise PlannerInputError(
            f"{source}: schedule {plan.schedule.value!r} is not supported by the runtime "
            f"(supported: {', '.join(s.value for s in SUPPORTED_SCHEDULES)})"
        )
    lay = plan.layout
    missing = "" if lay.replicated_per_stage else missing_action_runtime()
    if missing:
        raise PlannerInputError(
            f"{source}: the runtime runs schedules through torch.distributed.pipelining's action-list runtime, "
            f"and the installed torch {torch.__version__} lacks schedules.{missing} (torch 2.13 has it)"
        )
    try:
        check_schedule_rules(plan.schedule, lay.num_stages, plan.num_microbatches, lay.virtual_stages_per_rank,
                             lay.stage_replicas)
        validate_schedule(layout_schedule(plan.schedule, lay, plan.num_microbatches), lay.num_stages,
                          plan.num_microbatches, replicated=lay.replicated_per_stage)
    except PlannerInputError as exc:
        raise PlannerInputError(f"{source}: {exc}") from None


def check_layers(plan: Plan, workload: Workload, source: str = "plan", profile: Profile | None = None) -> None:
    """The plan's layer count, each stage's layer names, and the fingerprint (layer names and
    parameter shapes, and the configuration ``Workload.model_config``), against the model. A plan
    holds only the fingerprint's hash; when the plan's ``profile`` is given (it holds every
    layer's parameter names and shapes, and the configuration), a mismatch names the config field
    or the parameter that differs instead of two hashes (:func:`model_difference`)."""
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
    if not expected:
        return
    got = workload_fingerprint(workload)
    if got == expected or legacy_fingerprint(workload) == expected:
        return
    if profile is not None and profile.fingerprint_sha256 == expected:
        where = model_difference(profile, workload)
        if where:
            raise PlannerInputError(f"{source}: model {workload.name!r} differs from the plan's: {where}")
    raise PlannerInputError(
        f"{source}: model fingerprint (layer names, parameter shapes, configuration) {got[:12]} "
        f"does not match the plan's {expected[:12]} (model {workload.name!r}; the layer names match, so a "
        "parameter shape or a config field differs: give the plan's profile with --profile to name it)"
    )


def legacy_fingerprint(workload: Workload) -> str:
    """The fingerprint plans carried before profile version 4 (layer names and parameter shapes,
    no configuration): such a plan still runs, though it cannot tell two configurations apart."""
    return profile_fingerprint(workload.layer_names, layer_param_shapes(workload))


def model_difference(profile: Profile, workload: Workload) -> str:
    """What differs between ``profile`` (what the plan was made from) and ``workload``, in words
    ("" when nothing it records does): the first layer with a parameter missing, extra or of
    another shape -- by name when the profile has the names (version 4), else by position --,
    else a config field (``Profile.model_config``)."""
    for idx, (name, layer, recorded) in enumerate(zip(workload.layer_names, workload.layers, profile.layers)):
        got = [(pname, tuple(p.shape)) for pname, p in layer.named_parameters()]
        expected = [tuple(e) for e in recorded.param_shapes]
        if not expected and got:
            return ""  # a profile without shapes (imported, analytic) cannot say
        if [shape for _, shape in got] == expected and (not recorded.param_names or
                                                       [n for n, _ in got] == list(recorded.param_names)):
            continue
        where = f"layer {name!r} (layer {idx})"
        if recorded.param_names:
            return f"{where} {_named_difference(dict(got), dict(zip(recorded.param_names, expected)))}"
        for k, (pname, shape) in enumerate(got):
            want = expected[k] if k < len(expected) else None
            if shape != want:
                shown = "absent" if want is None else list(want)
                return f"{where} parameter {pname!r} has shape {list(shape)}, the plan's profile {shown}"
        return f"{where} has {len(got)} parameters, the plan's profile {len(expected)}"
    default = "the model type's default"
    for key in sorted(set(profile.model_config) | set(workload.model_config)):
        want, have = profile.model_config.get(key), workload.model_config.get(key)
        if want != have:
            return (f"config field {key!r} is {have if have is not None else default} in the model but "
                    f"{want if want is not None else default} in the plan's profile")
    return ""


def _named_difference(got: dict[str, tuple[int, ...]], want: dict[str, tuple[int, ...]]) -> str:
    """The parameters the plan's profile has and the model lacks, then the model's extra ones,
    then the first whose shape differs."""
    missing = [n for n in want if n not in got]
    if missing:
        shown = ", ".join(f"{n!r} {list(want[n])}" for n in missing[:4]) + (" ..." if len(missing) > 4 else "")
        return f"lacks parameter{'s' if len(missing) > 1 else ''} {shown} of the plan's profile"
    extra = [n for n in got if n not in want]
    if extra:
        shown = ", ".join(f"{n!r} {list(got[n])}" for n in extra[:4]) + (" ..." if len(extra) > 4 else "")
        return f"has parameter{'s' if len(extra) > 1 else ''} {shown} that the plan's profile does not"
    name = next((n for n in got if got[n] != want[n]), next(iter(got)))
    return f"parameter {name!r} has shape {list(got[name])}, the plan's profile {list(want[name])}"


def _model_cuts(workload: Workload, microbatch_size: int, itemsize: int) -> list[float]:
    """The model's bytes per sample crossing every cut, counted as the plan's profile counts
    them: the layer DAG's edges from one no-grad forward of a micro-batch
    (``planner.profiling.measured.memory.layer_edges``, floating tensors at ``itemsize`` bytes
    an element), then ``planner.graph.cut_bytes_per_sample`` (per producer live across a cut,
    its largest outgoing tensor). In eval mode (no running statistics updated) and with the
    RNG state restored, so the run trains as it would have."""
    modes = [layer.training for layer in workload.layers]
    for layer in workload.layers:
        layer.eval()
    try:
        with torch.random.fork_rng(devices=[]):
            inputs, _ = workload.make_batch(microbatch_size, 0)
            edges = layer_edges(workload, inputs, lambda t: t.numel() * (itemsize if t.is_floating_point() else t.element_size()))
    finally:
        for layer, mode in zip(workload.layers, modes):
            layer.train(mode)
    dag = SimpleNamespace(
        num_layers=len(workload.layers),
        edges=[SimpleNamespace(src=src, dst=dst, bytes_per_sample=b / microbatch_size) for (src, dst), b in edges.items()],
    )
    return [float(c) for c in cut_bytes_per_sample(dag)]  # type: ignore[arg-type]


def check_boundaries(plan: Plan, workload: Workload, source: str = "plan") -> None:
    """The tensors crossing each stage boundary of the model against the plan's: the plan's
    stage s prices receive and send buffers of 2 mb (cut_s + cut_(s+1)) bytes
    (``planner.cost.model.CostModel.buffer_bytes``), from which its bytes per sample at every
    cut follow, stage by stage; the model's are measured the same way (:func:`_model_cuts`). A
    plan profiled with other shapes (the same layers at 64 tokens per sample where the plan
    was profiled at 32) is refused: every activation byte it predicts would be off. Skipped
    for plans without memory figures (all buffers 0), one stage, or tensor parallelism (the
    per-device cuts depend on the split)."""
    lay = plan.layout
    if len(plan.stages) < 2 or lay.tp_degree > 1 or not any(s.memory.buffer_bytes for s in plan.stages):
        return
    mb = plan.microbatch_size
    planned: list[float] = []
    cut = 0.0
    for stage in plan.stages[:-1]:  # buffer_s / (2 mb) = cut_s + cut_(s+1)
        cut = stage.memory.buffer_bytes / (2.0 * mb) - cut
        planned.append(cut)
    model = _model_cuts(workload, mb, (plan.dtype or DType.FLOAT32).itemsize)
    for s, stage in enumerate(plan.stages[:-1]):
        got, want = model[stage.layer_stop], planned[s]
        if abs(got - want) > max(2.0 / mb, 0.005 * want):  # buffer bytes are rounded to whole bytes per micro-batch
            last = stage.layer_stop - 1
            raise PlannerInputError(
                f"{source}: the tensors crossing from stage {s} to {s + 1} (after layer {last}, "
                f"{workload.layer_names[last]!r}) are {got:g} bytes per sample in model {workload.name!r} but the plan "
                f"priced {want:g}: it was planned for other shapes (sequence length, width?); profile and plan this model"
            )
