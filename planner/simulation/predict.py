"""A plan's predictions: the simulator's replay with the bounds beside it, the achieved model
FLOP/s and MFU, and the ME index."""

from __future__ import annotations

from dataclasses import dataclass

from planner.artifacts.plan import Plan
from planner.artifacts.plan_summary import Prediction
from planner.simulation.bounds import me_index_of, partition_bound_ms
from planner.simulation.simulator import Summary, simulate, simulate_summary
from planner.simulation.timeline import Timeline

__all__ = ["FlopsFigures", "flops_figures", "me_index", "predict"]


def predict(plan: Plan, *, optimizer_ms: float = 0.0, timeline: Timeline | None = None) -> Prediction:
    """``plan.predicted`` from the simulator and :mod:`planner.simulation.bounds`. Left as in the plan: the
    ME index (it needs a reference plan, see :func:`planner.simulation.bounds.me_index`), the machine bound,
    the model FLOPs and the device peak (they need the profile and cluster: ``build_plan``
    fills them in), and the straggler share, the overhead terms and the band; the iteration is
    the replay's lengthened by the straggler share (:mod:`planner.cost.overheads`: the job waits
    for its slowest GPU), and the achieved TFLOP/s and MFU follow it. Without a ``timeline`` the
    replay's figures come from :func:`simulate_summary` (the same numbers, without building the
    Timeline)."""
    t: Timeline | Summary = timeline if timeline is not None else simulate_summary(plan, optimizer_ms=optimizer_ms)
    old = plan.predicted
    iteration = t.iteration_ms * (1.0 + old.straggler_fraction)
    flops = flops_figures(old.model_flops_per_iteration, iteration, plan.num_devices, old.device_peak_tflops)
    return Prediction(
        iteration_ms=iteration,
        throughput_samples_per_s=plan.global_batch / iteration * 1e3 if iteration > 0 else 0.0,
        peak_memory_bytes=t.peak_memory_bytes,
        bubble_fraction=t.bubble_fraction,
        exposed_allreduce_ms=t.exposed_allreduce_ms,
        partition_bound_ms=partition_bound_ms(plan),
        machine_bound_ms=old.machine_bound_ms,
        model_flops_per_iteration=flops.model_flops_per_iteration,
        achieved_tflops_per_device=flops.achieved_tflops_per_device,
        device_peak_tflops=old.device_peak_tflops,
        mfu=flops.mfu,
        me_index=old.me_index,
        me_reference=old.me_reference,
        straggler_fraction=old.straggler_fraction,
        overheads=old.overheads,
        band=old.band,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class FlopsFigures:
    model_flops_per_iteration: float
    achieved_tflops_per_device: float
    mfu: float


def flops_figures(
    model_flops_per_iteration: float, iteration_ms: float, num_devices: int, peak_tflops: float
) -> FlopsFigures:
    """Achieved model TFLOP/s per device (model FLOPs / time / devices, recomputation not
    counted) and MFU = achieved / peak (Chowdhery et al. 2022); zeros where unknown."""
    achieved = (
        model_flops_per_iteration / (iteration_ms / 1e3) / num_devices / 1e12
        if model_flops_per_iteration > 0 and iteration_ms > 0 and num_devices > 0
        else 0.0
    )
    return FlopsFigures(
        model_flops_per_iteration=model_flops_per_iteration,
        achieved_tflops_per_device=achieved,
        mfu=achieved / peak_tflops if peak_tflops > 0 else 0.0,
    )


def _throughput_and_peak(plan: Plan) -> tuple[float, float]:
    """From ``plan.predicted`` when filled in, else from the simulator."""
    pred = plan.predicted
    if pred.iteration_ms > 0 and pred.peak_memory_bytes > 0:
        return plan.global_batch / pred.iteration_ms * 1e3, float(pred.peak_memory_bytes)
    timeline = simulate(plan)
    return plan.global_batch / timeline.iteration_ms * 1e3, float(timeline.peak_memory_bytes)


def me_index(plan: Plan, reference_plan: Plan) -> float:
    """The ME index of ``plan`` against ``reference_plan`` (samples/s over peak bytes per device)."""
    thr, peak = _throughput_and_peak(plan)
    ref_thr, ref_peak = _throughput_and_peak(reference_plan)
    return me_index_of(thr, peak, ref_thr, ref_peak)
