"""Schedules as data: printing, orders drawn as literal tables, rules, dry run, torch's CSV."""

from __future__ import annotations

import pytest

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.request import ScheduleKind
from planner.schedule import (
    Action,
    ActionKind,
    ScheduleError,
    build_schedule,
    parse_action,
    read_schedule_csv,
    stage_inflight,
    validate_schedule,
    write_schedule_csv,
)

GPIPE, ONE_F_ONE_B, INTERLEAVED = ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED_1F1B


def as_text(schedule):
    return [" ".join(str(a) for a in rank) for rank in schedule]


def parse_rows(rows):
    return tuple(tuple(parse_action(cell) for cell in row.split()) for row in rows)


def test_action_prints_and_parses_back():
    a = Action(stage_idx=2, kind=ActionKind.FORWARD, mb_idx=0)
    assert str(a) == "2F0"
    assert parse_action("1B13") == Action(stage_idx=1, kind=ActionKind.BACKWARD, mb_idx=13)
    assert Action.parse(str(a)) == a
    for bad in ("", "F0", "2X0", "2F", "-1F0", "2SEND_F0"):
        with pytest.raises(PlannerInputError, match="invalid action"):
            parse_action(bad)


def test_gpipe_order():
    assert as_text(build_schedule(GPIPE, 2, 3)) == [
        "0F0 0F1 0F2 0B0 0B1 0B2",
        "1F0 1F1 1F2 1B0 1B1 1B2",
    ]


def test_1f1b_order_matches_torch_schedule1f1b():
    # torch Schedule1F1B: warm-up min(M, P - s) forwards, then B, F alternating.
    assert as_text(build_schedule(ONE_F_ONE_B, 3, 4)) == [
        "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3",
        "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3",
        "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3",
    ]


def test_interleaved_order_literal():
    # P = 2 ranks, v = 2: rank 0 holds stages 0 and 2, rank 1 holds 1 and 3.
    assert as_text(build_schedule(INTERLEAVED, 4, 2, virtual_stages_per_rank=2)) == [
        "0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1",
        "1F0 1F1 3F0 3B0 3F1 3B1 1B0 1B1",
    ]


