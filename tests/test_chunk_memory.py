"""Interleaved chunks share their rank's memory (issue 19): the chain DP checks one stage at a
time, first with cap / v each; :func:`planner.solve.proposals.rebalanced` re-solves with each
chunk's share in proportion to its need, so a rank's first chunk (more micro-batches in flight)
gets what its last leaves unused -- and every rank still fits."""

from __future__ import annotations

import dataclasses

import pytest

from planner.artifacts.errors import InfeasibleError
from planner.artifacts.kinds import ScheduleKind, SolverKind
from planner.artifacts.layout import Layout
from planner.artifacts.request import PlanRequest
from planner.artifacts.stack import STACKS
from planner.cost import CostModel
from planner.schedule import held_counts
from planner.solve.build import build_best
from planner.solve.candidates import Candidate, fits, simulated, stage_needs
from planner.solve.chain import ChainSolution
from planner.solve.chain_dp import solve_chain
from planner.solve.coarsen import merged_model, to_layers
from planner.solve.optimum import solve_config
from planner.solve.prices import StageTable
from planner.solve.problem import Problem
from planner.solve.proposals import rebalanced
from planner.solve.space import Config
from tests.chains import chain_profile, small_cluster

MB = 10**6


def _setup() -> tuple[CostModel, Config, float]:
    layers = [{"fwd": 1.0, "bwd": 2.0, "params": 1_000_000, "saved": 100 * MB, "inp": 1 * MB, "out": 1 * MB}
              for _ in range(8)]
    cm = CostModel(chain_profile(layers), small_cluster(2), stack=STACKS["none"])
    c = Config(Layout(num_stages=4, virtual_stages_per_rank=2), 1, 8, ScheduleKind.INTERLEAVED_1F1B)
    ks = tuple(h.inflight for h in held_counts(c.schedule, c.layout, c.num_microbatches))
    assert ks[0] > ks[2]  # rank 0's first chunk holds more micro-batches than its second
    need = [cm.stage_memory(2 * s, 2 * s + 2, (), 1, ks[s]).total_bytes for s in range(4)]
    # every rank fits without recomputation, with 2% to spare (the shares are rounded down to 1/256 of the cap)
    cap = 1.02 * max(need[0] + need[2], need[1] + need[3])
    assert need[0] > cap / 2  # but the first chunk not in half of it
    return cm, c, cap


def test_half_each_recomputes_and_the_rebalanced_share_does_not() -> None:
    cm, c, cap = _setup()
    first = solve_config(solve_chain, StageTable(cm, 1, cap / 2), c)
    assert first is not None and any(first.recompute)
    again = rebalanced(cm, PlanRequest(global_batch=8), c, first, cap, rounds=3)
    assert again, "rebalancing found nothing"
    best = again[-1].solution
    assert not any(best.recompute)
    assert simulated(cm, again[-1]) < simulated(cm, Candidate(c, first))
    assert fits(cm, c, best, cap)
    need = stage_needs(cm, c, best)
    assert need[0] + need[2] <= cap and need[1] + need[3] <= cap


def test_fits_sums_a_ranks_chunks() -> None:
    cm, c, cap = _setup()
    sol = solve_config(solve_chain, StageTable(cm, 1, cap, stage_caps=[cap] * 4), c)
    assert sol is not None and not any(sol.recompute)  # each stage alone fits the whole cap
    need = stage_needs(cm, c, sol)
    tight = max(need[0] + need[2], need[1] + need[3])
    assert tight > max(need)  # a per-stage check would let a smaller cap through
    assert fits(cm, c, sol, tight) and not fits(cm, c, sol, tight - 1)
    assert rebalanced(cm, PlanRequest(global_batch=8), c, sol, cap, rounds=3) == []  # nothing recomputed: no share binds


