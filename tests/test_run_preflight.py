"""``planner run`` before torchrun (issue 13, items 4 and 5): the run's dtype and optimizer
against the plan's (refused or warned), ``--help`` showing every default, and the plan checked
against the world size and the model in the launcher: one line, exit 2, no torchrun."""

from __future__ import annotations

import dataclasses
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import DType, OptimizerFamily, OptimizerKind
from planner.artifacts.plan import Plan, save_plan
from planner.commands.cli import main as planner_main
from planner.runtime.model import load_workload, workload_fingerprint
from planner.runtime.preflight import run_settings
from tests.factories import make_plan

ROOT = Path(__file__).resolve().parents[1]
MLP = "tests.factories:mlp"


F32, F64, BF16 = DType.FLOAT32, DType.FLOAT64, DType.BFLOAT16
SGD, ADAMW = OptimizerFamily.SGD, OptimizerFamily.ADAMW


def _plan(dtype: DType | None = None, optimizer: OptimizerKind | None = None) -> Plan:
    workload = load_workload(MLP, 0)
    plan = make_plan(workload.layer_names, (2,), fingerprint=workload_fingerprint(workload))
    return dataclasses.replace(plan, dtype=dtype, optimizer=optimizer)


def _saved(tmp_path: Path, plan: Plan) -> str:
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    return str(path)


def test_run_help_shows_every_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        planner_main(["run", "--help"])
    text = capsys.readouterr().out
    options = text.split("options:")[1].split("\n\n")[0]
    entries: list[str] = []
    for line in options.splitlines():
        if line.startswith("  -"):
            entries.append(line)
        elif entries:
            entries[-1] += " " + line.strip()
    flags = [e.split()[0] for e in entries]
    assert {"--lr", "--seed", "--dtype", "--optimizer", "--warmup-steps", "--timeout-s"} <= set(flags)
    undocumented = [e.split()[0] for e in entries if not ("default" in e or "(required)" in e or e.startswith("  -h"))]
    assert not undocumented, f"options without their default in --help: {undocumented}"
    assert "make_batch(global batch, seed + k)" in " ".join(options.split())  # batch seeding
    assert "--dtype" in text.split("before torchrun starts")[1]  # the mismatch policy, in the epilog


def test_run_settings_follow_the_plan_and_refuse_or_warn() -> None:
    adam_mixed, adam_fp32, sgd_fp32 = OptimizerKind.ADAM_MIXED, OptimizerKind.ADAM_FP32, OptimizerKind.SGD_FP32
    # defaults: the plan's dtype and optimizer family
    assert run_settings(_plan(F64, adam_mixed), None, None) == run_settings(_plan(F64, adam_fp32), None, ADAMW)
    got = run_settings(_plan(F64, adam_mixed), None, None)
    assert (got.dtype, got.optimizer, got.warnings) == (F64, ADAMW, ())
    got = run_settings(_plan(F32, sgd_fp32), None, None)
    assert (got.dtype, got.optimizer, got.warnings) == (F32, SGD, ())
    got = run_settings(_plan(), None, None)  # unknown (a version-2 plan): the runtime's own defaults
    assert (got.dtype, got.optimizer, got.warnings) == (F32, SGD, ())
    got = run_settings(_plan(), F64, ADAMW)
    assert (got.dtype, got.optimizer, got.warnings) == (F64, ADAMW, ())
    # another dtype: refused; another optimizer family: warned
    with pytest.raises(PlannerInputError, match=r"--dtype float64 but the plan was priced for float32.*off by 2x"):
        run_settings(_plan(F32, adam_mixed), F64, None)
    got = run_settings(_plan(F32, adam_mixed), None, SGD)
    assert got.optimizer is SGD and len(got.warnings) == 1 and "priced for adam-mixed but --optimizer sgd" in got.warnings[0]
    # a dtype the runtime does not train in: float32, warned; and not one to run in
    got = run_settings(_plan(BF16, adam_mixed), None, None)
    assert got.dtype is F32 and "priced for bfloat16" in got.warnings[0]
    with pytest.raises(PlannerInputError, match="--dtype must be one of float32, float64 \\(got 'bfloat16'\\)"):
        run_settings(_plan(), BF16, None)


