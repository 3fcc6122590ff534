"""The attention cores of a measured model: their forward time (what the selective recompute
level costs) and which SDPA backend ran them (the profile's :class:`AttentionKind`).

The cores are the calls made through :func:`planner.models.selective.run_core`. One forward of
the model (with autograd, as in training) records each call with the layer making it; each
layer's calls are then replayed alone, with autograd recording as the checkpoint's
recomputation runs them, on detached copies of their own inputs: warm-up, then the median of
the repeats, as :mod:`planner.profiling.measured.timing` times the layers.

The backend is read off the ATen operators one core call dispatches (a ``TorchDispatchMode``):
FlashAttention-style kernels that save no ``s x s`` tensor (``_scaled_dot_product_flash_attention``,
its CPU form, ``_efficient_attention``, ``_cudnn_attention``) are :attr:`AttentionKind.FLASH`;
the math backend or an eager softmax are :attr:`AttentionKind.MATERIALISED`.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from planner.artifacts.kinds import AttentionKind
from planner.models.selective import CoreCall, observing
from planner.models.workload import Workload
from planner.profiling.measured.tensors import tree_map
from planner.profiling.measured.timing import Clock

__all__ = ["FLASH_KERNELS", "core_backend", "record_cores", "time_cores"]

#: ATen kernels of attention that keep no s x s tensor
FLASH_KERNELS = ("flash_attention", "efficient_attention", "cudnn_attention")


def record_cores(workload: Workload, inputs: Any) -> list[list[CoreCall]]:
    """Per layer, the attention-core calls one forward of the model makes."""
    calls: list[list[CoreCall]] = [[] for _ in workload.layers]
    current = [0]
    with observing(lambda call: calls[current[0]].append(call)):
        x = inputs
        for idx, layer in enumerate(workload.layers):
            current[0] = idx
            x = layer(x)
    return calls


def _fresh(value: Any) -> Any:
    return tree_map(lambda t: t.detach().requires_grad_(t.requires_grad), value)


def _replay(calls: list[CoreCall]) -> None:
    with torch.enable_grad():
        for _, fn, args, kwargs in calls:
            fn(*_fresh(args), **kwargs)


def time_cores(calls: list[list[CoreCall]], clock: Clock, *, warmup: int, repeats: int) -> list[float]:
    """Median forward ms of each layer's attention cores (0 for a layer without)."""
    out = []
    for layer_calls in calls:
        if not layer_calls:
            out.append(0.0)
            continue
        times = [clock.measure(lambda calls=layer_calls: _replay(calls))[1] for _ in range(warmup + repeats)]
        out.append(statistics.median(times[warmup:]))
    return out


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


def core_backend(calls: list[list[CoreCall]], workload: Workload | None = None, inputs: Any = None) -> tuple[AttentionKind, str]:
    """The attention kind and the ATen kernel of the first core call. Without core calls, the
    kernels one forward of ``workload`` dispatches: an SDPA kernel names the kind, no attention
    kernel and no softmax is ``none``, a softmax without one is ``unknown`` (attention written
    out, not through an attention core)."""
    first = next((c for layer_calls in calls for c in layer_calls), None)
    ops = _Ops()
    if first is None:
        if workload is None:
            return AttentionKind.NONE, ""
        with ops, torch.no_grad():
            x = inputs
            for layer in workload.layers:
                x = layer(x)
        if not any("attention" in n for n in ops.names):
            return (AttentionKind.UNKNOWN, "softmax") if any(n == "_softmax" for n in ops.names) else (AttentionKind.NONE, "")
    else:
        with ops, torch.enable_grad():
            _, fn, args, kwargs = first
            fn(*_fresh(args), **kwargs)
    kernel = next((n for n in ops.names if "attention" in n and n.startswith("_")), "")
    if any(k in kernel for k in FLASH_KERNELS):
        return AttentionKind.FLASH, kernel
    return AttentionKind.MATERIALISED, kernel or ("softmax" if any("softmax" in n for n in ops.names) else "")
