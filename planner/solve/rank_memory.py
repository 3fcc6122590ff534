"""What a rank's memory makes it work at least: per pipeline rank, the inverse ``g^-1`` of the
least time per micro-batch in which it does work ``w`` within its cap (recomputing what does not
fit), and the time at which the ranks' works reach the profile's. The memory floor of
:meth:`RankMemory.memory_bound_ms` (the search's order) and :meth:`RankMemory.floor_ms` (its
skipping) are built on it, the recomputation curve ``R`` (:func:`recompute_curve`) too.

``g(w) = w + R(max(0, H(w) - cap) / k)``: ``H`` the least bytes any share of the layers with
work ``w`` holds with ``k`` micro-batches in flight (:func:`least_bytes`),
``R`` the least recomputation time freeing that much per micro-batch
(:func:`recompute_curve`); convex and piecewise linear, so its inverse is
given by breakpoints ``(t, w)``, linear between.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from planner.artifacts.kinds import ChunkPlacement
from planner.cost import CostModel
from planner.schedule import held_counts
from planner.solve.arrays import distinct
from planner.solve.space import Config

#: breakpoints (bytes freed per micro-batch, ms) of :func:`recompute_curve`
Curve = tuple[np.ndarray, np.ndarray]
#: breakpoints (t, w) of a g^-1
Inverse = tuple[np.ndarray, np.ndarray]


def recompute_curve(fwd: np.ndarray, gain: np.ndarray, core_ms: np.ndarray, core_bytes: np.ndarray) -> Curve:
    """Breakpoints ``(x, R(x))`` of the least ms per micro-batch in which recomputation frees
    ``x`` bytes per micro-batch, each layer at most once and in any fraction: a layer frees
    ``gain`` at its forward's ``fwd`` ms (full), or ``core_bytes`` at ``core_ms`` (selective),
    or nothing; its lower convex hull of those three points, every layer's segments taken
    cheapest first (a convex piecewise-linear ``R`` from ``(0, 0)``; past the last point, where
    nothing frees more, :func:`recompute_ms` goes on at the last slope)."""
    segments: list[tuple[float, float]] = []  # (ms per byte, bytes)
    layers = zip(fwd.tolist(), np.maximum(gain, 0.0).tolist(), core_ms.tolist(), core_bytes.tolist())
    for (f, g, t, c), count in Counter(layers).items():  # equal layers: one hull, its segments that many times
        hull = [(0.0, 0.0)]
        for x, y in sorted(p for p in ((c, t), (g, f)) if p[0] > 0):
            while len(hull) > 1 and _turn(hull[-2], hull[-1], (x, y)) <= 0:
                hull.pop()  # the point before lies on or above the chord: not on the lower hull
            if x > hull[-1][0]:
                hull.append((x, y))
            elif y < hull[-1][1]:
                hull[-1] = (x, y)
        segments += [((y1 - y0) / (x1 - x0), x1 - x0) for (x0, y0), (x1, y1) in itertools.pairwise(hull)] * count
    segments.sort()
    # segments of one slope as one (equal layers': collinear points dropped, the same function)
    merged = [(r, sum(n for _, n in group)) for r, group in itertools.groupby(segments, key=lambda seg: seg[0])]
    xs = np.concatenate([[0.0], np.cumsum([n for _, n in merged])])
    ys = np.concatenate([[0.0], np.cumsum([r * n for r, n in merged])])
    return xs, ys


def _turn(a: tuple[float, float], b: tuple[float, float], c: tuple[float, float]) -> float:
    """Positive when ``a -> b -> c`` turns left (``b`` below the chord ``a c``)."""
    return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])


def last_slope(xs: Sequence[float] | np.ndarray, ys: Sequence[float] | np.ndarray) -> float:
    """The slope of a curve's last segment of non-zero width (0.0 where none): a floor past its last
    point (nothing frees more than the whole curve, so any slope >= 0 bounds from below). Bytes so
    small that adding them does not move a float leave a last segment of no width (a saved size of
    1.5e-200 bytes, drawn by tests/test_bounds.py), which divided by zero before."""
    for i in range(len(xs) - 1, 0, -1):
        if xs[i] > xs[i - 1]:
            return float((ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1]))
    return 0.0


def recompute_ms(curve: Curve, freed: np.ndarray | float) -> np.ndarray:
    """``R(freed)`` of :func:`recompute_curve`, past its last point at its last slope (a floor:
    nothing frees that much)."""
    xs, ys = curve
    slope = last_slope(xs, ys)
    x = np.asarray(freed, dtype=float)
    out: np.ndarray = np.where(x <= xs[-1], np.interp(x, xs, ys), ys[-1] + slope * (x - xs[-1]))
    return out


def inverse_points(work: list[float], state: list[float], saved: list[float], kmin: int, cap: float,
                   curve: Curve) -> Inverse:
    """Breakpoints ``(t, w)`` of ``g^-1`` for layers of ``work`` ms holding ``state + kmin x
    saved`` bytes within ``cap``: at ``H``'s breakpoints (the fewest bytes per ms first, with the
    point where ``H`` reaches ``cap``) and where ``(H - cap) / kmin`` reaches the curve's, linear
    between. On Python floats: a handful of layer rows and curve points (equal layers summed in
    one row, collinear curve points dropped), where NumPy's calls cost more than the arithmetic."""
    at_w, at_h = least_bytes(work, [s + kmin * a for s, a in zip(state, saved)], cap)
    xs, ys = curve[0].tolist(), curve[1].tolist()
    reach = [cap + kmin * x for x in xs[1:]]
    ws = sorted(set(at_w + [interp(x, at_h, at_w) for x in reach if cap < x < at_h[-1]]))
    slope = last_slope(xs, ys)
    ts = []
    for w in ws:
        x = max(0.0, interp(w, at_w, at_h) - cap) / kmin
        ts.append(w + (interp(x, xs, ys) if x <= xs[-1] else ys[-1] + slope * (x - xs[-1])))
    return np.array(ts), np.array(ws)


