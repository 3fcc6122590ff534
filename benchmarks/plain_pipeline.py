"""Baseline for runtime_overhead.py: plain ``torch.distributed.pipelining``, nothing of ours
but the layer split and the emulated compute (each chunk stretched to its profiled time,
as ``planner.runtime.emulate`` does), so both sides do identical "compute".

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

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe  # noqa: E402

from planner.artifacts.plan import load_plan  # noqa: E402
from planner.artifacts.profile import load_profile  # noqa: E402
from planner.artifacts.request import ScheduleKind  # noqa: E402
from planner.models import load_workload  # noqa: E402
from planner.runtime.emulate import sleep_until, stage_chunk_ms  # noqa: E402


class EmulatedStage(PipelineStage):
    """Chunks stretched to their profiled time, as in ``planner.runtime.engine.TimedStage``."""

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
    torch.manual_seed(0)
    workload = load_workload(spec)
    stage_plan = plan.stages[rank]
    module = nn.Sequential(*workload.layers[stage_plan.layer_start : stage_plan.layer_stop])
    stage = EmulatedStage(module, rank, plan.layout.num_stages, torch.device("cpu"))
    if compute == "emulate":
        stage.emulated_ms = stage_chunk_ms(plan, rank, profile)
    cls = ScheduleGPipe if plan.schedule is ScheduleKind.GPIPE else Schedule1F1B
    schedule = cls(stage, plan.num_microbatches, loss_fn=workload.loss_fn)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    # the same training as ours: the tied embedding / head copies on the first and last stage
    # get their gradients summed (one all-reduce), which plain pipelining leaves to the user
    tied_group = dist.new_group([0, plan.layout.num_stages - 1]) if workload.tied and plan.layout.num_stages > 1 else None
    tied_param = None
    if tied_group is not None and rank in (0, plan.layout.num_stages - 1):
        layer_idx, name = next((i, n) for i, n in workload.tied[0] if stage_plan.layer_start <= i < stage_plan.layer_stop)
        tied_param = workload.layers[layer_idx].get_parameter(name)
    walls = []
    for step in range(int(steps)):
        inputs, targets = workload.make_batch(plan.global_batch, step)
        opt.zero_grad()
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            schedule.step(inputs)
        elif rank == plan.layout.num_stages - 1:
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
