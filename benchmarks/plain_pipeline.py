"""Baseline for runtime_overhead.py: plain ``torch.distributed.pipelining``, nothing of ours
but the layer split, the plan's Layout (which stage a rank runs, where the tied copies are) and
the emulated compute (each chunk stretched to its profiled time, as ``planner.runtime.emulate``
does), so both sides do identical "compute".

    torchrun --nproc-per-node P benchmarks/plain_pipeline.py PLAN MODEL PROFILE STEPS WARMUP OUT {emulate|real}

What a user would write by hand: one stage module per rank from the plan's layer range,
``PipelineStage`` with run-time shape inference, ``ScheduleGPipe``/``Schedule1F1B`` with the
default gradient scaling, SGD, and the one all-reduce that keeps tied embedding / head
copies in sync. No data parallelism (P x 1 plans only), no recompute, no measurements
beyond the step wall time (barrier before, max over ranks after).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.plan import load_plan
from planner.artifacts.profile import load_profile
from planner.models import load_workload
from planner.runtime.emulate import sleep_until, stage_chunk_ms


class EmulatedStage(PipelineStage):
    """Chunks stretched to their profiled time, as ``planner.runtime.engine.TimedStage`` does."""

    emulated_ms: tuple[float, float] = (0.0, 0.0)

    def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = super().forward_one_chunk(*args, **kwargs)
        sleep_until(start + self.emulated_ms[0] / 1000.0)
        return out

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = super().backward_one_chunk(*args, **kwargs)
        sleep_until(start + self.emulated_ms[1] / 1000.0)
        return out


def main() -> None:
    plan_path, spec, profile_path, steps, warmup, out, compute = sys.argv[1:8]
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    plan, profile = load_plan(plan_path), load_profile(profile_path)
    layout = plan.layout
    if layout.replicated_per_stage or layout.mesh_shape != (layout.num_stages, 1, 1, 1):
        raise SystemExit(f"plain_pipeline runs P x 1 plans of one stage per rank (got {layout.describe()})")
    torch.manual_seed(0)
    workload = load_workload(spec)
    (stage_idx,) = layout.stage_indices(layout.coordinates(rank)[0])
    stage_plan = plan.stages[stage_idx]
    module = nn.Sequential(*workload.layers[stage_plan.layer_start : stage_plan.layer_stop])
    stage = EmulatedStage(module, stage_idx, layout.num_stages, torch.device("cpu"))
    if compute == "emulate":
        stage.emulated_ms = stage_chunk_ms(plan, stage_idx, profile)
    cls = ScheduleGPipe if plan.schedule is ScheduleKind.GPIPE else Schedule1F1B
    schedule = cls(stage, plan.num_microbatches, loss_fn=workload.loss_fn)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    # the same training as ours: the tied embedding / head copies on the first and last stage
    # get their gradients summed (one all-reduce), which plain pipelining leaves to the user
    last = layout.num_stages - 1
    ends = [layout.rank_of(stage_idx=0), layout.rank_of(stage_idx=last)]
    tied_group = dist.new_group(ends) if workload.tied and last > 0 else None
    tied_param = None
    if tied_group is not None and rank in ends:
        layer_idx, name = next((i, n) for i, n in workload.tied[0] if stage_plan.layer_start <= i < stage_plan.layer_stop)
        tied_param = workload.layers[layer_idx].get_parameter(name)
    walls = []
    for step in range(int(steps)):
        inputs, targets = workload.make_batch(plan.global_batch, step)
        opt.zero_grad()
        dist.barrier()
        start = time.perf_counter()
        if stage_idx == 0:
            schedule.step(inputs)
        elif stage_idx == last:
            schedule.step(target=targets, losses=[])
        else:
            schedule.step()
        if tied_param is not None and tied_param.grad is not None:
            dist.all_reduce(tied_param.grad, group=tied_group)
        opt.step()
        wall = torch.tensor([(time.perf_counter() - start) * 1000.0], dtype=torch.float64)
        dist.all_reduce(wall, op=dist.ReduceOp.MAX)
        walls.append(float(wall))
    if rank == 0:
        Path(out).write_text(json.dumps({"step_ms": walls[int(warmup) :]}) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