def least_bytes(work: Sequence[float], nbytes: Sequence[float], cap: float) -> tuple[list[float], list[float]]:
    """The least bytes any share of the layers with total work ``w`` holds, ``H(w)``, layer
    ``i`` holding ``nbytes[i]`` for its ``work[i] > 0`` and taken in any fraction (so the fewest
    bytes per ms first): breakpoints ``(w, H(w))`` of a convex piecewise-linear function from
    ``(0, 0)`` to the whole profile, with the point where ``H`` reaches ``cap`` among them."""
    at_w, at_h = [0.0], [0.0]
    for i in sorted(range(len(work)), key=lambda i: nbytes[i] / work[i]):
        at_w.append(at_w[-1] + float(work[i]))
        at_h.append(at_h[-1] + float(nbytes[i]))
    k = bisect.bisect_left(at_h, cap)
    if 0 < k < len(at_h) and at_h[k] > cap > at_h[k - 1]:
        at_w.insert(k, at_w[k - 1] + (at_w[k] - at_w[k - 1]) * (cap - at_h[k - 1]) / (at_h[k] - at_h[k - 1]))
        at_h.insert(k, cap)
    return at_w, at_h


def most_work(work: Sequence[float], nbytes: Sequence[float], cap: float) -> float:
    """The most work any share of the layers holds within ``cap``, layer ``i`` holding
    ``nbytes[i]`` for its ``work[i] > 0`` in any fraction (a fractional knapsack: the fewest bytes
    per ms first, :func:`least_bytes`); the whole work where all of it fits."""
    at_w, at_h = least_bytes(work, nbytes, cap)
    return at_w[-1] if at_h[-1] <= cap else interp(cap, at_h, at_w)


def interp(x: float, xp: list[float], fp: list[float]) -> float:
    """``np.interp`` of one value (``xp`` ascending)."""
    if x <= xp[0]:
        return fp[0]
    if x >= xp[-1]:
        return fp[-1]
    j = bisect.bisect_right(xp, x) - 1
    return fp[j] + (fp[j + 1] - fp[j]) * (x - xp[j]) / (xp[j + 1] - xp[j])


