"""Run plans replicated per stage in one torchrun launch and compare each with one-process
training on the same global batches (the reference is computed on every rank).

Usage (what tests/test_runtime_replicated.py does)::

    torchrun --nproc-per-node N tests/replicated_driver.py CONFIGS.json OUT.json

CONFIGS.json is a list of objects with: name, plan (a plan JSON path), model, dtype,
optimizer, steps, and optionally checkpoint_dir (then the run stops after step 1 with a
checkpoint, and a fresh runner resumes from it for the remaining steps). Every plan must use
all N processes. Rank 0 writes OUT.json: per config, the losses of both runs, the max
differences of losses and of the final parameters, and each rank's peak saved bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.artifacts.kinds import DType, OptimizerFamily
from planner.artifacts.plan import load_plan
from planner.runtime.model import cast_workload, load_workload
from planner.runtime.options import RuntimeOptions
from planner.runtime.replicated import ReplicatedRunner
from planner.runtime.runner import RankMeasure
from tests.runtime_driver import LR, reference, serve


def _runner(cfg: dict[str, Any], rank: int, **kw: Any) -> ReplicatedRunner:
    plan = load_plan(cfg["plan"])
    dtype = DType(cfg["dtype"])
    workload = load_workload(cfg["model"], 0, dtype)
    cast_workload(workload, dtype)
    options = RuntimeOptions(
        plan_path=cfg["plan"],
        model_spec=cfg["model"],
        dtype=dtype,
        optimizer=OptimizerFamily(cfg["optimizer"]),
        lr=LR,
        warmup_steps=0,
        timeout_s=60.0,
        **kw,
    )
    return ReplicatedRunner(plan, workload, options, rank, torch.device("cpu"))


def _train(cfg: dict[str, Any], rank: int) -> tuple[ReplicatedRunner, list[float], RankMeasure]:
    """Train ``cfg["steps"]`` steps; with a checkpoint directory, as a run of one step that
    saves and a fresh run that resumes."""
    steps = cfg["steps"]
    directory = cfg.get("checkpoint_dir", "")
    if not directory:
        runner = _runner(cfg, rank, num_steps=steps)
        measure = runner.run()
        return runner, [s.loss for s in measure.steps], measure
    first = _runner(cfg, rank, num_steps=1, checkpoint_dir=directory, checkpoint_every=1).run()
    dist.barrier()  # rank 0 writes latest.json after the checkpoint's own barrier
    runner = _runner(cfg, rank, num_steps=steps, checkpoint_dir=directory, resume=True)
    measure = runner.run()
    return runner, [s.loss for s in first.steps] + [s.loss for s in measure.steps], first


def run_config(cfg: dict[str, Any], rank: int) -> dict[str, Any]:
    runner, losses, measure = _train(cfg, rank)
    ref_losses, ref_grads, ref_params = reference(cfg, runner.plan.global_batch)
    diffs = [0.0, 0.0, 0.0, 0.0]  # params abs, params scale, grads abs, grads scale
    (chunk,) = runner.chunks  # one stage per rank
    for k, layer in enumerate(chunk.module.layers):
        idx = chunk.stage_plan.layer_start + k
        for p, ref, ref_grad in zip(layer.parameters(), ref_params[idx], ref_grads[idx], strict=True):
            pairs = [(p.detach(), ref)] + ([(p.grad, ref_grad)] if p.grad is not None else [])  # ZeRO: shard only
            for j, (got, want) in enumerate(pairs):
                diffs[2 * j] = max(diffs[2 * j], float((got.double() - want.double()).abs().max()))
                diffs[2 * j + 1] = max(diffs[2 * j + 1], float(want.double().abs().max()))
    stats = torch.tensor(diffs, dtype=torch.float64)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    saved = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(saved, torch.tensor([float(measure.saved_bytes_peak)], dtype=torch.float64))
    return {
        "name": cfg["name"],
        "losses": losses,
        "ref_losses": ref_losses,
        "loss_rel_diff": max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True)),
        "param_rel_diff": float(stats[0] / stats[1]),
        "grad_rel_diff": float(stats[2] / stats[3]),
        "saved_bytes_peak": [int(t.item()) for t in saved],
    }


def main() -> None:
    serve(run_config)


if __name__ == "__main__":
    main()
