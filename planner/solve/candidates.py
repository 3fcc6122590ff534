"""A candidate: a configuration with a partition and its recomputation (a chain solver's
optimum, :mod:`planner.solve.optimum`, or another proposal), and what is worked out of one: its
stages priced (:func:`stage_terms`) and replayed by the simulator's fast entry
(:func:`simulated`), its memory per stage (:func:`stage_needs`), its busiest rank's work,
whether it fits (:func:`fits`). What a solved configuration proposes beside its optimum (the
baselines' partitions, its chunks' memory rebalanced) is :mod:`planner.solve.proposals`'."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.artifacts.kinds import ChunkPlacement
from planner.artifacts.layout import Layout
from planner.cost import CostModel, StageTerms, price_stages
from planner.schedule import held_counts
from planner.simulation import simulate_iteration_ms
from planner.solve.chain import ChainSolution
from planner.solve.held import held_memory
from planner.solve.space import Config


@dataclass(frozen=True, slots=True)
class Candidate:
    config: Config
    solution: ChainSolution


Scored = tuple[float, Candidate]


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
