"""Per-stage replication: the chain DP over (layer, devices used) of PipeDream's optimizer
(Narayanan et al. 2019, "PipeDream: Generalized Pipeline Parallelism for DNN Training",
section 3.1), priced with our flushed schedules (GPipe, 1F1B) instead of PipeDream's
asynchronous steady state.

A pipeline of ``N`` devices in which stage ``s`` (layers ``[i, j)``) has ``R_s`` copies;
``M`` global micro-batches of ``b`` samples run round-robin over each stage's copies (see
:mod:`planner.schedule.build`), so one copy does ``M / R_s`` of them. Objective (the
replicated form of :mod:`planner.solve.chain_dp`'s J: one micro-batch crosses every stage,
and the busiest copy's work per micro-batch paces the rest):

    J = sum_s (T_s + c_s + X_s) + (M - 1) max_s T_s / R_s

with ``T_s`` the stage's compute per micro-batch (forward + backward + least recompute that
fits one copy's memory), ``c_s`` the boundary transfer forward + backward between the first
ranks of stages ``s`` and ``s + 1``, and ``X_s`` the part of the stage's gradient
synchronisation over its ``R_s`` ranks that the backward of the layers before it cannot hide.

Stages are laid out on consecutive ranks, stage 0 first, so the stage that starts at layer
``i`` when ``n`` devices carry layers ``i..L-1`` occupies ranks ``N - n .. N - n + R - 1``.
One copy's peak in-flight micro-batches then depends only on ``(n, R)``: ``M / R`` for GPipe,
``min(M / R, ceil(min(M, n) / R))`` for 1F1B (:func:`planner.schedule.replicated_warmup`).
The DP table, for a per-copy bottleneck cap ``t``::

    f[L][0] = 0
    f[i][n] = min_{j > i, R | M, R <= n, T_R(i, j) / R <= t} T_R(i, j) + c(j; n, R) + X_R(i, j; n) + f[j][n - R]

and ``J = min_t f[0][N] + (M - 1) t``, the caps visited downwards from the least feasible one
exactly as :func:`planner.solve.chain_dp._minimize` does (each visit jumps to the largest
candidate below the solution's own bottleneck, and stops once ``(M - 1)`` times the least
possible cap cannot beat the best). Exact for J for a given micro-batch size, schedule and
ZeRO stage; the simulator then judges the result beside the uniform plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.artifacts.request import ScheduleKind
from planner.cost import CostModel, allreduce_line, link_of, p2p_ms
from planner.solve.arrays import distinct
from planner.solve.chain import ChainSolution
from planner.solve.prices import StageTable, exposure
from planner.solve.recompute import INF

__all__ = ["ReplicatedSolution", "solve_replicated"]


@dataclass(frozen=True, slots=True)
class ReplicatedSolution:
    solution: ChainSolution
    replicas: tuple[int, ...]


def _inflight(schedule: ScheduleKind, m: int, n: int, d: int) -> int:
    if schedule is ScheduleKind.GPIPE:
        return m // d
    return min(m // d, -(-min(m, n) // d))


class _Pricing:
    """Per (n, R): the stage-time table of one copy and the extra terms c + X, as matrices."""

    def __init__(self, tables: dict[int, StageTable], schedule: ScheduleKind, num_devices: int, m: int,
                 limits: dict[int, float]):
        self.tables = tables
        self.schedule = schedule
        self.N = num_devices
        self.m = m
        self.limits = limits
        any_table = next(iter(tables.values()))
        self.cm: CostModel = any_table.cm
        self.L = any_table.L
        self.b = any_table.b
        self._t: dict[tuple[int, int], np.ndarray] = {}
        self._extra: dict[tuple[int, int], np.ndarray] = {}

    def times(self, n: int, d: int) -> np.ndarray:
        key = (n, d)
        if key not in self._t:
            table = self.tables[d]
            at = (_inflight(self.schedule, self.m, n, d), table.cap)
            self._t[key] = table.tables([at], self.limits[d])[at]
        return self._t[key]

    def extra(self, n: int, d: int) -> np.ndarray:
        """c(j; n, R) + X_R(i, j; n) for a stage on ranks N - n .. N - n + R - 1."""
        key = (n, d)
        if key in self._extra:
            return self._extra[key]
        cm, table = self.cm, self.tables[d]
        first = self.N - n
        cut = cm.cut_bytes_per_sample
        comm = np.zeros(self.L + 1)
        if n > d:  # a next stage exists, on rank first + d
            bw, lat = link_of(cm.cluster, first, first + d)
            comm = np.array([2.0 * p2p_ms(c * self.b, bandwidth_gb_per_s=bw, latency_us=lat) for c in cut])
            comm[self.L] = 0.0
        self._extra[key] = comm[None, :] + exposure(table, allreduce_line(cm.cluster, range(first, first + d)))
        return self._extra[key]


def _dp(
    pr: _Pricing, counts: Sequence[int], cap: float, spare: bool = False
) -> tuple[float, list[tuple[int, int, int, int]]]:
    """One pass of the table for one per-copy cap: f[0][N] and its stages as (start, stop, R, n)
    (n: the devices from this stage to the end; empty when nothing fits). With ``spare`` the
    last devices may stay idle (f[L][n] = 0 for every n)."""
    L, N = pr.L, pr.N
    f = np.full((L + 1, N + 1), INF)
    if spare:
        f[L, :] = 0.0
    else:
        f[L, 0] = 0.0
    best_j = np.zeros((L + 1, N + 1), dtype=np.int64)
    best_d = np.zeros((L + 1, N + 1), dtype=np.int64)
    for n in range(1, N + 1):
        col = np.full(L + 1, INF)
        for d in counts:
            if d > n:
                break
            rest = f[:, n - d]
            if not np.isfinite(rest).any():
                continue
            t = pr.times(n, d)
            cand = np.where(t / d <= cap, t, INF) + pr.extra(n, d) + rest[None, :]  # as the caps: t / d
            j = np.argmin(cand, axis=1)
            val = cand[np.arange(L + 1), j]
            better = val < col
            col = np.where(better, val, col)
            best_j[:, n] = np.where(better, j, best_j[:, n])
            best_d[:, n] = np.where(better, d, best_d[:, n])
        f[:L, n] = col[:L]
    total = float(f[0, N])
    stages: list[tuple[int, int, int, int]] = []
    if total < INF:
        i, n = 0, N
        while i < L:
            j, d = int(best_j[i, n]), int(best_d[i, n])
            stages.append((i, j, d, n))
            i, n = j, n - d
    return total, stages


def solve_replicated(
    tables: dict[int, StageTable],
    *,
    num_devices: int,
    num_microbatches: int,
    schedule: ScheduleKind,
    limit_ms: float = INF,
    spare: bool = False,
) -> ReplicatedSolution | None:
    """The exact minimum of J over partitions and per-stage copy counts (or None if nothing
    fits). ``tables[R]`` prices one copy of a stage with R copies (its ZeRO shard count), for
    each copy count R the caller allows (each at most ``num_devices`` and dividing
    ``num_microbatches``: :func:`planner.solve.replicated_search.replica_counts`);
    ``limit_ms`` bounds the iteration time worth finding (stages whose copies would alone
    take longer are not priced with recomputation). With ``spare``, the copies may use fewer
    than ``num_devices`` devices (the last ones stay idle); a 1F1B copy's in-flight count is
    then priced as if the idle devices carried stages (an upper bound: its memory is safe,
    and the plan built from it is priced exactly)."""
    m, N = num_microbatches, num_devices
    counts = sorted(tables)
    assert all(1 <= d <= N and m % d == 0 for d in counts), f"copy counts {counts}: at most {N}, dividing {m}"
    if not counts:
        return None
    # the busiest copy does (M / R) T: stages with T > limit R / M cannot be in a better plan
    limits = {d: (limit_ms * d / m if limit_ms < INF else INF) * (1 + 1e-9) for d in counts}
    pr = _Pricing(tables, schedule, N, m, limits)
    L = pr.L
    if L < 1:
        return None
    fwd, bwd = pr.cm.at_batch(pr.b).times_ms
    cap_lb = max(float(np.max(fwd + bwd)) / max(counts), float(np.sum(fwd + bwd)) / N)
    parts = {}  # per (table, copies): its finite stage times over the copies (one table serves many n)
    for n in range(1, N + 1):
        for d in counts:
            if d <= n:
                t = pr.times(n, d)
                if (id(t), d) not in parts:
                    parts[(id(t), d)] = distinct(t[np.isfinite(t)]) / d
    caps = distinct(np.concatenate(list(parts.values()))) if parts else np.zeros(0)
    if not caps.size:
        return None
    # J >= (M - 1) x the bottleneck: caps above limit / (M - 1) cannot give a better plan
    if m > 1 and limit_ms < INF:
        caps = caps[caps <= limit_ms / (m - 1) * (1 + 1e-9)]
        if caps.size == 0:
            return None
    best: tuple[float, float] | None = None
    cap = float(caps[-1])
    while True:
        total, stages = _dp(pr, counts, cap, spare)
        if total >= INF:
            break
        per_copy = max(float(pr.times(n, d)[i, j]) / d for i, j, d, n in stages)
        value = total + (m - 1) * per_copy
        if best is None or value < best[0]:
            best = (value, cap)
        if total + (m - 1) * cap_lb >= best[0] or m == 1:
            break
        k = int(np.searchsorted(caps, per_copy * (1 - 1e-12), side="left")) - 1
        if k < 0:
            break
        cap = float(caps[k])
    if best is None:
        return None
    _, stages = _dp(pr, counts, best[1], spare)
    bounds = tuple(i for i, _, _, _ in stages)
    replicas = tuple(d for _, _, d, _ in stages)
    times = tuple(float(pr.times(n, d)[i, j]) for i, j, d, n in stages)
    choices = [pr.tables[d].choice_of(_inflight(schedule, m, n, d), i, j) for i, j, d, n in stages]
    recompute = tuple(full for full, _ in choices)
    selective = tuple(sel for _, sel in choices)
    exact = all(t.all_exact for t in tables.values())
    return ReplicatedSolution(ChainSolution(best[0], bounds, recompute, times, exact, selective), replicas)
