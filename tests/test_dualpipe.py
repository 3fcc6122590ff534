"""DualPipe-V (DeepSeek-V3 tech. report sec. 3.2.1 folded in a V; torch ``ScheduleDualPipeV``):
its order against torch's, the dry run, its in-flight counts, the simulator's pricing of its
whole backwards and overlapped pairs, and the search (the runtime runs it through the plan's
action lists: tests/test_runtime_zero_bubble.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ChunkPlacement, ScheduleKind
from planner.artifacts.layout import Layout
from planner.artifacts.request import PlanRequest
from planner.schedule import ActionKind, build_schedule, held_counts, validate_schedule
from planner.schedule.dualpipe import dualpipe_v_steps
from planner.simulation import simulate, simulate_iteration_ms
from planner.solve import plan
from tests.chains import chain_profile, small_cluster
from tests.plan_factory import stage_terms

DPV, ZBV = ScheduleKind.DUALPIPE_V, ScheduleKind.ZBV


def v_layout(ranks: int) -> Layout:
    return Layout(num_stages=2 * ranks, virtual_stages_per_rank=2, placement=ChunkPlacement.V)


def _torch_steps(ranks: int, m: int) -> list[list[str]]:
    """torch's ``ScheduleDualPipeV.pipeline_order``, made as its ``__init__`` makes it (one
    ``_calculate_single_rank_operations`` per rank; the class needs live stages to construct)."""
    from torch.distributed.pipelining.schedules import ScheduleDualPipeV

    sched = ScheduleDualPipeV.__new__(ScheduleDualPipeV)
    sched.pp_group_size, sched._n_microbatches, sched._num_stages = ranks, m, 2 * ranks
    return [[str(a) for a in sched._calculate_single_rank_operations(r) if a is not None] for r in range(ranks)]


def _as_torch(step) -> str:
    """A step as torch prints it: ``(0F3;3B1)OVERLAP_F_B`` for an overlapped pair."""
    return f"({';'.join(map(str, step))})OVERLAP_F_B" if len(step) == 2 else str(step[0])


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("extra", [0, 1, 2, 3, 5, 8])
def test_order_is_torchs_pipeline_order(ranks, extra):
    m = 2 * ranks + extra
    theirs = _torch_steps(ranks, m)
    assert [[_as_torch(s) for s in dualpipe_v_steps(r, ranks, m)] for r in range(ranks)] == theirs
    # the planner's order: each step's actions in turn (an overlapped pair's forward first, as
    # torch's runtime runs its sub-actions)
    flat = [[str(a) for a in rank] for rank in build_schedule(DPV, 2 * ranks, m, 2)]
    assert flat == [[t for cell in rank for t in (cell[1:].split(")")[0].split(";") if cell[0] == "(" else [cell])]
                    for rank in theirs]
    grid = validate_schedule(build_schedule(DPV, 2 * ranks, m, 2), 2 * ranks, m)
    done = [a for row in grid for a in row if a is not None]
    whole = sum(a.kind is ActionKind.BACKWARD for a in done)
    split = sum(a.kind is ActionKind.BACKWARD_INPUT for a in done)
    assert whole + split == 2 * ranks * m and whole > 0 and split > 0
    assert split == sum(a.kind is ActionKind.BACKWARD_WEIGHT for a in done)


def test_order_literal_p2_m4():
    assert [[_as_torch(s) for s in dualpipe_v_steps(r, 2, 4)] for r in range(2)] == [
        ["0F0", "0F1", "0F2", "3F0", "3I0", "3W0", "3F1", "(0F3;3B1)OVERLAP_F_B", "(3F2;0B0)OVERLAP_F_B",
         "3B2", "(3F3;0B1)OVERLAP_F_B", "3B3", "0I2", "0W2", "0I3", "0W3"],
        ["1F0", "2F0", "1F1", "2F1", "1F2", "2B0", "(2F2;1B0)OVERLAP_F_B", "(1F3;2B1)OVERLAP_F_B",
         "(2F3;1B1)OVERLAP_F_B", "2B2", "1B2", "2I3", "1I3", "2W3", "1W3"],
    ]


def test_rules_are_torchs():
    with pytest.raises(PlannerInputError, match=r"dualpipe-v needs num_microbatches >= num_stages \(got M=3 < 4"):
        build_schedule(DPV, 4, 3, 2)
    with pytest.raises(PlannerInputError, match="virtual_stages_per_rank must be 2"):
        build_schedule(DPV, 4, 8, 1)


@pytest.mark.parametrize("ranks", [1, 2, 4, 8])
def test_holds_zbvs_counts(ranks):
    """Chunk s holds 2P - s micro-batches whole at its peak, none past I: ZBV's counts."""
    for m in (2 * ranks, 2 * ranks + 3, 4 * ranks):
        held = held_counts(DPV, v_layout(ranks), m)
        assert [(h.whole, h.pending) for h in held] == [(2 * ranks - s, 0) for s in range(2 * ranks)]
        assert held == held_counts(ZBV, v_layout(ranks), m)


