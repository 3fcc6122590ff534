"""The routed experts' grouped GEMMs at the GEMM model's efficiency for the tokens each expert
receives (no torch), and the line through two micro-batch sizes the analytic layers are fitted as;
shared by the analytic MoE profiles (:mod:`planner.profiling.analytic.moe`) and the cost model's
per-device expert view (:mod:`planner.cost.experts`)."""

from __future__ import annotations

from planner.artifacts.timefit import TimeFit
from planner.profiling.analytic.gemm import GemmModel

__all__ = ["FIT_SIZES", "expert_gemm_ms", "line_through"]

#: micro-batch sizes the expert lines are fitted through (as every analytic layer's)
FIT_SIZES = (1, 8)


def expert_gemm_ms(model: GemmModel, peak_flops_per_ms: float, *, tokens_per_expert: float, experts: float, hidden: int,
                   ffn: float, backward: bool = False) -> float:
    """The routed experts' grouped GEMMs on one device: ``experts`` products ``m x h . h x 2F`` and
    ``m x F . F x h`` over ``m = tokens_per_expert``, each at the GEMM model's efficiency for its
    shape (backward: input and weight gradients, twice the forward)."""
    if tokens_per_expert <= 0 or experts <= 0:
        return 0.0
    m, h, f = tokens_per_expert, float(hidden), ffn
    up = 2.0 * m * 2.0 * f * h / model.efficiency(m, 2.0 * f, h)
    down = 2.0 * m * h * f / model.efficiency(m, h, f)
    return experts * (up + down) / peak_flops_per_ms * (2.0 if backward else 1.0)


def line_through(ys: dict[int, float]) -> TimeFit:
    """The line through the times at :data:`FIT_SIZES`."""
    (b0, b1) = FIT_SIZES
    slope = max(0.0, (ys[b1] - ys[b0]) / (b1 - b0))
    return TimeFit(intercept_ms=max(ys[b0] - slope * b0, -slope), per_sample_ms=slope)
