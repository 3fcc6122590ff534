"""What fits: which stages of a chain fit a memory cap with a given number of micro-batches in
flight, as they are or at their leanest recomputation (the base class of
:class:`planner.solve.prices.table.StageTable`, which prices the recomputation).

Every answer is an ``(L + 1) x (L + 1)`` matrix over the stages ``[i, j)`` (or read from one),
worked out from the table's fixed part (:mod:`planner.solve.prices.fixed`) and kept per
``(inflight, cap)`` in the table's entries (:class:`Entries`: bases, tables, fit masks, recompute
choices, cap views), where a :class:`RecentEntries` may bound how many a search keeps. Questions
over a whole partition are the table's too: whether some partition might fit
(:meth:`StageFits.could_partition`, :func:`reaches`; at every held state of a zero-bubble stage,
:meth:`StageFits.could_fit_every_state`, over the states that can be its heaviest,
:func:`peak_states`), and what the chain DP reads before it prices any
recomputation, asked once per solve (:meth:`StageFits.chain_fits`, one :class:`ChainFits`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Generic, Self, TypeVar

import numpy as np

from planner.artifacts.caches import register_function
from planner.artifacts.layout import Sharding
from planner.cost import CostModel
from planner.schedule import Held
from planner.solve.arrays import distinct
from planner.solve.chain import StageQuestion
from planner.solve.prices.capview import CapView, cap_view, excess_bytes
from planner.solve.prices.fixed import fixed_part
from planner.solve.recompute import INF, RecomputeChoice

__all__ = ["LEAST_BYTES_WORKSPACES", "VIEW_MIN_LAYERS", "ChainFits", "Entries", "RecentEntries", "StageFits", "peak_states",
           "reaches"]

#: a stage's key in a :class:`ChainFits`: (micro-batches past I held in its static bytes, (in-flight count, cap))
StageKey = tuple[int, tuple[int, float]]

#: :meth:`StageFits.least_bytes` is worked out over at most this many distinct working sets
LEAST_BYTES_WORKSPACES = 32

#: tables of fewer layers work each count out alone: their matrices are small enough that numpy's
#: fixed cost per operation, not their size, is what a view would save on (default-memory, 42
#: layers: 4% slower with views)
VIEW_MIN_LAYERS = 64


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


@dataclass(slots=True)
class RecentEntries:
    """The entries per ``(inflight, cap)`` of several stage tables (bases, tables, fit
    masks, recompute choices, cap views: a few matrices each), least recently used first, of which
    at most ``keep`` are kept: a search asks each count and cap a few times, close together (GPT-3
    175B on 1,024 GPUs: 7 of 1,504 tables at a table's own cap asked again, 172 of 673 at a chunk's
    share, each within the last 32 asked; 2 of 271 views worked out again), while keeping every one
    held 420 MB of the search's 460 MB peak (resident; 184 MB with 32 kept, and 0.1 to 0.2 s less of
    the kernel's page faults). Forgotten entries are worked out again when asked, the same.
    Forgetting happens only between solves (:meth:`StageFits.settle`, at the start of each
    :func:`planner.solve.chain_dp.solve_chain`: :meth:`StageFits.chain_fits`), since a solve reads its entries until it returns."""

    keep: int = 32
    #: by (entries, at), oldest first
    _order: dict[tuple[int, tuple[int, float]], Entries] = field(default_factory=dict)

    def touch(self, entries: Entries, at: tuple[int, float]) -> None:
        key = (id(entries), at)
        self._order.pop(key, None)
        self._order[key] = entries

    def trim(self) -> None:
        while len(self._order) > self.keep:
            key = next(iter(self._order))
            self._order.pop(key).forget(key[1])


def reaches(fits: Sequence[np.ndarray], L: int, P: int) -> bool:
    """Some partition into ``P`` stages has stage ``s`` where ``fits[s]`` holds."""
    w = L - P + 1
    reach = np.zeros(w, dtype=bool)  # over the stops of stage s: stage s + 1 onwards can cover the rest
    reach[-1] = True
    for s in range(P - 1, -1, -1):
        fit = fits[s][s:s + w, s + 1:s + 1 + w]
        reach = np.any(fit & reach[None, :], axis=1)
        if not reach.any():
            return False
    return bool(reach[0])


@lru_cache(maxsize=4096)
def peak_states(states: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """Of a stage's :attr:`Held.states <planner.schedule.Held.states>` (the walk's points no other
    exceeds in both counts: ``whole`` descending, ``pending`` ascending), those on or above the
    chord of their neighbours (the frontier's upper concave chain, its two ends always among
    them): a stage's bytes at ``(whole, pending)`` are ``whole x a + pending x k`` plus what does
    not depend on them, with ``k >= 0`` (what a micro-batch past I keeps), so at every sizes the
    heaviest state is one of these, and a point below a chord is strictly lighter than one of
    its ends. A ZBV chunk's seven states (27, 0), (26, 1), (14, 2) ... (10, 6) leave three."""
    chain: list[tuple[int, int]] = []
    for c in states:
        # (b - a) x (c - a) < 0: b strictly below the chord a c (integers: exact)
        while len(chain) >= 2 and ((chain[-1][0] - chain[-2][0]) * (c[1] - chain[-2][1])
                                   - (chain[-1][1] - chain[-2][1]) * (c[0] - chain[-2][0])) < 0:
            chain.pop()
        chain.append(c)
    return tuple(chain)


