"""What a configuration's ranks wait and work at least, whatever its partition: the fill bounds
the search orders and prunes configurations by (:class:`planner.solve.floors.ConfigFacts`), and
the busiest rank's floor of whole layers. Each is a bound over every partition, recomputation
and ZeRO variant of the configuration (``tests/test_search_pruning.py`` checks each below every
candidate's simulated time)."""

from __future__ import annotations

import bisect

import numpy as np

from planner.cost import CostModel
from planner.solve.space import Config

__all__ = ["busiest_rank_floor_ms", "chunk_fill_bound_ms", "rank_fills_ms", "shared_fill_ms", "split_fill_bound_ms"]


def chunk_fill_bound_ms(cm: CostModel, c: Config) -> float:
    """No interleaved 1F1B plan of ``c`` simulates faster (whatever its partition). Pipeline rank
    ``r`` runs chunks ``r, r + P, ...``; its first operation is a forward, which waits for the
    forwards of chunks ``0 .. r - 1`` of that micro-batch, and after its last (a backward: every
    forward is followed by its backward on the same rank) the backwards of chunks ``r - 1 .. 0``
    of that micro-batch still run. Every chunk holds a layer, so those chunks hold at least the
    first ``r`` layers: ``T >= a_r + M W_r``, ``a_r`` the first ``r`` layers' forward + backward,
    ``W_r`` the rank's work per micro-batch. The ranks' works sum to at least the profile's
    ``W``, so the busiest of these bounds is at least the ``T`` at which ``sum_r max(0, T - a_r)
    = M W`` (recomputation, transfers and synchronisation only add). Against the average-work
    bound ``M W / P`` it adds about half the interleaved bubble when chunks are about a layer each
    (deep pipelines: e.g. +24% at P = 64, v = 2, M = 64)."""
    a = [float(x) for x in rank_fills_ms(cm, c)]  # ascending: layer work >= 0
    return shared_fill_ms(a, c.num_microbatches * cm.at_batch(c.microbatch_size).work_ms)


def split_fill_bound_ms(cm: CostModel, c: Config) -> float:
    """No zero-bubble plan of ``c`` simulates faster, whatever its partition. Rank ``r``'s first
    operation is a forward of its first chunk, chunk ``r``, behind the forwards of chunks
    ``0 .. r - 1`` of that micro-batch (after its last input-gradient pass a rank can still run
    weight-gradient passes, so nothing is owed at the end): ``T >= F_<r + M W_r``.

    One chunk per rank (ZB-H1, ZB-H2), ``F_<r`` is the forward of every layer before rank
    ``r``'s stage: with layers taken in fractions (a relaxation), given ``T`` each rank reaching
    furthest is best (its stop ``x + (T - F(x)) / M`` grows with its start ``x``, a forward being
    at most its layer's work), so ``T`` is bisected to the least at which ``P`` ranks cover the
    work. On ``P`` equal stages of forward share ``f`` this is about ``M W / P + f W / 2``: half
    of ZB-H1's fill on uniform stages, where 1F1B's bound counts a whole micro-batch (``W``).
    ZBV (two chunks per rank, the second in the model's second half): only the first ``r``
    layers' forward (a layer per chunk at least), :func:`shared_fill_ms`."""
    fp, _ = cm.at_batch(c.microbatch_size).prefix_ms
    b, M, P = c.microbatch_size, c.num_microbatches, min(c.layout.pipeline_size, len(fp) - 1)
    need = M * cm.at_batch(b).work_ms
    if c.layout.virtual_stages_per_rank > 1:
        return shared_fill_ms([float(x) for x in fp[:P]], need)
    fwd, bwd = cm.at_batch(b).times_ms
    work = [0.0, *np.cumsum(fwd + bwd).tolist()]  # F(x): the forward done by work x, interpolated
    fwds = [float(x) for x in fp]
    total = work[-1]

    last, find = len(work) - 1, bisect.bisect_right

    def covered(t: float) -> bool:
        x = 0.0
        for _ in range(P):
            i = min(find(work, x), last)  # F(x), inline (the bisection's hot loop)
            span = work[i] - work[i - 1]
            f = fwds[i - 1] + (fwds[i] - fwds[i - 1]) * ((x - work[i - 1]) / span if span > 0 else 1.0)
            x += max(0.0, t - f) / M
            if x >= total:
                return True
        return False

    lo, hi = need / P, need / P + fwds[-1]  # F_<r <= the whole forward
    while hi - lo > 1e-6 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if covered(mid) else (mid, hi)
    return lo * (1 - 1e-9)


def shared_fill_ms(a: list[float], need: float) -> float:
    """The least ``T`` with ``T >= a_r + w_r`` on every rank for works ``w_r >= 0`` summing to
    ``need`` (``a`` ascending): the ``T`` at which ``sum_r max(0, T - a_r) = need``."""
    for k in range(len(a), 0, -1):  # the ranks whose a_r is below T share the work
        t = (need + sum(a[:k])) / k
        if t >= a[k - 1]:
            return t
    return need


def busiest_rank_floor_ms(work: np.ndarray, num_ranks: int) -> float:
    """No one of ``num_ranks`` ranks holding whole layers of ``work`` ms between them (in any
    chunks, contiguous or not) has less than this: among the ``k`` layers of most work some rank
    holds ``ceil(k / R)``, so at least the ``ceil(k / R)`` lightest of them (the classical bound
    of scheduling on identical machines, over every ``k``). With layers of about equal work it
    is ``ceil(L / R)`` layers where the average counts ``L / R``: 98 layers over 64 ranks, 2
    against 1.53."""
    desc = np.sort(np.asarray(work, dtype=float))[::-1]
    prefix = np.concatenate([[0.0], np.cumsum(desc)])
    k = np.arange(1, len(desc) + 1)
    q = -(-k // num_ranks)
    return float(np.max(prefix[k] - prefix[k - q], initial=0.0)) * (1 - 1e-9)


def rank_fills_ms(cm: CostModel, c: Config) -> np.ndarray:
    """Per pipeline rank ``r``, ``a_r``: the first ``r`` layers' forward + backward, what rank
    ``r`` waits at least before its first operation and after its last (the chunks before its
    first hold a layer each)."""
    fp, bp = cm.at_batch(c.microbatch_size).prefix_ms
    P = min(c.layout.pipeline_size, len(fp))
    fills: np.ndarray = fp[:P] + bp[:P]
    return fills


