"""Exact chain DP over cut points for one configuration (P stages, D replicas, micro-batch b,
schedule), with per-stage recomputation: the recurrence, reading its stage prices from a
:class:`~planner.solve.prices.StageTable` (:mod:`planner.solve.prices`).

The objective (the 1F1B/GPipe pipeline time of Alpa's stage construction, Zheng et al. 2022,
eq. 3, with the boundary transfers on the fill/drain path):

    J = sum_s (T_s + c_s + X_s) + (M - 1) max_s T_s,   T_s = F_s + B_s + RC_s,

where ``c_s`` is the forward + backward transfer across the boundary after stage ``s``,
``X_s = max(0, AR_s - B_<s)`` the part of stage ``s``'s gradient all-reduce that the pipeline
cannot hide (it starts after the stage's last backward, while the last micro-batch's
backward still crosses the layers before the stage: the seed's gradient hiding), and
``RC_s`` the least recompute time that makes stage ``s`` fit its memory cap with ``k_s``
micro-batches in flight (``k_s = M`` for GPipe, ``min(P - s, M)`` for 1F1B): stages are
known by index, so ``k_s`` is known when the stage is priced, which is why the table is
filled from the last stage backwards. Under ZeRO 3 ``F_s`` and ``B_s`` are the times with the
per-layer all-gathers and reduce-scatters the stack does not hide (``F'``, ``B'`` of
:mod:`planner.cost.fsdp`: prefix sums plus terms at a stage's first and last layer), its memory
the sharded state plus the gathered working set, and ``X_s = 0``. ``T_s`` is the table's
(:meth:`StageTable.table`), ``c_s + X_s`` its extras (:func:`planner.solve.prices.stage_extras`).

ZB-H1 (zero bubble, Qi et al., ICLR 2024, sec. 3.1): its bubble is ``(P - 1)(T_F + T_B - T_W)``
where 1F1B's is ``(P - 1)(T_F + T_B + T_W)`` (B the input-gradient pass, W the weight-gradient
pass): each stage's W fills ``2 W_s`` of the fill and drain. So its objective is

    J_zb = sum_s (T_s - Z_s + c_s + X_s) + (M - 1) max_s T_s,   Z_s = min(2 W_s, F_s + B_s + W_s),

with ``W_s`` the stage's weight-gradient time (:meth:`CostModel.stage_wgrad_ms`); every term
stays per stage, so the same table solves it exactly, and ``T_s - Z_s >= RC_s >= 0`` keeps the
bound ``J >= (M - 1) max_s T_s`` that limits the useful stage times. ``k_s`` is the schedule's
count of whole micro-batches, those past I priced at W's inputs in the stage's static bytes
(:func:`planner.schedule.held_counts`, :meth:`StageTable.held`: the exact peak, not the paper's
``p M_B`` bound).

The brute force (:mod:`planner.solve.bruteforce`) and the CP-SAT model (:mod:`planner.solve.ilp`)
solve the same J pricing each stage from the cost model, not from the table; tests hold
DP = brute force = CP-SAT (tests/test_solver_dp.py).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

import numpy as np

from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.layout import Layout
from planner.schedule import Held, held_counts
from planner.solve.arrays import distinct
from planner.solve.chain import ChainSolution, objective_microbatches
from planner.solve.prices import StageTable, stage_extras
from planner.solve.recompute import INF

__all__ = ["least_largest", "solve_chain"]
_Key = TypeVar("_Key", bound=Hashable)  # a stage's key in :func:`_stage_bands`


# The DP table, for a bottleneck cap ``t`` (Alpa's stage construction, Zheng et al. 2022, sec. 5.2)::
#
#     f[P][L] = 0
#     f[s][i] = min_{j > i, T_{k_s}(i, j) <= t} T_{k_s}(i, j) + c_s(j) + X_s(i, j) + f[s + 1][j]
#
# and ``J = min_t f[0][0] + (M - 1) t`` over candidate caps ``t`` (the distinct stage times),
# enumerated downwards from the largest that can still win (:func:`_minimize`: above it, the
# least possible sum plus ``(M - 1) t`` exceeds the objective at the least feasible cap) and
# stopped once ``(M - 1) t`` plus the sum found exceeds the best found. For the optimal
# partition its own max stage time is a candidate cap, so the minimum is exact; ties between
# partitions go to the earliest stop at each stage (``argmin``'s first), the same at every cap.
# Each DP step is one vectorised min over the band of an ``(L + 1) x (L + 1)`` matrix that a stage
# of index ``s`` can start and stop in (every stage holds a layer): :class:`_Bands` holds the
# bands skewed so that a stage's starts are rows and its lengths columns.
# Pruning only skips: a bound (``limit``, ``longest``, the caps' range, the bands) leaves out
# stages or caps that no optimum uses and never changes a price; ties resolve as without it
# (tests/test_solver_dp.py: test_useful_limit_keeps_the_dps_solution, on integer times with many
# ties, and test_band_priced_tables_solve_as_fully_priced_ones, bit for bit; the brute force too).


class _Bands:
    """Every stage's table, and table plus ``extra`` (``c_s + X_s``), over the stages the DP can
    use, stacked ``P x width x K`` once for the DP passes of one set of tables (:meth:`dp` at
    each cap, :meth:`bottleneck`). Stage ``s`` of ``P`` starts at a layer in ``[s, L - P + s]``
    and stops in ``[s + 1, L - P + s + 1]`` (every stage holds a layer; ``width = L - P + 1``
    starts), and holds at most ``K`` layers (``longest``: the caller knows that no longer stage
    is finite at the caps asked); entry ``[s, a, l]`` is the stage starting at ``s + a`` with
    ``l + 1`` layers (inf where that stops beyond the stage's range)."""

    def __init__(self, tables: list[np.ndarray], extra: list[np.ndarray], L: int, longest: int | None = None):
        P = len(tables)
        w = L - P + 1
        K = w if longest is None else max(1, min(w, longest))
        self.P, self.L, self.width, self.K = P, L, w, K
        self.t = _skewed(tables, L, w, K)
        self.t[:, _beyond(w, K)] = INF
        self.te = self.t + _skewed(extra, L, w, K)  # inf where t is (extra is finite)
        self.rows = np.arange(w)
        self.buffer, self.ahead = _window(w, K)

    def largest(self, cap_max: float) -> float | None:
        """The largest finite stage time at most ``cap_max`` (None if none)."""
        t = self.t
        found = float(np.max(np.where((t <= cap_max) & (t < INF), t, -INF), initial=-INF))
        return found if found > -INF else None

    def caps_between(self, lo: float, hi: float) -> np.ndarray:
        """The distinct stage times in ``[lo, hi]`` (candidate caps), ascending."""
        t = self.t
        return distinct(t[(t >= lo) & (t <= hi)])

    def narrowed(self, cap_max: float) -> _Bands:
        """The same bands over the stages no longer than the longest of any stage time at most
        ``cap_max`` (a view: the DP at any cap up to ``cap_max`` is the same)."""
        fits = np.flatnonzero((self.t <= cap_max).any(axis=(0, 1)))
        K = int(fits[-1]) + 1 if fits.size else 1
        if K == self.K:
            return self
        out = object.__new__(_Bands)
        out.P, out.L, out.width, out.K = self.P, self.L, self.width, K
        out.t, out.te, out.rows = self.t[:, :, :K], self.te[:, :, :K], self.rows
        out.buffer, out.ahead = _window(self.width, K)
        return out

    def dp(self, cap: float) -> tuple[float, np.ndarray]:
        """One pass of the table for one cap: the least sum of ``T_s + c_s + X_s`` over the
        partitions with every stage at most ``cap`` (inf if none), and each stage's choice
        (``P x width``: at start ``s + a`` of stage ``s``, its layers less one; the first least
        entry, i.e. the earliest stop)."""
        cand_all = np.where(self.t <= cap, self.te, INF)
        buffer, ahead, rows, w = self.buffer, self.ahead, self.rows, self.width
        buffer[:w] = INF  # f[P] over the stops of the last stage: 0 at L only
        buffer[w - 1] = 0.0
        args = np.empty((self.P, w), dtype=np.intp)
        for s in range(self.P - 1, -1, -1):
            cand = cand_all[s] + ahead
            arg = cand.argmin(axis=1)
            args[s] = arg
            buffer[:w] = cand[rows, arg]
        return float(buffer[0]), args

    def stage_times(self, args: np.ndarray) -> tuple[list[int], list[float]]:
        """The partition ``args`` chooses from layer 0: its stage starts and stage times."""
        bounds, times, i = [], [], 0
        for s in range(self.P):
            a = int(args[s][i - s])
            bounds.append(i)
            times.append(float(self.t[s][i - s, a]))
            i += a + 1
        assert i == self.L, "DP reconstruction did not cover the layers"
        return bounds, times

    def bottleneck(self, cap_max: float) -> float:
        """The least largest stage time of any partition with every stage at most ``cap_max``
        (inf when there is none): the min-max DP over the same stages as :meth:`dp`."""
        capped = np.where(self.t <= cap_max, self.t, INF)
        buffer, ahead, w = self.buffer, self.ahead, self.width
        buffer[:w] = INF
        buffer[w - 1] = -INF
        for s in range(self.P - 1, -1, -1):
            buffer[:w] = np.maximum(capped[s], ahead).min(axis=1)
        return float(buffer[0])


def least_largest(tables: list[np.ndarray], L: int) -> float:
    """The least over the partitions of ``L`` layers into ``len(tables)`` stages (stage ``s``
    priced by ``tables[s][i, j]``, every stage a layer at least) of their largest entry (inf
    where none is finite): the min-max DP of :class:`_Bands`."""
    return _Bands(tables, [np.zeros_like(tables[0])] * len(tables), L).bottleneck(INF)


def _window(w: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """A buffer for ``f`` of the stops of the stage after (``w`` of them, past its end inf), and
    a view of it whose row ``a`` is ``f[a:a + K]``: the stops a stage from each start may reach."""
    buffer = np.full(w + K, INF)
    return buffer, np.lib.stride_tricks.as_strided(buffer, shape=(w, K), strides=(buffer.strides[0],) * 2,
                                                   writeable=False)


def _skewed(matrices: list[np.ndarray], L: int, w: int, K: int) -> np.ndarray:
    """``matrices[s][s + a, s + a + 1 + l]`` at ``[s, a, l]`` (``a < w``, ``l < K``), through a
    view whose rows step down the diagonal (entries stopping beyond ``L`` read other entries of
    the matrix: :func:`_beyond` marks them)."""
    views: dict[int, np.ndarray] = {}
    users: dict[int, list[int]] = {}
    for s, m in enumerate(matrices):
        if id(m) not in views:
            c = np.ascontiguousarray(m)
            step = c.strides[0] + c.strides[1]  # one row down, one column right
            views[id(m)] = np.lib.stride_tricks.as_strided(
                c.reshape(-1)[1:], shape=(len(matrices), w, K), strides=(step, step, c.strides[1]), writeable=False)
        users.setdefault(id(m), []).append(s)
    if len(views) > 3:  # many distinct matrices (1F1B's in-flight counts): one slice each
        return np.stack([views[id(m)][s] for s, m in enumerate(matrices)])
    out = np.empty((len(matrices), w, K))
    for key, stages in users.items():
        out[stages] = views[key][stages]
    return out


def _beyond(w: int, K: int) -> np.ndarray:
    """``[a, l]`` whose stage stops beyond its range (``a + l >= w``)."""
    return np.add.outer(np.arange(w), np.arange(K)) >= w


def _minimize(
    tables: list[np.ndarray], extra: list[np.ndarray], L: int, M: int, cap_max: float, cap_lb: float,
    longest: int | None = None,
) -> tuple[float, float, list[int]] | None:
    """min over caps of J; returns (J, cap at which the optimal partition is found, its stage
    starts) or None.

    Caps are visited downwards, jumping from a solution with largest stage time ``m`` to the
    largest candidate cap below ``m`` (every cap in between gives the same solution), and
    stopping once ``S + (M - 1) cap_lb`` cannot beat the best (S only grows as the cap falls).

    The visit starts below the top: with ``S_min`` the least sum of any partition (the DP at the
    largest cap) and ``J_b`` the objective of the DP's solution at the least feasible cap
    (:meth:`_Bands.bottleneck`), a solution whose largest stage exceeds ``(J_b - S_min) / (M - 1)``
    has ``J > J_b`` and cannot be the minimum (nor tie it), so the visit starts at the largest
    candidate cap below that. The caps visited from there, their solutions and the one returned
    are those of a visit from the top (whose solutions above it only ever lost to ``J_b``).
    ``cap_max``: a stage time no optimal partition exceeds (the caller's bound: a solution with
    a stage above it has ``J`` above an objective the caller knows), so no cap above it is
    visited; ``longest``: no stage with more layers is finite at any cap visited."""
    bands = _Bands(tables, extra, L, longest)
    if M == 1:
        total, args = bands.dp(INF)
        return (total, INF, bands.stage_times(args)[0]) if total < INF else None
    top = bands.largest(cap_max)
    if top is None:
        return None
    least_sum, _ = bands.dp(top)
    if least_sum >= INF:
        return None
    c_min = bands.bottleneck(top)
    if c_min >= INF:
        return None
    total, args = bands.dp(c_min)
    _, times = bands.stage_times(args)
    ceiling = (total + (M - 1) * max(times) - least_sum) / (M - 1)
    # the visit only meets caps in [c_min, ceiling]: the candidate caps there, and bands cut to
    # the stages no slower than the ceiling (the solutions and caps are those of the full bands)
    hi = min(max(ceiling * (1 + 1e-12), c_min), cap_max)
    bands = bands.narrowed(hi)
    caps = bands.caps_between(c_min, hi)
    k = len(caps) - 1
    best: tuple[float, float, list[int]] | None = None
    cap = float(caps[k])
    while True:
        total, args = bands.dp(cap)
        if total >= INF:
            break
        bounds, times = bands.stage_times(args)
        m = max(times)
        value = total + (M - 1) * m
        if best is None or value < best[0]:
            best = (value, cap, bounds)
        if total + (M - 1) * cap_lb >= best[0]:
            break
        k = int(np.searchsorted(caps, m, side="left")) - 1
        if k < 0:
            break
        cap = float(caps[k])
    return best


def _stage_bands(at: Sequence[_Key], layers: np.ndarray, longest: int) -> dict[_Key, np.ndarray]:
    """Per key (``(pending, (inflight, cap))``) of ``at`` (one per stage of ``len(at)``), the stages ``(i, j)`` the
    DP reads from its table (:class:`_Bands`): stage ``s`` starts in ``[s, s + w)`` and stops in
    ``[s + 1, s + w]`` (``w = L - P + 1``), at most ``longest`` layers long (``layers``: each
    stage's, ``j - i`` at ``[i, j]``)."""
    L = len(layers) - 1
    w = L - len(at) + 1
    out: dict[_Key, np.ndarray] = {}
    for s, a in enumerate(at):
        mask = out.get(a)
        if mask is None:
            mask = out[a] = np.zeros((L + 1, L + 1), dtype=bool)
        mask[s:s + w, s + 1:s + w + 1] = True
    short = (layers >= 1) & (layers <= max(1, longest))
    for mask in out.values():
        mask &= short
    return out


def _longest_within(fastest_by_length: np.ndarray, limit: float) -> int:
    """The most layers of any stage whose compute time is at most ``limit`` (0 if none), from
    :attr:`ChainFits.fastest_by_length <planner.solve.prices.fits.ChainFits.fastest_by_length>`."""
    within = np.flatnonzero(fastest_by_length <= limit)
    return int(within[-1]) if len(within) else 0


def _heuristic_starts(work: np.ndarray, L: int, P: int) -> list[list[int]]:
    """Two partitions of ``L`` layers of ``work`` into ``P`` stages of a layer at least, by their
    starts: cut at equal shares of the work (nearest), and at equal numbers of layers."""
    cum = np.concatenate([[0.0], np.cumsum(work)])
    target = cum[-1] * np.arange(1, P) / P
    at = np.clip(np.searchsorted(cum, target), 1, L)
    nearest = np.where(np.abs(cum[at - 1] - target) <= np.abs(cum[at] - target), at - 1, at).tolist()
    by_work = [0]
    for s, x in enumerate(nearest, start=1):
        by_work.append(min(max(int(x), by_work[-1] + 1), L - P + s))
    return [by_work, [s * L // P for s in range(P)]]


def _objective(tables: list[np.ndarray], extra: list[np.ndarray], starts: Sequence[int], L: int, M: int
               ) -> tuple[float, list[float]]:
    """J of the partition with stage starts ``starts`` (inf if a stage is), and its stage times."""
    stops = list(starts[1:]) + [L]
    times = [float(tables[s][i, j]) for s, (i, j) in enumerate(zip(starts, stops))]
    if max(times) == INF:
        return INF, times
    return sum(times) + sum(float(extra[s][i, j]) for s, (i, j) in enumerate(zip(starts, stops))) + (M - 1) * max(times), times


def _useful_limit(tables: list[np.ndarray], extra: list[np.ndarray], starts: list[list[int]], L: int, M: int,
                  sum_lb: float | None) -> float:
    """A stage time above which no stage is in an optimal partition (inf where none is known):
    with ``J_h`` the objective of the best of the partitions ``starts`` and ``sum_lb`` a lower
    bound of any partition's sum, an optimum has ``sum_lb + (M - 1) max_s T_s <= J <= J_h``
    (:func:`_minimize` takes it as its largest cap; with a relative slack of 1e-9)."""
    if M == 1 or sum_lb is None:
        return INF
    best = min(_objective(tables, extra, cut, L, M)[0] for cut in starts)
    return INF if best == INF else (best - sum_lb) / (M - 1) * (1 + 1e-9)


def solve_chain(
    table: StageTable, *, layout: Layout, num_microbatches: int, schedule: ScheduleKind, held: Sequence[Held] = (),
) -> ChainSolution | None:
    """The exact minimum of J for one configuration, or None if nothing fits.

    Interleaved 1F1B (``layout.virtual_stages_per_rank = v > 1``, ``num_stages = P v``): the
    same DP over the P v virtual stages with their counted in-flight micro-batches, and M
    replaced by ``v (M - P) + P``, for which J equals the schedule's ``(M v + P - 1) t`` on
    uniform chunks of time t; the simulator then judges it. The caller gives each chunk its
    share of a rank's memory (``StageTable.stage_caps``; :func:`planner.solve.proposals.rebalanced`).
    ZBV (two chunks per rank in a V) is solved the same way, with ZB-H1's bubble fill; the turn
    of the V (chunks ``P - 1`` and ``P`` on one rank) has no transfer.
    """
    L, P = table.L, layout.num_stages
    if P > L:
        return None
    held = held or held_counts(schedule, layout, num_microbatches)  # (given: solve_config's conservative counts)
    fits = table.chain_fits(held)  # (settles the table's entries first)
    if fits is None:
        return None  # no partition fits even with every layer at its leanest level
    ks, per, keys = [h.whole for h in held], fits.tables, fits.keys
    M = objective_microbatches(layout, num_microbatches)
    extra = stage_extras(table, layout, schedule)  # stages over the same link and line share one
    fwd, bwd = table.cm.at_batch(table.b).times_ms
    whole = float(table.compute[0, L])  # inf when fixed boundaries cut the model: then the layers' sum
    cap_lb = max(float(np.max(fwd + bwd)), (whole if whole < INF else float(np.sum(fwd + bwd))) / P)
    # a lower bound of any partition's sum of T_s + c_s + X_s (- Z_s): its compute is the layers'
    # (prefix sums; not under ZeRO 3, whose terms at a stage's ends are not), recomputation only
    # adds, and each stage's extra is at least its matrix's least entry
    least_extra = {id(e): min(0.0, float(np.min(e))) for e in extra}
    sum_lb = None if table.fsdp else float(np.sum(fwd + bwd)) * (1 - 1e-9) + sum(least_extra[id(e)] for e in extra)
    starts = _heuristic_starts(fwd + bwd, L, P)
    # stages keyed by (their table, in-flight count, cap): a table per pending count
    tab = {key: per[s] for s, key in enumerate(keys)}
    longest = fits.longest  # of any stage that might fit
    plain = [fits.bases[key] for key in keys]
    bands = _stage_bands(keys, table.lengths, longest)
    # the DP over the bases reads no stage longer than any whose compute is within what a
    # partition cutting at equal shares of the work bounds (:func:`_useful_limit`)
    plain_cap = _useful_limit(plain, extra, starts, L, M, sum_lb)
    plain_longest = (min(fits.plain_longest, _longest_within(fits.fastest_by_length, plain_cap)) if plain_cap < INF
                     else fits.plain_longest)
    if not any(bool(np.any(band & fits.needs[key])) for key, band in bands.items() if key in fits.needs):
        # no stage the DP reads fits only with recomputation: its tables are the bases
        tables = plain
        found = _minimize(tables, extra, L, M, plain_cap, cap_lb, plain_longest)
    else:
        # an upper bound from the plan without recomputation bounds the useful stage times:
        # J >= M max_s T_s, so no stage slower than J_ub / M (J_ub when M = 1) can be optimal
        # (no stage longer than any that fits without recomputation is finite there)
        # (none where no partition fits without recomputation: found without building the bands)
        fits_plain = table.could_partition(ks, False, tables=per)
        first = _minimize(plain, extra, L, M, plain_cap, cap_lb, plain_longest) if fits_plain else None
        # (with a relative slack of 1e-9 so that float rounding never drops the bound's own stages)
        per_mb = (M - 1 if schedule.splits_backward else M) if M > 1 else 1
        limit = INF if first is None else first[0] / per_mb * (1 + 1e-9)
        if first is not None and M > 1:
            # tighter: J >= S + (M - 1) max_s T_s with S at least ``sum_lb`` (else the least sum
            # of compute and transfers of any partition: recomputation only adds), so a stage
            # slower than (J_ub - S_least) / (M - 1) makes J > J_ub
            least = sum_lb if sum_lb is not None else _Bands([table.compute] * P, extra, L).dp(INF)[0]
            limit = min(limit, (first[0] - least) / (M - 1) * (1 + 1e-9))
        # a finite entry might fit with recomputation; with M > 1 only entries at most the limit
        # count (the caps), and those compute within it (the bands' longer stages compute above it)
        if M > 1:
            longest = min(longest, _longest_within(fits.fastest_by_length, limit))
        priced = {}
        for pending in dict.fromkeys(key[0] for key in bands):  # one call per table: its stages priced together
            mine = {key[1]: band for key, band in bands.items() if key[0] == pending}
            got = tab[next(key for key in bands if key[0] == pending)].tables(list(mine), limit, mine)
            priced.update({(pending, a): t for a, t in got.items()})
        tables = [priced[key] for key in keys]
        found = _minimize(tables, extra, L, M, limit, cap_lb, longest)
    if found is None:
        return None
    bounds = found[2]
    stops = bounds[1:] + [L]
    choices = [per[s].choice_of(keys[s][1][0], i, j, keys[s][1][1]) for s, (i, j) in enumerate(zip(bounds, stops))]
    recompute = [full for full, _ in choices]
    selective = [sel for _, sel in choices]
    objective, times = _objective(tables, extra, bounds, L, M)
    return ChainSolution(
        objective_ms=objective,
        boundaries=tuple(bounds),
        recompute=tuple(recompute),
        stage_times_ms=tuple(times),
        exact=all(t.all_exact for t in per),
        selective=tuple(selective),
    )
