"""What a solved configuration proposes besides its chain solver's optimum, and when (one call
per visit of the configuration search, :func:`offer`): the baselines' partitions with the least
recomputation that fits each stage (:func:`alternatives`, :func:`fixed_split`), and an
interleaved configuration's chunks' memory rebalanced (:func:`rebalanced`), at once or once the
search's order reaches the time its solution simulates without recomputation (the gate). The
configuration search (:mod:`planner.solve.config_search`) simulates them all and its policy keeps
the best."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.cost.sharding import is_fsdp
from planner.schedule import held_counts
from planner.solve.candidates import Candidate, simulated
from planner.solve.chain import ChainSolution
from planner.solve.chain_dp import solve_chain
from planner.solve.held import held_memory
from planner.solve.optimum import solve_config
from planner.solve.partitions import partition_by
from planner.solve.prices import StageTable
from planner.solve.recompute import choose_recompute
from planner.solve.settings import SETTINGS, SearchSettings
from planner.solve.space import Config


@dataclass(frozen=True, slots=True)
class Offer:
    """What a solved configuration proposes at one visit (:func:`offer`): its candidates beside
    the solution itself, and the time at which its memory rebalancing waits in the search's order
    (inf: none waits)."""

    candidates: tuple[Candidate, ...]
    rebalance_at_ms: float = math.inf


def offer(
    cm: CostModel, request: PlanRequest, c: Config, solution: ChainSolution, table: StageTable,
    settings: SearchSettings, *, cap: float, limit_ms: float, lean: bool, prune: bool,
    alternatives_below_ms: float | None, due: bool = False,
) -> Offer:
    """What ``solution`` of ``c`` (solved against ``table``, its own) proposes at a visit that must
    beat ``limit_ms``: its memory rebalancings (:func:`rebalanced`: at once for a ``lean`` policy;
    else gated by the solution simulated without its recomputation (:func:`simulated
    <planner.solve.candidates.simulated>`): now when nothing is pruned, or waiting in the
    order until that time when the search prunes) and, with ``alternatives_below_ms`` (the search's
    check; None: none proposed), the baselines' partitions (:func:`alternatives`). ``due``: the
    rebalancing that waited is due (its gate passed): the rebalancings alone. The gate is a
    heuristic, not a bound: a rebalancing re-solves the partition, which can then simulate faster
    than this one unrecomputed (RESULTS 25, 33); always rebalancing took 2x the CPU. The candidate
    without recomputation is no faster than M x its busiest rank's compute, checked first (no
    simulation)."""
    out: list[Candidate] = []
    unrec = math.inf
    rebalancing = rebalances(c, solution)
    if not lean and rebalancing and not due:
        unrec = simulated(cm, Candidate(c, solution), unrecomputed_below_ms=limit_ms)
    if due or (lean and rebalancing) or (unrec < limit_ms and not prune):
        out += rebalanced(cm, request, c, solution, cap, settings.rebalance_rounds, table)
    if alternatives_below_ms is not None and not due:
        out += alternatives(cm, c, cap, request.recompute, request.fixed_boundaries, settings, alternatives_below_ms)
    waits = unrec < limit_ms and prune and not lean
    return Offer(tuple(out), unrec if waits else math.inf)


def rebalances(c: Config, solution: ChainSolution) -> bool:
    """:func:`rebalanced` has something to re-solve: an interleaved configuration (not replicated
    per stage) whose solution recomputes something (else no chunk's share of memory binds)."""
    lay = c.layout
    return lay.virtual_stages_per_rank > 1 and not lay.stage_replicas and bool(any(solution.recompute) or any(solution.selective))


def rebalanced(
    cm: CostModel, request: PlanRequest, c: Config, solution: ChainSolution, cap: float, rounds: int,
    base: StageTable | None = None,
) -> list[Candidate]:
    """An interleaved configuration re-solved with its chunks' memory rebalanced. The chain DP
    checks one stage at a time, so it first gives each of a rank's v chunks cap / v; but
    interleaved 1F1B keeps more micro-batches in flight on a rank's first chunk than on its last
    (:func:`planner.schedule.held_counts`), so that split starves the first chunk (more
    recomputation, or no plan) while the last leaves memory unused. Each round splits every
    rank's ``cap`` over its chunks in proportion to what each stage of the last solution needs
    at the cheapest level that recomputes no layer fully (selective where a layer has an
    attention core, else none), and solves again, until the solution repeats or ``rounds`` are
    done. A rank's shares sum to ``cap``, so every solution fits; all are proposed to the
    simulator, which judges them with the first. ``base``: the configuration's own table (each
    chunk ``cap / v``); each round's table is a shallow copy of it with the chunks' shares, so
    that the stage times and recomputation choices worked out for one cap are shared by every
    round and configuration that meets it again (they are kept per cap)."""
    lay = c.layout
    if not rebalances(c, solution):
        return []  # nothing recomputed: no share binds
    line = cm.fsdp_line(lay) if is_fsdp(c.layout.sharding(0)) else (0.0, 0.0)
    held = held_counts(c.schedule, c.layout, c.num_microbatches)  # whole and past I: the DP's counts
    out: list[Candidate] = []
    for _ in range(rounds):
        stops = list(solution.boundaries[1:]) + [cm.num_layers]
        lean = [held_memory(cm, a, e, (), c.microbatch_size, held[s], c.layout.sharding(s),
                            [i for i in range(a, e) if cm.has_core[i]]).total_bytes
                for s, (a, e) in enumerate(zip(solution.boundaries, stops))]
        caps = [0.0] * len(lean)
        for r in range(lay.pipeline_size):
            chunks = lay.stage_indices(r)
            for s in chunks:  # rounded down to 1/256 of the cap: tables and knapsacks shared
                caps[s] = math.floor(256 * lean[s] / sum(lean[x] for x in chunks)) * cap / 256
        if base is not None:
            table = copy.copy(base)
            table.stage_caps = tuple(caps)
        else:
            table = StageTable(cm, c.microbatch_size, cap / len(chunks), request.fixed_boundaries,
                               allow_recompute=request.recompute, sharding=c.layout.sharding(0), fsdp_line=line,
                               stage_caps=caps)
        again = solve_config(solve_chain, table, c)
        if again is None or (again.boundaries, again.recompute, again.selective) == (
                solution.boundaries, solution.recompute, solution.selective):
            break
        out.append(Candidate(c, again))
        solution = again
    return out


def stage_recompute(
    cm: CostModel, start: int, stop: int, b: int, inflight: int, cap: float, c: Config, stage_idx: int,
    pending: int = 0,
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The least-time recompute levels that fit stage ``stage_idx`` of ``c`` in ``cap``: (fully,
    selectively recomputed layers), or None if none do. ``inflight`` micro-batches whole and
    ``pending`` past their I (:func:`planner.schedule.held_counts`): recomputation frees bytes of the whole ones
    only (W's inputs are kept recomputed or not, :meth:`CostModel.keep_bytes`)."""
    sharding = c.layout.sharding(stage_idx)
    excess = cm.stage_memory(start, stop, (), b, inflight, sharding, (), pending).total_bytes - cap
    fwd, core = cm.layout_recompute_prices(b, c.layout, stage_idx)
    choice = choose_recompute(
        fwd_ms=fwd[start:stop].tolist(),
        saved_bytes=cm.at_batch(b).saved_bytes[start:stop].tolist(),
        input_bytes=(cm.input_per_sample[start:stop] * b).tolist(),
        first_layer=start,
        inflight=inflight,
        excess_bytes=float(excess),
        core_ms=core[start:stop].tolist() if cm.selective else None,
        core_bytes=cm.at_batch(b).core_bytes[start:stop].tolist() if cm.selective else None,
        shared_bytes=cm.shared_out(start, stop, b).tolist() if cm.profile.shared_saved else None,
    )
    if choice.time_ms == float("inf") or cm.stage_memory(
        start, stop, choice.layers, b, inflight, sharding, choice.selective, pending
    ).total_bytes > cap:
        return None
    return choice.layers, choice.selective


def fixed_split(
    cm: CostModel, c: Config, bounds: Sequence[int], cap: float, allow_recompute: bool = True
) -> Candidate | None:
    """A given partition under configuration ``c``, each stage with the least recomputation
    that fits ``cap`` (None if a stage cannot fit, or would need recomputation that is not
    allowed)."""
    held = held_counts(c.schedule, c.layout, c.num_microbatches)
    b = c.microbatch_size
    stops = list(bounds[1:]) + [cm.num_layers]
    rc, sel = [], []
    for s, (a, z) in enumerate(zip(bounds, stops)):
        chosen = stage_recompute(cm, a, z, b, held[s].whole, cap, c, s, held[s].pending)
        if chosen is None or ((chosen[0] or chosen[1]) and not allow_recompute):
            return None
        rc.append(chosen[0])
        sel.append(chosen[1])
    times = tuple(
        sum(cm.stage_times_ms(a, z, b, s, c.layout)) + cm.recompute_ms(rc[s], b, sel[s], c.layout, s)
        for s, (a, z) in enumerate(zip(bounds, stops))
    )
    return Candidate(c, ChainSolution(0.0, tuple(bounds), tuple(rc), times, True, tuple(sel)))


def alternatives(
    cm: CostModel, c: Config, cap: float, allow_recompute: bool = True, fixed: Sequence[int] = (),
    settings: SearchSettings = SETTINGS, busiest_limit_ms: float = math.inf,
) -> list[Candidate]:
    """The baselines' partitions of one configuration (min-max by time, PipeDream's weight),
    with the least recompute that fits each stage: extra proposals for the simulator, which
    judges the all-reduce overlap more finely than the DP objective does. Stages start at the
    ``fixed`` boundaries (the min-max over the partitions that honour them). A partition whose
    busiest stage computes more than ``busiest_limit_ms / M`` is left out before its
    recomputation is chosen: its stage times (compute plus recomputation) put ``M x`` its busiest
    above that, which the search's check (:meth:`ConfigSearch.keep
    <planner.solve.config_search.ConfigSearch.keep>`) drops anyway."""
    lay = c.layout
    if lay.virtual_stages_per_rank > 1 or lay.num_stages == 1 or lay.stage_replicas:
        return []
    out = []
    for kind in settings.alternative_partitions:
        bounds = partition_by(kind, cm, c.microbatch_size, lay.pipeline_size, lay.dp_degree, fixed)
        if bounds is None or c.num_microbatches * max(_computes(cm, c, bounds)) > busiest_limit_ms:
            continue
        cand = fixed_split(cm, c, bounds, cap, allow_recompute)
        if cand is not None:
            out.append(cand)
    return out


def _computes(cm: CostModel, c: Config, bounds: Sequence[int]) -> list[float]:
    """Per stage of the partition ``bounds``, its forward + backward as :func:`fixed_split` sums them
    (its stage time less the recomputation)."""
    stops = list(bounds[1:]) + [cm.num_layers]
    return [sum(cm.stage_times_ms(a, z, c.microbatch_size, s, c.layout)) for s, (a, z) in enumerate(zip(bounds, stops))]
