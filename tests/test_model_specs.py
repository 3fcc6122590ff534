"""Model specs and factories at the input boundary (issue 23): whatever a factory does ends in
one line and exit 2 within a bounded time; the batch and activation contract is checked at
profile time; Hugging Face refusals that need no model are instant; a model that differs from
the plan's is named by layer and parameter.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import DType
from planner.artifacts.profile import save_profile
from planner.models import layer_param_shapes, load_workload, workload_fingerprint
from planner.models.spec import check_spec, load_factory
from planner.profiling.measured import profile_model
from planner.runtime.check import model_difference

ROOT = Path(__file__).resolve().parents[1]


def _planner(argv: list[str], timeout_s: float = 120.0, **env: str) -> tuple[int, str, float]:
    """(exit code, stderr, CPU seconds) of ``planner ARGV`` in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-m", "planner", *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "PLANNER_PROGRESS": "0", **env})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return proc.returncode, proc.stderr, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


@pytest.mark.parametrize(
    "spec, words",
    [
        ("sys:exit", "called sys.exit(None)"),
        ("os:_exit:status=7", "called os._exit(7)"),
        ("os:abort", "called os.abort()"),
        ("signal:pause", "did not return within 2 s (PLANNER_FACTORY_TIMEOUT_S)"),
        ("planner.commands.cli:main", "calls the planner's model loading again"),
        ("tests.contract_factories:interrupts", "raised KeyboardInterrupt"),
        ("tests.contract_factories:recurses", "raised RecursionError"),
    ],
)
def test_factory_failure_modes_end_in_one_line(spec: str, words: str, tmp_path: Path) -> None:
    """``sys:exit`` exited 0 silently, ``os:_exit`` / ``os:abort`` 7 and 134 silently,
    ``signal:pause`` blocked, ``planner.commands.cli:main`` recursed."""
    start = time.monotonic()
    code, err, _ = _planner(["profile", "--model", spec, "--out", str(tmp_path / "p.json")], PLANNER_FACTORY_TIMEOUT_S="2")
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err
    assert time.monotonic() - start < 60 and not (tmp_path / "p.json").exists()


def test_a_timer_already_set_survives_the_guard() -> None:
    """The factory guard's SIGALRM timer restores one the caller had set."""
    import signal

    signal.setitimer(signal.ITIMER_REAL, 100.0)
    try:
        load_factory("tests.factories:mlp", {}, "tests.factories:mlp")
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 90 < remaining <= 100
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def test_make_batch_with_swapped_arguments_is_refused() -> None:
    """``make_batch(seed, n)`` made a batch of ``seed`` samples: every activation 0 bytes,
    accepted, and ``planner run`` failed later under torchrun."""
    work = load_workload("tests.contract_factories:swapped_batch")
    with pytest.raises(PlannerInputError, match=r"make_batch\(1, 0\) returned inputs with 0 samples along dim 0 .* arguments swapped"):
        profile_model(work, microbatch_sizes=(1, 2), warmup=0, repeats=1, progress=False, trace_ops=False)


def test_a_batch_of_the_wrong_size_is_refused() -> None:
    work = load_workload("tests.contract_factories:fixed_batch")
    with pytest.raises(PlannerInputError, match=r"returned targets with 3 samples along dim 0 \(shape \[3\]\), expected 2"):
        profile_model(work, microbatch_sizes=(2,), warmup=0, repeats=1, progress=False, trace_ops=False)


def test_a_model_with_nothing_to_train_is_refused() -> None:
    """Its backward failed with a torch traceback in the profiler's timing."""
    work = load_workload("tests.contract_factories:saves_nothing")
    with pytest.raises(PlannerInputError, match="the loss does not require a gradient"):
        profile_model(work, microbatch_sizes=(1,), warmup=0, repeats=1, progress=False, trace_ops=False)


