"""Plans replicated per stage (planner.runtime.replicated, planner.runtime.exchange).

In one process: the micro-batch -> copy routing as a literal table, the exchange groups, the
dry run of every small replicated schedule (no hang under rendezvous sends, pairs in the same
order on both sides) and the plan checks. With torchrun (3 gloo processes, one launch for
all numerics configurations): training equals one process in float64 for [2, 1] and [1, 2]
pipelines under GPipe and 1F1B, with recomputation, SGD and AdamW, the tied-embedding zoo
GPT and the skip model, and a checkpoint-resume; the saved bytes each rank measures equal
the plan's activation_bytes_per_microbatch x in-flight micro-batches; and
``python -m planner.runtime`` runs a replicated plan and reports measured vs predicted.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from planner.artifacts.cluster import load_cluster
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import (
    DType,
    OptimizerKind,
    ScheduleKind,
    SolverKind,
    ZeroStage,
)
from planner.artifacts.layout import Layout
from planner.artifacts.plan import Plan, plan_to_json, save_plan
from planner.artifacts.profile import Profile
from planner.artifacts.report import load_report
from planner.artifacts.request import PlanRequest
from planner.commands.cli import main as planner_main
from planner.cost import CostModel
from planner.profiling.measured import profile_model
from planner.runtime.check import check_plan
from planner.runtime.exchange import (
    ExchangeError,
    copy_rank,
    dry_run_exchanges,
    exchange_groups,
)
from planner.runtime.model import load_workload
from planner.schedule import build_replicated_schedule, parse_action
from planner.solve.build import build_plan
from planner.solve.problem import Problem
from tests.runtime_launch import runtime, torchrun

MLP = "tests.factories:mlp"  # block0..3, head
SKIP = "tests.factories:skip"  # fork, carry1..3, join: tuples cross the cuts
ZOO_GPT = "gpt:layers=3,hidden=16,heads=2,seq=4,vocab=32"  # embed, 3 blocks, head tied to embed
GPIPE, ONE_F_ONE_B = ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B
B = 2  # micro-batch size


@cache
def _profile(model: str, dtype: DType) -> Profile:
    return profile_model(
        load_workload(model, 0), microbatch_sizes=(B,), dtype=dtype.value, warmup=0, repeats=1, trace_ops=False,
        progress=False,
    )


def replicated_plan(
    model: str,
    cut: int,
    replicas: tuple[int, int],
    schedule: ScheduleKind,
    *,
    recompute: bool = False,
    num_microbatches: int = 4,
    dtype: DType = DType.FLOAT64,
    zero: int = 0,
) -> Plan:
    """Two stages cut before layer ``cut``, priced on a profile of the model; with
    ``recompute`` stage 0 recomputes all its layers and stage 1 its first."""
    profile = _profile(model, dtype)
    devices = sum(replicas)
    request = PlanRequest(
        global_batch=num_microbatches * B, num_devices=devices, microbatch_sizes=(B,), optimizer=OptimizerKind.SGD_FP32
    )
    cluster = load_cluster("local-cpu").with_devices(devices)
    problem = Problem.of(profile, cluster, request, SolverKind.GIVEN, devices)
    return build_plan(
        problem,
        CostModel(profile, cluster, request.optimizer),
        layout=Layout(num_stages=2, stage_replicas=replicas, zero=ZeroStage(zero)),
        boundaries=(0, cut),
        recompute=(tuple(range(cut)), (cut,)) if recompute else ((), ()),
        microbatch_size=B,
        schedule=schedule,
    )


# ---------------------------------------------------------------- one process


def test_microbatch_runs_on_copy_m_mod_replicas() -> None:
    layout = ((0, 1), (2,), (3, 4, 5))  # replicas [2, 1, 3]
    table = [[copy_rank(layout, s, m) for m in range(6)] for s in range(3)]
    assert table == [
        [0, 1, 0, 1, 0, 1],
        [2, 2, 2, 2, 2, 2],
        [3, 4, 5, 3, 4, 5],
    ]


def test_exchange_groups_fuse_sends_with_the_next_receives() -> None:
    """Copy 0 of stage 0 in a [2, 1] pipeline, 1F1B, M = 4: its order, and before each action
    the group it posts (previous sends, then this action's receives)."""
    layout = ((0, 1), (2,))
    order = build_replicated_schedule(ONE_F_ONE_B, (2, 1), 4)[0]
    assert [str(a) for a in order] == ["0F0", "0F2", "0B0", "0B2"]
    groups = [[str(m) for m in g] for g in exchange_groups(layout, order)]
    assert groups == [
        [],  # 0F0 reads the batch
        ["0F0 0->2"],  # sends 0F0's output; 0F2 reads the batch
        ["0F2 0->2", "1B0 2->0"],  # sends 0F2's output, receives 0B0's gradient
        ["1B2 2->0"],
        [],  # stage 0's backward sends nothing
    ]
    last = build_replicated_schedule(ONE_F_ONE_B, (2, 1), 4)[2]
    assert [str(m) for m in exchange_groups(layout, last)[1]] == []  # 1B0 needs only its loss
    assert [str(m) for m in exchange_groups(layout, last)[2]] == ["1B0 2->0", "0F1 1->2"]


def test_every_small_replicated_schedule_dry_runs() -> None:
    for p in (1, 2, 3):
        for replicas in itertools.product((1, 2, 3), repeat=p):
            lcm = math.lcm(*replicas)
            layout, offset = [], 0
            for r in replicas:
                layout.append(tuple(range(offset, offset + r)))
                offset += r
            for m, kind in itertools.product((lcm, 2 * lcm, 3 * lcm), (GPIPE, ONE_F_ONE_B)):
                dry_run_exchanges(layout, build_replicated_schedule(kind, replicas, m))


def test_dry_run_names_a_hang_and_a_mismatched_order() -> None:
    layout = ((0,), (1,))
    good = build_replicated_schedule(GPIPE, (1, 1), 2)
    swapped = (good[0], tuple(parse_action(a) for a in ["1F1", "1F0", "1B0", "1B1"]))
    with pytest.raises(ExchangeError, match=r"ranks 0->1 post their messages in different orders"):
        dry_run_exchanges(layout, swapped)
    backward_first = (tuple(parse_action(a) for a in ["0F0", "0B0", "0F1", "0B1"]), good[1])
    with pytest.raises(ExchangeError, match=r"the exchanges hang: rank 0 .* waits on 1B0 1->0"):
        dry_run_exchanges(layout, backward_first)


def test_check_plan_accepts_replicated_and_refuses_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = load_workload(MLP, 0)
    plan = replicated_plan(MLP, 2, (2, 1), ONE_F_ONE_B)
    assert [s.ranks for s in plan.stages] == [(0, 1), (2,)] and plan.layout.replicated_per_stage
    check_plan(plan, workload, 3)
    check_plan(replicated_plan(MLP, 2, (1, 2), GPIPE, zero=2), workload, 3)  # ZeRO shards over a stage's copies
    want = r"plan needs 3 processes \(2 stages with replicas \[2, 1\]\) but the world size is 2"
    with pytest.raises(PlannerInputError, match=want) as refused:
        check_plan(plan, workload, 2)
    assert "\n" not in str(refused.value)
    # plan files whose ranks or replication no Layout has: refused when loaded, one line, exit 2
    data = plan_to_json(plan)
    moved = copy.deepcopy(data)
    moved["stages"][1]["ranks"] = [5]
    two_pipelines = copy.deepcopy(data)
    two_pipelines.update(dp_degree=2, global_batch=2 * plan.global_batch)
    two_pipelines["stages"][0]["ranks"], two_pipelines["stages"][1]["ranks"] = [0, 1, 2, 3], [4, 5]
    refusals = [
        (moved, r"stage 1: ranks \[5\] differ from the layout's \[2\]"),
        (two_pipelines, r"per-stage replication \(replicas \[2, 1\]\) needs one stage per rank, dp_degree 1, tp_degree 1 and cp_degree 1"),
    ]
    capsys.readouterr()
    for bad, pattern in refusals:
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        assert planner_main(["run", str(tmp_path / "bad.json"), "--model", MLP]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("planner run: error:") and re.search(pattern, err), err


# ---------------------------------------------------------------- torchrun


def _configs(tmp_path: Path) -> tuple[list[dict[str, Any]], dict[str, Plan]]:
    specs = {  # name: model, cut, replicas, schedule, recompute, optimizer, zero
        "mlp-21-gpipe-sgd": (MLP, 2, (2, 1), GPIPE, False, "sgd", 0),
        "mlp-21-1f1b-adamw-rc": (MLP, 2, (2, 1), ONE_F_ONE_B, True, "adamw", 0),
        "mlp-12-1f1b-sgd": (MLP, 2, (1, 2), ONE_F_ONE_B, False, "sgd", 0),
        "mlp-12-gpipe-adamw-rc-zero2": (MLP, 3, (1, 2), GPIPE, True, "adamw", 2),
        "skip-21-1f1b": (SKIP, 2, (2, 1), ONE_F_ONE_B, False, "sgd", 0),
        # the GPTs with SGD: a key bias has a true gradient of 0 (softmax ignores a constant per
        # row) and a summation-order noise of ~1e-18, which AdamW turns into a step of
        # lr x noise / eps ~ 5e-12, so AdamW parameters agree to ~4e-12 only (measured)
        "gpt-tied-21-gpipe": (ZOO_GPT, 2, (2, 1), GPIPE, False, "sgd", 0),
        "gpt-tied-12-1f1b-rc-zero1": (ZOO_GPT, 3, (1, 2), ONE_F_ONE_B, True, "sgd", 1),
        # a (sum, count) loss over the tokens that are not padding (issue 13)
        "tokens-21-1f1b": ("tests.contract_factories:padded_lm", 2, (2, 1), ONE_F_ONE_B, False, "sgd", 0),
        # one step with a checkpoint, then a fresh runner resumes (each copy its optimizer shard)
        "mlp-21-1f1b-adamw-zero1-resumed": (MLP, 2, (2, 1), ONE_F_ONE_B, False, "adamw", 1),
    }
    configs, plans = [], {}
    for name, (model, cut, replicas, schedule, recompute, optimizer, zero) in specs.items():
        plans[name] = replicated_plan(model, cut, replicas, schedule, recompute=recompute, zero=zero)
        save_plan(plans[name], tmp_path / f"{name}.json")
        configs.append({"name": name, "plan": str(tmp_path / f"{name}.json"), "model": model, "dtype": "float64",
                        "optimizer": optimizer, "steps": 2})
    configs[-1].update(steps=3, checkpoint_dir=str(tmp_path / "ckpt"))
    return configs, plans


@pytest.mark.slow
def test_replicated_training_matches_one_process(tmp_path: Path) -> None:
    configs, plans = _configs(tmp_path)
    (tmp_path / "configs.json").write_text(json.dumps(configs))
    proc = torchrun(3, ["tests/replicated_driver.py", str(tmp_path / "configs.json"), str(tmp_path / "out.json")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "out.json").read_text())
    assert [r["name"] for r in results] == [c["name"] for c in configs]
    errors = []
    for result, cfg in zip(results, configs):
        name, plan = cfg["name"], plans[cfg["name"]]
        if len(result["losses"]) != cfg["steps"]:
            errors.append(f"{name}: {len(result['losses'])} losses for {cfg['steps']} steps")
        diffs = {k: result[f"{k}_rel_diff"] for k in ("loss", "param", "grad")}
        if max(diffs.values()) > 1e-12:
            errors.append(f"{name}: relative differences {diffs} > 1e-12")
        predicted = [s.activation_bytes_per_microbatch * s.inflight_microbatches for s in plan.stages for _ in s.ranks]
        if result["saved_bytes_peak"] != predicted:
            errors.append(f"{name}: saved bytes per rank {result['saved_bytes_peak']}, predicted {predicted}")
    assert not errors, "\n".join(errors)


@pytest.mark.slow
def test_runtime_runs_a_replicated_plan_and_reports(tmp_path: Path) -> None:
    workload = load_workload(MLP, 0)
    plan = replicated_plan(MLP, 2, (2, 1), ONE_F_ONE_B, dtype=DType.FLOAT32)
    save_plan(plan, tmp_path / "plan.json")
    report_path = tmp_path / "report.json"
    args = ["--plan", str(tmp_path / "plan.json"), "--model", MLP, "--steps", "2", "--report", str(report_path)]
    proc = runtime(3, args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = load_report(report_path)
    assert report.world_size == 3 and len(report.steps) == 2 and report.steps[1].loss < report.steps[0].loss
    assert [s.ranks for s in report.stages] == [(0, 1), (2,)]
    for record, stage in zip(report.stages, plan.stages):
        assert record.saved_bytes_peak == stage.activation_bytes_per_microbatch * stage.inflight_microbatches
        per_copy = plan.num_microbatches // stage.replicas
        per_microbatch = stage.fwd_ms + stage.bwd_ms + stage.recompute_ms
        assert record.compute_ms_predicted == pytest.approx(per_copy * per_microbatch)
    assert workload.layer_names == tuple(n for s in plan.stages for n in s.layer_names)
