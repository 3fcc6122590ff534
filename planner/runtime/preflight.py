"""What ``planner run`` checks before it starts torchrun: the run's settings against the plan,
then the plan against the world size and the model. One line and exit 2 on a refusal, in
the launcher's one process, instead of one traceback per rank after torchrun has started.

Settings (:func:`run_settings`), decided per case:

- **dtype**: the plan records the dtype its profile was measured in (``Plan.dtype``). By
  default the run takes it. An explicit ``--dtype`` that differs is *refused*: every byte and
  time the plan predicts (activations, parameters, compute) scales with the element size, so
  the run's measured-against-predicted figures would be off by 2x without saying so. A plan
  priced for a dtype the runtime does not train in (``bfloat16``; the runtime runs float32 or
  float64) runs in float32 with a *warning*. Plans of unknown dtype (version 2 files, ``""``)
  run in float32, or in the ``--dtype`` asked for.
- **optimizer**: the plan records the optimizer its memory was priced for (``Plan.optimizer``:
  ``sgd-fp32``, ``adam-fp32``, ``adam-mixed``, ``adam-mixed-fp32-grad``). By default the run
  takes the same family: ``sgd`` for ``sgd-fp32``, ``adamw`` for the Adam kinds (the runtime
  keeps its optimizer state in the run's dtype; mixed precision is not run). An explicit
  ``--optimizer`` of the other family runs with a *warning*: the run report prices model
  state for the runtime's own optimizer, so no measured figure is compared with a wrong
  prediction, but the run does not train the way the plan was priced. Unknown: ``sgd``.

Then (:func:`check_launch`): the world size (``--nproc``, default the plan's devices) against
the plan, without torch; then the model, built as every rank builds it (on the CPU, seeded;
released before torchrun starts), against the plan's layer names, layer count and fingerprint
(``planner.runtime.check.check_plan``, the ranks' own check); a factory that raises is refused
here too; and a ``--profile`` whose layers differ from the model's. Only torch and the
model's own modules are imported (``torch.distributed.tensor`` only for a tensor-parallel
plan). Not on torch's ``meta`` device: its random initialisers import ``torch._dynamo``
(4-6 s here), more than building a model that fits one process costs.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.artifacts.plan import Plan
from planner.artifacts.errors import PlannerInputError

RUNTIME_DTYPES = ("float32", "float64")
RUNTIME_OPTIMIZERS = ("sgd", "adamw")


def optimizer_for(plan_optimizer: str) -> str:
    """The runtime optimizer of the plan's optimizer kind's family ("" when unknown)."""
    if plan_optimizer.startswith("sgd"):
        return "sgd"
    if plan_optimizer.startswith("adam"):
        return "adamw"
    return ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSettings:
    """The dtype and optimizer a run uses, and the warnings to print before it starts."""

    dtype: str
    optimizer: str
    warnings: tuple[str, ...] = ()


def run_settings(plan: Plan, dtype: str | None, optimizer: str | None, source: str = "plan") -> RunSettings:
    """Resolve ``--dtype`` and ``--optimizer`` (None = not given) against the plan (see the module
    docstring); raises :class:`PlannerInputError` on a refused mismatch."""
    warnings = []
    if dtype is not None and dtype not in RUNTIME_DTYPES:
        raise PlannerInputError(f"--dtype must be one of {', '.join(RUNTIME_DTYPES)} (got {dtype!r})")
    if plan.dtype in RUNTIME_DTYPES:
        if dtype is not None and dtype != plan.dtype:
            raise PlannerInputError(
                f"{source}: --dtype {dtype} but the plan was priced for {plan.dtype} (its profile's dtype): "
                f"its byte and time predictions would be off by {_ratio(dtype, plan.dtype)}; run with --dtype "
                f"{plan.dtype}, or plan from a profile measured with --dtype {dtype}"
            )
        dtype = plan.dtype
    elif plan.dtype:
        dtype = dtype or "float32"
        warnings.append(
            f"warning: {source}: the plan was priced for {plan.dtype}, which the runtime does not train in; "
            f"running in {dtype} (measured bytes and times will not match the plan's)"
        )
    else:
        dtype = dtype or "float32"
    if optimizer is not None and optimizer not in RUNTIME_OPTIMIZERS:
        raise PlannerInputError(f"--optimizer must be one of {', '.join(RUNTIME_OPTIMIZERS)} (got {optimizer!r})")
    family = optimizer_for(plan.optimizer)
    if optimizer is None:
        optimizer = family or "sgd"
    elif family and optimizer != family:
        warnings.append(
            f"warning: {source}: the plan's memory was priced for {plan.optimizer} but --optimizer {optimizer} runs; "
            f"the report predicts {optimizer}'s model state, not the plan's (use --optimizer {family} to match)"
        )
    return RunSettings(dtype=dtype, optimizer=optimizer, warnings=tuple(warnings))


def _ratio(a: str, b: str) -> str:
    sizes = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
    r = sizes.get(a, 4) / sizes.get(b, 4)
    return f"{r:g}x" if r >= 1 else f"1/{1 / r:g}"


def check_world_size(plan: Plan, nproc: int, source: str = "plan") -> None:
    """The process count against the plan's devices (no torch)."""
    if nproc != plan.num_devices:
        raise PlannerInputError(
            f"{source}: plan needs {plan.num_devices} processes ({plan.layout.num_stages} stages, dp_degree "
            f"{plan.layout.dp_degree}, replicas {list(plan.layout.stage_replicas)}) but --nproc is {nproc}"
        )


def check_launch(
    plan: Plan, model_spec: str, nproc: int, *, seed: int, dtype: str, profile_path: str = "", source: str = "plan"
) -> None:
    """Every check a rank would make before compute, in this process (see the module docstring)."""
    check_world_size(plan, nproc, source)
    profile = None
    if profile_path:
        from planner.artifacts.profile import load_profile

        profile = load_profile(profile_path)
    from planner.runtime.check import check_plan
    from planner.runtime.model import load_workload

    workload = load_workload(model_spec, seed, dtype)  # as every rank builds it; dropped on return

    check_plan(plan, workload, nproc, source=source)
    if profile is not None and profile.layer_names != workload.layer_names:
        raise PlannerInputError(f"{profile_path}: profile layers do not match model {workload.name!r}")
