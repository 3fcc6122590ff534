"""planner.compare, the comparison figures, ``planner compare`` and ``planner export`` (no torch)."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

import pytest

import planner
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import DType, OptimizerFamily, SolverKind, ZeroStage
from planner.artifacts.report import RunReport, StageRecord, StepRecord
from planner.artifacts.request import PlanRequest
from planner.commands.cli import main
from planner.report.compare import COLUMNS, MEASURED_COLUMNS
from planner.schedule import build_schedule, read_schedule_csv
from planner.solve import BASELINES

BASELINE_NAMES = [k.value for k in BASELINES]  # the solver column and the labels hold names
ROOT = Path(__file__).resolve().parents[1]
GPT3 = ROOT / "profiles" / "gpt3-13b-a100.json"


@pytest.fixture(scope="module")
def gpt3_plan() -> planner.Plan:
    profile = planner.load_profile(GPT3)
    return planner.plan(profile, planner.load_cluster("a100-80gb-x8"), PlanRequest(global_batch=64))


@pytest.fixture()
def plan_file(gpt3_plan: planner.Plan, tmp_path: Path) -> Path:
    path = tmp_path / "ours.json"
    planner.save_plan(gpt3_plan, path)
    return path


def test_columns_and_every_baseline_from_a_plan_file(plan_file: Path, gpt3_plan: planner.Plan) -> None:
    # the profile and cluster are found from the plan's provenance (shipped profile, preset)
    df = planner.compare([plan_file], baselines=True)
    assert tuple(df.columns) == COLUMNS
    assert list(df["solver"]) == ["dp", *BASELINE_NAMES]
    assert list(df.index) == ["ours", *BASELINE_NAMES]
    ours = df.loc["ours"]
    pred = gpt3_plan.predicted
    assert ours["iteration_ms"] == pred.iteration_ms
    assert (ours["P"], ours["D"], ours["M"]) == (gpt3_plan.layout.num_stages, gpt3_plan.layout.dp_degree, gpt3_plan.num_microbatches)
    assert ours["peak_memory_gib"] == pred.peak_memory_bytes / 1024**3
    assert ours["me_index"] == 1.0 and ours["speedup"] == 1.0
    assert ours["partition_bound_over_time"] == pytest.approx(pred.partition_bound_ms / pred.iteration_ms)
    assert ours["limit_over_time"] == pytest.approx(pred.machine_bound_ms / pred.iteration_ms)
    # the DP is never slower than a baseline on the same request
    feasible = df[df["note"] == ""]
    assert (feasible["iteration_ms"] >= pred.iteration_ms * (1 - 1e-9)).all()
    # 13B does not fit as pure data parallel on 80 GB: the row says so instead of vanishing
    dp_only = df.loc["data-parallel"]
    assert dp_only["note"].startswith("infeasible") and math.isnan(dp_only["iteration_ms"])
    # the memory by kind is the largest stage's planned breakdown
    big = max(gpt3_plan.stages, key=lambda s: s.memory_total_bytes).memory
    assert ours["optimizer_gib"] * 1024**3 == pytest.approx(big.optimizer_bytes)
    kinds = ours[["params_gib", "grads_gib", "optimizer_gib", "activations_gib", "other_gib"]].sum()
    assert kinds * 1024**3 == pytest.approx(big.total_bytes)


def test_me_index_against_a_named_reference(gpt3_plan: planner.Plan) -> None:
    df = planner.compare([gpt3_plan], baselines=True, profile=GPT3, cluster="a100-80gb-x8", reference="uniform")
    assert df.loc["uniform", "me_index"] == 1.0
    assert set(df["me_reference"]) == {"uniform"}
    uniform = planner.plan(planner.load_profile(GPT3), planner.load_cluster("a100-80gb-x8"),
                           dataclasses.replace(gpt3_plan.provenance.request, solver=SolverKind.UNIFORM))
    assert df.loc["dp", "me_index"] == pytest.approx(planner.me_index(gpt3_plan, uniform))
    assert df.loc["dp", "speedup"] == pytest.approx(uniform.predicted.iteration_ms / gpt3_plan.predicted.iteration_ms)
    with pytest.raises(PlannerInputError, match="names no plan"):
        planner.compare([gpt3_plan], reference="nope")
    with pytest.raises(PlannerInputError, match="has no plan"):
        planner.compare([gpt3_plan], baselines=True, profile=GPT3, cluster="a100-80gb-x8", reference="data-parallel")


def _report(plan: planner.Plan, *, scale: float, saved_bytes: int, model_fp: str = "") -> RunReport:
    """What a run that took ``scale`` x the predicted time would report."""
    stages = tuple(
        StageRecord(
            stage_idx=s.stage_idx, ranks=s.ranks, compute_ms=0.0, idle_ms=0.0,
            compute_ms_predicted=plan.num_microbatches * (s.fwd_ms + s.bwd_ms + s.recompute_ms), compute_rel_error=0.0,
            saved_bytes_peak=saved_bytes, activation_bytes_predicted=0, activation_rel_error=0.0,
        )
        for s in plan.stages
    )
    it = plan.predicted.iteration_ms * scale
    return RunReport(
        model=plan.provenance.model, plan_fingerprint_sha256=model_fp or plan.provenance.fingerprint_sha256,
        world_size=plan.num_devices, backend="gloo", device="cpu", dtype=DType.FLOAT32, optimizer=OptimizerFamily.SGD,
        emulate=True, layout=plan.layout, num_microbatches=plan.num_microbatches,
        microbatch_size=plan.microbatch_size, schedule=plan.schedule, warmup_steps=0,
        steps=(StepRecord(step_idx=0, loss=1.0, wall_ms=it),), stages=stages, iteration_ms=it,
        iteration_ms_predicted=plan.predicted.iteration_ms, iteration_rel_error=scale - 1,
    )


def test_layout_text_is_the_tables_text_of_every_layout() -> None:
    from planner.artifacts.layout import Layout

    assert Layout(num_stages=4, dp_degree=2, zero=ZeroStage.OPTIMIZER).describe() == "P=4 x D=2, ZeRO-1"
    tp = Layout(num_stages=1, dp_degree=4, tp_degree=2, sequence_parallel=True, zero=ZeroStage.OPTIMIZER)
    assert tp.describe() == "T=2 (seq-par) x P=1 x D=4, ZeRO-1"
    assert Layout(num_stages=2, tp_degree=4).describe() == "T=4 x P=2 x D=1, no ZeRO"
    assert Layout(num_stages=3, stage_replicas=(2, 1, 1)).describe() == "P=3 replicated 2+1+1, no ZeRO"
    interleaved = Layout(num_stages=8, virtual_stages_per_rank=2, dp_degree=2, zero=ZeroStage.GRADIENTS)
    assert interleaved.describe() == "P=8 x D=2, ZeRO-2"  # figure titles count stages
    assert interleaved.describe(pipeline_ranks=True) == "8 stages on P=4 pipeline ranks (2 each) x D=2, ZeRO-2"
    assert tp.describe(pipeline_ranks=True) == tp.describe()  # one chunk per rank: the same text


def test_reports_matched_by_signature_and_by_pairing(gpt3_plan: planner.Plan, tmp_path: Path) -> None:
    other = planner.plan(planner.load_profile(GPT3), planner.load_cluster("a100-80gb-x8"),
                         PlanRequest(global_batch=64, solver=SolverKind.UNIFORM))
    act = max(s.activation_bytes_per_microbatch * s.inflight_microbatches for s in other.stages)
    df = planner.compare([gpt3_plan, other], reports=[_report(other, scale=1.25, saved_bytes=act)])
    assert tuple(df.columns) == COLUMNS + MEASURED_COLUMNS
    row = df.loc["uniform"]
    assert row["measured_runs"] == 1
    assert row["measured_iteration_ms"] == pytest.approx(1.25 * other.predicted.iteration_ms)
    assert row["iteration_rel_error"] == pytest.approx(0.25)
    assert row["activation_rel_error"] == 0.0
    assert math.isnan(df.loc["dp", "measured_iteration_ms"])
    # explicit pairing by row index, with a report read from a file
    from planner.artifacts.report import save_report

    path = tmp_path / "run.json"
    save_report(_report(gpt3_plan, scale=0.5, saved_bytes=1), path)
    paired = planner.compare([gpt3_plan, other], reports={0: [path]})
    assert paired.loc["dp", "iteration_rel_error"] == pytest.approx(-0.5)
    # a report of neither plan is refused, naming why
    with pytest.raises(PlannerInputError, match="model fingerprint differs"):
        planner.compare([gpt3_plan], reports=[_report(gpt3_plan, scale=1.0, saved_bytes=1, model_fp="0" * 64)])
    with pytest.raises(PlannerInputError, match=r"\(P, D, M, mb, schedule\)"):
        planner.compare([gpt3_plan], reports=[_report(other, scale=1.0, saved_bytes=1)])


def test_cli_compare_table_csv_markdown_figures(plan_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_csv, figs = tmp_path / "cmp.csv", tmp_path / "figs"
    figs.mkdir()
    assert main(["compare", str(plan_file), "--baselines", "--csv", str(out_csv), "--figures", str(figs)]) == 0
    text = capsys.readouterr().out
    for name in ("ours", *BASELINE_NAMES):
        assert name in text
    assert "data-parallel: infeasible" in text
    with open(out_csv) as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == COLUMNS and [r["solver"] for r in rows] == ["dp", *BASELINE_NAMES]
    for name in ("timelines.png", "memory.png", "pareto.png"):
        data = (figs / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert main(["compare", str(plan_file), "--markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| plan | solver |") and lines[2].startswith("| ours | dp |")


def test_cli_compare_bad_inputs_exit_2(plan_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(tmp_path / "missing.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["compare", str(plan_file), "--reference", "nope"]) == 2
    assert main(["compare", str(plan_file), "--report", "x=run.json"]) == 2
    (tmp_path / "afile").write_text("")
    assert main(["compare", str(plan_file), "--figures", str(tmp_path / "afile")]) == 2  # a missing folder is made
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("planner compare: error:") for line in err)
    lone = tmp_path / "lone" / "p.json"
    lone.parent.mkdir()
    profile = dataclasses.replace(planner.load_profile(GPT3), model="not-shipped")
    planner.save_plan(planner.plan(profile, None, PlanRequest(global_batch=64, solver=SolverKind.UNIFORM)), lone)
    assert main(["compare", str(lone), "--baselines"]) == 2
    assert "pass it (--profile)" in capsys.readouterr().err


def test_a_plans_profile_is_found_decoding_only_the_files_naming_its_model(
    gpt3_plan: planner.Plan, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped profiles are older versions (not canonical): each one found is decoded, so
    the files naming the plan's model are tried first (``planner run`` looks the profile up on
    every launch; decoding all 15 cost about 1 s)."""
    from planner.report import resolve

    decoded: list[str] = []
    real = resolve.profile_from_json

    def counting(data: object, where: str) -> planner.Profile:
        decoded.append(Path(where).name)
        return real(data, where)  # type: ignore[arg-type]

    monkeypatch.setattr(resolve, "profile_from_json", counting)
    assert resolve.find_profile(gpt3_plan) == planner.load_profile(GPT3)
    assert decoded and {d.split("-a100")[0].split("-h100")[0] for d in decoded} == {"gpt3-13b"}, decoded
    assert len(decoded) <= 2  # the A100 and H100 profiles of the same model


