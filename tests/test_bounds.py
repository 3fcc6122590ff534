"""Lower bounds (by hand, and never beaten by the simulator) and the ME index."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import SolverKind
from planner.artifacts.layout import Layout
from planner.artifacts.request import PlanRequest, ScheduleKind
from planner.cost import CostModel
from planner.simulation import simulate, simulate_iteration_ms
from planner.simulation.bounds import machine_bound_ms, me_index_of
from planner.simulation.bounds import partition_bound_ms as lower_bound_ms
from planner.simulation.bounds import partition_bounds as lower_bounds
from planner.simulation.bounds import partition_bounds_from_arrays as lower_bounds_from_arrays
from planner.simulation.predict import me_index
from planner.solve.build import build_plan
from planner.solve.problem import Problem
from tests.chains import chain_profile, layer_dicts, small_cluster
from tests.plan_factory import make_plan, stage_terms

GPIPE, ONE_F_ONE_B, INTERLEAVED = ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED_1F1B


def test_bounds_by_hand():
    # M = 4; w = F + RC + B = (3, 6, 2); 3 ranks.
    b = lower_bounds_from_arrays(4, [1.0, 2.0, 1.0], [2.0, 3.0, 1.0], [0.0, 1.0, 0.0])
    assert b.average_work_ms == 4 * 11 / 3
    assert b.busiest_rank_ms == 24.0  # stage 1: 4 x 6
    # stage 0: 0 + 12 + 0; stage 1: 1 + 24 + 2 = 27; stage 2: 3 + 8 + 6 = 17
    assert (b.critical_path_ms, b.critical_stage_idx) == (27.0, 1)
    assert b.lower_bound_ms == 27.0


def test_transfers_and_allreduce_tighten_the_critical_path():
    # stage 1 of 2, M = 2, F = B = 1: send_fwd 0.5 before, 2 x 2 of work, then max(B0 + send_bwd 0.25, AR 3)
    b = lower_bounds_from_arrays(2, [1.0, 1.0], [1.0, 1.0], None, [0.5, 0.0], [0.0, 0.25], [0.0, 3.0])
    assert b.critical_path_ms == 1.5 + 4.0 + 3.0
    b = lower_bounds_from_arrays(2, [1.0, 1.0], [1.0, 1.0], None, [0.5, 0.0], [0.0, 0.25], [0.0, 0.0])
    assert b.critical_path_ms == 1.5 + 4.0 + 1.25


def test_uniform_1f1b_meets_its_bound():
    plan = make_plan(ONE_F_ONE_B, 8, [1.0] * 4, [2.0] * 4)
    assert lower_bound_ms(plan) == simulate(plan).iteration_ms == (8 + 4 - 1) * 3.0


def test_interleaved_bound_counts_a_rank_s_stages():
    plan = make_plan(INTERLEAVED, 4, [1.0] * 4, [1.0] * 4, virtual_stages_per_rank=2)
    assert lower_bounds(plan).busiest_rank_ms == 4 * 2 * 2.0
    assert lower_bounds(plan).average_work_ms == 4 * 8.0 / 2


@settings(max_examples=120, deadline=None)
@given(
    kind=st.sampled_from([GPIPE, ONE_F_ONE_B, INTERLEAVED]),
    stages=st.lists(st.tuples(*[st.floats(0.0, 10.0)] * 6), min_size=1, max_size=6),
    m_extra=st.integers(0, 8),
    v=st.sampled_from([1, 2]),
)
def test_simulator_never_beats_the_lower_bounds(kind, stages, m_extra, v):
    if kind is not INTERLEAVED or len(stages) % 2:
        v = 1
    m = len(stages) // v + m_extra
    if kind is INTERLEAVED and m % max(1, m // (len(stages) // v)):
        return
    cols = [list(c) for c in zip(*stages)]
    it = simulate_iteration_ms(kind, m, stage_terms(*cols), virtual_stages_per_rank=v)
    bound = lower_bounds_from_arrays(m, *cols, virtual_stages_per_rank=v).lower_bound_ms
    assert it >= bound - 1e-9 * max(1.0, bound)


def test_me_index():
    assert me_index_of(1.80, 0.43, 1.0, 1.0) == pytest.approx(4.186, abs=1e-3)  # the seed's +80% / -57%
    gpipe = make_plan(GPIPE, 8, [1.0] * 4, [2.0] * 4, activation_bytes=[1000] * 4, static_bytes=[0] * 4)
    one_f = make_plan(ONE_F_ONE_B, 8, [1.0] * 4, [2.0] * 4, activation_bytes=[1000] * 4, static_bytes=[0] * 4)
    # same time (33 ms: GPipe 4 + 7 + 8 + 14 = 33, 1F1B 11 x 3); peaks 8000 vs 4000 bytes
    assert me_index(one_f, gpipe) == pytest.approx(2.0)
    assert me_index(gpipe, gpipe) == pytest.approx(1.0)
    # numbers already in plan.predicted are used as they are
    faster = dataclasses.replace(
        one_f, predicted=dataclasses.replace(one_f.predicted, iteration_ms=16.5, peak_memory_bytes=4000)
    )
    assert me_index(faster, gpipe) == pytest.approx(4.0)
    with pytest.raises(PlannerInputError, match="positive"):
        me_index_of(1.0, 0.0, 1.0, 1.0)


def test_bad_shapes_are_clear_errors():
    with pytest.raises(PlannerInputError, match="divisible by v"):
        lower_bounds_from_arrays(4, [1.0] * 3, [1.0] * 3, virtual_stages_per_rank=2)
    with pytest.raises(PlannerInputError, match="M=0"):
        lower_bounds_from_arrays(0, [1.0], [1.0])


# ----------------------------------------------------------------- the machine bound and MFU


@settings(max_examples=25, deadline=None)
@given(layers=layer_dicts(5), n=st.sampled_from([1, 2, 4]), batch=st.sampled_from([4, 8]))
def test_machine_bound_bounds_every_solver_and_baseline(layers, n, batch):
    """No plan of any solver beats the machine bound; and it is the same number for all of them."""
    from planner.artifacts.errors import InfeasibleError
    from planner.simulation.bounds import machine_bound_ms
    from planner.solve import SOLVERS
    from planner.solve import plan as solve

    prof = chain_profile(layers)
    cluster = small_cluster(n, memory_bytes=10**11)
    bound = machine_bound_ms(prof, cluster, batch, n)
    for solver in SOLVERS:
        if solver == "ilp":
            continue  # slow; priced as dp (tests/test_solver_dp.py)
        try:
            p = solve(prof, cluster, PlanRequest(global_batch=batch, solver=solver))
        except InfeasibleError:
            continue
        assert p.predicted.machine_bound_ms == pytest.approx(bound)
        assert p.predicted.iteration_ms >= bound * (1 - 1e-9), solver


def test_machine_bound_takes_the_best_micro_batch_size():
    """Per-sample time falls with the micro-batch size when layers have a fixed cost: the bound
    uses the cheapest size any plan of this batch could use, not the profiled ones only."""
    from planner.simulation.bounds import machine_bound_ms

    prof = chain_profile([dict(fwd=1.0, fwd0=4.0, bwd=2.0, bwd0=4.0, params=1, saved=1.0, inp=1.0, out=1.0)])
    # b = 8 (the whole batch): (4 + 8) + (4 + 16) = 32 ms for 8 samples on one device; on 2, 16 ms
    assert machine_bound_ms(prof, small_cluster(2), 8, 2) == pytest.approx(16.0)


def test_default_plan_flops_and_mfu():
    """GPT-3 13B: model FLOPs = 3 x forward (72 B s l h^2 (1 + s/6h + V/12lh)), within 15% of the
    6 N tokens rule of thumb (attention and the head add to it); MFU = achieved / peak."""
    from planner.profiling.defaults import default_profile
    from planner.solve import plan as solve

    prof = default_profile()
    l, h, s, v = 40, 5120, 2048, 50257
    want = 72 * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    assert prof.model_flops_per_sample == pytest.approx(want, rel=1e-12)
    params = sum(layer.param_count for layer in prof.layers) - prof.tied[0].param_count
    ratio = prof.model_flops_per_sample / (6 * params * s)
    assert 1.0 < ratio < 1.15, ratio
    p = solve(prof, None, PlanRequest(global_batch=64))
    pred = p.predicted
    assert pred.model_flops_per_iteration == pytest.approx(64 * want)
    assert pred.achieved_tflops_per_device == pytest.approx(64 * want / (pred.iteration_ms / 1e3) / 8 / 1e12)
    assert pred.mfu == pytest.approx(pred.achieved_tflops_per_device / 312.0)
    # no GEMM of the profile runs above its largest GEMMs' efficiency; bubbles and the rest only lower it
    assert 0 < pred.mfu < prof.metadata["gemm_max_efficiency"]
    assert pred.machine_bound_ms <= pred.iteration_ms


def test_no_flops_when_the_profile_does_not_know_them():
    """A profile built without FLOPs (here a synthetic chain) plans with no MFU, not a guess."""
    from planner.solve import plan as solve

    prof = chain_profile([dict(fwd=1.0, bwd=2.0, params=1, saved=1.0, inp=1.0, out=1.0)])
    assert prof.model_flops_per_sample == 0.0
    pred = solve(prof, small_cluster(1), PlanRequest(global_batch=2)).predicted
    assert (pred.model_flops_per_iteration, pred.mfu) == (0.0, 0.0)


@settings(max_examples=120, deadline=None)
@given(
    stages=st.lists(st.tuples(*[st.floats(0.0, 10.0)] * 6), min_size=1, max_size=6),
    fracs=st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6),
    m_extra=st.integers(0, 8),
)
def test_simulator_never_beats_the_zero_bubble_bounds(stages, fracs, m_extra):
    """ZB-H1 runs W off the gradient's path: its bound (module docstring) still holds."""
    m = len(stages) + m_extra
    if m % max(1, m // len(stages)):
        return
    cols = [list(c) for c in zip(*stages)]
    wgrad = [b * f for b, f in zip(cols[1], fracs)]
    it = simulate_iteration_ms(ScheduleKind.ZB_H1, m, stage_terms(*cols, wgrad_ms=wgrad))
    bound = lower_bounds_from_arrays(m, *cols, wgrad_ms=wgrad).lower_bound_ms
    assert it >= bound - 1e-9 * max(1.0, bound)


def test_a_plan_on_fewer_devices_records_the_machine_bound_of_all_of_them():
    """zoo-resnet-cpu on 64 processes: the plan on 32 recorded ``machine_bound_ms`` 2.90, the bound
    on its own 32, where no plan on the 64 available runs faster than 1.45 (what ``plan_quality``
    compares with). The machine bound is over the devices available: ``limit/time`` is then the
    share of the machine the plan uses (at most 1/2 on half of it)."""
    profile = chain_profile([{"fwd": 1.0 + i, "bwd": 2.0, "params": 1000, "saved": 1000, "inp": 10, "out": 10}
                             for i in range(4)])
    cluster = small_cluster(4)
    request = PlanRequest(global_batch=8)
    cm = CostModel(profile, cluster)
    for available in (2, 4):
        problem = Problem.of(profile, cluster, request, SolverKind.DP, available)
        plan = build_plan(problem, cm, layout=Layout(num_stages=2), boundaries=[0, 2], recompute=[(), ()],
                          microbatch_size=1, schedule=ScheduleKind.ONE_F_ONE_B)
        assert plan.num_devices == 2
        assert plan.predicted.machine_bound_ms == pytest.approx(machine_bound_ms(profile, cluster, 8, available))
        assert plan.predicted.machine_bound_ms <= plan.predicted.iteration_ms * (1 + 1e-9)
    assert machine_bound_ms(profile, cluster, 8, 4) == pytest.approx(machine_bound_ms(profile, cluster, 8, 2) / 2)
