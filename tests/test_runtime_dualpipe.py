"""DualPipe-V (torch ``ScheduleDualPipeV``'s order, ``planner.schedule.dualpipe``) through torch's
action-list runtime, the plan's per-rank action lists (``planner.runtime.actions``): the runtime
trains exactly as one process would (float64 SGD, losses and gradients to 1e-12) at P = 2 (with
and without recomputation, the zoo GPT whose tied embedding and head share rank 0) and P = 4
(eight chunks of a six-block GPT; and D = 2 with the all-reduce in buckets); and the bytes saved for backward against the plan, for
``planner plan``'s own DualPipe-V plans run by the runtime: equal on every chunk at P = 2 and 4."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from planner.artifacts.kinds import ChunkPlacement
from tests.runtime_launch import SharedLaunches
from tests.test_runtime_numerics import _check
from tests.test_runtime_zero_bubble import _plan_and_report, _planned, v_configs

DPV = "dualpipe-v"


dpv_configs = functools.partial(v_configs, DPV, "dpv")


@pytest.mark.slow
@pytest.mark.driver(configs=dpv_configs)
@pytest.mark.parametrize("world", [2, 4])
def test_dualpipe_v_matches_one_process_training(world: int, driven: SharedLaunches) -> None:
    cfgs = dpv_configs(world)
    results = driven.results(world, cfgs)
    errors = [e for r, c in zip(results, cfgs) for e in _check(r, c)]
    assert not errors, "\n".join(errors)


def planned_dpv(world: int) -> list[dict[str, Any]]:
    return [_planned(DPV, "gpt", 2)] if world == 2 else [_planned(DPV, "resnet", 4)]


@pytest.mark.slow
@pytest.mark.driver(configs=planned_dpv)
@pytest.mark.parametrize("world", [2, 4])
def test_dualpipe_v_saved_bytes_against_the_plan(world: int, driven: SharedLaunches) -> None:
    """DualPipe-V's bytes saved for backward, measured by the runtime's hooks (once per storage)
    over the step, equal the plan's on every chunk: at each chunk's peak no micro-batch waits
    only for its W (``weight_pending_counts`` is 0: its steady phase runs whole backwards), so
    the count of whole micro-batches is exact. P = 2 on the zoo GPT (4 chunks), P = 4 on the
    zoo ResNet (8 chunks)."""
    from planner.schedule import weight_pending_counts

    (cfg,) = planned_dpv(world)
    plan, report = _plan_and_report(driven, world, cfg)
    assert plan.schedule.value == DPV and report.schedule.value == DPV
    assert plan.layout.placement is ChunkPlacement.V and plan.layout.num_stages == 2 * world
    assert plan.num_microbatches >= 2 * world
    assert set(weight_pending_counts(plan.schedule, plan.layout, plan.num_microbatches)) == {0}
    for stage, got in zip(plan.stages, report.stages, strict=True):
        predicted = stage.inflight_microbatches * stage.activation_bytes_per_microbatch
        assert got.activation_bytes_predicted == predicted
        assert got.saved_bytes_peak == predicted, (stage.stage_idx, got.saved_bytes_peak, predicted)
