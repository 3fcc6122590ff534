"""Emulated compute can only stretch (issue 13, item 6): a stage whose real work takes longer
than its profiled time overruns, the run report says by how much per stage, and a run that
overran by more than 5% is flagged as not a valid fidelity sample (``planner run`` warns,
``benchmarks/fidelity.py`` leaves it out)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from planner.artifacts.plan import save_plan
from planner.artifacts.report import (
    OVERRUN_LIMIT,
    load_report,
    report_from_json,
    report_to_json,
)
from planner.commands.cli import main as planner_main
from planner.runtime.model import load_workload, workload_fingerprint
from tests.factories import make_plan

ROOT = Path(__file__).resolve().parents[1]
MLP = "tests.factories:mlp"


@pytest.mark.slow
def test_an_overrunning_emulated_run_is_flagged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Stage 0 is emulated at 25 ms per chunk (its real work is far less: it sleeps the rest);
    stage 1 at 0.01 ms, less than its real work: every one of its actions overruns."""
    workload = load_workload(MLP, 0)
    plan = make_plan(workload.layer_names, (2,), fingerprint=workload_fingerprint(workload))
    slow, fast = (dataclasses.replace(s, fwd_ms=ms, bwd_ms=ms) for s, ms in zip(plan.stages, (25.0, 0.01)))
    plan = dataclasses.replace(plan, stages=(slow, fast))
    save_plan(plan, tmp_path / "plan.json")
    report_path = tmp_path / "report.json"
    args = ["run", str(tmp_path / "plan.json"), "--model", MLP, "--emulate", "--steps", "2", "--report", str(report_path)]
    assert planner_main(args) == 0
    err = capsys.readouterr().err
    report = load_report(report_path)
    first, second = report.stages
    assert second.overrun_fraction > OVERRUN_LIMIT and second.overrun_ms > 0 and second.overrun_max_ms > 0
    assert first.overrun_fraction < second.overrun_fraction
    assert report.emulation_overrun_fraction == second.overrun_fraction
    assert not report.fidelity_sample
    assert "warning: emulated compute overran its profiled time" in err and "on stage 1" in err
    assert "not a valid fidelity sample" in err


def test_old_reports_load_and_fidelity_skips_flagged_samples(tmp_path: Path) -> None:
    from planner.artifacts.kinds import DType, OptimizerFamily, ScheduleKind
    from planner.artifacts.layout import Layout
    from planner.artifacts.report import RunReport, StageRecord, StepRecord

    stage = StageRecord(
        stage_idx=0, ranks=(0,), compute_ms=1.5, idle_ms=0.5, compute_ms_predicted=1.0, compute_rel_error=0.5,
        saved_bytes_peak=10, activation_bytes_predicted=10, activation_rel_error=0.0,
    )
    report = RunReport(
        model="m", plan_fingerprint_sha256="", world_size=1, backend="gloo", device="cpu", dtype=DType.FLOAT32,
        optimizer=OptimizerFamily.SGD, emulate=True, layout=Layout(num_stages=1), num_microbatches=2,
        microbatch_size=1, schedule=ScheduleKind.GPIPE, warmup_steps=0,
        steps=(StepRecord(step_idx=0, loss=0.25, wall_ms=3.0),), stages=(stage,),
        iteration_ms=3.0, iteration_ms_predicted=2.0, iteration_rel_error=0.5,
    )
    data = report_to_json(report)
    for key in ("emulation_overrun_fraction", "fidelity_sample"):  # a report written before overruns were measured
        del data[key]
    for key in ("overrun_ms", "overrun_max_ms", "overrun_fraction"):
        del data["stages"][0][key]
    old = report_from_json(data)
    assert old.stages[0].overrun_ms == 0.0 and not old.fidelity_sample

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from fidelity import fidelity_summary

    row = {"config": "P2 D1", "time_error": 0.02, "activation_max_error": 0.0, "overrun_fraction": 0.01, "fidelity_sample": True}
    bad = dict(row, config="P4 D1", time_error=0.9, overrun_fraction=0.4, fidelity_sample=False)
    text = fidelity_summary([row, bad])
    assert "left out: P4 D1 (overrun 40.0%)" in text
    assert "1 configurations: time error median 2.0%" in text and "max 2.0%" in text
