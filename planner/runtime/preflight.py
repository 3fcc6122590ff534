"""What ``planner run`` checks before it starts torchrun: the run's settings against the plan,
then the plan against the world size and the model. One line and exit 2 on a refusal, in
the launcher's one process, instead of one traceback per rank after torchrun has started.

Settings (:func:`run_settings`), decided per case:

- **dtype**: the plan records the dtype its profile was measured in (``Plan.dtype``). By
  default the run takes it. An explicit ``--dtype`` that differs is *refused*: every byte and
  time the plan predicts (activations, parameters, compute) scales with the element size, so
  the run's measured-against-predicted figures would be off by 2x without saying so. A plan
  priced for a dtype the runtime does not train in (``bfloat16``; the runtime runs float32 or
  float64, ``RUNTIME_DTYPES``) runs in float32 with a *warning*. Plans of unknown dtype
  (version 2 files, ``""``: ``Plan.dtype`` None) run in float32, or in the ``--dtype`` asked for.
- **optimizer**: the plan records the optimizer its memory was priced for (``Plan.optimizer``:
  ``sgd-fp32``, ``adam-fp32``, ``adam-mixed``, ``adam-mixed-fp32-grad``). By default the run
  takes the same family (``OptimizerKind.family``): ``sgd`` for ``sgd-fp32``, ``adamw`` for the
  Adam kinds (the runtime keeps its optimizer state in the run's dtype; mixed precision is not
  run). An explicit
  ``--optimizer`` of the other family runs with a *warning*: the run report prices model
  state for the runtime's own optimizer, so no measured figure is compared with a wrong
  prediction, but the run does not train the way the plan was priced. Unknown: ``sgd``.
- **recomputation under a split backward** (ZB-H1, ZB-H2, ZBV, DualPipe-V): no warning any
  more. The stage recomputes a layer once in ``I`` and keeps it to ``W``, as the plan prices
  (``planner.runtime.recompute``; before, torch's checkpoint re-ran it once per parameter group in
  ``W`` and ``planner run`` warned).

Then (:func:`check_launch`): the world size (``--nproc``, default the plan's devices) against
the plan, without torch; then the model, built as every rank builds it (on the CPU, seeded;
released before torchrun starts), against the plan's layer names, layer count and fingerprint
(``planner.runtime.check.check_plan``, the ranks' own check); a factory that raises is refused
here too; and a ``--profile`` whose layers differ from the model's. Only torch and the
model's own modules are imported (``torch.distributed.tensor`` only for a tensor-parallel
plan). Not on torch's ``meta`` device: its random initialisers import ``torch._dynamo``
(4-6 s here), more than building a model that fits one process costs.

Outputs (:func:`check_outputs`, here and again on rank 0 before training): the ``--report``
path can be written atomically (``planner.artifacts.files.check_output_path``: not a directory
or a device such as ``/dev/full``, its directory exists and takes a new file, ``/proc`` does
not); the ``--checkpoint-dir`` is a directory that takes files, is not locked by another run
(``planner.runtime.checkpoint_files.DirectoryLock``) and has room for one checkpoint
(:func:`checkpoint_bytes`: every parameter and buffer, plus the optimizer's state, in the
run's dtype). With ``--resume`` (:func:`check_resume`): a checkpoint exists, and the newest
one's recorded settings match the run's (lr, dtype, optimizer, seed, plan; ``--steps`` above
the steps done), refused in one line otherwise; the ranks check again against the step they
actually load (the newest intact on every rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.files import check_output_path
from planner.artifacts.kinds import RUNTIME_DTYPES, DType, OptimizerFamily
from planner.artifacts.plan import Plan
from planner.runtime import checkpoint_files as ckpt
from planner.runtime.checkpoint_settings import compare_settings, run_settings_record

__all__ = [
    "RUNTIME_DTYPES",
    "RUNTIME_OPTIMIZERS",
    "RunSettings",
    "check_launch",
    "check_outputs",
    "check_resume",
    "check_world_size",
    "checkpoint_bytes",
    "run_settings",
]

#: room for a checkpoint's file headers and the manifest, beyond its tensors
CHECKPOINT_OVERHEAD_BYTES = 1 << 16

#: the optimizers the runtime runs (``--optimizer``)
RUNTIME_OPTIMIZERS = tuple(OptimizerFamily)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSettings:
    """The dtype and optimizer a run uses, and the warnings to print before it starts."""

    dtype: DType
    optimizer: OptimizerFamily
    warnings: tuple[str, ...] = ()


def run_settings(
    plan: Plan, dtype: DType | None, optimizer: OptimizerFamily | None, source: str = "plan"
) -> RunSettings:
    """Resolve ``--dtype`` and ``--optimizer`` (None = not given) against the plan (see the module
    docstring); raises :class:`PlannerInputError` on a refused mismatch."""
    dtype, warning = _run_dtype(plan, dtype, source)
    optimizer, optimizer_warning = _run_optimizer(plan, optimizer, source)
    found = (warning, optimizer_warning)
    return RunSettings(dtype=dtype, optimizer=optimizer, warnings=tuple(w for w in found if w))


def _run_dtype(plan: Plan, dtype: DType | None, source: str) -> tuple[DType, str]:
    """The run's dtype and a warning ("" for none): the plan's, refused if another is asked."""
    if dtype is not None and dtype not in RUNTIME_DTYPES:
        names = ", ".join(d.value for d in RUNTIME_DTYPES)
        raise PlannerInputError(f"--dtype must be one of {names} (got {dtype.value!r})")
    if plan.dtype in RUNTIME_DTYPES:
        if dtype is not None and dtype is not plan.dtype:
            raise PlannerInputError(
                f"{source}: --dtype {dtype.value} but the plan was priced for {plan.dtype.value} (its profile's dtype): "
                f"its byte and time predictions would be off by {_ratio(dtype, plan.dtype)}; run with --dtype "
                f"{plan.dtype.value}, or plan from a profile measured with --dtype {dtype.value}"
            )
        return plan.dtype, ""
    run = dtype or DType.FLOAT32
    if plan.dtype is None:  # unknown (a version-2 plan file)
        return run, ""
    return run, (
        f"warning: {source}: the plan was priced for {plan.dtype.value}, which the runtime does not train in; "
        f"running in {run.value} (measured bytes and times will not match the plan's)"
    )


def _run_optimizer(plan: Plan, optimizer: OptimizerFamily | None, source: str) -> tuple[OptimizerFamily, str]:
    """The run's optimizer and a warning ("" for none): the family of the plan's optimizer kind
    (``OptimizerKind.family``), SGD when unknown; the other family is warned about."""
    family = plan.optimizer.family if plan.optimizer is not None else None
    if optimizer is None:
        return family or OptimizerFamily.SGD, ""
    if family is None or optimizer is family:
        return optimizer, ""
    assert plan.optimizer is not None
    return optimizer, (
        f"warning: {source}: the plan's memory was priced for {plan.optimizer.value} but --optimizer {optimizer.value} "
        f"runs; the report predicts {optimizer.value}'s model state, not the plan's (use --optimizer {family.value} to match)"
    )


def _ratio(a: DType, b: DType) -> str:
    r = a.itemsize / b.itemsize
    return f"{r:g}x" if r >= 1 else f"1/{1 / r:g}"


def check_world_size(plan: Plan, nproc: int, source: str = "plan") -> None:
    """The process count against the plan's devices (no torch)."""
    if nproc != plan.num_devices:
        lay = plan.layout
        replicas = [lay.replicas_of(s) for s in range(lay.num_stages)]
        raise PlannerInputError(
            f"{source}: plan needs {plan.num_devices} processes ({lay.num_stages} stages, dp_degree "
            f"{lay.dp_degree}, replicas {replicas}) but --nproc is {nproc}"
        )


