"""Exact activation bytes per layer: saved for backward (once per storage), inputs, outputs,
the storages two layers share, and the layer DAG.

Saved bytes come from ``torch.autograd.graph.saved_tensors_hooks`` (PyTorch docs, "Hooks for
saved tensors") over one forward pass of the whole model and its loss, each layer's saves
tagged with the layer. They are counted *once per storage*, as the allocator holds them: a
saved tensor is the byte span ``[offset, offset + extent)`` of its untyped storage, and a
layer's bytes are the union of the spans it saves, per storage (so a view, or one tensor
saved by several autograd nodes -- the block input that the q, k and v projections each save
-- counts once; :func:`saved_span`). Storages of parameters and buffers (a weight, or a view
such as ``weight.t()``) are left out: they are model state, not activations.

A storage two layers both save (a ReLU keeping its output, the next layer's convolution
keeping it as its input) counts in each layer's bytes, and the pair is recorded with the bytes
of the overlap (``shared``): a stage holding both layers holds it once (``Profile.shared_saved``;
a storage saved by several layers is recorded pairwise along the chain of its savers).

With ``selective`` every attention core of the model (:mod:`planner.models.selective`) runs
under checkpoint, so the counts are those of the selective recompute level.

The layer DAG follows tensors by identity: a tensor a layer returns unchanged (a skip
connection carried in a tuple) keeps its original producer, so the edge runs from that
producer to every later layer that receives it and the cut sizes include it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from planner.models.selective import cores, set_selective
from planner.models.workload import Workload
from planner.profiling.measured.tensors import flatten, local, tensor_bytes, tree_bytes

#: (storage key, first byte, end byte) of a saved tensor
Span = tuple[int, int, int]


def saved_span(tensor: torch.Tensor) -> Span | None:
    """The bytes of ``tensor``'s storage that it covers: ``[offset, offset + extent)`` with
    extent ``element_size x (1 + sum_i (size_i - 1) stride_i)``; None for an empty tensor or
    one without storage."""
    if tensor.numel() == 0:
        return None
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    size = tensor.element_size()
    start = tensor.storage_offset() * size
    extent = 1 + sum((n - 1) * abs(s) for n, s in zip(tensor.shape, tensor.stride()))
    return storage.data_ptr(), start, start + extent * size


def union_bytes(intervals: list[tuple[int, int]]) -> int:
    """Bytes covered by byte intervals ``[a, b)``."""
    total, end = 0, -1
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def overlap_bytes(first: list[tuple[int, int]], second: list[tuple[int, int]]) -> int:
    """Bytes covered by both unions of intervals."""
    return union_bytes(first) + union_bytes(second) - union_bytes(first + second)


def excluded_storages(workload: Workload) -> set[int]:
    """Storages of the workload's parameters and buffers (model state, never activations)."""
    out = set()
    for layer in workload.layers:
        for t in (*layer.parameters(), *layer.buffers()):
            if t.numel():
                out.add(t.untyped_storage().data_ptr())
    return out


@dataclass(slots=True)
class SavedStorages:
    """Per layer, the byte intervals of each storage it saved (``saved_tensors_hooks``)."""

    excluded: set[int]
    layer: int = 0
    spans: list[dict[int, list[tuple[int, int]]]] = field(default_factory=list)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        span = saved_span(tensor)
        if span is not None and span[0] not in self.excluded:
            while len(self.spans) <= self.layer:
                self.spans.append({})
            self.spans[self.layer].setdefault(span[0], []).append((span[1], span[2]))
        return tensor

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield

    def layer_bytes(self, num_layers: int) -> list[int]:
        """Bytes each layer saved, once per storage."""
        while len(self.spans) < num_layers:
            self.spans.append({})
        return [sum(union_bytes(iv) for iv in per.values()) for per in self.spans[:num_layers]]

    def shared(self) -> dict[tuple[int, int], int]:
        """(earlier, later) layer -> bytes both saved, along each storage's chain of savers."""
        last: dict[int, int] = {}
        out: dict[tuple[int, int], int] = {}
        for idx, per in enumerate(self.spans):
            for key, intervals in per.items():
                prev = last.get(key)
                if prev is not None:
                    both = overlap_bytes(self.spans[prev][key], intervals)
                    if both:
                        out[(prev, idx)] = out.get((prev, idx), 0) + both
                last[key] = idx
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerBytes:
    """Bytes of one layer at one micro-batch size (whole micro-batch, not per sample)."""

    saved_bytes: int
    input_bytes: int
    output_bytes: int
    selective_saved_bytes: int = -1  # saved with its attention cores recomputed; -1 = no selective level


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelBytes:
    """Every layer's bytes at one micro-batch size, and the storages two layers share."""

    layers: tuple[LayerBytes, ...]
    shared: dict[tuple[int, int], int]


@contextlib.contextmanager
def _selective(workload: Workload, on: bool) -> Iterator[None]:
    """Every attention core of the workload recomputed (``on``) inside the block."""
    for layer in workload.layers:
        set_selective(layer, on)
    try:
        yield
    finally:
        for layer in workload.layers:
            set_selective(layer, False)


def _saved_pass(workload: Workload, inputs: Any, targets: Any, selective: bool) -> tuple[SavedStorages, list[Any]]:
    """One forward of the whole model and its loss, saves recorded per layer; and every
    layer's input."""
    record = SavedStorages(excluded_storages(workload))
    received = []
    last = len(workload.layers) - 1
    with _selective(workload, selective), record.recording():
        x = inputs
        for idx, layer in enumerate(workload.layers):
            record.layer = idx
            received.append(x)
            x = layer(x)
            if idx == last:
                workload.loss_fn(x, targets)
        received.append(x)
    return record, received


