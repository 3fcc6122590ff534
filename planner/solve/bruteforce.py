"""Brute-force oracle: every cut set and every recompute mask (small cases only); with
selective recomputation, every assignment of a level (none, selective, full) to each layer.

It prices the same objective as :mod:`planner.solve.chain_dp` directly from the cost model's
per-stage methods (``stage_fwd_ms``, ``stage_bwd_ms``, ``recompute_ms``, ``stage_memory`` for
feasibility, ``boundary_transfer_ms``, ``stage_exposed_sync_ms``, ``stage_bubble_fill_ms``), never
from the DP's stage tables (it imports nothing from :mod:`planner.solve.chain_dp` nor
:mod:`planner.solve.prices`: it reads only the :class:`~planner.solve.chain.StageQuestion` it is
handed), so tests holding DP = CP-SAT = brute force check the tables' prices too.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.layout import Layout
from planner.cost.fsdp import replay
from planner.schedule import Held, held_counts
from planner.solve.chain import ChainSolution, PricedStages, StageQuestion, objective_microbatches

MAX_LAYERS = 12
INF = float("inf")


def _masks(q: StageQuestion, start: int, stop: int) -> Iterable[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every (fully, selectively recomputed) pair of layer sets of a stage."""
    layers = range(start, stop)
    cm = q.cost_model
    if not q.allow_recompute:
        return [((), ())]
    if not cm.selective:
        return (((combo), ()) for r in range(len(layers) + 1) for combo in itertools.combinations(layers, r))
    levels = [(0, 1, 2) if cm.has_core[i] else (0, 1) for i in layers]
    return (
        (tuple(i for i, v in zip(layers, pick) if v == 1), tuple(i for i, v in zip(layers, pick) if v == 2))
        for pick in itertools.product(*levels)
    )


def stage_compute_ms(q: StageQuestion, start: int, stop: int, line: tuple[float, float]) -> float:
    """F + B of one stage; under ZeRO 3 by replaying its layers and collectives event by event
    (:func:`planner.cost.fsdp.replay`, not the closed form the DP's table holds)."""
    cm, b = q.cost_model, q.microbatch_size
    if not q.fsdp:
        return cm.stage_fwd_ms(start, stop, b) + cm.stage_bwd_ms(start, stop, b)
    fwd, bwd = cm.at_batch(b).times_ms
    counts = cm.param_count[start:stop]
    gather = [line[0] * n * cm.weight_bytes_per_param + line[1] if n else 0.0 for n in counts]
    scatter = [line[0] * n * cm.grad_bytes_per_param + line[1] if n else 0.0 for n in counts]
    if cm.has_experts:  # the routed experts' gathered and reduce-scattered over their own group's line
        e_byte, e_fixed = cm.expert_fsdp_line(q.sharding)
        experts = cm.expert_param_count[start:stop]
        for per_param, out in ((cm.weight_bytes_per_param, gather), (cm.grad_bytes_per_param, scatter)):
            for i, (n, x) in enumerate(zip(counts, experts)):
                out[i] = ((line[0] * (n - x) * per_param + line[1] if n - x else 0.0)
                          + (e_byte * x * per_param + e_fixed if x else 0.0))
    return sum(replay(fwd[start:stop].tolist(), bwd[start:stop].tolist(), gather, scatter, cm.stack.fsdp_prefetch))


def best_stage(
    table: PricedStages, start: int, stop: int, inflight: int, line: tuple[float, float] = (0.0, 0.0),
    pending: int = 0,
) -> tuple[float, tuple[int, ...], tuple[int, ...]]:
    """Least T = F + B + RC over every recompute assignment of one stage that fits (inf if
    none) with ``inflight`` micro-batches whole and ``pending`` past their I: (T, fully
    recomputed layers, selectively recomputed layers)."""
    q = table.question
    cm, b = q.cost_model, q.microbatch_size
    compute = stage_compute_ms(q, start, stop, line)
    best: tuple[float, tuple[int, ...], tuple[int, ...]] = (INF, (), ())
    rc_fwd, rc_core = cm.recompute_prices(b, q.sharding, line) if q.fsdp else cm.recompute_prices(b)
    for full, sel in _masks(q, start, stop):
        if cm.stage_memory(start, stop, full, b, inflight, q.sharding, sel, pending).total_bytes > q.cap_bytes:
            continue
        t = compute + float(sum(rc_fwd[i] for i in full)) + float(sum(rc_core[i] for i in sel))
        if t < best[0]:
            best = (t, full, sel)
    return best


def _extra_ms(q: StageQuestion, bounds: tuple[int, ...], stops: tuple[int, ...], layout: Layout,
              schedule: ScheduleKind) -> tuple[float, float, float]:
    """The partition's ``sum_s c_s``, ``sum_s X_s`` and ``sum_s Z_s`` (0 unless ``schedule`` splits
    the backward), stage by stage from the cost model."""
    cm, b = q.cost_model, q.microbatch_size
    comm = 0.0
    for s, z in enumerate(stops[:-1]):
        comm += 2.0 * cm.boundary_transfer_ms(z, b, s, layout)  # 0 at the turn of a V placement
    exposed = sum(cm.stage_exposed_sync_ms(a, z, s, layout, b) for s, (a, z) in enumerate(zip(bounds, stops)))
    fill = sum(cm.stage_bubble_fill_ms(a, z, b) for a, z in zip(bounds, stops)) if schedule.splits_backward else 0.0
    return comm, exposed, fill


def solve_chain_bruteforce(
    table: PricedStages, *, layout: Layout, num_microbatches: int, schedule: ScheduleKind, held: Sequence[Held] = (),
) -> ChainSolution | None:
    """The least J of one configuration over every cut set and recompute mask (GPipe, 1F1B,
    ZB-H1 and ZB-H2, whose objective subtracts each stage's bubble fill ``Z_s``; with several
    chunks per rank, ZBV and interleaved, the DP's ``M`` of :func:`objective_microbatches`), and
    the in-flight counts the schedule's). Reads only ``table.question``."""
    q = table.question
    cm, P = q.cost_model, layout.num_stages
    L = cm.num_layers
    M = objective_microbatches(layout, num_microbatches)
    if L > MAX_LAYERS:
        raise PlannerInputError(f"brute force handles at most {MAX_LAYERS} layers (profile has {L})")
    if P > L:
        return None
    held = held or held_counts(schedule, layout, num_microbatches)  # the schedule's own micro-batches (not J's M)
    line = cm.fsdp_line(layout) if q.fsdp else (0.0, 0.0)
    best: ChainSolution | None = None
    for cuts in itertools.combinations(range(1, L), P - 1):
        bounds = (0, *cuts)
        stops = (*cuts, L)
        if not all(q.stage_valid(a, z) for a, z in zip(bounds, stops)):
            continue
        stages = [best_stage(q, a, z, held[s].whole, line, held[s].pending) for s, (a, z) in enumerate(zip(bounds, stops))]
        if any(t == INF for t, _, _ in stages):
            continue
        times = [t for t, _, _ in stages]
        comm, exposed, fill = _extra_ms(q, bounds, stops, layout, schedule)
        value = sum(times) + comm + exposed - fill + (M - 1) * max(times)
        if best is None or value < best.objective_ms:
            best = ChainSolution(value, bounds, tuple(full for _, full, _ in stages), tuple(times), True,
                                 tuple(sel for _, _, sel in stages))
    return best
