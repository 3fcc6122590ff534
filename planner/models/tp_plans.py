"""Tensor-parallel splits of any model's layers: declared per module, recognised in standard
blocks, or read from a Hugging Face config's ``base_model_tp_plan`` (Megatron-LM's split,
Shoeybi et al. 2019; sequence parallelism after Korthikanti et al. 2022).

A *plan* maps module paths inside a layer to a kind, Hugging Face's notation
(``transformers``' ``base_model_tp_plan``, ``"layers.*.self_attn.q_proj": "colwise"``):

- ``colwise``: an ``nn.Linear`` (or GPT-2's transposed ``Conv1D``) split by output features:
  each device computes a contiguous block of them (a block of attention heads, of MLP units);
- ``colwise_qkv``: a fused query/key/value projection split by output features within each of
  its three parts, so that a device holds the same heads of q, k and v (GPT-2's ``c_attn``;
  stored as ``_StridedShard(1, split_factor=3)``, whose full tensor is the module's weight);
- ``rowwise``: split by input features; the partial outputs are all-reduced (reduce-scattered
  along the sequence with sequence parallelism) and the bias added once.

Patterns may use ``*`` for one path component (``"block.*.fc"``). From a plan the styles of a
layer (:func:`styles_for`) are: the plan's splits; :class:`ReplicateInput` on each module
holding column-split ones (its input made one replicated DTensor, so that its column splits
share one all-reduce of the input gradient in backward: Megatron's ``f``; attributes that
count heads or widths divided, see :data:`LOCAL_ATTRS`); with sequence parallelism the
layer's norms run on sequence shards (``SequenceParallel``).

:func:`recognised_plan` finds the standard blocks by the names of their projections
(:data:`ATTENTION_NAMES`, :data:`MLP_NAMES`); :mod:`planner.models.tp_check` checks a split
computes its layer (run by the profiler on every split layer).

Decisions: only the kinds above (an embedding or LM head stays whole: their vocabulary split
is priced by the analytic profiles, not run); a module kind other than ``nn.Linear`` and
``Conv1D`` is refused by name; uneven splits are refused by the workload's ``must_divide``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
from torch.distributed.tensor.parallel.style import ParallelStyle
from torch.distributed.tensor.placement_types import _StridedShard

from planner.artifacts.errors import PlannerInputError

__all__ = ["KINDS", "LOCAL_ATTRS", "ReplicateInput", "is_conv1d", "plan_styles", "recognised_plan", "styles_for"]

KINDS = ("colwise", "colwise_qkv", "rowwise")
#: attributes of a module holding column splits that count its own heads or widths: divided by t
LOCAL_ATTRS = ("split_size",)  # GPT-2's attention splits c_attn's output by it
#: standard attention blocks: (column-split projections, row-split output), by child names
ATTENTION_NAMES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("q_proj", "k_proj", "v_proj"), "o_proj"),
    (("q_proj", "k_proj", "v_proj"), "out_proj"),
    (("q", "k", "v"), "proj"),
    (("q", "k", "v"), "o"),
    (("query", "key", "value"), "../output/dense"),  # BERT: attention.self.{query,key,value}, attention.output.dense
    (("c_attn",), "c_proj"),  # GPT-2: fused q, k, v
)
#: standard MLPs: (column-split, row-split), by child names
MLP_NAMES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("gate_proj", "up_proj"), "down_proj"),
    (("w1", "w3"), "w2"),
    (("fc1",), "fc2"),
    (("c_fc",), "c_proj"),
    (("fc",), "out"),
    (("dense_h_to_4h",), "dense_4h_to_h"),
    (("dense",), "../output/dense"),  # BERT: intermediate.dense, output.dense
)


def is_conv1d(module: nn.Module) -> bool:
    """transformers' ``Conv1D`` (GPT-2): a linear layer with a transposed ``(in, out)`` weight."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and hasattr(module, "weight")


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _norm(module: nn.Module) -> bool:
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or type(module).__name__.endswith(("RMSNorm", "LayerNorm"))


# ---------------------------------------------------------------- styles


