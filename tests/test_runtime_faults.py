"""Refusals before compute, fail-fast on a failing rank, and kill-and-resume (real torchrun)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.plan import save_plan
from planner.artifacts.report import load_report
from planner.commands.cli import main as planner_main
from planner.runtime.model import load_workload, workload_fingerprint
from tests.factories import make_plan
from tests.runtime_launch import runtime

MLP = "tests.factories:mlp"


def _mlp_plan(tmp_path: Path, boundaries: tuple[int, ...] = (2,), **kw: object) -> str:
    workload = load_workload(MLP, 0)
    plan = make_plan(workload.layer_names, boundaries, fingerprint=workload_fingerprint(workload), **kw)  # type: ignore[arg-type]
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    return str(path)


@pytest.mark.slow
def test_fingerprint_mismatch_is_refused_before_compute(tmp_path: Path) -> None:
    plan = _mlp_plan(tmp_path)
    report = tmp_path / "r.json"
    proc = runtime(2, ["--plan", plan, "--model", "tests.factories:mlp_wide", "--report", str(report)])
    assert proc.returncode != 0
    # each rank refuses on its own; torchrun may stop the slower one before it prints
    assert ": error:" in proc.stderr and "does not match the plan's" in proc.stderr
    assert not report.exists()


@pytest.mark.slow
def test_layer_name_mismatch_is_refused(tmp_path: Path) -> None:
    plan = _mlp_plan(tmp_path)
    proc = runtime(2, ["--plan", plan, "--model", "tests.factories:skip"])
    assert proc.returncode != 0
    assert "layer 0 is 'block0' in the plan but 'fork' in model 'skip'" in proc.stderr


@pytest.mark.slow
def test_world_size_mismatch_is_refused(tmp_path: Path) -> None:
    plan = _mlp_plan(tmp_path, boundaries=(2,), dp_degree=2)
    proc = runtime(1, ["--plan", plan, "--model", MLP])
    assert proc.returncode != 0
    assert "plan needs 4 processes (2 stages x 2 replicas) but the world size is 1" in proc.stderr


@pytest.mark.slow
def test_rank_raising_at_step_2_ends_every_process(tmp_path: Path) -> None:
    plan = _mlp_plan(tmp_path, boundaries=(1, 3))
    start = time.monotonic()
    proc = runtime(
        3,
        ["--plan", plan, "--model", MLP, "--steps", "6", "--timeout-s", "20"]
        + ["--fault", "raise", "--fault-rank", "1", "--fault-step", "2"],
        timeout_s=90,
    )
    assert proc.returncode != 0
    assert time.monotonic() - start < 60
    first = "rank 1 failed at step 2: RuntimeError: injected fault (--fault raise) at step 2"
    assert f"planner.runtime: {first}" in proc.stderr
    # every peer that got to report (torchrun may stop one first) names rank 1 as the cause
    peers = [line for line in proc.stderr.splitlines() if line.startswith(("planner.runtime: rank 0 ", "planner.runtime: rank 2 "))]
    assert peers
    for line in peers:
        assert line.endswith(f"stopped: {first}"), line


@pytest.mark.slow
def test_kill_and_resume_gives_identical_losses(tmp_path: Path) -> None:
    plan = _mlp_plan(tmp_path, boundaries=(2,), schedule=ScheduleKind.ONE_F_ONE_B, num_microbatches=3)
    common = ["--model", MLP, "--steps", "4", "--optimizer", "adamw", "--dtype", "float64"]
    full = tmp_path / "full.json"
    # the uninterrupted run goes through the `planner run` command
    assert planner_main(["run", plan, *common, "--report", str(full), "--nproc", "2"]) == 0
    ckpt = tmp_path / "ckpt"
    killed = runtime(
        2,
        ["--plan", plan, *common, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2"]
        + ["--fault", "kill", "--fault-rank", "0", "--fault-step", "3"],
    )
    assert killed.returncode != 0
    assert json.loads((ckpt / "latest.json").read_text()) == {"completed_steps": 2}
    resumed_path = tmp_path / "resumed.json"
    resumed = runtime(2, ["--plan", plan, *common, "--checkpoint-dir", str(ckpt), "--resume", "--report", str(resumed_path)])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    full_losses = [(s.step_idx, s.loss) for s in load_report(full).steps]
    resumed_losses = [(s.step_idx, s.loss) for s in load_report(resumed_path).steps]
    assert [i for i, _ in resumed_losses] == [2, 3]
    assert resumed_losses == full_losses[2:]  # bit-identical floats
    # issue 51: the resume says where it resumed (rank 0, once)
    said = [line for line in resumed.stderr.splitlines() if "resumed from step" in line]
    assert said == [f"planner.runtime: resumed from step 2 ({ckpt / 'step_2'}): training steps 3 to 4"], resumed.stderr[-2000:]


def test_planner_run_refuses_a_bad_plan_file_without_launching(tmp_path: Path, capsys: object) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text('{"schema": "planner.plan", "version": 99}')
    assert planner_main(["run", str(bad), "--model", MLP]) == 2
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert "planner run: error:" in err and "unsupported planner.plan version 99" in err


@pytest.mark.slow
def test_a_hung_rank_ends_the_run_within_the_timeout(tmp_path: Path) -> None:
    plan = _mlp_plan(tmp_path)
    start = time.monotonic()
    proc = runtime(
        2,
        ["--plan", plan, "--model", MLP, "--steps", "4", "--timeout-s", "8"]
        + ["--fault", "hang", "--fault-rank", "1", "--fault-step", "1"],
        timeout_s=90,
    )
    assert proc.returncode != 0
    assert time.monotonic() - start < 60
    # rank 0 timed out waiting; the hung rank 1 is the one named (issue 22: this test checked rank 0)
    assert "planner.runtime: rank 0 stopped: rank 1 stopped making progress at step 1" in proc.stderr, proc.stderr[-3000:]
    assert "rank 0 failed" not in proc.stderr
