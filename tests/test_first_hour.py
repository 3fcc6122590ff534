"""The first hour of a new user (issue 23): help texts that say what the planner does,
``--devices N`` beyond a preset, what ``simulate`` and the Pareto labels say about a plan, and
progress on long work when stderr is not a terminal. (The README's commands: test_readme.py.)
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import planner.artifacts.progress as progress_module
from planner.artifacts.cluster import PRESETS, cluster_to_json
from planner.artifacts.kinds import ScheduleKind, ZeroStage
from planner.artifacts.plan import load_plan
from planner.artifacts.plan_summary import ParetoPoint
from planner.artifacts.progress import Progress, note
from planner.commands.cli import build_parser, main
from planner.report.table import format_pareto, pareto_label

ROOT = Path(__file__).resolve().parents[1]
GPT3 = str(ROOT / "profiles" / "gpt3-13b-a100.json")


def _help(*argv: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])


def test_help_texts_say_what_the_planner_does(capsys: pytest.CaptureFixture[str]) -> None:
    _help()
    top = " ".join(capsys.readouterr().out.split())
    assert "pipeline + data + tensor parallel" in top.lower()
    _help("plan")
    plan = " ".join(capsys.readouterr().out.split())
    assert "pipeline + data + tensor parallel" in plan
    assert "gpipe, 1f1b, interleaved-1f1b" in plan  # --schedules lists every schedule
    assert "--devices 64 with h100-80gb-x8" in plan
    _help("run")
    assert "hf:CONFIG" in capsys.readouterr().out
    _help("profile")
    profile = capsys.readouterr().out
    assert "gpt | bert | vgg | resnet | gpt2" in profile and "PLANNER_FACTORY_TIMEOUT_S" in profile


def test_devices_beyond_a_preset_add_its_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--devices 64`` with the 8-GPU ``h100-80gb-x8`` plans on 8 such nodes (it was refused);
    ``planner compare`` finds that cluster again from the plan."""
    out = tmp_path / "p.json"
    assert main(["plan", "--profile", GPT3, "--cluster", "h100-80gb-x8", "--devices", "64", "--global-batch", "64",
                 "--out", str(out)]) == 0
    assert "on h100-80gb-x8 (64 devices)" in capsys.readouterr().out.splitlines()[0]
    plan = load_plan(out)
    assert plan.devices_available == 64 and plan.num_devices == 64
    assert main(["compare", str(out), "--profile", GPT3]) == 0
    assert PRESETS["h100-80gb-x8"].grown_to(12).num_nodes == 2 and PRESETS["h100-80gb-x8"].grown_to(8).num_nodes == 1
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps(cluster_to_json(PRESETS["h100-80gb-x8"])))
    assert main(["plan", "--profile", GPT3, "--cluster", str(cluster), "--devices", "64", "--global-batch", "64"]) == 2
    assert "is more than cluster" in capsys.readouterr().err  # a cluster file is a machine as it is


