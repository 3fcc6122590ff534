"""Exact chain DP over cut points for one configuration (P stages, D replicas, micro-batch b,
schedule), with per-stage recomputation.

The objective (the 1F1B/GPipe pipeline time of Alpa's stage construction, Zheng et al. 2022,
eq. 3, with the boundary transfers on the fill/drain path):

    J = sum_s (T_s + c_s + X_s) + (M - 1) max_s T_s,   T_s = F_s + B_s + RC_s,

where ``c_s`` is the forward + backward transfer across the boundary after stage ``s``,
``X_s = max(0, AR_s - B_<s)`` the part of stage ``s``'s gradient all-reduce that the pipeline
cannot hide (it starts after the stage's last backward, while the last micro-batch's
backward still crosses the layers before the stage: the seed's gradient hiding), and
``RC_s`` the least recompute time that makes stage ``s`` fit its memory cap with ``k_s``
micro-batches in flight (``k_s = M`` for GPipe, ``min(P - s, M)`` for 1F1B): stages are
known by index, so ``k_s`` is known when the stage is priced, which is why the table is
filled from the last stage backwards. Under ZeRO 3 ``F_s`` and ``B_s`` are the times with the
per-layer all-gathers and reduce-scatters the stack does not hide (``F'``, ``B'`` of
:mod:`planner.cost.fsdp`: prefix sums plus terms at a stage's first and last layer), its memory
the sharded state plus the gathered working set, and ``X_s = 0``.

The DP table, for a bottleneck cap ``t``::

    f[P][L] = 0
    f[s][i] = min_{j > i, T_{k_s}(i, j) <= t} T_{k_s}(i, j) + c_s(j) + f[s + 1][j]

and ``J = min_t f[0][0] + (M - 1) t`` over candidate caps ``t`` (the distinct stage times),
enumerated downwards from the largest that can still win (:func:`_minimize`: above it, the
least possible sum plus ``(M - 1) t`` exceeds the objective at the least feasible cap) and
stopped once ``(M - 1) t`` plus the sum found exceeds the best found. For the optimal partition
its own max stage time is a candidate cap, so the minimum is exact. Each DP step is one
vectorised min over the band of an ``(L + 1) x (L + 1)`` matrix that a stage of index ``s`` can
start and stop in (every stage holds a layer).

Recompute prices: where a layer has a selective level, the least recompute time of every stage
a table call must price is worked out at once (:func:`planner.solve.recompute.level_covers`,
the excess-free part, shared by every table with the same layers;
:meth:`planner.solve.recompute.CoverRows.costs`, the excess-dependent part, vectorised over
the stages, each cover kept as a row of arrays); the layers of a stage are chosen
(:func:`choose_recompute`, the same least time bit for bit) only when a plan asks for them.
Without selective levels, or with shared saves, a stage at a time as before.

ZB-H1 (zero bubble, Qi et al., ICLR 2024, sec. 3.1): its bubble is ``(P - 1)(T_F + T_B - T_W)``
where 1F1B's is ``(P - 1)(T_F + T_B + T_W)`` (B the input-gradient pass, W the weight-gradient
pass): each stage's W fills ``2 W_s`` of the fill and drain. So its objective is

    J_zb = sum_s (T_s - Z_s + c_s + X_s) + (M - 1) max_s T_s,   Z_s = min(2 W_s, F_s + B_s + W_s),

with ``W_s`` the stage's weight-gradient time (:meth:`CostModel.stage_wgrad_ms`); every term
stays per stage, so the same table solves it exactly, and ``T_s - Z_s >= RC_s >= 0`` keeps the
bound ``J >= (M - 1) max_s T_s`` that limits the useful stage times. ``k_s`` is the schedule's
count (:func:`planner.schedule.inflight_counts`, every micro-batch until its W).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.artifacts.cluster import Cluster
from planner.artifacts.kinds import ScheduleKind, ZeroStage
from planner.artifacts.layout import Layout, Sharding
from planner.cost import CostModel, grad_group_line, link_of, p2p_ms
from planner.cost.fsdp import is_fsdp, working_set_matrix
from planner.schedule import inflight_counts
from planner.solve.arrays import distinct
from planner.solve.recompute import (
    INF,
    CoverRows,
    Option,
    RecomputeChoice,
    choose_recompute,
    layer_options,
    level_covers,
)


@dataclass(frozen=True, slots=True)
class ChainSolution:
    objective_ms: float
    boundaries: tuple[int, ...]  # stage starts, first is 0
    recompute: tuple[tuple[int, ...], ...]  # per stage, the fully recomputed layers
    stage_times_ms: tuple[float, ...]
    exact: bool
    selective: tuple[tuple[int, ...], ...] = ()  # per stage, the selectively recomputed layers (() = none anywhere)

    def selective_of(self, stage_idx: int) -> tuple[int, ...]:
        """The selectively recomputed layers of stage ``stage_idx``."""
        return self.selective[stage_idx] if self.selective else ()


class _Layers:
    """What a stage's recompute choice depends on besides the in-flight count and the excess:
    its layers' times and bytes. Shared by every :class:`StageTable` with the same layer arrays
    (caps, shardings and schedules differ only in the excess), so a stage's
    :class:`LevelCover` rows per in-flight count are worked out once for all of them."""

    def __init__(self, fwd: np.ndarray, saved: np.ndarray, inputs: np.ndarray, core: np.ndarray,
                 core_ms: np.ndarray):
        self.arrays = (fwd, saved, inputs, core, core_ms)
        L = len(fwd)
        kinds: dict[tuple[float, ...], int] = {}
        self.kind = [kinds.setdefault((float(f), float(a), float(b), float(c), float(cm_)), len(kinds))
                     for f, a, b, c, cm_ in zip(fwd, saved, inputs, core, core_ms)]
        self.run = [1] * L  # identical layers from i on (i included)
        for i in range(L - 2, -1, -1):
            if self.kind[i] == self.kind[i + 1]:
                self.run[i] = self.run[i + 1] + 1
        # maximal runs of identical layers: each layer's run, and each run's first and last + 1
        new = np.concatenate([[True], np.diff(np.array(self.kind, dtype=np.int64)) != 0]) if L else np.zeros(0, bool)
        self.run_of = np.cumsum(new) - 1
        self.run_start = np.flatnonzero(new)
        self.run_stop = np.append(self.run_start[1:], L)
        self.kind_arr = np.array(self.kind, dtype=np.int64)
        # few kinds (a transformer's blocks, its embedding and head, a grouped chain's merged
        # blocks): stages are known by what they hold, each kind's layers and the order in which
        # the kinds first appear, so stages anywhere in the chain with the same layers share rows
        self.by_content = len(kinds) <= CONTENT_KINDS
        if self.by_content:
            ids = np.arange(len(kinds))
            self.kind_prefix = np.concatenate([np.zeros((len(kinds), 1), dtype=np.int64),
                                               np.cumsum(self.kind_arr[None, :] == ids[:, None], axis=1)], axis=1)
            # per kind and layer i, the first layer of that kind at or after i (L: none)
            self.next_of = np.full((len(kinds), L + 1), L, dtype=np.int64)
            for k in ids:
                at = np.flatnonzero(self.kind_arr == k)
                pos = np.searchsorted(at, np.arange(L + 1))
                self.next_of[k] = np.where(pos < len(at), at[np.minimum(pos, len(at) - 1)], L)
        self._options: dict[tuple[int, int], tuple[Option, ...]] = {}
        self.rows = CoverRows()  # every cover worked out, one row each
        self._row_spans: dict[tuple[tuple[int, ...], int], tuple[int, int] | None] = {}

    def sequence_keys(self, I: np.ndarray, J: np.ndarray) -> np.ndarray:
        """Per stage ``[I, J)`` a row of integers equal only for stages whose covers
        (:func:`level_covers`) are the same. With :attr:`by_content`: each kind's count of layers,
        then each kind's place in the order of first appearance (-1: absent), which is all a
        cover reads (its groups are the layers of each kind of options, in order of first
        appearance). Else: inside one run (kind, length, -1, -1), otherwise (first run, layers
        taken from it, last run, layers taken from it), the runs between whole."""
        if self.by_content:
            counts = (self.kind_prefix[:, J] - self.kind_prefix[:, I]).T
            first = self.next_of[:, I].T
            present = first < J[:, None]
            # a present kind's place: the present kinds appearing before it (each layer is of one
            # kind, so two kinds never first appear at the same layer)
            key = np.where(present, first, len(self.kind) + 1)
            rank = (key[:, None, :] < key[:, :, None]).sum(axis=2)
            return np.concatenate([counts, np.where(present, rank, -1)], axis=1).astype(np.int64)
        a, b = self.run_of[I], self.run_of[J - 1]
        same = a == b
        return np.column_stack([
            np.where(same, self.kind_arr[I], a),
            np.where(same, J - I, self.run_stop[a] - I),
            np.where(same, -1, b),
            np.where(same, -1, J - self.run_start[b]),
        ]).astype(np.int64)

    def cover_rows(self, seq: tuple[int, ...], inflight: int) -> tuple[int, int] | None:
        """The rows of :attr:`rows` (first, count) holding :func:`level_covers` of the stage known
        by ``seq`` (:meth:`sequence_keys`), None where the cover is not exact."""
        key = (seq, inflight)
        if key not in self._row_spans:
            runs: list[tuple[tuple[Option, ...], int]]
            if self.by_content:
                n = len(seq) // 2
                present = sorted((seq[n + kind], kind) for kind in range(n) if seq[n + kind] >= 0)
                runs = [(self.options(kind, inflight), seq[kind]) for _, kind in present]
            elif seq[2] < 0:
                runs = [(self.options(seq[0], inflight), seq[1])]
            else:
                a, b = seq[0], seq[2]
                counts = [seq[1], *(int(self.run_stop[r] - self.run_start[r]) for r in range(a + 1, b)), seq[3]]
                runs = [(self.options(self.kind[int(self.run_start[r])], inflight), n)
                        for r, n in zip(range(a, b + 1), counts)]
            covers = level_covers(runs)
            self._row_spans[key] = None if covers is None else (self.rows.add(covers), len(covers))
        return self._row_spans[key]

    def options(self, kind: int, inflight: int) -> tuple[Option, ...]:
        """:func:`layer_options` of a layer of ``kind``."""
        key = (kind, inflight)
        found = self._options.get(key)
        if found is None:
            i = self.kind.index(kind)
            fwd, saved, inputs, core, core_ms = self.arrays
            found = self._options[key] = layer_options(float(fwd[i]), float(saved[i]), float(inputs[i]),
                                                       float(core_ms[i]), float(core[i]), inflight)
        return found


#: :meth:`StageTable.least_bytes` is worked out over at most this many distinct working sets
LEAST_BYTES_WORKSPACES = 32

#: profiles with at most this many kinds of layer key a stage's recompute covers by what it holds
#: (:attr:`_Layers.by_content`), else by its runs
CONTENT_KINDS = 16

#: :class:`_Layers` by the bytes of their arrays (a search builds tables for few micro-batch sizes)
_LAYERS: dict[bytes, _Layers] = {}
_LAYERS_KEPT = 64


def _layers_of(fwd: np.ndarray, saved: np.ndarray, inputs: np.ndarray, core: np.ndarray,
               core_ms: np.ndarray) -> _Layers:
    key = b"".join(np.ascontiguousarray(a, dtype=float).tobytes() for a in (fwd, saved, inputs, core, core_ms))
    found = _LAYERS.get(key)
    if found is None:
        if len(_LAYERS) >= _LAYERS_KEPT:
            _LAYERS.clear()
        found = _LAYERS[key] = _Layers(fwd, saved, inputs, core, core_ms)
    return found


#: per L, the layers of each stage (i, j): j - i (an (L + 1) x (L + 1) matrix, read-only)
_LENGTHS: dict[int, np.ndarray] = {}


def _lengths(L: int) -> np.ndarray:
    found = _LENGTHS.get(L)
    if found is None:
        idx = np.arange(L + 1)
        found = _LENGTHS[L] = idx[None, :] - idx[:, None]
        found.flags.writeable = False
    return found


@dataclass(frozen=True, slots=True)
class _Fixed:
    """What a :class:`StageTable` holds that its cap does not change (read-only arrays, and the
    recompute choices worked out so far, which depend on a stage's layers, in-flight count and
    excess only): shared by every table of one cost model, micro-batch size, sharding, ZeRO 3
    line and fixed boundaries (a search's tighter caps, the layouts a refusal measures); what
    the sharding and line do not change, and the choices, by every one of the same micro-batch
    size and fixed boundaries (:func:`_build_fixed`)."""

    fwd: np.ndarray
    valid: np.ndarray
    fsdp: bool
    compute: np.ndarray
    kappa: float
    sync_bytes_per_param: float
    static: np.ndarray
    sync_bytes: np.ndarray
    bwd_prefix: np.ndarray
    act: np.ndarray
    shared: bool
    saved: np.ndarray
    inputs: np.ndarray
    core: np.ndarray
    core_ms: np.ndarray
    choices: dict[tuple[object, ...], RecomputeChoice]
    layers: _Layers
    levels: np.ndarray | None  # pairs whose choice is the selective cover, priced for many pairs at once
    gain: np.ndarray  # the most bytes recomputation can free from each stage per micro-batch in flight


#: per cost model, its tables' fixed parts by (micro-batch size, sharding, ZeRO 3 line, fixed boundaries)
_FIXED: weakref.WeakKeyDictionary[CostModel, dict[tuple[object, ...], _Fixed]] = weakref.WeakKeyDictionary()


def _fixed_part(cm: CostModel, b: int, sharding: Sharding, fsdp_line: tuple[float, float],
                fixed_boundaries: tuple[int, ...]) -> _Fixed:
    by_key = _FIXED.setdefault(cm, {})
    key = (b, sharding, fsdp_line, fixed_boundaries)
    found = by_key.get(key)
    if found is None:
        found = by_key[key] = _build_fixed(cm, b, sharding, fsdp_line, fixed_boundaries)
    return found


#: per cost model, the parts of its fixed parts that several of them share (by what each reads)
_SHARED_PARTS: weakref.WeakKeyDictionary[CostModel, dict[tuple[object, ...], Any]] = weakref.WeakKeyDictionary()


def _build_fixed(cm: CostModel, microbatch_size: int, sharding: Sharding, fsdp_line: tuple[float, float],
                 fixed_boundaries: tuple[int, ...]) -> _Fixed:
    """A fixed part: what only the sharding and ZeRO 3 line change (the static bytes, the
    synchronised bytes, ZeRO 3's compute) worked out for it, the rest (each a matrix of the
    (L + 1)^2 stages, or the layers') shared with every fixed part of the same micro-batch size
    and fixed boundaries (GPT-3 175B on 1,024 GPUs: 120 fixed parts, 25
    shared parts)."""
    shared_parts = _SHARED_PARTS.setdefault(cm, {})
    key = ("batch", microbatch_size, fixed_boundaries)
    batch = shared_parts.get(key)
    if batch is None:
        batch = shared_parts[key] = _batch_part(cm, microbatch_size, fixed_boundaries)
    L = cm.num_layers
    idx = np.arange(L + 1)
    params = shared_parts.get(("params",))
    if params is None:
        params = (cm._param_prefix[None, :] - cm._param_prefix[:, None]).astype(float)
        for tie in cm.profile.tied:
            inside = np.zeros((L + 1, L + 1))
            for layer in tie.layers:
                inside += (idx[:, None] <= layer) & (idx[None, :] > layer)
            params -= np.maximum(inside - 1, 0) * tie.param_count
        params.flags.writeable = False
        shared_parts[("params",)] = params
    fsdp = is_fsdp(sharding)
    compute = batch["compute"]
    if fsdp:  # F' + B': ZeRO 3's gathers and reduce-scatters as the stack overlaps them
        compute = np.where(batch["valid"], cm.fsdp_terms(microbatch_size, fsdp_line).matrix(), INF)
    kappa = sum(cm.state_bytes_per_param(sharding))
    sync_per_param = cm.post_backward_sync_bytes_per_param(sharding.zero)
    sync_bytes = shared_parts.get(("sync", sync_per_param))
    if sync_bytes is None:
        sync_bytes = shared_parts[("sync", sync_per_param)] = params * sync_per_param
    cut = cm.cut_bytes_per_sample
    static = params * kappa + (2.0 * (cut[:, None] + cut[None, :]) + cm.gather_bytes_per_sample) * microbatch_size
    if fsdp:  # the gathered weights and gradients of the layers in flight
        static = static + working_set_matrix(
            cm.param_count, cm.weight_bytes_per_param + cm.grad_bytes_per_param, cm.stack.fsdp_prefetch)
    arrays = _read_only(dict(compute=compute, static=static, sync_bytes=sync_bytes))
    return _Fixed(fsdp=fsdp, kappa=kappa, sync_bytes_per_param=sync_per_param, **arrays,
                  **{k: v for k, v in batch.items() if k != "compute"})


def _batch_part(cm: CostModel, microbatch_size: int, fixed_boundaries: tuple[int, ...]) -> dict[str, Any]:
    """The fields of a :class:`_Fixed` that depend on the micro-batch size and fixed boundaries
    only (``compute`` outside ZeRO 3), and the recompute choices they share (a stage's choice
    reads its layers, in-flight count and excess only)."""
    L = cm.num_layers
    fwd, bwd = cm.layer_times(microbatch_size)
    fp = np.concatenate([[0.0], np.cumsum(fwd)])
    bp = np.concatenate([[0.0], np.cumsum(bwd)])
    idx = np.arange(L + 1)
    valid = idx[None, :] > idx[:, None]
    for f in fixed_boundaries:
        valid &= ~((idx[:, None] < f) & (idx[None, :] > f))
    compute = np.where(valid, (fp[None, :] - fp[:, None]) + (bp[None, :] - bp[:, None]), INF)
    sp, fxp = cm._saved_prefix, cm._fixed_prefix
    act = (sp[None, :] - sp[:, None]) * microbatch_size + (fxp[None, :] - fxp[:, None])
    shared = bool(cm.profile.shared_saved)
    if shared:  # storages two layers of a stage both save: once
        act = act - cm.shared_matrix(microbatch_size)
    arrays = dict(fwd=fwd, valid=valid, compute=compute, bwd_prefix=bp, act=act, saved=cm.saved_bytes(microbatch_size),
                  inputs=cm.input_per_sample * microbatch_size, core=cm.core_bytes(microbatch_size),
                  core_ms=cm.core_ms(microbatch_size))
    arrays = _read_only(arrays)
    has_core = np.concatenate([[0], np.cumsum(arrays["core"] > 0)])
    levels = (has_core[None, :] - has_core[:, None] > 0) if cm.selective and not shared else None
    layers = _layers_of(arrays["fwd"], arrays["saved"], arrays["inputs"], arrays["core"], arrays["core_ms"])
    gains = np.maximum(np.maximum(arrays["saved"] - arrays["inputs"], 0.0), arrays["core"] if cm.selective else 0.0)
    gp = np.concatenate([[0.0], np.cumsum(gains)])
    return dict(arrays, shared=shared, choices={}, layers=layers, levels=levels, gain=gp[None, :] - gp[:, None])


def _read_only(arrays: dict[str, Any]) -> dict[str, Any]:
    """``arrays`` as NumPy arrays, those owning their data made read-only (views into the cost
    model's own cached arrays are its to guard)."""
    out = {name: np.asarray(array) for name, array in arrays.items()}
    for array in out.values():
        if array.flags.owndata:
            array.flags.writeable = False
    return out


#: the most micro-batches in flight a cap view counts (a stage that fits this many fits any count asked)
MOST_INFLIGHT = float(2**40)
#: tables of fewer layers work each count out alone: their matrices are small enough that numpy's
#: fixed cost per operation, not their size, is what a view would save on (default-memory, 42
#: layers: 4% slower with views)
VIEW_MIN_LAYERS = 64


@dataclass(frozen=True, slots=True)
class _CapView:
    """What one memory cap lets each stage ``(i, j)`` hold, as in-flight counts, so that a count's
    tables are a comparison each (:meth:`StageTable.base`, :meth:`StageTable.could_fit`):
    ``plain``, the most micro-batches it holds without recomputation (``static + k act - cap <= 0``
    exactly as :meth:`StageTable.base` evaluates it: that is monotone in ``k``, ``act >= 0``; -1
    where none or not a stage); ``leanest``, a count above which it cannot fit even with every
    layer at its leanest level (``k (act - gain) <= cap - static``, with 1e-9 of the cap to spare
    for rounding: :meth:`StageTable.could_fit` may only err towards "might fit"; -inf where not a
    stage); and per number of layers the largest of each over the stages that long."""

    plain: np.ndarray
    leanest: np.ndarray
    plain_by_length: np.ndarray
    leanest_by_length: np.ndarray


def _excess_bytes(static: np.ndarray, act: np.ndarray, inflight: np.ndarray | int, cap: float) -> np.ndarray:
    """A stage's bytes without recomputation over ``cap`` with ``inflight`` micro-batches, element
    by element: the one expression every fit test and recompute price reads (the same floats
    whichever stages it is worked out for)."""
    out: np.ndarray = static + inflight * act - cap
    return out


def _cap_view(static: np.ndarray, act: np.ndarray, gain: np.ndarray, valid: np.ndarray, cap: float) -> _CapView:
    def fits(k: np.ndarray, at: tuple[np.ndarray, ...] | slice = slice(None)) -> np.ndarray:
        out: np.ndarray = _excess_bytes(static[at], act[at], k, cap) <= 0
        return out

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        guess = np.where(act > 0, np.floor((cap - static) / act), np.where(static - cap <= 0, MOST_INFLIGHT, -1.0))
        k = np.clip(guess, -1.0, MOST_INFLIGHT)
        # the guess is off by the division's rounding where k + 1 fits or k does not (the test is
        # monotone in k, act >= 0): settle those few on the exact test, a step at a time, then
        # bisect any still off (k act below the rounding of static: tiny act)
        wrong = np.nonzero(((k < MOST_INFLIGHT) & fits(k + 1)) | ((k >= 0) & ~fits(k)))
        if len(wrong[0]):
            kw = k[wrong]
            for _ in range(2):
                up = (kw < MOST_INFLIGHT) & fits(kw + 1, wrong)
                kw = np.where(up, kw + 1, np.where((kw >= 0) & ~fits(kw, wrong), kw - 1, kw))
            k[wrong] = kw
            off = ((kw < MOST_INFLIGHT) & fits(kw + 1, wrong)) | ((kw >= 0) & ~fits(kw, wrong))
            wrong = (wrong[0][off], wrong[1][off])
        if len(wrong[0]):
            lo, hi = np.full(len(wrong[0]), -1.0), np.full(len(wrong[0]), MOST_INFLIGHT + 1)
            while np.any(hi - lo > 1):
                mid = np.floor((lo + hi) / 2)
                ok = fits(mid, wrong)
                lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
            k[wrong] = lo
        spare = cap - static + 1e-9 * abs(cap)
        tight = act - gain
        leanest = np.where(tight > 0, spare / tight, np.where(spare >= 0, np.inf, -np.inf))
    plain = np.where(valid, k, -1.0)
    leanest = np.where(valid, leanest, -np.inf)
    L = len(static) - 1
    return _CapView(plain, leanest, _by_length(plain, L), _by_length(leanest, L))


def _by_length(m: np.ndarray, L: int) -> np.ndarray:
    """Per number of layers ``l`` (0 to ``L``), the largest ``m[i, i + l]`` (-inf for 0)."""
    order, starts = _diagonals(L)
    out = np.full(L + 1, -np.inf)
    out[1:] = np.maximum.reduceat(m.reshape(-1)[order], starts)
    return out


#: per L, the flat indices of an (L + 1) x (L + 1) matrix's entries above its diagonal, by
#: number of layers (j - i) and then by i, and where each number of layers starts among them
_DIAGONALS: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _diagonals(L: int) -> tuple[np.ndarray, np.ndarray]:
    found = _DIAGONALS.get(L)
    if found is None:
        lengths = np.repeat(np.arange(1, L + 1), np.arange(L, 0, -1))
        first = np.concatenate([np.arange(L + 1 - n) for n in range(1, L + 1)])  # i of each entry
        order = first * (L + 1) + first + lengths
        starts = np.concatenate([[0], np.cumsum(np.arange(L, 1, -1))])
        found = _DIAGONALS[L] = (order, starts)
    return found


class _Entries:
    """A :class:`StageTable`'s entries per ``(inflight, cap)`` (shared by its copies for a
    rebalancing): bases, tables, the stages priced and pending, recompute choices, fit masks and
    longest stages (these two per ``(inflight, cap, recompute)``), and its own cap's view at
    ``(-1, cap)``."""

    __slots__ = ("bases", "choices", "could", "lazy", "longest", "pending", "tables", "views")

    def __init__(self) -> None:
        self.bases: dict[tuple[int, float], np.ndarray] = {}
        self.tables: dict[tuple[int, float], np.ndarray] = {}
        # the stages that need recomputation to fit, and those of them priced so far
        self.pending: dict[tuple[int, float], tuple[np.ndarray, np.ndarray]] = {}
        self.lazy: dict[tuple[int, float], np.ndarray] = {}  # pairs priced there, their layers not yet chosen
        self.choices: dict[tuple[int, float], dict[tuple[int, int], tuple[int, RecomputeChoice]]] = {}
        self.could: dict[tuple[int, float, bool], np.ndarray] = {}
        self.longest: dict[tuple[int, float, bool], int] = {}
        self.views: dict[tuple[int, float], _CapView] = {}  # at (-1, cap)

    def forget(self, at: tuple[int, float]) -> None:
        """Drop everything worked out for ``at`` (asked again, it is worked out again, the same)."""
        for store in (self.bases, self.tables, self.pending, self.lazy, self.choices, self.views):
            store.pop(at, None)
        for recompute in (False, True):
            self.could.pop((*at, recompute), None)
            self.longest.pop((*at, recompute), None)


class RecentEntries:
    """The entries per ``(inflight, cap)`` of several :class:`StageTable` (bases, tables, fit
    masks, recompute choices, cap views: a few matrices each), least recently used first, of which
    at most ``keep`` are kept: a search asks each count and cap a few times, close together (GPT-3
    175B on 1,024 GPUs: 7 of 1,504 tables at a table's own cap asked again, 172 of 673 at a chunk's
    share, each within the last 32 asked; 2 of 271 views worked out again), while keeping every one
    held 420 MB of the search's 460 MB peak (resident; 184 MB with 32 kept, and 0.1 to 0.2 s less of
    the kernel's page faults). Forgotten entries are worked out again when asked, the same.
    Forgetting happens only between solves (:meth:`StageTable.settle`, at the start of
    :func:`solve_chain`), since a solve reads its entries until it returns."""

    def __init__(self, keep: int = 32) -> None:
        self.keep = keep
        self._order: dict[tuple[int, tuple[int, float]], _Entries] = {}  # by (entries, at), oldest first

    def touch(self, entries: _Entries, at: tuple[int, float]) -> None:
        key = (id(entries), at)
        self._order.pop(key, None)
        self._order[key] = entries

    def trim(self) -> None:
        while len(self._order) > self.keep:
            key = next(iter(self._order))
            self._order.pop(key).forget(key[1])


class StageTable:
    """Stage times ``T_k(i, j)`` (inf where the stage cannot fit) for one micro-batch size,
    memory cap and division of the model state (``sharding``), per in-flight count ``k``;
    shared across P and schedules."""

    def __init__(
        self,
        cm: CostModel,
        microbatch_size: int,
        cap_bytes: float,
        fixed_boundaries: Sequence[int] = (),
        allow_recompute: bool = True,
        *,
        sharding: Sharding = Sharding(),
        fsdp_line: tuple[float, float] = (0.0, 0.0),
        stage_caps: Sequence[float] = (),
        recent: RecentEntries | None = None,
    ):
        """``fsdp_line``: under ZeRO 3 (``sharding``), the layout's per-layer all-gather /
        reduce-scatter line (:meth:`CostModel.fsdp_line`), whose exposed time is in ``T``.
        ``recent``: where the table's entries per in-flight count and cap are counted with
        other tables' (those least recently used forgotten between solves), else all kept."""
        self.cm = cm
        self.allow_recompute = allow_recompute
        self.sharding = sharding
        self.b = microbatch_size
        self.cap = cap_bytes
        self.stage_caps = tuple(stage_caps)  # per stage (chunks of a rank share its memory), else cap each
        self.L = cm.num_layers
        fixed = _fixed_part(cm, microbatch_size, sharding, fsdp_line, tuple(fixed_boundaries))
        self.fwd, self.valid, self.fsdp, self.compute = fixed.fwd, fixed.valid, fixed.fsdp, fixed.compute
        self.kappa, self.sync_bytes_per_param, self.static = fixed.kappa, fixed.sync_bytes_per_param, fixed.static
        self.sync_bytes, self.bwd_prefix, self.act, self.shared = fixed.sync_bytes, fixed.bwd_prefix, fixed.act, fixed.shared
        self.saved, self.inputs, self.selective = fixed.saved, fixed.inputs, cm.selective
        self.core, self.core_ms, self.gain = fixed.core, fixed.core_ms, fixed.gain
        self._cache = fixed.choices  # a stage's recompute choice by its layers, in-flight count and excess
        entries = self._entries = _Entries()  # per (inflight, cap)
        self._bases, self._tables, self._pending, self._lazy = entries.bases, entries.tables, entries.pending, entries.lazy
        self._choices, self._could, self._longest = entries.choices, entries.could, entries.longest
        self._everywhere: dict[int, bool] = {}  # per in-flight count, fits_everywhere
        self._recent = recent
        self.all_exact = True
        self._layers = fixed.layers
        self._kind = self._layers.kind
        self._run = self._layers.run
        self._levels = fixed.levels

    def hidden_backward(self) -> np.ndarray:
        """The backward work a stage ``(i, j)``'s synchronisation can overlap in the objective's
        proxy ``X_s``: the layers' before it (``B_<i``), and with the stack's overlapped
        gradient reduction also its own (``B_<j``); broadcastable to ``(L + 1) x (L + 1)``."""
        overlap = self.cm.stack.reduce_overlap(self.sharding.zero is not ZeroStage.NONE)
        return self.bwd_prefix[None, :] if overlap else self.bwd_prefix[:, None]

    def fits_everywhere(self, inflight: int) -> bool:
        """Every stage fits with ``inflight`` micro-batches and no recomputation: memory does
        not constrain any partition (so sharding more could not make one faster)."""
        found = self._everywhere.get(inflight)
        if found is None:
            found = self._everywhere[inflight] = bool(np.all(~self.valid | (self.static + inflight * self.act <= self.cap)))
        return found

    def cap_of(self, stage_idx: int) -> float:
        """The memory stage ``stage_idx`` may use: its share (``stage_caps``), else the cap."""
        return self.stage_caps[stage_idx] if self.stage_caps else self.cap

    def base(self, inflight: int, cap: float | None = None) -> np.ndarray:
        """``T_k`` without recomputation: compute time where the stage fits as it is (in ``cap``,
        default the table's), else inf."""
        key = (inflight, self.cap if cap is None else cap)
        found = self._bases.get(key)
        if found is None:
            found = self._bases[key] = np.where(self.could_fit(*key, recompute=False), self.compute, INF)
        elif self._recent is not None:
            self._recent.touch(self._entries, key)
        return found

    def settle(self) -> None:
        """Forget the entries least recently used beyond what ``recent`` keeps (between solves:
        a solve reads its entries until it returns)."""
        if self._recent is not None:
            self._recent.trim()

    def _view(self, cap: float) -> _CapView | None:
        """:class:`_CapView` of ``cap`` if it is the table's own (an entry at ``(-1, cap)``): the cap its
        configurations ask at many in-flight counts (interleaved ones, one per chunk); None for
        another (a chunk's share of a rank's memory), asked at few, each worked out alone, and
        on chains of fewer than :data:`VIEW_MIN_LAYERS` layers."""
        if cap != self.cap or self.L < VIEW_MIN_LAYERS:
            return None
        views = self._entries.views
        found = views.get((-1, cap))
        if found is None:
            found = views[(-1, cap)] = _cap_view(self.static, self.act, self.gain, self.valid, cap)
        if self._recent is not None:
            self._recent.touch(self._entries, (-1, cap))
        return found

    def excess_at(self, at: tuple[int, float], i: np.ndarray | int, j: np.ndarray | int) -> np.ndarray:
        """The bytes of stages ``(i, j)`` without recomputation over the cap with the in-flight
        count of ``at = (inflight, cap)`` (what recomputation must free)."""
        return _excess_bytes(self.static[i, j], self.act[i, j], at[0], at[1])

    def could_fit(self, inflight: int, cap: float | None = None, recompute: bool = True) -> np.ndarray:
        """Stages that might fit ``cap`` (default the table's) with ``inflight`` micro-batches: as
        they are, or (with ``recompute``, where the table allows it) with every layer at its
        leanest level. Every finite entry of :meth:`table` is one of these; without
        ``recompute`` they are exactly the finite entries of :meth:`base`."""
        recompute = recompute and self.allow_recompute
        key = (inflight, self.cap if cap is None else cap, recompute)
        if self._recent is not None:
            self._recent.touch(self._entries, key[:2])
        found = self._could.get(key)
        if found is None:
            view = self._view(key[1])
            if view is not None:
                found = (view.leanest if recompute else view.plain) >= inflight
            else:
                excess = _excess_bytes(self.static, self.act, inflight, key[1])
                found = self.valid & ((inflight * self.gain >= excess) if recompute else (excess <= 0))
            self._could[key] = found
        return found

    def might_fit_all(self, ats: Sequence[tuple[int, float]], starts: Sequence[int], recompute: bool = True) -> bool:
        """Stage ``s``, layers ``starts[s]`` to ``starts[s + 1]``, :meth:`could_fit` ``ats[s] =
        (inflight, cap)``, for every ``s``: read from the table's own cap's view where there is one
        (without a matrix per in-flight count), else from :meth:`could_fit`."""
        view = self._view(self.cap)
        own = [s for s, at in enumerate(ats) if at[1] == self.cap] if view is not None else []
        if view is not None and own:
            test = view.leanest if recompute and self.allow_recompute else view.plain
            ks = np.array([ats[s][0] for s in own])
            if not np.all(test[[starts[s] for s in own], [starts[s + 1] for s in own]] >= ks):
                return False
        done = set(own)
        return all(bool(self.could_fit(*ats[s], recompute)[starts[s], starts[s + 1]])
                   for s in range(len(ats)) if s not in done)

    def least_bytes(self, inflight: int) -> np.ndarray | None:
        """Per stage the fewest bytes it needs with ``inflight`` micro-batches, at its leanest
        recomputation where the table allows it (inf where not a stage): at a cap of at least this
        the stage fits (:func:`choose_recompute` covers ``excess + W`` by the options whose working
        set is at most ``W``, for some ``W``: it can iff every such option together frees that
        much). None where this is not worked out (saved storages shared between layers, or more
        than :data:`LEAST_BYTES_WORKSPACES` distinct working sets)."""
        need = self.static + inflight * self.act
        if self.allow_recompute:
            if self.shared:
                return None
            full = np.maximum(self.saved - self.inputs, 0.0)
            sel = self.core if self.selective else np.zeros_like(self.core)
            sizes = distinct(np.concatenate([self.saved[full > 0], self.core[sel > 0]]))
            if len(sizes) > LEAST_BYTES_WORKSPACES:
                return None
            freed = np.zeros_like(need)
            for w in sizes.tolist():  # every option with a working set of at most w, its larger gain per layer
                gain = np.maximum(np.where(self.saved <= w, full, 0.0), np.where(self.core <= w, sel, 0.0))
                prefix = np.concatenate([[0.0], np.cumsum(gain)])
                freed = np.maximum(freed, inflight * (prefix[None, :] - prefix[:, None]) - w)
            need = need - freed
        out: np.ndarray = np.where(self.valid, need, INF)
        return out

    def _needs(self, at: tuple[int, float]) -> np.ndarray:
        """Stages that do not fit ``at = (inflight, cap)`` as they are but might with
        recomputation (what :meth:`tables` prices; the table allows recomputation)."""
        out: np.ndarray = self.could_fit(*at) & ~self.could_fit(*at, recompute=False)
        return out

    def recomputes(self, bands: dict[tuple[int, float], np.ndarray]) -> bool:
        """Some stage of ``bands`` (per ``(inflight, cap)``, a mask as :meth:`tables` takes) fits
        only with recomputation, which the table allows (:meth:`tables` would price it)."""
        return self.allow_recompute and any(bool(np.any(band & self._needs(at))) for at, band in bands.items())

    def longest(self, inflight: int, cap: float | None = None, recompute: bool = True) -> int:
        """The most layers of any stage that :meth:`could_fit` (0 if none)."""
        recompute = recompute and self.allow_recompute
        key = (inflight, self.cap if cap is None else cap, recompute)
        view = self._view(key[1])
        if view is not None:
            lengths = np.flatnonzero((view.leanest_by_length if recompute else view.plain_by_length) >= inflight)
            return int(lengths[-1]) if len(lengths) else 0
        found = self._longest.get(key)
        if found is None:
            found = self._longest[key] = int(np.max(self.could_fit(*key) * _lengths(self.L)))
        return found

    def longest_within(self, limit: float) -> int:
        """The most layers of any stage whose compute time is at most ``limit`` (0 if none)."""
        return int(np.max((self.compute <= limit) * _lengths(self.L)))

    def table(self, inflight: int, limit: float = INF, cap: float | None = None) -> np.ndarray:
        """``T_k`` for ``k = inflight``: compute + least recompute, inf where it cannot fit.

        Recompute choices are only worked out for stages whose compute time is at most
        ``limit`` (others keep inf): callers pass a bound above which no stage can be part of
        an optimal plan. Later calls with a larger limit fill in more.
        """
        at = (inflight, self.cap if cap is None else cap)
        return self.tables([at], limit)[at]

    def tables(self, ats: Sequence[tuple[int, float]], limit: float = INF,
               bands: dict[tuple[int, float], np.ndarray] | None = None) -> dict[tuple[int, float], np.ndarray]:
        """:meth:`table` of each ``(inflight, cap)`` of ``ats`` at one ``limit``, the stages of all
        of them with selective levels priced together (:meth:`_price_levels`). ``bands``: per
        ``(inflight, cap)``, the stages a caller reads (a boolean ``(L + 1) x (L + 1)`` mask):
        only those are priced (the rest of the table is priced when a later call asks for it);
        None: every stage."""
        out: dict[tuple[int, float], np.ndarray] = {}
        batches = []
        for at in dict.fromkeys(ats):
            inflight = at[0]
            base = self.base(*at)
            if not self.allow_recompute:
                out[at] = base
                continue
            if at not in self._tables:
                need = self._needs(at)
                self._tables[at] = base.copy()
                self._pending[at] = (need, np.zeros_like(need))
            table = out[at] = self._tables[at]
            need, priced = self._pending[at]
            todo = need & ~priced & (self.compute <= limit)
            if bands is not None:
                todo &= bands[at]
            if not todo.any():
                continue
            priced |= todo
            if self._levels is not None:
                batch = todo & self._levels
                todo = todo & ~self._levels
                if batch.any():
                    batches.append((at, batch, table))
                if not todo.any():
                    continue
            for i, j in zip(*np.nonzero(todo)):
                i, j = int(i), int(j)
                shared = self.cm.shared_out(i, j, self.b) if self.shared else None
                choice = self._cached_choice(inflight, i, j, float(self.excess_at(at, i, j)), shared)
                if choice.time_ms < INF:
                    table[i, j] = self.compute[i, j] + choice.time_ms
                    self._choices.setdefault(at, {})[(i, j)] = (i, choice)  # layers relative to i
                    self.all_exact &= choice.exact
        if batches:
            self._price_levels(batches)
        return out

    def _cached_choice(self, inflight: int, i: int, j: int, excess: float,
                       shared: np.ndarray | None = None) -> RecomputeChoice:
        """:meth:`_choose`, shared by every stage with the same layers (times, bytes) and excess
        (its layers are relative to the stage's first)."""
        key: tuple[object, ...]
        if j - i <= self._run[i] and shared is None:
            key = (inflight, self._kind[i], j - i, excess)
        else:
            key = (inflight, self.fwd[i:j].tobytes(), self.saved[i:j].tobytes(), self.inputs[i:j].tobytes(),
                   self.core[i:j].tobytes(), self.core_ms[i:j].tobytes(), excess,
                   None if shared is None else shared.tobytes())
        choice = self._cache.get(key)
        if choice is None:
            choice = self._cache[key] = self._choose(inflight, i, j, excess, shared)
        return choice

    def _choose(self, inflight: int, i: int, j: int, excess: float, shared: np.ndarray | None = None) -> RecomputeChoice:
        """:func:`choose_recompute` for stage ``[i, j)`` (layers relative to ``i``)."""
        return choose_recompute(
            fwd_ms=self.fwd[i:j].tolist(),
            saved_bytes=self.saved[i:j].tolist(),
            input_bytes=self.inputs[i:j].tolist(),
            first_layer=0,
            inflight=inflight,
            excess_bytes=excess,
            core_ms=self.core_ms[i:j].tolist() if self.selective else None,
            core_bytes=self.core[i:j].tolist() if self.selective else None,
            shared_bytes=None if shared is None else shared.tolist(),
        )

    def _price_levels(self, batches: list[tuple[tuple[int, float], np.ndarray, np.ndarray]]) -> None:
        """Least recompute times of the stages of each ``(at, batch, table)`` (selective
        levels, no shared saves), all at once: stages with the same layers, in-flight count and
        excess share one problem, and the problems' excess-free parts (:func:`level_covers`)
        are shared by every table with these layers."""
        parts = [np.nonzero(batch) for _, batch, _ in batches]
        I = np.concatenate([i for i, _ in parts])
        J = np.concatenate([j for _, j in parts])
        sizes = [len(i) for i, _ in parts]
        ks = np.repeat([at[0] for at, _, _ in batches], sizes)
        ex = np.concatenate([self.excess_at(at, i, j) for (i, j), (at, _, _) in zip(parts, batches)])
        seqs = self._layers.sequence_keys(I, J)
        order = np.lexsort((ex, ks, *seqs.T[::-1]))
        s_seq, s_k, s_ex = seqs[order], ks[order], ex[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = np.any(s_seq[1:] != s_seq[:-1], axis=1) | (s_k[1:] != s_k[:-1]) | (s_ex[1:] != s_ex[:-1])
        starts = np.flatnonzero(first)
        problem = np.cumsum(first) - 1  # per sorted pair, its problem
        p_seq, p_k, p_ex, p_pair = s_seq[starts], s_k[starts], s_ex[starts], order[starts]
        # problems with the same layers and in-flight count (consecutive) share their cover rows
        new = np.ones(len(starts), dtype=bool)
        new[1:] = np.any(p_seq[1:] != p_seq[:-1], axis=1) | (p_k[1:] != p_k[:-1])
        heads = np.flatnonzero(new)
        per_head = np.diff(np.append(heads, len(starts)))
        spans = [self._layers.cover_rows(tuple(q), k) for q, k in zip(p_seq[heads].tolist(), p_k[heads].tolist())]
        exact = np.repeat([span is not None for span in spans], per_head)
        first_row = np.repeat([span[0] if span else 0 for span in spans], per_head)
        n_rows = np.repeat([span[1] if span else 0 for span in spans], per_head)
        costs = np.full(len(starts), INF)
        for u in np.flatnonzero(~exact).tolist():  # not exact there: the greedy, one stage at a time
            at_pair = int(p_pair[u])
            choice = self._choose(int(p_k[u]), int(I[at_pair]), int(J[at_pair]), float(p_ex[u]))
            self.all_exact &= choice.exact or not choice.time_ms < INF
            costs[u] = choice.time_ms
        owners = np.repeat(np.arange(len(starts)), n_rows)
        if len(owners):  # every problem's cover rows, priced at its excess plus each row's workspace
            rows = np.repeat(first_row, n_rows) + (np.arange(len(owners)) - np.repeat(np.cumsum(n_rows) - n_rows, n_rows))
            held = self._layers.rows
            np.minimum.at(costs, owners, held.costs(rows, p_ex[owners] + held.workspace_bytes(rows)))
        pair_costs = np.empty(len(order))
        pair_costs[order] = costs[problem]
        lo = 0
        for (at, batch, table), (i, j), n in zip(batches, parts, sizes):
            cost = pair_costs[lo:lo + n]
            lo += n
            ok = cost < INF
            table[i[ok], j[ok]] = self.compute[i[ok], j[ok]] + cost[ok]
            lazy = self._lazy.setdefault(at, np.zeros_like(batch))
            lazy[i[ok], j[ok]] = True

    def _entry(self, inflight: int, i: int, j: int, cap: float | None) -> tuple[int, RecomputeChoice] | None:
        """The recompute choice of stage ``[i, j)`` (layers relative to the first), None if
        it was not priced or cannot fit; a stage priced by :meth:`_price_levels` gets its layers
        here, from :func:`choose_recompute` (the same least time, bit for bit)."""
        at = (inflight, self.cap if cap is None else cap)
        chosen = self._choices.setdefault(at, {})
        entry = chosen.get((i, j))
        if entry is None and at in self._lazy and self._lazy[at][i, j]:
            choice = self._cached_choice(inflight, i, j, float(self.excess_at(at, i, j)))
            assert self.compute[i, j] + choice.time_ms == self._tables[at][i, j], "recompute choice differs from its price"
            entry = chosen[(i, j)] = (i, choice)
        return entry

    def choice_of(self, inflight: int, i: int, j: int, cap: float | None = None
                  ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The (fully, selectively) recomputed layers of stage ``[i, j)`` with ``inflight``
        micro-batches (its choice looked up once for both)."""
        entry = self._entry(inflight, i, j, cap)
        if entry is None:
            return (), ()
        first, choice = entry
        return tuple(first + l for l in choice.layers), tuple(first + l for l in choice.selective)

    def recompute_of(self, inflight: int, i: int, j: int, cap: float | None = None) -> tuple[int, ...]:
        """The fully recomputed layers of stage ``[i, j)`` with ``inflight`` micro-batches."""
        return self.choice_of(inflight, i, j, cap)[0]

    def selective_of(self, inflight: int, i: int, j: int, cap: float | None = None) -> tuple[int, ...]:
        """The selectively recomputed layers of stage ``[i, j)`` with ``inflight`` micro-batches."""
        return self.choice_of(inflight, i, j, cap)[1]


def exposed_allreduce_ms(cm: CostModel, start: int, stop: int, stage_idx: int, layout: Layout,
                         microbatch_size: int) -> float:
    """``X_s``: the part of the stage's gradient synchronisation that runs after its last
    backward (all-reduce, or ZeRO's reduce-scatter + all-gather, or only the reduce-scatter when
    the stack gathers ahead of the forward: a line in its bytes) less the backward work it can
    overlap: the layers' before it, and when the stack overlaps the reduction also the stage's
    own (the objective's proxy for what the pipeline cannot hide; the simulator prices
    the buckets)."""
    per_byte, fixed = grad_group_line(cm.cluster, layout, stage_idx)
    if (per_byte == 0.0 and fixed == 0.0) or layout.zero is ZeroStage.PARAMETERS:
        return 0.0  # ZeRO 3: its collectives are in the stage's times
    _, bp = cm.time_prefix(microbatch_size)
    sync = cm.stage_param_count(start, stop) * cm.post_backward_sync_bytes_per_param(layout.zero)
    hidden = float(bp[stop] if cm.stack.reduce_overlap(layout.zero is not ZeroStage.NONE) else bp[start])
    return max(0.0, per_byte * sync + fixed - hidden)


#: per layout (of one cluster object) its stages' gradient lines and boundary links: rank
#: arithmetic the search would otherwise redo for every table a layout is solved on
_LINKS: dict[Layout, tuple[Cluster, list[tuple[float, float]], list[tuple[float, float] | None]]] = {}
_LINKS_KEPT = 4096


def _links(cluster: Cluster, layout: Layout) -> tuple[list[tuple[float, float]], list[tuple[float, float] | None]]:
    """Per stage ``allreduce_line`` of its gradient group, and ``link_of`` to the next stage
    (None for the last stage and the turn of a V, where nothing crosses a link)."""
    found = _LINKS.get(layout)
    if found is None or found[0] is not cluster:
        lines = [grad_group_line(cluster, layout, s) for s in range(layout.num_stages)]
        links: list[tuple[float, float] | None] = []
        for s in range(layout.num_stages):
            src = layout.rank_of(stage_idx=s)
            dst = layout.rank_of(stage_idx=s + 1) if s + 1 < layout.num_stages else src
            links.append(None if src == dst else link_of(cluster, src, dst))
        if len(_LINKS) >= _LINKS_KEPT:
            _LINKS.clear()
        found = _LINKS[layout] = (cluster, lines, links)
    return found[1], found[2]


def _exposure_matrices(table: StageTable, layout: Layout) -> list[np.ndarray]:
    """``X_s(i, j)`` for every stage, vectorised (same formula as :func:`exposed_allreduce_ms`);
    stages with the same gradient line share one (read-only) matrix."""
    out = []
    hidden = table.hidden_backward()
    by_line: dict[tuple[float, float], np.ndarray] = {}
    for per_byte, fixed in _links(table.cm.cluster, layout)[0]:
        if (per_byte, fixed) not in by_line:
            if (per_byte == 0.0 and fixed == 0.0) or layout.zero is ZeroStage.PARAMETERS:
                m = np.zeros_like(table.sync_bytes)
            else:
                m = np.maximum(0.0, per_byte * table.sync_bytes + fixed - hidden)
            m.flags.writeable = False
            by_line[(per_byte, fixed)] = m
        out.append(by_line[(per_byte, fixed)])
    return out


def _comm_vectors(cm: CostModel, layout: Layout, b: int) -> list[np.ndarray]:
    """c_s(j): forward + backward transfer across the cut before layer j after stage s (zero
    after the last stage and at the turn of a V placement: both chunks on one rank); boundaries
    over the same link share one (read-only) vector."""
    cut = cm.cut_bytes_per_sample
    by_link: dict[tuple[float, float] | None, np.ndarray] = {}
    out = []
    for link in _links(cm.cluster, layout)[1]:
        if link not in by_link:
            if link is None:
                vec = np.zeros(cm.num_layers + 1)
            else:
                bw, lat = link
                vec = np.array([2.0 * p2p_ms(c * b, bandwidth_gb_per_s=bw, latency_us=lat) for c in cut])
            vec.flags.writeable = False
            by_link[link] = vec
        out.append(by_link[link])
    return out


def bubble_fill_ms(cm: CostModel, start: int, stop: int, microbatch_size: int) -> float:
    """``Z_s`` of ZB-H1's objective (module docstring) for the stage ``[start, stop)``."""
    compute = cm.stage_fwd_ms(start, stop, microbatch_size) + cm.stage_bwd_ms(start, stop, microbatch_size)
    return min(2.0 * cm.stage_wgrad_ms(start, stop, microbatch_size), compute)


def _bubble_fill_matrix(table: StageTable) -> np.ndarray:
    """``Z_s(i, j)`` for every stage (0 where the stage is not valid)."""
    _, bwd = table.cm.layer_times(table.b)
    wp = np.concatenate([[0.0], np.cumsum(bwd * table.cm.wgrad_fraction)])
    fill = np.minimum(2.0 * (wp[None, :] - wp[:, None]), np.where(table.valid, table.compute, 0.0))
    return np.where(table.valid, fill, 0.0)


class _Bands:
    """Every stage's table, and table plus ``extra`` (``c_s + X_s``), over the stages the DP can
    use, stacked ``P x width x K`` once for the DP passes of one set of tables (:meth:`dp` at
    each cap, :meth:`bottleneck`). Stage ``s`` of ``P`` starts at a layer in ``[s, L - P + s]``
    and stops in ``[s + 1, L - P + s + 1]`` (every stage holds a layer; ``width = L - P + 1``
    starts), and holds at most ``K`` layers (``longest``: the caller knows that no longer stage
    is finite at the caps asked); entry ``[s, a, l]`` is the stage starting at ``s + a`` with
    ``l + 1`` layers (inf where that stops beyond the stage's range)."""

    def __init__(self, tables: list[np.ndarray], extra: list[np.ndarray], L: int, longest: int | None = None):
        P = len(tables)
        w = L - P + 1
        K = w if longest is None else max(1, min(w, longest))
        self.P, self.L, self.width, self.K = P, L, w, K
        self.t = _skewed(tables, L, w, K)
        self.t[:, _beyond(w, K)] = INF
        self.te = self.t + _skewed(extra, L, w, K)  # inf where t is (extra is finite)
        self.rows = np.arange(w)
        self.buffer, self.ahead = _window(w, K)

    def largest(self, cap_max: float) -> float | None:
        """The largest finite stage time at most ``cap_max`` (None if none)."""
        t = self.t
        found = float(np.max(np.where((t <= cap_max) & (t < INF), t, -INF), initial=-INF))
        return found if found > -INF else None

    def caps_between(self, lo: float, hi: float) -> np.ndarray:
        """The distinct stage times in ``[lo, hi]`` (candidate caps), ascending."""
        t = self.t
        return distinct(t[(t >= lo) & (t <= hi)])

    def narrowed(self, cap_max: float) -> _Bands:
        """The same bands over the stages no longer than the longest of any stage time at most
        ``cap_max`` (a view: the DP at any cap up to ``cap_max`` is the same)."""
        fits = np.flatnonzero((self.t <= cap_max).any(axis=(0, 1)))
        K = int(fits[-1]) + 1 if fits.size else 1
        if K == self.K:
            return self
        out = object.__new__(_Bands)
        out.P, out.L, out.width, out.K = self.P, self.L, self.width, K
        out.t, out.te, out.rows = self.t[:, :, :K], self.te[:, :, :K], self.rows
        out.buffer, out.ahead = _window(self.width, K)
        return out

    def dp(self, cap: float) -> tuple[float, np.ndarray]:
        """One pass of the table for one cap: the least sum of ``T_s + c_s + X_s`` over the
        partitions with every stage at most ``cap`` (inf if none), and each stage's choice
        (``P x width``: at start ``s + a`` of stage ``s``, its layers less one; the first least
        entry, i.e. the earliest stop)."""
        cand_all = np.where(self.t <= cap, self.te, INF)
        buffer, ahead, rows, w = self.buffer, self.ahead, self.rows, self.width
        buffer[:w] = INF  # f[P] over the stops of the last stage: 0 at L only
        buffer[w - 1] = 0.0
        args = np.empty((self.P, w), dtype=np.intp)
        for s in range(self.P - 1, -1, -1):
            cand = cand_all[s] + ahead
            arg = cand.argmin(axis=1)
            args[s] = arg
            buffer[:w] = cand[rows, arg]
        return float(buffer[0]), args

    def stage_times(self, args: np.ndarray) -> tuple[list[int], list[float]]:
        """The partition ``args`` chooses from layer 0: its stage starts and stage times."""
        bounds, times, i = [], [], 0
        for s in range(self.P):
            a = int(args[s][i - s])
            bounds.append(i)
            times.append(float(self.t[s][i - s, a]))
            i += a + 1
        assert i == self.L, "DP reconstruction did not cover the layers"
        return bounds, times

    def bottleneck(self, cap_max: float) -> float:
        """The least largest stage time of any partition with every stage at most ``cap_max``
        (inf when there is none): the min-max DP over the same stages as :meth:`dp`."""
        capped = np.where(self.t <= cap_max, self.t, INF)
        buffer, ahead, w = self.buffer, self.ahead, self.width
        buffer[:w] = INF
        buffer[w - 1] = -INF
        for s in range(self.P - 1, -1, -1):
            buffer[:w] = np.maximum(capped[s], ahead).min(axis=1)
        return float(buffer[0])


def least_largest(tables: list[np.ndarray], L: int) -> float:
    """The least over the partitions of ``L`` layers into ``len(tables)`` stages (stage ``s``
    priced by ``tables[s][i, j]``, every stage a layer at least) of their largest entry (inf
    where none is finite): the min-max DP of :class:`_Bands`."""
    return _Bands(tables, [np.zeros_like(tables[0])] * len(tables), L).bottleneck(INF)


def _window(w: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """A buffer for ``f`` of the stops of the stage after (``w`` of them, past its end inf), and
    a view of it whose row ``a`` is ``f[a:a + K]``: the stops a stage from each start may reach."""
    buffer = np.full(w + K, INF)
    return buffer, np.lib.stride_tricks.as_strided(buffer, shape=(w, K), strides=(buffer.strides[0],) * 2,
                                                   writeable=False)


def _skewed(matrices: list[np.ndarray], L: int, w: int, K: int) -> np.ndarray:
    """``matrices[s][s + a, s + a + 1 + l]`` at ``[s, a, l]`` (``a < w``, ``l < K``), through a
    view whose rows step down the diagonal (entries stopping beyond ``L`` read other entries of
    the matrix: :func:`_beyond` marks them)."""
    views: dict[int, np.ndarray] = {}
    users: dict[int, list[int]] = {}
    for s, m in enumerate(matrices):
        if id(m) not in views:
            c = np.ascontiguousarray(m)
            step = c.strides[0] + c.strides[1]  # one row down, one column right
            views[id(m)] = np.lib.stride_tricks.as_strided(
                c.reshape(-1)[1:], shape=(len(matrices), w, K), strides=(step, step, c.strides[1]), writeable=False)
        users.setdefault(id(m), []).append(s)
    if len(views) > 3:  # many distinct matrices (1F1B's in-flight counts): one slice each
        return np.stack([views[id(m)][s] for s, m in enumerate(matrices)])
    out = np.empty((len(matrices), w, K))
    for key, stages in users.items():
        out[stages] = views[key][stages]
    return out


def _beyond(w: int, K: int) -> np.ndarray:
    """``[a, l]`` whose stage stops beyond its range (``a + l >= w``)."""
    return np.add.outer(np.arange(w), np.arange(K)) >= w


def could_partition(table: StageTable, inflight: Sequence[int], recompute: bool = True) -> bool:
    """Some partition into ``len(inflight)`` stages might fit (:meth:`StageTable.could_fit`,
    stage ``s`` with ``inflight[s]`` micro-batches and its share of the memory): when none does,
    the configuration has no plan, which this finds without pricing any recomputation. Without
    ``recompute``: some partition fits with none (then :func:`solve_chain` finds a plan)."""
    L, P = table.L, len(inflight)
    w = L - P + 1  # stage s starts in [s, s + w) and stops in [s + 1, s + 1 + w) (as _Bands)
    if w < 1:
        return False
    ats = [(inflight[s], table.cap_of(s)) for s in range(P)]
    cuts = [s * L // P for s in range(P + 1)]  # a witness first: stages of about equal layers
    if table.might_fit_all(ats, cuts, recompute):
        return True
    found = {at: table.could_fit(*at, recompute) for at in dict.fromkeys(ats)}  # few distinct: one lookup each
    fits = [found[at] for at in ats]
    reach = np.zeros(w, dtype=bool)  # over the stops of stage s: stage s + 1 onwards can cover the rest
    reach[-1] = True
    for s in range(P - 1, -1, -1):
        fit = fits[s][s:s + w, s + 1:s + 1 + w]
        reach = np.any(fit & reach[None, :], axis=1)
        if not reach.any():
            return False
    return bool(reach[0])


def _minimize(
    tables: list[np.ndarray], extra: list[np.ndarray], L: int, M: int, cap_max: float, cap_lb: float,
    longest: int | None = None,
) -> tuple[float, float, list[int]] | None:
    """min over caps of J; returns (J, cap at which the optimal partition is found, its stage
    starts) or None.

    Caps are visited downwards, jumping from a solution with largest stage time ``m`` to the
    largest candidate cap below ``m`` (every cap in between gives the same solution), and
    stopping once ``S + (M - 1) cap_lb`` cannot beat the best (S only grows as the cap falls).

    The visit starts below the top: with ``S_min`` the least sum of any partition (the DP at the
    largest cap) and ``J_b`` the objective of the DP's solution at the least feasible cap
    (:meth:`_Bands.bottleneck`), a solution whose largest stage exceeds ``(J_b - S_min) / (M - 1)``
    has ``J > J_b`` and cannot be the minimum (nor tie it), so the visit starts at the largest
    candidate cap below that. The caps visited from there, their solutions and the one returned
    are those of a visit from the top (whose solutions above it only ever lost to ``J_b``).
    ``cap_max``: a stage time no optimal partition exceeds (the caller's bound: a solution with
    a stage above it has ``J`` above an objective the caller knows), so no cap above it is
    visited; ``longest``: no stage with more layers is finite at any cap visited."""
    bands = _Bands(tables, extra, L, longest)
    if M == 1:
        total, args = bands.dp(INF)
        return (total, INF, bands.stage_times(args)[0]) if total < INF else None
    top = bands.largest(cap_max)
    if top is None:
        return None
    least_sum, _ = bands.dp(top)
    if least_sum >= INF:
        return None
    c_min = bands.bottleneck(top)
    if c_min >= INF:
        return None
    total, args = bands.dp(c_min)
    _, times = bands.stage_times(args)
    ceiling = (total + (M - 1) * max(times) - least_sum) / (M - 1)
    # the visit only meets caps in [c_min, ceiling]: the candidate caps there, and bands cut to
    # the stages no slower than the ceiling (the solutions and caps are those of the full bands)
    hi = min(max(ceiling * (1 + 1e-12), c_min), cap_max)
    bands = bands.narrowed(hi)
    caps = bands.caps_between(c_min, hi)
    k = len(caps) - 1
    best: tuple[float, float, list[int]] | None = None
    cap = float(caps[k])
    while True:
        total, args = bands.dp(cap)
        if total >= INF:
            break
        bounds, times = bands.stage_times(args)
        m = max(times)
        value = total + (M - 1) * m
        if best is None or value < best[0]:
            best = (value, cap, bounds)
        if total + (M - 1) * cap_lb >= best[0]:
            break
        k = int(np.searchsorted(caps, m, side="left")) - 1
        if k < 0:
            break
        cap = float(caps[k])
    return best


def _stage_bands(at: Sequence[tuple[int, float]], L: int, longest: int) -> dict[tuple[int, float], np.ndarray]:
    """Per ``(inflight, cap)`` of ``at`` (one per stage of ``len(at)``), the stages ``(i, j)`` the
    DP reads from its table (:class:`_Bands`): stage ``s`` starts in ``[s, s + w)`` and stops in
    ``[s + 1, s + w]`` (``w = L - P + 1``), at most ``longest`` layers long."""
    w = L - len(at) + 1
    out: dict[tuple[int, float], np.ndarray] = {}
    for s, a in enumerate(at):
        mask = out.get(a)
        if mask is None:
            mask = out[a] = np.zeros((L + 1, L + 1), dtype=bool)
        mask[s:s + w, s + 1:s + w + 1] = True
    lengths = _lengths(L)
    short = (lengths >= 1) & (lengths <= max(1, longest))
    for mask in out.values():
        mask &= short
    return out


def _heuristic_starts(work: np.ndarray, L: int, P: int) -> list[list[int]]:
    """Two partitions of ``L`` layers of ``work`` into ``P`` stages of a layer at least, by their
    starts: cut at equal shares of the work (nearest), and at equal numbers of layers."""
    cum = np.concatenate([[0.0], np.cumsum(work)])
    target = cum[-1] * np.arange(1, P) / P
    at = np.clip(np.searchsorted(cum, target), 1, L)
    nearest = np.where(np.abs(cum[at - 1] - target) <= np.abs(cum[at] - target), at - 1, at).tolist()
    by_work = [0]
    for s, x in enumerate(nearest, start=1):
        by_work.append(min(max(int(x), by_work[-1] + 1), L - P + s))
    return [by_work, [s * L // P for s in range(P)]]


def _objective(tables: list[np.ndarray], extra: list[np.ndarray], starts: Sequence[int], L: int, M: int
               ) -> tuple[float, list[float]]:
    """J of the partition with stage starts ``starts`` (inf if a stage is), and its stage times."""
    stops = list(starts[1:]) + [L]
    times = [float(tables[s][i, j]) for s, (i, j) in enumerate(zip(starts, stops))]
    if max(times) == INF:
        return INF, times
    return sum(times) + sum(float(extra[s][i, j]) for s, (i, j) in enumerate(zip(starts, stops))) + (M - 1) * max(times), times


def _useful_limit(tables: list[np.ndarray], extra: list[np.ndarray], starts: list[list[int]], L: int, M: int,
                  sum_lb: float | None) -> float:
    """A stage time above which no stage is in an optimal partition (inf where none is known):
    with ``J_h`` the objective of the best of the partitions ``starts`` and ``sum_lb`` a lower
    bound of any partition's sum, an optimum has ``sum_lb + (M - 1) max_s T_s <= J <= J_h``
    (:func:`_minimize` takes it as its largest cap; with a relative slack of 1e-9)."""
    if M == 1 or sum_lb is None:
        return INF
    best = min(_objective(tables, extra, cut, L, M)[0] for cut in starts)
    return INF if best == INF else (best - sum_lb) / (M - 1) * (1 + 1e-9)


def objective_microbatches(layout: Layout, num_microbatches: int) -> int:
    """The ``M`` of J: the micro-batches, or with ``v > 1`` chunks per rank ``v (M - P) + P``
    (:func:`solve_chain`)."""
    v, ranks = layout.virtual_stages_per_rank, layout.pipeline_size
    return num_microbatches if v == 1 else max(1, v * (num_microbatches - ranks) + ranks)


def solve_chain(
    table: StageTable, *, layout: Layout, num_microbatches: int, schedule: ScheduleKind
) -> ChainSolution | None:
    """The exact minimum of J for one configuration, or None if nothing fits.

    Interleaved 1F1B (``layout.virtual_stages_per_rank = v > 1``, ``num_stages = P v``): the
    same DP over the P v virtual stages with their counted in-flight micro-batches, and M
    replaced by ``v (M - P) + P``, for which J equals the schedule's ``(M v + P - 1) t`` on
    uniform chunks of time t; the simulator then judges it. The caller gives each chunk its
    share of a rank's memory (``StageTable.stage_caps``; :func:`planner.solve.candidates.rebalanced`).
    ZBV (two chunks per rank in a V) is solved the same way, with ZB-H1's bubble fill; the turn
    of the V (chunks ``P - 1`` and ``P`` on one rank) has no transfer.
    """
    cm, L, P = table.cm, table.L, layout.num_stages
    if P > L:
        return None
    table.settle()
    ks = inflight_counts(schedule, layout, num_microbatches)
    if not could_partition(table, ks):
        return None  # no partition fits even with every layer at its leanest level
    M = objective_microbatches(layout, num_microbatches)
    comm = _comm_vectors(cm, layout, table.b)
    exposure = _exposure_matrices(table, layout)
    fill = _bubble_fill_matrix(table) if schedule.splits_backward else None
    by_parts: dict[tuple[int, int], np.ndarray] = {}  # stages over the same link and line share one
    extra = []
    for s in range(P):
        key = (id(comm[s]), id(exposure[s]))
        if key not in by_parts:
            e = comm[s][None, :] + exposure[s]
            by_parts[key] = e if fill is None else e - fill
        extra.append(by_parts[key])
    fwd, bwd = table.cm.layer_times(table.b)
    whole = float(table.compute[0, L])  # inf when fixed boundaries cut the model: then the layers' sum
    cap_lb = max(float(np.max(fwd + bwd)), (whole if whole < INF else float(np.sum(fwd + bwd))) / P)
    # a lower bound of any partition's sum of T_s + c_s + X_s (- Z_s): its compute is the layers'
    # (prefix sums; not under ZeRO 3, whose terms at a stage's ends are not), recomputation only
    # adds, and each stage's extra is at least its matrix's least entry
    least_extra = {id(e): min(0.0, float(np.min(e))) for e in by_parts.values()}
    sum_lb = None if table.fsdp else float(np.sum(fwd + bwd)) * (1 - 1e-9) + sum(least_extra[id(e)] for e in extra)
    starts = _heuristic_starts(fwd + bwd, L, P)
    at = [(k, table.cap_of(s)) for s, k in enumerate(ks)]
    bases = {a: table.base(*a) for a in dict.fromkeys(at)}
    longest = max(table.longest(*a) for a in bases)  # of any stage that might fit
    plain_longest = max(table.longest(*a, recompute=False) for a in bases)  # of any that fits as it is
    plain = [bases[a] for a in at]
    bands = _stage_bands(at, L, longest)
    # the DP over the bases reads no stage longer than any whose compute is within what a
    # partition cutting at equal shares of the work bounds (:func:`_useful_limit`)
    plain_cap = _useful_limit(plain, extra, starts, L, M, sum_lb)
    plain_longest = min(plain_longest, table.longest_within(plain_cap)) if plain_cap < INF else plain_longest
    if not table.recomputes(bands):
        # no stage the DP reads fits only with recomputation: its tables are the bases
        tables = plain
        found = _minimize(tables, extra, L, M, plain_cap, cap_lb, plain_longest)
    else:
        # an upper bound from the plan without recomputation bounds the useful stage times:
        # J >= M max_s T_s, so no stage slower than J_ub / M (J_ub when M = 1) can be optimal
        # (no stage longer than any that fits without recomputation is finite there)
        # (none where no partition fits without recomputation: found without building the bands)
        first = _minimize(plain, extra, L, M, plain_cap, cap_lb, plain_longest) if could_partition(table, ks, False) else None
        # (with a relative slack of 1e-9 so that float rounding never drops the bound's own stages)
        per = (M - 1 if schedule.splits_backward else M) if M > 1 else 1
        limit = INF if first is None else first[0] / per * (1 + 1e-9)
        if first is not None and M > 1:
            # tighter: J >= S + (M - 1) max_s T_s with S at least ``sum_lb`` (else the least sum
            # of compute and transfers of any partition: recomputation only adds), so a stage
            # slower than (J_ub - S_least) / (M - 1) makes J > J_ub
            least = sum_lb if sum_lb is not None else _Bands([table.compute] * P, extra, L).dp(INF)[0]
            limit = min(limit, (first[0] - least) / (M - 1) * (1 + 1e-9))
        # a finite entry might fit with recomputation; with M > 1 only entries at most the limit
        # count (the caps), and those compute within it (the bands' longer stages compute above it)
        if M > 1:
            longest = min(longest, table.longest_within(limit))
        priced = table.tables(at, limit, bands)
        tables = [priced[a] for a in at]
        found = _minimize(tables, extra, L, M, limit, cap_lb, longest)
    if found is None:
        return None
    bounds = found[2]
    stops = bounds[1:] + [L]
    choices = [table.choice_of(ks[s], i, j, table.cap_of(s)) for s, (i, j) in enumerate(zip(bounds, stops))]
    recompute = [full for full, _ in choices]
    selective = [sel for _, sel in choices]
    objective, times = _objective(tables, extra, bounds, L, M)
    return ChainSolution(
        objective_ms=objective,
        boundaries=tuple(bounds),
        recompute=tuple(recompute),
        stage_times_ms=tuple(times),
        exact=table.all_exact,
        selective=tuple(selective) if any(selective) else (),
    )
