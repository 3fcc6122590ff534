"""Nothing a run produced is lost, and what does not fit the model is refused (issue 22):
outputs checked before any work, the report written atomically or saved beside the
checkpoints, a write error naming the file and its cause, "before training" only before
training; a plan priced for other boundary tensors refused; a tie found by identity kept.

Each test failed on the code before issue 22 (commit 38aa3f5): an unwritable ``--report``
(``/dev/full``, under ``/proc``, a directory, under a regular file) was found only after all
training, labelled "before training", and the results were lost; a full disk during a
checkpoint said ``enforce fail at inline_container.cc`` with no path; a plan profiled at 4
tokens per sample ran a model at 8 with exit 0; ``load_workload`` kept an undeclared tie
undeclared (``tied`` empty), so the runtime trained two copies.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.files import check_output_path
from planner.artifacts.kinds import DType, OptimizerFamily, ScheduleKind
from planner.artifacts.layout import Layout
from planner.artifacts.plan import load_plan, save_plan
from planner.artifacts.report import RunReport, StageRecord, StepRecord, load_report
from planner.commands.cli import main as planner_main
from planner.runtime.check import check_plan
from planner.runtime.main import write_report
from planner.runtime.model import load_workload, workload_fingerprint
from planner.runtime.options import RuntimeOptions
from tests.factories import make_plan
from tests.runtime_launch import runtime_launched

MLP = "tests.factories:mlp"


def _mlp_plan(tmp_path: Path) -> str:
    workload = load_workload(MLP, 0)
    plan = make_plan(workload.layer_names, (2,), fingerprint=workload_fingerprint(workload),
                     schedule=ScheduleKind.ONE_F_ONE_B, num_microbatches=3)
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    return str(path)


def _unwritable(tmp_path: Path, kind: str) -> str:
    regular = tmp_path / "regular"
    regular.write_text("x")
    return {"dev-full": "/dev/full", "proc": "/proc/planner-report.json", "directory": str(tmp_path),
            "under-a-file": str(regular / "report.json"), "no-directory": str(tmp_path / "nope" / "r.json")}[kind]


@pytest.mark.parametrize("kind", ["dev-full", "proc", "directory", "under-a-file", "no-directory"])
def test_an_unwritable_report_is_refused_before_torchrun(tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = _unwritable(tmp_path, kind)
    assert planner_main(["run", _mlp_plan(tmp_path), "--model", MLP, "--report", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--report {path}" in err, err
    assert "before training" not in err


def test_output_checks_name_the_cause() -> None:
    with pytest.raises(PlannerInputError, match="/dev/full: is a character device"):
        check_output_path("/dev/full", "--report")
    with pytest.raises(PlannerInputError, match=r"cannot create a file in /proc: .*\(E[A-Z]+\)"):
        check_output_path("/proc/x.json", "--report")
    with pytest.raises(PlannerInputError, match=r"has \d+ bytes free, \d+ needed \(No space left on device \(ENOSPC\)\)"):
        check_output_path("/tmp/x.json", "--report", need_bytes=1 << 62)


def _report() -> RunReport:
    stage = StageRecord(
        stage_idx=0, ranks=(0,), compute_ms=1.5, idle_ms=0.5, compute_ms_predicted=1.0, compute_rel_error=0.5,
        saved_bytes_peak=10, activation_bytes_predicted=10, activation_rel_error=0.0,
    )
    return RunReport(
        model="m", plan_fingerprint_sha256="", world_size=1, backend="gloo", device="cpu", dtype=DType.FLOAT32,
        optimizer=OptimizerFamily.SGD, emulate=False, layout=Layout(num_stages=1), num_microbatches=2,
        microbatch_size=1, schedule=ScheduleKind.GPIPE, warmup_steps=0,
        steps=(StepRecord(step_idx=0, loss=0.25, wall_ms=3.0),), stages=(stage,),
        iteration_ms=3.0, iteration_ms_predicted=2.0, iteration_rel_error=0.5,
    )


def test_a_report_that_cannot_be_written_is_saved_beside_the_checkpoints(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    options = RuntimeOptions(plan_path="p", model_spec=MLP, report_path="/proc/report.json", checkpoint_dir=str(ckpt))
    line = write_report(_report(), options)
    assert line.startswith("cannot write the report /proc/report.json: ") and "(E" in line
    fallback = Path(line.split("the results were saved to ")[1])
    assert fallback.parent == ckpt and load_report(fallback) == _report()
    options = RuntimeOptions(plan_path="p", model_spec=MLP, report_path="/proc/report.json")
    fallback = Path(write_report(_report(), options).split("saved to ")[1])
    assert load_report(fallback) == _report()  # no checkpoint directory: the temporary directory
    fallback.unlink()
    good = tmp_path / "report.json"
    assert write_report(_report(), RuntimeOptions(plan_path="p", model_spec=MLP, report_path=str(good))) == ""
    assert load_report(good) == _report() and not list(tmp_path.glob(".*.tmp"))


def test_a_tie_found_by_identity_becomes_a_declared_tie() -> None:
    workload = load_workload("tests.factories:tiny_gpt_undeclared_tie", 0)
    assert workload.tied == (((0, "tok.weight"), (4, "proj.weight")),)
    assert load_workload("tests.factories:tiny_gpt", 0).tied == workload.tied  # a declared one is not doubled


def test_a_plan_priced_for_other_boundary_tensors_is_refused(tmp_path: Path) -> None:
    """A profile at 4 tokens per sample, a plan from it, run with the model at 8 tokens: the
    same layers and parameters (the fingerprint matches), twice the bytes at every cut."""
    model = "tests.factories:tiny_gpt"
    profile, plan_path = tmp_path / "p.json", tmp_path / "plan.json"
    args = ["profile", "--model", f"{model}:seq=4", "--out", str(profile), "--microbatch-sizes", "1,2", "--warmup", "1",
            "--repeats", "1", "--no-progress"]
    assert planner_main(args) == 0
    args = ["plan", "--profile", str(profile), "--cluster", "local-cpu", "--devices", "2", "--global-batch", "4",
            "--fixed-boundaries", "2", "--stages", "2", "--out", str(plan_path)]
    assert planner_main(args) == 0
    plan = load_plan(plan_path)
    check_plan(plan, load_workload(f"{model}:seq=4", 0), 2)  # the model it was profiled from runs
    with pytest.raises(PlannerInputError) as info:
        check_plan(plan, load_workload(f"{model}:seq=8", 0), 2)
    message = str(info.value)
    assert "the tensors crossing from stage 0 to 1" in message and "256 bytes per sample" in message
    assert "the plan priced 128" in message and "\n" not in message


@pytest.mark.slow
def test_a_report_lost_after_training_is_saved_beside_the_checkpoints(tmp_path: Path) -> None:
    """The report's directory goes away during training: rank 0 saves the results beside the
    checkpoints, names both, and says "after training" (never "before training")."""
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    launched = runtime_launched(2, ["--plan", _mlp_plan(tmp_path), "--model", MLP, "--steps", "300", "--report",
                                    str(out / "r.json"), "--checkpoint-dir", str(ckpt), "--checkpoint-every", "100"])
    while not (ckpt / "step_100" / "manifest.json").exists():
        assert launched.proc.poll() is None, launched.output[-3000:]
        time.sleep(0.05)
    shutil.rmtree(out)
    assert launched.finish(120) == 1, launched.output[-3000:]
    line = next(line for _, line in launched.lines if "failed after training" in line)
    assert f"cannot write the report {out / 'r.json'}: No such file or directory (ENOENT)" in line
    saved = Path(line.split("the results were saved to ")[1])
    assert saved.parent == ckpt and len(load_report(saved).steps) == 300
    assert "before training" not in launched.output


@pytest.mark.slow
def test_a_checkpoint_write_that_fails_names_the_file_and_leaves_no_tmp(tmp_path: Path) -> None:
    """A file-size limit (EFBIG, as a full disk gives ENOSPC) larger than stage 0's file and
    smaller than stage 1's: rank 1 fails writing its file, named with the cause, its peer
    names rank 1, the step stays uncommitted (no manifest), no ``.tmp`` is left. (The ranks
    ignore SIGXFSZ, so the write fails with EFBIG instead of the signal killing them.)"""
    ckpt = tmp_path / "ckpt"
    limit = 10_000  # float64 AdamW: stage_0.pt is 8755 bytes, stage_1.pt 11483

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "planner.runtime",
         "--plan", _mlp_plan(tmp_path), "--model", MLP, "--steps", "4", "--dtype", "float64", "--optimizer", "adamw",
         "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"],
        env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[1])),
        preexec_fn=limited, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode != 0
    target = ckpt / "step_1" / "stage_1.pt"
    first = f"rank 1 failed writing checkpoint step_1 (after 1 completed steps): {target}: cannot write the checkpoint: " \
            "File too large (EFBIG)"
    assert f"planner.runtime: {first}" in proc.stderr, proc.stderr[-3000:]
    assert f"planner.runtime: rank 0 stopped: {first}" in proc.stderr
    assert not (ckpt / "step_1" / "manifest.json").exists() and not list(ckpt.rglob("*.tmp"))
    assert (ckpt / "step_1" / "stage_0.pt").exists()  # written, but the step is not committed
