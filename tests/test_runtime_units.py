"""In-process checks of the runtime's parts: saved-bytes meter, emulated layers, plan checks,
and the RunReport document."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import DType, OptimizerFamily, ScheduleKind
from planner.artifacts.layout import Layout
from planner.artifacts.plan import Plan, plan_to_json
from planner.artifacts.profile import Layer, Profile, TimeFit
from planner.artifacts.report import (
    RunReport,
    StageRecord,
    StepRecord,
    report_from_json,
    report_to_json,
)
from planner.commands.cli import main as planner_main
from planner.models import load_workload
from planner.profiling.measured.memory import measure_layer_bytes
from planner.runtime.check import check_plan
from planner.runtime.collect import build_report
from planner.runtime.emulate import sleep_until, stage_chunk_ms
from planner.runtime.options import RuntimeOptions
from planner.runtime.runner import RankMeasure, StepMeasure
from planner.runtime.stage import StageModule
from tests.factories import make_plan

ROOT = Path(__file__).resolve().parents[1]

GPT = "gpt:layers=2,hidden=16,heads=2,seq=4,vocab=32"


def test_meter_matches_profiler_and_counts_only_inputs_of_recomputed_layers() -> None:
    workload = load_workload(GPT)
    inputs, targets = workload.make_batch(2, 0)
    hidden = workload.layers[0](inputs).detach().requires_grad_()
    blocks = list(workload.layers[1:3])
    expected = measure_layer_bytes(workload, inputs, targets)  # the profiler's count, per layer
    plain = StageModule(blocks, [False, False])
    out = plain(hidden)
    assert plain.meter.live_bytes == expected[1].saved_bytes + expected[2].saved_bytes
    out.sum().backward()
    assert plain.meter.live_bytes == 0
    recomputed = StageModule(blocks, [True, True])
    out = recomputed(hidden)
    assert recomputed.meter.live_bytes == expected[1].input_bytes + expected[2].input_bytes
    out.sum().backward()
    assert recomputed.meter.live_bytes == 0 and recomputed.meter.peak_bytes > 0


def test_selective_recomputation_keeps_the_layers_but_their_attention_cores() -> None:
    """A selectively recomputed block keeps what the profiler counts at the selective level (its
    saved bytes less its attention core's), recomputes the core in backward, and gives the
    same gradients as without."""
    workload = load_workload(GPT, dtype="float64")
    inputs, targets = workload.make_batch(2, 0)
    expected = measure_layer_bytes(workload, inputs, targets)
    hidden = workload.layers[0](inputs).detach()
    grads, kept = [], []
    for selective in (False, True):
        x = hidden.clone().requires_grad_()
        module = StageModule(list(workload.layers[1:3]), [False, False], [selective, selective])
        out = module(x)
        kept.append(module.meter.live_bytes)
        out.square().sum().backward()
        grads.append((x.grad, [p.grad.clone() for p in module.parameters()]))
        module.zero_grad(set_to_none=True)
        assert module.meter.live_bytes == 0
    assert kept[0] == expected[1].saved_bytes + expected[2].saved_bytes
    assert kept[1] == expected[1].selective_saved_bytes + expected[2].selective_saved_bytes < kept[0]
    assert torch.equal(grads[0][0], grads[1][0])
    assert all(torch.equal(a, b) for a, b in zip(grads[0][1], grads[1][1]))


def test_sent_outputs_are_freed_unless_something_else_holds_them() -> None:
    """Megatron-LM's deallocate_output_tensor: a block's output (a residual sum no node saved)
    is freed and its backward still gives the same gradients; an output an autograd node saved
    (tanh keeps its result), or a skip a later layer of the stage took as input, is kept."""
    from planner.runtime.engine import deallocate_output
    from tests.factories import skip

    workload = load_workload(GPT, dtype="float64")
    inputs, _ = workload.make_batch(2, 0)
    hidden = workload.layers[0](inputs).detach()
    grads = []
    for free in (False, True):
        x = hidden.clone().requires_grad_()
        module = StageModule(list(workload.layers[1:3]), [False, False])
        module.metering = False
        out = module(x)
        g = torch.ones_like(out)
        if free:
            assert deallocate_output(out) and out.untyped_storage().nbytes() == 8
        torch.autograd.backward([out], grad_tensors=[g])
        grads.append(x.grad)
    assert torch.equal(grads[0], grads[1])
    work = skip()
    x = work.make_batch(2, 0)[0]
    module = StageModule(list(work.layers[:2]), [False, False])
    module.metering = False
    main_out, skip_out = module(x)
    assert not deallocate_output(main_out)  # tanh saved its result: the storage has two owners
    assert not deallocate_output(skip_out)  # the second layer's linear saved it as its input
    assert module.consumed(skip_out) and not module.consumed(main_out)  # the skip fed the second layer


def test_recompute_keeps_gradients() -> None:
    workload = load_workload(GPT, dtype="float64")
    inputs, _ = workload.make_batch(2, 0)
    hidden = workload.layers[0](inputs).detach()
    grads = []
    for recompute in (False, True):
        x = hidden.clone().requires_grad_()
        StageModule(list(workload.layers[1:3]), [recompute] * 2)(x).square().sum().backward()
        grads.append(x.grad)
    assert torch.equal(grads[0], grads[1])


def _profile(names: tuple[str, ...]) -> Profile:
    def layer(i: int, name: str) -> Layer:
        return Layer(
            name=name, fwd=TimeFit(intercept_ms=1.0 + i, per_sample_ms=0.5), bwd=TimeFit(intercept_ms=2.0 * i, per_sample_ms=1.0),
            param_count=0, param_bytes=0, saved_bytes_per_sample=0.0, input_bytes_per_sample=0.0, output_bytes_per_sample=0.0,
        )

    return Profile(
        model="m", source="analytic", device="cpu", dtype=DType.FLOAT32, microbatch_sizes=(1,),
        layers=tuple(layer(i, n) for i, n in enumerate(names)), edges=(),
    )


def test_emulated_chunk_times_from_profile_and_from_plan() -> None:
    names = load_workload("tests.factories:mlp").layer_names
    profile = _profile(names)
    plan = make_plan(names, (2,), recompute=True)  # stage 0 recomputes layers 0 and 1, stage 1 layer 2
    b = plan.microbatch_size
    fwd0 = (1.0 + 0.5 * b) + (2.0 + 0.5 * b)
    bwd0 = (0.0 + b) + (2.0 + b) + fwd0
    assert stage_chunk_ms(plan, 0, profile) == pytest.approx((fwd0, bwd0, bwd0, 0.0))  # no W outside zero bubble
    stage = plan.stages[1]
    full = stage.bwd_ms + stage.recompute_ms
    assert stage_chunk_ms(plan, 1, None) == (stage.fwd_ms, full, full, 0.0)
    # zero bubble: W is each layer's weight_grad_fraction of its backward
    zb = dataclasses.replace(plan, schedule=ScheduleKind.ZB_H1)
    split = dataclasses.replace(profile, layers=tuple(dataclasses.replace(layer, weight_grad_fraction=0.25)
                                                      for layer in profile.layers))
    w0 = 0.25 * ((0.0 + b) + (2.0 + b))
    assert stage_chunk_ms(zb, 0, split) == pytest.approx((fwd0, bwd0, bwd0 - w0, w0))


def test_sleep_until_never_returns_early() -> None:
    for _ in range(5):
        deadline = time.perf_counter() + 0.01
        sleep_until(deadline)
        assert time.perf_counter() >= deadline


def test_check_plan_refusals() -> None:
    workload = load_workload("tests.factories:mlp")
    plan = make_plan(workload.layer_names, (2,), dp_degree=2)
    check_plan(plan, workload, 4)
    with pytest.raises(PlannerInputError, match=r"plan needs 4 processes .* world size is 2"):
        check_plan(plan, workload, 2)
    with pytest.raises(PlannerInputError, match="covers 5 layers but model 'gpt' has"):
        check_plan(make_plan(workload.layer_names, (2,)), load_workload("gpt:layers=1,hidden=8,heads=2,seq=4,vocab=16"), 2)
    with pytest.raises(PlannerInputError, match="fingerprint"):
        check_plan(make_plan(workload.layer_names, (2,), fingerprint="0" * 64), workload, 2)


def _interleaved(layer_names: tuple[str, ...], num_microbatches: int, dp_degree: int = 1) -> Plan:
    """4 stages of the 5-layer mlp on P = 2 pipeline ranks, v = 2 each."""
    return make_plan(
        layer_names,
        (1, 2, 4),
        schedule=ScheduleKind.INTERLEAVED_1F1B,
        virtual_stages_per_rank=2,
        num_microbatches=num_microbatches,
        dp_degree=dp_degree,
    )


def test_check_plan_interleaved() -> None:
    workload = load_workload("tests.factories:mlp")
    plan = _interleaved(workload.layer_names, num_microbatches=4, dp_degree=2)
    assert [s.ranks for s in plan.stages] == [(0, 1), (2, 3), (0, 1), (2, 3)]
    check_plan(plan, workload, 4)
    with pytest.raises(PlannerInputError, match=r"plan needs 4 processes \(4 stages on 2 pipeline ranks x 2 replicas\)"):
        check_plan(plan, workload, 8)
    with pytest.raises(PlannerInputError, match=r"multiple of the number of rounds .* M=5") as refused:
        check_plan(_interleaved(workload.layer_names, num_microbatches=5), workload, 2)
    assert "\n" not in str(refused.value)  # torch would raise at schedule construction


def test_a_plan_file_whose_ranks_are_not_its_layouts_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stage 2 of the interleaved plan moved to ranks 4 and 5 (6 distinct ranks: the layout,
    not the count, is refused): ``planner run`` says so in one line with exit 2, and so does a
    rank of ``python -m planner.runtime`` (the plan is loaded before any process group)."""
    workload = load_workload("tests.factories:mlp")
    data = plan_to_json(_interleaved(workload.layer_names, num_microbatches=4, dp_degree=2))
    data["stages"][2]["ranks"] = [4, 5]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    expected = "stage 2: ranks [4, 5] differ from the layout's [0, 1]"
    capsys.readouterr()
    assert planner_main(["run", str(path), "--model", "tests.factories:mlp", "--nproc", "6"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("planner run: error:") and expected in err, err
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    proc = subprocess.run(
        [sys.executable, "-m", "planner.runtime", "--plan", str(path), "--model", "tests.factories:mlp"],
        cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("planner.runtime: rank 0: error:") and expected in proc.stderr


def test_report_takes_each_stage_from_its_chunk_on_its_ranks() -> None:
    workload = load_workload("tests.factories:mlp")
    plan = _interleaved(workload.layer_names, num_microbatches=4)
    steps = (StepMeasure(step_idx=0, loss=1.0, wall_ms=10.0),)
    # rows: idle, cuda peak, then (compute, saved, optimizer bytes, grad bytes, overrun, max overrun,
    # emulated ms, saved per micro-batch, the hooks' and the allocator's bytes) for stages p and p + 2
    z = [0.0] * 5
    m = [2.0, 1.0, 1.0]
    rows = [[1.0, 0.0, 2.0, 20.0, *z, *m, 4.0, 40.0, *z, *m], [3.0, 0.0, 5.0, 50.0, *z, *m, 6.0, 60.0, *z, *m]]
    mine = RankMeasure(steps=steps, compute_ms=6.0, idle_ms=1.0, saved_bytes_peak=40, cuda_peak_bytes=0)
    options = RuntimeOptions(plan_path="p", model_spec="m", num_steps=1, warmup_steps=0)
    report = build_report(plan, options, mine, rows, model="mlp", fingerprint="", backend="gloo", device="cpu")
    got = [(s.stage_idx, s.ranks, s.compute_ms, s.idle_ms, s.saved_bytes_peak) for s in report.stages]
    assert got == [(0, (0,), 2.0, 1.0, 20), (1, (1,), 5.0, 3.0, 50), (2, (0,), 4.0, 1.0, 40), (3, (1,), 6.0, 3.0, 60)]
    assert report.schedule is ScheduleKind.INTERLEAVED_1F1B and report.layout == plan.layout


def test_report_round_trip() -> None:
    stage = StageRecord(
        stage_idx=0, ranks=(0,), compute_ms=1.5, idle_ms=0.5, compute_ms_predicted=1.0, compute_rel_error=0.5,
        saved_bytes_peak=10, activation_bytes_predicted=10, activation_rel_error=0.0,
    )
    report = RunReport(
        model="m", plan_fingerprint_sha256="", world_size=1, backend="gloo", device="cpu", dtype=DType.FLOAT32,
        optimizer=OptimizerFamily.SGD, emulate=False, layout=Layout(num_stages=1), num_microbatches=2,
        microbatch_size=1, schedule=ScheduleKind.GPIPE, warmup_steps=0,
        steps=(StepRecord(step_idx=0, loss=0.25, wall_ms=3.0),), stages=(stage,),
        iteration_ms=3.0, iteration_ms_predicted=2.0, iteration_rel_error=0.5,
    )
    data = report_to_json(report)
    assert data["schema"] == "planner.runreport" and data["version"] == 3
    assert report_from_json(data) == report
    with pytest.raises(PlannerInputError, match="version"):
        report_from_json({**data, "version": 4})
    old = json.loads(json.dumps(data))  # version 2: without the per-micro-batch and allocator fields
    old["version"] = 2
    for key in ("saved_bytes_per_microbatch", "activation_bytes_per_microbatch_predicted", "microbatch_rel_error",
                "allocator_bytes_per_microbatch", "allocator_hook_bytes_per_microbatch", "allocator_rel_error"):
        old["stages"][0].pop(key)
    assert report_from_json(old) == report


def test_both_executors_share_one_training_step() -> None:
    """The step, the batch and the checkpoint slot are ``RankTrainer``'s alone; each executor
    only prepares and executes its schedule (and mypy checks both against ``Runner``)."""
    from planner.runtime.engine import RankRunner
    from planner.runtime.replicated import ReplicatedRunner
    from planner.runtime.trainer import RankTrainer

    for cls in (RankRunner, ReplicatedRunner):
        assert issubclass(cls, RankTrainer)
        assert {"__init__", "train_step", "batch", "checkpoint_slot", "run"}.isdisjoint(vars(cls)), cls
        assert {"prepare_schedule", "run_schedule"} <= set(vars(cls)), cls


def test_sleep_until_survives_preemption_before_the_sleep(monkeypatch):
    """The process may be descheduled between computing the remaining time and sleeping:
    the deadline has then passed and the sleep must be zero, not negative (a ValueError)."""
    from planner.runtime import emulate

    clock = iter([0.0, 5.0])  # remaining computed at t=0; then preempted until t=5

    def fake_counter() -> float:
        return next(clock, 5.0)

    monkeypatch.setattr(emulate.time, "perf_counter", fake_counter)
    sleeper = emulate._Sleeper()
    sleeper.until(1.0)  # raised "sleep length must be non-negative" before the fix


def test_a_step_failure_says_its_root_cause_in_one_line() -> None:
    """Issue 51: torch's pipelining wraps the model's error in ``[Stage 0] failed to run forward:
    args: (...)`` (the tensors printed); the line names the innermost error and the model's line."""
    from planner.runtime.runner import StepFailure

    def model_code() -> None:
        raise RuntimeError("aten.mul.Tensor got mixed torch.Tensor and DTensor, need to convert all torch.Tensor")

    try:
        try:
            model_code()
        except RuntimeError as exc:
            raise RuntimeError("[Stage 0] failed to run forward:\nargs: ('tensor([[0.1, 0.2]])',)") from exc
    except RuntimeError as outer:
        failure = StepFailure(0, outer)
    text = str(failure)
    assert "\n" not in text and "args:" not in text
    assert text.startswith("at step 0: RuntimeError: aten.mul.Tensor got mixed torch.Tensor and DTensor")
    assert "(at test_runtime_units.py:" in text and "raise RuntimeError(\"aten.mul.Tensor" in text


def test_quiet_torch_silences_the_profiler_and_torchs_future_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 51: libkineto's ``USDT: ... profiler_start`` lines (its log level above USDT's) and
    torch.distributed's FutureWarnings on context-parallel runs, unless ``--verbose``."""
    import warnings

    from planner.runtime.main import quiet_torch

    monkeypatch.setenv("KINETO_LOG_LEVEL", "")  # restored (unset) after the test, whatever quiet_torch sets
    monkeypatch.delenv("KINETO_LOG_LEVEL")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_torch()
        warnings.warn_explicit("`all_gather_into_tensor` is deprecated", FutureWarning, "c10d_logger.py", 83,
                               module="torch.distributed.c10d_logger")
        warnings.warn_explicit("the user's own", FutureWarning, "model.py", 1, module="mymodel")
    assert os.environ["KINETO_LOG_LEVEL"] == "6"
    assert [str(w.message) for w in caught] == ["the user's own"]
