"""Interleaved chunks share their rank's memory (issue 19): the chain DP checks one stage at a
time, first with cap / v each; :func:`planner.solve.proposals.rebalanced` re-solves with each
chunk's share in proportion to its need, so a rank's first chunk (more micro-batches in flight)
gets what its last leaves unused -- and every rank still fits."""

from __future__ import annotations

from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.layout import Layout
from planner.artifacts.request import PlanRequest
from planner.artifacts.stack import STACKS
from planner.cost import CostModel
from planner.solve.candidates import Candidate, fits, simulated, solve_config, stage_needs
from planner.solve.chain_dp import solve_chain
from planner.solve.prices import StageTable
from planner.solve.proposals import rebalanced
from planner.solve.space import Config
from tests.chains import chain_profile, small_cluster

MB = 10**6


def _setup() -> tuple[CostModel, Config, float]:
    layers = [{"fwd": 1.0, "bwd": 2.0, "params": 1_000_000, "saved": 100 * MB, "inp": 1 * MB, "out": 1 * MB}
              for _ in range(8)]
    cm = CostModel(chain_profile(layers), small_cluster(2), stack=STACKS["none"])
    c = Config(Layout(num_stages=4, virtual_stages_per_rank=2), 1, 8, ScheduleKind.INTERLEAVED_1F1B)
    ks = c.inflight()
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
