"""Per-stage checkpoints: ``torch.save`` of tensors and plain containers, loaded with
``weights_only=True`` (no arbitrary unpickling).

Layout under the checkpoint directory::

    step_<k>/stage_<s>.pt   model + optimizer state of stage s after k completed steps
    step_<k>/stage_<s>.optimizer_shard_<r>.pt
                            ZeRO >= 1 only: optimizer state of shard r of stage s
    step_<k>/manifest.json  sha256 and size of every file of the step, and the run's settings:
                            written last, by rank 0, once every rank's files are in place
    latest.json             {"completed_steps": k}, written by rank 0 after the manifest
    .lock                   held by rank 0 of the run writing the directory

How the files are written, verified, pruned (``--keep-last``) and locked, and what a resume
must match, is ``planner.runtime.checkpoint_files``. A resume takes the newest step intact on
every rank (:func:`choose_step`): a corrupt, truncated or missing file makes it fall back to
the step before, with a warning naming the file; a directory without manifests is refused
unless the run passes ``--trust-unverified-checkpoint``.

A rank running several stages (interleaved 1F1B) writes and reads one file per stage; each
stage has its own optimizer (``{}`` when another stage of the rank owns all its parameters).

Replica 0 of each stage writes the stage file (replicas are identical); every replica reads.
With ZeRO (``optimizer_shards`` = n > 1) the replicas' optimizers differ: each holds the state
of its own shard (``planner.runtime.zero``), so replica r also writes its optimizer to its
shard file (the file records ``shard_idx`` and ``num_shards``) and reads it back; the stage
file then records ``optimizer_shards`` = n and no optimizer state. Resuming with another
shard count (a different dp_degree or zero) is refused: shards do not re-split.

Experts folded apart from attention (``planner.runtime.experts``: ep x etp > 1, or t > 1): a
rank's routed-expert shards, and their optimizer state (ZeRO-sharded over their own edp group),
are its own, so every rank writes and reads its own file per stage, ``stage_<s>.rank_<r>.pt``,
holding its module's state and its whole optimizer state (no shard files); the file records
the expert degrees and a resume with others is refused (as the layout in the settings is).

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

import itertools
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from planner.artifacts.errors import PlannerInputError
from planner.runtime import checkpoint_files as files
from planner.runtime.checkpoint_settings import compare_settings
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
    own_file: int = -1  # >= 0: this rank (experts folded) writes and reads its own file, named by this rank
    experts: tuple[int, int] = (1, 1)  # the run's (ep_degree, etp_degree), recorded in its own files

    @property
    def tp(self) -> tuple[int, int]:
        return self.tp_index, self.tp_degree


def _stage_name(stage_idx: int, tp: tuple[int, int], own_file: int = -1) -> str:
    if own_file >= 0:
        return f"stage_{stage_idx}.rank_{own_file}"
    return f"stage_{stage_idx}" if tp[1] == 1 else f"stage_{stage_idx}.tp_{tp[0]}"


def _stage_file(directory: Path, completed_steps: int, stage_idx: int, tp: tuple[int, int] = (0, 1), own_file: int = -1) -> Path:
    return directory / f"step_{completed_steps}" / f"{_stage_name(stage_idx, tp, own_file)}.pt"


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


def _stage_files(root: Path, completed_steps: int, chunks: Sequence[Chunk], slot: CheckpointSlot) -> list[Path]:
    """The files a rank reads to resume its chunks: each stage file, and with ZeRO its shard."""
    files = []
    for c in chunks:
        files.append(_stage_file(root, completed_steps, c.stage_idx, slot.tp, slot.own_file))
        if c.optimizer is not None and slot.optimizer_shards > 1 and slot.own_file < 0:
            files.append(_shard_file(root, completed_steps, c.stage_idx, slot.replica, slot.tp))
    return files


_SAVES = itertools.count()


def _default_store() -> Any:
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def save_checkpoint(
    directory: str,
    completed_steps: int,
    stages: list[tuple[int, torch.nn.Module, torch.optim.Optimizer | None]],
    replica: int,
    *,
    optimizer_shards: int = 1,
    tp: tuple[int, int] = (0, 1),
    settings: dict[str, Any] | None = None,
    keep_last: int = files.DEFAULT_KEEP_LAST,
    own_file: int = -1,
    experts: tuple[int, int] = (1, 1),
) -> None:
    """Save this rank's stages, (stage index, module, optimizer) each (replica 0 only; with
    ``optimizer_shards`` > 1 every replica also writes its optimizer shard; with ``own_file``
    = this rank >= 0 every rank its own file, the optimizer inside: experts folded), each file
    hashed on its way out; then rank 0 gathers the files' records through the process group's
    store, writes the step's manifest (with ``settings``) and ``latest.json``, and prunes to
    ``keep_last`` steps (``planner.runtime.checkpoint_files``). Collective. ``tp``: this rank's
    (tp index, tp degree). A write that fails raises
    :class:`~planner.runtime.checkpoint_files.CheckpointError` naming the file and the cause."""
    root = Path(directory)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        files.uncommit(root, completed_steps)  # a step written again is partial until its new manifest
    dist.barrier()
    sharded = optimizer_shards > 1 and own_file < 0
    records: dict[str, dict[str, Any]] = {}
    for stage_idx, module, optimizer in stages:
        opt_state = _local_state(optimizer.state_dict()) if optimizer is not None else {}
        if sharded:
            shard = {"optimizer": opt_state, "shard_idx": replica, "num_shards": optimizer_shards}
            path = _shard_file(root, completed_steps, stage_idx, replica, tp)
            records[path.name] = files.write_hashed(path, lambda f, state=shard: torch.save(state, f))  # type: ignore[misc]
        if replica == 0 or own_file >= 0:
            stage = {"model": _local_state(module.state_dict()), "optimizer": {} if sharded else opt_state}
            stage.update(optimizer_shards=optimizer_shards, tp_degree=tp[1], ep_degree=experts[0], etp_degree=experts[1])
            path = _stage_file(root, completed_steps, stage_idx, tp, own_file)
            records[path.name] = files.write_hashed(path, lambda f, state=stage: torch.save(state, f))  # type: ignore[misc]
    store = _default_store()
    key = f"planner/checkpoint/{next(_SAVES)}"
    store.set(f"{key}/{rank}", json.dumps(records))
    dist.barrier()
    if rank == 0:
        written: dict[str, dict[str, Any]] = {}
        for r in range(world):
            written.update(json.loads(store.get(f"{key}/{r}").decode()))
        files.write_manifest(root, completed_steps, written, settings or {})
        for line in files.prune(root, keep_last):
            print(f"planner.runtime: {line}", file=sys.stderr, flush=True)


def _all_min(value: int, device: torch.device) -> int:
    """The minimum of ``value`` over the ranks (the value itself without a process group)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def choose_step(
    root: Path, needed: Callable[[int], list[Path]], device: torch.device, trust_unverified: bool = False
) -> tuple[int, files.Manifest | None]:
    """The newest step whose manifest reads and whose files (``needed(step)``) verify on every
    rank (collective: the ranks agree by ``all_reduce`` MIN); warnings name each skipped file.
    Refuses when there is no checkpoint, or none intact; a directory without manifests only
    with ``trust_unverified`` (:func:`~planner.runtime.checkpoint_files.unverified_step`)."""
    steps = files.complete_steps(root)
    if not steps:
        legacy = files.unverified_step(root, trust_unverified)
        _warn(f"--resume: loading step {legacy} without verification (--trust-unverified-checkpoint): "
              f"{root} has no {files.MANIFEST}")
        return legacy, None
    problems: dict[int, str] = {}
    manifests: dict[int, files.Manifest] = {}

    def intact(step: int) -> bool:
        if step not in problems:
            try:
                manifests[step] = files.read_manifest(root, step)
                problems[step] = next((why for why in (files.verify_file(manifests[step], p) for p in needed(step)) if why), "")
            except files.CheckpointError as exc:
                problems[step] = str(exc)
        return not problems[step]

    bound = steps[0]
    while True:
        mine = next((s for s in steps if s <= bound and intact(s)), -1)
        agreed = _all_min(mine, device)
        if agreed < 0:
            mine_why = "; ".join(why for why in problems.values() if why) or "the other ranks' files failed verification"
            raise files.CheckpointError(f"--resume: no intact checkpoint in {root}: {mine_why}")
        if _all_min(1 if intact(agreed) else 0, device) == 1:
            break
        bound = agreed - 1
    for step in steps:
        if step > agreed and problems.get(step):
            _warn(f"--resume: skipping step {step}: {problems[step]}")
    if steps[0] > agreed and (not dist.is_initialized() or dist.get_rank() == 0):
        _warn(f"--resume: resuming from {files.step_dir(root, agreed)}, the newest step intact on every rank")
    return agreed, manifests[agreed]


