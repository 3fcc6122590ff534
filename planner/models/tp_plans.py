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
(:data:`ATTENTION_NAMES`, :data:`MLP_NAMES`); :func:`check_split` (run by the profiler on every
split layer) computes the split layer in one process with t = 2 emulated devices and refuses a
plan whose output differs from the whole layer's -- e.g. an attention that reshapes by a fixed
head count -- naming the module.

Decisions: only the kinds above (an embedding or LM head stays whole: their vocabulary split
is priced by the analytic profiles, not run); a module kind other than ``nn.Linear`` and
``Conv1D`` is refused by name; uneven splits are refused by the workload's ``must_divide``.
"""

from __future__ import annotations

import fnmatch
import threading
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

__all__ = ["KINDS", "ReplicateInput", "check_split", "plan_styles", "recognised_plan", "styles_for"]

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


def _is_conv1d(module: nn.Module) -> bool:
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
    if _is_conv1d(module):
        return ColwiseConv1D(parts=3 if kind == "colwise_qkv" else 1)
    raise PlannerInputError(f"tensor-parallel plan: {path!r} is a {type(module).__name__}; {kind} splits nn.Linear"
                            + (" (colwise_qkv: a fused Conv1D)" if kind == "colwise_qkv" else " and transformers' Conv1D"))


def _row_style(module: nn.Module, stream: Any, path: str) -> ParallelStyle:
    if isinstance(module, nn.Linear):
        return RowwiseParallel(output_layouts=stream)
    if _is_conv1d(module):
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


# ---------------------------------------------------------------- checking a split in one process


def check_split(layer: nn.Module, kinds: Mapping[str, str], x: Any, name: str, t: int = 2) -> None:
    """Compute ``layer(x)`` split over ``t`` emulated devices in one process -- each a copy of
    the layer holding its shard of every split parameter, the row splits' partial outputs summed
    across the copies (threads meeting at each row split), the column splits' parents with their
    :data:`LOCAL_ATTRS` divided -- and refuse the plan when the result differs from the whole
    layer's (``PlannerInputError`` naming the layer and the module)."""
    import copy

    copies = [copy.deepcopy(layer) for _ in range(t)]
    parents = {_parent(p) for p, k in kinds.items() if k.startswith("colwise")}
    for rank, twin in enumerate(copies):
        modules = dict(twin.named_modules())
        for path, kind in kinds.items():
            _shard(modules[path], kind, rank, t, f"layer {name!r}: {path!r}")
        for path in parents:
            for attr in LOCAL_ATTRS:
                if isinstance(getattr(modules[path], attr, None), int):
                    setattr(modules[path], attr, getattr(modules[path], attr) // t)
    rows = [p for p, k in kinds.items() if k == "rowwise"]
    barrier = threading.Barrier(t)
    slots: dict[tuple[str, int], torch.Tensor] = {}

    def hook_for(path: str, rank: int) -> Callable[..., torch.Tensor]:
        def hook(mod: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
            slots[(path, rank)] = out
            barrier.wait()
            total = sum(slots[(path, r)] for r in range(t))
            barrier.wait()
            return total  # type: ignore[return-value]

        return hook

    results: list[Any] = [None] * t
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        modules = dict(copies[rank].named_modules())
        handles = [modules[p].register_forward_hook(hook_for(p, rank)) for p in rows]
        try:
            with torch.no_grad():
                results[rank] = copies[rank](x)
        except BaseException as exc:  # reported below, one line
            errors.append(exc)
            barrier.abort()
        finally:
            for h in handles:
                h.remove()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(t)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    with torch.no_grad():
        whole = layer(x)
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real:
        raise PlannerInputError(
            f"layer {name!r}: its tensor-parallel split fails when computed over {t} devices ({type(real[0]).__name__}: "
            f"{' '.join(str(real[0]).split())[:200]}); a module that reshapes by a fixed head count cannot be split: "
            "declare the layer's split (TensorParallel.from_plan) or none"
        )
    got, want = _first(results[0]), _first(whole)
    scale = float(want.abs().max()) or 1.0
    diff = float((got.double() - want.double()).abs().max()) if got.shape == want.shape else float("inf")
    tol = 1e-9 if want.dtype == torch.float64 else 1e-4 if want.dtype == torch.float32 else 5e-2
    if not diff <= tol * scale:
        split = ", ".join(f"{p} {k}" for p, k in kinds.items())
        raise PlannerInputError(
            f"layer {name!r}: its tensor-parallel split ({split}) does not compute the layer: over {t} devices the "
            f"output differs by {diff:.3g} (of {scale:.3g}); declare the layer's split (TensorParallel.from_plan) or none"
        )


def _first(value: Any) -> torch.Tensor:
    return value[0] if isinstance(value, tuple) else value


def _shard(module: nn.Module, kind: str, rank: int, t: int, where: str) -> None:
    """Replace ``module``'s parameters with this rank's shard (in one process)."""
    conv = _is_conv1d(module)
    if not (isinstance(module, nn.Linear) or conv):
        raise PlannerInputError(f"{where} is a {type(module).__name__}; tensor-parallel splits nn.Linear and Conv1D")
    out_dim, in_dim = (1, 0) if conv else (0, 1)
    with torch.no_grad():
        if kind == "rowwise":
            module.weight = nn.Parameter(module.weight.chunk(t, dim=in_dim)[rank].clone())
            if getattr(module, "bias", None) is not None and rank:
                module.bias = nn.Parameter(torch.zeros_like(module.bias))
        else:
            parts = 3 if kind == "colwise_qkv" else 1
            module.weight = nn.Parameter(
                torch.cat([c.chunk(t, dim=out_dim)[rank] for c in module.weight.chunk(parts, dim=out_dim)], dim=out_dim).clone())
            if getattr(module, "bias", None) is not None:
                module.bias = nn.Parameter(torch.cat([c.chunk(t)[rank] for c in module.bias.chunk(parts)]).clone())
        if conv:
            module.nf = module.weight.size(1)
