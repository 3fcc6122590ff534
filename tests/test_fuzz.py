"""Every loader against hostile files (tests/fuzzing.py has the mutation classes and their
oracles): 0 crashes, 0 hangs, 0 silent acceptances, every refusal one line naming the file in
under 5 s of CPU; special files (a FIFO, /dev/zero, a directory, a socket, an empty file)
refused without blocking, in process and through the CLI (exit 2, one line, under 5 s of CPU
and 1 GB). ``benchmarks/fuzz_loaders.py`` runs the same with more mutants and prints figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzzing import CPU_LIMIT_S, Loader, loaders, run_mutants, run_one, special_files

ROOT = Path(__file__).resolve().parents[1]
LOADERS = loaders()
MUTANTS_PER_LOADER = 260  # every class at least 20 times (13 JSON classes, 8 text classes)


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_loader_refuses_every_hostile_mutant(name: str, tmp_path: Path) -> None:
    problems = [f"{m.kind}: {o.problem}" for m, o in run_mutants(LOADERS[name], tmp_path, MUTANTS_PER_LOADER, seed=23) if o.problem]
    assert problems == []


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_loader_refuses_special_files(name: str, tmp_path: Path) -> None:
    with special_files(tmp_path) as files:
        for kind, path in files.items():
            outcome = run_one(LOADERS[name], path, must_refuse=True)
            assert outcome.refused and not outcome.problem, (kind, outcome)


@settings(max_examples=150, deadline=None, database=None)
@given(doc=st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
))
def test_arbitrary_json_never_crashes(doc: object, tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = tmp_path_factory.mktemp("arbitrary")
    for loader in LOADERS.values():
        if not loader.json:
            continue
        body = {**doc, "schema": json.loads(loader.text).get("schema", "x"), "version": 1} if isinstance(doc, dict) else doc
        path = folder / "doc.json"
        path.write_text(json.dumps(body))
        outcome = run_one(loader, path, must_refuse=False)
        assert not outcome.problem.startswith(("crash", "hang", "multi-line", "message")), outcome


# ---------------------------------------------------------------- through the CLI: exit 2, time and memory


#: A small launcher process that starts ``planner`` and reports its rusage. Linux records the
#: old address space's high-water RSS into ``ru_maxrss`` at exec, and subprocess starts children
#: with vfork: measured straight from the test process, a child's peak would include the pytest
#: process's own RSS (over 1 GiB after the golden-plan tests). Started from this launcher (a
#: fresh, small interpreter), the child's figure is its own.
_LAUNCHER = """
import json, os, subprocess, sys, threading
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
deadline = threading.Timer(120.0, proc.kill)  # a hang ends as a kill, and fails the test
deadline.start()
_, status, usage = os.wait4(proc.pid, 0)
deadline.cancel()
print(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024]))
"""


def _cli(argv: list[str], cwd: Path) -> tuple[int, str, float, float]:
    """(exit code, stderr, CPU seconds, peak resident MiB) of ``planner ARGV`` in a fresh process,
    its own resource usage (``os.wait4`` in :data:`_LAUNCHER`), not that of other processes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PLANNER_PROGRESS": "0"}
    with tempfile.TemporaryFile() as err:
        out = subprocess.run([sys.executable, "-c", _LAUNCHER, sys.executable, "-m", "planner", *argv], cwd=cwd,
                             env=env, stdout=subprocess.PIPE, stderr=err, timeout=180, check=True)
        code, cpu, rss = json.loads(out.stdout)
        err.seek(0)
        text = err.read().decode(errors="replace")
    return code, text, cpu, rss


def test_cli_refuses_special_files_fast(tmp_path: Path) -> None:
    graph = LOADERS["pipedream"]
    assert graph.text
    with special_files(tmp_path) as files:
        fifo, zero, folder, sock = files["fifo"], files["dev_zero"], files["directory"], files["socket"]
        cases = [
            ["show", str(fifo)],
            ["simulate", str(zero)],
            ["plan", "--profile", str(folder)],
            ["plan", "--cluster", str(sock)],
            ["export", str(zero)],
            ["import-pipedream", str(fifo), "--out", str(tmp_path / "p.json")],
            ["profile", "--model", f"hf:{zero}"],
            ["profile", "--analytic", "hf", "--config", str(fifo)],
            ["calibrate", str(fifo), "--plan", str(zero), "--profile", str(zero), "--out", str(tmp_path / "c.json")],
            ["plan", "--out", str(fifo)],
        ]
        for argv in cases:
            code, err, cpu, rss = _cli(argv, tmp_path)
            lines = err.strip().splitlines()
            assert code == 2 and len(lines) == 1 and "Traceback" not in err, (argv, err)
            assert cpu < CPU_LIMIT_S and rss < 1024, (argv, cpu, rss)