def merged_inverse(parts: list[Inverse]) -> Inverse:
    """The inverse of a rank holding several chunks, each within its own cap with its own ``g``
    (``parts``): its least time for work ``w`` is the least over the chunks' shares of the sum
    of their ``g``; each convex and piecewise linear, their segments taken cheapest ms per ms of
    work first (each chunk free to take the lightest layers: a relaxation, never above)."""
    dt = np.concatenate([np.diff(t) for t, _ in parts])
    dw = np.concatenate([np.diff(w) for _, w in parts])
    order = np.argsort(dt / dw, kind="stable")
    return np.concatenate([[0.0], np.cumsum(dt[order])]), np.concatenate([[0.0], np.cumsum(dw[order])])


def held_whole(c: Config) -> tuple[int, ...]:
    """Per stage, micro-batches it holds whole at least at some point: its in-flight count, or
    under a schedule that splits the backward the most whole of its walk (:attr:`Held.most_whole
    <planner.schedule.Held.most_whole>`: those whole just before its first I). Every point of a
    zero-bubble stage's walk fits its cap (:func:`planner.solve.held.fits_every_state`), and
    those past their I keep W's inputs, more bytes, never fewer: each recomputed layer still
    holds ``a - z g >= 0`` of a whole one."""
    return tuple(h.most_whole for h in held_counts(c.schedule, c.layout, c.num_microbatches))


def rank_holds(c: Config) -> list[tuple[int, ...]]:
    """Per pipeline rank, the counts its memory is bounded at (:func:`held_whole`): under the loop
    placement (rank ``r`` holds chunks ``r, r + P, ...``) the fewest any of its chunks holds,
    ``(k_min,)``, the rank within its cap; under ZBV's V (chunks ``r`` and ``2P - 1 - r``) each
    chunk's own count, the larger first, each chunk within ``cap / 2`` (as its stage table
    prices it, :meth:`planner.solve.floors.ConfigFacts.table_of`)."""
    lay, ks = c.layout, held_whole(c)
    if lay.placement is ChunkPlacement.LOOP:
        return [(k,) for k in np.asarray(ks).reshape(-1, lay.pipeline_size).min(axis=0).tolist()]
    return [tuple(sorted((ks[s] for s in lay.stage_indices(r)), reverse=True)) for r in range(lay.pipeline_size)]


def lean_saved_rows(cm: CostModel, microbatch_size: int) -> tuple[list[float], list[float], np.ndarray, np.ndarray]:
    """Per row of :meth:`RankMemory.layer_arrays`
    (busy layers, equal ones summed, in its order), per micro-batch: their saved bytes less the
    most recomputation frees of them (fully: saved less input; selectively: the attention core),
    and what each keeps past its I for its W (:meth:`CostModel.keep_bytes` layer by layer: their
    sum is at most any stage's); then the same two per layer, every layer."""
    b = microbatch_size
    fwd, bwd = cm.at_batch(b).times_ms
    saved = cm.at_batch(b).saved_bytes
    core = cm.at_batch(b).core_bytes if cm.selective else np.zeros_like(saved)
    lean = np.maximum(saved - np.maximum(np.maximum(saved - cm.input_per_sample * b, 0.0), core), 0.0)
    keep = np.array([cm.keep_bytes(i, i + 1, b) for i in range(cm.num_layers)])
    busy = (fwd + bwd) > 0
    params = layer_params(cm)
    rows: dict[tuple[float, float, float], tuple[float, float]] = {}
    for i in np.flatnonzero(busy).tolist():
        row = (float(fwd[i] + bwd[i]), float(params[i]), float(saved[i]))
        had = rows.get(row, (0.0, 0.0))
        rows[row] = (had[0] + float(lean[i]), had[1] + float(keep[i]))
    return [r[0] for r in rows.values()], [r[1] for r in rows.values()], lean, keep