def checkpoint_bytes(workload: Any, dtype: DType, optimizer: OptimizerFamily) -> int:
    """Bytes of one checkpoint of the whole model: each distinct parameter and buffer in
    ``dtype``, plus AdamW's two moments per parameter (SGD without momentum keeps none), plus
    :data:`CHECKPOINT_OVERHEAD_BYTES`."""
    params: dict[int, int] = {}
    buffers = 0
    for layer in workload.layers:
        for p in layer.parameters():
            params[id(p)] = p.numel()
        buffers += sum(b.numel() for b in layer.buffers())
    per_param = dtype.itemsize + optimizer.moment_bytes(dtype.itemsize)
    return sum(params.values()) * per_param + buffers * dtype.itemsize + CHECKPOINT_OVERHEAD_BYTES


def check_outputs(report_path: str, checkpoint_dir: str, checkpoint_need: int, *, hold_lock: bool = False) -> Any:
    """Refuse, in one line, outputs the run could not write (see the module docstring); with
    ``hold_lock`` return the checkpoint directory's lock, held (None without a directory)."""
    if report_path:
        check_output_path(report_path, "--report")
    if not checkpoint_dir:
        return None
    root = Path(checkpoint_dir)
    if root.exists() and not root.is_dir():
        raise PlannerInputError(f"--checkpoint-dir {root}: is not a directory")
    lock = ckpt.DirectoryLock(root).acquire()
    try:
        check_output_path(root / ckpt.LATEST, "--checkpoint-dir", need_bytes=checkpoint_need)
    except PlannerInputError:
        lock.release()
        raise
    if not hold_lock:
        lock.release()
        return None
    return lock


