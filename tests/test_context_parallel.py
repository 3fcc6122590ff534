"""Context parallelism in planning: the per-device view of an analytic profile, its refusals,
exactness of the three solvers over cp, and the search choosing cp where memory binds."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import OptimizerKind, ScheduleKind, ZeroStage
from planner.artifacts.layout import DeviceGroup, Layout
from planner.artifacts.plan import plan_from_json, plan_to_json
from planner.artifacts.profile import load_profile
from planner.artifacts.request import PlanRequest
from planner.artifacts.stack import STACKS
from planner.cost.collectives import allreduce_line
from planner.cost.context import context_parallel_view, gemm_ratio
from planner.cost.context_degrees import candidate_cp_degrees, refusal
from planner.cost.tensor_parallel import device_cost_model
from planner.profiling.analytic.gpt import gpt_profile
from planner.profiling.analytic.sequence import sequence_shape
from planner.profiling.defaults import profiles_dir
from planner.solve import plan
from planner.solve.prices import StageTable
from tests.chains import small_cluster, solve_three_ways

from planner.artifacts.cluster import PRESETS  # isort: skip

LONG = dict(layers=4, hidden=1024, heads=16, seq=32768, vocab=32000)


def _long(**kw: object) -> object:
    return gpt_profile(**{**LONG, **kw})  # type: ignore[arg-type]


def test_view_splits_token_work_and_attention_and_adds_the_kv_collectives() -> None:
    """Per layer on one of cp devices: the attention core 1/cp of its time and bytes,
    token-wise work r/cp (r from the GEMM model, >= 1), activations and boundary bytes 1/cp,
    parameters whole; a block pays an all-gather of its K/V forward and an all-gather plus a
    reduce-scatter backward on the cp group's ring, exposed without the stack's overlap and
    hidden behind the core with it; the gathered K/V of one layer sit in the buffers."""
    prof = _long()
    cluster = PRESETS["h100-80gb-x8"]
    shape = sequence_shape(prof)
    assert shape is not None and shape.seq == 32768 and shape.kv_heads == 16 and shape.head_dim == 64
    cp = 4
    view = context_parallel_view(prof, cluster, cp).profile
    r = gemm_ratio(shape, cp)
    assert r > 1.0
    kv = 2 * 32768 * 16 * 64 * 2
    assert context_parallel_view(prof, cluster, cp).gather_bytes_per_sample == kv
    per_byte, fixed = allreduce_line(cluster, (0, 1, 2, 3))
    for whole, part in zip(prof.layers, view.layers):
        assert part.param_count == whole.param_count
        assert math.isclose(part.saved_bytes_per_sample, whole.saved_bytes_per_sample / cp)
        assert math.isclose(part.output_bytes_per_sample, whole.output_bytes_per_sample / cp)
        core = whole.attention_core
        if core is None:
            assert math.isclose(part.fwd.per_sample_ms, whole.fwd.per_sample_ms * r / cp)
            continue
        assert part.attention_core is not None
        assert math.isclose(part.attention_core.fwd.per_sample_ms, core.fwd.per_sample_ms / cp)
        assert math.isclose(part.attention_core.saved_bytes_per_sample, core.saved_bytes_per_sample / cp)
        token = (whole.fwd.per_sample_ms - core.fwd.per_sample_ms) * r / cp
        gather = 0.5 * per_byte * kv
        assert math.isclose(part.fwd.per_sample_ms, token + core.fwd.per_sample_ms / cp + gather, rel_tol=1e-9)
        assert math.isclose(part.fwd.intercept_ms, whole.fwd.intercept_ms - core.fwd.intercept_ms + 0.5 * fixed,
                            rel_tol=1e-9, abs_tol=1e-12)
    hidden = context_parallel_view(prof, cluster, cp, stack=STACKS["megatron-core-0.8"]).profile
    for exposed, overlapped in zip(view.layers[1:-1], hidden.layers[1:-1]):
        for b in (1, 8):
            assert overlapped.fwd_ms(b) < exposed.fwd_ms(b) and overlapped.bwd_ms(b) < exposed.bwd_ms(b)
    cm = device_cost_model(prof, cluster, OptimizerKind.ADAM_MIXED, DeviceGroup(cp_degree=cp))
    one = device_cost_model(prof, cluster, OptimizerKind.ADAM_MIXED)
    assert cm.buffer_bytes(1, 3, 2) - one.buffer_bytes(1, 3, 2) / cp == pytest.approx(2 * kv)


def test_gradients_sync_over_dp_x_cp() -> None:
    """The stage's synchronisation runs over its dp x cp ranks: with cp = 2 the same line as
    dp = 2 without cp (the ring is what matters), and ZeRO shards over both."""
    prof = _long()
    cluster = PRESETS["h100-80gb-x8"]
    cm = device_cost_model(prof, cluster, OptimizerKind.ADAM_MIXED, DeviceGroup(cp_degree=2))
    with_cp = Layout(num_stages=1, dp_degree=2, cp_degree=2, zero=ZeroStage.OPTIMIZER)
    assert with_cp.grad_group(0) == (0, 1, 2, 3) and with_cp.sharding(0).ranks == 4
    sync = cm.stage_sync(0, cm.num_layers, 0, with_cp).total_ms
    plain = device_cost_model(prof, cluster, OptimizerKind.ADAM_MIXED)
    four = Layout(num_stages=1, dp_degree=4, zero=ZeroStage.OPTIMIZER)
    assert sync > 0 and sync == pytest.approx(plain.stage_sync(0, cm.num_layers, 0, four).total_ms)


def test_refusals_name_why() -> None:
    """Measured profiles declare no sequence scaling; the sequence must cut into 2 cp whole
    chunks; cp x t must divide the devices; --cp asks only for usable degrees."""
    zoo = load_profile(profiles_dir() / "zoo-gpt-cpu.json")
    assert sequence_shape(zoo) is None
    assert "does not declare what scales with the sequence" in refusal(zoo, 8, 1, 2)
    assert candidate_cp_degrees(zoo, 8, 1) == [1]
    prof = _long(seq=40)
    assert "cut the 40-token sequence into 16 whole load-balanced chunks" in refusal(prof, 64, 1, 8)
    assert "x tensor-parallel degree 4 does not divide the 8 devices" in refusal(prof, 8, 4, 4)
    assert candidate_cp_degrees(prof, 8, 1) == [1, 2, 4] and candidate_cp_degrees(prof, 8, 8) == [1]
    with pytest.raises(PlannerInputError, match=r"--cp 2: profile .* does not declare"):
        candidate_cp_degrees(zoo, 8, 1, asked=(2,))
    assert candidate_cp_degrees(prof, 8, 4, asked=(1, 2, 4)) == [1, 2]  # 4 x 4 > 8 devices: skipped with t = 4


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cp=st.sampled_from([2, 4]),
    num_stages=st.integers(1, 3),
    num_microbatches=st.integers(1, 4),
    microbatch_size=st.sampled_from([1, 2]),
    schedule=st.sampled_from([ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B]),
    cap_gb=st.floats(2.0, 40.0),
    dp_degree=st.sampled_from([1, 2]),
    zero=st.sampled_from([0, 1]),
)
def test_dp_equals_brute_force_over_cp(cp, num_stages, num_microbatches, microbatch_size, schedule, cap_gb,
                                      dp_degree, zero):
    """The three exact solvers agree on the context-parallel view (its K/V buffers, its
    collectives in the layer times, its sync over dp x cp), and the DP's choice fits."""
    prof = gpt_profile(layers=4, hidden=512, heads=8, seq=8192, vocab=8000)
    # the "none" stack: CP-SAT's proxy X_s hides a stage's synchronisation behind earlier stages'
    # backward only, not its own as the DP's does under an overlapping stack (see the report)
    cm = device_cost_model(prof, small_cluster(16), OptimizerKind.ADAM_MIXED, DeviceGroup(cp_degree=cp), STACKS["none"])
    layout = Layout(num_stages=num_stages, dp_degree=dp_degree, cp_degree=cp, zero=ZeroStage(zero))
    table = StageTable(cm, microbatch_size, cap_gb * 1e9, sharding=layout.sharding(0))
    dp = solve_three_ways(table, layout=layout, num_microbatches=num_microbatches, schedule=schedule)
    if dp is None:
        return
    stops = list(dp.boundaries[1:]) + [cm.num_layers]
    for s, (a, z) in enumerate(zip(dp.boundaries, stops)):
        k = num_microbatches if schedule is ScheduleKind.GPIPE else min(num_stages - s, num_microbatches)
        mem = cm.stage_memory(a, z, dp.recompute[s], microbatch_size, k, layout.sharding(s), dp.selective[s])
        assert mem.total_bytes <= table.cap