def _grouped() -> tuple[CostModel, CostModel, list[int], Config, float]:
    """16 layers searched as 8 groups of 2 (a long profile's coarse chain), 4 chunks on 2 ranks,
    under a cap where a rebalanced solution gives rank 0's first chunk more than half of it."""
    layers = [{"fwd": 1.0, "bwd": 2.0, "params": 1_000_000, "saved": 100 * MB, "inp": 1 * MB, "out": 1 * MB}
              for _ in range(16)]
    cm = CostModel(chain_profile(layers), small_cluster(2), stack=STACKS["none"])
    starts = list(range(0, 16, 2))
    c = Config(Layout(num_stages=4, virtual_stages_per_rank=2), 1, 8, ScheduleKind.INTERLEAVED_1F1B)
    ks = tuple(h.inflight for h in held_counts(c.schedule, c.layout, c.num_microbatches))
    need = [cm.stage_memory(4 * s, 4 * s + 4, (), 1, ks[s]).total_bytes for s in range(4)]
    return cm, merged_model(cm, starts), starts, c, 0.7 * max(need[0] + need[2], need[1] + need[3])


def test_a_rebalanced_candidate_mapped_to_layers_still_fits_its_ranks() -> None:
    """Llama-3 70B on 16 A100s (issue fitfix 1) was planned at 73.04 GiB for a 71.23 GiB cap: its
    interleaved candidate over groups was rebalanced (chunk 0 over half the cap, chunk 2 under),
    and mapping it to layers chose chunk 2's recomputation in half the cap, taking what chunk 0
    held. Each chunk's choice must stay within what the rank's other chunks leave."""
    cm, merged, starts, c, cap = _grouped()
    first = solve_config(solve_chain, StageTable(merged, 1, cap / 2), c)
    assert first is not None
    again = rebalanced(merged, PlanRequest(global_batch=8), c, first, cap, rounds=3)
    over_half = [cand for cand in again if stage_needs(merged, c, cand.solution)[0] > cap / 2]
    assert over_half, "no rebalanced candidate gives the first chunk more than half the cap"
    for cand in [Candidate(c, first)] + again:
        assert fits(merged, c, cand.solution, cap)
        mapped = to_layers(cm, cand, starts, cap)
        need = stage_needs(cm, c, mapped.solution)
        assert need[0] + need[2] <= cap and need[1] + need[3] <= cap, (cand.solution, mapped.solution, need, cap)


def test_build_best_never_returns_a_plan_over_the_cap() -> None:
    """A candidate whose simulated peak is over the cap (the memory tables and the simulator
    disagreeing) gives way to the next; with none left the search refuses in one line."""
    cm, c, cap = _setup()
    request = PlanRequest(global_batch=8, memory_cap_bytes=int(cap))
    problem = Problem.of(cm.profile, cm.cluster, request, SolverKind.DP, 2)
    bounds = (0, 2, 4, 6)
    none = Candidate(c, ChainSolution(0.0, bounds, ((),) * 4, (3.0,) * 4, True, ((),) * 4))
    lean = Candidate(c, ChainSolution(0.0, bounds, tuple((a, a + 1) for a in bounds), (4.0,) * 4, True, ((),) * 4))
    assert not fits(cm, c, none.solution, cap / 2) and fits(cm, c, lean.solution, cap / 2)
    half = Problem.of(cm.profile, cm.cluster, dataclasses.replace(request, memory_cap_bytes=int(cap / 2)),
                      SolverKind.DP, 2)
    plans = build_best(half, cm, [(1.0, none), (2.0, lean)], 1)
    assert len(plans) == 1 and plans[0].predicted.peak_memory_bytes <= cap / 2
    assert plans[0].stages[0].recompute == (0, 1)
    with pytest.raises(InfeasibleError, match="disagree") as err:
        build_best(half, cm, [(1.0, none)], 1)
    assert "\n" not in str(err.value)
    assert build_best(half, cm, [(1.0, none)], 1, refuse=False) == []
    assert len(build_best(problem, cm, [(1.0, none)], 1)) == 1  # within the whole cap it fits
