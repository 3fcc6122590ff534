"""Coarsening and refinement: long profiles are searched over groups of consecutive layers,
then the best configurations re-solved with single layers around their chosen boundaries.

A profile longer than :attr:`SearchSettings.chain_max` layers (or twice the deepest pipeline
searched) is merged into at most that many groups, cut where the fewest bytes cross
(:func:`planner.graph.coarse_starts`); :func:`to_layers` maps a candidate over groups back to
layers, :func:`refine` re-solves one configuration on a finer chain (single layers within
:attr:`SearchSettings.refine_radius` of each boundary, groups elsewhere). Under the working-set
ceiling (:mod:`planner.solve.ceiling`) the groups are at most its longest chain, and a refinement
whose finer chain is longer is not solved.
"""

from __future__ import annotations

from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.cost.sharding import is_fsdp
from planner.graph import merge_layers
from planner.schedule import held_counts
from planner.solve.candidates import Candidate, simulated
from planner.solve.chain import ChainSolution
from planner.solve.optimum import ChainSolver, solve_config
from planner.solve.prices import StageTable
from planner.solve.proposals import stage_recompute
from planner.solve.replicated_search import solve_replicated_config
from planner.solve.settings import SETTINGS, SearchSettings


def merged_model(cm: CostModel, starts: list[int]) -> CostModel:
    """``cm`` over groups of layers starting at ``starts``."""
    return CostModel(merge_layers(cm.profile, starts), cm.cluster, cm.optimizer, group=cm.group, stack=cm.stack,
                     gather_bytes_per_sample=cm.gather_bytes_per_sample, offload_optimizer=cm.offload_optimizer)


def to_layers(cm: CostModel, cand: Candidate, starts: list[int], cap: float) -> Candidate:
    """A candidate over merged groups as one over the original layers: boundaries at the
    groups' first layers, and per stage the least-time recompute set over its own layers
    (or the groups' recompute sets mapped to their layers, if that is cheaper).

    The least-time set is sought within ``cap / v`` (each of a rank's ``v`` chunks its share, as
    the chain DP checks them) and within what the rank's other chunks leave of ``cap`` as they
    stand: a rebalanced candidate (:func:`planner.solve.proposals.rebalanced`) gives one chunk
    more than ``cap / v`` and another less, so the second chunk's ``cap / v`` alone could take
    memory the first one holds (the rank over ``cap``)."""
    L = cm.num_layers
    stops_of = starts[1:] + [L]
    bounds = tuple(starts[g] for g in cand.solution.boundaries)
    ends = list(bounds[1:]) + [L]
    c = cand.config
    lay = c.layout
    ks = held_counts(c.schedule, c.layout, c.num_microbatches)  # whole and past I
    share = cap / lay.virtual_stages_per_rank
    b = c.microbatch_size
    recompute: list[tuple[int, ...]] = []
    selective: list[tuple[int, ...]] = []
    for s in range(len(bounds)):
        recompute.append(tuple(layer for g in cand.solution.recompute[s] for layer in range(starts[g], stops_of[g])))
        # a group recomputed selectively: the attention cores of its layers that have one
        selective.append(tuple(layer for g in cand.solution.selective[s] for layer in range(starts[g], stops_of[g])
                               if cm.has_core[layer]))

    def need(s: int) -> float:
        return float(cm.stage_memory(bounds[s], ends[s], recompute[s], b, ks[s].whole, c.layout.sharding(s), selective[s],
                                     ks[s].pending).total_bytes)

    ranks = ([lay.stage_indices(r) for r in range(lay.pipeline_size)] if lay.virtual_stages_per_rank > 1
             else [(s,) for s in range(len(bounds))])
    for chunks in ranks:
        held = {s: need(s) for s in chunks}
        for s in chunks:
            room = min(share, cap - sum(m for x, m in held.items() if x != s))
            chosen = stage_recompute(cm, bounds[s], ends[s], b, ks[s].whole, room, c, s, ks[s].pending)
            if chosen is not None and cm.recompute_ms(chosen[0], b, chosen[1], lay, s) <= cm.recompute_ms(
                    recompute[s], b, selective[s], lay, s):
                recompute[s], selective[s] = chosen
                held[s] = need(s)
    sol = ChainSolution(cand.solution.objective_ms, bounds, tuple(recompute), cand.solution.stage_times_ms, False,
                        tuple(selective))
    return Candidate(c, sol)


def refine(
    cm: CostModel, starts: list[int], request: PlanRequest, cand: Candidate, cap: float, chain_solver: ChainSolver,
    settings: SearchSettings = SETTINGS, max_chain: int | None = None,
) -> Candidate:
    """Re-solve one configuration over a finer chain: single layers within
    :attr:`SearchSettings.refine_radius` of each boundary the coarse solution chose, groups elsewhere.
    ``max_chain``: the working-set ceiling's longest chain (:mod:`planner.solve.ceiling`); a finer
    chain longer than that is not solved (the coarse solution is kept, its stages on group starts)."""
    L = cm.num_layers
    coarse = to_layers(cm, cand, starts, cap)
    finer = set(starts)
    radius = settings.refine_radius
    for cut in coarse.solution.boundaries[1:]:
        finer.update(range(max(1, cut - radius), min(L - 1, cut + radius) + 1))
    finer_starts = sorted(finer)
    if max_chain is not None and len(finer_starts) > max_chain:
        return coarse
    merged = merged_model(cm, finer_starts)
    fixed = tuple(finer_starts.index(f) for f in request.fixed_boundaries)
    c = cand.config
    line = merged.fsdp_line(c.layout) if is_fsdp(c.layout.sharding(0)) else (0.0, 0.0)
    table = StageTable(merged, c.microbatch_size, cap / c.layout.virtual_stages_per_rank, fixed,
                       allow_recompute=request.recompute, sharding=c.layout.sharding(0), fsdp_line=line)
    if c.layout.stage_replicas:
        again = solve_replicated_config(merged, request, c.microbatch_size, c.schedule, c.layout.zero,
                                        c.layout.world_size, cap, fixed, simulated(cm, coarse))
        if again is None:
            return coarse
        fine = to_layers(cm, again, finer_starts, cap)
        return min((coarse, fine), key=lambda x: simulated(cm, x))
    sol = solve_config(chain_solver, table, c)
    if sol is None:
        return coarse
    fine = to_layers(cm, Candidate(c, sol), finer_starts, cap)
    return min((coarse, fine), key=lambda x: simulated(cm, x))
