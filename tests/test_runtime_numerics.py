"""The runtime trains exactly as one process would: P in {1, 2, 4}, D in {1, 2} (within 4
processes), GPipe and 1F1B, with and without recomputation, float64 to 1e-12 and float32 to
1e-6 relative; plus the skip-connection model and the tied-embedding GPT; plus interleaved
1F1B (P = 2 ranks x v = 2 stages each, 4 stages, D in {1, 2}), in the same launches; plus
the all-reduce in 256-byte buckets started during the last backward (P in {1, 2}, D = 2,
interleaved too) and a plan for the ``none`` stack (one all-reduce after the schedule); plus
ZeRO 1 and 2 with AdamW (P in {1, 2}, D = 2, interleaved and a tie split over pipeline
ranks too): losses and final parameters to 1e-12 relative in float64, and the optimizer
state and gradient bytes each rank holds, exactly (``check_model_state``); one ZeRO 2 run
resumes from a checkpoint of its first step, each rank reloading its own optimizer shard
(step 2's loss depends on that state); plus tensor parallelism (t = 2) on the zoo GPT (tied
embedding and head) at (t, P, D) in {(2, 1, 1), (2, 2, 1), (2, 1, 2)} and interleaved, with
and without sequence parallelism and recomputation, and with ZeRO 1 and 2 (each rank's
shard of its local tensor-parallel shards): losses, gradients and final parameters to 1e-12
relative in float64 with SGD; two of them resume from a checkpoint of their first step (one
file per tp index, and per ZeRO shard); plus selective recomputation (every attention core
recomputed in backward, Korthikanti et al. 2022) of the zoo GPT at P in {1, 2} and t in {1, 2},
alone and beside full recomputation, with and without sequence parallelism: float64 to 1e-12.
With AdamW the parameters agree to 1e-10 only: the
split matmuls sum in another order (gradients differ by ~1e-16), and AdamW's m / sqrt(v)
turns that into a relative change of the update wherever a gradient is near zero (measured
5.6e-12 to 6.7e-12 after 2 steps, 1.05e-11 after 3); the losses still agree to 1e-12.

One torchrun launch per world size runs every configuration of that size, these and the other
test files' (tests/runtime_driver.py, ``SharedLaunches``), because starting processes and
importing torch costs seconds.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tests.runtime_launch import SharedLaunches, step_files

MLP = "tests.factories:mlp"
ZOO_GPT = "gpt:layers=3,hidden=16,heads=2,seq=4,vocab=32"  # embed, 3 blocks, tied head
ZOO_BERT = "bert:layers=3,hidden=16,heads=2,seq=4,vocab=32"  # embed, 3 post-LN blocks, head
ZOO_RESNET = "resnet:blocks=2,width=4,image=8,classes=4"  # stem, (a, b) x 2, head; skips a -> b
# (P, D) -> boundaries of the 5-layer test models
SPLITS = {1: [], 2: [2], 4: [1, 2, 4]}
IL = "interleaved-1f1b"
#: the bundled runtime's stack with 256-byte buckets: many all-reduces launched during the last backward
SMALL_BUCKETS = {"name": "planner", "grad_reduce_overlap": True, "grad_bucket_bytes": 256}
TOKENS = "tests.contract_factories:padded_lm"  # loss (sum, count) over the tokens that are not padding


def _il(name: str, model: str, d: int, recompute: bool, **kw: Any) -> dict[str, Any]:
    """Interleaved 1F1B: 4 stages on P = 2 pipeline ranks (stages 0, 2 on rank 0; 1, 3 on rank 1)."""
    return _cfg(name, model, 4, d, IL, recompute, virtual_stages_per_rank=2, **kw)


def _cfg(name: str, model: str, p: int, d: int, schedule: str, recompute: bool, **kw: Any) -> dict[str, Any]:
    cfg = {
        "name": name,
        "model": model,
        "boundaries": SPLITS[p],
        "dp_degree": d,
        "num_microbatches": 4,
        "microbatch_size": 2,
        "schedule": schedule,
        "recompute": recompute,
        "dtype": "float64",
        "optimizer": "sgd",
        "steps": 2,
    }
    cfg.update(kw)
    return cfg


def _zero(name: str, model: str, p: int, schedule: str, zero: int, **kw: Any) -> dict[str, Any]:
    """ZeRO with AdamW (so the optimizer state matters) on D = 2 replicated pipelines."""
    return _cfg(name, model, p, 2, schedule, kw.pop("recompute", False), optimizer="adamw", zero=zero, **kw)


def _tp(name: str, p: int, d: int, schedule: str, recompute: bool, sp: bool, **kw: Any) -> dict[str, Any]:
    """Tensor parallelism over t = 2 ranks per stage replica, zoo GPT (heads 2, tied head) unless
    ``model`` says otherwise."""
    return _cfg(name, kw.pop("model", ZOO_GPT), p, d, schedule, recompute, tp_degree=2, sequence_parallel=sp, **kw)


def configs(world: int) -> list[dict[str, Any]]:
    out = []
    for (p, d), schedule, rc in itertools.product([(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)], ["gpipe", "1f1b"], [False, True]):
        if p * d == world:
            out.append(_cfg(f"mlp-P{p}-D{d}-{schedule}-rc{int(rc)}", MLP, p, d, schedule, rc))
    extra = {
        1: [
            _cfg("gpt-P1-D1-adamw", "tests.factories:tiny_gpt", 1, 1, "1f1b", True, optimizer="adamw"),
            _cfg("sel-zoo-gpt-P1-D1-t1-1f1b", ZOO_GPT, 1, 1, "1f1b", False, selective=True, optimizer="adamw"),
        ],
        2: [
            _cfg("gpt-tied-P2-D1-gpipe", "tests.factories:tiny_gpt", 2, 1, "gpipe", False, optimizer="adamw"),
            _cfg("skip-P2-D1-1f1b-rc", "tests.factories:skip", 2, 1, "1f1b", True),
            _cfg("mlp-P2-D1-float32", MLP, 2, 1, "1f1b", False, dtype="float32", num_microbatches=3),
            _cfg("zoo-gpt-P2-D1-1f1b", ZOO_GPT, 2, 1, "1f1b", False, optimizer="adamw"),
            _cfg("zoo-resnet-P2-D1-gpipe-rc", ZOO_RESNET, 2, 1, "gpipe", True),
            _il("il-mlp-P2v2-D1", MLP, 1, False),
            _il("il-mlp-P2v2-D1-rc", MLP, 1, True),
            _il("il-gpt-tied-P2v2-D1-adamw", "tests.factories:tiny_gpt", 1, False, optimizer="adamw"),
            _il("il-skip-P2v2-D1-M6", "tests.factories:skip", 1, False, num_microbatches=6),
            _zero("zero0-mlp-P1-D2-1f1b", MLP, 1, "1f1b", 0),
            _zero("zero1-mlp-P1-D2-1f1b", MLP, 1, "1f1b", 1),
            _zero("zero2-mlp-P1-D2-gpipe-rc", MLP, 1, "gpipe", 2, recompute=True),
            _zero("zero2-gpt-P1-D2-1f1b", "tests.factories:tiny_gpt", 1, "1f1b", 2),
            _zero("zero2-mlp-P1-D2-1f1b-resumed", MLP, 1, "1f1b", 2, steps=3, resume_at=1),
            _tp("tp2-gpt-P1-D1-1f1b", 1, 1, "1f1b", False, False),
            _tp("tp2-sp-gpt-P1-D1-gpipe-rc", 1, 1, "gpipe", True, True),
            _tp("tp2-bert-P1-D1-gpipe-rc", 1, 1, "gpipe", True, False, model=ZOO_BERT),
            _tp("tp2-sp-gpt-P1-D1-1f1b-adamw-resumed", 1, 1, "1f1b", False, True, optimizer="adamw", steps=3, resume_at=1),
            # issue 13: a (sum, count) token-weighted loss; a non-contiguous tensor crossing the boundary
            _cfg("tokens-P2-D1-1f1b", TOKENS, 2, 1, "1f1b", False),
            _zero("tokens-zero1-P1-D2-1f1b", TOKENS, 1, "1f1b", 1),
            _cfg("transposed-P2-D1-gpipe", "tests.contract_factories:transposed", 2, 1, "gpipe", False),
            # selective recomputation: P = 2, t = 1 (beside full recomputation), and P = 1, t = 2
            _cfg("sel-zoo-gpt-P2-D1-t1-gpipe-rc", ZOO_GPT, 2, 1, "gpipe", True, selective=True),
            _tp("sel-tp2-gpt-P1-D1-1f1b", 1, 1, "1f1b", False, False, selective=True),
            # issue 19: the all-reduce in buckets of 256 bytes (a few parameters each) started from the
            # gradient hooks during the last backward; and a plan for a stack that does not overlap it
            _cfg("mlp-P1-D2-1f1b-buckets", MLP, 1, 2, "1f1b", True, stack=SMALL_BUCKETS),
            _cfg("gpt-tied-P1-D2-gpipe-buckets", "tests.factories:tiny_gpt", 1, 2, "gpipe", False,
                 optimizer="adamw", stack=SMALL_BUCKETS),
            _cfg("mlp-P1-D2-gpipe-stack-none", MLP, 1, 2, "gpipe", False, stack={"name": "none"}),
        ],
        4: [
            _cfg("gpt-tied-P2-D2-1f1b-rc", "tests.factories:tiny_gpt", 2, 2, "1f1b", True, optimizer="adamw"),
            _cfg("gpt-tied-P4-D1-gpipe", "tests.factories:tiny_gpt", 4, 1, "gpipe", True),
            _cfg("skip-P4-D1-gpipe", "tests.factories:skip", 4, 1, "gpipe", False, num_microbatches=5),
            _cfg("mlp-P2-D2-float32-adamw", MLP, 2, 2, "gpipe", True, dtype="float32", optimizer="adamw"),
            _cfg("zoo-resnet-P4-D1-1f1b", ZOO_RESNET, 4, 1, "1f1b", False, boundaries=[1, 2, 4]),
            _cfg("zoo-gpt-P2-D2-gpipe-rc", ZOO_GPT, 2, 2, "gpipe", True, boundaries=[3], dtype="float32"),
            _il("il-mlp-P2v2-D2-rc", MLP, 2, True),
            _il("il-gpt-tied-P2v2-D2-adamw", "tests.factories:tiny_gpt", 2, True, optimizer="adamw"),
            _zero("zero1-mlp-P2-D2-gpipe-rc", MLP, 2, "gpipe", 1, recompute=True),
            _zero("zero2-gpt-tied-P2-D2-1f1b", "tests.factories:tiny_gpt", 2, "1f1b", 2),
            _il("zero2-il-mlp-P2v2-D2", MLP, 2, False, optimizer="adamw", zero=2),
            _tp("tp2-sp-gpt-tied-P2-D1-1f1b", 2, 1, "1f1b", False, True),
            _tp("tp2-gpt-P1-D2-gpipe-rc", 1, 2, "gpipe", True, False),
            _tp("zero1-tp2-gpt-P1-D2-1f1b", 1, 2, "1f1b", False, False, optimizer="adamw", zero=1),
            _tp("zero2-tp2-sp-gpt-P1-D2-gpipe-rc-resumed", 1, 2, "gpipe", True, True, optimizer="adamw", zero=2, steps=3, resume_at=1),
            _tp("tp2-il-gpt-tied-P2v2-D1-rc", 4, 1, IL, True, False, virtual_stages_per_rank=2),
            _cfg("tokens-P2-D2-gpipe-rc", TOKENS, 2, 2, "gpipe", True),
            # selective recomputation at P = 2, t = 2, with sequence parallelism
            _tp("sel-tp2-sp-gpt-tied-P2-D1-1f1b", 2, 1, "1f1b", False, True, selective=True),
            _cfg("gpt-tied-P2-D2-1f1b-buckets", "tests.factories:tiny_gpt", 2, 2, "1f1b", True, stack=SMALL_BUCKETS),
            _il("il-mlp-P2v2-D2-buckets", MLP, 2, False, stack=SMALL_BUCKETS),
        ],
    }
    return out + extra[world]


def _check(result: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    errors = []
    if cfg["dtype"] == "float64":
        if result["loss_abs_diff"] > 1e-12 or result["grad_abs_diff"] > 1e-12:
            errors.append(f"{cfg['name']}: loss diff {result['loss_abs_diff']:.3g}, grad diff {result['grad_abs_diff']:.3g} > 1e-12")
    elif result["loss_rel_diff"] > 1e-6 or result["grad_rel_diff"] > 1e-6:
        errors.append(f"{cfg['name']}: loss rel {result['loss_rel_diff']:.3g}, grad rel {result['grad_rel_diff']:.3g} > 1e-6")
    if "zero" in cfg and cfg.get("tp_degree", 1) == 1 and (result["loss_rel_diff"] > 1e-12 or result["param_rel_diff"] > 1e-12):
        errors.append(f"{cfg['name']}: loss rel {result['loss_rel_diff']:.3g}, param rel {result['param_rel_diff']:.3g} > 1e-12")
    if cfg.get("tp_degree", 1) > 1:
        param_tol = 1e-12 if cfg["optimizer"] == "sgd" else 1e-10  # AdamW: see the module docstring
        if result["loss_rel_diff"] > 1e-12 or result["param_rel_diff"] > param_tol:
            errors.append(f"{cfg['name']}: loss rel {result['loss_rel_diff']:.3g}, param rel {result['param_rel_diff']:.3g}")
    if len(result["losses"]) != cfg["steps"]:
        errors.append(f"{cfg['name']}: {len(result['losses'])} losses for {cfg['steps']} steps")
    if result["saved_bytes_peak"] <= 0:
        errors.append(f"{cfg['name']}: no saved bytes measured")
    return errors + check_model_state(result, cfg)


STEP_BYTES = 4  # AdamW's step counter: one float32 scalar per parameter tensor (default dtype float32)


def check_model_state(result: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    """AdamW on D = 2 ranks per stage, no tie split over pipeline ranks: a stage chunk's
    optimizer state is 2 x N elements (exp_avg, exp_avg_sq) plus a step scalar per tensor;
    with ZeRO 2 x ceil(N / D) elements and one step scalar, i.e. 1/D of it up to padding and
    step scalars. Gradients held after the sync: N elements (ZeRO 0), the padded flat buffer
    of D x ceil(N / D) (ZeRO 1), the shard of ceil(N / D) (ZeRO 2)."""
    zero = cfg.get("zero")
    if zero is None or (cfg["model"] == "tests.factories:tiny_gpt" and len(cfg["boundaries"]) > 0):
        return []  # not a ZeRO config, or a tie split over pipeline ranks (stepped unsharded)
    es, d = (8 if cfg["dtype"] == "float64" else 4), cfg["dp_degree"]
    errors = []
    for rank, chunks in enumerate(result["model_state"]):
        for got in chunks:
            n, shard = got["numel"], -(-got["numel"] // d)
            if zero == 0:
                expected = (2 * es * n + STEP_BYTES * got["tensors"], es * n)
            else:
                expected = (2 * es * shard + STEP_BYTES, es * shard * (d if zero == 1 else 1))
            if (got["optimizer_bytes"], got["grad_bytes"]) != expected:
                errors.append(f"{cfg['name']}: rank {rank} optimizer/grad bytes {got}, expected {expected}")
    return errors


@pytest.mark.slow
@pytest.mark.driver(configs=configs)
@pytest.mark.parametrize("world", [1, 2, 4])
def test_matches_one_process_training(world: int, driven: SharedLaunches) -> None:
    cfgs = configs(world)
    results = driven.results(world, cfgs)
    errors = [e for r, c in zip(results, cfgs) for e in _check(r, c)]
    assert not errors, "\n".join(errors)
    by_name = {r["name"]: r for r in results}
    if world == 4:
        saved = step_files(by_name["zero2-tp2-sp-gpt-P1-D2-gpipe-rc-resumed"])
        shards = (".optimizer_shard_0", ".optimizer_shard_1", "")
        assert saved == ["manifest.json"] + [f"stage_0.tp_{k}{s}.pt" for k in range(2) for s in shards]
    if world == 2:
        # ZeRO 2 resumed from a checkpoint of its first step: each rank saved its own AdamW shard
        saved = step_files(by_name["zero2-mlp-P1-D2-1f1b-resumed"])
        assert saved == ["manifest.json", "stage_0.optimizer_shard_0.pt", "stage_0.optimizer_shard_1.pt", "stage_0.pt"]
        saved = step_files(by_name["tp2-sp-gpt-P1-D1-1f1b-adamw-resumed"])
        assert saved == ["manifest.json", "stage_0.tp_0.pt", "stage_0.tp_1.pt"]  # each tp index its own shards
        # the same stage unsharded and sharded over D = 2: half the optimizer state
        for rank in range(2):
            plain = by_name["zero0-mlp-P1-D2-1f1b"]["model_state"][rank][0]
            sharded = by_name["zero1-mlp-P1-D2-1f1b"]["model_state"][rank][0]
            assert plain["numel"] % 2 == 0  # no padding
            assert plain["optimizer_bytes"] - STEP_BYTES * plain["tensors"] == 2 * (sharded["optimizer_bytes"] - STEP_BYTES)


def test_configs_cover_the_issue_grid() -> None:
    names = {c["name"] for w in (1, 2, 4) for c in configs(w)}
    for p, d in [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)]:
        for schedule in ("gpipe", "1f1b"):
            for rc in (0, 1):
                assert f"mlp-P{p}-D{d}-{schedule}-rc{rc}" in names


def test_zero_is_covered() -> None:
    """ZeRO 1 and 2 run against one-process training with AdamW at P in {1, 2}, D = 2, with
    interleaved 1F1B and with a tie split over pipeline ranks, in the launches above."""
    zero = [c for w in (1, 2, 4) for c in configs(w) if c.get("zero")]
    assert {(c["zero"], len(c["boundaries"]) + 1) for c in zero} >= {(1, 1), (2, 1), (1, 2), (2, 2)}
    assert all(c["dp_degree"] == 2 and c["optimizer"] == "adamw" and c["steps"] >= 2 for c in zero)
    assert any(c["schedule"] == IL for c in zero) and any(c["model"] == "tests.factories:tiny_gpt" for c in zero)


def test_interleaved_1f1b_is_covered() -> None:
    """Interleaved 1F1B (ScheduleInterleaved1F1B, 2 stages per rank) is checked against
    one-process training by the launches above: D = 1 in the 2-process launch, D = 2 in the
    4-process one, with recompute, AdamW and the tie split across pipeline ranks."""
    il = {c["name"]: c for w in (1, 2, 4) for c in configs(w) if c["schedule"] == IL}
    assert {(c["dp_degree"], c["recompute"]) for c in il.values()} >= {(1, False), (1, True), (2, True)}
    for cfg in il.values():
        assert cfg["virtual_stages_per_rank"] == 2 and len(cfg["boundaries"]) + 1 == 4 and cfg["dtype"] == "float64"
    assert any(c["model"] == "tests.factories:tiny_gpt" and c["dp_degree"] == 2 for c in il.values())


def test_selective_recomputation_is_covered() -> None:
    """Selective recomputation runs against one-process training at P in {1, 2} x t in {1, 2}
    (float64), beside full recomputation and with sequence parallelism in some."""
    sel = [c for w in (1, 2, 4) for c in configs(w) if c.get("selective")]
    grid = {((len(c["boundaries"]) + 1), c.get("tp_degree", 1)) for c in sel}
    assert grid >= {(1, 1), (2, 1), (1, 2), (2, 2)}
    assert any(c["recompute"] for c in sel) and any(c.get("sequence_parallel") for c in sel)
    assert all(c["dtype"] == "float64" and c["model"] == ZOO_GPT for c in sel)


def test_tensor_parallel_is_covered() -> None:
    """Tensor parallelism (t = 2) runs against one-process training in the launches above at
    (t, P, D) in {(2, 1, 1), (2, 2, 1), (2, 1, 2)}, with sequence parallelism and recompute on
    some, the zoo GPT's tie split over pipeline ranks, and interleaved 1F1B."""
    tp = [c for w in (1, 2, 4) for c in configs(w) if c.get("tp_degree", 1) > 1]
    grid = {(c["tp_degree"], (len(c["boundaries"]) + 1) // c.get("virtual_stages_per_rank", 1), c["dp_degree"]) for c in tp}
    assert grid >= {(2, 1, 1), (2, 2, 1), (2, 1, 2)}
    assert any(c["sequence_parallel"] for c in tp) and any(c["recompute"] for c in tp)
    assert any(c["model"] == ZOO_GPT and c["boundaries"] for c in tp)  # embedding and head on different ranks
    assert all(c["dtype"] == "float64" for c in tp)


def test_driver_configurations_share_launches_without_clashing() -> None:
    """Every file's driver configurations run in one launch per world size (``SharedLaunches``):
    their names are unique across files, and a name given twice with other fields is refused."""
    from tests import (
        test_hf_runtime,
        test_hf_tensor_parallel,
        test_runtime_context,
        test_runtime_experts,
        test_runtime_fsdp,
        test_runtime_survival,
        test_runtime_zero_bubble,
    )

    by_world = {
        1: configs(1) + test_hf_runtime.configs(1),
        2: configs(2) + test_hf_runtime.configs(2) + test_hf_tensor_parallel.configs(2) + test_runtime_fsdp.CONFIGS[2]
        + test_runtime_zero_bubble.configs(2) + test_runtime_zero_bubble.zbv_configs(2) + test_runtime_survival.undeclared_tie()
        + test_runtime_context.zoo_gpt_configs() + test_runtime_context.hugging_face_configs()
        + test_runtime_context.run_reference_configs()
        + test_runtime_experts.configs(2) + test_runtime_experts.planned(2),
        4: configs(4) + test_hf_runtime.configs(4) + test_hf_tensor_parallel.configs(4) + test_runtime_fsdp.CONFIGS[4]
        + test_runtime_zero_bubble.configs(4) + test_runtime_zero_bubble.zbv_configs(4) + test_runtime_context.combination_configs()
        + test_runtime_experts.configs(4) + test_runtime_experts.planned(4),
    }
    launches = SharedLaunches()
    for world, cfgs in by_world.items():
        names = [c["name"] for c in cfgs]
        assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
        launches.plan(world, cfgs)
        launches.plan(world, cfgs)  # the same again: planned once
        assert list(launches.planned[world]) == names
    with pytest.raises(ValueError, match="named 'mlp-P1-D1-gpipe-rc0' differ"):
        launches.plan(1, [{**configs(1)[0], "steps": 9}])
