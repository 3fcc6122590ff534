"""The busiest stage's floor of a one-chunk-per-rank configuration, stage by stage: no partition
of it (any recomputation) has every stage's time at most ``X`` when this says so, and a witness
that some partition fits at all.

A stage ``[i, j)`` holding ``k`` micro-batches whole and ``p`` past their I within ``cap`` takes
``T = C(i, j) + r`` ms, ``r`` its least recomputation (:func:`~planner.solve.recompute.choose_recompute`),
which frees at least ``e / k`` bytes per micro-batch, ``e = static + p keep + k act - cap`` (its
bytes over the cap without any; W's inputs are kept recomputed or not), and no more than the
stage's ``gain``. Any choice freeing ``x`` bytes per micro-batch takes at least ``R(x)``, the
least time of any layers freeing ``x`` in fractions (:func:`~planner.solve.rank_memory.recompute_curve`,
convex). So ``T <= X`` only where ``e <= k min(gain, R^-1(X - C))``: :func:`stage_fits_within`,
a mask per stage; where no partition into ``P`` stages is made of such stages
(:func:`~planner.solve.prices.fits.reaches`), every partition has a stage over ``X``. The chain DP's
optimum, its re-solve at a zero-bubble stage's conservative counts (more bytes: slower), and the
baselines' partitions (:func:`~planner.solve.proposals.fixed_split`, the same least recomputation)
then all have their busiest rank above ``X`` (one stage per rank): ``M X`` above what the
search's check lets through (:meth:`~planner.solve.config_search.ConfigSearch.keep`).

Whether such a configuration fits at all still decides which of its ZeRO 3 variants the search
solves, so it is skipped unsolved only where :func:`surely_fits`: some partition fits with
every layer at its leanest level and the largest working set of its layers
(``e + W <= k gain``: the cover of every option is one choice, so the least one exists).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from planner.schedule import Held
from planner.solve.prices import StageTable
from planner.solve.prices.fits import reaches
from planner.solve.rank_memory import Curve, recompute_curve

__all__ = ["busiest_stage_above", "skippable", "stage_fits_within", "surely_fits", "table_curve"]

#: relative slack on times and bytes: the floor may only err towards "might fit" (float rounding)
SLACK = 1e-9


def table_curve(table: StageTable) -> Curve:
    """The least ms of recomputation freeing ``x`` bytes per micro-batch from the table's layers
    (its own recompute prices: under ZeRO 3 those of :meth:`CostModel.recompute_prices`)."""
    core = table.core if table.selective else np.zeros_like(table.core)
    core_ms = table.core_ms if table.selective else np.zeros_like(table.core_ms)
    return recompute_curve(table.fwd, np.maximum(table.saved - table.inputs, 0.0), core_ms, core)


def freed_within(curve: Curve, ms: np.ndarray) -> np.ndarray:
    """The most bytes per micro-batch any recomputation taking at most ``ms`` frees
    (``R^-1``; where ``ms < 0``, -1: none is that fast), at most the curve's last point."""
    xs, ys = curve
    start = int(np.searchsorted(ys, 0.0, side="right")) - 1  # the free segments' end (R = 0 up to xs[start])
    x = np.interp(np.maximum(ms, 0.0), ys[start:], xs[start:]) if start < len(xs) - 1 else np.full(ms.shape, xs[-1])
    out: np.ndarray = np.where(ms >= 0, x * (1 + SLACK), -1.0)
    return out


def stage_fits_within(table: StageTable, curve: Curve, held: Sequence[Held], limit_ms: float) -> list[np.ndarray]:
    """Per stage ``s`` (``held[s]``: its counts at its peak), the stages ``[i, j)`` whose time
    might be at most ``limit_ms`` (module docstring; every one whose time is, and more)."""
    slack_ms = limit_ms * (1 + SLACK) - table.compute
    frees = freed_within(curve, np.where(table.valid, slack_ms, -1.0))
    frees = np.minimum(frees, table.gain * (1 + SLACK)) if table.allow_recompute else np.minimum(frees, 0.0)

    def mask(h: Held, cap: float) -> np.ndarray:
        per = table.held(h.pending)
        out: np.ndarray = (frees >= 0) & (per.static + h.whole * per.act - cap * (1 + SLACK) <= h.whole * frees)
        return out

    return _per_stage(table, held, mask)


def _per_stage(table: StageTable, held: Sequence[Held], mask: Callable[[Held, float], np.ndarray]) -> list[np.ndarray]:
    """``mask(held[s], cap of s)`` per stage, computed once per distinct (counts, cap)."""
    found: dict[tuple[int, int, float], np.ndarray] = {}
    out = []
    for s, h in enumerate(held):
        cap = table.cap_of(s)
        key = (h.whole, h.pending, cap)
        if key not in found:
            found[key] = mask(h, cap)
        out.append(found[key])
    return out


def busiest_stage_above(table: StageTable, curve: Curve, held: Sequence[Held], limit_ms: float) -> bool:
    """Every partition into ``len(held)`` stages (one per rank) has a stage slower than
    ``limit_ms``, whatever its recomputation (:func:`stage_fits_within`)."""
    P = len(held)
    return P > table.L or not reaches(stage_fits_within(table, curve, held, limit_ms), table.L, P)


def surely_fits(table: StageTable, held: Sequence[Held], workspace: np.ndarray) -> bool:
    """Some partition into ``len(held)`` stages fits each stage's cap at ``held[s]`` with every
    layer at its leanest level and ``workspace`` (per stage, its layers' largest working set:
    :func:`largest_workspace`) besides: then the chain DP has a plan at those counts (and at any
    counts below). Only a witness: False says nothing."""
    P = len(held)
    if P > table.L:
        return False

    def mask(h: Held, cap: float) -> np.ndarray:
        per = table.held(h.pending)
        leanest = h.whole * table.gain if table.allow_recompute else 0.0
        out: np.ndarray = table.valid & ((per.static + h.whole * per.act + workspace - leanest) * (1 + 1e-6) <= cap)
        return out

    return reaches(_per_stage(table, held, mask), table.L, P)


def largest_workspace(table: StageTable) -> np.ndarray:
    """Per stage ``[i, j)``, the largest working set of recomputing any of its layers (a layer's
    saved bytes, or its attention core's; 0 where the table does not recompute)."""
    L = table.L
    per_layer = np.maximum(table.saved, table.core if table.selective else 0.0)
    out = np.zeros((L + 1, L + 1))
    if not table.allow_recompute:
        return out
    for i in range(L):
        out[i, i + 1:] = np.maximum.accumulate(per_layer[i:])
    return out


def skippable(table: StageTable, held: Sequence[Held], sure_held: Sequence[Held], limit_ms: float,
              curves: dict[int, Curve], workspaces: dict[int, np.ndarray]) -> bool:
    """Every partition into ``len(held)`` stages has a stage slower than ``limit_ms``
    (:func:`busiest_stage_above`) and some partition surely fits at ``sure_held``
    (:func:`surely_fits`): a configuration solving nothing a search can use. ``curves`` and
    ``workspaces``: the caller's, per table (by id), its :func:`table_curve` and
    :func:`largest_workspace`, worked out here once each."""
    curve = curves.get(id(table))
    if curve is None:
        curve = curves[id(table)] = table_curve(table)
    if not busiest_stage_above(table, curve, held, limit_ms):
        return False
    workspace = workspaces.get(id(table))
    if workspace is None:
        workspace = workspaces[id(table)] = largest_workspace(table)
    return surely_fits(table, sure_held, workspace)
