"""Stage times: the stage table the chain DP reads, ``T_k(i, j)`` = compute + the least
recompute time that fits stage ``[i, j)`` in its cap with ``k`` micro-batches in flight (inf
where nothing fits), and the recomputed layers behind each time.

Recompute prices: where a layer has a selective level, the least recompute time of every stage
a table call must price is worked out at once, one call asked of the table's layers
(:func:`planner.solve.prices.layers.level_costs`: :func:`planner.solve.recompute.level_covers`,
the excess-free part, shared by every table with the same layers through
:class:`~planner.solve.prices.layers.LayerKinds`; :meth:`planner.solve.prices.layers.CoverRows.costs`,
the excess-dependent part, vectorised over the stages); the layers of a stage are chosen
(:func:`~planner.solve.recompute.choose_recompute`, the same least time bit for bit, which an
assertion holds) only when a plan asks for them. Without selective levels, or with shared
saves, a stage at a time. Stages are priced only where a caller reads them (its bands) and
only up to a time it can use (its limit): pruning only skips stages, it never changes a price.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from planner.solve.prices.capview import excess_bytes
from planner.solve.prices.fits import StageFits
from planner.solve.prices.layers import level_costs
from planner.solve.recompute import INF, RecomputeChoice, choose_recompute

__all__ = ["StageTable"]


class StageTable(StageFits):
    """Stage times ``T_k(i, j)`` (inf where the stage cannot fit) for one micro-batch size,
    memory cap and division of the model state (``sharding``), per in-flight count ``k``;
    shared across P and schedules. What fits: :class:`~planner.solve.prices.fits.StageFits`;
    the extra terms of the objective per stage (transfers, exposed synchronisation, ZB-H1's
    bubble fill): :mod:`planner.solve.prices.extras` (:func:`~planner.solve.prices.extras.exposure`).

    Public API (what the DP, the searches, the replicated solver and the infeasibility
    explainer read): :meth:`table` / :meth:`tables` (stage times), :meth:`base` (without
    recomputation), :meth:`choice_of` / :meth:`recompute_of` / :meth:`selective_of` (the layers
    behind a time), :meth:`chain_fits` (what the chain DP reads before pricing), :meth:`could_fit` /
    :meth:`could_partition` / :meth:`could_fit_every_state` /
    :meth:`least_bytes` / :meth:`longest`,
    :meth:`cap_of`, :meth:`settle`, :attr:`all_exact`, :attr:`question`."""

    def excess_at(self, at: tuple[int, float], i: np.ndarray | int, j: np.ndarray | int) -> np.ndarray:
        """The bytes of stages ``(i, j)`` without recomputation over the cap with the in-flight
        count of ``at = (inflight, cap)`` (what recomputation must free)."""
        return excess_bytes(self.static[i, j], self.act[i, j], at[0], at[1])

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
        found = level_costs(self.fwd, self.saved, self.inputs, self.core, self.core_ms, I, J, ks, ex)
        costs = found.costs
        for u in found.inexact.tolist():  # not exact there: the greedy, one stage at a time
            at_pair = int(found.pair[u])
            choice = self._choose(int(found.inflight[u]), int(I[at_pair]), int(J[at_pair]), float(found.excess[u]))
            self.all_exact &= choice.exact or not choice.time_ms < INF
            costs[u] = choice.time_ms
        pair_costs = costs[found.problem]
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
