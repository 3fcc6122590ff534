"""Gather every rank's measurements to rank 0 and build the RunReport.

Gathered as one float64 tensor per rank (``all_gather``, no pickled objects); byte counts
stay exact below 2**53. A row is the rank's idle ms and CUDA peak bytes, then compute ms,
peak saved bytes, optimizer state bytes and gradient bytes held after the sync of each stage
it runs (v of them, in its order ``Layout.stage_indices``: p, p + P, ...; ``PER_STAGE`` values
each); a stage's record takes the maximum over its replicas' ranks (or copies': a stage
replicated per stage predicts M / R_s micro-batches of compute per copy). Idle time is per
rank: wall time less the compute of all the rank's stages. With emulated compute, a stage's
overrun is its rank that overran the largest fraction of its emulated time
(``planner.runtime.emulate.finish_chunk``).
"""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from planner import __version__
from planner.artifacts.kinds import ZeroStage
from planner.artifacts.plan import Plan, PlanStage
from planner.artifacts.report import (
    OVERRUN_LIMIT,
    RunReport,
    StageRecord,
    StepRecord,
    relative_error,
)
from planner.runtime.options import RuntimeOptions
from planner.runtime.runner import RankMeasure
from planner.runtime.zero import state_bytes_per_param
from planner.schedule import held_bytes, held_counts

#: compute ms, saved bytes, optimizer state bytes, gradient bytes, overrun ms, max overrun ms, emulated ms, and per
#: micro-batch: saved bytes, the hooks' bytes of the allocator's storages, the allocator's bytes
PER_STAGE = 10


def gather_measures(mine: RankMeasure, world_size: int, device: torch.device) -> list[list[float]]:
    values = [mine.idle_ms, float(mine.cuda_peak_bytes)]
    num = len(mine.stage_compute_ms)
    optim = mine.stage_optimizer_state_bytes or (0,) * num  # runners that do not measure them report 0
    grads = mine.stage_grad_bytes or (0,) * num
    over = mine.stage_overrun_ms or (0.0,) * num
    over_max = mine.stage_overrun_max_ms or (0.0,) * num
    emulated = mine.stage_emulated_ms or (0.0,) * num
    per_mb = mine.stage_saved_bytes_per_microbatch or (0,) * num
    new = mine.stage_new_saved_bytes or (0,) * num
    allocated = mine.stage_allocated_bytes or (-1,) * num
    for compute, saved, opt, grad, o, o_max, e, mb, hook, alloc in zip(
        mine.stage_compute_ms, mine.stage_saved_bytes_peak, optim, grads, over, over_max, emulated, per_mb, new, allocated
    ):
        values += [compute, float(saved), float(opt), float(grad), o, o_max, e, float(mb), float(hook), float(alloc)]
    row = torch.tensor(values, dtype=torch.float64, device=device)
    rows = [torch.zeros(len(values), dtype=torch.float64, device=device) for _ in range(world_size)]
    dist.all_gather(rows, row)
    return [r.tolist() for r in rows]


def _plan_param_count(plan: Plan, stage: PlanStage) -> int:
    """The stage's parameters as the plan counted them: its weight bytes / the plan's weight
    bytes per parameter (0 when the plan has no memory figures)."""
    weight_bytes = plan.provenance.request.optimizer.state_bytes_per_param[0]
    return stage.memory.param_bytes // weight_bytes


def _chunk_index(plan: Plan, stage_idx: int) -> int:
    """Where stage ``stage_idx`` sits among the chunks its ranks run (``Layout.stage_indices``)."""
    layout = plan.layout
    return layout.stage_indices(layout.pipeline_rank(stage_idx)).index(stage_idx)


def _overrun_fraction(overrun_ms: float, emulated_ms: float) -> float:
    """Overrun over the emulated time it stretched (1 when there was nothing to stretch)."""
    return overrun_ms / emulated_ms if emulated_ms > 0 else float(overrun_ms > 0)


