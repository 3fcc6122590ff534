"""The planner CLI: exit codes, one-line errors, determinism, infeasible explanations."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest

from planner.artifacts.cluster import PRESETS, cluster_to_json
from planner.artifacts.kinds import CollectiveModel, OverheadKind
from planner.artifacts.plan_summary import OverheadTerm, Prediction
from planner.artifacts.profile import profile_to_json, save_profile
from planner.commands.cli import main
from planner.cost.collectives import allreduce_line
from planner.report.table import band_text
from tests.chains import chain_profile


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, timeout=120)


def test_default_plan_prints_table():
    proc = run_cli("plan")
    assert proc.returncode == 0, proc.stderr
    assert "stage" in proc.stdout and "iteration" in proc.stdout and "throughput" in proc.stdout


def test_planning_path_does_not_import_torch():
    code = (
        "import sys, planner; from planner.commands.cli import main; "
        "rc = main(['plan', '--global-batch', '64']); "
        "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_runtime_checks_import_no_tensor_parallelism():
    """The checks ``planner run`` makes before launching (``planner.runtime.preflight``,
    ``planner.runtime.check``) import torch but not ``torch.distributed.tensor`` (0.9 s here),
    which only the profiler's tensor-parallel checks need (preflight module docstring)."""
    code = ("import sys, planner.runtime.preflight, planner.runtime.check; "
            "print('torch' in sys.modules, 'torch.distributed.tensor' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False"]


