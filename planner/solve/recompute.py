"""Which layers of a stage to recompute, and how much of each: an exact covering knapsack.

A stage holding ``k`` micro-batches of size ``b`` in flight must fit in ``cap`` bytes:

    static + buffers + k b (A - sum_{l in R} (saved_l - input_l)) + b max_{l in R} saved_l <= cap

and recomputing layer ``l`` costs its forward time ``f_l`` in every backward. We minimise
``sum_{l in R} f_l``. The max term (the recompute working set: the saved tensors of the layer
being recomputed) is handled exactly by enumerating the largest recomputed layer ``W``: only
layers with ``saved_l <= saved_W`` may join, and the working set is ``b saved_W``. For each
``W`` the rest is a min-cost cover (``sum gain_l >= target``) solved by a Pareto front of
(cost, gain) points, with gains above the target clipped (the standard exact DP over
non-dominated states; Kellerer, Pferschy & Pisinger, *Knapsack Problems*, 2004, sec. 2.3).

Three levels per layer (Korthikanti et al. 2022 sec. 4; :class:`RecomputeLevel`): a layer
with an attention core may instead be recomputed *selectively*, re-running only the core
(cost ``c_l``, its core forward) and freeing only the core's bytes ``C_l`` (gain ``k C_l``,
working set ``C_l``). Then the knapsack is a multiple-choice cover (at most one of {selective,
full} per layer, Kellerer et al. 2004 ch. 11): the same Pareto front, over which each layer
(or run of identical layers taken together, with every split of the run into full /
selective / none) adds one option; the workspace is enumerated over both levels' working
sets. Without selective options the 0/1 cover above runs, unchanged.

Above :data:`EXACT_MAX_ITEMS` candidate layers (with selective options: and more than
:data:`EXACT_MAX_GROUPS` kinds of layer) the front can grow exponentially; there a greedy by ms
per byte saved gives a feasible (upper-bound) answer and the result says so.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

EXACT_MAX_ITEMS = 64
#: with selective options the cover is exact over at most this many kinds of layers (any number of each)
EXACT_MAX_GROUPS = 8
INF = float("inf")


@dataclass(frozen=True, slots=True)
class RecomputeChoice:
    time_ms: float  # recompute ms of the chosen layers (INF if infeasible)
    layers: tuple[int, ...]  # fully recomputed layer indices, ascending
    exact: bool
    selective: tuple[int, ...] = ()  # selectively recomputed layer indices, ascending


NO_RECOMPUTE = RecomputeChoice(0.0, (), True)
INFEASIBLE = RecomputeChoice(INF, (), True)


def _cover(items: list[tuple[float, float, int]], target: float) -> tuple[float, tuple[int, ...]]:
    """Least total cost of items (cost, gain, idx) whose gains sum to >= target (exact).

    Consecutive items with equal (cost, gain) -- a transformer's identical blocks -- are taken
    as one group of k copies (k = 1 .. n, lowest indices first), so that n identical items
    cost O(n) front updates instead of O(n^2)."""
    if target <= 0:
        return 0.0, ()
    if sum(g for _, g, _ in items) < target:
        return INF, ()
    groups: list[tuple[float, float, list[int]]] = []
    for cost, gain, idx in items:
        if groups and groups[-1][0] == cost and groups[-1][1] == gain:
            groups[-1][2].append(idx)
        else:
            groups.append((cost, gain, [idx]))
    # front: list of (cost, gain, chosen) with cost ascending and gain strictly ascending
    front: list[tuple[float, float, tuple[int, ...]]] = [(0.0, 0.0, ())]
    best: tuple[float, tuple[int, ...]] = (INF, ())
    for cost, gain, idxs in groups:
        shifted = []
        for c, g, chosen in front:
            if c + cost >= best[0]:
                break
            for k in range(1, len(idxs) + 1):
                nc = c + k * cost
                if nc >= best[0]:
                    break
                ng = g + k * gain
                if ng >= target:
                    best = (nc, chosen + tuple(idxs[:k]))
                    break
                shifted.append((nc, ng, chosen + tuple(idxs[:k])))
        merged = sorted(front + shifted, key=lambda p: (p[0], -p[1]))
        front = []
        top = -1.0
        for point in merged:
            if point[1] > top:
                front.append(point)
                top = point[1]
    return best[0], tuple(sorted(best[1]))


def _greedy_cover(items: list[tuple[float, float, int]], target: float) -> tuple[float, tuple[int, ...]]:
    if target <= 0:
        return 0.0, ()
    chosen, total_cost, total_gain = [], 0.0, 0.0
    for cost, gain, idx in sorted(items, key=lambda it: (it[0] / it[1], it[2])):
        chosen.append(idx)
        total_cost += cost
        total_gain += gain
        if total_gain >= target:
            return total_cost, tuple(sorted(chosen))
    return INF, ()


def choose_recompute(
    *,
    fwd_ms: list[float],
    saved_bytes: list[float],
    input_bytes: list[float],
    first_layer: int,
    inflight: int,
    excess_bytes: float,
    core_ms: list[float] | None = None,
    core_bytes: list[float] | None = None,
    shared_bytes: list[float] | None = None,
) -> RecomputeChoice:
    """Least-time recompute levels for one stage.

    ``saved_bytes``/``input_bytes`` are per micro-batch (already x b) for the stage's layers
    (``first_layer`` is the index of the first), ``excess_bytes`` = memory without recompute
    minus the cap (<= 0 means it fits as is). ``core_ms`` / ``core_bytes``: per layer the
    attention core's forward ms and bytes per micro-batch (0 bytes: no selective level).
    ``shared_bytes``: per layer the bytes of its saves a later layer of the stage also saves,
    which recomputing it fully does not free (``CostModel.shared_out``; the working set is
    still all it saves).
    """
    if excess_bytes <= 0:
        return NO_RECOMPUTE
    if shared_bytes is not None and any(shared_bytes):
        freed = [s - k for s, k in zip(saved_bytes, shared_bytes)]
    else:
        freed = saved_bytes
    if core_ms is not None and core_bytes is not None and any(c > 0 for c in core_bytes):
        return _choose_levels(fwd_ms, saved_bytes, input_bytes, core_ms, core_bytes, first_layer, inflight, excess_bytes,
                              freed)
    candidates = [
        (fwd_ms[i], inflight * (freed[i] - input_bytes[i]), first_layer + i, saved_bytes[i])
        for i in range(len(fwd_ms))
        if inflight * (freed[i] - input_bytes[i]) > 0
    ]
    if not candidates:
        return INFEASIBLE
    exact = len(candidates) <= EXACT_MAX_ITEMS
    solve = _cover if exact else _greedy_cover
    workspaces = sorted({c[3] for c in candidates})
    best = INFEASIBLE
    by_ws = sorted(candidates, key=lambda c: c[3])
    keys = [c[3] for c in by_ws]
    for ws in workspaces:
        upto = bisect.bisect_right(keys, ws)
        items = [(c[0], c[1], c[2]) for c in by_ws[:upto]]
        # cheapest first makes the front's early exits effective; ties by layer index
        items.sort(key=lambda it: (it[0], -it[1], it[2]))
        cost, chosen = solve(items, excess_bytes + ws)
        if cost < best.time_ms or (cost == best.time_ms and cost < INF and chosen < best.layers):
            best = RecomputeChoice(cost, chosen, exact)
    return best


#: one option of a layer: (cost ms, gain bytes, working set bytes, selective?)
Option = tuple[float, float, float, bool]


def _layer_options(
    fwd_ms: list[float], saved: list[float], inputs: list[float], core_ms: list[float], core_bytes: list[float],
    inflight: int, freed: list[float],
) -> list[tuple[Option, ...]]:
    """Per layer its recompute options with a positive gain: full, then selective."""
    out = []
    for i in range(len(fwd_ms)):
        opts: list[Option] = []
        if inflight * (freed[i] - inputs[i]) > 0:
            opts.append((fwd_ms[i], inflight * (freed[i] - inputs[i]), saved[i], False))
        if core_bytes[i] > 0:
            opts.append((core_ms[i], inflight * core_bytes[i], core_bytes[i], True))
        out.append(tuple(opts))
    return out


@functools.lru_cache(maxsize=4096)
def _group_combos(opts: tuple[Option, ...], n: int) -> list[tuple[float, float, int, int]]:
    """The non-dominated ways to recompute ``n`` identical layers: (cost, gain, number full,
    number selective), cost ascending and gain strictly ascending, nothing-at-all left out."""
    full = next((o for o in opts if not o[3]), None)
    sel = next((o for o in opts if o[3]), None)
    combos = []
    for kf in range(n + 1 if full else 1):
        for ks in range(n - kf + 1 if sel else 1):
            if kf or ks:
                cost = (kf * full[0] if full else 0.0) + (ks * sel[0] if sel else 0.0)
                gain = (kf * full[1] if full else 0.0) + (ks * sel[1] if sel else 0.0)
                combos.append((cost, gain, kf, ks))
    combos.sort(key=lambda c: (c[0], -c[1], -c[2]))
    out: list[tuple[float, float, int, int]] = []
    top = -1.0
    for combo in combos:
        if combo[1] > top:
            out.append(combo)
            top = combo[1]
    return out


def _least_in_group(
    opts: tuple[Option, ...], n: int, bases: np.ndarray, target: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each gain in ``bases``, the cheapest split of ``n`` identical layers into full /
    selective / none whose gains, added to it, reach ``target``: (cost, number full, number
    selective), cost inf where none does. Every number of full layers, each with the fewest
    selective ones that reach the target, vectorised."""
    full = next((o for o in opts if not o[3]), None)
    sel = next((o for o in opts if o[3]), None)
    kf = np.arange(n + 1, dtype=float) if full else np.zeros(1)
    got = bases[:, None] + kf[None, :] * (full[1] if full else 0.0)
    cost = kf * (full[0] if full else 0.0)
    if sel is None:
        ks = np.zeros_like(got)
        ok = got >= target
    else:
        ks = np.maximum(0.0, np.ceil((target - got) / sel[1]) - 1.0)
        for _ in range(2):  # the float sum decides, as the oracles sum
            ks = ks + (got + ks * sel[1] < target)
        ks = np.where(got >= target, 0.0, ks)
        ok = ks <= n - kf[None, :]
    total = np.where(ok, cost[None, :] + ks * (sel[0] if sel else 0.0), INF)
    best = np.argmin(total, axis=1)  # the fewest full layers among the cheapest
    rows = np.arange(len(bases))
    return total[rows, best], kf[best], ks[rows, best]


