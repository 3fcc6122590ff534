"""Communication overlapped with computation as the training stack does it (issue 19):
planner.cost.overlap by hand, the cost model's synchronisation under each stack, the
simulator's replay of it, the plan format (version 4, older files as the ``none`` stack) and
the bounds that must still hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.artifacts.codec import parse_text
from planner.artifacts.kinds import ScheduleKind, SolverKind, ZeroStage
from planner.artifacts.layout import Layout
from planner.artifacts.plan import dumps_plan, load_plan, plan_from_json
from planner.artifacts.request import PlanRequest
from planner.artifacts.stack import DEFAULT_STACK, STACKS, Stack, stack_named
from planner.cost import CostModel, allreduce_line
from planner.cost.overlap import buckets, overlapped_gather, overlapped_reduce
from planner.simulation import simulate
from planner.simulation.bounds import partition_bound_ms
from planner.solve.build import build_plan
from planner.solve.problem import Problem
from tests.chains import chain_profile, small_cluster

V3 = Path(__file__).parent / "golden" / "v3"


def test_buckets_cut_in_ready_order_and_a_large_item_alone() -> None:
    assert buckets([1, 1, 1, 5, 1], 2) == [(0, 1, 2.0, 1), (2, 2, 1.0, 1), (3, 3, 5.0, 3), (4, 4, 1.0, 1)]
    assert buckets([0, 0], 4) == []


def test_reduce_by_hand() -> None:
    """Three layers of 2 ms backward, one 1-ms bucket each: ready at 2, 4, 6, reduced 2-3, 4-5,
    6-7: total 3 ms, 1 ms after the backward, so 2 ms of it early; a slow link (3 ms a bucket)
    runs 2-5, 5-8, 8-11: 5 ms after, 4 early."""
    assert overlapped_reduce([2, 2, 2], [1, 1, 1], 1.0, 0.0, 1) == (3.0, 2.0)
    assert overlapped_reduce([2, 2, 2], [1, 1, 1], 3.0, 0.0, 1) == (9.0, 4.0)
    # one bucket of everything: ready at the end, nothing early (the stack "none" case)
    assert overlapped_reduce([2, 2, 2], [1, 1, 1], 1.0, 0.0, 10) == (3.0, 0.0)


def test_gather_by_hand() -> None:
    """Forward of 2 ms per layer; each layer's weights gathered in 1 ms, in order: layer k can
    start at k + 1, so the forward ends at max(1 + 6, 2 + 4, 3 + 2) = 7 after the gather starts."""
    assert overlapped_gather([2, 2, 2], [1, 1, 1], 1.0, 0.0, 1) == (3.0, 7.0)
    assert overlapped_gather([2, 2, 2], [1, 1, 1], 3.0, 0.0, 1) == (9.0, 11.0)


def _model(stack: Stack, n: int = 4) -> CostModel:
    layers = [{"fwd": 1.0, "bwd": 2.0, "params": 50_000_000, "saved": 1e6, "inp": 1e5, "out": 1e5} for _ in range(6)]
    return CostModel(chain_profile(layers), small_cluster(n), stack=stack)


@pytest.mark.parametrize("zero", [ZeroStage.NONE, ZeroStage.OPTIMIZER])
def test_stack_none_prices_one_collective_after_the_backward(zero: ZeroStage) -> None:
    """The ``none`` stack is what version-3 plans were priced for: the all-reduce line at the
    sync bytes per parameter (the mean of gradients and weights with ZeRO), once."""
    cm = _model(STACKS["none"])
    layout = Layout(num_stages=2, dp_degree=2, zero=zero)
    per_byte, fixed = allreduce_line(cm.cluster, layout.grad_group(0))
    sync = cm.stage_sync(0, 3, 0, layout)
    assert sync.total_ms == pytest.approx(per_byte * cm.stage_param_count(0, 3) * cm.sync_bytes_per_param(zero) + fixed)
    assert (sync.early_ms, sync.gather_ahead_ms, sync.gather_bound_ms) == (0.0, 0.0, 0.0)


def test_overlapped_reduction_starts_during_the_backward_and_pays_a_latency_per_bucket() -> None:
    lay = Layout(num_stages=1, dp_degree=2)
    none = _model(STACKS["none"]).stage_sync(0, 6, 0, lay)
    small = Stack(name="planner", grad_reduce_overlap=True, grad_bucket_bytes=100_000_000)  # one layer a bucket
    cm = _model(small)
    sync = cm.stage_sync(0, 6, 0, lay)
    _, fixed = allreduce_line(cm.cluster, lay.grad_group(0))
    assert sync.total_ms == pytest.approx(none.total_ms + 5 * fixed)  # six collectives instead of one
    assert 0.0 < sync.early_ms < sync.total_ms
    # ZeRO's reduce-scatter is not overlapped by the planner's runtime: early 0, the same total as none
    zero = Layout(num_stages=1, dp_degree=2, zero=ZeroStage.OPTIMIZER)
    assert _model(DEFAULT_STACK).stage_sync(0, 6, 0, zero).early_ms == 0.0


def _plan(stack: Stack, layout: Layout, schedule: ScheduleKind = ScheduleKind.ONE_F_ONE_B, m: int = 4, n: int = 4):
    cm = _model(stack, n)
    request = PlanRequest(global_batch=m * layout.dp_degree, num_devices=layout.world_size, stack=stack)
    problem = Problem.of(cm.profile, cm.cluster, request, SolverKind.GIVEN, layout.world_size)
    starts = [0, 3] if layout.num_stages == 2 else [0]
    return build_plan(problem, cm, layout=layout, boundaries=starts, recompute=[[] for _ in starts],
                      microbatch_size=1, schedule=schedule)


def test_one_stage_exposes_only_the_tail_of_an_overlapped_reduction() -> None:
    lay = Layout(num_stages=1, dp_degree=2)
    small = Stack(name="planner", grad_reduce_overlap=True, grad_bucket_bytes=100_000_000)
    none, over = _plan(STACKS["none"], lay), _plan(small, lay)
    stage = over.stages[0]
    assert none.predicted.exposed_allreduce_ms == pytest.approx(none.stages[0].allreduce_ms)
    assert over.predicted.exposed_allreduce_ms == pytest.approx(stage.allreduce_ms - stage.sync_early_ms)
    assert over.predicted.iteration_ms < none.predicted.iteration_ms


def test_megatron_core_gathers_weights_ahead_of_the_forward() -> None:
    lay = Layout(num_stages=2, dp_degree=2, zero=ZeroStage.OPTIMIZER)
    plan = _plan(STACKS["megatron-core-0.8"], lay)
    tl = simulate(plan)
    for s, stage in enumerate(plan.stages):
        assert 0 < stage.gather_ahead_ms < stage.allreduce_ms
        assert stage.gather_bound_ms >= stage.fwd_ms
        # the stage's first forward cannot end before its gather allows
        first = next(i for i, a in enumerate(tl.orders[s]) if a.mb_idx == 0 and a.stage_idx == s)
        assert tl.end_ms[s][first] >= stage.gather_bound_ms - 1e-9
        # after the last backward only the reduce-scatter's tail remains
        assert tl.stages[s].allreduce_end_ms - tl.stages[s].allreduce_start_ms == pytest.approx(
            stage.allreduce_ms - stage.gather_ahead_ms)


def test_plan_v6_round_trip_and_stack_recorded() -> None:
    lay = Layout(num_stages=2, dp_degree=2, zero=ZeroStage.OPTIMIZER)
    plan = _plan(STACKS["megatron-core-0.8"], lay)
    again = plan_from_json(parse_text(dumps_plan(plan), "plan"))
    assert again == plan and again.stack == STACKS["megatron-core-0.8"] == again.provenance.request.stack
    assert json.loads(dumps_plan(plan))["version"] == 6
    assert simulate(again).iteration_ms == pytest.approx(plan.predicted.iteration_ms)


@pytest.mark.parametrize("name", ["default.json", "default-interleaved.json", "gpt3-13b-a100-n16.json"])
def test_version_3_plans_load_as_the_none_stack_and_replay_as_predicted(name: str) -> None:
    """Three plans of the golden corpus as version 3 wrote them (before issue 19)."""
    assert json.loads((V3 / name).read_text())["version"] == 3
    plan = load_plan(V3 / name)
    assert plan.stack == STACKS["none"] == plan.provenance.request.stack
    assert simulate(plan).iteration_ms == pytest.approx(plan.predicted.iteration_ms, rel=1e-12)


def test_stack_presets_and_refusals() -> None:
    assert stack_named("planner") == DEFAULT_STACK == PlanRequest().stack
    assert "nothing beyond the pipeline" in STACKS["none"].describe()
    with pytest.raises(ValueError, match="unknown stack 'mpi'"):
        stack_named("mpi")
    with pytest.raises(ValueError, match="grad_bucket_bytes must be >= 1"):
        Stack(name="x", grad_bucket_bytes=0)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stack=st.sampled_from([STACKS["none"], DEFAULT_STACK, STACKS["megatron-core-0.8"],
                              Stack(name="tiny", grad_reduce_overlap=True, zero_reduce_overlap=True,
                                    grad_bucket_bytes=50_000_000, param_gather_overlap=True)]),
       zero=st.sampled_from([ZeroStage.NONE, ZeroStage.OPTIMIZER]), p=st.sampled_from([1, 2]),
       schedule=st.sampled_from([ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B]), m=st.sampled_from([2, 4, 6]))
def test_the_partition_bound_holds_under_every_stack(stack: Stack, zero: ZeroStage, p: int, schedule: ScheduleKind,
                                                     m: int) -> None:
    lay = Layout(num_stages=p, dp_degree=2, zero=zero)
    plan = _plan(stack, lay, schedule, m)
    assert partition_bound_ms(plan) <= plan.predicted.iteration_ms * (1 + 1e-12)
    assert plan.predicted.iteration_ms == pytest.approx(simulate(plan).iteration_ms)
