"""Forward and backward time of one layer, measured alone: warm-up, repeats, median.

On CUDA, CUDA events bracket the work (PyTorch docs, ``torch.cuda.Event``); on CPU a
monotonic clock (``time.perf_counter``) with a fixed thread count set by the caller.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from planner.profiling.tensors import flatten, fresh_like


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerTime:
    """Median forward and backward milliseconds of one layer at one micro-batch size."""

    fwd_ms: float
    bwd_ms: float


class Clock:
    """Milliseconds of a callable on ``device``: CUDA events on GPU, perf_counter on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    @property
    def name(self) -> str:
        return "cuda_events" if self.cuda else "perf_counter"

    def measure(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = fn()
            end.record()
            end.synchronize()
            return result, float(start.elapsed_time(end))
        t0 = time.perf_counter()
        result = fn()
        return result, (time.perf_counter() - t0) * 1e3


def _clear_grads(module: nn.Module) -> None:
    for p in module.parameters():
        p.grad = None


def backward_of(out: Any) -> Callable[[], None]:
    """A closure running backward from ``out`` with fixed all-ones output gradients."""
    tensors = [t for t in flatten(out) if t.requires_grad]
    grads = [torch.ones_like(t) for t in tensors]
    return lambda: torch.autograd.backward(tensors, grads) if tensors else None


def time_layer(
    layer: nn.Module,
    layer_input: Any,
    clock: Clock,
    *,
    warmup: int,
    repeats: int,
    loss: Callable[[Any], Any] | None = None,
) -> LayerTime:
    """Median forward and backward ms of ``layer`` on ``layer_input``.

    ``loss``, for the last layer, maps the output to the scalar loss; forward and backward
    then include it, as they do in a training step.
    """
    fwd: list[float] = []
    bwd: list[float] = []

    def forward(x: Any) -> Any:
        out = layer(x)
        return loss(out) if loss is not None else out

    for rep in range(warmup + repeats):
        x = fresh_like(layer_input)
        _clear_grads(layer)
        out, fwd_ms = clock.measure(lambda: forward(x))
        _, bwd_ms = clock.measure(backward_of(out))
        if rep >= warmup:
            fwd.append(fwd_ms)
            bwd.append(bwd_ms)
    return LayerTime(fwd_ms=statistics.median(fwd), bwd_ms=statistics.median(bwd))


def time_step(layers: tuple[nn.Module, ...], inputs: Any, loss: Callable[[Any], Any], clock: Clock, *, warmup: int, repeats: int) -> float:
    """Median ms of one whole training step (forward of every layer, loss, backward)."""

    def step() -> None:
        out = inputs
        for layer in layers:
            out = layer(out)
        loss(out).backward()

    times = []
    for rep in range(warmup + repeats):
        for layer in layers:
            _clear_grads(layer)
        _, ms = clock.measure(step)
        if rep >= warmup:
            times.append(ms)
    return statistics.median(times)
