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

The selective path's excess-free part (:func:`level_covers`, one :class:`LevelCover` per working
set) is priced for many stages at once by :mod:`planner.solve.prices.layers` (the stage tables'
recompute prices, the same least time).

Above :data:`EXACT_MAX_ITEMS` candidate layers (with selective options: and more than
:data:`EXACT_MAX_GROUPS` kinds of layer) the front can grow exponentially; there a greedy by ms
per byte saved gives a feasible (upper-bound) answer and the result says so.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from planner.artifacts.caches import register_function

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
#: a layer's figures (forward ms, saved bytes, input bytes, attention core ms, attention core bytes)
Layer = tuple[float, float, float, float, float]


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


Point = TypeVar("Point", bound=tuple[Any, ...])


def cost_gain_front(points: list[Point]) -> list[Point]:
    """The Pareto front of (cost ``p[0]``, gain ``p[1]``) points: by cost, each point whose gain
    exceeds every cheaper one's (ties: the larger gain first)."""
    front: list[Point] = []
    top = -1.0
    for point in sorted(points, key=lambda p: (p[0], -p[1])):
        if point[1] > top:
            front.append(point)
            top = point[1]
    return front


@functools.lru_cache(maxsize=4096)
def group_combos(opts: tuple[Option, ...], n: int) -> list[tuple[float, float, int, int]]:
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
    combinations (:func:`group_combos`; full on its lowest indices, then selective). The
    largest group is searched directly for each point of the Pareto front of (cost, gain) over
    the others (:func:`_least_in_group`)."""
    if target <= 0:
        return 0.0, (), ()
    if sum(len(idxs) * max(o[1] for o in opts) for opts, idxs in groups) < target:
        return INF, (), ()
    big = max(range(len(groups)), key=lambda g: (len(groups[g][1]), -g))
    combos = {g: [(0.0, 0.0, 0, 0), *group_combos(opts, len(idxs))] for g, (opts, idxs) in enumerate(groups) if g != big}
    # the front over the other groups: (cost, gain, the combination picked in each)
    front: list[tuple[float, float, tuple[tuple[int, int, int], ...]]] = [(0.0, 0.0, ())]
    for g, options in combos.items():
        front = cost_gain_front([(c + cc, gg + ga, (*picks, (g, kf, ks))) for c, gg, picks in front
                                 for cc, ga, kf, ks in options])
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


def layer_options(fwd_ms: float, saved_bytes: float, input_bytes: float, core_ms: float, core_bytes: float,
                  inflight: int) -> tuple[Option, ...]:
    """One layer's recompute options with a positive gain (full, then selective), as
    :func:`choose_recompute` makes them where no save is shared."""
    return _layer_options([fwd_ms], [saved_bytes], [input_bytes], [core_ms], [core_bytes], inflight, [saved_bytes])[0]


register_function("solve.recompute.group_combos", group_combos, key="(a layer's options, number of identical layers)")


@dataclass(frozen=True, slots=True)
class LevelCover:
    """One workspace's cover of the selective path of
    :func:`choose_recompute` for one stage and in-flight count, with
    everything that does not depend on the excess worked out: the front over the groups other
    than the largest, and that group's options. :func:`planner.solve.prices.layers.level_cover_costs` prices it for many
    targets at once with the same float operations as that path's cover (the same least cost,
    bit for bit); which layers reach it is left to ``choose_recompute``."""

    workspace_bytes: float
    most_gain_bytes: float  # every layer's largest gain summed: above it nothing covers
    front_ms: tuple[float, ...]  # the front over the other groups, cost ascending
    front_gain_bytes: tuple[float, ...]
    count: int  # layers in the largest group
    full: tuple[float, float] | None  # (ms, gain bytes) of its full level, if any
    sel: tuple[float, float] | None  # the same for its selective level
    #: (count, most full layers, full ms, full gain, has selective, selective ms, selective gain
    #: (1 where none: never used), most gain): one row of level_cover_costs, derived from the above
    params: tuple[float, ...] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        full, sel, count = self.full, self.sel, self.count
        object.__setattr__(self, "params", (
            float(count), float(count if full else 0), full[0] if full else 0.0, full[1] if full else 0.0,
            1.0 if sel else 0.0, sel[0] if sel else 0.0, sel[1] if sel else 1.0, self.most_gain_bytes))


def level_covers(runs: Sequence[tuple[Layer, int]], inflight: int) -> tuple[LevelCover, ...] | None:
    """The excess-free part of :func:`choose_recompute`'s selective path for a stage with
    ``inflight`` micro-batches, given as runs of identical layers in order, ``(layer, count)``
    (a :data:`Layer`: its figures, whose options :func:`layer_options` makes), one
    :class:`LevelCover` per workspace (``()``: no layer can free anything; None: the cover is not
    exact there, the greedy runs, so :func:`choose_recompute` must be called)."""
    members: dict[tuple[Option, ...], int] = {}  # layers per options, in order of first appearance
    for layer, count in runs:
        opts = layer_options(*layer, inflight)
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
            options = [(0.0, 0.0), *((c, gain) for c, gain, _, _ in group_combos(opts, count))]
            front = cost_gain_front([(c + cc, gg + ga) for c, gg in front for cc, ga in options])
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


register_function("solve.recompute.one_group_levels", _one_group_levels, key="a layer's options")
