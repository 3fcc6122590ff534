"""ZeRO 3 in the runtime (``planner.runtime.zero``, ``zero=3``) against one-process training:
float64, SGD, losses and gradients equal to <= 1e-12 at P = 1, D = 2 and P = 2, D = 2 (with
recomputation, and the zoo GPT with its tied embedding kept unsharded), under the split-backward
schedules too (ZB-H1 with AdamW, and with recomputation on the zoo GPT; ZBV with recomputation
and DualPipe-V, two chunks per rank, so a middle stage's I and W) with the weights all-gathered as
often per micro-batch as the cost model prices (three under a split backward), the bytes a forward saves for
backward equal to the same stages' without ZeRO (the weights, gathered anew, not counted), and
the parameter bytes
each rank holds between its uses of a stage measured against the cost model's ``w N / d``."""

from __future__ import annotations

from typing import Any

import pytest

from planner.cost.fsdp import gathers_per_microbatch
from tests.runtime_launch import SharedLaunches

MLP = "tests.factories:mlp"
ZOO_GPT = "gpt:layers=3,hidden=16,heads=2,seq=4,vocab=32"  # embed, 3 blocks, tied head


def _cfg(name: str, model: str, boundaries: list[int], schedule: str, recompute: bool, **kw: Any) -> dict[str, Any]:
    return {"name": name, "model": model, "boundaries": boundaries, "dp_degree": 2, "num_microbatches": 4,
            "microbatch_size": 2, "schedule": schedule, "recompute": recompute, "dtype": "float64",
            "optimizer": "sgd", "steps": 2, "zero": 3, **kw}


V2 = {"virtual_stages_per_rank": 2}
CONFIGS = {
    2: [_cfg("zero3-mlp-P1-D2-1f1b", MLP, [], "1f1b", False), _cfg("zero3-zoo-gpt-P1-D2-gpipe", ZOO_GPT, [], "gpipe", False)],
    4: [_cfg("zero3-mlp-P2-D2-1f1b", MLP, [2], "1f1b", False), _cfg("zero3-mlp-P2-D2-gpipe-rc", MLP, [2], "gpipe", True),
        _cfg("zero3-zoo-gpt-P2-D2-1f1b", ZOO_GPT, [2], "1f1b", False),
        # a split backward (issue zbzero3: silently wrong on ZB-H1, stopped with recomputation and at
        # ZBV's middle stages): each micro-batch's I and W apart, other micro-batches' passes between
        _cfg("zero3-mlp-P2-D2-zb-h1", MLP, [2], "zb-h1", False, optimizer="adamw"),
        _cfg("zero3-zoo-gpt-P2-D2-zb-h1-rc", ZOO_GPT, [2], "zb-h1", True),
        _cfg("zero3-mlp-P2v2-D2-zbv-rc", MLP, [1, 2, 4], "zbv", True, **V2),
        _cfg("zero3-mlp-P2v2-D2-dualpipe-v", MLP, [1, 2, 4], "dualpipe-v", False, **V2),
        # the same stages without ZeRO: what one forward saves for backward must not change with it
        _cfg("zero0-mlp-P2-D2-1f1b", MLP, [2], "1f1b", False, zero=0)],
}


@pytest.mark.slow
@pytest.mark.driver(configs=CONFIGS.__getitem__)
@pytest.mark.parametrize("world", [2, 4])
def test_zero3_matches_one_process_training(world: int, driven: SharedLaunches) -> None:
    results = driven.results(world, CONFIGS[world])
    for r, cfg in zip(results, CONFIGS[world]):
        assert len(r["losses"]) == 2
        assert r["loss_abs_diff"] <= 1e-12 and r["grad_abs_diff"] <= 1e-12 and r["param_abs_diff"] <= 1e-12, r
        if cfg["zero"] != 3:
            continue
        if cfg["model"] == MLP and cfg["boundaries"] == [2] and not cfg["recompute"]:
            # the bytes a forward saves, as without ZeRO: the gathered weights are not activations
            # (ZeRO 3 gathers them into a new allocation each time: the meter re-reads its address)
            plain = next(p for p, c in zip(results, CONFIGS[world]) if c["zero"] == 0)
            assert r["saved_bytes_per_microbatch"] == plain["saved_bytes_per_microbatch"], (r["name"], r, plain)
        split = cfg["schedule"] in ("zb-h1", "zbv", "dualpipe-v")
        for chunks in r["model_state"]:
            for got in chunks:
                # the weights' all-gathers per micro-batch are the cost model's (planner.cost.fsdp):
                # F and B, and W's under a split backward (two on the first stage, three where it
                # rebuilds recomputed layers at its I); DualPipe-V runs some backwards whole (two)
                priced = gathers_per_microbatch(split, got["stage_idx"] == 0, cfg["recompute"])
                runs = cfg["steps"] * cfg["num_microbatches"]
                if cfg["schedule"] == "dualpipe-v":
                    assert 2 * runs <= got["gathers"] <= priced * runs, (r["name"], got)
                else:
                    assert got["gathers"] == priced * runs, (r["name"], got, priced)
                # between its uses a rank keeps only its shard: w N / d (the cost model's ZeRO 3
                # weights, w = 8 bytes in float64), up to the padding of the last shard, less the
                # tied embedding the zoo GPT keeps whole outside the shard
                predicted = 8 * got["numel"] / 2
                assert 0 < got["param_bytes_between"] <= predicted + 8, (r["name"], got)
                if r["name"].startswith("zero3-mlp"):  # no tied parameters: exactly the shard
                    assert got["param_bytes_between"] == 8 * -(-got["numel"] // 2), (r["name"], got)
