"""Run many runtime configurations in one torchrun launch and compare each with
one-process training on the same global batches (the reference is computed on every rank).

Usage (what tests/test_runtime_numerics.py does)::

    torchrun --nproc-per-node N tests/runtime_driver.py CONFIGS.json OUT.json

CONFIGS.json is a list of objects with: name, model (factory spec), boundaries, dp_degree,
num_microbatches, microbatch_size, schedule, recompute, dtype, optimizer, steps, and
optionally virtual_stages_per_rank (interleaved 1F1B). Every config
must use all N processes. Rank 0 writes OUT.json: per config, the losses of both runs and the
max absolute and relative differences of losses and of every stage's final gradients.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.artifacts.request import ScheduleKind  # noqa: E402
from planner.runtime.engine import RankRunner  # noqa: E402
from planner.runtime.model import cast_batch, cast_workload, load_workload  # noqa: E402
from planner.runtime.options import RuntimeOptimizer, RuntimeOptions  # noqa: E402
from tests.factories import make_plan  # noqa: E402

LR = 0.05


def _optimizer(kind: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=LR, foreach=False)
    return torch.optim.SGD(params, lr=LR, foreach=False)


def reference(cfg: dict[str, Any], global_batch: int) -> tuple[list[float], list[list[torch.Tensor]]]:
    """One process, whole model, whole global batch: losses per step and the last grads per layer."""
    workload = load_workload(cfg["model"], 0, cfg["dtype"])
    cast_workload(workload, cfg["dtype"])
    unique = list({id(p): p for layer in workload.layers for p in layer.parameters()}.values())
    opt = _optimizer(cfg["optimizer"], unique)
    losses = []
    for step in range(cfg["steps"]):
        opt.zero_grad(set_to_none=True)
        inputs, targets = workload.make_batch(global_batch, step)
        x = cast_batch(inputs, cfg["dtype"])
        for layer in workload.layers:
            x = layer(x)
        loss = workload.loss_fn(x, targets)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach().double()))
    grads = [[p.grad.detach().clone() for p in layer.parameters()] for layer in workload.layers]
    return losses, grads


def run_config(cfg: dict[str, Any], rank: int) -> dict[str, Any]:
    workload = load_workload(cfg["model"], 0, cfg["dtype"])
    plan = make_plan(
        workload.layer_names,
        tuple(cfg["boundaries"]),
        dp_degree=cfg["dp_degree"],
        num_microbatches=cfg["num_microbatches"],
        microbatch_size=cfg["microbatch_size"],
        schedule=ScheduleKind(cfg["schedule"]),
        recompute=cfg["recompute"],
        virtual_stages_per_rank=cfg.get("virtual_stages_per_rank", 1),
    )
    if plan.num_devices != dist.get_world_size():
        raise ValueError(f"config {cfg['name']} needs {plan.num_devices} processes")
    cast_workload(workload, cfg["dtype"])
    options = RuntimeOptions(
        plan_path="<driver>",
        model_spec=cfg["model"],
        num_steps=cfg["steps"],
        dtype=cfg["dtype"],
        optimizer=RuntimeOptimizer(cfg["optimizer"]),
        lr=LR,
        warmup_steps=0,
        timeout_s=60.0,
    )
    runner = RankRunner(plan, workload, options, rank, torch.device("cpu"))
    measure = runner.run()
    ref_losses, ref_grads = reference(cfg, plan.global_batch)
    abs_diff, scale = 0.0, 0.0
    for chunk in runner.chunks:  # every stage the rank ran (several with interleaved 1F1B)
        for k, layer in enumerate(chunk.module.layers):
            for p, ref in zip(layer.parameters(), ref_grads[chunk.stage_plan.layer_start + k]):
                abs_diff = max(abs_diff, float((p.grad.double() - ref.double()).abs().max()))
                scale = max(scale, float(ref.double().abs().max()))
    stats = torch.tensor([abs_diff, abs_diff / scale if scale else 0.0], dtype=torch.float64)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    losses = [s.loss for s in measure.steps]
    loss_abs = max(abs(a - b) for a, b in zip(losses, ref_losses))
    loss_rel = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    return {
        "name": cfg["name"],
        "losses": losses,
        "ref_losses": ref_losses,
        "loss_abs_diff": loss_abs,
        "loss_rel_diff": loss_rel,
        "grad_abs_diff": float(stats[0]),
        "grad_rel_diff": float(stats[1]),
        "saved_bytes_peak": measure.saved_bytes_peak,
    }


def main() -> None:
    configs = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    torch.set_default_dtype(torch.float32)
    results = [run_config(cfg, rank) for cfg in configs]
    if rank == 0:
        out.write_text(json.dumps(results, indent=2))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
