"""What a rank's memory makes it work at least: per pipeline rank, the inverse ``g^-1`` of the
least time per micro-batch in which it does work ``w`` within its cap (recomputing what does not
fit), and the time at which the ranks' works reach the profile's. The memory floor of
:meth:`planner.solve.floors.ConfigFacts.memory_bound` (ordering) and
:meth:`~planner.solve.floors.ConfigFacts.memory_floor_ms` (skipping) are built on it.

``g(w) = w + R(max(0, H(w) - cap) / k)``: ``H`` the least bytes any share of the layers with
work ``w`` holds with ``k`` micro-batches in flight (:func:`least_bytes`),
``R`` the least recomputation time freeing that much per micro-batch
(:func:`planner.solve.floors.recompute_curve`); convex and piecewise linear, so its inverse is
given by breakpoints ``(t, w)``, linear between.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import numpy as np

from planner.artifacts.kinds import ChunkPlacement
from planner.cost import CostModel
from planner.solve.arrays import distinct
from planner.solve.space import Config

#: breakpoints (bytes freed per micro-batch, ms) of planner.solve.floors.recompute_curve
Curve = tuple[np.ndarray, np.ndarray]
#: breakpoints (t, w) of a g^-1
Inverse = tuple[np.ndarray, np.ndarray]


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
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
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
    return tuple(h.most_whole for h in c.held())


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
    """Per row of :meth:`ConfigFacts.layer_arrays <planner.solve.floors.ConfigFacts.layer_arrays>`
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
    :func:`solve_config <planner.solve.candidates.solve_config>` returns a solution only where one
    does (the first solve's where it fits every state, else the re-solve's, above them all): ``c``
    has none, nor any proposal. ``rows``: the busy layers' rows (work, state, lean, keep, equal
    layers summed); ``layers``: every layer's state, lean and keep bytes; ``most``: each count's
    and cap's most work and layers, kept."""
    share = cap / c.layout.virtual_stages_per_rank
    layer_work, state, lean, keep = rows
    total, count = 0.0, 0
    for h in c.held():
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
