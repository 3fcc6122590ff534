"""A stage table's entries per in-flight count and cap (bases, tables, fit masks, recompute
choices, cap views), and the bound on how many of them a search keeps (:class:`RecentEntries`).
"""

from __future__ import annotations

import numpy as np

from planner.solve.prices.capview import CapView
from planner.solve.recompute import RecomputeChoice

__all__ = ["Entries", "RecentEntries"]


class Entries:
    """A :class:`~planner.solve.prices.table.StageTable`'s entries per ``(inflight, cap)`` (shared by its copies for a
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
        self.views: dict[tuple[int, float], CapView] = {}  # at (-1, cap)

    def forget(self, at: tuple[int, float]) -> None:
        """Drop everything worked out for ``at`` (asked again, it is worked out again, the same)."""
        for store in (self.bases, self.tables, self.pending, self.lazy, self.choices, self.views):
            store.pop(at, None)
        for recompute in (False, True):
            self.could.pop((*at, recompute), None)
            self.longest.pop((*at, recompute), None)


class RecentEntries:
    """The entries per ``(inflight, cap)`` of several stage tables (bases, tables, fit
    masks, recompute choices, cap views: a few matrices each), least recently used first, of which
    at most ``keep`` are kept: a search asks each count and cap a few times, close together (GPT-3
    175B on 1,024 GPUs: 7 of 1,504 tables at a table's own cap asked again, 172 of 673 at a chunk's
    share, each within the last 32 asked; 2 of 271 views worked out again), while keeping every one
    held 420 MB of the search's 460 MB peak (resident; 184 MB with 32 kept, and 0.1 to 0.2 s less of
    the kernel's page faults). Forgotten entries are worked out again when asked, the same.
    Forgetting happens only between solves (:meth:`StageTable.settle`, at the start of
    :func:`planner.solve.chain_dp.solve_chain`), since a solve reads its entries until it returns."""

    def __init__(self, keep: int = 32) -> None:
        self.keep = keep
        self._order: dict[tuple[int, tuple[int, float]], Entries] = {}  # by (entries, at), oldest first

    def touch(self, entries: Entries, at: tuple[int, float]) -> None:
        key = (id(entries), at)
        self._order.pop(key, None)
        self._order[key] = entries

    def trim(self) -> None:
        while len(self._order) > self.keep:
            key = next(iter(self._order))
            self._order.pop(key).forget(key[1])
