"""Tensor parallelism in the runtime: each stage's split layers over the mesh's "tp" dimension.

A plan with ``tp_degree`` = t > 1 runs every stage replica on t ranks of one node, placed by
the plan's :class:`~planner.artifacts.layout.Layout`. The runtime builds the layout's device
mesh of shape ``Layout.mesh_shape`` = (P, D, cp, t), ``mesh_dim_names=Layout.MESH_DIMS`` =
("pp", "dp", "cp", "tp"; cp is 1 in this runtime), over ``Layout.rank_of`` (``planner.runtime.topology.build_mesh``), and uses

- ``mesh["pp"]``'s group for the pipeline's point-to-point messages (the ``PipelineStage``
  group: the stages of one replica at one tp index);
- ``mesh["dp"]``'s group for the gradient all-reduce (the replicas of one stage at one tp
  index: they hold the same shard of every split parameter, so reducing the local shards
  is the data-parallel sum);
- ``mesh["tp"]`` for ``torch.distributed.tensor.parallel.parallelize_module`` of each layer
  of the rank's stages, with the styles the workload declares
  (:class:`planner.models.workload.TensorParallel`; the zoo transformers: Megatron-LM's column /
  row split of attention and MLP, ``SequenceParallel`` layer norms with sequence
  parallelism; Hugging Face blocks and users' models: :mod:`planner.models.tp_plans`, GPT-2's
  transposed ``Conv1D`` by its own styles there).

Stage boundaries carry whole tensors, so the static ``PipelineStage`` shapes, the loss and
the layers that stay whole (embeddings, heads: every tp rank computes them identically) do not
change. With sequence parallelism a split layer takes and returns its slice of the sequence
(dim 1): each run of consecutive split layers of a stage slices the whole tensor at its start
(no communication) and all-gathers it at its end; inside the run the layers pass slices. A layer
that takes or returns a tuple (a Hugging Face block's hidden states and padding mask) has its
first tensor sliced and gathered, the rest passed whole. The
planner's cost model instead also sends 1/t of each boundary tensor per device (Narayanan et
al. 2021 section 4.1), so the runtime moves more bytes than the plan prices there (one
all-gather per run of split layers, and whole boundary tensors).

Split parameters are ``DTensor`` s: the optimizer steps them as they are (SGD and AdamW run
on DTensors); gradient buckets, the saved-bytes meter and the byte counts read their local
shards (:func:`local`). Parameters tied across pipeline ranks (embedding and head) stay whole
and are summed per tp index.

Refused before any compute (:func:`tensor_parallel_refusal`): a model that declares no split;
t not dividing the heads (or, with sequence parallelism, the tokens per sample). Per-stage
replication with t > 1 is not a Layout (its own check: the replicated executor routes whole
stages), so no plan asks for it. Checkpoints are written per tp index as local tensors
(``planner.runtime.checkpoint``). ZeRO 1 and 2 run: ``planner.runtime.zero`` flattens each
rank's local shards, so a rank's optimizer keeps 1/D of its 1/t of the split parameters.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import parallelize_module
from torch.distributed.tensor.parallel.style import ParallelStyle

from planner.artifacts.plan import Plan
from planner.models.workload import Workload
from planner.profiling.measured.tensors import local

__all__ = ["full", "local", "parallelize_layers", "split_layer_indices", "tensor_parallel_refusal"]


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (a collective over its mesh); a plain tensor as it is."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def tensor_parallel_refusal(plan: Plan, workload: Workload) -> str:
    """Why the runtime cannot run ``plan``'s tensor parallelism on ``workload`` ("" when it can)."""
    t = plan.layout.tp_degree
    if t == 1:
        return ""
    spec = workload.tensor_parallel
    if spec is None:
        return f"tp_degree {t}: model {workload.name!r} declares no tensor-parallel split (Workload.tensor_parallel)"
    why = spec.refusal(t, plan.layout.sequence_parallel)
    if why:
        return why
    if not split_layer_indices(workload, plan.layout.sequence_parallel):
        return f"tp_degree {t}: no layer of model {workload.name!r} splits"
    return ""


def split_layer_indices(workload: Workload, sequence_parallel: bool) -> tuple[int, ...]:
    """The layers the workload splits (its styles give a plan for them)."""
    spec = workload.tensor_parallel
    if spec is None:
        return ()
    return tuple(i for i, layer in enumerate(workload.layers) if spec.styles(layer, sequence_parallel))


def parallelize_layers(workload: Workload, indices: Iterable[int], tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Split each listed layer over ``tp_mesh`` in place with the workload's styles (layers
    the styles leave whole are left alone). Every rank holds the same seeded weights, so each
    takes its shard locally (``src_data_rank=None``: no broadcast)."""
    spec = workload.tensor_parallel
    if spec is None:
        return
    split = []
    for idx in indices:
        layer = workload.layers[idx]
        styles = spec.styles(layer, sequence_parallel)
        if styles:
            parallelize_module(layer, tp_mesh, styles, src_data_rank=None)
            split.append(idx)
    if sequence_parallel:
        for first, last in _runs(split):
            parallelize_module(workload.layers[first], tp_mesh, _slice_input(), src_data_rank=None)
            parallelize_module(workload.layers[last], tp_mesh, _gather_output(), src_data_rank=None)


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    """(first, last) of each run of consecutive indices."""
    runs: list[tuple[int, int]] = []
    for idx in indices:
        if runs and runs[-1][1] == idx - 1:
            runs[-1] = (runs[-1][0], idx)
        else:
            runs.append((idx, idx))
    return runs


class _FirstOfTuple(ParallelStyle):
    """The first tensor of a layer's input (``slice``) or output (``gather``) moved between whole
    and this device's slice of dim 1, when the layer takes or returns a tuple (a Hugging Face
    block's ``(hidden, padding mask)``: the mask stays whole); a plain tensor as
    :func:`_slice_input` / :func:`_gather_output` do."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where

    def _apply(self, module: torch.nn.Module, device_mesh: DeviceMesh) -> torch.nn.Module:
        def move(value: Any, source: Any, target: Any) -> Any:
            if isinstance(value, tuple) and value and isinstance(value[0], torch.Tensor):
                return (move(value[0], source, target), *value[1:])
            if not isinstance(value, torch.Tensor):
                return value
            dt = value if isinstance(value, DTensor) else DTensor.from_local(value, device_mesh, (source,), run_check=False)
            return dt.redistribute(device_mesh, (target,)).to_local()

        if self.where == "slice":
            module.register_forward_pre_hook(lambda mod, args: (move(args[0], Replicate(), Shard(1)), *args[1:]))
        else:
            module.register_forward_hook(lambda mod, args, out: move(out, Shard(1), Replicate()))
        return module


def _slice_input() -> Any:
    """The whole input -> this device's slice of dim 1 (no communication; backward all-gathers);
    of a tuple input, its first tensor."""
    return _FirstOfTuple("slice")


def _gather_output() -> Any:
    """This device's slice of dim 1 -> the whole output (all-gather; backward slices); of a
    tuple output, its first tensor."""
    return _FirstOfTuple("gather")