def test_export_stage_names_and_schedule_csv(plan_file: Path, gpt3_plan: planner.Plan, tmp_path: Path) -> None:
    names, sched = tmp_path / "stages.json", tmp_path / "schedule.csv"
    uniform = planner.plan(planner.load_profile(GPT3), planner.load_cluster("a100-80gb-x8"),
                           PlanRequest(global_batch=64, per_stage_replication=False))
    uniform_file = tmp_path / "uniform.json"
    planner.save_plan(uniform, uniform_file)
    assert main(["export", str(uniform_file), "--stages-json", str(names), "--schedule-csv", str(sched)]) == 0
    stages = json.loads(names.read_text())
    assert len(stages) == uniform.layout.num_stages
    assert [n for stage in stages for n in stage] == list(planner.load_profile(GPT3).layer_names)
    assert read_schedule_csv(sched) == build_schedule(uniform.schedule, uniform.layout.num_stages, uniform.num_microbatches)
    if gpt3_plan.layout.replicated_per_stage:  # torch's CSV runs one stage per rank: refused, one line, exit 2
        assert main(["export", str(plan_file), "--schedule-csv", str(tmp_path / "r.csv")]) == 2
        assert not (tmp_path / "r.csv").exists()


def test_comparison_figures_draw_every_plan(gpt3_plan: planner.Plan, tmp_path: Path) -> None:
    from planner.report.figures_compare import plot_pareto, plot_stage_memory, plot_timelines

    other = planner.plan(planner.load_profile(GPT3), planner.load_cluster("a100-80gb-x8"),
                         PlanRequest(global_batch=64, solver=SolverKind.UNIFORM))
    fig = plot_timelines([gpt3_plan, other], ["ours", "uniform"])
    assert len(fig.axes) == 2 and fig.axes[0].get_xlim() == fig.axes[1].get_xlim()  # one time scale
    replay_ms = other.predicted.iteration_ms / (1 + other.predicted.straggler_fraction)  # the schedule's own end
    assert fig.axes[1].get_xlim()[1] == pytest.approx(replay_ms * 1.01)
    fig = plot_stage_memory([gpt3_plan, other], ["ours", "uniform"])
    bars = [len(ax.patches) for ax in fig.axes[:2]]
    assert bars == [5 * gpt3_plan.layout.num_stages, 5 * other.layout.num_stages]  # five kinds stacked per stage
    tops = [max(p.get_y() + p.get_height() for p in ax.patches) for ax in fig.axes[:1]]
    assert tops[0] * 1024**3 == pytest.approx(max(s.memory_total_bytes for s in gpt3_plan.stages), rel=1e-9)
    fig = plot_pareto(gpt3_plan, tmp_path / "p.png", others={"uniform": other})
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert any(label.startswith("chosen (dp)") for label in labels) and any(label.startswith("uniform") for label in labels)
    assert len(gpt3_plan.pareto) >= 2
