"""Emulated compute: each stage's forward and backward of a micro-batch take exactly the
profiled time, while the real (small) layers run, real tensors cross stages and real
gradients flow.

Granularity is the stage chunk (one micro-batch through the stage), the unit the cost model
prices (F_s, and B_s plus the recompute R_s) and the unit between which the pipeline
communicates. The chunk's real work (the toy layers, the recomputation, the framework's
bookkeeping) runs first and the chunk then sleeps until its profiled time has passed. That
is how a GPU behaves: the host-side work of launching a chunk overlaps the device's compute
instead of adding to it. (A first version slept per layer after each layer's real work;
the ~1 ms of host work per chunk that torch.distributed.pipelining spends on this 2-core
machine then added 5-10% to every stage.) Sleeping processes leave the CPUs free, so
timing is reproducible within 1-3% run to run where real compute across 4 processes on 2
cores varies 1.3-1.4x (measured for issue 6).

Gradients inside an emulated backward: on a GPU a layer's gradients are final when its own
backward ends, which is what lets a stack reduce them in buckets during the backward
(``planner.runtime.grads``). The chunk's real backward finishes them all at its very start,
so the gradient hooks wait, before starting a bucket's reduction, until the profiled time at
which the bucket's layer ends (:func:`layer_bwd_offsets_ms`, from ``ChunkTimer.bwd_start_s``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile


class _Sleeper:
    """Sleeps to a deadline, correcting for the wake-up lag of ``time.sleep``.

    ``time.sleep`` overshoots by the scheduler's wake-up latency (0.16 ms median here when
    quiet, more under load). The sleeper keeps a running mean of that lag, wakes that much
    early, and spins the rest (well under a millisecond of CPU per call).
    """

    def __init__(self) -> None:
        self.lag_s = 0.0002

    def until(self, deadline: float) -> None:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            return
        if remaining > self.lag_s:
            target = deadline - self.lag_s
            time.sleep(max(0.0, target - time.perf_counter()))  # preemption may have used it up
            overshoot = time.perf_counter() - target
            self.lag_s = min(0.002, max(0.0, 0.9 * self.lag_s + 0.1 * overshoot))
        while time.perf_counter() < deadline:
            pass


_SLEEPER = _Sleeper()  # one per process: the lag is a property of the machine and its load


def sleep_until(deadline: float) -> None:
    """Return at ``deadline`` (a ``time.perf_counter()`` value), not before, barely after."""
    _SLEEPER.until(deadline)


@dataclass(slots=True, kw_only=True)
class ChunkTimer:
    """The compute seconds of one stage chunk in the current step (mutable: :func:`finish_chunk`
    adds to it, :func:`reset_chunk_timer` zeroes it), and its emulated (fwd, bwd) ms when the
    run emulates compute."""

    emulated_ms: tuple[float, ...] | None = None  # (fwd, bwd, its I pass, its W pass): stage_chunk_ms
    bwd_start_s: float = 0.0  # perf_counter() at the start of the chunk's current (or last) backward
    compute_s: float = 0.0
    overrun_s: float = 0.0  # emulated chunks only: seconds past their profiled time
    overrun_max_s: float = 0.0
    emulated_s: float = 0.0


def finish_chunk(timer: ChunkTimer, start: float, which: int) -> None:
    """End a forward (``which`` 0), backward (1), input-gradient (2) or weight-gradient (3)
    chunk that began at ``start``: with emulation
    (``timer.emulated_ms`` set) sleep until its profiled time has passed and record how far it
    ran past that time; add its seconds to ``timer.compute_s``.

    Emulation can only stretch: when the chunk's real work (or a late wake-up under load) takes
    longer than the profiled time, the chunk ends late and the run no longer measures the
    cost model. ``timer.overrun_s`` adds up those excesses, ``timer.overrun_max_s`` keeps the
    largest, ``timer.emulated_s`` the profiled seconds, so that the run report can say how much
    of the emulated compute overran (``planner.artifacts.report.OVERRUN_LIMIT``).
    """
    if timer.emulated_ms is not None:
        target_s = timer.emulated_ms[which] / 1000.0
        sleep_until(start + target_s)
        over = max(0.0, time.perf_counter() - start - target_s)
        timer.overrun_s += over
        timer.overrun_max_s = max(timer.overrun_max_s, over)
        timer.emulated_s += target_s
    timer.compute_s += time.perf_counter() - start


def reset_chunk_timer(timer: ChunkTimer) -> None:
    """Zero what :func:`finish_chunk` adds up (at the start of every step)."""
    timer.compute_s = 0.0
    timer.overrun_s = 0.0
    timer.overrun_max_s = 0.0
    timer.emulated_s = 0.0


def stage_chunk_ms(plan: Plan, stage_idx: int, profile: Profile | None) -> tuple[float, float, float, float]:
    """(forward ms, backward ms including recompute, its input-gradient pass including
    recompute, its weight-gradient pass) of one micro-batch on stage ``stage_idx``: from the
    profile's layers at the plan's micro-batch size when given (W: each layer's
    ``wgrad_fraction`` of its backward), else the plan's own per-stage ``fwd_ms``,
    ``bwd_ms + recompute_ms`` and ``wgrad_ms``. The last two are what a zero-bubble schedule's
    I and W chunks are stretched to."""
    stage = plan.stages[stage_idx]
    if profile is None:
        full = stage.bwd_ms + stage.recompute_ms
        return stage.fwd_ms, full, full - stage.wgrad_ms, stage.wgrad_ms
    b = plan.microbatch_size
    layers = profile.layers[stage.layer_start : stage.layer_stop]
    fwd = sum(layer.fwd_ms(b) for layer in layers)
    recompute = sum(profile.layers[i].fwd_ms(b) for i in stage.recompute)
    cores = (profile.layers[i].attention_core for i in stage.recompute_selective)
    recompute += sum(core.fwd.at(b) for core in cores if core is not None)  # selective: the attention cores
    full = sum(layer.bwd_ms(b) for layer in layers) + recompute
    wgrad = sum(layer.bwd_ms(b) * layer.wgrad_fraction for layer in layers) if plan.schedule.splits_backward else 0.0
    return fwd, full, full - wgrad, wgrad


def layer_bwd_offsets_ms(plan: Plan, stage_idx: int, profile: Profile) -> list[float]:
    """Per layer of stage ``stage_idx`` (in order): when its backward ends in an emulated
    backward chunk, ms after the chunk starts -- backward runs the layers last first, each
    taking its profiled backward, after its recomputed forward when it is recomputed."""
    stage = plan.stages[stage_idx]
    b = plan.microbatch_size
    offsets: list[float] = []
    at = 0.0
    for i in range(stage.layer_stop - 1, stage.layer_start - 1, -1):
        layer = profile.layers[i]
        at += layer.bwd_ms(b) + (layer.fwd_ms(b) if i in stage.recompute else 0.0)
        offsets.append(at)
    return offsets[::-1]
