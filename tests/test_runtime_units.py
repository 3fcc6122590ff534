"""In-process checks of the runtime's parts: saved-bytes meter, emulated layers, plan checks,
and the RunReport document."""

from __future__ import annotations

import time

import pytest
import torch

from planner.artifacts.report import RunReport, StageRecord, StepRecord, report_from_json, report_to_json
from planner.errors import PlannerInputError
from planner.models import load_workload
from planner.profiling.memory import measure_layer_bytes
from planner.runtime.check import check_plan
from planner.runtime.emulate import run_emulated
from planner.runtime.stage import StageModule
from tests.factories import make_plan

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


def test_recompute_and_emulation_keep_gradients() -> None:
    workload = load_workload(GPT, dtype="float64")
    inputs, _ = workload.make_batch(2, 0)
    hidden = workload.layers[0](inputs).detach()
    grads = []
    for recompute, times in [(False, None), (True, None), (True, [(1.0, 2.0), (1.0, 2.0)])]:
        x = hidden.clone().requires_grad_()
        StageModule(list(workload.layers[1:3]), [recompute] * 2, times)(x).square().sum().backward()
        grads.append(x.grad)
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[0], grads[2])


def test_emulated_layer_takes_at_least_its_profiled_time() -> None:
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    start = time.perf_counter()
    out = run_emulated(layer, x, 20.0, 40.0)
    mid = time.perf_counter()
    out.sum().backward()
    end = time.perf_counter()
    assert mid - start >= 0.020 and end - mid >= 0.040


def test_check_plan_refusals() -> None:
    workload = load_workload("tests.factories:mlp")
    plan = make_plan(workload.layer_names, (2,), dp_degree=2)
    check_plan(plan, workload, 4)
    with pytest.raises(PlannerInputError, match="plan needs 4 processes .* world size is 2"):
        check_plan(plan, workload, 2)
    with pytest.raises(PlannerInputError, match="covers 5 layers but model 'gpt' has"):
        check_plan(make_plan(workload.layer_names, (2,)), load_workload("gpt:layers=1,hidden=8,heads=2,seq=4,vocab=16"), 2)
    with pytest.raises(PlannerInputError, match="fingerprint"):
        check_plan(make_plan(workload.layer_names, (2,), fingerprint="0" * 64), workload, 2)


def test_report_round_trip() -> None:
    stage = StageRecord(
        stage_idx=0, ranks=(0,), compute_ms=1.5, idle_ms=0.5, compute_ms_predicted=1.0, compute_rel_error=0.5,
        saved_bytes_peak=10, activation_bytes_predicted=10, activation_rel_error=0.0,
    )
    report = RunReport(
        model="m", plan_fingerprint_sha256="", world_size=1, backend="gloo", device="cpu", dtype="float32",
        optimizer="sgd", emulate=False, num_stages=1, dp_degree=1, num_microbatches=2, microbatch_size=1,
        schedule="gpipe", warmup_steps=0, steps=(StepRecord(step_idx=0, loss=0.25, wall_ms=3.0),), stages=(stage,),
        iteration_ms=3.0, iteration_ms_predicted=2.0, iteration_rel_error=0.5,
    )
    data = report_to_json(report)
    assert data["schema"] == "planner.runreport" and data["version"] == 1
    assert report_from_json(data) == report
    with pytest.raises(PlannerInputError, match="version"):
        report_from_json({**data, "version": 2})