def test_simulator_runs_a_whole_backward_as_i_plus_w():
    """A B of a schedule that splits the others takes I's time plus W's, and every chunk's
    busy time is M (F + I + W) whatever the mix; the iteration is at least the busiest rank."""
    m, f, i, w = 6, 1.0, 1.5, 0.7  # P = 2: four chunks
    terms = stage_terms([f] * 4, [i + w] * 4, wgrad_ms=[w] * 4)
    t = simulate_iteration_ms(DPV, m, terms, virtual_stages_per_rank=2)
    assert t >= 2 * m * (f + i + w) - 1e-9
    # no W at all: the same order, every backward its I
    no_w = simulate_iteration_ms(DPV, m, stage_terms([f] * 4, [i] * 4, wgrad_ms=[0.0] * 4), virtual_stages_per_rank=2)
    assert no_w < t


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 16), (8, 32)])
def test_simulated_against_zbv(p, m):
    """Uniform chunks, sends of 0.1 ms: DualPipe-V's pairs run one after the other on the
    rank (torch's runtime runs OVERLAP_F_B's sub-actions in turn), so on one device the overlap
    hides only the sends, which the simulator already runs beside compute. It is within 1% of
    ZBV here, below 1F1B on stages twice as long."""
    n = 2 * p
    kw = dict(send_fwd_ms=[0.1] * n, send_bwd_ms=[0.1] * n)
    terms = stage_terms([1.0] * n, [2.0] * n, wgrad_ms=[1.0] * n, **kw)
    dpv = simulate_iteration_ms(DPV, m, terms, virtual_stages_per_rank=2)
    zbv = simulate_iteration_ms(ZBV, m, terms, virtual_stages_per_rank=2)
    one = simulate_iteration_ms(ScheduleKind.ONE_F_ONE_B, m, stage_terms([2.0] * p, [4.0] * p, send_fwd_ms=[0.1] * p,
                                                                         send_bwd_ms=[0.1] * p))
    assert m * 6.0 <= zbv <= dpv <= zbv * 1.01 and dpv < one


def _profile():
    layers = [dict(fwd=1.0, bwd=2.0, params=1000, saved=1e6, inp=1e5, out=1e5, wfrac=0.5, wsaved=0.4)] * 8
    return chain_profile(layers)


def test_searched_by_name_and_by_default():
    prof, cluster = _profile(), small_cluster(4)
    assert DPV in PlanRequest().schedules
    only = plan(prof, cluster, PlanRequest(global_batch=16, schedules=(DPV,), num_stages=2, dp_degree=1))
    assert only.schedule is DPV and only.layout.placement is ChunkPlacement.V
    assert only.num_microbatches >= 4
    timeline = simulate(only)
    assert math.isclose(timeline.iteration_ms, only.predicted.iteration_ms)
    kinds = {a.kind for rank in timeline.orders for a in rank}
    assert {ActionKind.BACKWARD, ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT} <= kinds
    # each pass its own time: a whole B is I and W together
    for t in timeline.actions():
        st = only.stages[t.action.stage_idx]
        want = {ActionKind.FORWARD: st.fwd_ms, ActionKind.BACKWARD: st.bwd_ms + st.recompute_ms,
                ActionKind.BACKWARD_INPUT: st.bwd_ms - st.wgrad_ms + st.recompute_ms,
                ActionKind.BACKWARD_WEIGHT: st.wgrad_ms}[t.action.kind]
        assert math.isclose(t.end_ms - t.start_ms, want, abs_tol=1e-9), (str(t.action), t.end_ms - t.start_ms, want)
    assert 0 < only.stages[0].wgrad_ms < only.stages[0].bwd_ms
    for stage, h in zip(only.stages, held_counts(DPV, only.layout, only.num_microbatches)):
        assert stage.inflight_microbatches == h.whole
    # beside ZBV: the search keeps the faster, and both are priced
    both = plan(prof, cluster, dataclasses.replace(PlanRequest(global_batch=16, num_stages=2, dp_degree=1),
                                                   schedules=(ZBV, DPV)))
    zbv = plan(prof, cluster, PlanRequest(global_batch=16, schedules=(ZBV,), num_stages=2, dp_degree=1))
    assert both.predicted.iteration_ms <= min(zbv.predicted.iteration_ms, only.predicted.iteration_ms) + 1e-9
    from planner.report.export import torchtitan_config

    assert 'pipeline_parallel_schedule = "DualPipeV"' in torchtitan_config(only)


