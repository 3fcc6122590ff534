"""ZB-H1 (Qi et al. 2024) through torch's ``ScheduleInterleavedZeroBubble``: the runtime trains
exactly as one process would (float64 SGD, losses and gradients to 1e-12), at P = 2 (with and
without recomputation, the tied-embedding GPT, D = 2 with the all-reduce in buckets started from
the gradient hooks, which fire in the W passes) and P = 4, on gloo; the order torch runs is
checked against the plan's before the first step (``planner.runtime.engine``). ZBV (sec. 6)
through ``ScheduleZBVZeroBubble`` the same way, two chunks per rank in a V, at P = 2 (with and
without recomputation, the tied GPT whose embedding and head share rank 0, D = 2 in buckets) and
P = 4 (eight chunks of a six-block GPT); and its saved bytes against the plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime_launch import drive
from tests.test_runtime_numerics import MLP, SMALL_BUCKETS, ZOO_GPT, _cfg, _check

ZB = "zb-h1"


def configs(world: int) -> list[dict]:
    if world == 2:
        return [
            _cfg("zb-mlp-P2-D1", MLP, 2, 1, ZB, False),
            _cfg("zb-mlp-P2-D1-rc", MLP, 2, 1, ZB, True),
            _cfg("zb-gpt-tied-P2-D1-rc", "tests.factories:tiny_gpt", 2, 1, ZB, True, num_microbatches=6),
            _cfg("zb-zoo-gpt-P2-D1", ZOO_GPT, 2, 1, ZB, False, boundaries=[3]),
        ]
    return [
        _cfg("zb-mlp-P4-D1-rc", MLP, 4, 1, ZB, True, num_microbatches=8),
        _cfg("zb-mlp-P2-D2-buckets", MLP, 2, 2, ZB, True, stack=SMALL_BUCKETS),
    ]


ZBV = "zbv"
GPT6 = "gpt:layers=6,hidden=16,heads=2,seq=4,vocab=32"  # embed, 6 blocks, tied head: 8 chunks


def zbv_configs(world: int) -> list[dict]:
    v2 = {"virtual_stages_per_rank": 2}
    if world == 2:
        return [
            _cfg("zbv-mlp-P2-D1", MLP, 4, 1, ZBV, False, **v2),
            _cfg("zbv-mlp-P2-D1-rc", MLP, 4, 1, ZBV, True, num_microbatches=6, **v2),
            _cfg("zbv-zoo-gpt-P2-D1-tied", ZOO_GPT, 4, 1, ZBV, False, boundaries=[1, 2, 4], **v2),
        ]
    return [
        _cfg("zbv-gpt6-P4-D1-rc", GPT6, 4, 1, ZBV, True, boundaries=list(range(1, 8)), num_microbatches=8, **v2),
        _cfg("zbv-mlp-P2-D2-buckets", MLP, 4, 2, ZBV, True, stack=SMALL_BUCKETS, **v2),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_zbv_matches_one_process_training(world: int, tmp_path: Path) -> None:
    cfgs = zbv_configs(world)
    results = drive(world, cfgs, tmp_path)
    errors = [e for r, c in zip(results, cfgs) for e in _check(r, c)]
    assert not errors, "\n".join(errors)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_zb_h1_matches_one_process_training(world: int, tmp_path: Path) -> None:
    cfgs = configs(world)
    results = drive(world, cfgs, tmp_path)
    errors = [e for r, c in zip(results, cfgs) for e in _check(r, c)]
    assert not errors, "\n".join(errors)


def _plan_and_run(tmp_path: Path, devices: int, extra: list[str], schedule: str = ZB, model: str = "gpt") -> tuple:
    """``planner plan`` a ``schedule`` plan of the zoo ``model``'s profile and ``planner run`` it (gloo, CPU)."""
    import os
    import subprocess
    import sys

    from planner.artifacts.plan import load_plan
    from planner.artifacts.report import load_report

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    plan_cmd = [sys.executable, "-m", "planner", "plan", "--profile", str(root / "profiles" / f"zoo-{model}-cpu.json"),
                "--cluster", "local-cpu", "--devices", str(devices), "--global-batch", str(4 * devices),
                "--schedules", schedule, "--stages", str(devices), "--out", "plan.json", *extra]
    done = subprocess.run(plan_cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    run_cmd = [sys.executable, "-m", "planner", "run", "plan.json", "--model", model, "--steps", "2", "--report", "report.json"]
    done = subprocess.run(run_cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return load_plan(tmp_path / "plan.json"), load_report(tmp_path / "report.json")


@pytest.mark.slow
@pytest.mark.parametrize(("devices", "extra"), [(2, ["--fixed-boundaries", "3"]), (4, [])])
def test_zb_h1_saved_bytes_against_the_plan(tmp_path: Path, devices: int, extra: list[str]) -> None:
    """The bytes saved for backward, measured by the runtime's hooks over the step, against the
    plan: equal on stage 0 (its peak holds whole micro-batches only), at most the plan's bound
    on every stage (every micro-batch in flight whole), and at least the micro-batches the
    schedule holds whole at that peak (``weight_pending_counts``: the rest keep part)."""
    from planner.schedule import weight_pending_counts

    plan, report = _plan_and_run(tmp_path, devices, extra)
    assert plan.schedule.value == ZB and report.schedule.value == ZB
    pending = weight_pending_counts(plan.schedule, plan.layout, plan.num_microbatches)
    for stage, got in zip(plan.stages, report.stages):
        predicted = stage.inflight_microbatches * stage.activation_bytes_per_microbatch
        assert got.activation_bytes_predicted == predicted
        whole = (stage.inflight_microbatches - pending[stage.stage_idx]) * stage.activation_bytes_per_microbatch
        assert whole <= got.saved_bytes_peak <= predicted, (stage.stage_idx, whole, got.saved_bytes_peak, predicted)
        if stage.stage_idx == 0:
            assert got.saved_bytes_peak == predicted


@pytest.mark.slow
@pytest.mark.parametrize(("devices", "model"), [(2, "gpt"), (4, "resnet")])
def test_zbv_saved_bytes_against_the_plan(tmp_path: Path, devices: int, model: str) -> None:
    """ZBV's bytes saved for backward, measured by the runtime's hooks over the step, equal the
    plan's on every chunk: at each chunk's peak no micro-batch waits only for its W
    (``weight_pending_counts`` is 0), so the count of whole micro-batches is exact. P = 2 on the
    zoo GPT (4 chunks of 6 layers), P = 4 on the zoo ResNet (8 chunks of 10)."""
    from planner.artifacts.kinds import ChunkPlacement
    from planner.schedule import weight_pending_counts

    plan, report = _plan_and_run(tmp_path, devices, [], schedule=ZBV, model=model)
    assert plan.schedule.value == ZBV and report.schedule.value == ZBV
    assert plan.layout.placement is ChunkPlacement.V and plan.layout.num_stages == 2 * devices
    assert set(weight_pending_counts(plan.schedule, plan.layout, plan.num_microbatches)) == {0}
    for stage, got in zip(plan.stages, report.stages):
        predicted = stage.inflight_microbatches * stage.activation_bytes_per_microbatch
        assert got.activation_bytes_predicted == predicted
        assert got.saved_bytes_peak == predicted, (stage.stage_idx, got.saved_bytes_peak, predicted)
