"""Bytes saved for backward, measured with ``torch.autograd.graph.saved_tensors_hooks``.

Every tensor autograd saves while a stage runs its forward is counted with its own bytes
(``numel x element_size``, views counted as themselves, as the profiler does) until the
autograd node that saved it is freed (after its backward). Parameters (and views of them,
e.g. the transposed weight ``mm`` saves) are left out: they are model state, not
activations. A layer under non-reentrant ``torch.utils.checkpoint`` shows here only as its
inputs: the checkpoint saves them through the ambient hooks (checked with torch 2.13), while
the tensors of its recomputation go through the checkpoint's own hooks, so the count is
what the cost model assumes for a recomputed layer (its inputs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from planner.runtime.tensor import local


class _Held:
    """A saved tensor's handle; releasing it (node freed) gives its bytes back."""

    __slots__ = ("meter", "num_bytes", "tensor")

    def __init__(self, tensor: torch.Tensor, num_bytes: int, meter: SavedBytesMeter) -> None:
        self.tensor = tensor
        self.num_bytes = num_bytes
        self.meter = meter
        meter.add(num_bytes)

    def __del__(self) -> None:
        self.meter.add(-self.num_bytes)


def tensor_bytes(value: Any) -> int:
    """Bytes of a tensor or of the tensors in a tuple/list."""
    if isinstance(value, torch.Tensor):
        value = local(value)  # a DTensor (tensor parallelism) holds only its shard here
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(v) for v in value)
    return 0


class SavedBytesMeter:
    """Live and peak bytes saved for backward on one stage."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self._param_storages = {local(p).untyped_storage().data_ptr() for p in params}
        self.live_bytes = 0
        self.peak_bytes = 0

    def add(self, num_bytes: int) -> None:
        self.live_bytes += num_bytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    def _pack(self, tensor: torch.Tensor) -> Any:
        if local(tensor).untyped_storage().data_ptr() in self._param_storages:
            return tensor
        return _Held(tensor, tensor_bytes(tensor), self)

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Held) else packed

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield
