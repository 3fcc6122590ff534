"""The runtime trains exactly as one process would: P in {1, 2, 4}, D in {1, 2} (within 4
processes), GPipe and 1F1B, with and without recomputation, float64 to 1e-12 and float32 to
1e-6 relative; plus the skip-connection model and the tied-embedding GPT; plus interleaved
1F1B (P = 2 ranks x v = 2 stages each, 4 stages, D in {1, 2}), in the same launches.

One torchrun launch per world size runs every configuration of that size
(tests/runtime_driver.py), because starting processes and importing torch costs seconds.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from tests.runtime_launch import torchrun

MLP = "tests.factories:mlp"
ZOO_GPT = "gpt:layers=3,hidden=16,heads=2,seq=4,vocab=32"  # embed, 3 blocks, tied head
ZOO_RESNET = "resnet:blocks=2,width=4,image=8,classes=4"  # stem, (a, b) x 2, head; skips a -> b
# (P, D) -> boundaries of the 5-layer test models
SPLITS = {1: [], 2: [2], 4: [1, 2, 4]}
IL = "interleaved-1f1b"


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


def configs(world: int) -> list[dict[str, Any]]:
    out = []
    for (p, d), schedule, rc in itertools.product([(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)], ["gpipe", "1f1b"], [False, True]):
        if p * d == world:
            out.append(_cfg(f"mlp-P{p}-D{d}-{schedule}-rc{int(rc)}", MLP, p, d, schedule, rc))
    extra = {
        1: [_cfg("gpt-P1-D1-adamw", "tests.factories:tiny_gpt", 1, 1, "1f1b", True, optimizer="adamw")],
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
    if len(result["losses"]) != cfg["steps"]:
        errors.append(f"{cfg['name']}: {len(result['losses'])} losses for {cfg['steps']} steps")
    if result["saved_bytes_peak"] <= 0:
        errors.append(f"{cfg['name']}: no saved bytes measured")
    return errors


@pytest.mark.parametrize("world", [1, 2, 4])
def test_matches_one_process_training(world: int, tmp_path: Path) -> None:
    cfgs = configs(world)
    (tmp_path / "configs.json").write_text(json.dumps(cfgs))
    proc = torchrun(world, ["tests/runtime_driver.py", str(tmp_path / "configs.json"), str(tmp_path / "out.json")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "out.json").read_text())
    assert [r["name"] for r in results] == [c["name"] for c in cfgs]
    errors = [e for r, c in zip(results, cfgs) for e in _check(r, c)]
    assert not errors, "\n".join(errors)


def test_configs_cover_the_issue_grid() -> None:
    names = {c["name"] for w in (1, 2, 4) for c in configs(w)}
    for p, d in [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)]:
        for schedule in ("gpipe", "1f1b"):
            for rc in (0, 1):
                assert f"mlp-P{p}-D{d}-{schedule}-rc{rc}" in names


def test_interleaved_1f1b_is_covered() -> None:
    """Interleaved 1F1B (ScheduleInterleaved1F1B, 2 stages per rank) is checked against
    one-process training by the launches above: D = 1 in the 2-process launch, D = 2 in the
    4-process one, with recompute, AdamW and the tie split across pipeline ranks."""
    il = {c["name"]: c for w in (1, 2, 4) for c in configs(w) if c["schedule"] == IL}
    assert {(c["dp_degree"], c["recompute"]) for c in il.values()} >= {(1, False), (1, True), (2, True)}
    for cfg in il.values():
        assert cfg["virtual_stages_per_rank"] == 2 and len(cfg["boundaries"]) + 1 == 4 and cfg["dtype"] == "float64"
    assert any(c["model"] == "tests.factories:tiny_gpt" and c["dp_degree"] == 2 for c in il.values())
