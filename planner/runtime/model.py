"""Load a workload by spec, cast it to the run's dtype, and fingerprint it.

Specs are resolved by the model zoo, :func:`planner.models.load_workload` (``gpt``,
``resnet:blocks=2``, ``package.module:callable``, ...). The global RNG is also seeded before
the factory runs, so user factories that do not seed themselves still build identical
weights on every rank. The fingerprint is the zoo's (= the profiler's): layer names and
parameter shapes in ``named_parameters()`` order.

Ties found by identity: a model whose layers share one ``Parameter`` object (a head built on
the embedding's weight) without declaring it in ``Workload.tied`` is tied all the same -- the
profiler finds the tie that way and the plan prices its synchronisation -- so
:func:`load_workload` adds each such group to ``tied`` (:func:`identity_ties`), and the runtime
synchronises it across pipeline ranks exactly like a declared tie. Without that, a rank
holding the embedding and one holding the head would each train their own copy.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from planner.artifacts.kinds import DType
from planner.models import load_workload as zoo_load_workload
from planner.models import workload_fingerprint
from planner.models.workload import Workload

__all__ = ["TORCH_DTYPES", "cast_batch", "cast_workload", "identity_ties", "load_workload", "workload_fingerprint"]

#: the torch element type of each runtime dtype (``planner.artifacts.kinds.RUNTIME_DTYPES``)
TORCH_DTYPES = {DType.FLOAT32: torch.float32, DType.FLOAT64: torch.float64}


def load_workload(spec: str, seed: int, dtype: DType | None = None) -> Workload:
    """The workload named by ``spec`` (zoo dtype option set to ``dtype`` when given), with its
    undeclared ties by identity added (see the module docstring)."""
    torch.manual_seed(seed)
    workload = zoo_load_workload(spec, dtype=None if dtype is None else DType(dtype).value)
    extra = identity_ties(workload)
    return dataclasses.replace(workload, tied=workload.tied + extra) if extra else workload


def identity_ties(workload: Workload) -> tuple[tuple[tuple[int, str], ...], ...]:
    """Groups of ``(layer index, parameter name)`` that are one ``Parameter`` object in two or
    more layers and that no declared group of ``workload.tied`` already covers."""
    owners: dict[int, list[tuple[int, str]]] = {}
    for idx, layer in enumerate(workload.layers):
        seen: set[int] = set()
        for name, param in layer.named_parameters():
            if id(param) not in seen:
                seen.add(id(param))
                owners.setdefault(id(param), []).append((idx, name))
    declared = {
        id(workload.layers[i].get_parameter(name)) for group in workload.tied for i, name in group
    }
    return tuple(tuple(group) for key, group in owners.items() if len(group) > 1 and key not in declared)


def cast_workload(workload: Workload, dtype: DType) -> None:
    """Cast every layer's floating parameters and buffers to ``dtype`` in place."""
    torch_dtype = TORCH_DTYPES[DType(dtype)]
    for layer in workload.layers:
        layer.to(torch_dtype)


def cast_batch(value: Any, dtype: DType) -> Any:
    """Floating tensors of a batch (or tuple of them) cast to ``dtype``; others untouched."""
    if isinstance(value, torch.Tensor):
        return value.to(TORCH_DTYPES[DType(dtype)]) if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(cast_batch(v, dtype) for v in value)
    return value
