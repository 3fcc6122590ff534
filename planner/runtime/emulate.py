"""Emulated compute: each layer takes exactly its profiled forward and backward time.

The real (small) layer still runs, so real tensors cross stages and real gradients flow;
sleeping fills the rest of the profiled time. A layer's forward sleeps until ``fwd_ms``
after it started; its backward, bracketed by two identity autograd nodes (one on its output,
whose backward starts the clock, and one on its input, whose backward runs after the layer's
own backward ops), sleeps until ``bwd_ms`` after the gradient reached it. When the input
needs no gradient (the first layer's token ids) the output node sleeps the whole ``bwd_ms``.
A recomputed layer runs (and sleeps) its forward again during backward, as a real recompute
would. On a 2-core machine running 4 processes, sleeping layers reproduce a schedule's
timing within 1-3% run to run, where real compute varies 1.3-1.4x (measured for issue 6).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch


class _Sleeper:
    """Sleeps to a deadline, correcting for the wake-up lag of ``time.sleep``.

    ``time.sleep`` overshoots by the scheduler's wake-up latency (0.16 ms median here when
    quiet, more under load), which would add up over hundreds of emulated layers. The sleeper
    keeps a running mean of that lag, wakes that much early, and spins the rest (well under
    a millisecond of CPU per call).
    """

    def __init__(self) -> None:
        self.lag_s = 0.0002

    def until(self, deadline: float) -> None:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            return
        if remaining > self.lag_s:
            target = deadline - self.lag_s
            time.sleep(target - time.perf_counter())
            overshoot = time.perf_counter() - target
            self.lag_s = min(0.002, max(0.0, 0.9 * self.lag_s + 0.1 * overshoot))
        while time.perf_counter() < deadline:
            pass


_SLEEPER = _Sleeper()  # one per process: the lag is a property of the machine and its load


def _sleep_until(deadline: float) -> None:
    _SLEEPER.until(deadline)


class _Clock:
    __slots__ = ("bwd_s", "deadline", "has_input_mark")

    def __init__(self, bwd_s: float, has_input_mark: bool) -> None:
        self.bwd_s = bwd_s
        self.deadline = 0.0
        self.has_input_mark = has_input_mark


class _BackwardStart(torch.autograd.Function):
    """On the layer's output: backward starts the clock (or sleeps it all, with no input mark)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, clock: _Clock) -> torch.Tensor:  # type: ignore[override]
        ctx.clock = clock
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        clock: _Clock = ctx.clock
        clock.deadline = time.perf_counter() + clock.bwd_s
        if not clock.has_input_mark:
            _sleep_until(clock.deadline)
        return grad, None


class _BackwardEnd(torch.autograd.Function):
    """On the layer's input: backward runs after the layer's backward; sleeps to the deadline."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, clock: _Clock) -> torch.Tensor:  # type: ignore[override]
        ctx.clock = clock
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        _sleep_until(ctx.clock.deadline)
        return grad, None


def _first_grad_tensor(value: Any) -> int:
    items = value if isinstance(value, tuple) else (value,)
    for i, item in enumerate(items):
        if isinstance(item, torch.Tensor) and item.requires_grad:
            return i
    return -1


def _apply_at(value: Any, idx: int, fn: type[torch.autograd.Function], clock: _Clock) -> Any:
    if isinstance(value, tuple):
        items = list(value)
        items[idx] = fn.apply(items[idx], clock)
        return tuple(items)
    return fn.apply(value, clock)


def run_emulated(layer: Callable[[Any], Any], x: Any, fwd_ms: float, bwd_ms: float) -> Any:
    """``layer(x)``, taking ``fwd_ms`` in forward and ``bwd_ms`` in backward (at least the real time)."""
    start = time.perf_counter()
    in_idx = _first_grad_tensor(x) if torch.is_grad_enabled() else -1
    clock = _Clock(bwd_ms / 1000.0, has_input_mark=in_idx >= 0)
    if in_idx >= 0:
        x = _apply_at(x, in_idx, _BackwardEnd, clock)
    out = layer(x)
    out_idx = _first_grad_tensor(out)
    if out_idx >= 0:
        out = _apply_at(out, out_idx, _BackwardStart, clock)
    _sleep_until(start + fwd_ms / 1000.0)
    return out
