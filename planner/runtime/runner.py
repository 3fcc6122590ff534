"""The contract between the step loop and a rank's executor, and the step loop itself.

:class:`Runner` is what :func:`run_steps` (with ``planner.runtime.checkpoint.save_chunks`` /
``resume_chunks``, and ``planner.runtime.main``) need of one rank: its options and device, the
stage chunks it runs (``planner.runtime.stage_helpers.Chunk``), the gradient bytes it held
after the last step's sync, where it checkpoints, and one training step. Both executors satisfy
it through ``planner.runtime.trainer.RankTrainer``, which writes the step once:
``planner.runtime.engine.RankRunner`` (``torch.distributed.pipelining``) and
``planner.runtime.replicated.ReplicatedRunner`` (plans replicated per stage).

:func:`run_steps`: faults (``--fault``), saved-bytes metering on the first step (the hooks'
count and, in the same forwards, the allocator's: ``planner.runtime.memory``), timing after
the warm-up, checkpoints, and the rank's :class:`RankMeasure`, gathered to rank 0 for the
RunReport (``planner.runtime.collect``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from planner.artifacts.plan import Plan
from planner.artifacts.progress import note
from planner.runtime.checkpoint import CheckpointSlot, resume_chunks, save_chunks
from planner.runtime.checkpoint_files import CheckpointError, run_settings_record, step_dir
from planner.runtime.emulate import reset_chunk_timer
from planner.runtime.lifecycle import StopRun
from planner.runtime.liveness import StepControl
from planner.runtime.memory import AllocatorProbe, ForwardRecord
from planner.runtime.options import FaultKind, RuntimeOptions
from planner.runtime.stage_helpers import Chunk
from planner.runtime.zero import optimizer_state_bytes

__all__ = ["CheckpointFailure", "RankMeasure", "Runner", "StepFailure", "StepMeasure", "run_steps"]


class StepFailure(RuntimeError):
    """An exception raised during a training step, tagged with the step index, said in one line
    by its root cause (:func:`root_cause`)."""

    def __init__(self, step_idx: int, cause: BaseException) -> None:
        self.step_idx = step_idx
        super().__init__(f"at step {step_idx}: {root_cause(cause)}")


def root_cause(exc: BaseException) -> str:
    """One line for a failure: the innermost exception of its chain (torch's pipelining wraps the
    model's own error in ``[Stage 0] failed to run forward: args: (...)``, the tensors printed),
    with the last line of the model's code it passed through (not torch's, not the runtime's)."""
    inner = exc
    seen = {id(inner)}
    while (nxt := inner.__cause__ or inner.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        inner = nxt
    text = " ".join(str(inner).split())
    line = f"{type(inner).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"
    skipped = (str(Path(torch.__file__).parent), str(Path(__file__).parent))
    frames = [f for f in traceback.extract_tb(inner.__traceback__) if not f.filename.startswith(skipped)]
    if frames:
        line += f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno}: {frames[-1].line})"
    return line


class CheckpointFailure(RuntimeError):
    """A checkpoint that could not be written after a step (the cause names the file)."""

    def __init__(self, completed_steps: int, cause: BaseException) -> None:
        self.completed_steps = completed_steps
        super().__init__(f"writing checkpoint step_{completed_steps} (after {completed_steps} completed steps): {cause}")


