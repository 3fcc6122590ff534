"""Exact activation bytes per layer: saved for backward, inputs, outputs, and the layer DAG.

Saved bytes come from ``torch.autograd.graph.saved_tensors_hooks`` (PyTorch docs, "Hooks for
saved tensors"): every tensor autograd packs is counted as ``numel * element_size``. Tensors
that alias a parameter (a weight, or a view such as ``weight.t()``) are not counted: they
cost no memory beyond the parameter itself, which the cost model counts as model state.

The layer DAG follows tensors by identity: a tensor a layer returns unchanged (a skip
connection carried in a tuple) keeps its original producer, so the edge runs from that
producer to every later layer that receives it and the cut sizes include it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from planner.models.workload import Workload
from planner.profiling.measured.tensors import flatten, fresh_like, tensor_bytes, tree_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerBytes:
    """Bytes of one layer at one micro-batch size (whole micro-batch, not per sample)."""

    saved_bytes: int
    input_bytes: int
    output_bytes: int


class SavedBytesCounter:
    """Context manager summing the bytes autograd saves for backward, parameters excluded."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self._param_ptrs = {p.untyped_storage().data_ptr() for p in params}
        self.total_bytes = 0
        self.count = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        try:
            ptr = tensor.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            ptr = None
        if ptr is None or ptr not in self._param_ptrs:
            self.total_bytes += tensor_bytes(tensor)
            self.count += 1
        return tensor

    @staticmethod
    def _unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def __enter__(self) -> SavedBytesCounter:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)


def all_params(workload: Workload) -> list[torch.nn.Parameter]:
    return [p for layer in workload.layers for p in layer.parameters()]


def forward_outputs(workload: Workload, inputs: Any) -> list[Any]:
    """The output of every layer in one forward pass (with autograd, as in training)."""
    outputs: list[Any] = []
    x = inputs
    for layer in workload.layers:
        x = layer(x)
        outputs.append(x)
    return outputs


def measure_layer_bytes(workload: Workload, inputs: Any, targets: Any) -> list[LayerBytes]:
    """Per layer, measured alone on the inputs it receives inside the model.

    The last layer includes the loss (its saved tensors are part of the training step).
    """
    params = all_params(workload)
    activations = [inputs, *forward_outputs(workload, inputs)]
    result = []
    last = len(workload.layers) - 1
    for idx, layer in enumerate(workload.layers):
        layer_in = fresh_like(activations[idx])
        with SavedBytesCounter(params) as counter:
            out = layer(layer_in)
            if idx == last:
                workload.loss_fn(out, targets)
        result.append(
            LayerBytes(saved_bytes=counter.total_bytes, input_bytes=tree_bytes(layer_in), output_bytes=tree_bytes(out))
        )
    return result


def whole_model_saved_bytes(workload: Workload, inputs: Any, targets: Any) -> int:
    """Bytes saved for backward by one forward pass of the whole model and its loss."""
    with SavedBytesCounter(all_params(workload)) as counter:
        workload.loss_fn(forward_outputs(workload, inputs)[-1], targets)
    return counter.total_bytes


def layer_edges(workload: Workload, inputs: Any) -> dict[tuple[int, int], int]:
    """Edges ``(src, dst) -> bytes`` of the layer DAG, from one forward pass.

    Batch inputs count as produced by layer 0 (they are pinned to the first stage). Each
    tensor a layer receives adds an edge from the layer that produced it; a tensor returned
    unchanged keeps its producer.
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
                edges[(src, idx)] = edges.get((src, idx), 0) + tensor_bytes(t)
            seen.add(id(t))
        for t in flatten(out):
            producer.setdefault(id(t), idx)
        received = out
    return edges