def _cover_levels(
    groups: list[tuple[tuple[Option, ...], list[int]]], target: float
) -> tuple[float, tuple[int, ...], tuple[int, ...]]:
    """Least total cost of at most one option per layer whose gains sum to >= target (exact).

    ``groups``: layers with the same options (a transformer's identical blocks), indices
    ascending; a group's ways to split into full / selective / none are its non-dominated
    combinations (:func:`_group_combos`; full on its lowest indices, then selective). The
    largest group is searched directly for each point of the Pareto front of (cost, gain) over
    the others (:func:`_least_in_group`)."""
    if target <= 0:
        return 0.0, (), ()
    if sum(len(idxs) * max(o[1] for o in opts) for opts, idxs in groups) < target:
        return INF, (), ()
    big = max(range(len(groups)), key=lambda g: (len(groups[g][1]), -g))
    combos = {g: [(0.0, 0.0, 0, 0), *_group_combos(opts, len(idxs))] for g, (opts, idxs) in enumerate(groups) if g != big}
    # the front over the other groups: (cost, gain, the combination picked in each)
    front: list[tuple[float, float, tuple[tuple[int, int, int], ...]]] = [(0.0, 0.0, ())]
    for g, options in combos.items():
        grown = [(c + cc, gg + ga, (*picks, (g, kf, ks))) for c, gg, picks in front for cc, ga, kf, ks in options]
        grown.sort(key=lambda p: (p[0], -p[1]))
        front, top = [], -1.0
        for point in grown:
            if point[1] > top:
                front.append(point)
                top = point[1]
    opts, idxs = groups[big]
    costs, kfs, kss = _least_in_group(opts, len(idxs), np.array([p[1] for p in front]), target)
    totals = np.array([p[0] for p in front]) + costs
    at = int(np.argmin(totals))  # the cheapest; on a tie, the front's cheaper point
    if not totals[at] < INF:
        return INF, (), ()
    best = (float(totals[at]), (*front[at][2], (big, int(kfs[at]), int(kss[at]))))
    full: list[int] = []
    sel: list[int] = []
    for g, kf, ks in best[1]:
        full += groups[g][1][:kf]
        sel += groups[g][1][kf : kf + ks]
    return best[0], tuple(sorted(full)), tuple(sorted(sel))


