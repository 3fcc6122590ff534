"""Per-stage checkpoints: ``torch.save`` of tensors and plain containers, loaded with
``weights_only=True`` (no arbitrary unpickling).

Layout under the checkpoint directory::

    step_<k>/stage_<s>.pt   model + optimizer state of stage s after k completed steps

A rank running several stages (interleaved 1F1B) writes and reads one file per stage; each
stage has its own optimizer (``{}`` when another stage of the rank owns all its parameters).
    latest.json             {"completed_steps": k}, written by rank 0 after every stage saved

Replica 0 of each stage writes (replicas are identical); every replica reads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from planner.errors import PlannerInputError


def _stage_file(directory: Path, completed_steps: int, stage_idx: int) -> Path:
    return directory / f"step_{completed_steps}" / f"stage_{stage_idx}.pt"


def save_checkpoint(
    directory: str,
    completed_steps: int,
    stages: list[tuple[int, torch.nn.Module, torch.optim.Optimizer | None]],
    replica: int,
) -> None:
    """Save this rank's stages, (stage index, module, optimizer) each (replica 0 only), then,
    after a barrier, mark the step complete."""
    root = Path(directory)
    if replica == 0:
        for stage_idx, module, optimizer in stages:
            path = _stage_file(root, completed_steps, stage_idx)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            opt_state = optimizer.state_dict() if optimizer is not None else {}
            torch.save({"model": module.state_dict(), "optimizer": opt_state}, tmp)
            os.replace(tmp, path)
    dist.barrier()
    if dist.get_rank() == 0:
        tmp = root / "latest.json.tmp"
        tmp.write_text(json.dumps({"completed_steps": completed_steps}) + "\n")
        os.replace(tmp, root / "latest.json")


def load_checkpoint(
    directory: str, stage_idx: int, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> int:
    """Load the latest complete checkpoint into ``module`` and ``optimizer``; return its step count."""
    root = Path(directory)
    marker = root / "latest.json"
    if not marker.exists():
        raise PlannerInputError(f"--resume: no checkpoint in {root} (no latest.json)")
    completed = int(json.loads(marker.read_text())["completed_steps"])
    path = _stage_file(root, completed, stage_idx)
    if not path.exists():
        raise PlannerInputError(f"--resume: {path} is missing")
    state = torch.load(path, weights_only=True)
    module.load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    return completed
