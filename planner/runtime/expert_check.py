"""Whether the runtime can run a plan's expert layout on a workload, checked before any process
starts (``planner run``'s preflight, :mod:`planner.runtime.check`) and again in each rank; kept
apart from :mod:`planner.runtime.experts`, which imports ``torch.distributed.tensor`` (seconds)
through the data-parallel hooks."""

from __future__ import annotations

from planner.artifacts.kinds import ZeroStage
from planner.artifacts.layout import Layout
from planner.artifacts.plan import Plan
from planner.models.experts import expert_modules
from planner.models.workload import Workload

__all__ = ["expert_parallel_refusal", "experts_folded"]


def experts_folded(layout: Layout, workload: Workload) -> bool:
    """Whether the runtime lays the workload's routed experts out apart from attention (module docstring)."""
    if layout.replicated_per_stage or layout.ep_degree * layout.etp_degree * layout.tp_degree == 1:
        return False
    return any(expert_modules(layer) for layer in workload.layers)


def expert_parallel_refusal(plan: Plan, workload: Workload) -> str:
    """Why the runtime cannot run ``plan``'s expert layout on ``workload`` ("" when it can)."""
    layout = plan.layout
    ep, etp = layout.ep_degree, layout.etp_degree
    experts = [m for layer in workload.layers for m in expert_modules(layer)]
    if ep * etp > 1 and not experts:
        return (f"ep_degree {ep} x etp_degree {etp}: model {workload.name!r} has no routed experts "
                "(planner.models.experts.RoutedExperts)")
    for module in experts:
        if module.num_experts % ep:
            return f"ep_degree {ep} does not divide the model's {module.num_experts} experts per layer"
        if module.w1.size(-1) % etp:
            return f"etp_degree {etp} does not divide the experts' ffn width {module.w1.size(-1)}"
    if experts_folded(layout, workload) and layout.zero is ZeroStage.PARAMETERS:
        return (f"ZeRO 3 with experts folded (ep {ep} x etp {etp} x tp {layout.tp_degree}): the runtime shards "
                "the experts' state over their edp group with ZeRO 1 and 2 only")
    return ""