@dataclass(frozen=True, slots=True, kw_only=True)
class StepMeasure:
    step_idx: int
    loss: float
    wall_ms: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RankMeasure:
    """What one rank measured; gathered to rank 0 for the RunReport."""

    steps: tuple[StepMeasure, ...]
    compute_ms: float  # all the rank's chunks together
    idle_ms: float
    saved_bytes_peak: int  # the largest over the rank's chunks
    cuda_peak_bytes: int
    stage_indices: tuple[int, ...] = ()
    stage_compute_ms: tuple[float, ...] = ()  # per chunk, in ``stage_indices`` order
    stage_saved_bytes_peak: tuple[int, ...] = ()
    stage_optimizer_state_bytes: tuple[int, ...] = ()  # per chunk, after the last step
    stage_grad_bytes: tuple[int, ...] = ()  # per chunk, held after the gradient sync of the last step
    stage_overrun_ms: tuple[float, ...] = ()  # per chunk, emulated: ms past the profiled times per timed step
    stage_overrun_max_ms: tuple[float, ...] = ()  # per chunk, emulated: the largest overrun of one action
    stage_emulated_ms: tuple[float, ...] = ()  # per chunk, emulated: the profiled ms of its actions per step
    # per chunk, over the micro-batches of the metered step (the largest): the hooks' bytes saved by one forward
    # (inputs included), the hooks' bytes of the storages the allocator sees, and the allocator's own (-1: none)
    stage_saved_bytes_per_microbatch: tuple[int, ...] = ()
    stage_new_saved_bytes: tuple[int, ...] = ()
    stage_allocated_bytes: tuple[int, ...] = ()


class Runner(Protocol):
    """One rank's executor, as the step loop, the checkpoints and ``main`` see it."""

    @property
    def options(self) -> RuntimeOptions: ...

    @property
    def plan(self) -> Plan: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def rank(self) -> int: ...

    @property
    def chunks(self) -> Sequence[Chunk]:
        """The stages the rank runs, in its order (p, p + P, ... when interleaved)."""
        ...

    @property
    def grad_bytes(self) -> tuple[int, ...]:
        """Per chunk: the gradient bytes held after the last step's sync."""
        ...

    @property
    def checkpoint_slot(self) -> CheckpointSlot: ...

    def train_step(self, step_idx: int) -> StepMeasure:
        """One iteration of the plan over step ``step_idx``'s global batch (collective)."""
        ...


def _maybe_fault(options: RuntimeOptions, rank: int, step_idx: int) -> None:
    if options.fault is FaultKind.NONE or rank != options.fault_rank or step_idx != options.fault_step:
        return
    print(f"planner.runtime: rank {rank}: --fault {options.fault.value} at step {step_idx}", file=sys.stderr, flush=True)
    if options.fault is FaultKind.KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    if options.fault is FaultKind.STOP:
        os.kill(os.getpid(), signal.SIGSTOP)
    if options.fault is FaultKind.HANG:
        while True:  # peers must give up after --timeout-s; torchrun then ends this process
            time.sleep(1.0)
    raise RuntimeError(f"injected fault (--fault raise) at step {step_idx}")


