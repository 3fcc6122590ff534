"""Expert parallelism in the runtime (issue 48 item 5; planner.runtime.experts).

Fast: the expert groups each rank joins (the layout's expert mesh, "parallel folding"), and
what is refused before any compute.

Slow: the zoo MoE decoder (``moe:...``, planner.models.moe) trained on gloo processes against
one process on the whole global batches (tests/runtime_driver.py), float64, 2 steps: losses,
gradients and final parameters within 1e-12 (SGD; AdamW parameters 1e-10, as
tests/test_runtime_numerics.py explains: the experts' gradients are summed in another order).

- Checkpoints: with the experts folded every rank writes its own file (its experts and their
  optimizer state are its own); ZeRO 1 at EP 2 (2 processes) and ZeRO 2 at EP 2 x ETP 2 (4)
  with AdamW resume from a checkpoint of their first step, and step 2's and 3's losses (which
  depend on the reloaded AdamW state) are one process's.
- 2 processes: EP = 2 over D = 2; EP = 2 over the tp ranks of t = 2 without sequence
  parallelism (each tp rank routes half of the replicated tokens) and with it (forced-balance
  router); the experts whole on each rank of t = 2 with sequence parallelism (edp = 2 spans
  the tp ranks); ETP = 2; EP = 2 with context parallelism; EP = 2 with the MoE blocks'
  selective level (moe_act + layernorm) and full recomputation.
- 4 processes: EP = 4 (edp 1); EP = 2 x edp 2 (the experts' all-reduce over their own group);
  EP = 2 with PP = 2 (GPipe, recomputation, a shared expert, a dense first block); EP = 4 over
  t = 2 x D = 2; EP = 2 x ETP = 2; ZeRO 1 and 2 with AdamW (the experts' state sharded over
  edp, exactly 1/edp of it); interleaved 1F1B (P = 2 x v = 2) with EP = 2; EP = 4 over cp = 2 x
  D = 2; zero bubble with EP = 2 (ZB-H1 with the selective level and recomputation, ZBV: the
  backward's input-gradient pass carries the all-to-alls, the weight pass none).
- ``planner plan``'s own EP = 2 plans of the shipped zoo MoE profile (profiles/zoo-moe-cpu.json;
  2 processes: D = 2; 4: what it plans with --stages 2, interleaved P = 2 x v = 2, D = 2), run as
  ``planner run`` runs them (the driver builds the runtime's report): one process's losses to
  float32's rounding, and each stage's bytes saved by one micro-batch's forward within 1% of
  the plan's activation bytes (the forced-balance router, as the profile's experts were timed
  and counted; a top-k router on random tokens loads the ranks unevenly), the gradients held
  after the sync exactly the plan's parameters on the rank.
- Activation bytes (the runtime's saved-tensor hooks, one micro-batch's forward): with the
  forced-balance router an EP rank receives as many token copies as it sends, so it saves
  what the same rank saves without expert parallelism (D = 2, every expert local) plus the
  dispatch's own index vectors (exactly: per MoE layer, two int64 per token copy: the regroup
  order at the receiver and its inverse).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.layout import Layout
from planner.models import load_workload
from planner.models.experts import expert_modules
from planner.runtime.check import check_plan
from planner.runtime.experts import expert_lines, experts_folded
from tests.factories import make_plan
from tests.runtime_launch import SharedLaunches, step_files

MOE = "moe:layers=2,hidden=16,heads=2,seq=8,vocab=32,experts=4,topk=2,ffn=24,dense=0,dtype=float64"
MOE3 = "moe:layers=3,hidden=16,heads=2,seq=8,vocab=32,experts=4,topk=2,ffn=24,dense=1,shared=1,dtype=float64"
BALANCED = f"{MOE},router=balanced"
MEM = "moe:layers=2,hidden=32,heads=2,seq=16,vocab=32,experts=4,topk=2,ffn=48,dense=0,router=balanced,dtype=float64"
ROOT = Path(__file__).resolve().parents[1]


def test_expert_groups_fold_over_each_pipeline_ranks_ranks() -> None:
    """P = 2 pipeline ranks of D 2 x t 2 = 4 ranks each, EP 2: etp innermost (1 here), then ep,
    then edp -- the expert rank order "tp-ep-dp-pp" over the same ranks as attention's."""
    layout = Layout(num_stages=2, dp_degree=2, tp_degree=2, ep_degree=2)
    ep, etp, edp = expert_lines(layout)
    assert ep == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert etp == [(0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,)]
    assert edp == [(0, 2), (1, 3), (4, 6), (5, 7)]
    layout = Layout(num_stages=1, dp_degree=4, ep_degree=2, etp_degree=2)
    assert expert_lines(layout) == ([(0, 2), (1, 3)], [(0, 1), (2, 3)], [(0,), (1,), (2,), (3,)])


