"""The event simulator against closed forms and hand-computed timelines."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import SolverKind
from planner.artifacts.layout import Layout
from planner.artifacts.plan import load_plan
from planner.artifacts.request import PlanRequest, ScheduleKind
from planner.simulation import SegmentKind, simulate, simulate_iteration_ms
from planner.simulation.simulator import simulate_summary, stage_terms_of
from planner.solve import plan as solve
from planner.solve.build import rebuild_plan
from tests.chains import chain_profile, small_cluster
from tests.golden_plans import GOLDEN
from tests.plan_factory import make_plan, stage_terms

GPIPE, ONE_F_ONE_B, INTERLEAVED = ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED_1F1B

small_ms = st.integers(min_value=0, max_value=9).map(float)


def low_level(kind, m, fwd, bwd, *, rc=None, sf=None, sb=None, ar=None, v=1):
    return simulate_iteration_ms(kind, m, stage_terms(fwd, bwd, rc, sf, sb, ar), virtual_stages_per_rank=v)


@settings(max_examples=60, deadline=None)
@given(
    stages=st.lists(st.tuples(small_ms, small_ms), min_size=1, max_size=6),
    m=st.integers(min_value=1, max_value=10),
)
def test_gpipe_without_communication_is_its_closed_form(stages, m):
    fwd = [f for f, _ in stages]
    bwd = [b for _, b in stages]
    closed = sum(fwd) + (m - 1) * max(fwd) + sum(bwd) + (m - 1) * max(bwd)
    assert low_level(GPIPE, m, fwd, bwd) == closed
    assert simulate(make_plan(GPIPE, m, fwd, bwd)).iteration_ms == closed


def test_gpipe_closed_form_by_hand():
    # F = (1, 3, 2), B = (2, 5, 1), M = 4: 6 + 3 x 3 + 8 + 3 x 5 = 38
    assert low_level(GPIPE, 4, [1.0, 3.0, 2.0], [2.0, 5.0, 1.0]) == 38.0


@pytest.mark.parametrize("p, m", [(1, 1), (1, 5), (2, 2), (3, 7), (4, 4), (4, 9), (6, 16)])
@pytest.mark.parametrize("f, b", [(1.0, 2.0), (3.0, 3.0), (2.0, 0.5)])
def test_1f1b_uniform_is_m_plus_p_minus_1_times_f_plus_b(p, m, f, b):
    expected = (m + p - 1) * (f + b)
    assert low_level(ONE_F_ONE_B, m, [f] * p, [b] * p) == expected
    timeline = simulate(make_plan(ONE_F_ONE_B, m, [f] * p, [b] * p))
    assert timeline.iteration_ms == expected
    assert timeline.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("p, m", [(1, 3), (3, 1), (4, 4), (4, 10), (5, 3)])
def test_peak_inflight_is_m_for_gpipe(p, m):
    timeline = simulate(make_plan(GPIPE, m, [1.0] * p, [2.0] * p))
    assert [s.peak_inflight_microbatches for s in timeline.stages] == [m] * p


@pytest.mark.parametrize("p, m", [(1, 3), (4, 4), (4, 10), (6, 7)])
def test_peak_inflight_is_min_p_minus_s_m_for_1f1b(p, m):
    # uneven stage times must not change the count
    timeline = simulate(make_plan(ONE_F_ONE_B, m, [1.0 + s % 3 for s in range(p)], [2.0 + s % 2 for s in range(p)]))
    assert [s.peak_inflight_microbatches for s in timeline.stages] == [min(p - s, m) for s in range(p)]


def test_memory_over_time_and_peak_by_hand():
    # 1F1B, P = 3, M = 4; static 4000 B, 1000 B per micro-batch; stage 0 recomputes (+300 B workspace).
    plan = make_plan(
        ONE_F_ONE_B, 4, [1.0] * 3, [2.0] * 3, recompute_ms=[0.5, 0.0, 0.0], workspace_bytes=[300, 0, 0]
    )
    timeline = simulate(plan)
    assert [t.peak_bytes for t in timeline.memory] == [4000 + 3 * 1000 + 300, 4000 + 2 * 1000, 4000 + 1000]
    assert timeline.peak_memory_bytes == 7300
    trace = timeline.memory[2]  # last stage: F, B, F, B, ... 0 -> 1 -> 0 micro-batches
    assert trace.bytes_[0] == 4000 and trace.times_ms[0] == 0.0
    assert set(trace.bytes_) == {4000, 5000}
    assert trace.bytes_[-1] == 4000  # everything freed at the end


def test_recompute_is_its_own_segment_before_the_backward():
    timeline = simulate(make_plan(GPIPE, 1, [1.0, 1.0], [2.0, 2.0], recompute_ms=[0.5, 0.0]))
    segs = {(s.kind, s.stage_idx): s for s in timeline.segments()}
    rc, bw = segs[(SegmentKind.RECOMPUTE, 0)], segs[(SegmentKind.BACKWARD, 0)]
    # 0F0 [0,1], 1F0 [1,2], 1B0 [2,4], then stage 0 recomputes [4,4.5] and back-props [4.5,6.5]
    assert (rc.start_ms, rc.end_ms, bw.start_ms, bw.end_ms) == (4.0, 4.5, 4.5, 6.5)
    assert timeline.iteration_ms == 6.5


def test_transfers_delay_dependants_but_take_no_compute():
    # M = 1: 0F0 [0,1], send 0.25, 1F0 [1.25,3.25], 1B0 [3.25,6.25], send 0.5, 0B0 [6.75,8.75]
    plan = make_plan(GPIPE, 1, [1.0, 2.0], [2.0, 3.0], send_fwd_ms=[0.25, 9.0], send_bwd_ms=[9.0, 0.5])
    timeline = simulate(plan)
    assert timeline.iteration_ms == 8.75
    assert timeline.rank_busy_ms == (3.0, 5.0)
    kinds = [s.kind for s in timeline.segments()]
    assert kinds.count(SegmentKind.SEND_FWD) == 1 and kinds.count(SegmentKind.SEND_BWD) == 1


def test_allreduce_hidden_in_the_cooldown_of_earlier_stages():
    # 1F1B, P = 4, M = 8, F = 1, B = 2: stage s's last backward ends at 33 - 2 s, the pipeline at 33.
    base = dict(kind=ONE_F_ONE_B, num_microbatches=8, fwd_ms=[1.0] * 4, bwd_ms=[2.0] * 4)
    hidden = simulate(make_plan(**base, allreduce_ms=[0.0, 0.0, 0.0, 6.0]))  # fits 27 + 6 <= 33
    assert hidden.stages[3].last_backward_end_ms == 27.0
    assert hidden.exposed_allreduce_ms == 0.0
    assert hidden.iteration_ms == 33.0
    exposed = simulate(make_plan(**base, allreduce_ms=[0.0, 0.0, 0.0, 10.0]))  # 27 + 10 = 37
    assert exposed.exposed_allreduce_ms == 4.0 and exposed.iteration_ms == 37.0
    first = simulate(make_plan(**base, allreduce_ms=[1.5, 0.0, 0.0, 0.0]))  # stage 0 ends last: all exposed
    assert first.exposed_allreduce_ms == 1.5 and first.iteration_ms == 34.5


def test_pure_data_parallel_and_single_microbatch():
    # P = 1 (pure data parallel): 4 x (1 + 2) compute, then the all-reduce
    timeline = simulate(make_plan(GPIPE, 4, [1.0], [2.0], allreduce_ms=[5.0]))
    assert timeline.iteration_ms == 17.0 and timeline.exposed_allreduce_ms == 5.0
    assert timeline.bubble_fraction == 0.0
    assert simulate(make_plan(ONE_F_ONE_B, 1, [1.0], [2.0])).iteration_ms == 3.0
    # M = 1 through 3 stages is a single chain
    assert simulate(make_plan(GPIPE, 1, [1.0, 2.0, 3.0], [4.0, 5.0, 6.0])).iteration_ms == 21.0


def test_interleaving_shrinks_the_bubble():
    # Same per-rank work (F = 2, B = 4 per rank and micro-batch) on 4 ranks, M = 8:
    # 1F1B: (M + P - 1)(F + B) = 66; interleaved, v = 2: (M + (P - 1)/v)(F + B) = 57.
    assert low_level(ONE_F_ONE_B, 8, [2.0] * 4, [4.0] * 4) == 66.0
    timeline = simulate(make_plan(INTERLEAVED, 8, [1.0] * 8, [2.0] * 8, virtual_stages_per_rank=2))
    assert timeline.iteration_ms == 57.0
    assert timeline.num_ranks == 4 and timeline.stages[5].rank == 1
    # a device holds its two stages' memory at once
    assert timeline.rank_peak_memory_bytes[0] > max(timeline.memory[0].peak_bytes, timeline.memory[4].peak_bytes)


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from([GPIPE, ONE_F_ONE_B]),
    stages=st.lists(st.tuples(*[st.floats(0, 5)] * 6), min_size=1, max_size=5),
    extra=st.integers(0, 6),
)
def test_low_level_entry_agrees_with_the_timeline(kind, stages, extra):
    m = len(stages) + extra
    cols = [list(c) for c in zip(*stages)]
    plan = make_plan(
        kind, m, cols[0], cols[1], recompute_ms=cols[2], send_fwd_ms=cols[3], send_bwd_ms=cols[4], allreduce_ms=cols[5]
    )
    timeline = simulate(plan)
    assert simulate_iteration_ms(kind, m, stage_terms(*cols)) == timeline.iteration_ms
    assert timeline.iteration_ms == pytest.approx(timeline.compute_end_ms + timeline.exposed_allreduce_ms)
    for t in timeline.actions():  # per-rank order respected, no overlap on a rank
        assert t.end_ms >= t.start_ms
    for rank_starts, rank_ends in zip(timeline.start_ms, timeline.end_ms):
        assert all(e <= s + 1e-12 for e, s in zip(rank_ends, rank_starts[1:]))


def test_simulate_is_deterministic():
    plan = make_plan(ONE_F_ONE_B, 6, [1.0, 2.5, 0.5], [2.0, 1.0, 3.0], send_fwd_ms=[0.1] * 3, allreduce_ms=[1.0] * 3)
    assert simulate(plan) == simulate(plan)


def test_bad_inputs_are_clear_errors():
    with pytest.raises(PlannerInputError, match="at least one stage"):
        simulate_iteration_ms(GPIPE, 2, [])
    with pytest.raises(PlannerInputError, match="fwd_ms must be >= 0 \\(got nan\\)"):
        simulate_iteration_ms(GPIPE, 2, stage_terms([1.0, float("nan")], [1.0] * 2))
    with pytest.raises(PlannerInputError, match=r"stage 1: wgrad_ms must not exceed bwd_ms \(got 2\.0 > 1\.0\)"):
        simulate_iteration_ms(ScheduleKind.ZB_H1, 2, stage_terms([1.0] * 2, [1.0] * 2, wgrad_ms=[0.5, 2.0]))
    with pytest.raises(PlannerInputError, match="M=2 < P=3"):
        simulate(make_plan(ONE_F_ONE_B, 2, [1.0] * 3, [1.0] * 3))

    from planner.artifacts.cluster import PRESETS

    one_gpu = PRESETS["a100-80gb-x8"].with_devices(1)
    with pytest.raises(PlannerInputError, match="the plan needs 2 devices but the cluster has 1"):
        simulate(make_plan(GPIPE, 2, [1.0] * 2, [1.0] * 2), cluster=one_gpu)


def test_cli_prints_the_summary_and_writes_figures(tmp_path, capsys):
    from planner.artifacts.plan import save_plan
    from planner.commands.cli import main

    plan_path = tmp_path / "plan.json"
    save_plan(make_plan(ONE_F_ONE_B, 8, [1.0] * 4, [2.0] * 4, allreduce_ms=[0.0, 0.0, 0.0, 10.0]), plan_path)
    out = {name: tmp_path / f"{name}.{ext}" for name, ext in (("timeline", "png"), ("memory", "png"), ("csv", "csv"))}
    argv = ["simulate", str(plan_path)] + [a for name, path in out.items() for a in (f"--{name}", str(path))]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "iteration        37 ms" in text and "exposed all-reduce 4 ms" in text
    assert all(path.stat().st_size > 0 for path in out.values())
    assert out["csv"].read_text().splitlines()[3] == "3F0,3B0,3F1,3B1,3F2,3B2,3F3,3B3,3F4,3B4,3F5,3B5,3F6,3B6,3F7,3B7"
    assert main(["simulate", str(tmp_path / "missing.json")]) == 2
    assert "missing.json: no such file" in capsys.readouterr().err


def test_schedule_simulator_bounds_and_figures_do_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, planner.schedule, planner.simulation, planner.simulation.timeline, planner.simulation.bounds, "
        "planner.report.figures, planner.commands.simulate; "
        "assert not [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_predict_fills_the_plan_prediction():
    from planner.simulation import predict

    plan = make_plan(ONE_F_ONE_B, 8, [1.0] * 4, [2.0] * 4, allreduce_ms=[0.0, 0.0, 0.0, 10.0])
    pred = predict(plan)
    # bound via stage 3: 3 forwards before it + 8 x 3 of work + its 10 ms all-reduce = 37, tight here
    assert (pred.iteration_ms, pred.exposed_allreduce_ms, pred.partition_bound_ms) == (37.0, 4.0, 37.0)
    assert pred.throughput_samples_per_s == pytest.approx(8 / 37.0 * 1e3)
    assert pred.peak_memory_bytes == 4000 + 4 * 1000
    assert pred.bubble_fraction == pytest.approx(3 / 11)


def test_integer_orders_match_the_schedule_builder():
    from planner.schedule import build_schedule
    from planner.schedule.actions import ActionKind
    from planner.schedule.build import encoded_orders

    for kind in (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B):
        for p, m in [(1, 1), (2, 2), (3, 7), (4, 4), (5, 12)]:
            expected = tuple(
                tuple((a.stage_idx, a.kind is ActionKind.BACKWARD, a.mb_idx) for a in acts)
                for acts in build_schedule(kind, p, m, 1)
            )
            encoded_orders.cache_clear()
            assert encoded_orders(kind, p, m, 1) == expected, (kind, p, m)


def test_split_integer_orders_are_the_actions_codes():
    """The zero-bubble and V orders' integer triples (codes by identity, not the dict) are the
    Actions' with ``_SPLIT_CODE``: F 0, I 1, W 2, a whole B 3 (DualPipe-V's steady phase)."""
    from planner.schedule import build_schedule
    from planner.schedule.build import _SPLIT_CODE, encoded_orders

    for kind, v in ((ScheduleKind.ZB_H1, 1), (ScheduleKind.ZB_H2, 1), (ScheduleKind.ZBV, 2),
                    (ScheduleKind.DUALPIPE_V, 2)):
        for ranks, m in [(1, 2), (2, 4), (3, 6), (4, 8), (4, 12)]:
            n = ranks * v
            expected = tuple(tuple((a.stage_idx, _SPLIT_CODE[a.kind], a.mb_idx) for a in acts)
                             for acts in build_schedule(kind, n, m, v))
            encoded_orders.cache_clear()
            assert encoded_orders(kind, n, m, v) == expected, (kind, ranks, m)


def _figures(summary_or_timeline) -> tuple[float, int, float, float]:
    t = summary_or_timeline
    return t.iteration_ms, t.peak_memory_bytes, t.bubble_fraction, t.exposed_allreduce_ms


def test_summary_is_the_timelines_figures_on_the_golden_plans():
    """:func:`simulate_summary` (what plans are predicted with) gives every golden plan the
    iteration time, peak memory, bubble and exposed synchronisation its full Timeline has,
    exactly (interleaved ranks, recomputation, ZeRO's gathers ahead among them)."""
    paths = sorted(GOLDEN.glob("*.json"))
    assert len(paths) > 50
    for path in paths:
        plan = load_plan(path)
        assert _figures(simulate_summary(plan)) == _figures(simulate(plan)), path.name


@pytest.mark.parametrize("kind", [ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED_1F1B,
                                  ScheduleKind.ZB_H1, ScheduleKind.ZB_H2, ScheduleKind.ZBV])
def test_summary_is_the_timelines_figures_for_every_schedule(kind):
    """The same on solved plans of every schedule (split backwards keeping part of their saves
    until W), with and without recomputation, and replicated per stage."""
    layers = [dict(fwd=1.0 + i % 3, bwd=2.0 + i % 2, params=1000, saved=1e6 * (1 + i % 2), inp=1e5, out=1e5,
                   wfrac=0.5, wsaved=0.4) for i in range(8)]
    prof = chain_profile(layers)
    base = PlanRequest(global_batch=16, schedules=(kind,), dp_degree=1, num_stages=4, per_stage_replication=False)
    recomputed = 0
    for cap in (None, 9e6, 6e6):
        request = base if cap is None else dataclasses.replace(base, memory_cap_bytes=int(cap))
        try:
            found = solve(prof, small_cluster(4, memory_bytes=10**9), request)
        except Exception:  # too tight for this schedule
            continue
        recomputed += any(s.recompute for s in found.stages)
        assert _figures(simulate_summary(found)) == _figures(simulate(found)), (kind, cap)
    assert recomputed or kind is ScheduleKind.ZBV
    if kind in (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B):
        copies = solve(prof, small_cluster(3), PlanRequest(global_batch=12, schedules=(kind,), microbatch_sizes=(1,)))
        replicated = rebuild_plan(prof, small_cluster(3), PlanRequest(global_batch=12), schedule=kind,
                                  layout=Layout(num_stages=2, stage_replicas=(2, 1)), boundaries=(0, 4),
                                  recompute=[(1,), ()], microbatch_size=1, solver=SolverKind.GIVEN)
        for p in (copies, replicated):
            assert _figures(simulate_summary(p)) == _figures(simulate(p))


@pytest.mark.parametrize("schedules", [None, (ScheduleKind.ZB_H1,), (ScheduleKind.INTERLEAVED_1F1B,)])
def test_plan_stages_are_the_records_the_search_replays(schedules: tuple[ScheduleKind, ...] | None) -> None:
    """A stage is priced by one function on both paths (:func:`planner.cost.price_stages`): a
    chosen plan's stages, read back as :class:`StageTerms`, are its partition priced again under
    its layout, and the solver's fast entry replays those records to the plan's own iteration
    time (the Plan path's replay), which the prediction lengthens by the straggler share."""
    from pathlib import Path

    from planner.artifacts.cluster import PRESETS
    from planner.artifacts.profile import load_profile
    from planner.cost import price_stages
    from planner.cost.groups import base_cluster
    from planner.cost.tensor_parallel import device_cost_model

    profile = load_profile(Path(__file__).resolve().parents[1] / "profiles" / "gpt3-1.3b-a100.json")
    cluster = PRESETS["a100-80gb-x8"]
    request = PlanRequest(global_batch=64) if schedules is None else PlanRequest(global_batch=64, schedules=schedules)
    plan = solve(profile, cluster, request)
    cm = device_cost_model(profile, base_cluster(cluster, cluster.num_devices), request.optimizer, plan.layout.group,
                           request.stack)
    st = plan.stages
    selective = [s.recompute_selective for s in st] if any(s.recompute_selective for s in st) else []
    priced = price_stages(cm, plan.layout, plan.microbatch_size, [s.layer_start for s in st],
                          [s.recompute for s in st], selective, split_backward=plan.schedule.splits_backward)
    assert priced == tuple(stage_terms_of(s) for s in st)
    fast = simulate_iteration_ms(plan.schedule, plan.num_microbatches, priced,
                                 virtual_stages_per_rank=plan.layout.virtual_stages_per_rank,
                                 replicas=plan.layout.stage_replicas)
    # the prediction is the replay lengthened by the straggler share (planner.simulation.predict)
    assert fast == simulate(plan).iteration_ms
    assert plan.predicted.iteration_ms == pytest.approx(fast * (1.0 + plan.predicted.straggler_fraction), rel=1e-12)
