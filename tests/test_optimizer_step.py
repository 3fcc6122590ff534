"""The optimizer step priced (issue 19): bytes the update streams per parameter over the device's
memory bandwidth, over the shard of the state a device holds (planner.cost.sharding), run by the
simulator on each rank after its gradient synchronisation, and carried by the plan (version 5;
version-4 files read with none)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from planner.artifacts.cluster import PRESETS
from planner.artifacts.codec import parse_text
from planner.artifacts.kinds import OptimizerKind, ScheduleKind, SolverKind, ZeroStage
from planner.artifacts.layout import Layout, Sharding
from planner.artifacts.plan import dumps_plan, plan_from_json
from planner.artifacts.request import PlanRequest
from planner.artifacts.stack import STACKS
from planner.cost import CostModel
from planner.simulation import simulate
from planner.solve.build import build_plan
from planner.solve.problem import Problem
from tests.chains import chain_profile, small_cluster

LAYERS = [{"fwd": 1.0, "bwd": 2.0, "params": 50_000_000, "saved": 1e6, "inp": 1e5, "out": 1e5} for _ in range(6)]


def _model(optimizer: OptimizerKind, bandwidth: float = 1000.0, n: int = 4) -> CostModel:
    cluster = dataclasses.replace(small_cluster(n), memory_bandwidth_gb_per_s=bandwidth)
    return CostModel(chain_profile(LAYERS), cluster, optimizer, stack=STACKS["none"])


@pytest.mark.parametrize(("kind", "streamed"), [
    (OptimizerKind.ADAM_MIXED, 2 + 2 * 12 + 2),  # fp16 gradient read; master, m, v read and written; fp16 weight written
    (OptimizerKind.ADAM_MIXED_FP32_GRAD, 4 + 2 * 12 + 2),
    (OptimizerKind.ADAM_FP32, 4 + 2 * 8 + 2 * 4),  # the weights are the master copy: read and written
    (OptimizerKind.SGD_FP32, 4 + 2 * 4 + 2 * 4),
])
def test_step_streams_the_state_once_at_the_memory_bandwidth(kind: OptimizerKind, streamed: int) -> None:
    """150 M parameters of three layers at 1000 GB/s: 150e6 x bytes / 1e12 B/s."""
    cm = _model(kind)
    assert kind.step_bytes_per_param == streamed
    assert cm.optimizer_step_ms(0, 3) == pytest.approx(150e6 * streamed / 1e12 * 1e3)


def test_zero_divides_the_step_by_the_ranks_holding_the_state_and_unknown_bandwidth_prices_none() -> None:
    cm = _model(OptimizerKind.ADAM_MIXED)
    whole = cm.optimizer_step_ms(0, 6)
    assert cm.optimizer_step_ms(0, 6, Sharding(zero=ZeroStage.OPTIMIZER, ranks=4)) == pytest.approx(whole / 4)
    assert cm.optimizer_step_ms(0, 6, Sharding(zero=ZeroStage.NONE, ranks=4)) == pytest.approx(whole)
    assert _model(OptimizerKind.ADAM_MIXED, bandwidth=0.0).optimizer_step_ms(0, 6) == 0.0
    assert PRESETS["a100-80gb-x8"].memory_bandwidth_gb_per_s == 2039.0
    assert PRESETS["h100-80gb-x8"].memory_bandwidth_gb_per_s == 3350.0


def _plan(layout: Layout, bandwidth: float):
    cm = _model(OptimizerKind.ADAM_MIXED, bandwidth, layout.world_size)
    request = PlanRequest(global_batch=4 * layout.dp_degree, num_devices=layout.world_size, stack=STACKS["none"])
    problem = Problem.of(cm.profile, cm.cluster, request, SolverKind.GIVEN, layout.world_size)
    starts = [0, 2] if layout.num_stages == 2 else [0]
    return build_plan(problem, cm, layout=layout, boundaries=starts, recompute=[[] for _ in starts],
                      microbatch_size=1, schedule=ScheduleKind.ONE_F_ONE_B)


@pytest.mark.parametrize("layout", [Layout(num_stages=1, dp_degree=2), Layout(num_stages=2, dp_degree=2, zero=ZeroStage.OPTIMIZER)])
def test_the_iteration_ends_with_the_slowest_ranks_step(layout: Layout) -> None:
    """The step runs on each rank after its compute and synchronisation: the iteration grows by
    the step of the rank that finishes last (with one stage, by the step itself)."""
    priced, unpriced = _plan(layout, 1000.0), _plan(layout, 0.0)
    steps = [s.optimizer_ms for s in priced.stages]
    assert all(x > 0 for x in steps) and all(s.optimizer_ms == 0 for s in unpriced.stages)
    tl, base = simulate(priced), simulate(unpriced)
    rank_free = [max(tl.end_ms[r][-1], st.allreduce_end_ms) for r, st in enumerate(tl.stages)]
    assert tl.iteration_ms == pytest.approx(max(f + x for f, x in zip(rank_free, steps)))
    assert tl.iteration_ms > base.iteration_ms
    if layout.num_stages == 1:
        assert tl.iteration_ms == pytest.approx(base.iteration_ms + steps[0])
    assert tl.optimizer_ms == tuple(steps)
    assert priced.predicted.iteration_ms == pytest.approx(tl.iteration_ms)


def test_plan_v5_carries_the_step_and_a_v4_file_reads_as_unpriced() -> None:
    plan = _plan(Layout(num_stages=1, dp_degree=2), 1000.0)
    data = json.loads(dumps_plan(plan))
    assert data["version"] == 6 and data["stages"][0]["optimizer_ms"] == plan.stages[0].optimizer_ms > 0
    assert plan_from_json(parse_text(dumps_plan(plan), "plan")) == plan
    del data["stages"][0]["optimizer_ms"]
    old = plan_from_json(dict(data, version=4))
    assert old.stages[0].optimizer_ms == 0.0
    assert simulate(old).iteration_ms == pytest.approx(plan.predicted.iteration_ms - plan.stages[0].optimizer_ms)
