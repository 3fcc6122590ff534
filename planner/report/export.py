"""Exports of a plan for other tools (no torch).

- :func:`stage_module_names`: the layer names of each pipeline stage, in stage order -- the
  list of lists of module names torchtitan's pipeline splitting takes
  (``module_names_per_model_chunk``) and our runtime consumes;
- :func:`write_stage_module_names`: the same as a JSON document (a bare list of lists);
- :func:`write_plan_schedule_csv`: the plan's per-rank compute schedule in the CSV
  ``torch.distributed.pipelining`` loads (:func:`planner.schedule.write_schedule_csv`).
"""

from __future__ import annotations

import json
from pathlib import Path

from planner.artifacts.plan import Plan
from planner.errors import PlannerInputError
from planner.schedule import build_schedule, write_schedule_csv

__all__ = ["stage_module_names", "write_plan_schedule_csv", "write_stage_module_names"]


def stage_module_names(plan: Plan) -> list[list[str]]:
    """Per stage (virtual stages included, in stage order), the names of its layers."""
    return [list(stage.layer_names) for stage in plan.stages]


def write_stage_module_names(plan: Plan, path: str | Path) -> None:
    Path(path).write_text(json.dumps(stage_module_names(plan), indent=2) + "\n")


def write_plan_schedule_csv(plan: Plan, path: str | Path) -> None:
    if plan.replicated_per_stage:
        raise PlannerInputError(
            "the plan replicates stages per stage (copies "
            f"{'+'.join(map(str, plan.stage_replicas))}): torch.distributed.pipelining's CSV schedules run one "
            "stage per rank; its per-rank orders are planner.schedule.build_replicated_schedule's, run by "
            "planner's own runtime"
        )
    schedule = build_schedule(plan.schedule, plan.num_stages, plan.num_microbatches, plan.virtual_stages_per_rank)
    write_schedule_csv(schedule, path)
