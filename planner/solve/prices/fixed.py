"""What a stage table holds that its memory cap does not change: every stage's compute time,
static bytes, activation bytes per micro-batch, synchronised bytes and the like, each an
``(L + 1) x (L + 1)`` matrix over the stages ``[i, j)`` built from the cost model's vectorised
per-stage sums (:class:`planner.cost.prefix.PrefixSums`).

Two layers of sharing, each a registered cache (:mod:`planner.artifacts.caches`) held per cost
model (weakly: freed with it), as are every stage's synchronised bytes per sharding's bytes per
parameter:

- :class:`BatchPart`: what the micro-batch size and fixed boundaries decide (times, activation
  bytes, the layers' kinds and runs of identical layers (:func:`layer_kinds`), the recompute
  choices worked out so far, which read a stage's layers, in-flight count and excess only),
  shared by every sharding;
- :class:`FixedPart`: a batch part with what the sharding and ZeRO 3 line decide (static bytes,
  synchronised bytes, ZeRO 3's compute), shared by every cap (a search's tighter caps, the
  layouts a refusal measures). GPT-3 175B on 1,024 GPUs: 120 fixed parts, 25 batch parts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from planner.artifacts.caches import Cache, OwnedCache
from planner.artifacts.layout import Sharding
from planner.cost import CostModel
from planner.cost.fsdp import working_set_matrix
from planner.cost.sharding import is_fsdp
from planner.solve.recompute import INF, RecomputeChoice

__all__ = ["BatchPart", "FixedPart", "fixed_part", "layer_kinds", "layer_runs", "lengths"]

#: a stage's recompute choice by what it reads (its layers, in-flight count and excess)
Choices = dict[tuple[object, ...], RecomputeChoice]


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchPart:
    """The arrays of one micro-batch size and set of fixed boundaries (read-only; per stage
    ``[i, j)`` at ``[i, j]``, per layer at ``[l]``)."""

    fwd: np.ndarray  # per layer, forward ms
    valid: np.ndarray  # stages: at least one layer, no fixed boundary inside
    compute: np.ndarray  # F + B, inf where not a stage
    bwd_prefix: np.ndarray  # backward ms of layers 0..l-1
    act: np.ndarray  # bytes one in-flight micro-batch keeps without recomputation
    buffer: np.ndarray  # send and receive buffers (and context parallelism's gathered keys and values)
    keep: np.ndarray  # bytes a micro-batch past its input-gradient pass keeps until its W (at most act)
    shared: bool  # some storage is saved by two layers (then recompute choices are made a stage at a time)
    saved: np.ndarray  # per layer, bytes saved for backward
    inputs: np.ndarray  # per layer, its input's bytes (what a fully recomputed layer keeps)
    core: np.ndarray  # per layer, its attention core's bytes (what the selective level frees)
    core_ms: np.ndarray  # per layer, its attention core's forward ms
    gain: np.ndarray  # the most bytes recomputation can free from each stage per micro-batch in flight
    levels: np.ndarray | None  # stages whose choice is the selective cover, priced many at once (None: none)
    kind: tuple[int, ...]  # per layer its kind: layers of the same times and bytes share one (layer_kinds)
    run: tuple[int, ...]  # per layer i, the identical layers from i on, i included (layer_runs)
    lengths: np.ndarray  # per stage its number of layers, j - i at [i, j] (:func:`lengths`)
    choices: Choices  # grows as tables ask (a memo, the same answer whichever table asks)


@dataclass(frozen=True, slots=True, kw_only=True)
class FixedPart:
    """A :class:`BatchPart` with what one sharding and ZeRO 3 line decide (read-only)."""

    batch: BatchPart
    fsdp: bool  # ZeRO 3 over more than one rank
    compute: np.ndarray  # F + B (under ZeRO 3 F' + B' of planner.cost.fsdp), inf where not a stage
    kappa: float  # model-state bytes per parameter at the peak
    sync_bytes_per_param: float  # synchronised after the last backward
    static: np.ndarray  # model state + buffers (+ ZeRO 3's gathered working set), bytes
    sync_bytes: np.ndarray  # synchronised after the last backward, bytes (the routed experts' included)


#: per cost model, its fixed parts by (micro-batch size, sharding, ZeRO 3 line, fixed boundaries)
_FIXED: OwnedCache[CostModel, tuple[int, Sharding, tuple[float, float], tuple[int, ...]], FixedPart] = OwnedCache(
    "solve.prices.fixed", key="cost model -> (micro-batch size, sharding, ZeRO 3 line, fixed boundaries)", bound=512)
#: per cost model, its batch parts by (micro-batch size, fixed boundaries)
_BATCHES: OwnedCache[CostModel, tuple[int, tuple[int, ...]], BatchPart] = OwnedCache(
    "solve.prices.batches", key="cost model -> (micro-batch size, fixed boundaries)", bound=128)
#: per cost model, every stage's bytes synchronised after its last backward by the bytes per parameter
_SYNC: OwnedCache[CostModel, float, np.ndarray] = OwnedCache(
    "solve.prices.sync", key="cost model -> bytes synchronised per parameter", bound=16)


def fixed_part(cm: CostModel, microbatch_size: int, sharding: Sharding, fsdp_line: tuple[float, float],
               fixed_boundaries: tuple[int, ...]) -> FixedPart:
    """The :class:`FixedPart` of these (cached per cost model)."""
    key = (microbatch_size, sharding, fsdp_line, fixed_boundaries)
    found = _FIXED.get(cm, key)
    if found is None:
        found = _FIXED.put(cm, key, _build_fixed(cm, microbatch_size, sharding, fsdp_line, fixed_boundaries))
    return found


def _build_fixed(cm: CostModel, microbatch_size: int, sharding: Sharding, fsdp_line: tuple[float, float],
                 fixed_boundaries: tuple[int, ...]) -> FixedPart:
    """A fixed part: what only the sharding and ZeRO 3 line change worked out for it, the rest
    shared with every fixed part of the same micro-batch size and fixed boundaries."""
    batch = _BATCHES.get(cm, (microbatch_size, fixed_boundaries))
    if batch is None:
        batch = _BATCHES.put(cm, (microbatch_size, fixed_boundaries), _batch_part(cm, microbatch_size, fixed_boundaries))
    tables = cm.state_tables(sharding)
    params = tables.param_count
    fsdp = is_fsdp(sharding)
    compute = batch.compute
    if fsdp:  # F' + B': ZeRO 3's gathers and reduce-scatters as the stack overlaps them
        compute = np.where(batch.valid, cm.fsdp_terms(microbatch_size, fsdp_line, sharding).matrix(), INF)
        batch = _fsdp_batch(cm, batch, microbatch_size, sharding, fsdp_line)
    kappa = tables.state_bytes_per_param
    sync_per_param = tables.sync_bytes_per_param
    sync_bytes = _SYNC.get(cm, sync_per_param)
    if sync_bytes is None:
        sync_bytes = _SYNC.put(cm, sync_per_param, _read_only(params * sync_per_param))
    static = tables.state_bytes + batch.buffer
    if fsdp:  # the gathered weights and gradients of the layers in flight
        static = static + working_set_matrix(
            cm.param_count, cm.weight_bytes_per_param + cm.grad_bytes_per_param, cm.stack.fsdp_prefetch)
    return FixedPart(batch=batch, fsdp=fsdp, compute=_read_only(compute), kappa=kappa,
                     sync_bytes_per_param=sync_per_param, static=_read_only(static), sync_bytes=_read_only(sync_bytes))


def _fsdp_batch(cm: CostModel, batch: BatchPart, microbatch_size: int, sharding: Sharding,
                fsdp_line: tuple[float, float]) -> BatchPart:
    """``batch`` with its recompute prices as ZeRO 3 prices them (what runs beside a backward's
    collectives hidden: :meth:`CostModel.recompute_prices`), its choices its own; ``batch``
    itself where nothing is hidden."""
    fwd, core_ms = cm.recompute_prices(microbatch_size, sharding, fsdp_line)
    if fwd is batch.fwd or (np.array_equal(fwd, batch.fwd) and np.array_equal(core_ms, batch.core_ms)):
        return batch
    kind, _ = layer_kinds(fwd, batch.saved, batch.inputs, batch.core, core_ms)
    return dataclasses.replace(batch, fwd=_read_only(fwd), core_ms=_read_only(core_ms), choices={},
                               kind=tuple(kind), run=tuple(layer_runs(kind)))


def _batch_part(cm: CostModel, microbatch_size: int, fixed_boundaries: tuple[int, ...]) -> BatchPart:
    """The :class:`BatchPart` of one micro-batch size and set of fixed boundaries."""
    L = cm.num_layers
    idx = np.arange(L + 1)
    valid = idx[None, :] > idx[:, None]
    for f in fixed_boundaries:
        valid &= ~((idx[:, None] < f) & (idx[None, :] > f))
    at = cm.at_batch(microbatch_size, stages=True)
    fwd, _ = at.times_ms
    saved, inputs = at.saved_bytes, cm.input_per_sample * microbatch_size
    core, core_ms = at.core_bytes, at.core_ms
    shared = bool(cm.profile.shared_saved)
    has_core = np.concatenate([[0], np.cumsum(core > 0)])
    levels = (has_core[None, :] - has_core[:, None] > 0) if cm.selective and not shared else None
    gains = np.maximum(np.maximum(saved - inputs, 0.0), core if cm.selective else 0.0)
    gp = np.concatenate([[0.0], np.cumsum(gains)])
    sums = at.stages
    assert sums is not None  # asked for above
    kind, _ = layer_kinds(fwd, saved, inputs, core, core_ms)
    return BatchPart(
        fwd=_read_only(fwd), valid=_read_only(valid),
        compute=_read_only(np.where(valid, sums.compute_ms, INF)), bwd_prefix=_read_only(at.prefix_ms[1]),
        act=_read_only(sums.activation_bytes), buffer=_read_only(sums.buffer_bytes),
        keep=_read_only(np.minimum(sums.wgrad_bytes, sums.activation_bytes)), shared=shared,
        saved=_read_only(saved), inputs=_read_only(inputs), core=_read_only(core), core_ms=_read_only(core_ms),
        gain=_read_only(gp[None, :] - gp[:, None]), levels=None if levels is None else _read_only(levels),
        kind=tuple(kind), run=tuple(layer_runs(kind)), lengths=lengths(L), choices={},
    )


#: a kind of layer's figures: (forward ms, saved bytes, input bytes, core bytes, core ms)
Figures = tuple[float, float, float, float, float]


def layer_kinds(fwd: np.ndarray, saved: np.ndarray, inputs: np.ndarray, core: np.ndarray, core_ms: np.ndarray
                ) -> tuple[list[int], list[Figures]]:
    """The distinct layers of these per-layer arrays (what a stage's recompute choice reads of
    its layers): per layer its kind, numbered in the order the kinds first appear, and per kind
    its figures."""
    kinds: dict[Figures, int] = {}
    kind = [kinds.setdefault((float(f), float(a), float(b), float(c), float(cm_)), len(kinds))
            for f, a, b, c, cm_ in zip(fwd, saved, inputs, core, core_ms)]
    return kind, list(kinds)


def layer_runs(kind: list[int]) -> list[int]:
    """Per layer ``i``, how many identical layers (of ``kind``) follow from ``i`` on, ``i`` included."""
    run = [1] * len(kind)
    for i in range(len(kind) - 2, -1, -1):
        if kind[i] == kind[i + 1]:
            run[i] = run[i + 1] + 1
    return run


def _read_only(array: np.ndarray) -> np.ndarray:
    """``array``, made read-only where it owns its data (views into the cost model's own cached
    arrays are its to guard)."""
    out = np.asarray(array)
    if out.flags.owndata:
        out.flags.writeable = False
    return out


#: per number of layers L, the layers of each stage (i, j): j - i (an (L + 1) x (L + 1) matrix)
_LENGTHS: Cache[int, np.ndarray] = Cache("solve.prices.lengths", key="number of layers L", bound=16)


def lengths(L: int) -> np.ndarray:
    """``j - i`` at ``[i, j]`` for a chain of ``L`` layers (read-only, cached)."""
    found = _LENGTHS.get(L)
    if found is None:
        idx = np.arange(L + 1)
        found = _LENGTHS.put(L, _read_only(idx[None, :] - idx[:, None]))
    return found
