"""Cross-field checks of loaded documents (planner/artifacts/consistency.py) and refusal cost
(issue 52 items 6 and 7): each contradiction the issue names is refused in one line naming the
file, the field and the value; each was accepted on 8607f8e (before issue 52), as the issue
measured (a layer's param_bytes 2^61 beside 198,272 parameters, a plan predicting 1e-9 ms for
stages that add up to 49 ms, a stage of 1 byte, reports with no steps, the same step twice,
negative or 2^64 losses, a report of another model calibrated; the empty-sequence ``max()``
of a report with iteration_ms 0), and the two slow refusals took 6.3 and 6.2 s (the plan was
even accepted).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.plan import load_plan
from planner.artifacts.profile import load_profile
from planner.artifacts.report import load_report
from planner.report.resolve import report_mismatch
from tests.fuzzing import loaders

ROOT = Path(__file__).resolve().parents[1]
LOADERS = loaders()
MEASURED = ROOT / "profiles" / "zoo-gpt-cpu.json"  # measured: param_shapes and a fingerprint


def _refused(tmp_path: Path, load: Callable[[Path], Any], doc: Any, *words: str) -> str:
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc))
    cpu = time.process_time()
    with pytest.raises(PlannerInputError) as info:
        load(path)
    used = time.process_time() - cpu
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    for word in words:
        assert word in message, (word, message)
    assert used < 1.0, (used, message)
    return message


def _doc(name: str) -> Any:
    return json.loads(LOADERS[name].text)


def test_param_bytes_that_contradict_param_count_are_refused(tmp_path: Path) -> None:
    doc = json.loads(MEASURED.read_text())
    layer = doc["layers"][1]
    layer["param_bytes"] = 2**61
    _refused(tmp_path, load_profile, doc, "layers[1]", "param_bytes 2,305,843,009,213,693,952", f"{layer['param_count']:,}")


@pytest.mark.parametrize("shapes", [[], [[]], [[1] * 10**6]])
def test_empty_or_absurd_param_shapes_are_refused(tmp_path: Path, shapes: list[list[int]]) -> None:
    doc = json.loads(MEASURED.read_text())
    doc["layers"][1]["param_shapes"] = shapes
    _refused(tmp_path, load_profile, doc, "param_shapes")  # [] is refused for its 16 param_names (the layer's own check)


def test_the_shipped_profiles_hold_together() -> None:
    for path in sorted((ROOT / "profiles").glob("*.json")):
        load_profile(path)


def test_a_plan_faster_than_its_stages_is_refused(tmp_path: Path) -> None:
    doc = _doc("plan")
    doc["predicted"]["iteration_ms"] = 1e-9
    _refused(tmp_path, load_plan, doc, "predicted.iteration_ms 1e-09 is less than rank")


def test_a_stage_whose_memory_total_is_not_its_parts_is_refused(tmp_path: Path) -> None:
    doc = _doc("plan")
    doc["stages"][0]["memory_total_bytes"] = 1
    _refused(tmp_path, load_plan, doc, "stages[0].memory_total_bytes 1 is not the sum")


def test_a_throughput_that_is_not_the_batch_over_the_time_is_refused(tmp_path: Path) -> None:
    doc = _doc("plan")
    doc["predicted"]["throughput_samples_per_s"] *= 1000
    _refused(tmp_path, load_plan, doc, "throughput_samples_per_s")


@pytest.mark.parametrize(("edit", "words"), [
    (lambda d: d.update(steps=[]), ("steps: a run report holds at least one step",)),
    (lambda d: d["steps"].append(dict(d["steps"][0])), ("step_idx 0 follows 0",)),
    (lambda d: d["steps"][0].update(loss=-1.0), ("steps[0]", "loss", "-1.0")),
    (lambda d: d["steps"][0].update(loss=2**64), ("steps[0]", "loss", "1.8446744073709552e+19")),
    (lambda d: d.update(iteration_ms=1e6), ("iteration_ms 1e+06 is outside its steps' wall times",)),
])
def test_contradictory_run_reports_are_refused(tmp_path: Path, edit: Callable[[Any], None], words: tuple[str, ...]) -> None:
    doc = _doc("runreport")
    edit(doc)
    _refused(tmp_path, load_report, doc, *words)


def test_a_report_of_another_model_does_not_match_the_plan(tmp_path: Path) -> None:
    plan_path, report_path = tmp_path / "plan.json", tmp_path / "report.json"
    plan_path.write_text(LOADERS["plan"].text)
    doc = _doc("runreport")
    report_path.write_text(json.dumps(doc))
    plan, report = load_plan(plan_path), load_report(report_path)
    assert report_mismatch(plan, report) == ""
    other = dataclasses.replace(report, model="another-model")
    assert "model 'another-model' is not the plan's" in report_mismatch(plan, other)


def test_calibrating_with_a_report_that_measured_no_iteration_is_one_line() -> None:
    """Was ``ValueError: max() arg is an empty sequence`` from the overhead fit."""
    from planner.report.calibrate import calibrate
    from tests.chains import chain_profile, small_cluster

    plan = load_plan_text(LOADERS["plan"].text)
    report = load_report_text(_doc("runreport"))
    zero = dataclasses.replace(report, steps=tuple(dataclasses.replace(s, wall_ms=0.0) for s in report.steps),
                               iteration_ms=0.0, iteration_rel_error=-1.0)
    profile = chain_profile([dict(fwd=1, bwd=2, params=1000, saved=1e6, inp=1e5, out=1e5)] * 3)
    with pytest.raises(PlannerInputError, match=r"^r0.json: iteration_ms: 0: the run measured no iteration time"):
        calibrate([zero], [plan], profile, small_cluster(2), report_names=["r0.json"])


def load_plan_text(text: str) -> Any:
    from planner.artifacts.codec import parse_text
    from planner.artifacts.plan import plan_from_json

    return plan_from_json(parse_text(text, "plan"), "plan")


def load_report_text(doc: Any) -> Any:
    from planner.artifacts.report import report_from_json

    return report_from_json(copy.deepcopy(doc), "report")


# ---------------------------------------------------------------- item 7: refusal cost


def test_a_report_with_20000_stage_records_is_refused_within_a_cpu_second(tmp_path: Path) -> None:
    doc = _doc("runreport")
    record = doc["stages"][0]
    doc["stages"] = [dict(record, stage_idx=i, ranks=[0]) for i in range(20_000)]
    text = json.dumps(doc)
    assert len(text) > 15 * 10**6  # the 18 MB report (records of this plan are a little shorter)
    _refused(tmp_path, load_report, doc, "20,000 stage records")


def test_a_report_whose_20000_stages_agree_with_its_layout_is_refused_within_a_cpu_second(tmp_path: Path) -> None:
    doc = _doc("runreport")
    record, n = doc["stages"][0], 20_000
    doc["layout"]["num_stages"], doc["world_size"] = n, n
    doc["stages"] = [dict(record, stage_idx=i, ranks=[i]) for i in range(n)]
    doc["stages"][-1]["compute_ms"] = -1.0  # the refusal is the last record's
    _refused(tmp_path, load_report, doc, "stages[19999]: compute_ms")


def test_a_plan_with_a_million_requested_schedules_is_refused_within_a_cpu_second(tmp_path: Path) -> None:
    doc = _doc("plan")
    doc["provenance"]["request"]["schedules"] = ["1f1b"] * 10**6
    _refused(tmp_path, load_plan, doc, "provenance.request.schedules", "1,000,000 items")


def test_a_schedule_requested_twice_is_refused(tmp_path: Path) -> None:
    doc = _doc("plan")
    doc["provenance"]["request"]["schedules"] = ["1f1b", "1f1b"]
    _refused(tmp_path, load_plan, doc, "schedules lists '1f1b' twice")