def _greedy_levels(
    layers: list[tuple[int, tuple[Option, ...]]], target: float
) -> tuple[float, tuple[int, ...], tuple[int, ...]]:
    """A feasible (not always least) choice: options by ms per byte, a layer's option replaced
    by a later one of larger gain."""
    if target <= 0:
        return 0.0, (), ()
    chosen: dict[int, Option] = {}
    order = sorted(((o, idx) for idx, opts in layers for o in opts), key=lambda oi: (oi[0][0] / oi[0][1], oi[1]))
    for opt, idx in order:
        if idx in chosen and chosen[idx][1] >= opt[1]:
            continue
        chosen[idx] = opt
        if sum(o[1] for o in chosen.values()) >= target:
            full = tuple(sorted(i for i, o in chosen.items() if not o[3]))
            sel = tuple(sorted(i for i, o in chosen.items() if o[3]))
            return sum(o[0] for o in chosen.values()), full, sel
    return INF, (), ()


def _choose_levels(
    fwd_ms: list[float], saved: list[float], inputs: list[float], core_ms: list[float], core_bytes: list[float],
    first_layer: int, inflight: int, excess_bytes: float, freed: list[float],
) -> RecomputeChoice:
    """:func:`choose_recompute` with selective options: for each largest working set ``W``
    (over both levels), the least-cost multiple-choice cover of ``excess + W`` by the options
    whose working set is at most ``W``."""
    members: dict[tuple[Option, ...], list[int]] = {}
    for i, opts in enumerate(_layer_options(fwd_ms, saved, inputs, core_ms, core_bytes, inflight, freed)):
        if opts:
            members.setdefault(opts, []).append(first_layer + i)
    if not members:
        return INFEASIBLE
    workspaces = sorted({o[2] for opts in members for o in opts})
    exact = len(members) <= EXACT_MAX_GROUPS or sum(len(v) for v in members.values()) <= EXACT_MAX_ITEMS
    best = INFEASIBLE
    for ws in workspaces:
        groups: dict[tuple[Option, ...], list[int]] = {}
        for opts, idxs in members.items():
            allowed = tuple(o for o in opts if o[2] <= ws)
            if allowed:
                groups.setdefault(allowed, []).extend(idxs)
        if exact:
            cost, full, sel = _cover_levels([(o, sorted(i)) for o, i in groups.items()], excess_bytes + ws)
        else:
            cost, full, sel = _greedy_levels([(i, o) for o, idxs in groups.items() for i in idxs], excess_bytes + ws)
        if cost < best.time_ms or (cost == best.time_ms and cost < INF and (full, sel) < (best.layers, best.selective)):
            best = RecomputeChoice(cost, full, exact, sel)
    return best


