"""Bytes saved for backward, two ways: the saved-tensor hooks, and the allocator's own accounting.

**The hook count** (:class:`SavedBytesMeter`, ``torch.autograd.graph.saved_tensors_hooks``):
every tensor autograd saves while a stage runs its forward is held, as the allocator holds it,
*once per storage* (the union of the byte spans saved of it,
:func:`planner.profiling.measured.memory.saved_span`: a view, or a tensor several autograd
nodes save, counts once, as the profiler counts it) until the last autograd node that saved
it is freed (after its backward). Parameters and buffers (and views of them, e.g. the
transposed weight ``mm`` saves) are left out: they are model state, not activations. A layer
under non-reentrant ``torch.utils.checkpoint`` shows here only as its inputs: the checkpoint
saves them through the ambient hooks (checked with torch 2.13), while the tensors of its
recomputation go through the checkpoint's own hooks, so the count is what the cost model
assumes for a recomputed layer (its inputs); an attention core recomputed selectively shows
as its inputs likewise.

**The allocator** (:class:`AllocatorProbe`), independent of the hooks: the bytes a stage's
forward of one micro-batch allocated and did not free by its end, read from the allocator's
own events -- on CPU the memory events ``torch.profiler`` records (one profiling session over
the metered step, each forward a ``record_function`` range, its allocations minus frees), on
GPU ``torch.cuda.memory_allocated`` before and after it. That is what the forward leaves for
backward plus its output; the output's new storages are taken off (they are the next stage's
to receive, and freed once sent, :mod:`planner.runtime.stage`). Against it the meter counts the
same storages: those it holds after the forward that were neither held before, nor the
forward's inputs (received before it, not allocated in it), nor its outputs
(``ForwardRecord.new_saved_bytes``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from planner.profiling.measured.memory import SavedBytesMeter, saved_span
from planner.profiling.measured.tensors import flatten
from planner.runtime.tensor import local

__all__ = ["AllocatorProbe", "ForwardRecord", "SavedBytesMeter", "StageMeter", "storage_keys", "tensor_bytes"]


class StageMeter(SavedBytesMeter):
    """A stage's meter whose never-counted storages (its parameters and buffers, known by their
    address) are read again when the weights move: ZeRO 3 frees their storage between uses and
    gathers them into a new allocation (``planner.runtime.zero``), whose address the meter would
    otherwise count as saved activations (the weights of every layer, 26-30% above the plan on
    the zoo GPT), and whose old address could hide an activation allocated there."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        super().__init__(tensors)
        self._weights = tensors

    def weights_moved(self) -> None:
        self._excluded = {span[0] for t in self._weights if (span := saved_span(local(t))) is not None}


def tensor_bytes(value: Any) -> int:
    """Bytes of a tensor or of the tensors in a tuple/list."""
    if isinstance(value, torch.Tensor):
        value = local(value)  # a DTensor (tensor parallelism) holds only its shard here
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(v) for v in value)
    return 0


def storage_keys(value: Any) -> set[int]:
    """The storages of the tensors of ``value`` (a tensor or a tuple of them)."""
    out = set()
    for t in flatten(value):
        span = saved_span(local(t))
        if span is not None:
            out.add(span[0])
    return out


@dataclass(slots=True)
class ForwardRecord:
    """One metered forward of one micro-batch on a stage (the last stage: with its loss)."""

    saved_bytes: int = 0  # the meter's bytes held after it less before: everything it saved, inputs included
    new_saved_bytes: int = 0  # the meter's bytes of the storages the allocator sees (module docstring)
    output_bytes: int = 0  # the new storages of its output (taken off the allocator's count)
    allocated_bytes: int = -1  # the allocator's count less the output; -1 until the probe reads it
    windows: list[int] = field(default_factory=list)  # the probe's windows of this forward


class AllocatorProbe:
    """The allocator's bytes left allocated by forward windows (module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self._session: Any = None
        self._cuda_windows: list[int] = []
        self._count = 0

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """One profiling session (CPU) over a metered step; windows are read at its end."""
        if self.cuda:
            yield
            return
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            self._session = prof
            yield
        self._session = None
        self._cpu_windows = _window_bytes(prof)

    @contextlib.contextmanager
    def window(self) -> Iterator[int]:
        """A forward window; yields its index (read by :meth:`bytes_of`)."""
        idx = self._count
        self._count += 1
        if self.cuda:
            before = torch.cuda.memory_allocated(self.device)
            yield idx
            self._cuda_windows.append(torch.cuda.memory_allocated(self.device) - before)
            return
        with torch.profiler.record_function(f"planner::window::{idx}"):
            yield idx

    def bytes_of(self, idx: int) -> int | None:
        """Bytes allocated and not freed in window ``idx`` (None when it was not recorded)."""
        if self.cuda:
            return self._cuda_windows[idx] if idx < len(self._cuda_windows) else None
        return getattr(self, "_cpu_windows", {}).get(idx)


def _window_bytes(prof: Any) -> dict[int, int]:
    """Per window of a CPU profiling session: the memory events' bytes inside its range."""
    events = prof.profiler.kineto_results.events()
    ranges = []
    for e in events:
        name = e.name()
        if name.startswith("planner::window::"):
            ranges.append((e.start_ns(), e.end_ns(), int(name.rsplit("::", 1)[1])))
    out = {idx: 0 for _, _, idx in ranges}
    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    for start, end, idx in ranges:
        out[idx] += sum(n for t, n in memory if start <= t <= end)
    return out
