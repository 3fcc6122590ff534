"""A candidate: a configuration with a partition and its recomputation (a chain solver's
optimum, or another proposal), and what is worked out of one: its stages priced
(:func:`stage_terms`) and replayed by the simulator's fast entry (:func:`simulated`), its
memory per stage (:func:`stage_needs`), its busiest rank's work, whether it fits (:func:`fits`).
What a solved configuration proposes beside its optimum (the baselines' partitions, its chunks'
memory rebalanced) is :mod:`planner.solve.proposals`'."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from planner.artifacts.kinds import ChunkPlacement
from planner.artifacts.layout import Layout
from planner.cost import CostModel, StageTerms, price_stages
from planner.schedule import Held, held_counts
from planner.simulation import simulate_iteration_ms
from planner.solve.chain import ChainSolution
from planner.solve.held import fits_every_state, held_memory
from planner.solve.prices import StageTable
from planner.solve.space import Config

#: a chain solver: (stage table, layout, micro-batches, schedule) -> the optimum of J, or None
ChainSolver = Callable[..., "ChainSolution | None"]
#: one search's optima of the chain DP by what it reads (:func:`remembered`), each with its table
Solved = dict[tuple[object, ...], tuple[StageTable, "ChainSolution | None"]]


@dataclass(frozen=True, slots=True)
class Candidate:
    config: Config
    solution: ChainSolution


Scored = tuple[float, Candidate]


def solve_config(chain_solver: ChainSolver, table: StageTable, c: Config,
                 solved: Solved | None = None) -> ChainSolution | None:
    """The chain solver's optimum of ``c`` (remembered in ``solved`` where given:
    :func:`remembered`). A zero-bubble stage is priced at the peak of its count of held
    micro-batches; where the optimum does not fit at another of its states
    (:func:`planner.solve.held.fits_every_state`: a stage recomputing so much that W keeps more
    than it saved), solved again with every stage's most micro-batches past I
    (:attr:`Held.conservative <planner.schedule.Held.conservative>`, above every state): where
    the first fits it is the optimum, else the second is a plan that fits. Where no partition
    might fit every state (:meth:`StageTable.could_fit_every_state
    <planner.solve.prices.fits.StageFits.could_fit_every_state>`), neither does, and
    neither is solved."""
    held = held_counts(c.schedule, c.layout, c.num_microbatches) if c.schedule.splits_backward else ()
    if any(len(h.states) > 1 for h in held) and not table.could_fit_every_state(held):
        return None
    sol = remembered(chain_solver, table, c, (), solved)
    if sol is None or not c.schedule.splits_backward:
        return sol
    caps = [table.cap_of(s) for s in range(len(held))]
    shardings = [c.layout.sharding(s) for s in range(len(held))]
    if fits_every_state(table.cm, held, sol, c.microbatch_size, shardings, caps):
        return sol
    return remembered(chain_solver, table, c, tuple(h.conservative for h in held), solved)


def remembered(chain_solver: ChainSolver, table: StageTable, c: Config, held: tuple[Held, ...],
               solved: Solved | None) -> ChainSolution | None:
    """``chain_solver``'s optimum of ``c`` (``held``: the counts priced, () for the schedule's
    own), remembered in ``solved`` (one search's; None: solved as asked) by what the chain DP
    (:func:`planner.solve.chain_dp.solve_chain`) reads of the schedule: whether it splits the
    backward (its bubble fill, its ``M - 1`` bound) and each stage's held counts. ZBV and
    DualPipe-V (:mod:`planner.schedule.dualpipe`) are searched on the same V layout, micro-batch
    size and count, and those are equal for the two (chunk ``s`` holds ``2P - s`` whole, none past
    I), so the second schedule's configuration reuses the first's optimum instead of solving the
    same DP again; each schedule's own states are still checked against it (:func:`solve_config`)
    and its order still simulated. Each table is kept with its optima, so a key's table is the
    one asked."""
    if solved is None:
        if held:
            return chain_solver(table, layout=c.layout, num_microbatches=c.num_microbatches, schedule=c.schedule,
                                held=held)
        return chain_solver(table, layout=c.layout, num_microbatches=c.num_microbatches, schedule=c.schedule)
    counts = tuple((h.whole, h.pending) for h in (held or held_counts(c.schedule, c.layout, c.num_microbatches)))
    key = (id(table), c.layout, c.num_microbatches, c.schedule.splits_backward, counts)
    found = solved.get(key)
    if found is None or found[0] is not table:
        found = solved[key] = (table, chain_solver(table, layout=c.layout, num_microbatches=c.num_microbatches,
                                                   schedule=c.schedule, held=held))
    return found[1]


def stage_terms(cm: CostModel, cand: Candidate) -> tuple[StageTerms, ...]:
    """Each stage of a candidate priced (:func:`planner.cost.stage.price_stages`): what the
    simulator's fast entry replays, the records its plan's stages are built from alike."""
    c, sol = cand.config, cand.solution
    return price_stages(cm, c.layout, c.microbatch_size, sol.boundaries, sol.recompute, sol.selective,
                        split_backward=c.schedule.splits_backward)


def busiest_compute_ms(cm: CostModel, c: Config, solution: ChainSolution) -> float:
    """The most compute (forward + backward as the simulator takes them, no recomputation) per
    micro-batch of one rank of ``solution`` (its chunks' summed): every rank runs it M times, so
    no replay of the solution, with or without its recomputation, is faster than M times this."""
    return busiest_rank(c.layout, stage_compute_ms(cm, c, solution))


def stage_compute_ms(cm: CostModel, c: Config, solution: ChainSolution) -> list[float]:
    """Per stage of ``solution``, its forward + backward per micro-batch as the simulator takes
    them (no recomputation)."""
    stops = list(solution.boundaries[1:]) + [cm.num_layers]
    return [sum(cm.stage_times_ms(a, e, c.microbatch_size, s, c.layout))
            for s, (a, e) in enumerate(zip(solution.boundaries, stops))]


def unrecomputed_floor_ms(cm: CostModel, c: Config, solution: ChainSolution) -> float:
    """No replay of ``solution`` without its recomputation (:func:`simulated`) is faster, on
    one chunk or several per rank in the loop placement: rank ``r`` runs its chunks' compute M
    times, after the forwards of chunks ``0 .. r - 1`` of the first micro-batch and before the
    backwards of chunks ``r - 1 .. 0`` of the last (:func:`chunk_fill_bound_ms`'s argument, on
    the solution's own chunks): at least ``M x`` :func:`busiest_compute_ms`, and on uniform
    chunks of ``t`` the interleaved schedule's ``(M v + P - 1) t``."""
    lay = c.layout
    work = stage_compute_ms(cm, c, solution)
    if lay.stage_replicas or lay.placement is not ChunkPlacement.LOOP or c.schedule.splits_backward:
        return c.num_microbatches * busiest_rank(lay, work)  # (a split backward's W can run after)
    before = np.concatenate([[0.0], np.cumsum(work)])  # the first r chunks' forward + backward
    P = lay.pipeline_size
    return max(float(before[r]) + c.num_microbatches * sum(work[s] for s in lay.stage_indices(r)) for r in range(P))


def busiest_rank(layout: Layout, per_stage: Sequence[float]) -> float:
    """The largest sum of ``per_stage`` over one device's stages: a pipeline rank's chunks (one
    stage each without interleaving), or one copy of a stage replicated per stage."""
    if layout.stage_replicas:
        return max(per_stage)
    return max(sum(per_stage[s] for s in layout.stage_indices(r)) for r in range(layout.pipeline_size))


def simulated(cm: CostModel, cand: Candidate, unrecomputed_below_ms: float | None = None) -> float:
    """The candidate's iteration time by the simulator's fast entry; with ``unrecomputed_below_ms``,
    its time were nothing recomputed (a memory rebalancing's best case on its partition) where that
    could be below it (its floor, :func:`unrecomputed_floor_ms`, is: checked first, no
    simulation), else inf."""
    c = cand.config
    if unrecomputed_below_ms is None:
        terms = stage_terms(cm, cand)
    elif unrecomputed_floor_ms(cm, c, cand.solution) >= unrecomputed_below_ms:
        return float("inf")
    else:
        terms = tuple(dataclasses.replace(t, recompute_ms=0.0) for t in stage_terms(cm, cand))
    return simulate_iteration_ms(c.schedule, c.num_microbatches, terms,
                                 virtual_stages_per_rank=c.layout.virtual_stages_per_rank,
                                 replicas=c.layout.stage_replicas)


def stage_needs(cm: CostModel, c: Config, solution: ChainSolution) -> list[int]:
    """Per stage of ``solution`` under ``c``, one device's memory at its peak (with its
    recomputation, micro-batches held (:func:`planner.schedule.held_counts`) and ZeRO sharding)."""
    held = held_counts(c.schedule, c.layout, c.num_microbatches)
    stops = list(solution.boundaries[1:]) + [cm.num_layers]
    return [held_memory(cm, a, e, solution.recompute[s], c.microbatch_size, held[s], c.layout.sharding(s),
                        solution.selective[s]).total_bytes for s, (a, e) in enumerate(zip(solution.boundaries, stops))]


def fits(cm: CostModel, c: Config, solution: ChainSolution, cap: float) -> bool:
    """Every device of ``solution`` fits ``cap`` under ``c`` (a rank holding v chunks: their
    memory summed; a stage's copies: each)."""
    return busiest_rank(c.layout, stage_needs(cm, c, solution)) <= cap
