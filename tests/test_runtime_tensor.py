"""Tensor parallelism in the runtime: ranks placed by the plan's Layout, and what is refused
before any compute.

The numerics (t = 2 against one process, float64) run in tests/test_runtime_numerics.py's
launches; the profile-side split of the zoo blocks is checked in tests/test_tp_profile.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.layout import Layout
from planner.artifacts.plan import plan_to_json
from planner.models import load_workload
from planner.runtime.check import check_plan
from planner.runtime.tensor import split_layer_indices
from planner.runtime.topology import RankPosition, mesh_ranks
from tests.factories import make_plan

GPT = "gpt:layers=3,hidden=16,heads=2,seq=4,vocab=32"
GPT_3_HEADS = "gpt:layers=3,hidden=12,heads=3,seq=4,vocab=32"


def test_ranks_are_placed_by_the_plans_layout() -> None:
    """The runtime's mesh (``mesh_ranks``, from ``Layout.rank_of``) is arange(world) reshaped to
    (P, D, t) in row-major order, which ``init_device_mesh`` builds; a rank's position is its
    place in it; its lines are the pipeline (over p) and data-parallel (over replicas) groups;
    a stage's ranks are its D x t."""
    P, D, t = 2, 2, 2
    layout = Layout(num_stages=P, dp_degree=D, tp_degree=t)
    mesh = np.arange(P * D * t).reshape(P, D, t)
    assert mesh_ranks(layout).tolist() == mesh.reshape(P, D, 1, t).tolist()  # ("pp", "dp", "cp", "tp"), cp 1
    for rank in range(P * D * t):
        pos = RankPosition.of(layout, rank)
        assert mesh[pos.pipeline_rank, pos.replica, pos.tp_index] == rank
        assert (pos.stage_indices, pos.data_replica) == ((pos.pipeline_rank,), pos.replica)
        assert layout.dp_group(pos.pipeline_rank, pos.tp_index) == tuple(mesh[pos.pipeline_rank, :, pos.tp_index])
    workload = load_workload(GPT)
    plan = make_plan(workload.layer_names, (2,), dp_degree=D, tp_degree=t)
    assert [s.ranks for s in plan.stages] == [tuple(mesh[p].reshape(-1)) for p in range(P)]
    check_plan(plan, workload, 8)
    assert RankPosition.of(Layout(num_stages=2, dp_degree=2), 3).replica == 1  # t = 1: rank = p D + r
    interleaved = RankPosition.of(Layout(num_stages=4, virtual_stages_per_rank=2, dp_degree=2), 1)
    assert (interleaved.pipeline_rank, interleaved.replica, interleaved.stage_indices) == (0, 1, (0, 2))
    copy = RankPosition.of(Layout(num_stages=2, stage_replicas=(2, 1)), 1)  # stage 0's second copy
    assert (copy.pipeline_rank, copy.replica, copy.stage_indices, copy.data_replica) == (0, 1, (0,), 0)


def test_zoo_transformers_declare_their_split() -> None:
    gpt = load_workload(GPT)
    assert split_layer_indices(gpt, False) == (1, 2, 3)  # the blocks; embedding and tied head stay whole
    assert split_layer_indices(load_workload("gpt:layers=2,hidden=16,heads=2,seq=4,vocab=32,granularity=sublayer"), True) == (1, 2, 3, 4)
    assert split_layer_indices(load_workload("bert:layers=2,hidden=16,heads=2,seq=4,vocab=32"), False) == (1, 2)
    assert split_layer_indices(load_workload("tests.factories:mlp"), False) == ()