def _cpu_s() -> float:
    """CPU seconds of this process and of its children that ended (a launch's would count)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, float]:
    """(exit code, stderr, CPU seconds: :func:`_cpu_s`) of ``planner ARGS`` run here. CPU, not
    wall: other jobs on the shared machine stretch the wall time (a load average of 10 made
    these refusals take up to ~2 s of wall), not the CPU (0.6-0.9 s each at a load average of
    21; the bound, 3 s, is under what torchrun and two ranks would cost)."""
    start = _cpu_s()
    code = planner_main(args)
    return code, capsys.readouterr().err, _cpu_s() - start


def test_mismatches_are_refused_or_warned_before_torchrun(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _saved(tmp_path, _plan(F32, OptimizerKind.ADAM_MIXED))
    code, err, _ = _cli(["run", plan, "--model", MLP, "--dtype", "float64"], capsys)
    assert code == 2 and err.count("\n") == 1 and "priced for float32" in err
    # the warning comes first, then the world-size refusal (so that no torchrun starts here)
    code, err, _ = _cli(["run", plan, "--model", MLP, "--optimizer", "sgd", "--nproc", "3"], capsys)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 2
    assert lines[0].startswith("warning:") and "adam-mixed" in lines[0]
    assert "plan needs 2 processes" in lines[1] and "--nproc is 3" in lines[1]


def test_plan_and_model_are_checked_in_the_launcher(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _saved(tmp_path, _plan())
    cases = {
        "tests.factories:mlp_wide": "model fingerprint (layer names, parameter shapes",  # same names, other shapes
        "tests.factories:skip": "layer 0 is 'block0' in the plan but 'fork' in model 'skip'",
        "tests.factories:tiny_gpt": "layer 0 is 'block0' in the plan but 'embed'",
        "tests.contract_factories:raising": "factory raised RuntimeError: cannot build this model here",
        "gpt:layers=5": "plan covers 5 layers but model 'gpt' has 7",
    }
    for model, expected in cases.items():
        code, err, seconds = _cli(["run", plan, "--model", model], capsys)
        assert code == 2, (model, err)
        assert err.count("\n") == 1 and expected in err, (model, err)
        assert seconds < 3.0, f"{model}: the refusal took {seconds:.1f} s of CPU in-process"


def test_a_refusal_is_one_line_in_seconds_not_a_torchrun_traceback(tmp_path: Path) -> None:
    """The whole command in a fresh interpreter: one line on stderr, exit 2, no torchrun.
    Measured on the shared 2-core machine: 2.0-2.7 s wall when quiet, 3.0 s of CPU (torch's
    import is 2.2 s of it; the wall time grows with the machine's load); 12-18 s and ~46 lines
    of torchrun traceback before. The bound is on CPU seconds, which other jobs on the machine
    do not inflate: torchrun and two ranks would take well over it."""
    plan = _saved(tmp_path, _plan())
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        [sys.executable, "-m", "planner.commands.cli", "run", plan, "--model", "tests.factories:mlp_wide"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("planner run: error:") and proc.stdout == ""
    assert "fingerprint" in proc.stderr
    assert cpu_s < 5.0, f"the refusal took {cpu_s:.1f} s of CPU"


@pytest.mark.parametrize("boundaries", [(), (2,)], ids=["one-stage", "two-stage"])
def test_swapped_make_batch_arguments_are_refused_with_their_cause(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], boundaries: tuple[int, ...]) -> None:
    """Issue 51: a ``make_batch(seed, batch_size)`` passes the fingerprint (same layers and
    shapes); the one-stage plan died under torchrun with "number of sections must be larger than
    0", the two-stage one was blamed on "other shapes (sequence length, width?)"."""
    workload = load_workload(MLP, 0)
    plan = make_plan(workload.layer_names, boundaries, fingerprint=workload_fingerprint(workload))
    code, err, _ = _cli(["run", _saved(tmp_path, plan), "--model", "tests.factories:mlp_swapped_batch"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert f"make_batch({plan.global_batch}, 0) returned inputs with 0 samples along dim 0" in err
    assert "are its arguments swapped?" in err
    assert "sections" not in err and "other shapes" not in err


# ---------------------------------------------------------------- issue 52 item 4: every flag, before torchrun
# On 8607f8e (before issue 52) each of these started torchrun: the ranks refused it 3-10 s later, each
# with torchrun's ~35-line ChildFailedError traceback (--timeout-s 1e308: OverflowError, 5e-324: a c10d
# "timed out after 0ms"); --lr 1e308, 1_000 and --warmup-steps 1e40 trained every step and failed after
# training; --checkpoint-every -1 was accepted.
BAD_RUN_FLAGS = [
    *(["--timeout-s", v] for v in ("0", "-1", "nan", "inf", "1e400", "1e308", "5e-324", "1_000")),
    *(["--lr", v] for v in ("0", "-1", "nan", "inf", "1e400", "1e40", "1e308", "1_000", "5e-324")),
    *(["--warmup-steps", v] for v in ("-1", "1e40", "1_000", "1.5")),
    *(["--checkpoint-every", v] for v in ("-1", "1e40", "1_000")),
    *(["--steps", v] for v in ("0", "1e40", "1_000")),
    *(["--seed", v] for v in ("-1", "1e40", "1_000")),
    *(["--keep-last", v] for v in ("-1", "1_000")),
    ["--nproc", "0"],
]


@pytest.mark.parametrize("flag", BAD_RUN_FLAGS, ids=lambda f: " ".join(f))
def test_every_run_flag_is_refused_in_the_launcher(tmp_path: Path, flag: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", _saved(tmp_path, _plan()), "--model", MLP, "--checkpoint-dir", str(tmp_path / "ckpt"), *flag]
    with pytest.raises(SystemExit) as info:
        planner_main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"argument {flag[0]}:" in err and repr(flag[1]) in err, err


def test_flags_only_a_rank_would_refuse_are_refused_in_the_launcher(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Combinations: the ranks' own parser and RuntimeOptions, run in the launcher (no torchrun)."""
    plan = _saved(tmp_path, _plan())
    cases = {
        ("--checkpoint-every", "2"): "--checkpoint-every needs --checkpoint-dir",
        ("--trust-unverified-checkpoint",): "--trust-unverified-checkpoint applies to --resume only",
    }
    for flags, words in cases.items():
        started = time.monotonic()
        assert planner_main(["run", plan, "--model", MLP, *flags]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and words in err, err
        assert time.monotonic() - started < 5.0


def test_the_launcher_and_the_ranks_read_a_flag_alike() -> None:
    from planner.artifacts.kinds import DType, OptimizerFamily
    from planner.runtime.main import build_parser, runtime_options

    parsed = build_parser().parse_args(["--plan", "p", "--model", "m", "--lr", "0.5", "--timeout-s", "7"])
    options = runtime_options(parsed, DType.FLOAT32, OptimizerFamily.SGD)
    assert options.lr == 0.5 and options.timeout_s == 7.0
    with pytest.raises(PlannerInputError, match=r"argument --lr: expected a number in \[1e-12, 10\], got '1_000'"):
        build_parser().parse_args(["--plan", "p", "--model", "m", "--lr", "1_000"])


def test_a_split_backward_plan_that_recomputes_runs_without_a_warning() -> None:
    """ZB-H1 recomputing on every stage (``make_plan``'s recompute) is no longer warned about:
    the runtime recomputes each layer once in I and keeps it to W, as the plan prices
    (``planner.runtime.recompute``; ``tests/test_zero_bubble.py`` counts the forward runs), and
    builds its stages so."""
    from planner.artifacts.kinds import ScheduleKind
    from planner.runtime.stage_helpers import stage_module

    workload = load_workload(MLP, 0)
    names, fp = workload.layer_names, workload_fingerprint(workload)
    zb = make_plan(names, (2,), schedule=ScheduleKind.ZB_H1, recompute=True, fingerprint=fp)
    assert all(stage.recompute for stage in zb.stages)
    assert run_settings(zb, None, None, source="p.json").warnings == ()
    import torch

    for plan in (zb, make_plan(names, (2,), schedule=ScheduleKind.ONE_F_ONE_B, recompute=True, fingerprint=fp)):
        module = stage_module(workload, plan.stages[1], torch.device("cpu"), plan.schedule.splits_backward)
        assert (module.ledger is not None) == plan.schedule.splits_backward  # 1F1B keeps torch's checkpoint
