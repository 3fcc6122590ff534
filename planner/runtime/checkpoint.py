"""Per-stage checkpoints: ``torch.save`` of tensors and plain containers, loaded with
``weights_only=True`` (no arbitrary unpickling).

Layout under the checkpoint directory::

    step_<k>/stage_<s>.pt   model + optimizer state of stage s after k completed steps
    step_<k>/stage_<s>.optimizer_shard_<r>.pt
                            ZeRO >= 1 only: optimizer state of shard r of stage s
    latest.json             {"completed_steps": k}, written by rank 0 after every stage saved

A rank running several stages (interleaved 1F1B) writes and reads one file per stage; each
stage has its own optimizer (``{}`` when another stage of the rank owns all its parameters).

Replica 0 of each stage writes the stage file (replicas are identical); every replica reads.
With ZeRO (``optimizer_shards`` = n > 1) the replicas' optimizers differ: each holds the state
of its own shard (``planner.runtime.zero``), so replica r also writes its optimizer to its
shard file (the file records ``shard_idx`` and ``num_shards``) and reads it back; the stage
file then records ``optimizer_shards`` = n and no optimizer state. Resuming with another
shard count (a different dp_degree or zero) is refused: shards do not re-split.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from planner.errors import PlannerInputError


def _stage_file(directory: Path, completed_steps: int, stage_idx: int) -> Path:
    return directory / f"step_{completed_steps}" / f"stage_{stage_idx}.pt"


def _shard_file(directory: Path, completed_steps: int, stage_idx: int, shard_idx: int) -> Path:
    return directory / f"step_{completed_steps}" / f"stage_{stage_idx}.optimizer_shard_{shard_idx}.pt"


def _write(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def save_checkpoint(
    directory: str,
    completed_steps: int,
    stages: list[tuple[int, torch.nn.Module, torch.optim.Optimizer | None]],
    replica: int,
    *,
    optimizer_shards: int = 1,
) -> None:
    """Save this rank's stages, (stage index, module, optimizer) each (replica 0 only; with
    ``optimizer_shards`` > 1 every replica also writes its optimizer shard), then, after a
    barrier, mark the step complete."""
    root = Path(directory)
    sharded = optimizer_shards > 1
    for stage_idx, module, optimizer in stages:
        opt_state = optimizer.state_dict() if optimizer is not None else {}
        if sharded:
            shard = {"optimizer": opt_state, "shard_idx": replica, "num_shards": optimizer_shards}
            _write(_shard_file(root, completed_steps, stage_idx, replica), shard)
        if replica == 0:
            stage = {"model": module.state_dict(), "optimizer": {} if sharded else opt_state}
            _write(_stage_file(root, completed_steps, stage_idx), {**stage, "optimizer_shards": optimizer_shards})
    dist.barrier()
    if dist.get_rank() == 0:
        tmp = root / "latest.json.tmp"
        tmp.write_text(json.dumps({"completed_steps": completed_steps}) + "\n")
        os.replace(tmp, root / "latest.json")


def load_checkpoint(
    directory: str,
    stage_idx: int,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    replica: int = 0,
    optimizer_shards: int = 1,
) -> int:
    """Load the latest complete checkpoint into ``module`` and ``optimizer`` (with
    ``optimizer_shards`` > 1, replica ``replica``'s shard); return its step count."""
    root = Path(directory)
    marker = root / "latest.json"
    if not marker.exists():
        raise PlannerInputError(f"--resume: no checkpoint in {root} (no latest.json)")
    completed = int(json.loads(marker.read_text())["completed_steps"])
    path = _stage_file(root, completed, stage_idx)
    if not path.exists():
        raise PlannerInputError(f"--resume: {path} is missing")
    state = torch.load(path, weights_only=True)
    saved_shards = int(state.get("optimizer_shards", 1))
    if saved_shards != optimizer_shards:
        raise PlannerInputError(
            f"--resume: {path} holds optimizer state in {saved_shards} shard(s) but this run shards it "
            f"over {optimizer_shards} (the plan's zero or replication differs from the checkpointed run)"
        )
    module.load_state_dict(state["model"])
    if optimizer is not None:
        opt_state = state["optimizer"]
        if optimizer_shards > 1:
            shard_path = _shard_file(root, completed, stage_idx, replica)
            if not shard_path.exists():
                raise PlannerInputError(f"--resume: {shard_path} is missing")
            shard = torch.load(shard_path, weights_only=True)
            if (shard["shard_idx"], shard["num_shards"]) != (replica, optimizer_shards):
                raise PlannerInputError(
                    f"--resume: {shard_path} is shard {shard['shard_idx']} of {shard['num_shards']}, "
                    f"expected {replica} of {optimizer_shards}"
                )
            opt_state = shard["optimizer"]
        optimizer.load_state_dict(opt_state)
    return completed
