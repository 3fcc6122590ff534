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

Tensor parallelism (``tp`` = (index k, degree t), t > 1): each tp index holds its own shards,
so the files are per index, ``stage_<s>.tp_<k>.pt`` and ``stage_<s>.tp_<k>.optimizer_shard_<r>.pt``
(replica 0 of index k writes the stage file). DTensors are saved as their local tensors and
loaded back into the local shards (and an optimizer's state re-wrapped as DTensors of its
parameter's placements), so ``weights_only=True`` still reads every file. Resuming with
another t is refused.

A rank saves and resumes all its stage chunks with :func:`save_chunks` and
:func:`resume_chunks`, at its :class:`CheckpointSlot` (which replica it is, the optimizer shards,
its tp index and degree).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from planner.artifacts.errors import PlannerInputError
from planner.runtime.stage_helpers import Chunk
from planner.runtime.tensor import local


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointSlot:
    """Which files a rank writes and reads: its ``replica`` (replica 0 writes the stage file;
    with ``optimizer_shards`` > 1 each replica its own optimizer shard) and its tp index of
    ``tp_degree``."""

    replica: int = 0
    optimizer_shards: int = 1
    tp_index: int = 0
    tp_degree: int = 1

    @property
    def tp(self) -> tuple[int, int]:
        return self.tp_index, self.tp_degree


def _stage_name(stage_idx: int, tp: tuple[int, int]) -> str:
    return f"stage_{stage_idx}" if tp[1] == 1 else f"stage_{stage_idx}.tp_{tp[0]}"


def _stage_file(directory: Path, completed_steps: int, stage_idx: int, tp: tuple[int, int] = (0, 1)) -> Path:
    return directory / f"step_{completed_steps}" / f"{_stage_name(stage_idx, tp)}.pt"


def _shard_file(directory: Path, completed_steps: int, stage_idx: int, shard_idx: int, tp: tuple[int, int] = (0, 1)) -> Path:
    return directory / f"step_{completed_steps}" / f"{_stage_name(stage_idx, tp)}.optimizer_shard_{shard_idx}.pt"


def _local_state(value: Any) -> Any:
    """``value`` with every DTensor replaced by its local tensor (containers rebuilt)."""
    if isinstance(value, dict):
        return {k: _local_state(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_local_state(v) for v in value)
    return local(value)


def _load_module(module: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    """Copy a saved (local) state dict into the module's parameters and buffers, each into
    its local shard; the keys must match exactly."""
    own = module.state_dict()
    if not any(isinstance(v, DTensor) for v in own.values()):
        module.load_state_dict(saved)
        return
    if set(own) != set(saved):
        missing, extra = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
        raise PlannerInputError(f"--resume: checkpoint keys differ from the stage (missing {missing[:3]}, unexpected {extra[:3]})")
    with torch.no_grad():
        for key, value in own.items():
            local(value).copy_(saved[key])


def _rewrap_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """After loading local tensors: each state tensor shaped like a DTensor parameter's local
    shard becomes a DTensor of that parameter's placements again (scalars such as AdamW's
    ``step`` stay plain, as the optimizer made them)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if not isinstance(param, DTensor) or param not in optimizer.state:
                continue
            state = optimizer.state[param]
            shard = param.to_local()
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and not isinstance(value, DTensor) and value.shape == shard.shape and value.dim() > 0:
                    state[key] = DTensor.from_local(
                        value, param.device_mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride()
                    )


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
    tp: tuple[int, int] = (0, 1),
) -> None:
    """Save this rank's stages, (stage index, module, optimizer) each (replica 0 only; with
    ``optimizer_shards`` > 1 every replica also writes its optimizer shard), then, after a
    barrier, mark the step complete. ``tp``: this rank's (tp index, tp degree)."""
    root = Path(directory)
    sharded = optimizer_shards > 1
    for stage_idx, module, optimizer in stages:
        opt_state = _local_state(optimizer.state_dict()) if optimizer is not None else {}
        if sharded:
            shard = {"optimizer": opt_state, "shard_idx": replica, "num_shards": optimizer_shards}
            _write(_shard_file(root, completed_steps, stage_idx, replica, tp), shard)
        if replica == 0:
            stage = {"model": _local_state(module.state_dict()), "optimizer": {} if sharded else opt_state}
            stage.update(optimizer_shards=optimizer_shards, tp_degree=tp[1])
            _write(_stage_file(root, completed_steps, stage_idx, tp), stage)
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
    tp: tuple[int, int] = (0, 1),
) -> int:
    """Load the latest complete checkpoint into ``module`` and ``optimizer`` (with
    ``optimizer_shards`` > 1, replica ``replica``'s shard; with ``tp`` = (k, t), t > 1, tp
    index k's files); return its step count."""
    root = Path(directory)
    marker = root / "latest.json"
    if not marker.exists():
        raise PlannerInputError(f"--resume: no checkpoint in {root} (no latest.json)")
    completed = int(json.loads(marker.read_text())["completed_steps"])
    path = _stage_file(root, completed, stage_idx, tp)
    if not path.exists():
        others = sorted(p.name for p in path.parent.glob(f"stage_{stage_idx}*.pt"))
        hint = f" (the checkpointed run's tensor parallelism differs: found {others[:2]})" if others else ""
        raise PlannerInputError(f"--resume: {path} is missing{hint}")
    state = torch.load(path, weights_only=True)
    saved_shards = int(state.get("optimizer_shards", 1))
    if saved_shards != optimizer_shards:
        raise PlannerInputError(
            f"--resume: {path} holds optimizer state in {saved_shards} shard(s) but this run shards it "
            f"over {optimizer_shards} (the plan's zero or replication differs from the checkpointed run)"
        )
    saved_tp = int(state.get("tp_degree", 1))
    if saved_tp != tp[1]:
        raise PlannerInputError(f"--resume: {path} was written with tp_degree {saved_tp} but this run uses {tp[1]}")
    _load_module(module, state["model"])
    if optimizer is not None:
        opt_state = state["optimizer"]
        if optimizer_shards > 1:
            shard_path = _shard_file(root, completed, stage_idx, replica, tp)
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
        _rewrap_optimizer_state(optimizer)
    return completed


def save_chunks(directory: str, chunks: Sequence[Chunk], slot: CheckpointSlot, completed_steps: int) -> None:
    """Save every stage chunk of a rank after ``completed_steps`` (collective: see
    :func:`save_checkpoint`)."""
    save_checkpoint(
        directory,
        completed_steps,
        [(c.stage_idx, c.module, c.optimizer) for c in chunks],
        slot.replica,
        optimizer_shards=slot.optimizer_shards,
        tp=slot.tp,
    )


def resume_chunks(directory: str, chunks: Sequence[Chunk], slot: CheckpointSlot) -> int:
    """Load the latest checkpoint into every stage chunk of a rank (each ZeRO master shard
    taken again from the loaded parameters); return its completed steps."""
    done = set()
    for c in chunks:
        done.add(load_checkpoint(
            directory, c.stage_idx, c.module, c.optimizer,
            replica=slot.replica, optimizer_shards=slot.optimizer_shards, tp=slot.tp,
        ))
        if c.zero is not None:
            c.zero.reload_master()
    return done.pop()  # one latest.json: the same step for every chunk