def test_experts_fold_where_the_layout_asks() -> None:
    moe, mlp = load_workload(MOE), load_workload("tests.factories:mlp")
    assert experts_folded(Layout(num_stages=1, dp_degree=2, ep_degree=2), moe)
    assert experts_folded(Layout(num_stages=1, tp_degree=2), moe)  # edp spans the tp ranks
    assert not experts_folded(Layout(num_stages=1, dp_degree=2), moe)  # experts are dense parameters then
    assert not experts_folded(Layout(num_stages=1, tp_degree=2), mlp)
    assert [len(expert_modules(layer)) for layer in moe.layers] == [0, 1, 1, 0]


@pytest.mark.parametrize(("model", "kw", "message"), [
    ("tests.factories:mlp", {"dp_degree": 2, "ep_degree": 2}, "ep_degree 2 x etp_degree 1: model 'mlp' has no routed experts"),
    (MOE, {"dp_degree": 8, "ep_degree": 8}, "ep_degree 8 does not divide the model's 4 experts per layer"),
    (MOE, {"dp_degree": 2, "etp_degree": 2, "ep_degree": 1}, ""),
    (MOE.replace("ffn=24", "ffn=25"), {"dp_degree": 2, "etp_degree": 2}, "etp_degree 2 does not divide the experts' ffn width 25"),
    (MOE, {"dp_degree": 2, "ep_degree": 2, "zero": 3}, "ZeRO 3 with experts folded"),
])
def test_plans_the_runtime_cannot_fold_are_refused_before_compute(model: str, kw: dict[str, Any], message: str) -> None:
    workload = load_workload(model)
    plan = make_plan(workload.layer_names, (), **kw)
    if not message:
        check_plan(plan, workload, plan.num_devices)
        return
    with pytest.raises(PlannerInputError, match=message):
        check_plan(plan, workload, plan.num_devices)