def _modules_after(*argv: str) -> set[str]:
    """The modules a ``planner`` process with ``argv`` has imported when it ends (its own entry
    point, ``python -m planner``, so with its own environment handling)."""
    code = (
        "import json, runpy, sys\n"
        f"sys.argv = ['planner', *{list(argv)!r}]\n"
        "try:\n    runpy.run_module('planner', run_name='__main__')\n"
        "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "finally:\n    print(json.dumps(sorted(sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_commands_import_only_what_they_use():
    """``planner --help`` builds every parser without the solver or NumPy; ``planner plan``
    imports the solver but no other command's modules (runtime, calibration, export) and none
    of the heavy packages planning does not use (cli module docstring)."""
    heavy = {"numpy", "networkx", "ortools", "pandas", "matplotlib", "torch", "scipy"}
    help_mods = _modules_after("--help")
    assert not help_mods & heavy, sorted(help_mods & heavy)
    assert not {m for m in help_mods if m.startswith(("planner.solve", "planner.cost", "planner.simulation"))}
    plan_mods = _modules_after("plan", "--global-batch", "64", "--tp", "1", "--zero", "0", "--schedules", "1f1b")
    assert "planner.solve.search" in plan_mods and "numpy" in plan_mods
    assert not plan_mods & (heavy - {"numpy"}), sorted(plan_mods & heavy)
    assert "numpy.ma" not in plan_mods  # np.unique imports it (planner.solve.arrays.distinct)
    # (the analytic generators are loaded where a plan's band rebuilds an analytic profile with the
    # leave-one-source-out fits of its device's constants: planner.cost.band)
    unused = {m for m in plan_mods if m.startswith(("planner.runtime", "planner.report.calibrate", "planner.report.export",
                                                    "planner.solve.pipedream", "planner.solve.baselines"))}
    assert not unused, sorted(unused)


def test_help_on_every_subcommand(capsys):
    from planner.commands.cli import COMMANDS

    for name in COMMANDS:
        with pytest.raises(SystemExit) as exc:
            main([name.replace("_", "-"), "--help"])
        assert exc.value.code == 0
        assert "usage" in capsys.readouterr().out


def test_plan_files_are_byte_identical(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["plan", "--global-batch", "128", "--out", str(a)]) == 0
    assert main(["plan", "--global-batch", "128", "--out", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()


def test_show_prints_saved_plan(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["plan", "--global-batch", "64", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    assert "iteration" in capsys.readouterr().out


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _profile_doc():
    return profile_to_json(chain_profile([dict(fwd=1, bwd=2, params=1000, saved=1e3, inp=1e2, out=1e2)] * 3))


@pytest.mark.parametrize(
    "case",
    ["missing_field", "wrong_type", "negative_time", "nan_time", "unknown_version", "not_json", "zero_devices",
     "bad_flag", "no_file", "cluster_zero_nodes"],
)
def test_invalid_input_exits_2_with_one_line(tmp_path, capsys, case):
    doc = _profile_doc()
    args = ["plan"]
    if case == "missing_field":
        del doc["layers"][0]["fwd"]
    elif case == "wrong_type":
        doc["layers"][0]["param_count"] = [1]
    elif case == "negative_time":
        doc["layers"][1]["bwd"]["per_sample_ms"] = -3.0
    elif case == "nan_time":
        pass
    elif case == "unknown_version":
        doc["version"] = 7
    if case == "nan_time":
        text = re.sub(r'"per_sample_ms": [0-9.]+', '"per_sample_ms": NaN', json.dumps(doc), count=1)
        assert "NaN" in text
        args += ["--profile", _write(tmp_path, "p.json", text)]
    elif case == "not_json":
        args += ["--profile", _write(tmp_path, "p.json", "{not json")]
    elif case == "zero_devices":
        args += ["--devices", "0"]
    elif case == "bad_flag":
        args += ["--global-batch", "lots"]
    elif case == "no_file":
        args += ["--profile", str(tmp_path / "absent.json")]
    elif case == "cluster_zero_nodes":
        cdoc = cluster_to_json(PRESETS["local-cpu"])
        cdoc["num_nodes"] = 0
        args += ["--cluster", _write(tmp_path, "c.json", json.dumps(cdoc))]
    else:
        args += ["--profile", _write(tmp_path, "p.json", json.dumps(doc))]
    with pytest.raises(SystemExit) if case in ("zero_devices", "bad_flag") else _nullcontext() as ctx:
        rc = main(args)
    if case in ("zero_devices", "bad_flag"):
        rc = ctx.value.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err and len(err.splitlines()) == 1, err
    assert "Traceback" not in err


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_invalid_input_subprocess_has_no_traceback(tmp_path):
    proc = run_cli("plan", "--profile", _write(tmp_path, "p.json", '{"schema": "planner.profile", "version": 1}'))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "p.json" in proc.stderr and "missing required field" in proc.stderr


def test_infeasible_exits_3_and_explains(tmp_path, capsys):
    big = chain_profile([dict(fwd=1, bwd=2, params=400_000_000, saved=1e8, inp=1e6, out=1e6)] * 4)
    path = tmp_path / "big.json"
    save_profile(big, path)
    rc = main(["plan", "--profile", str(path), "--cluster", "local-cpu", "--global-batch", "8"])
    assert rc == 3
    err = capsys.readouterr().err
    assert "no plan fits" in err and "Tightest stage" in err and "bytes over" in err
    assert "more devices" in err or "micro-batch" in err


def test_unwritable_output_is_refused_before_planning(tmp_path, capsys):
    rc = main(["plan", "--out", str(tmp_path / "missing" / "plan.json")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "folder does not exist" in err and len(err.strip().splitlines()) == 1


def test_recompute_is_forced_from_the_command_line_and_the_band_printed(tmp_path, capsys):
    """``--recompute full`` recomputes every transformer block; the table prints the iteration's
    band, whether the plan fits at its top, and the overhead terms; ``--stack megatron-core``
    still names the Megatron-Core 0.8 preset."""
    out = tmp_path / "p.json"
    assert main(["plan", "--global-batch", "64", "--recompute", "full", "--stack", "megatron-core", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert re.search(r"iteration \d+\.\d+ ms \(\d+\.\d+-\d+\.\d+\)", text), text
    assert "memory at its top" in text and "fits the device's" in text and "overheads in the iteration: " in text
    doc = json.loads(out.read_text())
    blocks = [i for s in doc["stages"] for i in range(s["layer_start"], s["layer_stop"]) if 1 <= i <= 40]
    assert sorted(i for s in doc["stages"] for i in s["recompute"]) == blocks
    assert doc["provenance"]["request"]["recompute_mode"] == "full" and doc["stack"]["name"] == "megatron-core-0.8"
    assert doc["predicted"]["band"]["iteration_low_ms"] <= doc["predicted"]["iteration_ms"]
    assert {t["kind"] for t in doc["predicted"]["overheads"]} >= {"straggler"}


def test_a_cluster_file_from_before_the_memory_correction_exits_2_naming_the_value(tmp_path, capsys):
    cdoc = cluster_to_json(PRESETS["a100-80gb-x8"])
    cdoc["device_memory_bytes"] = 80 * 10**9
    rc = main(["plan", "--cluster", _write(tmp_path, "old.json", json.dumps(cdoc))])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "old.json" in err and "predates the correction" in err and str(PRESETS["a100-80gb-x8"].device_memory_bytes) in err


def test_the_nccl_term_says_why_it_is_negative():
    """Llama-3 70B at T = 8 on 16 A100s printed "nccl-collectives -9892.59 ms" unexplained: inside a
    node NCCL's ring costs 8.4 us + 14 NVLink steps of 3.4 us, the alpha-beta ring 14 steps of the
    link's 10 us small-message latency (planner/cost/overheads.py); the line says so."""
    nccl = PRESETS["a100-80gb-x8"]
    beta = dataclasses.replace(nccl, collective_model=CollectiveModel.ALPHA_BETA)
    assert allreduce_line(nccl, range(8))[1] == pytest.approx(0.056)
    assert allreduce_line(beta, range(8))[1] == pytest.approx(0.140)
    assert allreduce_line(nccl, range(8))[0] == allreduce_line(beta, range(8))[0]  # the same bandwidth term

    def line(ms: float) -> str:
        terms = (OverheadTerm(kind=OverheadKind.NCCL_COLLECTIVES, ms=ms, source="s"),
                 OverheadTerm(kind=OverheadKind.HOST, ms=1.0, source="s"))
        return band_text(dataclasses.replace(Prediction.unset(1), overheads=terms))

    assert ("nccl-collectives -9892.59 ms (NCCL's NVLink step latency below the alpha-beta ring's), host 1.00 ms"
            in line(-9892.59))
    assert "nccl-collectives 12.00 ms (NCCL's network step latency above the alpha-beta ring's)" in line(12.0)
    assert "nccl-collectives 0.00 ms, host" in line(0.001)


def test_moe_plan_without_zero_bubble_schedules_has_no_traceback(tmp_path):
    """Qwen3-30B-A3B on 16 H100s with the schedules named (no zero bubble): the search tries an
    HSDP candidate at a lower ZeRO stage (``build.least_zero``), which raised a ValueError
    (``shard_group_size 4 needs ZeRO 3``) until ``Config.with_zero`` dropped its shard groups;
    now a plan, exit 0."""
    prof = tmp_path / "q30.json"
    made = run_cli("profile", "--analytic", "hf", "--config", "configs/qwen3-30b-a3b.json", "--seq", "4096",
                   "--device-preset", "h100-80gb", "--out", str(prof))
    assert made.returncode == 0, made.stderr
    proc = run_cli("plan", "--profile", str(prof), "--cluster", "h100-80gb-x8", "--devices", "16", "--global-batch", "64",
                   "--stack", "megatron-core", "--moe-dispatcher", "deepep", "--cp", "1",
                   "--schedules", "gpipe,1f1b,interleaved-1f1b")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "plan for qwen3-30b-a3b" in proc.stdout