def test_refusals_before_compute() -> None:
    gpt = load_workload(GPT)
    names = gpt.layer_names
    with pytest.raises(PlannerInputError, match="tensor-parallel degree 2 does not divide the model's 3 attention heads"):
        check_plan(make_plan(names, (2,), tp_degree=2), load_workload(GPT_3_HEADS), 4)
    with pytest.raises(PlannerInputError, match="does not divide the 5 tokens per sample"):
        workload = load_workload("gpt:layers=3,hidden=16,heads=2,seq=5,vocab=32")
        check_plan(make_plan(names, (), tp_degree=2, sequence_parallel=True), workload, 2)
    with pytest.raises(PlannerInputError, match="declares no tensor-parallel split"):
        mlp = load_workload("tests.factories:mlp")
        check_plan(make_plan(mlp.layer_names, (2,), tp_degree=2), mlp, 4)
    check_plan(make_plan(names, (), dp_degree=2, tp_degree=2, zero=2), gpt, 4)  # ZeRO runs
    plan = make_plan(names, (2,), tp_degree=2)
    with pytest.raises(PlannerInputError, match=r"plan needs 4 processes \(2 stages x 1 replicas x tp 2\)"):
        check_plan(plan, gpt, 2)


def test_planner_run_refuses_tensor_parallel_stages_replicated_per_stage(tmp_path, capsys) -> None:
    """A plan file asking for per-stage copies of tensor-parallel stages is not a Layout: refused
    when the plan is loaded, one line and exit 2, before any model is built."""
    from planner.commands.cli import main

    workload = load_workload(GPT)
    data = plan_to_json(make_plan(workload.layer_names, (2,), tp_degree=2))
    data["stages"][0].update(replicas=2, ranks=[0, 1, 2, 3])
    data["stages"][1]["ranks"] = [4, 5]
    (tmp_path / "plan.json").write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["run", str(tmp_path / "plan.json"), "--model", GPT, "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("planner run: error:"), err
    assert "per-stage replication (replicas [2, 1]) needs one stage per rank, dp_degree 1, tp_degree 1 and cp_degree 1" in err


def test_planner_run_refuses_heads_not_divisible_with_one_line(tmp_path, capsys) -> None:
    """``planner run``: exit 2 with one line, before torchrun starts (the launcher runs the
    ranks' own check_plan; under torchrun each rank refuses the same way before joining a
    process group, see test_refusals_before_compute)."""
    from planner.commands.cli import main

    workload = load_workload(GPT_3_HEADS)
    plan = make_plan(workload.layer_names, (), tp_degree=2, schedule=ScheduleKind.ONE_F_ONE_B)
    (tmp_path / "plan.json").write_text(json.dumps(plan_to_json(plan)))
    capsys.readouterr()
    code = main(["run", str(tmp_path / "plan.json"), "--model", GPT_3_HEADS, "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.rstrip().endswith("tensor-parallel degree 2 does not divide the model's 3 attention heads"), err


@pytest.mark.slow
def test_planner_run_reports_a_tensor_parallel_plan_per_stage(tmp_path, capsys) -> None:
    """Measured zoo GPT profile -> ``planner plan --tp 2 --fixed-boundaries 2`` on 4 CPU devices (T=2 x P=2
    x D=1) -> ``planner run``: the losses, and measured beside predicted per stage."""
    from planner.artifacts.plan import load_plan
    from planner.commands.cli import main

    model = "gpt:layers=2,hidden=32,heads=4,seq=8,vocab=64"
    profile, plan = str(tmp_path / "p.json"), str(tmp_path / "plan.json")
    assert main(["profile", "--model", model, "--microbatch-sizes", "1,2", "--warmup", "0", "--repeats", "1",
                 "--no-progress", "--out", profile]) == 0
    assert main(["plan", "--profile", profile, "--cluster", "local-cpu", "--devices", "4", "--global-batch", "4",
                 "--tp", "2", "--fixed-boundaries", "2", "--schedules", "1f1b", "--out", plan]) == 0
    made = load_plan(plan)
    assert (made.layout.tp_degree, made.layout.num_stages, made.layout.dp_degree) == (2, 2, 1)
    capsys.readouterr()
    assert main(["run", plan, "--model", model, "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "x 2 tensor-parallel" in out and "losses per step:" in out
    table = out[out.index("stage  compute ms"):].splitlines()
    assert [row.split()[0] for row in table[2:4]] == ["0", "1"]  # one row per stage, measured and predicted
    assert all(len(row.split()) == 8 for row in table[2:4])