def test_search_splits_a_long_sequence_and_the_plan_says_so() -> None:
    """A 4-layer GPT (h = 4096) at 131,072 tokens on 8 GPUs: with --cp 1 its activations need
    recomputation; with cp searched the plan has cp > 1 and is faster; its file records cp_degree
    and reads back; the runtime's check refuses it for the tiny zoo model's layers, not for its
    cp; a cp = 1 plan has no cp_degree key, a default request no cp_degrees (the golden corpus's
    case)."""
    prof = _long(hidden=4096, heads=32, seq=131072)
    cluster = PRESETS["h100-80gb-x8"]
    request = PlanRequest(global_batch=8, tp_degrees=(1,))
    best = plan(prof, cluster, request)
    one = plan(prof, cluster, PlanRequest(global_batch=8, tp_degrees=(1,), cp_degrees=(1,)))
    assert best.layout.cp_degree > 1 and best.predicted.iteration_ms < one.predicted.iteration_ms
    assert any(s.recompute or s.recompute_selective for s in one.stages)
    assert "cp_degree" not in plan_to_json(one) and plan_to_json(one)["provenance"]["request"]["cp_degrees"] == [1]
    assert "cp_degrees" not in plan_to_json(best)["provenance"]["request"]  # searched by default: not written
    doc = plan_to_json(best)
    assert doc["cp_degree"] == best.layout.cp_degree and plan_from_json(doc) == best
    assert f"CP={best.layout.cp_degree}" in best.layout.describe()
    from planner.models import load_workload
    from planner.runtime.check import check_plan

    # the runtime runs cp plans (tests/test_runtime_context.py); this one is refused for its layers, not its cp
    with pytest.raises(PlannerInputError, match="plan covers 6 layers but model 'gpt' has 4"):
        check_plan(best, load_workload("gpt:layers=2,hidden=16,heads=2,seq=4,vocab=32"), best.num_devices)