class ReplicateInput(ParallelStyle):
    """The module's hidden input -- its first positional argument, else ``hidden_states`` -- made
    one replicated DTensor (from ``stream``: ``Replicate()``, or ``Shard(1)`` with sequence
    parallelism: an all-gather), so that its column splits share the backward all-reduce;
    :data:`LOCAL_ATTRS` it has are divided by the degree."""

    def __init__(self, stream: Any) -> None:
        super().__init__()
        self.stream = stream

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        t = device_mesh.size()
        for name in LOCAL_ATTRS:
            if isinstance(getattr(module, name, None), int):
                setattr(module, name, getattr(module, name) // t)
        stream = self.stream

        def convert(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            if not isinstance(x, DTensor):
                x = DTensor.from_local(x, device_mesh, (stream,), run_check=False)
            return x.redistribute(device_mesh, (Replicate(),))

        def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
            if args:
                return (convert(args[0]), *args[1:]), kwargs
            if "hidden_states" in kwargs:
                return args, {**kwargs, "hidden_states": convert(kwargs["hidden_states"])}
            return args, kwargs

        module.register_forward_pre_hook(hook, with_kwargs=True)
        return module


def _local_input(x: Any, device_mesh: DeviceMesh) -> torch.Tensor:
    """A column split's input as a plain tensor whose gradient is partial (summed by the
    parent's :class:`ReplicateInput` in backward)."""
    if isinstance(x, DTensor):
        return x.to_local(grad_placements=(Partial(),))
    return DTensor.from_local(x, device_mesh, (Replicate(),), run_check=False).to_local(grad_placements=(Partial(),))


class ColwiseConv1D(ColwiseParallel):
    """``colwise`` / ``colwise_qkv`` for transformers' ``Conv1D`` (weight ``(in, out)``): the
    output features split, within each of ``parts`` fused projections; computed on the local
    shard (the parameters are DTensors of that placement, so gradients, the optimizer, ZeRO and
    checkpoints see them as every other split parameter)."""

    def __init__(self, parts: int = 1) -> None:
        super().__init__()
        self.parts = parts

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        t, rank = device_mesh.size(), device_mesh.get_local_rank()
        k = self.parts

        def local_cols(tensor: torch.Tensor, dim: int) -> torch.Tensor:
            chunks = tensor.chunk(k, dim=dim)
            return torch.cat([c.chunk(t, dim=dim)[rank] for c in chunks], dim=dim).contiguous()

        placement_w = _StridedShard(1, split_factor=k) if k > 1 else Shard(1)
        placement_b = _StridedShard(0, split_factor=k) if k > 1 else Shard(0)
        with torch.no_grad():
            weight = DTensor.from_local(local_cols(module.weight, 1), device_mesh, (placement_w,), run_check=False,
                                        shape=module.weight.shape, stride=module.weight.stride())
            bias = DTensor.from_local(local_cols(module.bias, 0), device_mesh, (placement_b,), run_check=False,
                                      shape=module.bias.shape, stride=module.bias.stride())
        module.weight = nn.Parameter(weight, requires_grad=module.weight.requires_grad)
        module.bias = nn.Parameter(bias, requires_grad=module.bias.requires_grad)

        def forward(x: Any) -> torch.Tensor:
            x = _local_input(x, device_mesh)
            w, b = module.weight.to_local(), module.bias.to_local()
            return torch.addmm(b, x.reshape(-1, x.size(-1)), w).view(*x.shape[:-1], w.size(1))

        module.forward = forward  # type: ignore[method-assign]
        return module


class RowwiseConv1D(RowwiseParallel):
    """``rowwise`` for transformers' ``Conv1D``: the input features split; the partial outputs
    all-reduced (or reduce-scattered along ``output_layouts``' dim), the bias added once."""

    def __init__(self, output_layout: Any) -> None:
        super().__init__(output_layouts=output_layout)
        self.output_layout = output_layout

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        t, rank = device_mesh.size(), device_mesh.get_local_rank()
        with torch.no_grad():
            weight = DTensor.from_local(module.weight.chunk(t, dim=0)[rank].contiguous(), device_mesh, (Shard(0),),
                                        run_check=False, shape=module.weight.shape, stride=module.weight.stride())
            bias = DTensor.from_local(module.bias.detach().clone(), device_mesh, (Replicate(),), run_check=False)
        module.weight = nn.Parameter(weight, requires_grad=module.weight.requires_grad)
        module.bias = nn.Parameter(bias, requires_grad=module.bias.requires_grad)
        out_layout = self.output_layout

        def forward(x: Any) -> torch.Tensor:
            if isinstance(x, DTensor):
                x = x.to_local()
            w = module.weight.to_local()
            partial = (x.reshape(-1, x.size(-1)) @ w).view(*x.shape[:-1], w.size(1))
            reduced = DTensor.from_local(partial, device_mesh, (Partial(),), run_check=False)
            # the bias added as a DTensor: with sequence parallelism each device holds some tokens,
            # so its gradient is a partial sum that DTensor reduces over the devices
            return (reduced.redistribute(device_mesh, (out_layout,)) + module.bias).to_local()

        module.forward = forward  # type: ignore[method-assign]
        return module


def _col_style(module: nn.Module, kind: str, path: str) -> ParallelStyle:
    if isinstance(module, nn.Linear) and kind == "colwise":
        return ColwiseParallel()
    if is_conv1d(module):
        return ColwiseConv1D(parts=3 if kind == "colwise_qkv" else 1)
    if kind == "colwise_qkv":
        raise PlannerInputError(
            f"tensor-parallel plan: {path!r} is a {type(module).__name__}, but colwise_qkv splits only transformers' "
            "fused Conv1D (GPT-2's c_attn); declare q, k and v as three nn.Linear modules split colwise, or leave "
            f"{path!r} out of the plan")
    raise PlannerInputError(f"tensor-parallel plan: {path!r} is a {type(module).__name__}; colwise splits nn.Linear "
                            "and transformers' Conv1D only")


def _row_style(module: nn.Module, stream: Any, path: str) -> ParallelStyle:
    if isinstance(module, nn.Linear):
        return RowwiseParallel(output_layouts=stream)
    if is_conv1d(module):
        return RowwiseConv1D(stream)
    raise PlannerInputError(f"tensor-parallel plan: {path!r} is a {type(module).__name__}; rowwise splits nn.Linear "
                            "and transformers' Conv1D")


def resolve(layer: nn.Module, plan: Mapping[str, str]) -> dict[str, str]:
    """The plan's patterns matched against the layer's module paths: path -> kind (of the
    patterns that match a path, the one with the fewest ``*`` wins, then the first given).
    Unknown kinds are refused."""
    for pattern, kind in plan.items():
        if kind not in KINDS:
            raise PlannerInputError(f"tensor-parallel plan: {pattern!r}: kind {kind!r} is not one of {', '.join(KINDS)}")
    out: dict[str, str] = {}
    for path, _ in layer.named_modules():
        matches = [(pattern.count("*"), i, kind) for i, (pattern, kind) in enumerate(plan.items())
                   if path and fnmatch.fnmatchcase(path, pattern) and path.count(".") == pattern.count(".")]
        if matches:
            out[path] = min(matches)[2]
    return out


def styles_for(layer: nn.Module, kinds: Mapping[str, str], sequence_parallel: bool) -> dict[str, ParallelStyle] | None:
    """The ``parallelize_module`` plan of ``layer`` for resolved ``kinds`` (path -> kind), or
    None when nothing in it is row-split (a layer that does not split)."""
    rows = [p for p, k in kinds.items() if k == "rowwise"]
    cols = [p for p, k in kinds.items() if k.startswith("colwise")]
    if not rows or not cols:
        return None
    stream = Shard(1) if sequence_parallel else Replicate()
    modules = dict(layer.named_modules())
    styles: dict[str, ParallelStyle] = {}
    for parent in sorted({_parent(p) for p in cols}):
        styles[parent] = ReplicateInput(stream)
    for p in cols:
        styles[p] = _col_style(modules[p], kinds[p], p)
    for p in rows:
        styles[p] = _row_style(modules[p], stream, p)
    if sequence_parallel:
        inside = tuple(f"{parent}." for parent in {_parent(p) for p in cols})
        for path, module in modules.items():
            if path and _norm(module) and not path.startswith(inside):
                styles[path] = SequenceParallel(use_local_output=True)
    return styles


def plan_styles(plan: Mapping[str, str]) -> Callable[[nn.Module, bool], dict[str, Any] | None]:
    """``TensorParallel.styles`` of a declared plan (patterns -> kinds, see the module docstring)."""
    frozen = dict(plan)

    def styles(layer: nn.Module, sequence_parallel: bool) -> dict[str, Any] | None:
        return styles_for(layer, resolve(layer, frozen), sequence_parallel)

    return styles


def recognised_plan(layer: nn.Module) -> dict[str, str]:
    """The standard attention and MLP blocks of ``layer``, by the names of their projections
    (:data:`ATTENTION_NAMES`, :data:`MLP_NAMES`): path -> kind."""
    modules = dict(layer.named_modules())
    out: dict[str, str] = {}
    for path, module in modules.items():
        prefix = f"{path}." if path else ""
        children = dict(module.named_children())
        for cols, row in ATTENTION_NAMES + MLP_NAMES:
            if not all(c in children for c in cols):
                continue
            row_path = _relative(prefix, row)
            if row_path not in modules or any(f"{prefix}{c}" in out for c in cols):
                continue
            fused = cols == ("c_attn",)
            for c in cols:
                out[f"{prefix}{c}"] = "colwise_qkv" if fused else "colwise"
            out[row_path] = "rowwise"
            break
    return out


def _relative(prefix: str, row: str) -> str:
    """A row-split module named relative to the column splits' parent (``../output/dense``)."""
    if not row.startswith("../"):
        return f"{prefix}{row}"
    base = prefix.rstrip(".").rpartition(".")[0]
    rest = row.removeprefix("../").replace("/", ".")
    return f"{base}.{rest}" if base else rest