@dataclass(frozen=True, slots=True)
class LevelCover:
    """One workspace's cover of :func:`_choose_levels` for one stage and in-flight count, with
    everything that does not depend on the excess worked out: the front over the groups other
    than the largest, and that group's options. :func:`level_cover_costs` prices it for many
    targets at once with the same float operations as :func:`_cover_levels` (the same least
    cost, bit for bit); which layers reach it is left to :func:`choose_recompute`."""

    workspace_bytes: float
    most_gain_bytes: float  # every layer's largest gain summed: above it nothing covers
    front_ms: tuple[float, ...]  # the front over the other groups, cost ascending
    front_gain_bytes: tuple[float, ...]
    count: int  # layers in the largest group
    full: tuple[float, float] | None  # (ms, gain bytes) of its full level, if any
    sel: tuple[float, float] | None  # the same for its selective level

    @property
    def params(self) -> tuple[float, ...]:
        """(count, most full layers, full ms, full gain, has selective, selective ms, selective
        gain (1 where none: never used), most gain): one row of :func:`level_cover_costs`."""
        full, sel = self.full, self.sel
        return (float(self.count), float(self.count if full else 0), full[0] if full else 0.0, full[1] if full else 0.0,
                1.0 if sel else 0.0, sel[0] if sel else 0.0, sel[1] if sel else 1.0, self.most_gain_bytes)


