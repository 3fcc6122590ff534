"""Cross-field checks of a loaded document: figures that must agree with each other.

Each field of a document is range-checked where it is declared (``__post_init__``); what
only shows between fields -- a sum that must match its parts, a count its shapes imply, a
time its stages bound from below -- is checked here, by the loaders
(``profile_from_json``, ``plan_from_json``, ``report_from_json``), once, at the boundary. Each
check raises ``ValueError`` naming the field path and the values that disagree; the loader
prefixes the file. Every check is linear in the document and holds, with the tolerances
stated, for every document the planner writes (the golden corpus, the shipped profiles, the
runtime's reports).

Profiles (:func:`check_profile`):

- a layer's (and a tied parameter's) ``param_bytes`` is its ``param_count`` x the profile's
  dtype size, within a factor of 2 either way (a bfloat16 model keeping some parameters in
  float32, or in float8) and 8 bytes (PipeDream's sizes rounded to whole parameters);
- ``param_shapes``, when given (measured profiles), add up to ``param_count`` (each holds at
  most ``MAX_SHAPE_DIMS`` dimensions: ``Layer``'s own check);
- ``fingerprint_sha256``, when set, is the fingerprint of the layer names, shapes and model config listed
  (``planner.artifacts.profile.profile_fingerprint``): a profile whose names or shapes were
  edited is no longer the model it claims to be.

Plans (:func:`check_plan`), when the prediction is set (``iteration_ms`` > 0; 0 is a plan
whose predictions are still to be made):

- ``predicted.iteration_ms`` is at least the compute of the busiest device (the sum over the
  stages it holds of ``M / replicas x (fwd + bwd + recompute)``: no schedule runs a device's
  work in less) and at least ``partition_bound_ms`` and ``machine_bound_ms``;
- ``throughput_samples_per_s`` is ``global_batch / iteration_ms`` (to 1e-6);
- each stage's ``memory_total_bytes`` is the sum of its ``memory`` parts.

Run reports (:func:`check_report`): at least one step; step indices strictly increasing (no
step twice); stages listed in order; ``iteration_ms`` (a median of the steps' wall times)
within the steps' range, and ``iteration_rel_error`` what it and ``iteration_ms_predicted``
give (to 1e-6).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["check_plan", "check_profile", "check_report"]

#: relative tolerance of figures the planner computes in floating point
REL_TOL = 1e-6


def _bytes_per_param_ok(count: int, nbytes: int, itemsize: int) -> bool:
    return count * itemsize / 2 - 8 <= nbytes <= count * itemsize * 2 + 8


def check_profile(
    profile: Any,
    fingerprint: Callable[[tuple[str, ...], tuple[tuple[tuple[int, ...], ...], ...], dict[str, str] | None], str],
) -> None:
    """The cross-field checks of a ``Profile`` (see the module docstring); ``fingerprint`` is
    ``planner.artifacts.profile.profile_fingerprint``. (The documents are typed loosely here:
    their modules import this one.)"""
    size = profile.dtype.itemsize
    for i, layer in enumerate(profile.layers):
        if not _bytes_per_param_ok(layer.param_count, layer.param_bytes, size):
            raise ValueError(
                f"layers[{i}] ({layer.name!r}): param_bytes {layer.param_bytes:,} contradicts param_count "
                f"{layer.param_count:,} x {size} bytes ({profile.dtype.value}): {layer.param_count * size:,} expected"
            )
        if layer.param_shapes:
            _check_shapes(i, layer.name, layer.param_shapes, layer.param_count)
    for tie in profile.tied:
        if not _bytes_per_param_ok(tie.param_count, tie.param_bytes, size):
            raise ValueError(f"tied {tie.name!r}: param_bytes {tie.param_bytes:,} contradicts param_count "
                             f"{tie.param_count:,} x {size} bytes ({profile.dtype.value})")
    if profile.fingerprint_sha256:
        shapes = tuple(layer.param_shapes for layer in profile.layers)
        if fingerprint(profile.layer_names, shapes, profile.model_config or None) != profile.fingerprint_sha256:
            raise ValueError(
                f"fingerprint_sha256 {profile.fingerprint_sha256[:12]}... is not the fingerprint of the layer names, "
                f"param_shapes and model_config listed: the profile was edited after it was made (re-profile the model)"
            )


def _check_shapes(i: int, name: str, shapes: tuple[tuple[int, ...], ...], count: int) -> None:
    total = sum(math.prod(shape) for shape in shapes)  # each at most MAX_SHAPE_DIMS long (Layer's own check)
    if total != count:
        raise ValueError(f"layers[{i}] ({name!r}): param_shapes hold {total:,} parameters but param_count is {count:,}")


def check_plan(plan: Any) -> None:
    """The cross-field checks of a ``Plan`` (see the module docstring)."""
    for stage in plan.stages:
        if stage.memory_total_bytes != stage.memory.total_bytes:
            raise ValueError(f"stages[{stage.stage_idx}].memory_total_bytes {stage.memory_total_bytes:,} is not the sum of "
                             f"its memory ({stage.memory.total_bytes:,} bytes)")
    pred = plan.predicted
    if pred.iteration_ms == 0:
        if pred.throughput_samples_per_s:
            raise ValueError(f"predicted.throughput_samples_per_s {pred.throughput_samples_per_s} without an iteration_ms")
        return
    load: dict[int, float] = {}
    for stage in plan.stages:
        work = plan.num_microbatches / stage.replicas * (stage.fwd_ms + stage.bwd_ms + stage.recompute_ms)
        for rank in stage.ranks:
            load[rank] = load.get(rank, 0.0) + work
    busiest = max(load, key=lambda r: load[r])
    floors = {f"rank {busiest}'s compute (its stages' M / replicas x (fwd_ms + bwd_ms + recompute_ms))": load[busiest],
              "predicted.partition_bound_ms": pred.partition_bound_ms, "predicted.machine_bound_ms": pred.machine_bound_ms}
    for what, floor in floors.items():
        if pred.iteration_ms < floor * (1 - REL_TOL):
            raise ValueError(f"predicted.iteration_ms {pred.iteration_ms:g} is less than {what}, {floor:g} ms")
    throughput = plan.global_batch * 1000.0 / pred.iteration_ms
    if not math.isclose(pred.throughput_samples_per_s, throughput, rel_tol=REL_TOL):
        raise ValueError(f"predicted.throughput_samples_per_s {pred.throughput_samples_per_s:g} is not global_batch / "
                         f"iteration_ms = {throughput:g}")


def check_report(report: Any) -> None:
    """The cross-field checks of a ``RunReport`` (see the module docstring)."""
    if not report.steps:
        raise ValueError("steps: a run report holds at least one step")
    for prev, step in zip(report.steps, report.steps[1:]):
        if step.step_idx <= prev.step_idx:
            raise ValueError(f"steps: step_idx {step.step_idx} follows {prev.step_idx} (each step once, in order)")
    for i, stage in enumerate(report.stages):
        if stage.stage_idx != i:
            raise ValueError(f"stages[{i}] is listed as stage_idx {stage.stage_idx}")
    walls = [s.wall_ms for s in report.steps]
    lo, hi = min(walls), max(walls)
    if not lo * (1 - REL_TOL) <= report.iteration_ms <= hi * (1 + REL_TOL):
        raise ValueError(f"iteration_ms {report.iteration_ms:g} is outside its steps' wall times [{lo:g}, {hi:g}] "
                         f"(it is their median)")
    predicted = report.iteration_ms_predicted
    error = (report.iteration_ms - predicted) / predicted if predicted else 0.0
    if not math.isclose(report.iteration_rel_error, error, rel_tol=REL_TOL, abs_tol=1e-9):
        raise ValueError(f"iteration_rel_error {report.iteration_rel_error:g} is not (iteration_ms - "
                         f"iteration_ms_predicted) / iteration_ms_predicted = {error:g}")
