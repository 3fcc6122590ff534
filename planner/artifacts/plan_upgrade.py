"""Older plan documents read as a later version (:func:`planner.artifacts.plan.plan_from_json` calls
them before validating)."""

from __future__ import annotations

from typing import Any

from planner.artifacts import codec
from planner.artifacts.stack import STACKS

__all__ = ["upgrade_v1", "upgrade_v3"]


def upgrade_v3(data: dict[str, Any]) -> dict[str, Any]:
    """A version-3 plan as version 5 (optimizer steps 0): priced for the ``none`` stack (nothing overlapped beyond
    the pipeline), in the plan and in its request."""
    none = codec.encode(STACKS["none"])
    out = dict(data, version=5, stack=none)
    prov = out.get("provenance")
    if isinstance(prov, dict) and isinstance(prov.get("request"), dict):
        out["provenance"] = dict(prov, request=dict(prov["request"], stack=none))
    return out


def upgrade_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A version-1 plan as version 2: ``lower_bound_ms`` was the partition bound."""
    out = dict(data, version=2)
    pred = out.get("predicted")
    if isinstance(pred, dict) and "lower_bound_ms" in pred:
        pred = dict(pred)
        pred["partition_bound_ms"] = pred.pop("lower_bound_ms")
        out["predicted"] = pred
    return out
