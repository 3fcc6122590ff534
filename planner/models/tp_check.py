"""Checks that a layer's tensor-parallel split (:mod:`planner.models.tp_plans`) computes the
layer, run by the profiler on one layer of each class and split, before any figure is counted:

- :func:`check_split`: the layer computed over t = 2 emulated devices in one process (each a
  copy holding its shards, :func:`shard_copy`; threads meeting at each row split to sum the
  partial outputs) against the whole layer: a plan whose output differs -- e.g. an attention
  that reshapes by a fixed head count -- is refused, naming the layer and the module;
- :func:`check_dtensor_split`: the layer split by torch itself (``parallelize_module`` over a
  one-device mesh of a one-process gloo group), with and without sequence parallelism: the
  styles meet the layer's real code as the runtime's ranks will, so a module the split leaves
  whole whose plain parameters meet a DTensor (an RMSNorm inside the module whose input the
  split makes a DTensor: ``aten.mul.Tensor got mixed torch.Tensor and DTensor`` at ``self.weight
  * x``) is refused here, in one line naming the module and the line of code, rather than at
  the run's first step on every rank.
"""

from __future__ import annotations

import copy
import threading
import traceback
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from planner.artifacts.errors import PlannerInputError
from planner.models.tp_plans import LOCAL_ATTRS, is_conv1d

__all__ = ["check_dtensor_split", "check_split", "shard_copy"]


def check_split(layer: nn.Module, kinds: Mapping[str, str], x: Any, name: str, t: int = 2) -> None:
    """Compute ``layer(x)`` split over ``t`` emulated devices in one process -- each a copy of
    the layer holding its shard of every split parameter, the row splits' partial outputs summed
    across the copies (threads meeting at each row split), the column splits' parents with their
    :data:`LOCAL_ATTRS` divided -- and refuse the plan when the result differs from the whole
    layer's (``PlannerInputError`` naming the layer and the module)."""
    copies = [shard_copy(layer, kinds, rank, t, name) for rank in range(t)]
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


def shard_copy(layer: nn.Module, kinds: Mapping[str, str], rank: int, t: int, name: str) -> nn.Module:
    """A copy of ``layer`` as device ``rank`` of ``t`` holds it (in one process): every split
    module with its shard of the parameters, the column splits' parents with their
    :data:`LOCAL_ATTRS` divided. Alone it computes the device's share with the row splits'
    outputs partial (not summed): the shapes, and so the bytes it saves, are the device's."""
    twin = copy.deepcopy(layer)
    modules = dict(twin.named_modules())
    for path, kind in kinds.items():
        _shard(modules[path], kind, rank, t, f"layer {name!r}: {path!r}")
    for path in {p.rpartition('.')[0] for p, k in kinds.items() if k.startswith("colwise")}:
        for attr in LOCAL_ATTRS:
            if isinstance(getattr(modules[path], attr, None), int):
                setattr(modules[path], attr, getattr(modules[path], attr) // t)
    return twin


def _first(value: Any) -> torch.Tensor:
    return value[0] if isinstance(value, tuple) else value


def _shard(module: nn.Module, kind: str, rank: int, t: int, where: str) -> None:
    """Replace ``module``'s parameters with this rank's shard (in one process)."""
    conv = is_conv1d(module)
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


def check_dtensor_split(layer: nn.Module, styles_of: Callable[[nn.Module, bool], dict[str, Any] | None], x: Any,
                        name: str) -> None:
    """Split a copy of ``layer`` with torch's ``parallelize_module`` over a one-device mesh and run
    it on ``x`` (no grad), with sequence parallelism off and on (``styles_of``: the workload's
    ``TensorParallel.styles``); a failure is refused in one line naming the module running and
    the line of code (see the module docstring). Skipped inside a process that already has a
    default process group (a run's ranks), or where a one-process gloo group cannot start."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import parallelize_module

    if not dist.is_available() or dist.is_initialized():
        return
    try:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    except (RuntimeError, ValueError):  # no gloo here (a build without it, no usable network device): left to the run
        return
    try:
        mesh = DeviceMesh("cpu", [0])
        for sp in (False, True):
            twin = copy.deepcopy(layer)
            styles = styles_of(twin, sp)
            if not styles:
                return
            running = _track_modules(twin)
            parallelize_module(twin, mesh, styles, src_data_rank=None)
            try:
                with torch.no_grad(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # torch's own advice on building DTensors: not the user's to act on
                    twin(x)
            except Exception as exc:  # the user's layer meeting torch's styles: one line
                raise PlannerInputError(_dtensor_failure(name, twin, running, exc, styles, sp)) from None
    finally:
        dist.destroy_process_group()


def _track_modules(layer: nn.Module) -> list[str]:
    """A stack of the paths of the modules of ``layer`` running now (hooks push and pop them);
    after an exception its top is the innermost module that was running."""
    running: list[str] = []

    def pop(mod: nn.Module, args: Any, out: Any) -> None:  # None: the output stays the module's
        running.pop()

    for path, module in layer.named_modules():
        module.register_forward_pre_hook(lambda mod, args, path=path: running.append(path))
        module.register_forward_hook(pop)
    return running


def _dtensor_failure(name: str, layer: nn.Module, running: list[str], exc: Exception, styles: dict[str, Any],
                     sp: bool) -> str:
    """The one line of a split that fails under torch's styles: the module running, the line of
    the layer's code, the error, and what to do."""
    path = running[-1] if running else ""
    module = layer.get_submodule(path) if path else layer
    torch_dir = str(Path(torch.__file__).parent)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(torch_dir)]
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno} `{frames[-1].line}`" if frames else ""
    text = " ".join(str(exc).split())
    cause = f"{type(exc).__name__}: {text[:160]}"
    if "mixed torch.Tensor and DTensor" in text:
        cause = f"{type(exc).__name__}: {text.split('!')[0].split(', need')[0]}"
        from torch.distributed.tensor.parallel import ColwiseParallel

        cols = sorted(p for p, style in styles.items() if isinstance(style, ColwiseParallel))
        parents = sorted({f"module {c.rpartition('.')[0]!r}" if "." in c else "the layer itself" for c in cols})
        hint = (f"module {path or '(the layer)'!r} ({type(module).__name__}) is left whole, its parameters plain tensors, "
                f"but runs on the DTensor input that {' and '.join(parents)} receives for the column splits "
                f"{', '.join(map(repr, cols))}: declare the split so that the projections' parent holds only them "
                "(e.g. 'mlp.gate' with the norm outside 'mlp'), or split none of this layer")
    else:
        hint = "declare the layer's split (TensorParallel.from_plan) so that torch's styles run it, or none"
    mode = " with sequence parallelism" if sp else ""
    return (f"layer {name!r}: its tensor-parallel split fails under torch's DTensor styles{mode}, in module "
            f"{path or '(the layer)'!r}{where}: {cause}; {hint}")
