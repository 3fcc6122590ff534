"""Exports of a plan for other tools (no torch).

- :func:`stage_module_names`: the layer names of each pipeline stage, in stage order -- the
  list of lists of module names torchtitan's pipeline splitting takes
  (``module_names_per_model_chunk``) and our runtime consumes;
- :func:`write_stage_module_names`: the same as a JSON document (a bare list of lists);
- :func:`write_plan_schedule_csv`: the plan's per-rank compute schedule in the CSV
  ``torch.distributed.pipelining`` loads (:func:`planner.schedule.write_schedule_csv`);
- :func:`torchtitan_config`: the plan as the ``[training]``, ``[parallelism]`` and
  ``[activation_checkpoint]`` tables of a torchtitan job config (TOML): its parallelism
  degrees, pipeline schedule, micro-batch size and per-stage module names.

torchtitan mapping (decisions): t -> ``tensor_parallel_degree`` (+ ``enable_sequence_parallel``);
cp > 1 -> ``context_parallel_degree`` (torchtitan's FSDP then shards over dp_shard x cp, the
group the plan synchronises gradients over);
P -> ``pipeline_parallel_degree`` (interleaved: ranks, with one module list per virtual stage);
D without ZeRO -> ``data_parallel_replicate_degree``; D with ZeRO 1/2 ->
``data_parallel_shard_degree`` with ``fsdp_reshard_after_forward = "never"``: torchtitan shards
with FSDP2, whose never-resharding mode keeps whole weights through the step like ZeRO 1/2 but
also shards the gradients (ZeRO 2), so the memory it reaches is at most ours; D with ZeRO 3 ->
``data_parallel_shard_degree`` with ``fsdp_reshard_after_forward = "always"`` (weights gathered
for each forward and backward; under pipelining torch defers the gradient reduce-scatter to
the last micro-batch, so torchtitan then holds whole gradients, more than ZeRO 3 is priced
with: :mod:`planner.cost.fsdp`). Recomputation:
``none``, ``full`` when every layer is recomputed, else ``selective`` every N-th layer
(torchtitan's layer-wise option) with the exact per-stage sets in a comment; a plan that
recomputes attention cores only (selective, Korthikanti et al. 2022) maps to torchtitan's
op-level ``selective`` option, the nearest it has, with the per-stage layers in a comment. Module names are
the profile's layer names: a model whose module FQNs differ (``tok_embeddings``, ``layers.0``,
``norm``, ``output``) needs them renamed. Per-stage replication has no torchtitan form: refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ScheduleKind, ZeroStage
from planner.artifacts.plan import Plan
from planner.schedule import layout_schedule, write_schedule_csv

__all__ = ["stage_module_names", "torchtitan_config", "write_plan_schedule_csv", "write_stage_module_names"]

_TITAN_SCHEDULES = {
    ScheduleKind.GPIPE: "GPipe", ScheduleKind.ONE_F_ONE_B: "1F1B", ScheduleKind.INTERLEAVED_1F1B: "Interleaved1F1B",
    ScheduleKind.ZB_H1: "InterleavedZeroBubble", ScheduleKind.ZBV: "ZBVZeroBubble",  # torch's class names less "Schedule"
    ScheduleKind.DUALPIPE_V: "DualPipeV",
}


def stage_module_names(plan: Plan) -> list[list[str]]:
    """Per stage (virtual stages included, in stage order), the names of its layers."""
    return [list(stage.layer_names) for stage in plan.stages]


def write_stage_module_names(plan: Plan, path: str | Path) -> None:
    Path(path).write_text(json.dumps(stage_module_names(plan), indent=2) + "\n")


def write_plan_schedule_csv(plan: Plan, path: str | Path) -> None:
    lay = plan.layout
    if plan.schedule is ScheduleKind.DUALPIPE:
        raise PlannerInputError("schedule dualpipe: its devices hold a stage of each of two copies, which "
                                "torch.distributed.pipelining's CSV schedules (one rank per stage) cannot say")
    if lay.replicated_per_stage:
        raise PlannerInputError(
            "the plan replicates stages per stage (copies "
            f"{'+'.join(map(str, lay.stage_replicas))}): torch.distributed.pipelining's CSV schedules run one "
            "stage per rank; its per-rank orders are planner.schedule.build_replicated_schedule's, run by "
            "planner's own runtime"
        )
    write_schedule_csv(layout_schedule(plan.schedule, lay, plan.num_microbatches), path)


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def torchtitan_config(plan: Plan) -> str:
    """The plan as torchtitan job-config TOML (see the module docstring for the mapping)."""
    lay = plan.layout
    if lay.replicated_per_stage:
        raise PlannerInputError(
            f"the plan replicates stages per stage (copies {'+'.join(map(str, lay.stage_replicas))}): "
            "torchtitan's pipelines have one copy of every stage"
        )
    if plan.schedule not in _TITAN_SCHEDULES:
        raise PlannerInputError(f"schedule {plan.schedule.value}: torch.distributed.pipelining has no class for it, "
                                "so torchtitan cannot run it")
    rc = [list(s.recompute) for s in plan.stages]
    sel = [list(s.recompute_selective) for s in plan.stages]
    n_rc = sum(map(len, rc))
    if n_rc == 0 and any(sel):  # the attention core only: torchtitan's op-level selective AC is the nearest
        ac: dict[str, object] = {"mode": "selective", "selective_ac_option": "op"}
    elif n_rc == 0:
        ac = {"mode": "none"}
    elif n_rc == plan.num_layers:
        ac = {"mode": "full"}
    else:
        ac = {"mode": "selective", "selective_ac_option": str(max(1, round(plan.num_layers / n_rc)))}
    tables: dict[str, dict[str, object]] = {
        "training": {
            "global_batch_size": plan.global_batch,
            "local_batch_size": plan.global_batch // lay.dp_degree,
        },
        "parallelism": {
            "data_parallel_replicate_degree": 1 if lay.zero else lay.dp_degree,
            "data_parallel_shard_degree": lay.dp_degree if lay.zero else 1,
            "tensor_parallel_degree": lay.tp_degree,
            "enable_sequence_parallel": lay.sequence_parallel,
            "pipeline_parallel_degree": lay.pipeline_size,
            "pipeline_parallel_schedule": _TITAN_SCHEDULES[plan.schedule],
            "pipeline_parallel_microbatch_size": plan.microbatch_size,
            "module_fqns_per_model_part": stage_module_names(plan),
        },
        "activation_checkpoint": ac,
    }
    if lay.cp_degree > 1:  # torchtitan shards FSDP over dp_shard x cp, as the plan synchronises over dp x cp
        tables["parallelism"]["context_parallel_degree"] = lay.cp_degree
    if lay.zero:
        tables["parallelism"]["fsdp_reshard_after_forward"] = "always" if lay.zero is ZeroStage.PARAMETERS else "never"
    prov = plan.provenance
    lines = [
        f"# torchtitan job config for the plan of {prov.model} on {prov.cluster_name} ({plan.num_devices} devices),",
        f"# written by planner export; predicted {plan.predicted.iteration_ms:.2f} ms per iteration.",
        f"# planner layout: T={lay.tp_degree} x {f'CP={lay.cp_degree} x ' if lay.cp_degree > 1 else ''}"
        f"P={lay.num_stages} x D={lay.dp_degree}, ZeRO-{int(lay.zero)}, "
        f"{plan.num_microbatches} micro-batches of {plan.microbatch_size}.",
        "# Module names are the profile's layer names: rename them to your model's module FQNs.",
    ]
    if ac["mode"] == "selective" and n_rc:
        lines.append(f"# planner recomputes, per stage: {rc}")
    if any(sel):
        lines.append(f"# planner recomputes the attention core only (selective), per stage: {sel}")
    for name, table in tables.items():
        lines += ["", f"[{name}]"] + [f"{k} = {_toml(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"
