"""The plan's action lists through torch's action-list runtime (``planner.runtime.actions``),
in one process without a network: torch's lowering of every schedule the planner builds keeps
the plan's stage map and per-rank compute order, and its dry run with messages finishes; a
lowering that differs is refused naming the rank and step; the order's own dry run before
launch (``planner.runtime.check.check_schedule``) names the rank and step of a deadlock. Then,
on two gloo processes, a stage's sends hold their tensors only until its next send
(``SendQueue``), where torch's runtime alone holds them to the end of the step."""

from __future__ import annotations

import json
import os
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.layout import Layout
from planner.runtime import check
from planner.runtime.actions import SendQueue, check_lowering, torch_actions
from planner.schedule import Action, ActionKind, build_schedule
from tests.factories import make_plan

#: (kind, stages, micro-batches, chunks per rank): every schedule the runtime runs, at shapes
#: with M below, at and above the pipeline's depth
SHAPES = [
    *[(k, p, m, 1) for k in (ScheduleKind.GPIPE, ScheduleKind.ZB_H2) for p, m in ((1, 3), (2, 1), (4, 3), (4, 8))],
    *[(ScheduleKind.ONE_F_ONE_B, p, m, 1) for p, m in ((1, 2), (2, 2), (4, 4), (4, 9))],
    *[(ScheduleKind.ZB_H1, p, m, 1) for p, m in ((2, 2), (4, 3), (4, 8), (3, 9))],
    *[(ScheduleKind.INTERLEAVED_1F1B, s, m, 2) for s, m in ((4, 2), (4, 4), (8, 8), (8, 12))],
    (ScheduleKind.INTERLEAVED_1F1B, 12, 6, 3),
    *[(ScheduleKind.ZBV, s, m, 2) for s, m in ((2, 1), (4, 2), (4, 6), (8, 4), (8, 16))],
]


def _layout(kind: ScheduleKind, num_stages: int, v: int) -> Layout:
    return Layout(num_stages=num_stages, virtual_stages_per_rank=v, placement=kind.placement)


def lower(order: Any, num_stages: int, num_microbatches: int) -> tuple[dict[int, list[_Action]], dict[int, int]]:
    """torch's own lowering (``_PipelineScheduleRuntime._prepare_schedule_with_comms``) of the
    per-rank lists, run on a runtime without stages: what every rank computes at construction."""
    sched = object.__new__(_PipelineScheduleRuntime)
    sched._stages, sched.pp_group_size, sched._num_stages = [], len(order), num_stages
    sched._n_microbatches, sched._defer_pp_recv = num_microbatches, False
    sched._prepare_schedule_with_comms(torch_actions(order))
    return sched.pipeline_order_with_comms, sched.stage_index_to_group_rank


@pytest.mark.parametrize(("kind", "num_stages", "num_mb", "v"), SHAPES)
def test_torch_lowering_keeps_the_plans_order(kind: ScheduleKind, num_stages: int, num_mb: int, v: int) -> None:
    order = build_schedule(kind, num_stages, num_mb, v)
    lowered, stage_to_rank = lower(order, num_stages, num_mb)
    check_lowering(order, lowered, stage_to_rank, kind, _layout(kind, num_stages, v))
    for rank, actions in lowered.items():  # every message a rank waits for is posted before the compute that needs it
        seen: set[str] = set()
        for a in actions:
            kind_letter = a.computation_type.value
            if kind_letter == "F" and a.stage_index > 0 and stage_to_rank[a.stage_index - 1] != rank:
                assert f"{a.stage_index}RECV_F{a.microbatch_index}" in seen, (rank, a)
            if kind_letter in ("B", "I") and a.stage_index < num_stages - 1 and stage_to_rank[a.stage_index + 1] != rank:
                assert f"{a.stage_index}RECV_B{a.microbatch_index}" in seen, (rank, a)
            seen.add(str(a))


