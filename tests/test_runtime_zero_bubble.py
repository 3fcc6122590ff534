"""Zero-bubble schedules (Qi et al. 2024) through torch's action-list runtime, the plan's per-rank
action lists (``planner.runtime.actions``): the runtime trains exactly as one process would
(float64 SGD, losses and gradients to 1e-12). ZB-H1 at P = 2 (with and without recomputation,
the tied-embedding GPT, D = 2 with the all-reduce in buckets started from the gradient hooks,
which fire in the W passes) and P = 4, on gloo. ZB-H2 (sec. 3.2, no torch class) the same way at
P = 2 and 4 (M below P too). ZBV (sec. 6) two chunks per rank in a V, at P = 2 (with and without
recomputation, the tied GPT whose embedding and head share rank 0, D = 2 in buckets) and P = 4
(eight chunks of a six-block GPT), and ZeRO 2 with recomputation and AdamW at P = 2, D = 2 (ZeRO 3
under these schedules: tests/test_runtime_fsdp.py); and the bytes saved for backward against the plan, for
``planner plan``'s own ZB-H1, ZB-H2 and ZBV plans run by the runtime at P = 2 and 4 (its report,
in the same launches), and a ZB-H2 plan through ``planner run`` itself."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from planner.artifacts.plan import Plan, plan_from_json
from planner.artifacts.report import RunReport, load_report, report_from_json
from tests.runtime_launch import ROOT, SharedLaunches
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


ZB2 = "zb-h2"


def zb_h2_configs(world: int) -> list[dict]:
    if world == 2:
        return [
            _cfg("zb2-mlp-P2-D1", MLP, 2, 1, ZB2, False),
            _cfg("zb2-gpt-tied-P2-D1-rc", "tests.factories:tiny_gpt", 2, 1, ZB2, True, num_microbatches=6),
        ]
    return [
        _cfg("zb2-mlp-P4-D1-rc", MLP, 4, 1, ZB2, True, num_microbatches=8),
        _cfg("zb2-mlp-P4-D1-M3", MLP, 4, 1, ZB2, False, num_microbatches=3),  # M < P: rank 0 warms up with all 3
        _cfg("zb2-mlp-P2-D2-buckets", MLP, 2, 2, ZB2, True, stack=SMALL_BUCKETS),
    ]


ZBV = "zbv"
GPT6 = "gpt:layers=6,hidden=16,heads=2,seq=4,vocab=32"  # embed, 6 blocks, tied head: 8 chunks


def v_configs(schedule: str, prefix: str, world: int) -> list[dict]:
    """A V-shaped schedule's (ZBV, DualPipe-V: two chunks per rank) numerics cases, named
    ``prefix-...``: at P = 2 the MLP with and without recomputation and the tied zoo GPT; on four
    processes eight chunks of a six-block GPT, and D = 2 with the all-reduce in buckets started
    from the gradient hooks."""
    v2 = {"virtual_stages_per_rank": 2}
    if world == 2:
        return [
            _cfg(f"{prefix}-mlp-P2-D1", MLP, 4, 1, schedule, False, **v2),
            _cfg(f"{prefix}-mlp-P2-D1-rc-M6", MLP, 4, 1, schedule, True, num_microbatches=6, **v2),
            _cfg(f"{prefix}-zoo-gpt-P2-D1-tied", ZOO_GPT, 4, 1, schedule, False, boundaries=[1, 2, 4], **v2),
        ]
    return [
        _cfg(f"{prefix}-gpt6-P4-D1-rc", GPT6, 4, 1, schedule, True, boundaries=list(range(1, 8)), num_microbatches=8, **v2),
        _cfg(f"{prefix}-mlp-P2-D2-buckets", MLP, 4, 2, schedule, True, stack=SMALL_BUCKETS, **v2),
        # ZeRO 2 under a split backward: the gradients accumulate over every W into the flat buffer
        _cfg(f"{prefix}-mlp-P2-D2-zero2-rc", MLP, 4, 2, schedule, True, optimizer="adamw", zero=2, **v2),
    ]


zbv_configs = functools.partial(v_configs, ZBV, "zbv")


@pytest.mark.slow
@pytest.mark.driver(configs=zbv_configs)
@pytest.mark.parametrize("world", [2, 4])
def test_zbv_matches_one_process_training(world: int, driven: SharedLaunches) -> None:
    cfgs = zbv_configs(world)
    results = driven.results(world, cfgs)
    errors = [e for r, c in zip(results, cfgs) for e in _check(r, c)]
    assert not errors, "\n".join(errors)


@pytest.mark.slow
@pytest.mark.driver(configs=configs)
@pytest.mark.parametrize("world", [2, 4])
def test_zb_h1_matches_one_process_training(world: int, driven: SharedLaunches) -> None:
    cfgs = configs(world)
    results = driven.results(world, cfgs)
    errors = [e for r, c in zip(results, cfgs) for e in _check(r, c)]
    assert not errors, "\n".join(errors)


@pytest.mark.slow
@pytest.mark.driver(configs=zb_h2_configs)
@pytest.mark.parametrize("world", [2, 4])
def test_zb_h2_matches_one_process_training(world: int, driven: SharedLaunches) -> None:
    cfgs = zb_h2_configs(world)
    results = driven.results(world, cfgs)
    errors = [e for r, c in zip(results, cfgs) for e in _check(r, c)]
    assert not errors, "\n".join(errors)


@functools.cache
def _planned(schedule: str, model: str, devices: int, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """A driver config of ``planner plan``'s own ``schedule`` plan (one stage per rank) of the
    shipped zoo ``model``'s profile (what W keeps measured: ``benchmarks/make_profiles.py
    --refresh-keep``) on ``devices`` local CPUs, float32 SGD for 2 steps, as ``planner run``
    would run it (the driver returns the runtime's report). Planned once per session."""
    from planner.artifacts.plan import plan_to_json
    from planner.commands.cli import build_parser
    from planner.commands.plan import plan_of_args

    argv = ["plan", "--profile", str(ROOT / "profiles" / f"zoo-{model}-cpu.json"), "--cluster", "local-cpu",
            "--devices", str(devices), "--global-batch", str(4 * devices), "--schedules", schedule,
            "--stages", str(devices), *extra]
    made = plan_of_args(build_parser("plan").parse_args(argv))
    name = f"planned-{schedule}-{model}-P{devices}" + "".join(extra).replace("--", "-")
    return {"name": name, "model": model, "plan": plan_to_json(made), "dtype": "float32", "optimizer": "sgd", "steps": 2}


def planned_saved(world: int) -> list[dict[str, Any]]:
    """``planner plan``'s ZB-H1 and ZB-H2 plans of the zoo GPT (P = 2 cut after layer 3, P = 4
    as planned) and ZBV plans at M = 2P (micro-batches of 2: chunk ``s`` holds ``2P - s`` whole at
    its peak): the zoo GPT at P = 2 (4 chunks of its 6 layers), the zoo ResNet at P = 4 (8
    chunks of its 10 layers; the zoo GPT has too few)."""
    cut, deep = ("--fixed-boundaries", "3"), ("--microbatch-sizes", "2")  # deep: ZBV at M = 2P, its full depth
    if world == 2:
        return [_planned(ZB, "gpt", 2, cut), _planned(ZB2, "gpt", 2, cut), _planned(ZBV, "gpt", 2, deep)]
    return [_planned(ZB, "gpt", 4), _planned(ZB2, "gpt", 4), _planned(ZBV, "resnet", 4, deep)]


def _plan_and_report(driven: SharedLaunches, world: int, cfg: dict[str, Any]) -> tuple[Plan, RunReport]:
    """The plan and the runtime's report of its run on ``world`` processes (its losses one
    process's, to float32's rounding: float32 gradients differ by up to 3e-4 relative on the
    zoo ResNet, summed in another order)."""
    (result,) = driven.results(world, [cfg])
    assert len(result["losses"]) == 2 and result["loss_rel_diff"] <= 1e-5, (result["losses"], result["ref_losses"])
    return plan_from_json(cfg["plan"]), report_from_json(result["report"])


def check_saved_bytes(plan: Plan, report: RunReport, model: str) -> list[tuple[int, int, int]]:
    """Per stage ``(stage, measured, predicted)``: the bytes saved for backward the runtime's hooks
    measured (once per storage, peak over the step) and the plan's activation peak
    (``held_bytes`` of the schedule's own held counts, every point of the walk), asserting them
    equal to within the bytes the fraction does not scale: W's fraction is measured at one
    micro-batch size, and the loss's fixed bytes (4, its scalar) are freed whole, so each
    micro-batch past I can be off by at most the stage's fixed saved bytes (and 1 for rounding)."""
    from planner.artifacts.profile import load_profile
    from planner.schedule import held_counts
    from planner.schedule.inflight import held_bytes

    prof = load_profile(ROOT / "profiles" / f"zoo-{model}-cpu.json")
    held = held_counts(plan.schedule, plan.layout, plan.num_microbatches)
    rows = []
    for stage, got in zip(plan.stages, report.stages, strict=True):
        h = held[stage.stage_idx]
        fixed = sum(layer.saved_bytes_fixed for layer in prof.layers[stage.layer_start:stage.layer_stop])
        # W keeps at most what a micro-batch saves, unless the stage recomputes (then W's inputs come back in I)
        assert stage.wgrad_bytes_per_microbatch <= stage.activation_bytes_per_microbatch or stage.recompute
        assert got.activation_bytes_predicted == int(held_bytes(h, stage.activation_bytes_per_microbatch,
                                                                stage.wgrad_bytes_per_microbatch))
        assert abs(got.saved_bytes_peak - got.activation_bytes_predicted) <= h.pending * fixed + 1, (
            plan.schedule.value, stage.stage_idx, got.saved_bytes_peak, got.activation_bytes_predicted)
        rows.append((stage.stage_idx, got.saved_bytes_peak, got.activation_bytes_predicted))
    return rows


@pytest.mark.slow
@pytest.mark.driver(configs=planned_saved)
@pytest.mark.parametrize("world", [2, 4])
def test_saved_bytes_equal_the_plan(world: int, driven: SharedLaunches) -> None:
    """The plan's per-stage activation peak equals the bytes the runtime's hooks measured on every
    stage (:func:`check_saved_bytes`): ZB-H1 and ZB-H2 (the action-list runtime) at P = 2 and 4,
    ZBV at P = 2 (zoo GPT) and 4 (zoo ResNet). ZB-H1 and ZB-H2 hold micro-batches past I at the
    head's stage's peak, so it holds less than every micro-batch in flight whole (the old
    bound); ZBV's chunks hold none past I at their peak (their walk's
    heaviest point is all whole, whatever W keeps below a micro-batch), so theirs is the count of
    whole micro-batches."""
    from planner.artifacts.kinds import ChunkPlacement
    from planner.schedule import held_counts

    for cfg in planned_saved(world):
        plan, report = _plan_and_report(driven, world, cfg)
        assert report.schedule is plan.schedule and plan.num_devices == world
        check_saved_bytes(plan, report, cfg["model"])
        held = held_counts(plan.schedule, plan.layout, plan.num_microbatches)
        if plan.schedule.value == ZBV:
            assert plan.layout.placement is ChunkPlacement.V and plan.layout.num_stages == 2 * world
            assert {h.pending for h in held} == {0}
            for stage, got in zip(plan.stages, report.stages, strict=True):
                assert got.saved_bytes_peak == stage.inflight_microbatches * stage.activation_bytes_per_microbatch
            continue
        assert held[-1].pending
        head = plan.stages[-1]  # the head past I: below every micro-batch in flight whole
        assert report.stages[-1].saved_bytes_peak < head.inflight_microbatches * head.activation_bytes_per_microbatch


def planned_recomputing(world: int) -> list[dict[str, Any]]:
    """``planner plan``'s plans that recompute every transformer block (``--recompute full``)
    under each split-backward schedule the runtime runs: ZB-H1, ZB-H2, ZBV and DualPipe-V of the
    zoo GPT at P = 2 (ZB-H1 and ZB-H2 cut after layer 3, the V's at M = 2P) and ZB-H1 at P = 4
    (ZBV and DualPipe-V at P = 4 need 8 chunks, more than its 6 layers; the zoo ResNet's blocks
    are not exact, docs/zero-bubble.md). In the launches of the plans above."""
    full = ("--recompute", "full")
    cut, deep = ("--fixed-boundaries", "3", *full), ("--microbatch-sizes", "2", *full)
    if world == 2:
        return [_planned(ZB, "gpt", 2, cut), _planned(ZB2, "gpt", 2, cut), _planned(ZBV, "gpt", 2, deep),
                _planned("dualpipe-v", "gpt", 2, deep)]
    return [_planned(ZB, "gpt", 4, full)]


@pytest.mark.slow
@pytest.mark.driver(configs=planned_recomputing)
@pytest.mark.parametrize("world", [2, 4])
def test_saved_bytes_equal_the_plan_with_recomputation(world: int, driven: SharedLaunches) -> None:
    """A stage that recomputes under a split backward holds what the plan prices on every stage
    (:func:`check_saved_bytes`): the runtime recomputes each layer once in I and keeps what it
    recomputed until W (``planner.runtime.recompute``), so a micro-batch past I holds W's inputs
    (``keep``), above what it saved (``act``: the recomputed layers' inputs) -- before, torch's
    checkpoint freed them at I and recomputed again per parameter group in W, and the plan was
    above the run (docs/zero-bubble.md). The loss's stage included: its I is cut after the last
    recomputed layer, so the head's and the loss's tail is freed before the recomputed layers'
    graphs are rebuilt (one torch pass would hold both: 526,338 bytes over on ZB-H1 P = 2).
    Losses equal one process's (:func:`_plan_and_report`)."""
    for cfg in planned_recomputing(world):
        plan, report = _plan_and_report(driven, world, cfg)
        assert plan.schedule.splits_backward and report.schedule is plan.schedule
        assert all(stage.recompute for stage in plan.stages)
        rows = check_saved_bytes(plan, report, cfg["model"])
        assert any(stage.wgrad_bytes_per_microbatch > stage.activation_bytes_per_microbatch for stage in plan.stages)
        assert len(rows) == plan.layout.num_stages


@pytest.mark.slow
def test_planner_run_runs_zb_h2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``planner run`` of ``planner plan``'s own ZB-H2 plan (it refused the schedule before the
    action runtime: torch has no ZB-H2 class) trains 2 steps on 2 processes, and its report's
    bytes saved for backward equal the plan's on every stage (:func:`check_saved_bytes`)."""
    from planner.commands.cli import main as planner_main

    cfg = _planned(ZB2, "gpt", 2, ("--fixed-boundaries", "3"))
    plan = plan_from_json(cfg["plan"])
    assert plan.schedule.value == ZB2
    path = tmp_path / "h2.json"
    path.write_text(json.dumps(cfg["plan"]))
    code = planner_main(["run", str(path), "--model", "gpt", "--steps", "2", "--report", str(tmp_path / "r.json")])
    assert code == 0, capsys.readouterr().err[-3000:]
    report = load_report(tmp_path / "r.json")
    assert report.schedule.value == ZB2 and len(report.steps) == 2
    check_saved_bytes(plan, report, "gpt")