def measure_model_bytes(workload: Workload, inputs: Any, targets: Any) -> ModelBytes:
    """Per layer its saved bytes (once per storage; also at the selective level where it has
    attention cores), input and output bytes, and the storages layers share (module docstring).
    The last layer includes the loss."""
    n = len(workload.layers)
    plain, received = _saved_pass(workload, inputs, targets, selective=False)
    saved = plain.layer_bytes(n)
    has_core = [bool(cores(layer)) for layer in workload.layers]
    selective = _saved_pass(workload, inputs, targets, selective=True)[0].layer_bytes(n) if any(has_core) else saved
    layers = tuple(
        LayerBytes(
            saved_bytes=saved[i],
            input_bytes=tree_bytes(received[i]),
            output_bytes=tree_bytes(received[i + 1]),
            selective_saved_bytes=selective[i] if has_core[i] else -1,
        )
        for i in range(n)
    )
    return ModelBytes(layers=layers, shared=plain.shared())


def measure_layer_bytes(workload: Workload, inputs: Any, targets: Any) -> list[LayerBytes]:
    """Per layer: :func:`measure_model_bytes`'s layers."""
    return list(measure_model_bytes(workload, inputs, targets).layers)


def whole_model_saved_bytes(workload: Workload, inputs: Any, targets: Any) -> int:
    """Bytes saved for backward by one forward pass of the whole model and its loss, once
    per storage over the whole model."""
    record = SavedStorages(excluded_storages(workload))
    with record.recording():
        out = inputs
        for layer in workload.layers:
            out = layer(out)
        workload.loss_fn(out, targets)
    merged: dict[int, list[tuple[int, int]]] = {}
    for per in record.spans:
        for key, intervals in per.items():
            merged.setdefault(key, []).extend(intervals)
    return sum(union_bytes(iv) for iv in merged.values())


def forward_outputs(workload: Workload, inputs: Any) -> list[Any]:
    """The output of every layer in one forward pass (with autograd, as in training)."""
    outputs: list[Any] = []
    x = inputs
    for layer in workload.layers:
        x = layer(x)
        outputs.append(x)
    return outputs


def layer_edges(
    workload: Workload, inputs: Any, nbytes: Callable[[torch.Tensor], int] = tensor_bytes
) -> dict[tuple[int, int], int]:
    """Edges ``(src, dst) -> bytes`` of the layer DAG, from one forward pass.

    Batch inputs count as produced by layer 0 (they are pinned to the first stage). Each
    tensor a layer receives adds an edge from the layer that produced it; a tensor returned
    unchanged keeps its producer. ``nbytes`` counts a tensor's bytes (the runtime's plan check
    counts floating tensors in the plan's dtype).
    """
    with torch.no_grad():
        outputs = forward_outputs(workload, inputs)
    producer: dict[int, int] = {id(t): 0 for t in flatten(inputs)}
    edges: dict[tuple[int, int], int] = {}
    received = inputs
    for idx, out in enumerate(outputs):
        seen: set[int] = set()
        for t in flatten(received):
            src = producer.get(id(t), 0)
            if src != idx and id(t) not in seen:
                edges[(src, idx)] = edges.get((src, idx), 0) + nbytes(t)
            seen.add(id(t))
        for t in flatten(out):
            producer.setdefault(id(t), idx)
        received = out
    return edges


class _Held:
    """A saved tensor's handle; releasing it (node freed) gives its span back."""

    __slots__ = ("key", "meter", "span", "tensor")

    def __init__(self, tensor: torch.Tensor, key: int, span: tuple[int, int], meter: SavedBytesMeter) -> None:
        self.tensor = tensor
        self.key = key
        self.span = span
        self.meter = meter
        meter.hold(key, span)

    def __del__(self) -> None:
        self.meter.release(self.key, self.span)


class SavedBytesMeter:
    """Live and peak bytes saved for backward on one stage, once per storage."""

    def __init__(self, tensors: Iterable[torch.Tensor]) -> None:
        """``tensors``: the stage's parameters and buffers (never counted)."""
        self._excluded = {span[0] for t in tensors if (span := saved_span(local(t))) is not None}
        self._spans: dict[int, list[tuple[int, int]]] = {}
        self._bytes: dict[int, int] = {}
        self.live_bytes = 0
        self.peak_bytes = 0

    def hold(self, key: int, span: tuple[int, int]) -> None:
        self._spans.setdefault(key, []).append(span)
        self._update(key)

    def release(self, key: int, span: tuple[int, int]) -> None:
        spans = self._spans.get(key)
        if spans is None:
            return
        spans.remove(span)
        if not spans:
            del self._spans[key]
        self._update(key)

    def _update(self, key: int) -> None:
        now = union_bytes(self._spans[key]) if key in self._spans else 0
        self.live_bytes += now - self._bytes.get(key, 0)
        if now:
            self._bytes[key] = now
        else:
            self._bytes.pop(key, None)
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def held(self) -> set[int]:
        """The storages held now."""
        return set(self._bytes)

    def bytes_of(self, keys: Iterable[int]) -> int:
        """Bytes held now of the storages ``keys``."""
        return sum(self._bytes.get(k, 0) for k in keys)

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    def _pack(self, tensor: torch.Tensor) -> Any:
        span = saved_span(local(tensor))
        if span is None or span[0] in self._excluded:
            return tensor
        # an alias of its own: a stage output autograd saved stays intact when the executor
        # frees the output's data after sending it (planner.runtime.engine.deallocate_output)
        return _Held(tensor.detach(), span[0], (span[1], span[2]), self)

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Held) else packed

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield
