"""ZBV and ZB-H2 (Qi et al., ICLR 2024, sec. 6 and 3.2): the V placement, the orders against
torch's, the dry run, in-flight counts, the simulator, the DP against brute force and the search
(the runtime runs both through the plan's action lists: tests/test_runtime_zero_bubble.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ChunkPlacement, ScheduleKind
from planner.artifacts.layout import Layout
from planner.artifacts.plan import dumps_plan, plan_from_json
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.schedule import ActionKind, ScheduleError, build_schedule, inflight_counts, parse_action, validate_schedule
from planner.simulation import SegmentKind, simulate, simulate_iteration_ms
from planner.solve import plan
from planner.solve.prices import StageTable
from tests.chains import chain_profile, layer_dicts, small_cluster
from tests.plan_factory import stage_terms
from tests.test_zero_bubble import assert_dp_is_bruteforce

ZBV, H1, H2 = ScheduleKind.ZBV, ScheduleKind.ZB_H1, ScheduleKind.ZB_H2


def v_layout(ranks: int, **kw) -> Layout:
    return Layout(num_stages=2 * ranks, virtual_stages_per_rank=2, placement=ChunkPlacement.V, **kw)


def as_text(schedule):
    return [" ".join(str(a) for a in rank) for rank in schedule]


# ---------------------------------------------------------------- placement


@pytest.mark.parametrize("ranks", [1, 2, 3, 5])
@pytest.mark.parametrize("v", [2, 4])
def test_v_placement_is_torchs_v_style(ranks, v):
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

    lay = Layout(num_stages=ranks * v, virtual_stages_per_rank=v, placement=ChunkPlacement.V, dp_degree=2)
    theirs = generate_stage_to_rank_mapping(ranks, ranks * v, style="v")
    assert {s: lay.pipeline_rank(s) for s in range(ranks * v)} == theirs
    for p in range(ranks):
        assert lay.stage_indices(p) == tuple(s for s in range(ranks * v) if theirs[s] == p)
    # rank_of stays the one formula: the pipeline rank, then the replica
    assert lay.rank_of(stage_idx=0, replica=1) == 1
    assert lay.rank_of(stage_idx=ranks * v - 1, replica=1) == 1
    # a loop layout is unchanged: p, p + P, ...
    loop = Layout(num_stages=ranks * v, virtual_stages_per_rank=v)
    assert loop.stage_indices(0) == tuple(range(0, ranks * v, ranks))


def test_v_placement_needs_an_even_chunk_count_and_the_plan_its_schedule():
    with pytest.raises(ValueError, match="even virtual_stages_per_rank"):
        Layout(num_stages=3, virtual_stages_per_rank=3, placement=ChunkPlacement.V)
    with pytest.raises(PlannerInputError, match="virtual_stages_per_rank must be 2"):
        build_schedule(ZBV, 6, 4, 3)
    with pytest.raises(PlannerInputError, match="one stage per rank"):
        build_schedule(H2, 4, 4, 2)
    assert v_layout(2).describe(pipeline_ranks=True) == "4 stages on P=2 pipeline ranks (2 each, in a V) x D=1, no ZeRO"


# ---------------------------------------------------------------- orders


def test_zbv_order_literal():
    # rank 0 holds chunks 0 and 3 (the first and the last), rank 1 chunks 1 and 2
    assert as_text(build_schedule(ZBV, 4, 3, 2)) == [
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 3F2 3I2 3W2 0I1 0W1 0I2 0W2",
        "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1I1 2I2 1I2 1W1 2W2 1W2",
    ]


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 9, 16])
def test_zbv_matches_torch_schedule_zbv_zero_bubble(ranks, m):
    from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble

    sched = ScheduleZBVZeroBubble.__new__(ScheduleZBVZeroBubble)
    sched.pp_group_size, sched._n_microbatches, sched.num_stages = ranks, m, 2 * ranks
    theirs = [" ".join(str(a) for a in sched._calculate_single_rank_operations(r) if a is not None) for r in range(ranks)]
    ours = build_schedule(ZBV, 2 * ranks, m, 2)
    assert as_text(ours) == theirs
    grid = validate_schedule(ours, 2 * ranks, m)
    assert sum(a is not None for row in grid for a in row) == 3 * 2 * ranks * m


def test_zb_h2_order_literal_and_dry_run():
    # rank 0 warms up with 2P - 1 = 3 forwards (ZB-H1: P - 1 = 1)
    assert as_text(build_schedule(H2, 2, 4)) == [
        "0F0 0F1 0F2 0F3 0I0 0W0 0I1 0W1 0I2 0W2 0I3 0W3",
        "1F0 1F1 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1I3 1W2 1W3",
    ]
    for p in (1, 2, 3, 4, 6):
        for m in (1, 2, 3, 5, 8, 13):
            validate_schedule(build_schedule(H2, p, m), p, m)


def test_dry_run_points_at_a_zbv_deadlock():
    # rank 1 runs chunk 2's forward before chunk 1's: 2F0 waits for 1F0 on the same rank
    rows = ("0F0 3F0 3I0 3W0 0I0 0W0", "2F0 1F0 2I0 2W0 1I0 1W0")
    bad = tuple(tuple(parse_action(t) for t in row.split()) for row in rows)
    with pytest.raises(ScheduleError) as err:
        validate_schedule(bad, 4, 1)
    assert "<-- ERROR HERE" in err.value.grid


# ---------------------------------------------------------------- in flight


def _peaks_by_hand(schedule, num_stages):
    live = [0] * num_stages
    peak = [0] * num_stages
    for order in schedule:
        for a in order:
            live[a.stage_idx] += 1 if a.kind is ActionKind.FORWARD else -1 if a.kind is ActionKind.BACKWARD_WEIGHT else 0
            peak[a.stage_idx] = max(peak[a.stage_idx], live[a.stage_idx])
    return tuple(peak)


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
def test_inflight_counts_are_the_orders(ranks, m):
    lay = v_layout(ranks)
    ks = inflight_counts(ZBV, lay, m)
    assert ks == _peaks_by_hand(build_schedule(ZBV, 2 * ranks, m, 2), 2 * ranks)
    if m >= 2 * ranks:  # the module docstring's closed forms
        assert ks == tuple(2 * ranks - s for s in range(2 * ranks))
        assert {ks[r] + ks[2 * ranks - 1 - r] for r in range(ranks)} == {2 * ranks + 1}
    h2 = inflight_counts(H2, Layout(num_stages=ranks), m)
    assert h2 == _peaks_by_hand(build_schedule(H2, ranks, m), ranks)
    assert h2 == tuple(min(m, 2 * ranks - r) for r in range(ranks))
    if m % max(1, m // ranks) == 0:  # a shape ZB-H1 (torch's rounds) runs
        assert all(a >= b for a, b in zip(h2, inflight_counts(H1, Layout(num_stages=ranks), m)))


# ---------------------------------------------------------------- simulator


def _uniform(n, f, i, w):
    return stage_terms([f] * n, [i + w] * n, wgrad_ms=[w] * n)


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 16), (8, 32)])
def test_simulated_zbv_and_zb_h2_against_zb_h1(p, m):
    """Same total work (each ZBV chunk half a stage), no communication: ZBV's bubble is below
    ZB-H1's; ZB-H2 ties ZB-H1 at F = I = W (the tail after the last I stays under a synchronous
    optimizer step, see planner.schedule.zero_bubble) and never beats it with I > W."""
    for f, i, w in ((1.0, 1.0, 1.0), (1.0, 1.3, 0.7), (1.0, 0.8, 1.2)):
        h1 = simulate_iteration_ms(H1, m, _uniform(p, f, i, w))
        h2 = simulate_iteration_ms(H2, m, _uniform(p, f, i, w))
        zbv = simulate_iteration_ms(ZBV, m, _uniform(2 * p, f / 2, i / 2, w / 2), virtual_stages_per_rank=2)
        ideal = m * (f + i + w)
        assert ideal - 1e-9 <= zbv < h1
        assert h2 >= h1 - 1e-9
        if f == i == w:
            assert math.isclose(h2, h1)
            assert math.isclose(h1, ideal + (p - 1) * (f + i - w))


# ---------------------------------------------------------------- DP and brute force

ZB_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@ZB_SETTINGS
@given(
    layers=layer_dicts(6),
    wfracs=st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6),
    ranks=st.integers(1, 3),
    num_microbatches=st.integers(1, 8),
    microbatch_size=st.sampled_from([1, 2]),
    cap_gb=st.floats(0.05, 2.0),
    kind=st.sampled_from([ZBV, H2]),
)
def test_dp_equals_brute_force(layers, wfracs, ranks, num_microbatches, microbatch_size, cap_gb, kind):
    """The DP's objective for ZB-H2 (ZB-H1's, its own in-flight counts) and for ZBV (over the
    2P chunks, the turn of the V without a transfer): equal to the brute force's."""
    layers = [dict(d, wfrac=w) for d, w in zip(layers, wfracs)]
    cm = CostModel(chain_profile(layers), small_cluster(8))
    layout = v_layout(ranks) if kind is ZBV else Layout(num_stages=ranks)
    table = StageTable(cm, microbatch_size, cap_gb * 1e9 / layout.virtual_stages_per_rank)
    kw = dict(layout=layout, num_microbatches=num_microbatches, schedule=kind)
    assert_dp_is_bruteforce(table, kw, microbatch_size)


def test_bruteforce_counts_the_schedules_own_microbatches_in_flight():
    """Found by the test above: the brute force took ZBV's in-flight counts at J's ``M`` (``v (M -
    P) + P``, 4 here) instead of the schedule's 3 micro-batches, so the first chunk held one more
    than it does and nothing fitted where the DP's plan does (its stages checked at the real
    counts by :func:`assert_dp_is_bruteforce`)."""
    layers = [dict(fwd=1.0, bwd=1.0, params=0, saved=18509140.0, inp=7996953.0, out=1e7, wfrac=0.0),
              dict(fwd=1.0, bwd=3.0, params=1, saved=0.0, inp=3.0, out=2.0, wfrac=0.0),
              dict(fwd=4.0, bwd=3.0, params=1, saved=0.0, inp=3.0, out=2.0, wfrac=0.0),
              dict(fwd=1.0, bwd=1.0, params=0, saved=0.0, inp=0.0, out=0.0, wfrac=0.0)]
    cm = CostModel(chain_profile(layers), small_cluster(8))
    layout = v_layout(2)
    table = StageTable(cm, 1, 0.125e9 / 2)
    kw = dict(layout=layout, num_microbatches=3, schedule=ZBV)
    assert inflight_counts(ZBV, layout, 3) != inflight_counts(ZBV, layout, 4)
    assert_dp_is_bruteforce(table, kw, 1)


# ---------------------------------------------------------------- search and plan


def _profile():
    layers = [dict(fwd=1.0, bwd=2.0, params=1000, saved=1e6, inp=1e5, out=1e5, wfrac=0.5, wsaved=0.4)] * 8
    return chain_profile(layers)


def test_solver_searches_zbv_and_zb_h2_when_named():
    prof, cluster = _profile(), small_cluster(4)
    base = PlanRequest(global_batch=16, schedules=(ScheduleKind.ONE_F_ONE_B, H1), dp_degree=1, max_stages=4)
    before = plan(prof, cluster, base)
    after = plan(prof, cluster, dataclasses.replace(base, schedules=base.schedules + (ZBV, H2)))
    assert after.schedule is ZBV
    assert after.layout.placement is ChunkPlacement.V and after.layout.virtual_stages_per_rank == 2
    assert after.predicted.iteration_ms < before.predicted.iteration_ms
    assert after.predicted.bubble_fraction < before.predicted.bubble_fraction
    # the file does not hold the placement: the schedule implies it, and it reads back equal
    again = plan_from_json(__import__("json").loads(dumps_plan(after)))
    assert again == after
    # the timeline draws F, I and W of both chunks; the turn of the V sends nothing
    timeline = simulate(after)
    assert {SegmentKind.FORWARD, SegmentKind.BACKWARD_INPUT, SegmentKind.BACKWARD_WEIGHT} <= {
        seg.kind for seg in timeline.segments()}
    p = after.layout.pipeline_size
    assert after.stages[p - 1].send_fwd_ms == 0.0 and after.stages[p].send_bwd_ms == 0.0
    # the busiest-rank bound sums each rank's own chunks (the V's, not round-robin)
    from planner.simulation.bounds import partition_bounds

    work = [s.fwd_ms + s.recompute_ms + s.bwd_ms for s in after.stages]
    per_rank = [work[r] + work[2 * p - 1 - r] for r in range(p)]
    assert math.isclose(partition_bounds(after).busiest_rank_ms, after.num_microbatches * max(per_rank))
    only_h2 = plan(prof, cluster, dataclasses.replace(base, schedules=(H2,), num_stages=4))
    assert only_h2.schedule is H2
    assert only_h2.stages[0].inflight_microbatches == min(only_h2.num_microbatches, 8)
    # torchtitan runs ZBV by torch's class; nothing runs ZB-H2
    from planner.report.export import torchtitan_config

    assert 'pipeline_parallel_schedule = "ZBVZeroBubble"' in torchtitan_config(after)
    with pytest.raises(PlannerInputError, match=r"schedule zb-h2: torch\.distributed\.pipelining has no class"):
        torchtitan_config(only_h2)


def test_plan_refuses_a_placement_its_schedule_does_not_use():
    prof, cluster = _profile(), small_cluster(4)
    best = plan(prof, cluster, PlanRequest(global_batch=16, schedules=(ZBV,), num_stages=2, dp_degree=1))
    with pytest.raises(ValueError, match="schedule interleaved-1f1b places chunks loop, the layout v"):
        dataclasses.replace(best, schedule=ScheduleKind.INTERLEAVED_1F1B)