def test_a_lowering_that_differs_from_the_plan_is_refused_naming_rank_and_step() -> None:
    kind, layout = ScheduleKind.ONE_F_ONE_B, _layout(ScheduleKind.ONE_F_ONE_B, 2, 1)
    order = build_schedule(kind, 2, 4)
    lowered, stage_to_rank = lower(order, 2, 4)
    rank1 = lowered[1]
    computes = [i for i, a in enumerate(rank1) if a.is_compute_op]
    i, j = computes[1], computes[2]  # 1B0 and 1F1 swapped
    swapped = {**lowered, 1: [*rank1[:i], rank1[j], *rank1[i + 1 : j], rank1[i], *rank1[j + 1 :]]}
    with pytest.raises(PlannerInputError, match=r"would run 1F1 at compute step 1 of rank 1, the plan's 1f1b order 1B0"):
        check_lowering(order, swapped, stage_to_rank, kind, layout)
    with pytest.raises(PlannerInputError, match=r"torch places stage 0 of the plan's 1f1b order on pipeline rank 1"):
        check_lowering(order, lowered, {0: 1, 1: 0}, kind, layout)
    no_recv = {**lowered, 1: [a for a in rank1 if str(a) != "1RECV_F2"]}
    with pytest.raises(PlannerInputError, match=r"does not finish: Schedule is not progressing \(.*1F2"):
        check_lowering(order, no_recv, stage_to_rank, kind, layout)


def test_the_order_is_dry_run_before_launch_naming_rank_and_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """``check_schedule`` (the launcher's preflight and every rank's check) dry-runs the plan's
    order: here a GPipe plan whose rank 0 runs 0B0 before 0F1 while rank 1 waits for 0F1."""
    plan = make_plan(("a", "b", "c", "d"), (2,), num_microbatches=2)
    check.check_schedule(plan, "p.json")

    def act(text: str) -> Action:
        return Action(stage_idx=int(text[0]), kind=ActionKind(text[1]), mb_idx=int(text[2]))

    stuck = (tuple(map(act, ["0F0", "0B0", "0F1", "0B1"])), tuple(map(act, ["1F0", "1F1", "1B0", "1B1"])))
    monkeypatch.setattr(check, "layout_schedule", lambda *_: stuck)
    with pytest.raises(
        PlannerInputError,
        match=r"^p.json: rank 0, step 2: deadlock \(rank 0 waits at 0B0 for 1B0; "
        r"rank 1 waits at 1F1 for 0F1\)$",
    ):
        check.check_schedule(plan, "p.json")


def test_the_launcher_finds_the_action_runtime_without_importing_it() -> None:
    """What the runtime needs of torch's ``schedules.py`` (``check.ACTION_RUNTIME``), read off
    its source by the preflight, is what importing it gives."""
    from torch.distributed.pipelining import schedules

    assert check.missing_action_runtime() == ""
    assert all(hasattr(schedules, name) for name in check.ACTION_RUNTIME)


def test_zb_h2_is_a_schedule_the_runtime_runs() -> None:
    plan = make_plan(("a", "b", "c", "d"), (1, 2, 3), num_microbatches=5, schedule=ScheduleKind.ZB_H2)
    check.check_schedule(plan, "h2.json")  # refused before: torch has no ZB-H2 class
    assert ScheduleKind.ZB_H2 in check.SUPPORTED_SCHEDULES


def _sender_and_receiver(rank: int, store_path: str, out: str) -> None:
    store = dist.FileStore(store_path, 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    n = 4
    if rank == 1:
        time.sleep(0.2)  # the sends are posted before their receives
        got = []
        for _ in range(n):
            buf = torch.empty(1000)
            dist.recv(buf, 0)
            got.append(float(buf[0]))
        Path(out).write_text(json.dumps(got))
    else:
        queue = SendQueue()
        refs: list[weakref.ref[torch.Tensor]] = []
        alive: list[list[bool]] = []
        for i in range(n):
            tensor = torch.full((1000,), float(i))
            refs.append(weakref.ref(tensor))
            queue.post([dist.P2POp(dist.isend, tensor, 1)])
            del tensor
            alive.append([r() is not None for r in refs])
        queue.drain()
        alive.append([r() is not None for r in refs])
        Path(out + ".sender").write_text(json.dumps(alive))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_a_stage_holds_a_sent_tensor_only_until_its_next_send(tmp_path: Path) -> None:
    """Four sends of one direction through a ``SendQueue``: after posting send i, the tensors of
    sends < i are released (their works waited for and dropped), and after the drain none is held."""
    out = str(tmp_path / "out")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(_sender_and_receiver, args=(str(tmp_path / "store"), out), nprocs=2, start_method="spawn")
    assert json.loads(Path(out).read_text()) == [0.0, 1.0, 2.0, 3.0]
    alive = json.loads(Path(out + ".sender").read_text())
    assert alive == [[True], [False, True], [False, False, True], [False, False, False, True], [False] * 4]
