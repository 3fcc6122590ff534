"""Forward and backward time of every layer, measured in model order: warm-up, repeats, median.

On CUDA, CUDA events bracket the work (PyTorch docs, ``torch.cuda.Event``); on CPU a
monotonic clock (``time.perf_counter``) with a fixed thread count set by the caller.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from planner.profiling.measured.tensors import flatten, fresh_like


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerTime:
    """Median forward and backward milliseconds of one layer at one micro-batch size."""

    fwd_ms: float
    bwd_ms: float
    bwd_input_ms: float | None = None  # the input-gradient pass alone (None: not measured)


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


def _with_grad(out: Any, grad_source: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Pairs (output tensor, its gradient) for the tensors of ``out`` that got a gradient in
    ``grad_source`` (the next layer's detached inputs, same structure)."""
    pairs = [(t, g.grad) for t, g in zip(flatten(out), flatten(grad_source)) if t.requires_grad and g.grad is not None]
    return [t for t, _ in pairs], [g for _, g in pairs]


def time_layers(
    layers: tuple[nn.Module, ...],
    inputs: Any,
    loss: Callable[[Any], Any],
    clock: Clock,
    *,
    warmup: int,
    repeats: int,
) -> list[LayerTime]:
    """Median forward and backward ms of every layer, measured in model order.

    Each repeat is one training step cut at the layer boundaries, as a pipeline runs it: the
    forward runs layer after layer on detached copies of the previous output (same
    ``requires_grad``), then the backward runs layer after layer in reverse, each fed the
    gradients the next layer produced for its inputs. Every layer is timed in the context of
    the whole step (caches, allocator), so the per-layer times add up to a step. The last
    layer includes the loss.
    """
    num = len(layers)
    fwd: list[list[float]] = [[] for _ in range(num)]
    bwd: list[list[float]] = [[] for _ in range(num)]
    for _ in range(warmup + repeats):
        for layer in layers:
            _clear_grads(layer)
        received: list[Any] = []
        outputs: list[Any] = []
        x = inputs
        for idx, layer in enumerate(layers):
            x = fresh_like(x)
            received.append(x)
            out, ms = clock.measure(lambda: layer(x) if idx < num - 1 else loss(layer(x)))
            outputs.append(out)
            fwd[idx].append(ms)
            x = out
        for idx in reversed(range(num)):
            if idx == num - 1:
                tensors, grads = [outputs[idx]], [torch.ones_like(outputs[idx])]
            else:
                tensors, grads = _with_grad(outputs[idx], received[idx + 1])
            _, ms = clock.measure(lambda: torch.autograd.backward(tensors, grads) if tensors else None)
            bwd[idx].append(ms)
    inp = time_input_grads(layers, inputs, loss, clock, warmup=warmup, repeats=repeats)
    return [
        LayerTime(fwd_ms=statistics.median(f[warmup:]), bwd_ms=statistics.median(b[warmup:]), bwd_input_ms=i)
        for f, b, i in zip(fwd, bwd, inp)
    ]


def time_input_grads(
    layers: tuple[nn.Module, ...], inputs: Any, loss: Callable[[Any], Any], clock: Clock, *, warmup: int, repeats: int
) -> list[float]:
    """Median ms of every layer's input-gradient pass alone (zero bubble's B, Qi et al. 2024):
    the same cut step as :func:`time_layers`, each layer's backward run as
    ``torch.autograd.grad`` with respect to its inputs only, so autograd skips the weight
    gradients (their ``AccumulateGrad`` branches); the gradients it returns feed the layer
    before. A layer whose inputs need no gradient (the first: the batch) has no such pass: 0.
    Its own steps, after :func:`time_layers`' (which keep timing the whole backward as before)."""
    num = len(layers)
    out: list[list[float]] = [[] for _ in range(num)]
    for _ in range(warmup + repeats):
        received: list[Any] = []
        outputs: list[Any] = []
        x = inputs
        for idx, layer in enumerate(layers):
            x = fresh_like(x)
            received.append(x)
            x = layer(x) if idx < num - 1 else loss(layer(x))
            outputs.append(x)
        for idx in reversed(range(num)):
            if idx == num - 1:
                tensors, grads = [outputs[idx]], [torch.ones_like(outputs[idx])]
            else:
                tensors, grads = _with_grad(outputs[idx], received[idx + 1])
            wanted = [t for t in flatten(received[idx]) if isinstance(t, torch.Tensor) and t.requires_grad]
            if not tensors or not wanted:
                out[idx].append(0.0)
                continue
            got, ms = clock.measure(lambda: torch.autograd.grad(tensors, wanted, grads, allow_unused=True))
            for t, g in zip(wanted, got):
                t.grad = g
            out[idx].append(ms)
    return [statistics.median(v[warmup:]) for v in out]


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