def torch_interleaved_order(ranks, v, m):
    """torch's own ScheduleInterleaved1F1B order computation, with its None padding dropped."""
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B

    sched = ScheduleInterleaved1F1B.__new__(ScheduleInterleaved1F1B)
    sched.pp_group_size, sched.n_local_stages, sched._n_microbatches = ranks, v, m
    sched.number_of_rounds = max(1, m // ranks)
    sched.microbatches_per_round = m // sched.number_of_rounds
    return [" ".join(str(a) for a in sched._calculate_single_rank_operations(r) if a is not None) for r in range(ranks)]


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("v", [1, 2, 3])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 6, 8, 9])
def test_interleaved_matches_torch(ranks, v, m):
    rounds = max(1, m // ranks)
    if m % rounds:
        with pytest.raises(PlannerInputError, match="multiple of the number of rounds"):
            build_schedule(INTERLEAVED, ranks * v, m, v)
        return
    ours = build_schedule(INTERLEAVED, ranks * v, m, v)
    assert as_text(ours) == torch_interleaved_order(ranks, v, m)
    validate_schedule(ours, ranks * v, m)


@pytest.mark.parametrize("kind", [GPIPE, ONE_F_ONE_B])
@pytest.mark.parametrize("p", [1, 2, 3, 5])
@pytest.mark.parametrize("m", [1, 2, 5, 8])
def test_built_schedules_pass_the_dry_run(kind, p, m):
    if kind is ONE_F_ONE_B and m < p:
        return
    grid = validate_schedule(build_schedule(kind, p, m), p, m)
    # each action once; lock-step 1F1B takes 2(M + P - 1) steps, like GPipe
    assert sum(a is not None for row in grid for a in row) == 2 * p * m
    assert len(grid) == 2 * (m + p - 1)


def test_rules_have_clear_errors():
    with pytest.raises(PlannerInputError, match=r"M=2 < P=4"):
        build_schedule(ONE_F_ONE_B, 4, 2)
    with pytest.raises(PlannerInputError, match="virtual_stages_per_rank must be 1"):
        build_schedule(GPIPE, 4, 8, virtual_stages_per_rank=2)
    with pytest.raises(PlannerInputError, match="divisible by virtual_stages_per_rank"):
        build_schedule(INTERLEAVED, 6, 8, virtual_stages_per_rank=4)
    with pytest.raises(PlannerInputError, match=r"rounds max\(1, M // P\) = 2"):
        build_schedule(INTERLEAVED, 8, 9, virtual_stages_per_rank=2)  # 4 ranks, 9 % 2 != 0
    with pytest.raises(PlannerInputError, match="num_microbatches must be >= 1"):
        build_schedule(GPIPE, 2, 0)


def test_backward_before_forward_is_rejected_with_rank_and_step():
    broken = parse_rows(["0F0 0F1 0B0 0B1", "1F0 1B1 1B0 1F1"])  # rank 1 runs 1B1 at step 1
    with pytest.raises(ScheduleError) as err:
        validate_schedule(broken, 2, 2)
    assert (err.value.rank, err.value.step) == (1, 1)
    assert "rank 1, step 1" in str(err.value) and "1B1 runs before its forward 1F1" in str(err.value)
    assert "Step 1: 0F1    1B1    <-- ERROR HERE" in err.value.grid


def test_deadlock_is_rejected_with_rank_and_step():
    # rank 1 wants micro-batch 1 first; rank 0 will not send it before 0B0, which needs 1B0.
    broken = parse_rows(["0F0 0B0 0F1 0B1", "1F1 1F0 1B0 1B1"])
    with pytest.raises(ScheduleError) as err:
        validate_schedule(broken, 2, 2)
    assert (err.value.rank, err.value.step) == (0, 1)
    assert "deadlock" in str(err.value)
    assert "rank 0 waits at 0B0 for 1B0" in str(err.value) and "rank 1 waits at 1F1 for 0F1" in str(err.value)
    assert err.value.grid.splitlines()[1].startswith("Step 0: 0F0")
    assert err.value.grid.splitlines()[2].endswith("<-- ERROR HERE")
    assert "\n" not in str(err.value)  # one line for the CLI; the grid is on .grid


def test_structural_errors():
    with pytest.raises(ScheduleError, match="appears twice"):
        validate_schedule(parse_rows(["0F0 0F0 0B0"]), 1, 1)
    with pytest.raises(ScheduleError, match="already runs on rank 0"):
        validate_schedule(parse_rows(["0F0 0B0", "0F1 0B1"]), 1, 2)
    with pytest.raises(ScheduleError, match="outside 1 stages"):
        validate_schedule(parse_rows(["0F0 1F0"]), 1, 1)
    with pytest.raises(PlannerInputError, match="missing 1 action"):
        validate_schedule(parse_rows(["0F0"]), 1, 1)


def test_csv_round_trip(tmp_path):
    schedule = build_schedule(INTERLEAVED, 4, 4, virtual_stages_per_rank=2)
    path = tmp_path / "s.csv"
    write_schedule_csv(schedule, path)
    assert path.read_text().splitlines()[0].startswith("0F0,0F1,")
    assert read_schedule_csv(path) == schedule


def test_a_schedule_csv_is_read_as_every_input_is(tmp_path):
    """Issue 52: a FIFO named like a CSV is refused in one line (``open`` blocked on it before)."""
    import os

    fifo = tmp_path / "s.csv"
    os.mkfifo(fifo)
    with pytest.raises(PlannerInputError, match=r"s\.csv: is a FIFO \(named pipe\), expected a schedule CSV"):
        read_schedule_csv(fifo)


@pytest.fixture
def fake_process_group():
    """A 4-rank process group that needs no network (torch's fake backend)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    yield 4
    dist.destroy_process_group()


def torch_load_csv(path, num_stages, num_microbatches):
    """Load with torch.distributed.pipelining's own CSV loader on a real (rank 0) pipeline stage."""
    import torch
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    stage = PipelineStage(torch.nn.Linear(4, 4), stage_index=0, num_stages=num_stages, device=torch.device("cpu"))
    sched = _PipelineScheduleRuntime([stage], n_microbatches=num_microbatches, loss_fn=lambda out, target: out.sum())
    sched._load_csv(str(path), format="compute_only")
    return sched


def test_1f1b_csv_loads_in_torch_pipelining(tmp_path, fake_process_group):
    from torch.distributed.pipelining.schedules import _simulate_comms_compute

    p, m = fake_process_group, 8
    path = tmp_path / "1f1b.csv"
    write_schedule_csv(build_schedule(ONE_F_ONE_B, p, m), path)
    sched = torch_load_csv(path, p, m)
    assert sched.stage_index_to_group_rank == {0: 0, 1: 1, 2: 2, 3: 3}
    assert [str(a) for a in sched.pipeline_order[3]] == [str(a) for a in build_schedule(ONE_F_ONE_B, p, m)[3]]
    # torch lowers it to sends/receives; its own dry run of that lowered schedule completes
    comm_kinds = {"F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B"}
    lowered = {
        r: [a for a in acts if a.computation_type.value in comm_kinds] for r, acts in sched.pipeline_order_with_comms.items()
    }
    assert "1RECV_F0" in [str(a) for a in lowered[1]]
    _simulate_comms_compute(lowered, lambda s: sched.stage_index_to_group_rank[s], p)


def test_torch_loader_rejects_a_broken_csv(tmp_path, fake_process_group):
    """The loader check above can fail: torch refuses a backward before its forward."""
    path = tmp_path / "bad.csv"
    rows = [" ".join(str(a) for a in r) for r in build_schedule(ONE_F_ONE_B, 4, 4)]
    rows[3] = "3B0 3F0 3F1 3B1 3F2 3B2 3F3 3B3"
    path.write_text("\n".join(r.replace(" ", ",") for r in rows) + "\n")
    with pytest.raises(AssertionError, match="without first running Forward"):
        torch_load_csv(path, 4, 4)


def test_interleaved_inflight_counts_equal_a_walk_over_the_actions():
    """The in-flight counts of interleaved 1F1B come from the order's arrays; a walk over the
    built Actions (forwards done minus backwards done, per stage, its peak) must agree."""
    checked = 0
    for ranks in range(1, 7):
        for v in (2, 3, 4):
            for m in range(1, 33):
                try:
                    sched = build_schedule(ScheduleKind.INTERLEAVED_1F1B, ranks * v, m, v)
                except PlannerInputError:
                    continue
                live = [0] * (ranks * v)
                peak = [0] * (ranks * v)
                for order in sched:
                    for a in order:
                        live[a.stage_idx] += 1 if a.kind is ActionKind.FORWARD else -1
                        peak[a.stage_idx] = max(peak[a.stage_idx], live[a.stage_idx])
                assert stage_inflight(ScheduleKind.INTERLEAVED_1F1B, ranks * v, m, v) == tuple(peak), (ranks, v, m)
                checked += 1
    assert checked > 300
