"""The attention core of a model's layers, which selective recomputation re-runs in backward.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
sec. 4) recompute only the *attention core* of a transformer layer -- QK^T, softmax, dropout
and attention over V -- and keep everything else the layer saves. Here an attention core is
one call of the attention kernel made through :func:`run_core` by the module that owns it
(the zoo's :class:`~planner.models.common.SelfAttention`, a Hugging Face attention module via
the ``planner_sdpa`` attention function of :mod:`planner.models.hf`). The owner carries the
switch :data:`RECOMPUTE_ATTR`: when it is on and autograd records, the call runs under
non-reentrant ``torch.utils.checkpoint``, which keeps the call's inputs (Q, K, V, the mask)
and re-runs the kernel in backward; its output is kept by whatever consumes it (the output
projection), so what is freed is what the kernel itself saves (the ``s x s`` scores of a
materialised attention; the log-sum-exp of a flash one).

Observers (:func:`observing`) see every core call as it is made: the profiler times the cores
this way (their forward is what the selective level costs) and records which SDPA backend ran.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["RECOMPUTE_ATTR", "CoreCall", "cores", "observing", "run_core", "set_selective"]

#: the attribute of a module owning an attention core: True = recompute the core in backward
RECOMPUTE_ATTR = "planner_recompute_core"

#: (owner, function, args, kwargs) of one core call
CoreCall = tuple[nn.Module, Callable[..., Any], tuple[Any, ...], dict[str, Any]]
_OBSERVERS: list[Callable[[CoreCall], None]] = []


def run_core(owner: nn.Module, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, the attention core of ``owner``: checkpointed (recomputed in
    backward) when ``owner``'s :data:`RECOMPUTE_ATTR` is on and autograd records."""
    for observe in list(_OBSERVERS):
        observe((owner, fn, args, kwargs))
    if getattr(owner, RECOMPUTE_ATTR, False) and torch.is_grad_enabled():
        return checkpoint(fn, *args, use_reentrant=False, **kwargs)
    return fn(*args, **kwargs)


def cores(layer: nn.Module) -> list[nn.Module]:
    """The modules of ``layer`` that own an attention core (empty: no selective level)."""
    return [m for m in layer.modules() if hasattr(m, RECOMPUTE_ATTR)]


def set_selective(layer: nn.Module, on: bool) -> None:
    """Recompute (``on``) or keep every attention core of ``layer``."""
    for module in cores(layer):
        setattr(module, RECOMPUTE_ATTR, on)


@contextlib.contextmanager
def observing(callback: Callable[[CoreCall], None]) -> Iterator[None]:
    """``callback`` sees every core call made inside the block."""
    _OBSERVERS.append(callback)
    try:
        yield
    finally:
        _OBSERVERS.remove(callback)