def test_simulate_names_t_zero_devices_and_prints_no_noise(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    assert main(["plan", "--profile", GPT3, "--global-batch", "64", "--out", str(out)]) == 0
    plan = load_plan(out)
    assert plan.layout.tp_degree == 2 and int(plan.layout.zero) == 1
    capsys.readouterr()
    assert main(["simulate", str(out)]) == 0
    text = capsys.readouterr().out
    first = text.splitlines()[0]
    assert "T=2 (seq-par) x P=1 x D=4, ZeRO-1" in first and "on 8 devices" in first
    assert "exposed reduce-scatter + all-gather" in text and "allreduce" not in text
    assert "e-1" not in text and "e-0" not in text  # no 3.638e-12-style rounding noise


def test_pareto_labels_show_the_layout() -> None:
    point = ParetoPoint(iteration_ms=10.0, peak_memory_bytes=2**30, num_stages=2, dp_degree=4, microbatch_size=1,
                        schedule=ScheduleKind.ONE_F_ONE_B, num_recomputed_layers=3, zero=ZeroStage.OPTIMIZER, tp_degree=2,
                        sequence_parallel=True)
    assert pareto_label(point) == "T=2 (seq-par) x P=2 x D=4, ZeRO-1, mb 1, 1f1b, rc 3"
    assert "T" in format_pareto((point,)).splitlines()[1]


def test_pareto_figure_lists_the_labels_beside_the_axes(tmp_path: Path) -> None:
    from planner.report.figures_compare import plot_pareto

    plan = load_plan(ROOT / "tests" / "golden" / "plans" / sorted(os.listdir(ROOT / "tests" / "golden" / "plans"))[0])
    fig = plot_pareto(plan)
    texts = [t.get_text() for t in fig.axes[0].texts]
    # every Pareto point is numbered beside its marker and labelled with its layout in the list
    labels = [pareto_label(p) for p in plan.pareto]
    assert labels and all(any(label in t for t in texts) for label in labels), (labels, texts)


def test_progress_lines_without_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a terminal: a line every few seconds while the work lasts, a last one with the total;
    nothing at all for short work."""
    monkeypatch.setattr(progress_module, "FIRST_AFTER_S", 0.05)
    monkeypatch.setenv("PLANNER_PROGRESS", "1")  # the suite's default is off (conftest.py)
    stream = io.StringIO()
    with Progress("search", total=3, unit="layouts", stream=stream, every_s=0.05) as bar:
        note("tensor-parallel degree 2")
        bar.update(1)
        time.sleep(0.3)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("planner: search: 1/3 layouts, tensor-parallel degree 2 (")
    assert lines[-1].startswith("planner: search: done (") and len(lines) >= 3
    quiet = io.StringIO()
    with Progress("short", stream=quiet):
        pass
    assert quiet.getvalue() == ""


def test_profile_prints_progress_to_a_pipe(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PLANNER_PROGRESS": "1", "PLANNER_PROGRESS_EVERY_S": "0.5"}
    proc = subprocess.run([sys.executable, "-m", "planner", "profile", "--model", "gpt:layers=2,hidden=64,heads=4,seq=32,vocab=128",
                           "--microbatch-sizes", "1,2,4,8", "--repeats", "40", "--out", str(tmp_path / "p.json")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("planner: profile gpt: ")]
    assert lines and lines[-1].startswith("planner: profile gpt: done"), proc.stderr


# ---------------------------------------------------------------- issue 51: help, noise, progress, the direct form

ZOO_GPT = str(ROOT / "profiles" / "zoo-gpt-cpu.json")


def _lines(text: str) -> str:
    return " ".join(text.split())


def test_help_names_what_each_flag_does(capsys: pytest.CaptureFixture[str]) -> None:
    """Items 3 and 8: the top level names every profile source and PLANNER_DEBUG; ``export``
    says what no flag prints, ``--torchtitan`` that it writes cp; ``profile --device`` and the
    ``--analytic`` size flags have help."""
    _help()
    top = _lines(capsys.readouterr().out)
    for source in ("--analytic gpt", "--analytic hf", "hf:CONFIG", "package.module:callable", "import-pipedream",
                   "PLANNER_DEBUG=1"):
        assert source in top, source
    _help("export")
    export = _lines(capsys.readouterr().out)
    assert "With no flag, prints the stage names" in export and "(tp, pp, dp, and cp when" in export
    _help("profile")
    profile = capsys.readouterr().out
    for flag in ("--device {cpu,cuda}", "--layers LAYERS", "--hidden HIDDEN", "--heads HEADS", "--seq SEQ", "--vocab VOCAB"):
        entry = profile.split(f"  {flag}", 1)[1].split("\n  -")[0]
        assert entry.strip(), f"{flag} has no help"


def test_flop_figures_only_where_they_mean_something(capsys: pytest.CaptureFixture[str]) -> None:
    """Item 6: "model 2.819e-06 PFLOP per iteration, 0.0 TFLOP/s" on CPU plans is gone; a GPU
    plan keeps its FLOP line with the MFU."""
    assert main(["plan", "--profile", ZOO_GPT, "--cluster", "local-cpu", "--devices", "2", "--global-batch", "8"]) == 0
    cpu = capsys.readouterr().out
    assert "PFLOP" not in cpu and "TFLOP/s" not in cpu
    assert main(["plan", "--profile", GPT3, "--global-batch", "64"]) == 0
    gpu = capsys.readouterr().out
    assert "PFLOP per iteration" in gpu and "TFLOP/s per device, MFU" in gpu


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PLANNER_PROGRESS": "1", "PLANNER_PROGRESS_EVERY_S": "1"}
    env.pop("OMP_NUM_THREADS", None)  # as a user's shell has it: torchrun would warn
    return {**env, **extra}


def _adam_plan(tmp_path: Path) -> str:
    import dataclasses

    from planner.artifacts.kinds import DType, OptimizerKind
    from planner.artifacts.plan import save_plan
    from planner.runtime.model import load_workload, workload_fingerprint
    from tests.factories import make_plan

    workload = load_workload("tests.factories:mlp", 0)
    plan = make_plan(workload.layer_names, (2,), fingerprint=workload_fingerprint(workload))
    path = tmp_path / "plan.json"
    save_plan(dataclasses.replace(plan, dtype=DType.FLOAT32, optimizer=OptimizerKind.ADAM_MIXED), path)
    return str(path)


@pytest.mark.slow
def test_planner_run_says_where_it_is_and_prints_no_noise(tmp_path: Path) -> None:
    """Items 5 and 6, without a terminal: a line per phase of the launcher's checks and of rank
    0's work, no torchrun OMP_NUM_THREADS banner, no libkineto ``USDT: ... profiler_start``
    lines, no FutureWarning; the summary once."""
    plan = _adam_plan(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "planner", "run", plan, "--model", "tests.factories:mlp", "--steps", "3"],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    progress = [line for line in err.splitlines() if line.startswith("planner: run plan.json")]
    # every second here (PLANNER_PROGRESS_EVERY_S=1): the launcher's checks, torchrun starting, rank 0's phases
    assert progress and all(line.endswith(" s)") for line in progress), err
    for noise in ("USDT", "SyncActivityProfilerHandler", "OMP_NUM_THREADS", "FutureWarning", "Warning"):
        assert noise not in err, err
    assert proc.stdout.count("ran 2 stages x 1 replicas") == 1, proc.stdout
    assert "the runtime's adamw float32 optimizer state" in proc.stdout


@pytest.mark.slow
def test_the_direct_torchrun_form_prints_the_summary_and_takes_the_plans_optimizer(tmp_path: Path) -> None:
    """Item 5: ``torchrun ... -m planner.runtime`` printed nothing and trained with SGD where
    ``planner run`` takes the plan's AdamW."""
    from planner.artifacts.kinds import OptimizerFamily
    from planner.artifacts.report import load_report

    plan, report = _adam_plan(tmp_path), tmp_path / "r.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "planner.runtime",
           "--plan", plan, "--model", "tests.factories:mlp", "--steps", "3", "--report", str(report)]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert load_report(report).optimizer is OptimizerFamily.ADAMW
    assert proc.stdout.startswith("ran 2 stages x 1 replicas, gpipe") and "losses per step:" in proc.stdout, proc.stdout
    assert "planner: run plan.json: " in proc.stderr and "USDT" not in proc.stderr


@pytest.mark.slow
def test_compare_with_baselines_and_figures_says_where_it_is(tmp_path: Path) -> None:
    """Item 5: 5-11 s with no line; now a line per phase on a pipe (every 0.5 s here)."""
    plan = tmp_path / "p.json"
    assert main(["plan", "--profile", ZOO_GPT, "--cluster", "local-cpu", "--devices", "2", "--global-batch", "8",
                 "--out", str(plan)]) == 0
    proc = subprocess.run([sys.executable, "-m", "planner", "compare", str(plan), "--baselines", "--figures",
                           str(tmp_path / "figs")], cwd=ROOT, env=_env(PLANNER_PROGRESS_EVERY_S="0.5"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("planner: ")]
    assert any("drawing the figures" in line for line in lines), proc.stderr
    assert lines[-1].startswith("planner: compare: done ("), proc.stderr