def test_planner_run_refuses_zero3_with_experts_folded_in_one_line(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """exit 2 with one line, before torchrun starts (the launcher runs the ranks' own check)."""
    import json

    from planner.artifacts.plan import plan_to_json
    from planner.commands.cli import main

    plan = make_plan(load_workload(MOE).layer_names, (), dp_degree=2, ep_degree=2, zero=3)
    (tmp_path / "plan.json").write_text(json.dumps(plan_to_json(plan)))
    capsys.readouterr()
    code = main(["run", str(tmp_path / "plan.json"), "--model", MOE, "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "ZeRO 3 with experts folded (ep 2 x etp 1 x tp 1)" in err, err


# ---------------------------------------------------------------- launches against one process


def _cfg(name: str, model: str = MOE, *, d: int = 1, ep: int = 1, **kw: Any) -> dict[str, Any]:
    cfg = {
        "name": name, "model": model, "boundaries": [], "dp_degree": d, "ep_degree": ep, "num_microbatches": 2,
        "microbatch_size": 2, "schedule": "1f1b", "recompute": False, "dtype": "float64", "optimizer": "sgd", "steps": 2,
    }
    return {**cfg, **kw}


def _memory() -> list[dict[str, Any]]:
    """One micro-batch of 2 samples on each of 2 ranks, every expert local (D = 2) and EP = 2."""
    one = {"num_microbatches": 1, "steps": 1}
    return [_cfg("moe-mem-D2", MEM, d=2, **one), _cfg("moe-mem-ep2", MEM, d=2, ep=2, **one)]


def configs(world: int) -> list[dict[str, Any]]:
    if world == 2:
        return [
            _cfg("moe-ep2-D2", d=2, ep=2),
            _cfg("moe-ep2-tp2", f"{MOE},shared=1", ep=2, tp_degree=2),
            _cfg("moe-ep2-tp2-sp-balanced", BALANCED, ep=2, tp_degree=2, sequence_parallel=True),
            _cfg("moe-tp2-sp-experts-whole", MOE3, tp_degree=2, sequence_parallel=True, schedule="gpipe"),
            _cfg("moe-etp2-D2", d=2, etp_degree=2),
            _cfg("moe-ep2-cp2", BALANCED, ep=2, cp_degree=2),
            _cfg("moe-ep2-D2-selective-rc", MOE3, d=2, ep=2, boundaries=[], recompute=True, selective=True,
                 num_microbatches=1, microbatch_size=4),
            _cfg("moe-ep2-D2-zero1-adamw-resumed", d=2, ep=2, zero=1, optimizer="adamw", steps=3, resume_at=1),
            *_memory(),
        ]
    return [
        _cfg("moe-ep4-D4", d=4, ep=4),
        _cfg("moe-ep2-edp2-D4", d=4, ep=2),
        _cfg("moe-ep2-P2-D2-gpipe-rc", MOE3, d=2, ep=2, boundaries=[3], schedule="gpipe", recompute=True),
        _cfg("moe-ep4-tp2-sp-D2", d=2, ep=4, tp_degree=2, sequence_parallel=True),
        _cfg("moe-ep2-etp2-D4", BALANCED, d=4, ep=2, etp_degree=2),
        _cfg("moe-zero1-ep2-edp2-adamw", d=4, ep=2, zero=1, optimizer="adamw"),
        _cfg("moe-zero2-tp2-sp-ep2-adamw", d=2, ep=2, tp_degree=2, sequence_parallel=True, zero=2, optimizer="adamw"),
        _cfg("moe-zero2-ep2-etp2-D4-adamw-resumed", d=4, ep=2, etp_degree=2, zero=2, optimizer="adamw", steps=3,
             resume_at=1),
        _cfg("moe-il-P2v2-D2-ep2", MOE3, d=2, ep=2, boundaries=[1, 2, 3], schedule="interleaved-1f1b",
             virtual_stages_per_rank=2, num_microbatches=4),
        _cfg("moe-ep4-cp2-D2", BALANCED, d=2, ep=4, cp_degree=2),
        _cfg("moe-zbh1-P2-D2-ep2-sel-rc", MOE3, d=2, ep=2, boundaries=[3], schedule="zb-h1", num_microbatches=4,
             microbatch_size=1, recompute=True, selective=True),
        _cfg("moe-zbv-P2-D2-ep2", MOE3, d=2, ep=2, boundaries=[1, 2, 4], schedule="zbv", virtual_stages_per_rank=2,
             num_microbatches=4, microbatch_size=1),
    ]


def _exact(result: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    """Losses and gradients within 1e-12 of one process; parameters too (1e-10 with AdamW)."""
    param_tol = 1e-10 if cfg["optimizer"] == "adamw" else 1e-12
    worst = max(result["loss_abs_diff"], result["grad_abs_diff"], result["loss_rel_diff"])
    if worst > 1e-12 or result["param_rel_diff"] > param_tol or len(result["losses"]) != cfg["steps"]:
        return [f"{cfg['name']}: loss/grad {worst:.3g}, params {result['param_rel_diff']:.3g}"]
    return []


def _expert_state(result: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    """ZeRO 1 with AdamW on D = 4, EP = 2 (edp 2), one stage: each rank's optimizer keeps
    2 x (ceil(N / 4) + ceil(N_e / (2 x 2))) float64 elements and two step scalars: the rest's
    N parameters sharded over the D = 4 data-parallel ranks, the experts' N_e over ep 2 x edp 2."""
    workload = load_workload(cfg["model"])
    experts = sum(p.numel() for layer in workload.layers for m in expert_modules(layer) for p in m.parameters())
    unique = {id(p): p for layer in workload.layers for p in layer.parameters()}  # the tied embedding once
    rest = sum(p.numel() for p in unique.values()) - experts
    expected = 2 * 8 * (-(-rest // 4) + -(-experts // 4)) + 2 * 4
    got = [chunk["optimizer_bytes"] for rank in result["model_state"] for chunk in rank]
    return [] if got == [expected] * 4 else [f"{cfg['name']}: optimizer bytes {got}, expected {expected} on each rank"]


def _check_memory(results: dict[str, dict[str, Any]]) -> list[str]:
    """EP = 2 against every expert local, the same micro-batch: + 2 int64 per token copy per MoE layer."""
    extra = 2 * 2 * (2 * 16 * 2) * 8  # MoE layers x 2 vectors x token copies (b s topk) x int64
    whole, split = results["moe-mem-D2"]["saved_bytes_per_microbatch"], results["moe-mem-ep2"]["saved_bytes_per_microbatch"]
    return [f"rank {r}: {s} B at EP 2, {w} B with every expert local (+ {extra} expected)"
            for r, (w, s) in enumerate(zip(whole, split)) if s - w != extra]


@pytest.mark.slow
@pytest.mark.driver(configs=configs)
@pytest.mark.parametrize("world", [2, 4])
def test_expert_parallel_runs_match_one_process(world: int, driven: SharedLaunches) -> None:
    cfgs = configs(world)
    results = {r["name"]: r for r in driven.results(world, cfgs)}
    errors = [e for c in cfgs for e in _exact(results[c["name"]], c)]
    if world == 4:
        cfg = next(c for c in cfgs if c["name"] == "moe-zero1-ep2-edp2-adamw")
        errors += _expert_state(results[cfg["name"]], cfg)
    else:
        errors += _check_memory(results)
    assert not errors, "\n".join(errors)
    resumed = next(r for r in results.values() if r["name"].endswith("-resumed"))  # each rank its own file
    assert step_files(resumed) == ["manifest.json"] + [f"stage_0.rank_{r}.pt" for r in range(world)]


@functools.cache
def _planned(devices: int, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """A driver config of ``planner plan``'s own plan with EP = 2 of the zoo MoE profile on
    ``devices`` local CPUs, run float32 SGD for 2 steps with the forced-balance router (the same
    parameters: the profile's fingerprint). Planned once per session."""
    from planner.artifacts.plan import plan_to_json
    from planner.commands.cli import build_parser
    from planner.commands.plan import plan_of_args

    argv = ["plan", "--profile", str(ROOT / "profiles" / "zoo-moe-cpu.json"), "--cluster", "local-cpu",
            "--devices", str(devices), "--global-batch", str(4 * devices), "--optimizer", "sgd-fp32",
            "--ep", "2", *extra]
    made = plan_of_args(build_parser("plan").parse_args(argv))
    name = f"planned-moe-ep2-{devices}" + "".join(extra).replace("--", "-")
    return {"name": name, "model": "moe:router=balanced", "plan": plan_to_json(made), "dtype": "float32",
            "optimizer": "sgd", "steps": 2}


def planned(world: int) -> list[dict[str, Any]]:
    return [_planned(2)] if world == 2 else [_planned(4, ("--stages", "2"))]


@pytest.mark.slow
@pytest.mark.driver(configs=planned)
@pytest.mark.parametrize("world", [2, 4])
def test_planner_made_expert_parallel_plans_run_as_predicted(world: int, driven: SharedLaunches) -> None:
    from planner.artifacts.plan import plan_from_json
    from planner.artifacts.report import report_from_json

    (cfg,) = planned(world)
    (result,) = driven.results(world, [cfg])
    plan, report = plan_from_json(cfg["plan"]), report_from_json(result["report"])
    assert plan.layout.ep_degree == 2 and plan.num_devices == world
    assert len(result["losses"]) == 2 and result["loss_rel_diff"] <= 1e-5, (result["losses"], result["ref_losses"])
    errors = []
    for stage, got in zip(plan.stages, report.stages, strict=True):
        predicted = stage.activation_bytes_per_microbatch
        if abs(got.saved_bytes_per_microbatch - predicted) > 0.01 * predicted:
            errors.append(f"stage {stage.stage_idx}: saved {got.saved_bytes_per_microbatch} B a micro-batch, "
                          f"the plan {predicted} B")
        if got.grad_bytes_after_sync != got.grad_bytes_predicted:
            errors.append(f"stage {stage.stage_idx}: {got.grad_bytes_after_sync} B of gradients, the plan "
                          f"{got.grad_bytes_predicted} B")
    assert not errors, "\n".join(errors)
