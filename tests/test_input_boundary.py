"""The input boundary (issue 23): each hostile input the issue names is refused with exit 2 and
one line naming the file (or flag), the field path and the value, before any work.

The classes at scale are tests/test_fuzz.py's; these are the named cases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.artifacts import codec
from planner.artifacts.cluster import PRESETS, cluster_to_json, load_cluster
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.limits import MAX_INPUT_BYTES
from planner.artifacts.plan import load_plan, plan_to_json
from planner.artifacts.profile import load_profile, profile_to_json
from planner.artifacts.request import PlanRequest
from planner.commands.cli import main
from planner.solve import plan as solve
from tests.chains import chain_profile, small_cluster

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def docs(tmp_path: Path) -> dict[str, Path]:
    prof = chain_profile([dict(fwd=1, bwd=2, params=1000, saved=1e6, inp=1e5, out=1e5)] * 4)
    pl = solve(prof, small_cluster(2), PlanRequest(global_batch=4, num_stages=2))
    out = {"profile": tmp_path / "profile.json", "plan": tmp_path / "plan.json"}
    out["profile"].write_text(codec.dumps_canonical(profile_to_json(prof)))
    out["plan"].write_text(codec.dumps_canonical(plan_to_json(pl)))
    return out


def _one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str], *words: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)
    return err


def _edit(path: Path, edit: object) -> None:
    data = json.loads(path.read_text())
    edit(data)  # type: ignore[operator]
    path.write_text(json.dumps(data))


def test_lone_surrogate_is_refused_naming_file_and_path(docs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    text = docs["profile"].read_text().replace('"model": "chain"', '"model": "chain\\ud800"')
    docs["profile"].write_text(text)
    _one_line_exit_2(["plan", "--profile", str(docs["profile"])], capsys, str(docs["profile"]), "model", "surrogate")
    text = docs["plan"].read_text().replace('"model": "chain"', '"model": "\\udc00"')
    docs["plan"].write_text(text)
    _one_line_exit_2(["show", str(docs["plan"])], capsys, str(docs["plan"]), "provenance.model", "surrogate")


def test_duplicate_keys_are_refused(docs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    text = docs["plan"].read_text().replace('"num_microbatches":', '"num_microbatches": 999, "num_microbatches":', 1)
    docs["plan"].write_text(text)
    _one_line_exit_2(["show", str(docs["plan"])], capsys, "num_microbatches", "appears twice")


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda d: d["stages"][0].update(fwd_ms=-1.0), ("stages[0]", "fwd_ms", "-1.0")),
        (lambda d: d["stages"][1]["memory"].update(param_bytes=-10**12), ("stages[1].memory", "param_bytes")),
        (lambda d: d["predicted"].update(iteration_ms=-1.0), ("predicted", "iteration_ms", "-1.0")),
        (lambda d: d["stages"][0].update(ranks=[-1]), ("ranks",)),
        (lambda d: d["stages"][1].update(ranks=[0]), ("stage 1", "ranks [0]")),
        (lambda d: d["stages"][0].update(layer_names=list(reversed(d["stages"][1]["layer_names"]))), ("appears twice",)),
        (lambda d: d["stages"][0].update(layer_names=["a\nb"] * len(d["stages"][0]["layer_names"])), ("printable",)),
        (lambda d: d.update(global_batch=2**40, num_microbatches=2**40), ("global_batch",)),
    ],
)
def test_plan_values_are_range_checked_when_read(docs: dict[str, Path], capsys: pytest.CaptureFixture[str], edit: object,
                                                 words: tuple[str, ...]) -> None:
    """``planner show`` and ``planner simulate`` refuse a hand-edited plan whose values no
    plan has (negative times, bytes, ranks; two stages on one rank; a layer in two stages)."""
    _edit(docs["plan"], edit)
    for command in ("show", "simulate"):
        _one_line_exit_2([command, str(docs["plan"])], capsys, str(docs["plan"]), *words)


def test_raw_measurements_are_range_checked(docs: dict[str, Path]) -> None:
    """A measured point of 1e308 ms is refused even though plans use the fitted line."""
    _edit(docs["profile"], lambda d: d["layers"][1].update(measured=[{"microbatch_size": 1, "fwd_ms": 1e308, "bwd_ms": 1.0}]))
    with pytest.raises(PlannerInputError, match=r"layers\[1\]\.measured\[0\]: fwd_ms must be in \[0, 1e\+15\] \(got 1e\+308\)"):
        load_profile(docs["profile"])


def test_denormal_peak_is_refused_at_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """peak_tflops 5e-324 made MFU infinite, refused only when the plan was written (a traceback)."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**cluster_to_json(PRESETS["a100-80gb-x8"]), "peak_tflops": 5e-324}))
    _one_line_exit_2(["plan", "--cluster", str(path)], capsys, str(path), "peak_tflops", "5e-324")
    path.write_text(json.dumps({**cluster_to_json(PRESETS["a100-80gb-x8"]), "intra_node_bandwidth_gb_per_s": 1e-300}))
    with pytest.raises(PlannerInputError, match="intra_node_bandwidth_gb_per_s must be in"):
        load_cluster(path)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["plan", "--memory-cap-gib", "1e308"], ("--memory-cap-gib", "1e308")),
        (["plan", "--memory-cap-gib", "nan"], ("--memory-cap-gib",)),
        (["plan", "--time-budget-ms", "inf"], ("--time-budget-ms",)),
        (["plan", "--global-batch", "99999999999999999999"], ("--global-batch",)),
        (["plan", "--devices", "-3"], ("--devices",)),
        (["plan", "--tp", "1,99999999999"], ("--tp",)),
        (["profile", "--analytic", "gpt", "--layers", "0"], ("--layers",)),
        (["profile", "--analytic", "gpt", "--efficiency", "nan"], ("--efficiency",)),
        (["profile", "--model", "gpt", "--repeats", "0"], ("--repeats",)),
        (["simulate", "x.json", "--optimizer-ms", "-1"], ("--optimizer-ms",)),
        # issue 52: 1e-30 GiB rounded to 0 bytes and planned with the default cap; the empty item was dropped
        (["plan", "--memory-cap-gib", "1e-30"], ("--memory-cap-gib", "at least one byte", "1e-30")),
        (["plan", "--microbatch-sizes", "1,,2"], ("--microbatch-sizes", "an empty item", "1,,2")),
        (["plan", "--global-batch", "1_000"], ("--global-batch", "1_000")),
    ],
)
def test_flags_are_finite_and_in_range(argv: list[str], words: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and all(w in err for w in words), err


def test_non_utf8_graph_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.fuzzing import PIPEDREAM_GRAPH

    path = tmp_path / "graph.txt"
    path.write_bytes(PIPEDREAM_GRAPH.encode().replace(b"Conv2d", b"Conv\xff2d"))
    _one_line_exit_2(["import-pipedream", str(path), "--out", str(tmp_path / "p.json")], capsys, str(path), "not UTF-8", "byte")


def test_fifo_and_dev_zero_are_refused_without_reading(tmp_path: Path) -> None:
    """A FIFO blocked forever and /dev/zero filled memory: both refused at once, in a fresh process."""
    fifo = tmp_path / "p.json"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for path in (fifo, Path("/dev/zero")):
        proc = subprocess.run([sys.executable, "-m", "planner", "plan", "--profile", str(path)], env=env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2 and str(path) in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    with pytest.raises(PlannerInputError, match="is a FIFO"):
        load_plan(fifo)


def test_bom_is_accepted(docs: dict[str, Path]) -> None:
    """RFC 8259 lets a parser ignore a UTF-8 byte-order mark; Windows editors write one."""
    before = load_profile(docs["profile"])
    docs["profile"].write_bytes(b"\xef\xbb\xbf" + docs["profile"].read_bytes())
    assert load_profile(docs["profile"]) == before


def test_oversized_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    with open(path, "wb") as fh:
        fh.truncate(MAX_INPUT_BYTES + 1)  # sparse: nothing is written
    with pytest.raises(PlannerInputError, match="larger than"):
        codec.read_json(path)


@pytest.mark.parametrize("argv, flag", [
    (["plan", "--microbatch-sizes", "0"], "--microbatch-sizes"),
    (["plan", "--zero", "5"], "--zero"),
    (["plan", "--zero", "1,1"], "--zero"),
    (["plan", "--tp", "0"], "--tp"),
    (["plan", "--cp", "0"], "--cp"),
    (["plan", "--fixed-boundaries", "0"], "--fixed-boundaries"),
    (["plan", "--global-batch", "7", "--dp-degree", "2"], "--dp-degree"),
    (["plan", "--stages", "9", "--max-stages", "2"], "--max-stages"),
    (["plan", "--schedules", "1f1b,1f1b"], "--schedules"),
])
def test_request_refusals_name_the_flag_not_the_field(argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 52: 16 refusals named PlanRequest's field (``microbatch_sizes``) rather than the flag."""
    err = _one_line_exit_2(argv, capsys, flag)
    for field in ("microbatch_sizes", "zero_stages", "tp_degrees", "cp_degrees", "fixed_boundaries", "dp_degree",
                  "max_stages", "num_stages", "global_batch"):
        assert field not in err, err