# ---------------------------------------------------------------- DualPipe (two copies)

DUAL = ScheduleKind.DUALPIPE


def test_dualpipe_is_the_v_per_copy_with_a_turn_that_crosses():
    """DualPipe on 4 devices (two copies, each device a stage of each) is priced as DualPipe-V's
    order on each copy's 2 pipeline ranks, the copies a data-parallel pair, M per copy: the same
    stages and orders as DualPipe-V at D = 2, but for the turn of the V, which crosses to the
    other copy's device (the copies' link) where DualPipe-V's stays on one."""
    prof, cluster = _profile(), small_cluster(4)
    dual = plan(prof, cluster, PlanRequest(global_batch=16, schedules=(DUAL,), num_stages=2))
    dpv = plan(prof, cluster, PlanRequest(global_batch=16, schedules=(DPV,), num_stages=2, dp_degree=2))
    assert dual.schedule is DUAL and dual.layout.placement is ChunkPlacement.MIRROR
    assert (dual.layout.dp_degree, dual.layout.pipeline_size, dual.num_devices) == (2, 2, 4)
    assert dual.num_microbatches >= 4 and dual.layout.num_stages == 4
    assert [s.layer_start for s in dual.stages] == [s.layer_start for s in dpv.stages]
    assert dual.num_microbatches == dpv.num_microbatches
    turn = dual.layout.pipeline_size - 1
    for a, b in zip(dual.stages, dpv.stages, strict=True):
        if a.stage_idx in (turn, turn + 1):
            continue
        assert (a.fwd_ms, a.bwd_ms, a.send_fwd_ms, a.send_bwd_ms, a.memory) == (b.fwd_ms, b.bwd_ms, b.send_fwd_ms,
                                                                               b.send_bwd_ms, b.memory)
    assert dpv.stages[turn].send_fwd_ms == 0.0 and dual.stages[turn].send_fwd_ms > 0.0
    assert dual.stages[turn + 1].send_bwd_ms == dual.stages[turn].send_fwd_ms
    assert dual.layout.downstream_rank(turn) == dual.layout.rank_of(stage_idx=turn, replica=1)
    assert dual.predicted.iteration_ms > dpv.predicted.iteration_ms
    # with the turn's transfer taken out, the replay is DualPipe-V's
    from planner.simulation.simulator import stage_terms_of

    terms = [stage_terms_of(s) for s in dual.stages]
    assert math.isclose(simulate_iteration_ms(DUAL, dual.num_microbatches, terms, virtual_stages_per_rank=2),
                        dual.predicted.iteration_ms)
    terms[turn] = dataclasses.replace(terms[turn], send_fwd_ms=0.0)
    terms[turn + 1] = dataclasses.replace(terms[turn + 1], send_bwd_ms=0.0)
    assert simulate_iteration_ms(DUAL, dual.num_microbatches, terms, virtual_stages_per_rank=2) == pytest.approx(
        simulate_iteration_ms(DPV, dual.num_microbatches, terms, virtual_stages_per_rank=2))
    # two copies of the parameters: each device holds two chunks, as DualPipe-V at D = 2
    assert dual.stages[0].memory.param_bytes == dpv.stages[0].memory.param_bytes > 0
    # the file does not hold the placement: the schedule implies it, and it reads back equal
    from planner.artifacts.plan import dumps_plan, plan_from_json

    assert plan_from_json(__import__("json").loads(dumps_plan(dual))) == dual


def test_dualpipe_needs_its_two_copies_and_is_refused_at_run():
    with pytest.raises(ValueError, match=r"mirror placement needs .* even dp_degree"):
        Layout(num_stages=4, virtual_stages_per_rank=2, placement=ChunkPlacement.MIRROR, dp_degree=1)
    prof, cluster = _profile(), small_cluster(4)
    assert DUAL not in PlanRequest().schedules  # searched when named
    # on D = 1 it has no layout: nothing to plan
    from planner.artifacts.errors import InfeasibleError

    with pytest.raises((InfeasibleError, PlannerInputError)):
        plan(prof, cluster, PlanRequest(global_batch=16, schedules=(DUAL,), num_stages=2, dp_degree=1))
    dual = plan(prof, cluster, PlanRequest(global_batch=16, schedules=(DUAL,), num_stages=2))
    from planner.runtime.check import check_schedule

    with pytest.raises(PlannerInputError, match=r"^plan: schedule 'dualpipe' is not run: .*torch 2\.13 has no DualPipe"):
        check_schedule(dual)
    from planner.report.export import torchtitan_config, write_plan_schedule_csv

    with pytest.raises(PlannerInputError, match="schedule dualpipe"):
        write_plan_schedule_csv(dual, "unused.csv")
    with pytest.raises(PlannerInputError, match="no class"):
        torchtitan_config(dual)