def test_all_zero_activations_are_refused() -> None:
    """The backstop behind the batch check: a measurement where nothing is saved anywhere."""
    from planner.profiling.measured.contract import check_activations
    from planner.profiling.measured.memory import measure_layer_bytes

    work = load_workload("tests.factories:mlp")
    inputs, targets = work.make_batch(2, 0)
    measured = measure_layer_bytes(work, inputs, targets)
    check_activations(work, measured)  # a real model saves something
    with pytest.raises(PlannerInputError, match="no layer saves a single byte for backward"):
        check_activations(work, measure_layer_bytes(work, inputs[:0], targets[:0]))


@pytest.mark.parametrize("model_type", ["phi", "gpt_neox", "opt", "bart", "nonsense"])
def test_unsupported_hf_architecture_is_refused_before_torch(model_type: str) -> None:
    """Refused from the spec alone: no torch, no transformers (they took 4.3 s of CPU)."""
    code = (f"import sys; from planner.commands.cli import main; rc = main(['profile', '--model', 'hf:{model_type}']); "
            "print(rc, 'torch' in sys.modules, 'transformers' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.split() == ["2", "False", "False"], proc.stdout + proc.stderr
    assert f"model_type {model_type!r} is not supported" in proc.stderr
    with pytest.raises(PlannerInputError, match="not supported"):
        check_spec(f"hf:{model_type}:layers=2")
    with pytest.raises(PlannerInputError, match=r"num_hidden_layers must be an integer in \[1, 10,000\]"):
        check_spec("hf:llama:layers=-1")


@pytest.mark.hf
def test_a_model_that_differs_from_the_plan_is_named_by_layer_and_parameter(tmp_path: Path) -> None:
    """The plan's profile (found beside the plan) names the first parameter whose shape differs,
    instead of two fingerprint hashes."""
    small = "hf:llama:layers=2,hidden=16,heads=4,kv_heads=2,intermediate=32,vocab=32,seq=8"
    wide = "hf:llama:layers=2,hidden=16,heads=4,kv_heads=2,intermediate=48,vocab=32,seq=8"
    profile = profile_model(load_workload(small), microbatch_sizes=(1,), warmup=0, repeats=1, progress=False, trace_ops=False)
    assert model_difference(profile, load_workload(wide)) == (
        "layer 'block_0' (layer 1) parameter 'block.mlp.gate_proj.weight' has shape [48, 16], the plan's profile [32, 16]")
    from planner.artifacts.profile import save_profile

    save_profile(profile, tmp_path / "small.json")
    code, err, _ = _planner(["plan", "--profile", str(tmp_path / "small.json"), "--cluster", "local-cpu", "--devices", "1",
                             "--global-batch", "2", "--out", str(tmp_path / "plan.json")])
    assert code == 0, err
    code, err, _ = _planner(["run", str(tmp_path / "plan.json"), "--model", wide, "--steps", "1"], timeout_s=300)
    assert code == 2 and "parameter 'block.mlp.gate_proj.weight' has shape [48, 16], the plan's profile [32, 16]" in err, err
    assert json.loads((tmp_path / "plan.json").read_text())["provenance"]["fingerprint_sha256"] == profile.fingerprint_sha256


def test_runtime_dtype_of_shape_difference_is_unaffected() -> None:
    """The shapes compared are the workload's own (any dtype)."""
    work = load_workload("tests.factories:mlp")
    profile = profile_model(work, microbatch_sizes=(1,), warmup=0, repeats=1, progress=False, trace_ops=False)
    assert model_difference(profile, work) == ""
    assert DType.FLOAT32.value == "float32" and torch.get_default_dtype() == torch.float32


QWEN2 = "hf:qwen2:layers=2,hidden=16,heads=4,kv_heads=2,intermediate=32,vocab=32,seq=8"
MISTRAL = "hf:mistral:layers=2,hidden=16,heads=4,kv_heads=2,intermediate=32,vocab=32,seq=8"


def _quick_profile(spec: str) -> Any:
    return profile_model(load_workload(spec), microbatch_sizes=(1,), warmup=0, repeats=1, progress=False, trace_ops=False)


@pytest.mark.hf
def test_a_qwen2_plan_run_with_mistral_names_the_biases() -> None:
    """Issue 51: shapes compared by position blamed ``k_proj.weight [32, 64] vs [64]``; by name
    the real difference is qwen2's q, k and v biases."""
    assert model_difference(_quick_profile(QWEN2), load_workload(MISTRAL)) == (
        "layer 'block_0' (layer 1) lacks parameters 'block.self_attn.q_proj.bias' [16], 'block.self_attn.k_proj.bias' "
        "[8], 'block.self_attn.v_proj.bias' [8] of the plan's profile")
    assert model_difference(_quick_profile(MISTRAL), load_workload(QWEN2)).endswith(
        "has parameters 'block.self_attn.q_proj.bias' [16], 'block.self_attn.k_proj.bias' [8], "
        "'block.self_attn.v_proj.bias' [8] that the plan's profile does not")


@pytest.mark.hf
def test_a_config_field_that_changes_no_shape_is_fingerprinted_and_named(tmp_path: Path) -> None:
    """``sliding_window`` 16 for a plan made at 8: the same shapes, other losses; refused before
    torchrun, naming the field (it ran silently)."""
    eight, sixteen = f"{MISTRAL},sliding_window=8", f"{MISTRAL},sliding_window=16"
    work8, work16 = load_workload(eight), load_workload(sixteen)
    assert layer_param_shapes(work8) == layer_param_shapes(work16)
    assert work8.model_config["sliding_window"] == "8" and workload_fingerprint(work8) != workload_fingerprint(work16)
    profile = _quick_profile(eight)
    assert profile.fingerprint_sha256 == workload_fingerprint(work8) and profile.model_config == work8.model_config
    assert model_difference(profile, work16) == "config field 'sliding_window' is 16 in the model but 8 in the plan's profile"
    save_profile(profile, tmp_path / "p.json")
    code, err, _ = _planner(["plan", "--profile", str(tmp_path / "p.json"), "--cluster", "local-cpu", "--devices", "1",
                             "--global-batch", "2", "--out", str(tmp_path / "plan.json")])
    assert code == 0, err
    code, err, _ = _planner(["run", str(tmp_path / "plan.json"), "--model", sixteen, "--steps", "1"], timeout_s=300)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "config field 'sliding_window' is 16 in the model but 8 in the plan's profile" in err, err


def test_a_plan_fingerprinted_before_version_4_still_runs() -> None:
    """A plan's fingerprint made of layer names and shapes only (before the configuration was
    hashed) is accepted; any other is refused."""
    from planner.runtime.check import check_layers, legacy_fingerprint
    from tests.factories import make_plan

    work = load_workload("tests.factories:mlp")
    work = dataclasses.replace(work, model_config={"dropout": "0.0"})
    assert legacy_fingerprint(work) != workload_fingerprint(work)
    check_layers(make_plan(work.layer_names, (2,), fingerprint=legacy_fingerprint(work)), work)
    check_layers(make_plan(work.layer_names, (2,), fingerprint=workload_fingerprint(work)), work)
    with pytest.raises(PlannerInputError, match="a parameter shape or a config field differs"):
        check_layers(make_plan(work.layer_names, (2,), fingerprint="0" * 64), work)


def test_a_version_3_profile_loads_with_the_rules_it_was_priced_by() -> None:
    """Version 3 files (no parameter names, no configuration, Megatron-LM's sequence parallelism)
    load; a profile using none of version 4's fields is still written as version 3, its text
    and so its sha256 (which plans record) unchanged."""
    from planner.artifacts.kinds import SequenceParallelRuntime
    from planner.artifacts.profile import load_profile, profile_to_json

    v3 = load_profile(ROOT / "profiles" / "gpt3-13b-a100.json")
    assert json.loads((ROOT / "profiles" / "gpt3-13b-a100.json").read_text())["version"] == 3
    assert not v3.model_config and all(not layer.param_names for layer in v3.layers)
    assert all(layer.tp.sequence_runtime is SequenceParallelRuntime.MEGATRON for layer in v3.layers if layer.tp)
    assert profile_to_json(v3)["version"] == 3
    measured = load_profile(ROOT / "profiles" / "zoo-gpt-cpu.json")
    assert profile_to_json(measured)["version"] == 4 and measured.layers[1].param_names