def test_compare_baselines_passes_over_bad_files_beside_the_plan(tmp_path: Path) -> None:
    """``compare --baselines`` looks for the plan's profile among the JSON files beside it: a
    FIFO, a socket, a directory, /dev/zero, a truncated or hostile file there is passed over,
    never read to the end, never fatal."""
    code, err, _, _ = _cli(["plan", "--profile", str(ROOT / "profiles" / "zoo-gpt-cpu.json"), "--cluster", "local-cpu",
                            "--devices", "2", "--global-batch", "8", "--out", "plan.json"], tmp_path)
    assert code == 0, err
    (tmp_path / "zoo-gpt-cpu.json").write_text((ROOT / "profiles" / "zoo-gpt-cpu.json").read_text())
    (tmp_path / "bad.json").write_text('{"schema": "planner.profile", "version": 2, "model": "\\ud800"')
    (tmp_path / "dup.json").write_text('{"schema": "planner.profile", "schema": "planner.profile"}')
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    with special_files(tmp_path):
        code, err, cpu, _ = _cli(["compare", "plan.json", "--baselines"], tmp_path)
    assert code == 0 and "Traceback" not in err, err
    assert cpu < 30


def test_loader_table_covers_every_loader() -> None:
    """The loaders fuzzed are every reader of a user's file."""
    assert set(LOADERS) == {"profile", "cluster", "plan", "runreport", "pipedream", "hf-config", "analytic-config"}
    assert all(isinstance(v, Loader) for v in LOADERS.values())


# ---------------------------------------------------------------- issue 52: checkpoints, run flags, values, contradictions


def test_hostile_checkpoint_directories_resume_exactly_or_are_refused_in_one_line(tmp_path: Path) -> None:
    """tests/fuzzing_checkpoints.py: each class 10 times; no crash, hang, silent corruption or
    unverified load (on 8607f8e a FIFO manifest hung, a flip without manifest loaded)."""
    import torch.distributed as dist

    from tests.fuzzing_checkpoints import CLASSES, make_base, run_dir_mutants

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        base = make_base(tmp_path)
        problems = [f"{m.kind} ({m.variant}): {o.problem}" for m, o in run_dir_mutants(base, tmp_path, 10 * len(CLASSES), 5)
                    if o.problem]
    finally:
        dist.destroy_process_group()
    assert problems == []


def test_hostile_run_flags_are_refused_in_the_launcher_and_valid_ones_kept(tmp_path: Path) -> None:
    import random

    from planner.artifacts.plan import save_plan
    from tests.fuzzing_checkpoints import _plan
    from tests.fuzzing_values import flag_cases, run_flag_case

    plan = tmp_path / "plan.json"
    save_plan(_plan(), plan)
    outcomes = [(c, run_flag_case(c, str(plan), str(tmp_path / "ckpt"))) for c in flag_cases(random.Random(3), 240)]
    assert [f"{c.flag}={c.text!r}: {o.problem}" for c, o in outcomes if o.problem] == []
    assert sum(o.refused for _, o in outcomes) > 100 and sum(not o.refused for _, o in outcomes) > 20


def test_hostile_hf_config_values_are_refused_by_family(tmp_path: Path) -> None:
    import random

    from tests.fuzzing_values import hf_value_loader, hf_value_mutants

    loader, problems = hf_value_loader(), []
    for i, mutant in enumerate(hf_value_mutants(random.Random(3), 160)):
        path = tmp_path / f"config-{i}.json"
        path.write_bytes(mutant.data)
        outcome = run_one(loader, path, must_refuse=mutant.must_refuse)
        if outcome.problem:
            problems.append(f"{mutant.kind}: {outcome.problem}")
    assert problems == []


def test_every_cross_field_contradiction_is_refused(tmp_path: Path) -> None:
    from tests.fuzzing_values import cross_field_cases

    problems = []
    for i, (loader, mutant) in enumerate(cross_field_cases()):
        path = tmp_path / f"doc-{i}.json"
        path.write_bytes(mutant.data)
        outcome = run_one(loader, path, must_refuse=True)
        if outcome.problem or outcome.cpu_s > 1.0:
            problems.append(f"{mutant.kind}: {outcome.problem or f'{outcome.cpu_s:.2f} CPU-s'}")
    assert problems == []