def layer_params(cm: CostModel) -> np.ndarray:
    """Per layer its parameters, a tie's counted once (as a stage holding several of its layers does)."""
    params = cm.param_count.astype(float)
    for tie in cm.profile.tied:
        params[list(tie.layers)] -= tie.param_count
    out: np.ndarray = np.maximum(params, 0.0)
    return out


def stages_hold_work(c: Config, rows: tuple[list[float], list[float], list[float], list[float]],
                     layers: tuple[np.ndarray, np.ndarray, np.ndarray], cap: float, work: float,
                     most: dict[tuple[object, ...], tuple[float, int]]) -> bool:
    """The stages of ``c`` can hold the profile between them, each within its table's share of the
    cap (``cap`` over the chunks per rank) at every one of its held states (:attr:`Held.states`:
    ``whole`` micro-batches with every layer at its leanest level, ``state + whole x lean``, and
    ``pending`` past I keeping W's inputs, ``pending x keep``, which no recomputation frees): its
    ``work`` with each stage its share of the layers in any fractions (at most :func:`most_work`
    at each state), and its layers whole (a stage holds at most as many as its fewest-byte layers
    that fit). Where either falls short, no partition fits every state at any recomputation, and
    :func:`solve_config <planner.solve.optimum.solve_config>` returns a solution only where one
    does (the first solve's where it fits every state, else the re-solve's, above them all): ``c``
    has none, nor any proposal. ``rows``: the busy layers' rows (work, state, lean, keep, equal
    layers summed); ``layers``: every layer's state, lean and keep bytes; ``most``: each count's
    and cap's most work and layers, kept."""
    share = cap / c.layout.virtual_stages_per_rank
    layer_work, state, lean, keep = rows
    total, count = 0.0, 0
    enough, num_layers = work * (1 - 1e-9), len(layers[0])
    for h in held_counts(c.schedule, c.layout, c.num_microbatches):
        if total >= enough and count >= num_layers:
            return True  # the stages after only add (each >= 0; a float sum of them never falls)
        least, fewest = math.inf, len(layers[0])
        for whole, pending in h.states:
            key = (id(state), whole, pending, share)
            found = most.get(key)
            if found is None:
                nbytes = [s + whole * a + pending * k for s, a, k in zip(state, lean, keep)]
                each = np.sort(layers[0] + whole * layers[1] + pending * layers[2])
                found = most[key] = (most_work(layer_work, nbytes, share), int(np.searchsorted(np.cumsum(each), share,
                                                                                                side="right")))
            least, fewest = min(least, found[0]), min(fewest, found[1])
        total += least
        count += fewest
    return total >= work * (1 - 1e-9) and count >= len(layers[0])


def works_reach_ms(inverses: list[tuple[np.ndarray, np.ndarray, np.ndarray]], M: int, work: float) -> float:
    """The least ``T`` at which ranks waiting ``a_r`` and then doing ``M`` micro-batches of
    ``g_r`` can do ``work`` between them: ``works(T) = sum_r g_r^-1((T - a_r) / M)`` reaches it.
    ``inverses``: per group of ranks with one ``g``, its breakpoints ``(t, w)`` and the ranks'
    waits ``a``. ``works`` is piecewise linear between the ranks' breakpoints ``a_r + M t`` and
    increasing, so a search over at most 32 probes a round (a call per group a round, not per
    probe), then linear between the two breakpoints around it."""
    Ts = distinct(np.concatenate([(a[:, None] + M * g[None, :]).ravel() for g, _, a in inverses]))

    def works(at: np.ndarray) -> np.ndarray:  # works(T) at breakpoints Ts[at]
        T = Ts[at]
        total: np.ndarray = sum(np.interp((T[None, :] - a[:, None]) / M, g, w).sum(axis=0) for g, w, a in inverses)
        return total

    target, lo, hi = work * (1 - 1e-12), 0, len(Ts)
    while lo < hi:
        probes = distinct(np.linspace(lo, hi - 1, num=min(32, hi - lo)).astype(np.int64))
        reached = np.flatnonzero(works(probes) >= target)
        if not len(reached):
            lo = int(probes[-1]) + 1
        else:
            j = int(reached[0])
            lo, hi = (int(probes[j - 1]) + 1 if j else lo), int(probes[j])
    k = lo
    if k == 0:
        return float(Ts[0])
    if k >= len(Ts):  # unreachable: at the largest breakpoint some rank takes all the work
        return 0.0
    (w0, w1), T0, T1 = works(np.array([k - 1, k])), float(Ts[k - 1]), float(Ts[k])
    return T0 + (T1 - T0) * (float(work) - float(w0)) / (float(w1) - float(w0))


