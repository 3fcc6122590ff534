"""Tensor-tree helpers: a layer's input or output is a tensor or a (nested) tuple of them."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch


def flatten(value: Any) -> list[torch.Tensor]:
    """The tensors of ``value`` (a tensor, or nested tuples/lists of tensors), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in flatten(item)]
    return []


def tree_map(fn: Callable[[torch.Tensor], torch.Tensor], value: Any) -> Any:
    """Apply ``fn`` to every tensor of ``value``, keeping the tuple structure."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (tuple, list)):
        return type(value)(tree_map(fn, item) for item in value)
    return value


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes of one tensor as ``numel * element_size`` (not its storage: views count their own size)."""
    return tensor.numel() * tensor.element_size()


def tree_bytes(value: Any) -> int:
    """Bytes of every distinct tensor of ``value`` (a tensor listed twice counts once)."""
    seen: dict[int, torch.Tensor] = {}
    for t in flatten(value):
        seen.setdefault(id(t), t)
    return sum(tensor_bytes(t) for t in seen.values())


def fresh_like(value: Any) -> Any:
    """Detached copies of the tensors of ``value`` with the same ``requires_grad``.

    A layer measured alone then sees inputs exactly as it does inside the whole model:
    activations that require grad (so autograd saves the same tensors), batch inputs that do not.
    """
    return tree_map(lambda t: t.detach().requires_grad_(t.requires_grad), value)


def to_device(value: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    """Move a batch to ``device``; floating tensors are cast to ``dtype`` when given."""

    def move(t: torch.Tensor) -> torch.Tensor:
        if dtype is not None and t.is_floating_point():
            return t.to(device=device, dtype=dtype)
        return t.to(device=device)

    return tree_map(move, value)


def local(tensor: Any) -> Any:
    """This rank's shard of a DTensor; any other value as it is. ``torch.distributed.tensor`` is
    not imported here (the runtime's checks stay without it, ``planner.runtime.preflight``): where
    it was never imported, no value is a DTensor."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return tensor.to_local() if dtensor is not None and isinstance(tensor, dtensor.DTensor) else tensor