def build_report(
    plan: Plan,
    options: RuntimeOptions,
    mine: RankMeasure,
    rows: list[list[float]],
    *,
    model: str,
    fingerprint: str,
    backend: str,
    device: str,
) -> RunReport:
    stages = []
    layout = plan.layout
    element_size = options.dtype.itemsize
    optim_per_param = state_bytes_per_param(options.optimizer, element_size)
    held = held_counts(plan.schedule, plan.layout, plan.num_microbatches)
    for stage in plan.stages:
        own = [rows[r] for r in stage.ranks]
        k = 2 + PER_STAGE * _chunk_index(plan, stage.stage_idx)  # this stage's chunk on its ranks
        compute = max(r[k] for r in own)
        idle = max(r[0] for r in own)
        saved = int(max(r[k + 1] for r in own))
        cuda = int(max(r[1] for r in own))
        per_copy = plan.num_microbatches // layout.replicas_of(stage.stage_idx)  # a stage's copy runs M / R_s
        compute_pred = per_copy * (stage.fwd_ms + stage.bwd_ms + stage.recompute_ms)
        # the peak the plan's schedule holds, walked on its order (whole micro-batches and those past I)
        act_pred = int(held_bytes(held[stage.stage_idx], stage.activation_bytes_per_microbatch, stage.wgrad_bytes_per_microbatch))
        shards = len(stage.ranks) if layout.zero else 1
        params = _plan_param_count(plan, stage)
        optim, grads = int(max(r[k + 2] for r in own)), int(max(r[k + 3] for r in own))
        worst = max(own, key=lambda r: _overrun_fraction(r[k + 4], r[k + 6]))  # overran most
        overrun, overrun_max, emulated = worst[k + 4], max(r[k + 5] for r in own), worst[k + 6]
        optim_pred = -(-params * optim_per_param // shards)  # ceil: the last shard is padded
        # per micro-batch: the rank whose allocator saw the most (the stage's replicas run the same shapes)
        mb_saved = int(max(r[k + 7] for r in own))
        by_alloc = max(own, key=lambda r: r[k + 9])
        alloc, hook = int(by_alloc[k + 9]), int(by_alloc[k + 8])
        grads_pred = -(-params * element_size // (shards if layout.zero >= ZeroStage.GRADIENTS else 1))
        stages.append(
            StageRecord(
                stage_idx=stage.stage_idx,
                ranks=stage.ranks,
                compute_ms=compute,
                idle_ms=idle,
                compute_ms_predicted=compute_pred,
                compute_rel_error=relative_error(compute, compute_pred),
                saved_bytes_peak=saved,
                activation_bytes_predicted=act_pred,
                activation_rel_error=relative_error(saved, act_pred),
                cuda_peak_bytes=cuda,
                memory_total_bytes_predicted=stage.memory_total_bytes,
                memory_rel_error=relative_error(cuda, stage.memory_total_bytes) if cuda else 0.0,
                optimizer_shards=shards,
                optimizer_state_bytes=optim,
                optimizer_state_bytes_predicted=optim_pred,
                optimizer_state_rel_error=relative_error(optim, optim_pred),
                grad_bytes_after_sync=grads,
                grad_bytes_predicted=grads_pred,
                grad_rel_error=relative_error(grads, grads_pred),
                overrun_ms=overrun,
                overrun_max_ms=overrun_max,
                overrun_fraction=_overrun_fraction(overrun, emulated),
                saved_bytes_per_microbatch=mb_saved,
                activation_bytes_per_microbatch_predicted=stage.activation_bytes_per_microbatch,
                microbatch_rel_error=relative_error(mb_saved, stage.activation_bytes_per_microbatch),
                allocator_bytes_per_microbatch=alloc,
                allocator_hook_bytes_per_microbatch=hook,
                allocator_rel_error=relative_error(hook, alloc) if alloc > 0 else 0.0,
            )
        )
    steps = tuple(StepRecord(step_idx=s.step_idx, loss=s.loss, wall_ms=s.wall_ms) for s in mine.steps)
    timed = [s.wall_ms for s in steps[options.warmup_steps :]] or [s.wall_ms for s in steps]
    iteration = statistics.median(timed) if timed else 0.0
    predicted = plan.predicted.iteration_ms
    worst_overrun = max((s.overrun_fraction for s in stages), default=0.0)
    return RunReport(
        model=model,
        plan_fingerprint_sha256=fingerprint,
        world_size=len(rows),
        backend=backend,
        device=device,
        dtype=options.dtype,
        optimizer=options.optimizer,
        emulate=options.emulate,
        layout=layout,
        num_microbatches=plan.num_microbatches,
        microbatch_size=plan.microbatch_size,
        schedule=plan.schedule,
        optimizer_state_bytes_per_param=optim_per_param,
        warmup_steps=options.warmup_steps,
        steps=steps,
        stages=tuple(stages),
        iteration_ms=iteration,
        iteration_ms_predicted=predicted,
        iteration_rel_error=relative_error(iteration, predicted),
        emulation_overrun_fraction=worst_overrun if options.emulate else 0.0,
        fidelity_sample=options.emulate and worst_overrun <= OVERRUN_LIMIT,
        versions={"planner": __version__, "torch": torch.__version__},
    )