def run_steps(runner: Runner, control: StepControl | None = None) -> RankMeasure:
    """The training loop of any runner (see the module docstring). ``control`` (``main``'s)
    hears of each step and says when the ranks agreed to stop on a signal: then, after a final
    checkpoint when ``--checkpoint-dir`` is set, :class:`~planner.runtime.lifecycle.StopRun`
    is raised on every rank."""
    options = runner.options
    chunks = list(runner.chunks)
    settings = run_settings_record(options, runner.plan)
    start_step = 0
    if options.resume:
        start_step = resume_chunks(
            options.checkpoint_dir, runner.chunks, runner.checkpoint_slot, settings=settings,
            allowed=options.allow_resume_change, num_steps=options.num_steps, lr=options.lr,
        )
        if runner.rank == 0:
            print(f"planner.runtime: resumed from step {start_step} ({step_dir(Path(options.checkpoint_dir), start_step)}): "
                  f"training steps {start_step + 1} to {options.num_steps}", file=sys.stderr, flush=True)
    steps: list[StepMeasure] = []
    compute_ms: list[list[float]] = []  # per timed step, per chunk
    wall_ms: list[float] = []
    peaks = [0] * len(chunks)
    records: list[list[ForwardRecord]] = [[] for _ in chunks]
    overruns: list[list[tuple[float, float, float]]] = []  # per timed step, per chunk: (total, max, emulated) ms
    for step_idx in range(start_step, options.num_steps):
        note(f"training: step {step_idx + 1} of {options.num_steps}")
        if control is not None:
            control.begin_step(step_idx)
        metered = step_idx == start_step  # peak saved bytes and the allocator: first step only
        probe = AllocatorProbe(runner.device) if metered else None
        try:
            _maybe_fault(options, runner.rank, step_idx)
            for c in chunks:
                reset_chunk_timer(c.timer)
                c.module.metering = metered
                c.module.probe = probe
                c.module.records = []
                c.module.meter.reset_peak()
            with probe.session() if probe is not None else contextlib.nullcontext():
                measure = runner.train_step(step_idx)
        except Exception as exc:
            raise StepFailure(step_idx, exc) from exc
        if metered:
            for c, mine in zip(chunks, records):
                c.module.read_allocator()
                mine.extend(c.module.records)
                c.module.probe = None
        steps.append(measure)
        if len(steps) > options.warmup_steps or len(steps) == options.num_steps - start_step:
            compute_ms.append([c.timer.compute_s * 1000.0 for c in chunks])
            overruns.append([(c.timer.overrun_s * 1e3, c.timer.overrun_max_s * 1e3, c.timer.emulated_s * 1e3) for c in chunks])
            wall_ms.append(measure.wall_ms)
        peaks = [max(peak, c.module.meter.peak_bytes) for peak, c in zip(peaks, chunks)]
        done = step_idx + 1
        stop = control.end_step(done) if control is not None else 0
        due = bool(options.checkpoint_every) and done % options.checkpoint_every == 0
        if due or (stop and options.checkpoint_dir):
            try:
                save_chunks(options.checkpoint_dir, runner.chunks, runner.checkpoint_slot, done,
                            settings=settings, keep_last=options.keep_last)
            except CheckpointError as exc:
                raise CheckpointFailure(done, exc) from exc
        if stop:
            raise StopRun(stop, done, str(step_dir(Path(options.checkpoint_dir), done)) if options.checkpoint_dir else "")
    return _rank_measure(runner, steps, compute_ms, wall_ms, peaks, overruns, records)


def _rank_measure(
    runner: Runner,
    steps: list[StepMeasure],
    compute_ms: list[list[float]],
    wall_ms: list[float],
    peaks: list[int],
    overruns: list[list[tuple[float, float, float]]],
    records: list[list[ForwardRecord]],
) -> RankMeasure:
    """The loop's records as the rank's measures: means over the timed steps, per chunk."""
    chunks = runner.chunks
    per_stage = tuple(statistics.fmean(col) for col in zip(*compute_ms)) if compute_ms else (0.0,) * len(chunks)
    per_chunk = list(zip(*overruns)) if overruns else [((0.0, 0.0, 0.0),)] * len(chunks)
    compute = sum(per_stage)
    wall = statistics.fmean(wall_ms) if wall_ms else 0.0
    device = runner.device
    cuda_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return RankMeasure(
        steps=tuple(steps),
        compute_ms=compute,
        idle_ms=max(0.0, wall - compute),
        saved_bytes_peak=max(peaks),
        cuda_peak_bytes=int(cuda_peak),
        stage_indices=tuple(c.stage_idx for c in chunks),
        stage_compute_ms=per_stage,
        stage_saved_bytes_peak=tuple(peaks),
        stage_optimizer_state_bytes=tuple(optimizer_state_bytes(c.optimizer) for c in chunks),
        stage_grad_bytes=tuple(runner.grad_bytes),
        stage_overrun_ms=tuple(statistics.fmean(o[0] for o in col) for col in per_chunk),
        stage_overrun_max_ms=tuple(max(o[1] for o in col) for col in per_chunk),
        stage_emulated_ms=tuple(statistics.fmean(o[2] for o in col) for col in per_chunk),
        stage_saved_bytes_per_microbatch=tuple(max((r.saved_bytes for r in rs), default=0) for rs in records),
        stage_new_saved_bytes=tuple(max((r.new_saved_bytes for r in rs), default=0) for rs in records),
        stage_allocated_bytes=tuple(max((r.allocated_bytes for r in rs), default=-1) for rs in records),
    )
