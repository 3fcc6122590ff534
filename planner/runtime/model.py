"""Load a workload by spec, cast it to the run's dtype, and fingerprint it.

A spec is either a zoo name handled by ``planner.models.load_workload`` (``gpt``,
``resnet``, with that module's option syntax) or ``package.module:callable``, a factory
called with no arguments that returns a :class:`planner.workload.Workload`. The global RNG
is seeded before the factory runs, so every rank builds identical weights.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from planner.artifacts.profile import profile_fingerprint
from planner.errors import PlannerInputError
from planner.workload import Workload

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _zoo_loader() -> Any:
    try:
        module = importlib.import_module("planner.models")
    except ImportError:
        return None
    return getattr(module, "load_workload", None)


def load_workload(spec: str, seed: int) -> Workload:
    """The workload named by ``spec``, built with the global RNG seeded to ``seed``."""
    torch.manual_seed(seed)
    module_name, sep, attr = spec.partition(":")
    if sep and "." in module_name:
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise PlannerInputError(f"model spec {spec!r}: cannot import {module_name}:{attr} ({exc})") from None
        workload = factory()
    else:
        loader = _zoo_loader()
        if loader is None:
            raise PlannerInputError(f"model spec {spec!r}: no model zoo (planner.models.load_workload) and not module:callable")
        workload = loader(spec)
    if not isinstance(workload, Workload):
        raise PlannerInputError(f"model spec {spec!r} returned {type(workload).__name__}, not a Workload")
    return workload


def cast_workload(workload: Workload, dtype_name: str) -> None:
    """Cast every layer's floating parameters and buffers to ``dtype_name`` in place."""
    dtype = DTYPES[dtype_name]
    for layer in workload.layers:
        layer.to(dtype)


def cast_batch(value: Any, dtype_name: str) -> Any:
    """Floating tensors of a batch (or tuple of them) cast to ``dtype_name``; others untouched."""
    if isinstance(value, torch.Tensor):
        return value.to(DTYPES[dtype_name]) if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(cast_batch(v, dtype_name) for v in value)
    return value


def layer_param_shapes(layer: torch.nn.Module) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(p.shape) for p in layer.parameters())


def workload_fingerprint(workload: Workload) -> str:
    """``profile_fingerprint`` over the workload's layer names and parameter shapes."""
    shapes = tuple(layer_param_shapes(layer) for layer in workload.layers)
    return profile_fingerprint(workload.layer_names, shapes)