def check_resume(
    plan: Plan, checkpoint_dir: str, *, settings: dict[str, Any], num_steps: int, allowed: tuple[str, ...],
    trust_unverified: bool = False,
) -> None:
    """With ``--resume``: a checkpoint exists and the newest readable manifest's settings match
    the run's (``settings``: :func:`checkpoint_settings.run_settings_record`); a directory whose
    manifests are all unreadable is refused naming the newest one's cause, and one without any
    only with ``trust_unverified`` (:func:`checkpoint_files.unverified_step`)."""
    root = Path(checkpoint_dir)
    problems = []
    for step in ckpt.complete_steps(root):
        try:
            manifest = ckpt.read_manifest(root, step)
        except ckpt.CheckpointError as exc:
            problems.append(str(exc))
            continue  # the ranks skip it too, with a warning naming it
        source = str(ckpt.step_dir(root, step) / ckpt.MANIFEST)
        compare_settings(source, manifest.get("settings", {}), settings, allowed, step, num_steps)
        return
    if problems:
        raise PlannerInputError(f"--resume: no readable checkpoint manifest in {root}: {problems[0]}")
    legacy = ckpt.unverified_step(root, trust_unverified)
    compare_settings(str(root / ckpt.LATEST), {}, {}, allowed, legacy, num_steps)


def settings_of(plan: Plan, *, lr: float, dtype: DType, optimizer: OptimizerFamily, seed: int) -> dict[str, Any]:
    """The settings record of a run with these flags (what its checkpoints record)."""
    options = SimpleNamespace(lr=lr, dtype=dtype, optimizer=optimizer, seed=seed)
    return run_settings_record(options, plan)


def check_launch(
    plan: Plan, model_spec: str, nproc: int, *, seed: int, dtype: DType, profile_path: str = "", source: str = "plan",
    optimizer: OptimizerFamily = OptimizerFamily.SGD, report_path: str = "", checkpoint_dir: str = "",
) -> None:
    """Every check a rank would make before compute, in this process, and the outputs (see the
    module docstring)."""
    check_world_size(plan, nproc, source)
    profile = None
    if profile_path:
        from planner.artifacts.profile import load_profile

        profile = load_profile(profile_path)
    from planner.runtime.check import check_plan
    from planner.runtime.model import load_workload

    workload = load_workload(model_spec, seed, dtype)  # as every rank builds it; dropped on return

    check_plan(plan, workload, nproc, source=source, profile=profile)
    if profile is not None and profile.layer_names != workload.layer_names:
        raise PlannerInputError(f"{profile_path}: profile layers do not match model {workload.name!r}")
    check_outputs(report_path, checkpoint_dir, checkpoint_bytes(workload, dtype, optimizer))
