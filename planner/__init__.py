"""planner: an offline partition planner for pipeline + data parallel training.

Public API (the CLI and the notebooks use only these). Names that need torch
(``profile_model``, ``load_workload``) are imported lazily, so ``import planner`` and the
planning path never import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> "module:attribute"
_LAZY = {
    # artifacts
    "Profile": "planner.artifacts.profile:Profile",
    "Cluster": "planner.artifacts.cluster:Cluster",
    "PlanRequest": "planner.artifacts.request:PlanRequest",
    "Plan": "planner.artifacts.plan:Plan",
    "Objective": "planner.artifacts.request:Objective",
    "ScheduleKind": "planner.artifacts.request:ScheduleKind",
    "OptimizerKind": "planner.artifacts.request:OptimizerKind",
    "load_profile": "planner.artifacts.profile:load_profile",
    "save_profile": "planner.artifacts.profile:save_profile",
    "load_cluster": "planner.artifacts.cluster:load_cluster",
    "load_plan": "planner.artifacts.plan:load_plan",
    "save_plan": "planner.artifacts.plan:save_plan",
    "CLUSTER_PRESETS": "planner.artifacts.cluster:PRESETS",
    "Workload": "planner.models.workload:Workload",
    "default_profile_path": "planner.profiling.defaults:default_profile_path",
    "profile_model": "planner.profiling.measured:profile_model",
    "load_workload": "planner.models:load_workload",
    "analytic_gpt_profile": "planner.profiling.analytic.gpt:gpt_profile",
    "analytic_llama_profile": "planner.profiling.analytic.llama:llama_profile",
    "read_hf_config": "planner.profiling.analytic.llama:read_config",
    # planning
    "plan": "planner.solve:plan",
    "simulate": "planner.simulation:simulate",
    "predict": "planner.simulation.predict:predict",
    "partition_bounds": "planner.simulation.bounds:partition_bounds",
    "machine_bound_ms": "planner.simulation.bounds:machine_bound_ms",
    "me_index": "planner.simulation.predict:me_index",
    "plot_timeline": "planner.report.figures:plot_timeline",
    "plot_memory": "planner.report.figures:plot_memory",
    "format_plan": "planner.report.table:format_plan",
    "compare": "planner.report.compare:compare",
    "plot_timelines": "planner.report.figures_compare:plot_timelines",
    "plot_stage_memory": "planner.report.figures_compare:plot_stage_memory",
    "plot_pareto": "planner.report.figures_compare:plot_pareto",
    "load_report": "planner.artifacts.report:load_report",
    # a long-lived process (a notebook planning many requests)
    "reset_caches": "planner.artifacts.caches:reset",
    "cache_sizes": "planner.artifacts.caches:sizes",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    module_name, attr = target.split(":")
    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names with the lazily imported public API (``dir(planner)``, completion)."""
    return sorted(set(globals()) | set(_LAZY))