def _warn(line: str) -> None:
    print(f"planner.runtime: warning: {line}", file=sys.stderr, flush=True)


def _check_dtype(path: Path, saved: dict[str, torch.Tensor], module: torch.nn.Module) -> None:
    """Refuse a checkpoint whose floating tensors are of another dtype than the stage's."""
    own = {local(v).dtype for v in module.state_dict().values() if local(v).is_floating_point()}
    theirs = {v.dtype for v in saved.values() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    if own and theirs and own != theirs:
        names = ", ".join(sorted(str(d).removeprefix("torch.") for d in theirs))
        mine = ", ".join(sorted(str(d).removeprefix("torch.") for d in own))
        raise PlannerInputError(f"--resume: {path} holds {names} tensors but this run trains in {mine}; pass --dtype {names}")


def load_checkpoint(
    directory: str,
    stage_idx: int,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    completed: int,
    replica: int = 0,
    optimizer_shards: int = 1,
    tp: tuple[int, int] = (0, 1),
    own_file: int = -1,
    experts: tuple[int, int] = (1, 1),
) -> None:
    """Load step ``completed`` into ``module`` and ``optimizer`` (with ``optimizer_shards`` > 1,
    replica ``replica``'s shard; with ``tp`` = (k, t), t > 1, tp index k's files; with
    ``own_file`` >= 0 that rank's own file, written with the expert degrees ``experts``); every
    refusal names the file."""
    root = Path(directory)
    path = _stage_file(root, completed, stage_idx, tp, own_file)
    if not path.exists():
        others = sorted(p.name for p in path.parent.glob(f"stage_{stage_idx}*.pt"))
        hint = f" (the checkpointed run's tensor parallelism differs: found {others[:2]})" if others else ""
        raise PlannerInputError(f"--resume: {path} is missing{hint}")
    state = files.load_verified(path)
    saved_shards = int(state.get("optimizer_shards", 1))
    if saved_shards != optimizer_shards:
        raise PlannerInputError(
            f"--resume: {path} holds optimizer state in {saved_shards} shard(s) but this run shards it "
            f"over {optimizer_shards} (the plan's zero or replication differs from the checkpointed run)"
        )
    saved_tp = int(state.get("tp_degree", 1))
    if saved_tp != tp[1]:
        raise PlannerInputError(f"--resume: {path} was written with tp_degree {saved_tp} but this run uses {tp[1]}")
    saved_experts = (int(state.get("ep_degree", 1)), int(state.get("etp_degree", 1)))
    if saved_experts != experts:
        raise PlannerInputError(f"--resume: {path} was written with (ep_degree, etp_degree) {saved_experts} but this run "
                                f"uses {experts}")
    _check_dtype(path, state["model"], module)
    try:
        _load_module(module, state["model"])
    except (RuntimeError, KeyError) as exc:
        raise PlannerInputError(f"--resume: {path} does not fit stage {stage_idx}: {str(exc).splitlines()[0]}") from None
    if optimizer is not None:
        opt_state, source = state["optimizer"], path
        if optimizer_shards > 1 and own_file < 0:
            source = _shard_file(root, completed, stage_idx, replica, tp)
            shard = files.load_verified(source)
            if (shard["shard_idx"], shard["num_shards"]) != (replica, optimizer_shards):
                raise PlannerInputError(
                    f"--resume: {source} is shard {shard['shard_idx']} of {shard['num_shards']}, "
                    f"expected {replica} of {optimizer_shards}"
                )
            opt_state = shard["optimizer"]
        try:
            optimizer.load_state_dict(opt_state)
            _check_optimizer_state(optimizer)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise PlannerInputError(
                f"--resume: {source}: its optimizer state does not fit this run's {type(optimizer).__name__} "
                f"(--optimizer; {type(exc).__name__}: {exc})"
            ) from None
        _rewrap_optimizer_state(optimizer)


def _check_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """The state keys of the run's optimizer kind (an SGD state in an AdamW fails at its first
    step otherwise, with a bare ``KeyError``)."""
    expected = {"exp_avg", "exp_avg_sq", "step"} if isinstance(optimizer, torch.optim.AdamW) else set()
    for state in optimizer.state.values():
        keys = set(state)
        if expected and not expected <= keys:
            raise KeyError(f"state has {sorted(keys)}, AdamW needs {sorted(expected)}")
        if not expected and keys - {"momentum_buffer"}:
            raise KeyError(f"state has {sorted(keys)}, which SGD does not keep")


def save_chunks(
    directory: str,
    chunks: Sequence[Chunk],
    slot: CheckpointSlot,
    completed_steps: int,
    *,
    settings: dict[str, Any] | None = None,
    keep_last: int = files.DEFAULT_KEEP_LAST,
) -> None:
    """Save every stage chunk of a rank after ``completed_steps`` (collective: see
    :func:`save_checkpoint`)."""
    save_checkpoint(
        directory,
        completed_steps,
        [(c.stage_idx, c.module, c.optimizer) for c in chunks],
        slot.replica,
        optimizer_shards=slot.optimizer_shards,
        tp=slot.tp,
        settings=settings,
        keep_last=keep_last,
        own_file=slot.own_file,
        experts=slot.experts,
    )


def resume_chunks(
    directory: str,
    chunks: Sequence[Chunk],
    slot: CheckpointSlot,
    *,
    settings: dict[str, Any] | None = None,
    allowed: tuple[str, ...] = (),
    num_steps: int | None = None,
    lr: float | None = None,
    trust_unverified: bool = False,
) -> int:
    """Load the newest checkpoint intact on every rank (:func:`choose_step`, collective) into
    every stage chunk of a rank (each ZeRO master shard, the experts' too, taken again from the
    loaded parameters), after comparing its recorded settings with the run's ``settings``
    (:func:`~planner.runtime.checkpoint_settings.compare_settings`: a difference not in
    ``allowed`` is refused; an allowed learning rate ``lr`` is applied); return its completed
    steps. A directory without manifests is loaded only with ``trust_unverified``."""
    root = Path(directory)
    device = next((p.device for c in chunks for p in c.module.parameters()), torch.device("cpu"))
    step, manifest = choose_step(root, lambda k: _stage_files(root, k, chunks, slot), device, trust_unverified)
    applied: list[str] = []
    if manifest is not None and settings is not None:
        source = str(files.step_dir(root, step) / files.MANIFEST)
        applied = compare_settings(source, manifest.get("settings", {}), settings, allowed, step, num_steps or step + 1)
    elif num_steps is not None and num_steps <= step:
        compare_settings(str(root / files.LATEST), {}, {}, allowed, step, num_steps)
    for c in chunks:
        load_checkpoint(
            directory, c.stage_idx, c.module, c.optimizer,
            completed=step, replica=slot.replica, optimizer_shards=slot.optimizer_shards, tp=slot.tp,
            own_file=slot.own_file, experts=slot.experts,
        )
        if c.optimizer is not None and lr is not None and applied:
            for group in c.optimizer.param_groups:
                group["lr"] = lr
        for zero in (c.zero, c.expert_zero):
            if zero is not None:
                zero.reload_master()
    if applied and (not dist.is_initialized() or dist.get_rank() == 0):
        for line in applied:
            print(f"planner.runtime: {line}", file=sys.stderr, flush=True)
    return step
