"""Brute-force oracle: every cut set and every recompute mask (small cases only).

It prices the same objective as :mod:`planner.solve.chain_dp` directly from the cost model
(``CostModel.stage_memory`` for feasibility), so tests can hold DP = CP-SAT = brute force.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.layout import Layout
from planner.cost import link_of, p2p_ms
from planner.schedule import inflight_counts
from planner.solve.chain_dp import ChainSolution, StageTable, exposed_allreduce_ms

MAX_LAYERS = 12
INF = float("inf")


def best_stage(table: StageTable, start: int, stop: int, inflight: int) -> tuple[float, tuple[int, ...]]:
    """Least T = F + B + RC over every recompute mask of one stage that fits (inf if none)."""
    cm, b = table.cm, table.b
    compute = cm.stage_fwd_ms(start, stop, b) + cm.stage_bwd_ms(start, stop, b)
    layers = range(start, stop)
    masks: Iterable[tuple[int, ...]] = [()] if not table.allow_recompute else (
        combo for r in range(len(layers) + 1) for combo in itertools.combinations(layers, r)
    )
    best: tuple[float, tuple[int, ...]] = (INF, ())
    for mask in masks:
        if cm.stage_memory(start, stop, mask, b, inflight, table.sharding).total_bytes > table.cap:
            continue
        t = compute + cm.recompute_ms(mask, b)
        if t < best[0]:
            best = (t, mask)
    return best


def solve_chain_bruteforce(
    table: StageTable, *, layout: Layout, num_microbatches: int, schedule: ScheduleKind
) -> ChainSolution | None:
    """The least J of one configuration over every cut set and recompute mask (one stage per
    rank: GPipe and 1F1B)."""
    cm, L, P, M, b = table.cm, table.L, layout.num_stages, num_microbatches, table.b
    if L > MAX_LAYERS:
        raise PlannerInputError(f"brute force handles at most {MAX_LAYERS} layers (profile has {L})")
    if P > L:
        return None
    ks = inflight_counts(schedule, layout, M)
    best: ChainSolution | None = None
    for cuts in itertools.combinations(range(1, L), P - 1):
        bounds = (0, *cuts)
        stops = (*cuts, L)
        if any(not table.valid[a, z] for a, z in zip(bounds, stops)):
            continue
        stages = [best_stage(table, a, z, ks[s]) for s, (a, z) in enumerate(zip(bounds, stops))]
        if any(t == INF for t, _ in stages):
            continue
        comm = 0.0
        for s, z in enumerate(stops[:-1]):
            bw, lat = link_of(cm.cluster, layout.rank_of(stage_idx=s), layout.rank_of(stage_idx=s + 1))
            comm += 2.0 * p2p_ms(float(cm.cut_bytes_per_sample[z]) * b, bandwidth_gb_per_s=bw, latency_us=lat)
        times = [t for t, _ in stages]
        exposed = sum(
            exposed_allreduce_ms(cm, a, z, s, layout, b) for s, (a, z) in enumerate(zip(bounds, stops))
        )
        value = sum(times) + comm + exposed + (M - 1) * max(times)
        if best is None or value < best.objective_ms:
            best = ChainSolution(value, bounds, tuple(m for _, m in stages), tuple(times), True)
    return best