@dataclass(frozen=True, slots=True)
class RankMemory:
    """The memory floors of the configurations of one cost model ``cm`` (the searched one) within
    a per-device ``cap_bytes`` (``unique_params``: the profile's parameters, a tie's counted
    once): as time for the search's order (:meth:`memory_bound_ms`) and its skipping
    (:meth:`floor_ms`), each figure they are built on worked out once per shape it depends on
    (the dicts, filled as asked)."""

    cm: CostModel
    cap_bytes: float
    unique_params: float
    #: per (micro-batch size, state bytes per parameter), :meth:`layer_arrays`
    per_size: dict[tuple[int, float], tuple[float, float, Curve, list[float], list[float], list[float]]] = field(
        default_factory=dict)
    #: breakpoints (t, w) of a rank's g^-1 per (micro-batch size, state bytes per parameter, k_min, cap)
    inverses: dict[tuple[object, ...], Inverse] = field(default_factory=dict)
    most: dict[tuple[object, ...], tuple[float, int]] = field(default_factory=dict)  # stages_hold_work's per (key, counts, cap)
    #: ranks_bound per (key, each rank's counts, micro-batches, waits): what it reads of a configuration
    bounds: dict[tuple[object, ...], float] = field(default_factory=dict)
    #: lean_saved_rows per micro-batch size
    leans: dict[int, tuple[list[float], list[float], np.ndarray, np.ndarray]] = field(default_factory=dict)
    states: dict[tuple[int, float], np.ndarray] = field(default_factory=dict)  # per layer its state bytes, per (b, kappa)

    def memory_bound_ms(self, c: Config, kappa: float, fills: np.ndarray) -> float:
        """The memory floor as time of ``c`` (GPipe, 1F1B, interleaved 1F1B: the caller's; its state
        at ``kappa`` bytes per parameter, the leanest variant solved). Devices short of memory recompute: a layer
        recomputed (a fraction ``z`` of it, fully or selectively) still holds ``a - z g >= 0``
        of its saved bytes ``a`` per micro-batch in flight (``g``: what that level frees), at
        ``z f`` ms per micro-batch. Counting every layer's held bytes for ``k_min`` micro-batches,
        no more than any stage of the devices holds, they still fit ``cap`` only if the
        recomputation frees at least ``(H - cap) / k_min`` bytes per micro-batch (``H``: their
        bytes counted so, without any), which takes at least ``R`` of it: the least time any
        layers' recomputation freeing that much per micro-batch takes (:func:`recompute_curve`,
        each layer once, fractions allowed; its first slope is the cheapest ms per byte of any
        layer, the one figure this took before: GPT-3's head frees bytes at 28 ms / GB, its blocks
        at 50, so past the head's 0.1 GB the old floor counted half). (Counted at ``k_min``, freeing is priced at
        ``k_min`` too: pricing it at the largest count, as before, divided this floor by up to
        ``k_max / k_min``, 16 on an interleaved rank.) Two relaxations, the larger counts:

        - summed over the ranks: every rank fits ``cap``, so all recomputation together frees
          at least what the stages would hold without any (the model state once, sharded as
          the leanest variant solved, plus every layer's saved bytes for the fewest
          micro-batches any stage holds) less ``P x cap``, over that fewest count; the busiest
          rank does at least 1 / P of the pipeline's ``M x (work + recomputation)``;
        - rank by rank: a rank given work ``w`` holding at least ``k_min`` micro-batches in every
          stage holds at least ``H(w)`` bytes, the least any share of the layers with that work
          holds (layer ``i``: ``kappa p_i + k_min a_i`` bytes for its work ``w_i``, state and
          saved activations; fractions of layers allowed, so the lightest bytes per ms are
          taken first: a convex piecewise-linear ``H``, :func:`~planner.solve.rank_memory.least_bytes`). It takes ``g_r(w) =
          w + R(max(0, H(w) - cap) / k_min)`` per micro-batch (convex, increasing), ``M g_r(w)`` between its first
          operation and its last, and waits ``a_r`` besides, the first ``r`` layers' forward and
          backward (:func:`~planner.solve.floors.chunk_fill_bound_ms`'s argument: the chunks before its first hold at
          least a layer each; one stage per rank alike), so ``T >= a_r + M g_r(w_r)``. The
          ranks' works sum to the profile's, so ``T`` is at least the ``T`` at which the works
          ``g_r^-1((T - a_r) / M)`` sum to it: both the fill and the memory floor of each rank
          count (the deep ranks, whose last chunks hold few micro-batches and so bound little
          memory, are the ones that wait). (Taking each layer's share at the least bytes per ms
          of any layer instead, one atypical layer, a GPT's embedding with its few saved bytes
          per ms, made the floor vanish.) ``fills``: per rank its ``a_r``
          (:func:`~planner.solve.floors.rank_fills_ms`)."""
        cm, b, lay = self.cm, c.microbatch_size, c.layout
        key = (b, kappa)
        work, saved_total, curve, _, _, _ = self.layer_arrays(key)
        if curve[1][-1] <= 0:
            return 0.0  # recomputation frees nothing, or costs nothing: not bounded here
        ks = tuple(h.inflight for h in held_counts(c.schedule, c.layout, c.num_microbatches))
        P, M, cap = lay.pipeline_size, c.num_microbatches, self.cap_bytes
        out = 0.0
        # context parallelism's gathered keys and values: one layer's per stage, live while it runs
        floor = kappa * self.unique_params + lay.num_stages * cm.gather_bytes_per_sample * b + min(ks) * saved_total
        if floor > P * cap:
            out = M * (work + float(recompute_ms(curve, (floor - P * cap) / min(ks)))) / P
        return max(out, self.ranks_bound(c, key, fills))

    def layer_arrays(self, key: tuple[int, float]) -> tuple[float, float, Curve, list[float], list[float], list[float]]:
        """Per (micro-batch size, state bytes per parameter): the profile's work and saved bytes,
        the recomputation curve, and the busy layers' work, state and saved bytes (equal layers
        summed in one row)."""
        found = self.per_size.get(key)
        if found is None:
            cm, (b, kappa) = self.cm, key
            at = cm.at_batch(b)
            fwd, bwd = at.times_ms
            saved = at.saved_bytes
            gain_full = saved - cm.input_per_sample * b
            cores = (at.core_ms, at.core_bytes) if cm.selective else (np.zeros_like(fwd), np.zeros_like(fwd))
            curve = recompute_curve(fwd, gain_full, *cores)
            layer_work = fwd + bwd
            busy = layer_work > 0
            params = layer_params(cm)  # a stage holding several of a tie's layers counts it once
            # equal layers as one row of their summed work and bytes (taken in fractions, any share
            # of their work holds the same bytes): a GPT's 96 blocks, one row
            rows = Counter(zip(layer_work[busy].tolist(), params[busy].tolist(), saved[busy].tolist()))
            found = self.per_size[key] = (float(layer_work.sum()), float(saved.sum()), curve,
                                          [w * n for (w, _, _), n in rows.items()],
                                          [kappa * p * n for (_, p, _), n in rows.items()],
                                          [a * n for (_, _, a), n in rows.items()])
        return found

    def ranks_bound(self, c: Config, key: tuple[int, float], fills: np.ndarray) -> float:
        """:meth:`memory_bound_ms`' rank-by-rank relaxation: rank r waits a_r (``fills``: the first r
        layers' forward and backward, :func:`~planner.solve.floors.rank_fills_ms`; zeros for
        :meth:`floor_ms`) besides
        M g_r(w_r); each distinct count's (:func:`rank_holds`) breakpoints (t, w) of its g^-1, a
        piecewise-linear increasing function (w <= the profile's work); the T at which the
        ranks' works reach the profile's (:func:`works_reach_ms`); once per what it reads of ``c``
        (ZBV and DualPipe-V hold the same whole micro-batches: one bound)."""
        per_rank = rank_holds(c)
        asked = (key, tuple(per_rank), c.num_microbatches, fills.tobytes())  # ZBV's and DualPipe-V's alike
        found = self.bounds.get(asked)
        if found is None:
            work, _, _, _, _, _ = self.layer_arrays(key)
            ranks: dict[tuple[int, ...], list[float]] = {}
            for r, holds in enumerate(per_rank):
                ranks.setdefault(holds, []).append(float(fills[r]))
            inverses = [(*self.rank_inverse(key, holds), np.array(waits)) for holds, waits in ranks.items()]
            found = self.bounds[asked] = works_reach_ms(inverses, c.num_microbatches, work)
        return found

    def rank_inverse(self, key: tuple[int, float], holds: tuple[int, ...]) -> Inverse:
        """A rank's g^-1 (:func:`rank_holds`): one count, :meth:`inverse` within the cap; one per
        chunk, each chunk's within its share of the cap, merged (:func:`merged_inverse`)."""
        if len(holds) == 1:
            return self.inverse(key, holds[0])
        found = self.inverses.get((key, holds))
        if found is None:
            found = self.inverses[(key, holds)] = merged_inverse(
                [self.inverse(key, k, self.cap_bytes / len(holds)) for k in holds])
        return found

    def inverse(self, key: tuple[int, float], kmin: int, cap: float | None = None) -> Inverse:
        """Breakpoints (t, w) of a rank's g^-1 holding at least ``kmin`` micro-batches in every
        stage within ``cap`` (the device's by default) (:meth:`memory_bound_ms`; per ``key``,
        ``kmin`` and ``cap``; :func:`inverse_points`)."""
        cap = self.cap_bytes if cap is None else cap
        found = self.inverses.get((key, kmin, cap))
        if found is None:
            _, _, curve, layer_work, state, saved = self.layer_arrays(key)
            found = self.inverses[(key, kmin, cap)] = inverse_points(layer_work, state, saved, kmin, cap, curve)
        return found

    def floor_ms(self, c: Config, kappa: float) -> float:
        """The memory floor as time of ``c`` with no waits, each rank's chunks holding the
        micro-batches :func:`held_whole` counts, its state at ``kappa`` bytes per parameter
        (:meth:`ConfigFacts.memory_floor_ms <planner.solve.floors.ConfigFacts.memory_floor_ms>`):
        :meth:`ranks_bound` with ``a_r = 0``; inf where the stages cannot hold the profile between
        them (:meth:`ranks_hold_the_work`), 0 where recomputation frees nothing."""
        key = (c.microbatch_size, kappa)
        _, _, curve, _, _, _ = self.layer_arrays(key)
        if curve[1][-1] <= 0 or min(held_whole(c)) < 1:
            return 0.0  # recomputation frees nothing, or costs nothing: not bounded here
        if not self.ranks_hold_the_work(c, key):
            return math.inf  # no partition fits, at any recomputation: no proposal at all
        return self.ranks_bound(c, key, np.zeros(c.layout.pipeline_size))

    def ranks_hold_the_work(self, c: Config, key: tuple[int, float]) -> bool:
        """:func:`~planner.solve.rank_memory.stages_hold_work` of ``c`` at ``key`` (each stage's most
        work and layers worked out once per count and cap)."""
        work, _, _, layer_work, state, _ = self.layer_arrays(key)
        if key[0] not in self.leans:
            self.leans[key[0]] = lean_saved_rows(self.cm, key[0])
        lean, keep, lean_l, keep_l = self.leans[key[0]]
        if key not in self.states:
            self.states[key] = key[1] * layer_params(self.cm)
        return stages_hold_work(c, (layer_work, state, lean, keep), (self.states[key], lean_l, keep_l), self.cap_bytes,
                                work, self.most)
