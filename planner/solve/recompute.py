"""Which layers of a stage to recompute: an exact 0/1 covering knapsack.

A stage holding ``k`` micro-batches of size ``b`` in flight must fit in ``cap`` bytes:

    static + buffers + k b (A - sum_{l in R} (saved_l - input_l)) + b max_{l in R} saved_l <= cap

and recomputing layer ``l`` costs its forward time ``f_l`` in every backward. We minimise
``sum_{l in R} f_l``. The max term (the recompute working set: the saved tensors of the layer
being recomputed) is handled exactly by enumerating the largest recomputed layer ``W``: only
layers with ``saved_l <= saved_W`` may join, and the working set is ``b saved_W``. For each
``W`` the rest is a min-cost cover (``sum gain_l >= target``) solved by a Pareto front of
(cost, gain) points, with gains above the target clipped (the standard exact DP over
non-dominated states; Kellerer, Pferschy & Pisinger, *Knapsack Problems*, 2004, sec. 2.3).

Above :data:`EXACT_MAX_ITEMS` candidate layers the front can grow exponentially; there a
greedy by ms per byte saved gives a feasible (upper-bound) answer and the result says so.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

EXACT_MAX_ITEMS = 64
INF = float("inf")


@dataclass(frozen=True, slots=True)
class RecomputeChoice:
    time_ms: float  # sum of forward ms of the recomputed layers (INF if infeasible)
    layers: tuple[int, ...]  # layer indices, ascending
    exact: bool


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
) -> RecomputeChoice:
    """Least-time recompute set for one stage.

    ``saved_bytes``/``input_bytes`` are per micro-batch (already x b) for the stage's layers
    (``first_layer`` is the index of the first), ``excess_bytes`` = memory without recompute
    minus the cap (<= 0 means it fits as is).
    """
    if excess_bytes <= 0:
        return NO_RECOMPUTE
    candidates = [
        (fwd_ms[i], inflight * (saved_bytes[i] - input_bytes[i]), first_layer + i, saved_bytes[i])
        for i in range(len(fwd_ms))
        if inflight * (saved_bytes[i] - input_bytes[i]) > 0
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