register_function("solve.prices.fits.peak_states", peak_states, key="a stage's held states")


_Table = TypeVar("_Table", bound="StageFits")


@dataclass(frozen=True, slots=True)
class ChainFits(Generic[_Table]):
    """What the chain DP reads of a table about one configuration's stages before it prices any
    recomputation (:meth:`StageFits.chain_fits`, once per solve): per stage its table (its
    micro-batches past I held, :meth:`StageFits.held`) and key; per distinct key the stage times
    without recomputation (:meth:`StageFits.base`) and the stages that fit only with it (none
    where the table does not recompute); the most layers of any stage that might fit, with and
    without recomputation (:meth:`StageFits.longest`); and per number of layers the least
    compute time of any stage that long (inf where none: the most layers of a stage within a
    time, :func:`planner.solve.chain_dp._longest_within`)."""

    tables: tuple[_Table, ...]  # per stage
    keys: tuple[StageKey, ...]  # per stage
    bases: dict[StageKey, np.ndarray]
    needs: dict[StageKey, np.ndarray]  # empty where the table does not recompute
    longest: int
    plain_longest: int
    fastest_by_length: np.ndarray  # [l]: the least compute ms of a stage of l layers


class StageFits:
    """The fit questions of a stage table for one micro-batch size, memory cap and division of
    the model state (``sharding``), per in-flight count (module docstring). Its inputs are
    :attr:`question`; the arrays it reads are public attributes (read-only), each per stage
    ``[i, j)`` at ``[i, j]``: :attr:`compute` (F + B ms, inf where not a stage), :attr:`static`
    (model state and buffers), :attr:`act` (bytes per micro-batch in flight), :attr:`gain` (the
    most recomputation frees per micro-batch), :attr:`sync_bytes` (synchronised after the last
    backward), :attr:`valid`; per layer :attr:`fwd`, :attr:`saved`, :attr:`inputs`, :attr:`core`,
    :attr:`core_ms`. ``stage_caps`` may be reassigned on a shallow copy (a chunk's share of a
    rank's memory per stage): the copy shares every entry worked out."""

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
        other tables' (those least recently used forgotten between solves), else all kept. A
        micro-batch of no samples is refused (ValueError naming the field and the value)."""
        if microbatch_size < 1:
            raise ValueError(f"StageTable.microbatch_size must be at least 1 (got {microbatch_size})")
        self.question = StageQuestion(cost_model=cm, microbatch_size=microbatch_size, cap_bytes=cap_bytes,
                                      sharding=sharding, fsdp_line=fsdp_line, fixed_boundaries=tuple(fixed_boundaries),
                                      allow_recompute=allow_recompute)
        self.cm = cm
        self.allow_recompute = allow_recompute
        self.sharding = sharding
        self.b = microbatch_size
        self.cap = cap_bytes
        self.stage_caps = tuple(stage_caps)  # per stage (chunks of a rank share its memory), else cap each
        self.L = cm.num_layers
        fixed = fixed_part(cm, microbatch_size, sharding, fsdp_line, tuple(fixed_boundaries))
        batch = fixed.batch
        self.fsdp, self.compute, self.kappa = fixed.fsdp, fixed.compute, fixed.kappa
        self.sync_bytes_per_param, self.static, self.sync_bytes = fixed.sync_bytes_per_param, fixed.static, fixed.sync_bytes
        self.fwd, self.valid, self.bwd_prefix, self.act, self.shared = batch.fwd, batch.valid, batch.bwd_prefix, batch.act, batch.shared
        self.saved, self.inputs, self.selective = batch.saved, batch.inputs, cm.selective
        self.core, self.core_ms, self.gain = batch.core, batch.core_ms, batch.gain
        self._cache = batch.choices  # a stage's recompute choice by its layers, in-flight count and excess
        entries = self._entries = Entries()  # per (inflight, cap)
        self._bases, self._tables, self._pending, self._lazy = entries.bases, entries.tables, entries.pending, entries.lazy
        self._choices, self._could, self._longest = entries.choices, entries.could, entries.longest
        self._recent = recent
        self.all_exact = True
        self._kind, self._run = batch.kind, batch.run  # what a choice within a run of identical layers is keyed by
        self.lengths = batch.lengths  # j - i at [i, j]
        self._fastest: np.ndarray | None = None  # per number of layers, the least compute (chain_fits)
        self._levels = batch.levels
        self._keep = batch.keep  # per stage, what a micro-batch past its I keeps (held)
        self._held: dict[int, Self] = {}  # per pending count, the table with their bytes in static
        self._pending_held = 0  # micro-batches past I in static (a copy of held())

    def held(self, pending: int) -> Self:
        """This table with ``pending`` micro-batches past their input-gradient pass on every
        stage, each keeping W's inputs (:meth:`CostModel.keep_bytes`, :func:`planner.schedule.held_counts`):
        their bytes join the stage's static ones, so its in-flight count is of whole micro-batches
        and every fit test and recompute price reads the exact peak. A shallow copy with entries
        of its own (kept per pending count, shared by this table's copies); itself for 0."""
        if pending == 0:
            return self
        found = self._held.get(pending)
        if found is None:
            found = copy.copy(self)
            found.static = self.static + pending * self._keep
            found._pending_held = pending
            entries = found._entries = Entries()
            found._bases, found._tables, found._pending, found._lazy = entries.bases, entries.tables, entries.pending, entries.lazy
            found._choices, found._could, found._longest = entries.choices, entries.could, entries.longest
            self._held[pending] = found
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

    def _view(self, cap: float) -> CapView | None:
        """:class:`~planner.solve.prices.capview.CapView` of ``cap`` if it is the table's own (an entry at ``(-1, cap)``): the cap its
        configurations ask at many in-flight counts (interleaved ones, one per chunk); None for
        another (a chunk's share of a rank's memory), asked at few, each worked out alone, and
        on chains of fewer than :data:`VIEW_MIN_LAYERS` layers."""
        if cap != self.cap or self.L < VIEW_MIN_LAYERS or self._pending_held:
            return None
        views = self._entries.views
        found = views.get((-1, cap))
        if found is None:
            found = views[(-1, cap)] = cap_view(self.static, self.act, self.gain, self.valid, cap)
        if self._recent is not None:
            self._recent.touch(self._entries, (-1, cap))
        return found

    def could_fit(self, inflight: int, cap: float | None = None, recompute: bool = True) -> np.ndarray:
        """Stages that might fit ``cap`` (default the table's) with ``inflight`` micro-batches: as
        they are, or (with ``recompute``, where the table allows it) with every layer at its
        leanest level. Every finite entry of :meth:`StageTable.table` is one of these; without
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
                excess = excess_bytes(self.static, self.act, inflight, key[1])
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
        the stage fits (:func:`~planner.solve.recompute.choose_recompute` covers ``excess + W`` by the options whose working
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
        recomputation (what :meth:`StageTable.tables` prices; the table allows recomputation)."""
        out: np.ndarray = self.could_fit(*at) & ~self.could_fit(*at, recompute=False)
        return out

    def longest(self, inflight: int, cap: float | None = None, recompute: bool = True) -> int:
        """The most layers of any stage that :meth:`could_fit` (0 if none)."""
        recompute = recompute and self.allow_recompute
        key = (inflight, self.cap if cap is None else cap, recompute)
        view = self._view(key[1])
        if view is not None:
            fitting = np.flatnonzero((view.leanest_by_length if recompute else view.plain_by_length) >= inflight)
            return int(fitting[-1]) if len(fitting) else 0
        found = self._longest.get(key)
        if found is None:
            found = self._longest[key] = int(np.max(self.could_fit(*key) * self.lengths))
        return found

    def could_partition(self, inflight: Sequence[int], recompute: bool = True, tables: Sequence[StageFits] = ()) -> bool:
        """Some partition into ``len(inflight)`` stages might fit (:meth:`could_fit`, stage ``s``
        with ``inflight[s]`` micro-batches and its share of the memory): when none does, the
        configuration has no plan, which this finds without pricing any recomputation. Without
        ``recompute``: some partition fits with none (then the chain DP finds a plan).
        ``tables``: each stage's own (:meth:`held`), else this table for all."""
        L, P = self.L, len(inflight)
        if tables and any(t is not self for t in tables):
            ats = [(inflight[s], self.cap_of(s)) for s in range(P)]
            return reaches([t.could_fit(*a, recompute) for t, a in zip(tables, ats)], L, P)
        if L - P + 1 < 1:  # stage s starts in [s, s + w) and stops in [s + 1, s + 1 + w), w = L - P + 1
            return False
        ats = [(inflight[s], self.cap_of(s)) for s in range(P)]
        cuts = [s * L // P for s in range(P + 1)]  # a witness first: stages of about equal layers
        if self.might_fit_all(ats, cuts, recompute):
            return True
        found = {at: self.could_fit(*at, recompute) for at in dict.fromkeys(ats)}  # few distinct: one lookup each
        return reaches([found[at] for at in ats], L, P)

    def could_fit_every_state(self, held: Sequence[Held]) -> bool:
        """Some partition into ``len(held)`` stages might fit every held state of each stage: stage
        ``s`` fits its cap at each ``(whole, pending)`` of ``held[s].states`` (each of its
        :func:`peak_states`: at its leanest a state holds ``whole x (act - gain)
        + pending x keep`` over what it holds at none, ``keep >= 0``, so one of those is the
        heaviest), each state at its own leanest recomputation (:meth:`could_fit` of the table with
        ``pending`` held, as the chain DP reads it). A relaxation of
        :func:`planner.solve.held.fits_every_state` over every partition and recomputation: where it
        fails, no solution fits every state (the peak's optimum fails that check), nor does any fit
        the state above them all (:attr:`Held.conservative`), so
        :func:`planner.solve.optimum.solve_config` has none without solving either."""
        masks: dict[tuple[tuple[tuple[int, int], ...], float], np.ndarray] = {}
        fits = []
        for s, h in enumerate(held):
            key = (peak_states(h.states), self.cap_of(s))
            found = masks.get(key)
            if found is None:
                found = np.logical_and.reduce([self.held(p).could_fit(w, key[1]) for w, p in key[0]])
                masks[key] = found
            fits.append(found)
        return len(held) <= self.L and reaches(fits, self.L, len(held))

    def chain_fits(self, held: Sequence[Held]) -> ChainFits[Self] | None:
        """:class:`ChainFits` of a configuration whose stage ``s`` holds ``held[s]`` (its whole
        micro-batches in flight, those past I in its table's static bytes), after :meth:`settle`
        (the chain DP asks this first); None where no partition might fit even with every layer
        at its leanest level (:meth:`could_partition`)."""
        self.settle()
        ks = [h.whole for h in held]
        per = tuple(self.held(h.pending) for h in held)
        if not self.could_partition(ks, tables=per):
            return None
        keys = tuple((h.pending, (k, self.cap_of(s))) for s, (h, k) in enumerate(zip(held, ks)))
        tab = {key: per[s] for s, key in enumerate(keys)}
        bases = {key: tab[key].base(*key[1]) for key in dict.fromkeys(keys)}
        if self._fastest is None:
            fastest = np.full(self.L + 1, INF)
            np.minimum.at(fastest, np.maximum(self.lengths, 0).ravel(), self.compute.ravel())
            fastest[0] = INF  # (no stage of no layers; below the diagonal compute is inf)
            self._fastest = fastest
        return ChainFits(
            tables=per, keys=keys, bases=bases,
            needs={key: tab[key]._needs(key[1]) for key in bases} if self.allow_recompute else {},
            longest=max(tab[key].longest(*key[1]) for key in bases),  # of any stage that might fit
            plain_longest=max(tab[key].longest(*key[1], recompute=False) for key in bases),  # that fits as it is
            fastest_by_length=self._fastest)
