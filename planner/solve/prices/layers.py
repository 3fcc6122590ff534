"""A chain's layers by kind, for pricing recomputation: stages holding the same layers share
their recompute covers, wherever they sit in the chain.

A stage's least recompute time depends, besides its in-flight count and the bytes it is over its
cap (the excess), only on its layers' times and bytes. :class:`LayerKinds` numbers the distinct
layers (kinds), keys every stage by what its cover reads (:meth:`LayerKinds.sequence_keys`) and
keeps each key's covers (:func:`planner.solve.prices.covers.level_covers`, the excess-free part)
as rows priced for many stages at once (:class:`planner.solve.prices.covers.CoverRows`). One instance
serves every table over the same layer arrays (:func:`layers_of`).
"""

from __future__ import annotations

import numpy as np

from planner.artifacts.caches import Cache
from planner.solve.prices.covers import CoverRows, level_covers
from planner.solve.recompute import Option, layer_options

__all__ = ["CONTENT_KINDS", "LayerKinds", "layers_of"]

#: profiles with at most this many kinds of layer key a stage's recompute covers by what it holds
#: (:attr:`LayerKinds.by_content`), else by its runs
CONTENT_KINDS = 16


class LayerKinds:
    """What a stage's recompute choice depends on besides the in-flight count and the excess:
    its layers' times and bytes. Shared by every stage table with the same arrays (caps,
    shardings and schedules differ only in the excess), so a stage's
    :class:`~planner.solve.recompute.LevelCover` rows per in-flight count are worked out once
    for all of them."""

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