def layer_options(fwd_ms: float, saved_bytes: float, input_bytes: float, core_ms: float, core_bytes: float,
                  inflight: int) -> tuple[Option, ...]:
    """One layer's recompute options with a positive gain (full, then selective), as
    :func:`choose_recompute` makes them where no save is shared."""
    return _layer_options([fwd_ms], [saved_bytes], [input_bytes], [core_ms], [core_bytes], inflight, [saved_bytes])[0]


def level_covers(runs: Sequence[tuple[tuple[Option, ...], int]]) -> tuple[LevelCover, ...] | None:
    """The excess-free part of :func:`choose_recompute`'s selective path for a stage given as
    runs of identical layers in order, ``(options, count)`` (:func:`layer_options`), one
    :class:`LevelCover` per workspace (``()``: no layer can free anything; None: the cover is
    not exact there, the greedy runs, so :func:`choose_recompute` must be called)."""
    members: dict[tuple[Option, ...], int] = {}  # layers per options, in order of first appearance
    for opts, count in runs:
        if opts:
            members[opts] = members.get(opts, 0) + count
    if not members:
        return ()
    if len(members) == 1:  # one kind of layer (a run of identical blocks): no front over other groups
        ((opts, count),) = members.items()
        return tuple(LevelCover(ws, count * most, (0.0,), (0.0,), count, full, sel)
                     for ws, most, full, sel in _one_group_levels(opts))
    if not (len(members) <= EXACT_MAX_GROUPS or sum(members.values()) <= EXACT_MAX_ITEMS):
        return None
    out = []
    for ws in sorted({o[2] for opts in members for o in opts}):
        by_opts: dict[tuple[Option, ...], int] = {}
        for opts, count in members.items():
            allowed = tuple(o for o in opts if o[2] <= ws)
            if allowed:
                by_opts[allowed] = by_opts.get(allowed, 0) + count
        groups = list(by_opts.items())
        most = sum(count * max(o[1] for o in opts) for opts, count in groups)
        big = max(range(len(groups)), key=lambda g: (groups[g][1], -g))
        front = [(0.0, 0.0)]  # as _cover_levels builds it, without the picks
        for g, (opts, count) in enumerate(groups):
            if g == big:
                continue
            options = [(0.0, 0.0), *((c, gain) for c, gain, _, _ in _group_combos(opts, count))]
            grown = sorted(((c + cc, gg + ga) for c, gg in front for cc, ga in options), key=lambda p: (p[0], -p[1]))
            front, top = [], -1.0
            for point in grown:
                if point[1] > top:
                    front.append(point)
                    top = point[1]
        opts, count = groups[big]
        full, sel = _levels(opts)
        out.append(LevelCover(ws, most, tuple(p[0] for p in front), tuple(p[1] for p in front), count, full, sel))
    return tuple(out)


@functools.lru_cache(maxsize=1024)
def _one_group_levels(opts: tuple[Option, ...]) -> tuple[tuple[float, float, tuple[float, float] | None,
                                                            tuple[float, float] | None], ...]:
    """Per workspace of ``opts`` (ascending), as :func:`level_covers` builds a stage of layers
    all with ``opts``: the workspace, the largest gain of an option within it, and the (ms, gain)
    of its full and selective levels within it (None: none)."""
    out = []
    for ws in sorted({o[2] for o in opts}):
        allowed = tuple(o for o in opts if o[2] <= ws)
        out.append((ws, max(o[1] for o in allowed), *_levels(allowed)))
    return tuple(out)


def _levels(opts: tuple[Option, ...]) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """The (ms, gain) of the full and of the selective level among ``opts`` (None: none)."""
    full = next(((o[0], o[1]) for o in opts if not o[3]), None)
    sel = next(((o[0], o[1]) for o in opts if o[3]), None)
    return full, sel


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
        nothing does): :func:`_cover_levels`'s cost, with :func:`_least_in_group`'s operations
        on arrays padded over the rows (padding costs inf, so it never wins)."""
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
