"""What a solved interleaved configuration proposes besides its J-optimum: its chunks' memory
rebalanced (:func:`rebalanced`; the baselines' partitions are
:func:`planner.solve.candidates.alternatives`); the configuration search
(:mod:`planner.solve.config_search`) simulates them all and its policy keeps the best."""

from __future__ import annotations

import copy
import math

from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.cost.sharding import is_fsdp
from planner.solve.candidates import Candidate, solve_config
from planner.solve.chain import ChainSolution
from planner.solve.chain_dp import solve_chain
from planner.solve.held import held_memory
from planner.solve.prices import StageTable
from planner.solve.space import Config


def rebalances(c: Config, solution: ChainSolution) -> bool:
    """:func:`rebalanced` has something to re-solve: an interleaved configuration (not replicated
    per stage) whose solution recomputes something (else no chunk's share of memory binds)."""
    lay = c.layout
    return lay.virtual_stages_per_rank > 1 and not lay.stage_replicas and bool(any(solution.recompute) or solution.selective)


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
    held = c.held()  # whole and past I: the DP's counts
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
