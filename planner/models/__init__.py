"""Models as the planner sees them: the :class:`~planner.models.workload.Workload` contract, the
zoo and model specs (:mod:`.zoo`, which imports torch), Hugging Face configs (:mod:`.hf`), layer
chains with skip connections carried for you (:func:`chain`, :mod:`.skips`), and the FLOP counts
of the blocks they build (:mod:`.flops`, no torch).

The names below are imported on first use, so that ``planner.models.flops`` and
``planner.models.workload`` stay free of torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "chain": "planner.models.skips",
    "ZOO": "planner.models.zoo",
    "load_workload": "planner.models.zoo",
    "workload_fingerprint": "planner.models.zoo",
    "layer_param_shapes": "planner.models.zoo",
    "layer_param_names": "planner.models.zoo",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'planner.models' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
