"""A chain's layers by kind, for pricing recomputation: stages holding the same layers share
their recompute covers, wherever they sit in the chain.

A stage's least recompute time depends, besides its in-flight count and the bytes it is over its
cap (the excess), only on its layers' times and bytes. :class:`LayerKinds` numbers the distinct
layers (kinds, :func:`~planner.solve.prices.fixed.layer_kinds`, as the tables' batch parts
number them), keys every stage by what its cover reads (:meth:`LayerKinds.sequence_keys`) and
keeps each key's covers (:func:`level_covers`, the excess-free part) as rows priced for many
stages at once (:class:`CoverRows`). One instance serves every table over the same layer arrays
(:func:`layers_of`); a table asks for its stages' prices by its arrays (:func:`level_costs`).

The covers are the stage tables' recompute prices for many stages at once: the excess-free part of
:func:`planner.solve.recompute.choose_recompute`'s selective path (:func:`level_covers`, one
:class:`LevelCover` per working set of a stage) worked out once per stage content, then priced
at each stage's excess with array operations over every stage a table call asks for
(:class:`CoverRows`). The price is :func:`~planner.solve.recompute.choose_recompute`'s least
time, bit for bit (the same float operations; tests/test_stage_prices.py holds it); which
layers reach it is left to that function, asked only for the stages a plan uses.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.artifacts.caches import Cache
from planner.solve.prices.fixed import layer_kinds, layer_runs
from planner.solve.recompute import INF, Layer, LevelCover, level_covers

__all__ = ["CONTENT_KINDS", "CoverRows", "LayerKinds", "LevelCosts", "layers_of", "level_costs", "level_cover_costs"]


#: elements per block of :func:`level_cover_costs` (rows x front x counts), to bound its memory
_BLOCK_ELEMENTS = 1 << 20


class CoverRows:
    """:class:`LevelCover` rows held as arrays (row ``r``: its front padded with inf, its
    :attr:`LevelCover.params`, its workspace), so that the covers of many stages are priced by
    their row numbers (:meth:`costs`) without a pass over them in Python. Rows are only added."""

    def __init__(self) -> None:
        self._workspace = np.zeros(0)
        self._params = np.zeros((0, 8))
        self._lens = np.zeros(0, dtype=np.int64)
        self._front_ms = np.full((0, 1), INF)
        self._front_gain = np.zeros((0, 1))
        self._pending: list[LevelCover] = []
        self._n = 0  # rows held; the arrays have room for more (grown by doubling: no copy per flush)

    def __len__(self) -> int:
        return self._n + len(self._pending)

    def add(self, covers: Sequence[LevelCover]) -> int:
        """Add ``covers`` as consecutive rows; the first one's number."""
        first = len(self)
        self._pending.extend(covers)
        return first

    def _flush(self) -> None:
        new = self._pending
        if not new:
            return
        self._pending = []
        lens = np.array([len(c.front_ms) for c in new], dtype=np.int64)
        F = max(self._front_ms.shape[1], int(lens.max()))
        fc = np.full((len(new), F), INF)
        fg = np.zeros((len(new), F))
        at_row = np.repeat(np.arange(len(new)), lens)
        at_col = np.arange(len(at_row)) - np.repeat(np.cumsum(lens) - lens, lens)
        fc[at_row, at_col] = list(itertools.chain.from_iterable(c.front_ms for c in new))
        fg[at_row, at_col] = list(itertools.chain.from_iterable(c.front_gain_bytes for c in new))
        n, m = self._n, self._n + len(new)
        room = len(self._lens)
        if m > room or F > self._front_ms.shape[1]:
            room = max(m, 2 * room) if m > room else room
            grown_ms, grown_gain = np.full((room, F), INF), np.zeros((room, F))
            grown_ms[:n, :self._front_ms.shape[1]] = self._front_ms[:n]
            grown_gain[:n, :self._front_gain.shape[1]] = self._front_gain[:n]
            self._front_ms, self._front_gain = grown_ms, grown_gain
            self._params = np.concatenate([self._params[:n], np.zeros((room - n, 8))])
            self._lens = np.concatenate([self._lens[:n], np.zeros(room - n, dtype=np.int64)])
            self._workspace = np.concatenate([self._workspace[:n], np.zeros(room - n)])
        self._front_ms[n:m] = fc  # F columns, as wide as the arrays (grown to F above)
        self._front_gain[n:m] = fg
        self._params[n:m] = np.array([c.params for c in new])
        self._lens[n:m] = lens
        self._workspace[n:m] = [c.workspace_bytes for c in new]
        self._n = m

    def workspace_bytes(self, rows: np.ndarray) -> np.ndarray:
        """:attr:`LevelCover.workspace_bytes` of each of ``rows``."""
        self._flush()
        out: np.ndarray = self._workspace[rows]
        return out

    def costs(self, rows: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """Per entry the least cost of row ``rows[e]`` reaching ``targets[e]`` bytes (inf where
        nothing does): the selective path's cover cost of
        :func:`~planner.solve.recompute.choose_recompute`, with its operations on arrays padded
        over the rows (padding costs inf, so it never wins)."""
        self._flush()
        out = np.full(len(rows), INF)
        if not len(rows):
            return out
        params = self._params[rows]
        lens = self._lens[rows]
        counts = params[:, 1].astype(np.int64) + 1  # per row its most full layers + 1
        for idx in _size_classes(lens, counts):
            F, K = int(lens[idx].max()), int(counts[idx].max())
            step = max(1, _BLOCK_ELEMENTS // (F * K))
            for lo in range(0, len(idx), step):
                at = idx[lo:lo + step]
                r = rows[at]
                out[at] = _cover_block(self._front_ms[r, :F], self._front_gain[r, :F], params[at], targets[at], K)
        return out


#: below this many padded elements (rows x front x counts) a call is priced in one size class
_CLASS_MIN_ELEMENTS = 1 << 17


def _size_classes(lens: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    """The rows (positions) priced together: all at once when the padded arrays are small, else
    by powers of two of their full-layer counts and front lengths, so that a long stage's row
    (GPT-3 175B's 98 single layers: counts up to 97) does not pad every short one to its size
    (each row's cost is the same whatever the padding: padded entries cost inf)."""
    if len(lens) * int(lens.max()) * int(counts.max()) <= _CLASS_MIN_ELEMENTS:
        return [np.arange(len(lens))]
    key = np.ceil(np.log2(counts)).astype(np.int64) * 64 + np.ceil(np.log2(lens)).astype(np.int64)
    order = np.argsort(key, kind="stable")
    cuts = np.flatnonzero(np.diff(key[order])) + 1
    return np.split(order, cuts)


def level_cover_costs(covers: Sequence[LevelCover], targets: np.ndarray) -> np.ndarray:
    """Per row the least cost of ``covers[r]`` reaching ``targets[r]`` bytes (inf where nothing
    does): :meth:`CoverRows.costs` of these covers."""
    rows = CoverRows()
    rows.add(covers)
    return rows.costs(np.arange(len(covers)), targets)


def _cover_block(fc: np.ndarray, fg: np.ndarray, params: np.ndarray, targets: np.ndarray, K: int) -> np.ndarray:
    n, kf_max, full_ms, full_gain, has_sel, sel_ms, sel_gain, most = (col[:, None, None] for col in params.T)
    has_sel = has_sel > 0
    most = most[:, 0, 0]
    target = targets[:, None, None]
    kf = np.arange(K, dtype=float)[None, None, :]
    got = fg[:, :, None] + kf * full_gain
    cost = kf * full_ms
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        ks = np.maximum(0.0, np.ceil((target - got) / sel_gain) - 1.0)
        for _ in range(2):  # the float sum decides, as _least_in_group
            ks = ks + (got + ks * sel_gain < target)
    ks = np.where(got >= target, 0.0, ks)
    ok = np.where(has_sel, ks <= n - kf, got >= target) & (kf <= kf_max)
    ks = np.where(has_sel, ks, 0.0)
    total = np.where(ok, cost + ks * sel_ms, INF)
    least = total.min(axis=2)
    best = (fc + least).min(axis=1)
    return np.where((most < targets) | ~(best < INF), INF, np.where(targets <= 0, 0.0, best))


#: profiles with at most this many kinds of layer key a stage's recompute covers by what it holds
#: (:attr:`LayerKinds.by_content`), else by its runs
CONTENT_KINDS = 16


@dataclass(frozen=True, slots=True)
class LevelCosts:
    """The least recompute times of many stages at once (:func:`level_costs`), by
    problem: stages with the same layers, in-flight count and excess share one. Per problem its
    cost (inf where nothing fits; inf too where the cover is not exact: ``inexact``, which the
    caller prices with :func:`~planner.solve.recompute.choose_recompute`'s greedy), a stage of it
    (``pair``), its in-flight count and excess; per stage its problem."""

    costs: np.ndarray  # per problem, ms (writable: the caller fills in the inexact ones)
    inexact: np.ndarray  # the problems whose cover is not exact
    pair: np.ndarray  # per problem, one of its stages (a position in the stages asked)
    inflight: np.ndarray  # per problem
    excess: np.ndarray  # per problem, bytes
    problem: np.ndarray  # per stage asked, its problem


class LayerKinds:
    """What a stage's recompute choice depends on besides the in-flight count and the excess:
    its layers' times and bytes. Shared by every stage table with the same arrays (caps,
    shardings and schedules differ only in the excess), so a stage's
    :class:`~planner.solve.recompute.LevelCover` rows per in-flight count are worked out once
    for all of them."""

    def __init__(self, fwd: np.ndarray, saved: np.ndarray, inputs: np.ndarray, core: np.ndarray,
                 core_ms: np.ndarray):
        L = len(fwd)
        self.kind, kinds = layer_kinds(fwd, saved, inputs, core, core_ms)
        #: per kind its layer's figures, as :func:`~planner.solve.recompute.level_covers` reads them
        self.layers: list[Layer] = [(f, a, b, cm_, c) for f, a, b, c, cm_ in kinds]
        self.run = layer_runs(self.kind)  # identical layers from i on (i included)
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

    def costs(self, I: np.ndarray, J: np.ndarray, ks: np.ndarray, ex: np.ndarray) -> LevelCosts:
        """The least recompute time of each stage ``[I, J)`` with ``ks`` micro-batches in flight and
        ``ex`` bytes over its cap, where its layers have selective levels and no shared saves: stages
        with the same layers (:meth:`sequence_keys`), count and excess are one problem, and each
        problem's cover rows (:meth:`cover_rows`) are priced at its excess plus each row's workspace."""
        seqs = self.sequence_keys(I, J)
        order = np.lexsort((ex, ks, *seqs.T[::-1]))
        s_seq, s_k, s_ex = seqs[order], ks[order], ex[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = np.any(s_seq[1:] != s_seq[:-1], axis=1) | (s_k[1:] != s_k[:-1]) | (s_ex[1:] != s_ex[:-1])
        starts = np.flatnonzero(first)
        problem = np.empty(len(order), dtype=np.intp)
        problem[order] = np.cumsum(first) - 1  # per pair, its problem
        p_seq, p_k, p_ex, p_pair = s_seq[starts], s_k[starts], s_ex[starts], order[starts]
        # problems with the same layers and in-flight count (consecutive) share their cover rows
        new = np.ones(len(starts), dtype=bool)
        new[1:] = np.any(p_seq[1:] != p_seq[:-1], axis=1) | (p_k[1:] != p_k[:-1])
        heads = np.flatnonzero(new)
        per_head = np.diff(np.append(heads, len(starts)))
        spans = [self.cover_rows(tuple(q), k) for q, k in zip(p_seq[heads].tolist(), p_k[heads].tolist())]
        exact = np.repeat([span is not None for span in spans], per_head)
        first_row = np.repeat([span[0] if span else 0 for span in spans], per_head)
        n_rows = np.repeat([span[1] if span else 0 for span in spans], per_head)
        costs = np.full(len(starts), INF)
        owners = np.repeat(np.arange(len(starts)), n_rows)
        if len(owners):  # every problem's cover rows, priced at its excess plus each row's workspace
            rows = np.repeat(first_row, n_rows) + (np.arange(len(owners)) - np.repeat(np.cumsum(n_rows) - n_rows, n_rows))
            np.minimum.at(costs, owners, self.rows.costs(rows, p_ex[owners] + self.rows.workspace_bytes(rows)))
        return LevelCosts(costs=costs, inexact=np.flatnonzero(~exact), pair=p_pair, inflight=p_k, excess=p_ex,
                          problem=problem)

    def cover_rows(self, seq: tuple[int, ...], inflight: int) -> tuple[int, int] | None:
        """The rows of :attr:`rows` (first, count) holding :func:`level_covers` of the stage known
        by ``seq`` (:meth:`sequence_keys`), None where the cover is not exact."""
        key = (seq, inflight)
        if key not in self._row_spans:
            runs: list[tuple[Layer, int]]
            if self.by_content:
                n = len(seq) // 2
                present = sorted((seq[n + kind], kind) for kind in range(n) if seq[n + kind] >= 0)
                runs = [(self.layers[kind], seq[kind]) for _, kind in present]
            elif seq[2] < 0:
                runs = [(self.layers[seq[0]], seq[1])]
            else:
                a, b = seq[0], seq[2]
                counts = [seq[1], *(int(self.run_stop[r] - self.run_start[r]) for r in range(a + 1, b)), seq[3]]
                runs = [(self.layers[self.kind[int(self.run_start[r])]], n)
                        for r, n in zip(range(a, b + 1), counts)]
            covers = level_covers(runs, inflight)
            self._row_spans[key] = None if covers is None else (self.rows.add(covers), len(covers))
        return self._row_spans[key]


#: :class:`LayerKinds` by the bytes of their arrays (a search builds tables for few micro-batch sizes)
_LAYERS: Cache[bytes, LayerKinds] = Cache(
    "solve.prices.layers", key="the bytes of the layers' fwd, saved, input, core and core-ms arrays", bound=64)


def layers_of(fwd: np.ndarray, saved: np.ndarray, inputs: np.ndarray, core: np.ndarray,
              core_ms: np.ndarray) -> LayerKinds:
    """The :class:`LayerKinds` of these per-layer arrays (one micro-batch's), shared while cached."""
    key = b"".join(np.ascontiguousarray(a, dtype=float).tobytes() for a in (fwd, saved, inputs, core, core_ms))
    found = _LAYERS.get(key)
    if found is None:
        found = _LAYERS.put(key, LayerKinds(fwd, saved, inputs, core, core_ms))
    return found


def level_costs(fwd: np.ndarray, saved: np.ndarray, inputs: np.ndarray, core: np.ndarray, core_ms: np.ndarray,
                I: np.ndarray, J: np.ndarray, ks: np.ndarray, ex: np.ndarray) -> LevelCosts:
    """The least recompute times of the stages ``[I, J)`` of the chain of these per-layer arrays
    (one micro-batch's) with ``ks`` micro-batches in flight and ``ex`` bytes over their caps, where
    their layers have selective levels and no shared saves: :meth:`LayerKinds.costs` of the
    arrays' :class:`LayerKinds` (:func:`layers_of`: every table over the same layers shares its
    covers)."""
    return layers_of(fwd, saved, inputs, core, core_ms).costs(I, J, ks, ex)
