"""Emulated compute: a layer that sleeps for its profiled forward and backward time.

The real (small) layer still runs, so real tensors cross stages and real gradients flow;
the sleep stands in for the compute a real device would spend. On a 2-core machine running
4 processes, sleeping layers reproduce a schedule's timing within 1-3% run to run, where
real compute varies 1.3-1.4x (measured for issue 6). A recomputed layer sleeps its forward
again during backward, as a real recompute would.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fwd_s: float, bwd_s: float) -> torch.Tensor:  # type: ignore[override]
        ctx.bwd_s = bwd_s
        time.sleep(fwd_s)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        time.sleep(ctx.bwd_s)
        return grad, None, None


def _first_grad_tensor(value: Any) -> int:
    items = value if isinstance(value, tuple) else (value,)
    for i, item in enumerate(items):
        if isinstance(item, torch.Tensor) and item.requires_grad:
            return i
    return -1


def sleep_after(out: Any, fwd_ms: float, bwd_ms: float) -> Any:
    """Sleep ``fwd_ms`` now and ``bwd_ms`` when the gradient of ``out`` passes back."""
    idx = _first_grad_tensor(out)
    if idx < 0:
        time.sleep(fwd_ms / 1000.0)
        return out
    if isinstance(out, tuple):
        items = list(out)
        items[idx] = _Sleep.apply(items[idx], fwd_ms / 1000.0, bwd_ms / 1000.0)
        return tuple(items)
    return _Sleep.apply(out, fwd_ms / 1000.0, bwd_ms / 1000.0)