@pytest.mark.parametrize(("p", "m"), [(1, 2), (2, 4), (2, 7), (3, 6), (3, 11), (4, 8), (4, 13)])
def test_held_states_cover_every_point_of_the_walk(p, m):
    """Every (whole, past I) point of each chunk's walk (a whole B frees its micro-batch at once)
    is at most one of its Held.states, so ``held_bytes`` is the walk's byte peak for any
    activation and keep sizes, a keep above the activations included."""
    from planner.schedule import held_bytes

    layout = v_layout(p)
    held = held_counts(DPV, layout, m)
    state = [(0, 0)] * layout.num_stages
    walks: list[list[tuple[int, int]]] = [[] for _ in range(layout.num_stages)]
    step = {ActionKind.FORWARD: (1, 0), ActionKind.BACKWARD_INPUT: (-1, 1), ActionKind.BACKWARD_WEIGHT: (0, -1),
            ActionKind.BACKWARD: (-1, 0)}
    for order in build_schedule(DPV, 2 * p, m, 2):
        for a in order:
            dw, dp = step[a.kind]
            state[a.stage_idx] = (state[a.stage_idx][0] + dw, state[a.stage_idx][1] + dp)
            walks[a.stage_idx].append(state[a.stage_idx])
    for s, points in enumerate(walks):
        assert min(min(pt) for pt in points) >= 0 and points[-1] == (0, 0)
        assert all(any(w <= x and q <= y for x, y in held[s].states) for w, q in points), (s, held[s].states)
        for act, keep in ((10.0, 3.0), (2.0, 9.0)):
            assert held_bytes(held[s], act, keep) == max(w * act + q * keep for w, q in points)


def test_zbv_and_dualpipe_v_share_one_chain_dp():
    """The chain DP reads the split and the held counts only, equal for ZBV and DualPipe-V, so a
    search solves their configuration once (planner.solve.optimum.remembered); the shared optimum
    is the one DualPipe-V's own solve finds, and another count or layout is solved anew."""
    from planner.cost import CostModel
    from planner.solve.chain_dp import solve_chain
    from planner.solve.optimum import Solved, remembered
    from planner.solve.prices import StageTable
    from planner.solve.space import Config

    cm = CostModel(_profile(), small_cluster(4))
    table = StageTable(cm, 1, 1e9)
    calls = []

    def counted(*args, **kw):
        calls.append(kw["schedule"])
        return solve_chain(*args, **kw)

    solved: Solved = {}

    def solve(layout, num_microbatches, schedule):
        return remembered(counted, table, Config(layout, 1, num_microbatches, schedule), (), solved)

    lay = v_layout(2)
    zbv = solve(lay, 8, ZBV)
    dpv = solve(lay, 8, DPV)
    assert calls == [ZBV] and dpv is zbv
    assert dpv == solve_chain(table, layout=lay, num_microbatches=8, schedule=DPV)
    solve(lay, 4, DPV)
    solve(v_layout(1), 8, DPV)
    assert calls == [ZBV, DPV, DPV]


@pytest.mark.parametrize(("ranks", "m"), [(2, 4), (2, 7), (4, 8), (4, 11)])
def test_runtime_checks_the_plans_order_against_torchs_class(ranks, m):
    """Before a run, ``planner.runtime.torch_order`` builds torch's own ``ScheduleDualPipeV`` over
    the rank's stages (here stand-ins holding what its ``__init__`` reads: the group's size and
    rank, the stage count, a module) and compares its ``pipeline_order``, overlapped pairs read as
    their sub-actions, with the plan's: equal for DualPipe-V's, a ZBV order refused at its first
    differing step."""
    from types import SimpleNamespace

    import torch

    from planner.runtime.torch_order import check_torch_order, torch_order

    for rank in range(ranks):
        stages = [SimpleNamespace(num_stages=2 * ranks, group_size=ranks, group_rank=rank, submod=torch.nn.Linear(1, 1))
                  for _ in range(2)]
        ours = build_schedule(DPV, 2 * ranks, m, 2)
        assert torch_order(stages, DPV, m, torch.nn.functional.mse_loss) == [[str(a) for a in r] for r in ours]
        check_torch_order(stages, DPV, ours, m, torch.nn.functional.mse_loss)
        with pytest.raises(PlannerInputError, match=r"torch's ScheduleDualPipeV runs \w+ at compute step \d+ of rank 0"):
            check_torch_order(stages, DPV, build_schedule(ZBV, 2 * ranks, m, 2), m, torch.nn.functional.mse_loss)
    assert torch_order([], ZBV, m, torch.nn.functional.mse_loss) is None  # no class compared for ZBV here
