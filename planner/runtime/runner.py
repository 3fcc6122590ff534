"""The contract between the step loop and a rank's executor, and the step loop itself.

:class:`Runner` is what :func:`run_steps` (with ``planner.runtime.checkpoint.save_chunks`` /
``resume_chunks``, and ``planner.runtime.main``) need of one rank: its options and device, the
stage chunks it runs (``planner.runtime.stage_helpers.Chunk``), the gradient bytes it held
after the last step's sync, where it checkpoints, and one training step. Both executors satisfy
it through ``planner.runtime.trainer.RankTrainer``, which writes the step once:
``planner.runtime.engine.RankRunner`` (``torch.distributed.pipelining``) and
``planner.runtime.replicated.ReplicatedRunner`` (plans replicated per stage).

:func:`run_steps`: faults (``--fault``), saved-bytes metering on the first step, timing after
the warm-up, checkpoints, and the rank's :class:`RankMeasure`, gathered to rank 0 for the
RunReport (``planner.runtime.collect``).
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from planner.runtime.checkpoint import CheckpointSlot, resume_chunks, save_chunks
from planner.runtime.emulate import reset_chunk_timer
from planner.runtime.options import FaultKind, RuntimeOptions
from planner.runtime.stage_helpers import Chunk
from planner.runtime.zero import optimizer_state_bytes

__all__ = ["RankMeasure", "Runner", "StepFailure", "StepMeasure", "run_steps"]


class StepFailure(RuntimeError):
    """An exception raised during a training step, tagged with the step index."""

    def __init__(self, step_idx: int, cause: BaseException) -> None:
        self.step_idx = step_idx
        super().__init__(f"at step {step_idx}: {type(cause).__name__}: {cause}")


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


class Runner(Protocol):
    """One rank's executor, as the step loop, the checkpoints and ``main`` see it."""

    @property
    def options(self) -> RuntimeOptions: ...

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
    if options.fault is FaultKind.KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    if options.fault is FaultKind.HANG:
        while True:  # peers must give up after --timeout-s; torchrun then ends this process
            time.sleep(1.0)
    raise RuntimeError(f"injected fault (--fault raise) at step {step_idx}")


def run_steps(runner: Runner) -> RankMeasure:
    """The training loop of any runner (see the module docstring)."""
    options = runner.options
    chunks = list(runner.chunks)
    start_step = resume_chunks(options.checkpoint_dir, runner.chunks, runner.checkpoint_slot) if options.resume else 0
    steps: list[StepMeasure] = []
    compute_ms: list[list[float]] = []  # per timed step, per chunk
    wall_ms: list[float] = []
    peaks = [0] * len(chunks)
    overruns: list[list[tuple[float, float, float]]] = []  # per timed step, per chunk: (total, max, emulated) ms
    for step_idx in range(start_step, options.num_steps):
        try:
            _maybe_fault(options, runner.rank, step_idx)
            for c in chunks:
                reset_chunk_timer(c.timer)
                c.module.metering = step_idx == start_step  # peak saved bytes: first step only
                c.module.meter.reset_peak()
            measure = runner.train_step(step_idx)
        except Exception as exc:
            raise StepFailure(step_idx, exc) from exc
        steps.append(measure)
        if len(steps) > options.warmup_steps or len(steps) == options.num_steps - start_step:
            compute_ms.append([c.timer.compute_s * 1000.0 for c in chunks])
            overruns.append([(c.timer.overrun_s * 1e3, c.timer.overrun_max_s * 1e3, c.timer.emulated_s * 1e3) for c in chunks])
            wall_ms.append(measure.wall_ms)
        peaks = [max(peak, c.module.meter.peak_bytes) for peak, c in zip(peaks, chunks)]
        done = step_idx + 1
        if options.checkpoint_every and done % options.checkpoint_every == 0:
            save_chunks(options.checkpoint_dir, runner.chunks, runner.checkpoint_slot, done)
    return _rank_measure(runner, steps, compute_ms, wall_ms, peaks, overruns)


def _rank_measure(
    runner: Runner,
    steps: list[StepMeasure],
    compute_ms: list[list[float]],
    wall_ms: list[float],
    peaks: list[int],
    overruns: list[list[tuple[float, float, float]]],
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
    )
