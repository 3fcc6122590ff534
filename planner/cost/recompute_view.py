"""Recomputation forced on every transformer block (``--recompute full|selective``), as the cost
model sees it during a search.

A request that forces a level (:class:`~planner.artifacts.kinds.RecomputeMode`) is searched on the
model with that level folded into its blocks, recomputation otherwise off: each forced block of
the device's view keeps what the level keeps (full: its input; selective: its saved bytes less its
attention core's) and its backward re-runs what the level re-runs (full: its forward; selective:
its core's forward), the storages a fully recomputed block shared with a later layer no longer
shared; the working set of the block being recomputed (its saved bytes, or its core's, per
sample: :func:`forced_workspace_per_sample`) is held as a per-sample buffer of every stage, which
is what the priced plan holds for it (the bytes of that layer that do not grow with the
micro-batch aside). The search's layouts and partitions are then optimal for the forced level,
and the chosen plan is priced again on the model itself with the level as its recomputed layers
(:mod:`planner.solve.forced`).

The level travels with the profile (:data:`FORCED_KEY` in its metadata, :func:`with_forced`), so
that every cost model the search builds (:func:`planner.cost.tensor_parallel.device_cost_model`)
folds it into the per-device view, after tensor and context parallelism: the re-run forward is the
device's, collectives included.
"""

from __future__ import annotations

import dataclasses

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import RecomputeMode
from planner.artifacts.profile import Layer, Profile, TimeFit

__all__ = ["FORCED_KEY", "forced_layers", "forced_view", "forced_workspace_per_sample", "with_forced"]

#: the profile metadata key the forced level travels in
FORCED_KEY = "forced_recompute"


def forced_layers(profile: Profile, mode: RecomputeMode) -> tuple[int, ...]:
    """The layers ``mode`` recomputes: the transformer blocks (the layers with an attention core);
    under ``full``, every layer where none has one; none under ``auto`` and ``none``."""
    if mode not in (RecomputeMode.FULL, RecomputeMode.SELECTIVE):
        return ()
    blocks = tuple(i for i, layer in enumerate(profile.layers) if layer.attention_core is not None)
    if blocks or mode is RecomputeMode.SELECTIVE:
        if not blocks:
            raise PlannerInputError(f"--recompute selective: no layer of profile {profile.model!r} has an attention core "
                                    "to recompute selectively (--recompute full recomputes whole layers)")
        return blocks
    return tuple(range(profile.num_layers))


def with_forced(profile: Profile, mode: RecomputeMode) -> Profile:
    """``profile`` carrying the forced level (searched as if it were the model's own)."""
    return dataclasses.replace(profile, metadata={**profile.metadata, FORCED_KEY: mode.value})


def _plus(a: TimeFit, b: TimeFit) -> TimeFit:
    return TimeFit(intercept_ms=a.intercept_ms + b.intercept_ms, per_sample_ms=a.per_sample_ms + b.per_sample_ms)


def _forced_layer(layer: Layer, mode: RecomputeMode) -> Layer:
    if mode is RecomputeMode.FULL:
        return dataclasses.replace(layer, saved_bytes_per_sample=layer.input_bytes_per_sample, saved_bytes_fixed=0.0,
                                   bwd=_plus(layer.bwd, layer.fwd), attention_core=None, measured=(), tp=None)
    core = layer.attention_core
    assert core is not None
    return dataclasses.replace(layer, saved_bytes_per_sample=layer.saved_bytes_per_sample - core.saved_bytes_per_sample,
                               saved_bytes_fixed=layer.saved_bytes_fixed - core.saved_bytes_fixed,
                               bwd=_plus(layer.bwd, core.fwd), attention_core=None, measured=(), tp=None)


def forced_view(profile: Profile, workspace_of: Profile | None = None) -> tuple[Profile, float]:
    """A device's view with the level its metadata forces folded in (module docstring;
    ``profile`` itself when it forces none), and the forced working set per sample
    (:func:`forced_workspace_per_sample`) of ``workspace_of`` (``profile`` when None): the two
    things a device's cost model takes from the forced level."""
    workspace = forced_workspace_per_sample(profile if workspace_of is None else workspace_of)
    value = profile.metadata.get(FORCED_KEY)
    if not value:
        return profile, workspace
    mode = RecomputeMode(str(value))
    chosen = set(forced_layers(profile, mode))
    layers = tuple(_forced_layer(layer, mode) if i in chosen else layer for i, layer in enumerate(profile.layers))
    shared = profile.shared_saved if mode is RecomputeMode.SELECTIVE else tuple(
        p for p in profile.shared_saved if p.first not in chosen)
    return dataclasses.replace(profile, layers=layers, shared_saved=shared), workspace


def forced_workspace_per_sample(profile: Profile) -> float:
    """Bytes per sample of the largest working set of a layer the profile's forced level recomputes
    (0 when it forces none): its saved bytes (full) or its attention core's (selective)."""
    value = profile.metadata.get(FORCED_KEY)
    if not value:
        return 0.0
    mode = RecomputeMode(str(value))
    layers = [profile.layers[i] for i in forced_layers(profile, mode)]
    if mode is RecomputeMode.FULL:
        return max((layer.saved_bytes_per_sample for layer in layers), default=0.0)
    return max((layer.attention_core.saved_bytes_per_sample for layer in layers if layer.attention_core), default=0.0)
