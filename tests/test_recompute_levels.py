"""Recompute levels and attention kinds of analytic profiles against Korthikanti et al. 2022
Table 2, and the files that carry them (profile v3, plan v4) loading their older versions."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from planner.artifacts.cluster import PRESETS
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import AttentionKind, OptimizerKind, RecomputeLevel
from planner.artifacts.layout import DeviceGroup
from planner.artifacts.plan import plan_from_json, plan_to_json
from planner.artifacts.profile import profile_from_json, profile_to_json
from planner.cost.tensor_parallel import device_cost_model
from planner.profiling.analytic.common import FIT_SIZES, device_rates
from planner.profiling.analytic.gpt import attention_gemms, gpt_profile
from planner.profiling.analytic.llama import llama_profile

S, H, A, B = 2048, 6144, 64, 4  # Korthikanti's 22B (Table 3): seq, hidden, heads; micro-batch 4
CLUSTER = PRESETS["a100-80gb-x8"]


def table2(level: RecomputeLevel, t: int, sp: bool) -> float:
    """Korthikanti et al. 2022 Table 2: activation bytes per transformer layer (16-bit), plus
    the full level's ``2 s b h`` divided by t under sequence parallelism (each device keeps its
    sequence shard of the layer input)."""
    sbh = S * B * H
    if level is RecomputeLevel.FULL:
        return 2 * sbh / (t if sp else 1)
    core = 5 * A * S / H if level is RecomputeLevel.NONE else 0.0
    if sp:
        return sbh / t * (34 + core)
    return sbh * (10 + 24 / t + core / t)


def level_bytes(cm, layer: int, level: RecomputeLevel) -> float:
    full = (layer,) if level is RecomputeLevel.FULL else ()
    sel = (layer,) if level is RecomputeLevel.SELECTIVE else ()
    return cm.activation_bytes(layer, layer + 1, full, B, sel)


@pytest.fixture(scope="module")
def small_plan():
    from planner.artifacts.request import PlanRequest
    from planner.solve import plan
    from tests.chains import chain_profile, small_cluster

    prof = chain_profile([dict(fwd=1, bwd=2, params=1000, saved=1e6, inp=1e5, out=1e5)] * 4)
    return plan(prof, small_cluster(4), PlanRequest(global_batch=8))


CASES = [(1, False), (2, False), (4, False), (8, False), (2, True), (4, True), (8, True)]


@pytest.mark.parametrize(("t", "sp"), CASES)
@pytest.mark.parametrize("level", list(RecomputeLevel))
def test_materialised_block_saves_table_2_at_every_level(t, sp, level):
    prof = gpt_profile(layers=2, hidden=H, heads=A, seq=S, vocab=51200, attention="materialised")
    cm = device_cost_model(prof, CLUSTER, OptimizerKind.ADAM_MIXED, DeviceGroup(tp_degree=t, sequence_parallel=sp))
    assert level_bytes(cm, 1, level) == pytest.approx(table2(level, t, sp), rel=1e-12)


@pytest.mark.parametrize(("t", "sp"), CASES)
@pytest.mark.parametrize("level", list(RecomputeLevel))
def test_flash_block_saves_no_scores(t, sp, level):
    """FlashAttention: Table 2 without the ``5 a s^2 b`` scores, plus the fp32 log-sum-exp
    ``4 a s b`` (split like the heads) where nothing is recomputed; selective and full as Table 2."""
    prof = gpt_profile(layers=2, hidden=H, heads=A, seq=S, vocab=51200)
    assert prof.attention is AttentionKind.FLASH
    cm = device_cost_model(prof, CLUSTER, OptimizerKind.ADAM_MIXED, DeviceGroup(tp_degree=t, sequence_parallel=sp))
    want = table2(RecomputeLevel.SELECTIVE, t, sp) + 4 * A * S * B / t if level is RecomputeLevel.NONE else table2(level, t, sp)
    assert level_bytes(cm, 1, level) == pytest.approx(want, rel=1e-12)


def test_selective_level_costs_the_attention_core_and_flash_backward_recomputes_scores():
    """The selective level re-runs the attention core: its GEMMs at the device's GEMM model
    (scores and values products; FlashAttention's fused causal pair) plus the bytes it saves.
    FlashAttention's block differs from the materialised one by that pair (whose backward,
    2.5 x its forward, recomputes the scores) and by the s x s bytes it neither saves nor moves
    (twice them in backward)."""
    rates = device_rates("a100-80gb")
    mat = gpt_profile(layers=1, hidden=H, heads=A, seq=S, vocab=51200, attention="materialised").layers[1]
    fla = gpt_profile(layers=1, hidden=H, heads=A, seq=S, vocab=51200).layers[1]
    pair_mat, pair_fla = attention_gemms(S, A, H // A, False), attention_gemms(S, A, H // A, True)
    for b in FIT_SIZES:
        assert mat.attention_core.fwd.at(b) == pytest.approx(rates.gemms_ms(pair_mat, b) + 5 * A * S * S * b / rates.bytes_per_ms)
        assert fla.attention_core.fwd.at(b) == pytest.approx(rates.gemms_ms(pair_fla, b) + 4 * A * S * b / rates.bytes_per_ms)
        extra = (rates.gemms_ms(pair_fla, b, backward=True) - rates.gemms_ms(pair_mat, b, backward=True)
                 - 2 * 5 * A * S * S * b / rates.bytes_per_ms)
        assert fla.bwd_ms(b) - mat.bwd_ms(b) == pytest.approx(extra, rel=1e-6)
        assert fla.fwd_ms(b) < mat.fwd_ms(b)


def test_llama_profile_has_a_selective_level():
    cfg = {"model_type": "llama", "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512,
           "intermediate_size": 1024, "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 256}
    prof = llama_profile(cfg)
    block = prof.layers[1]
    assert prof.attention is AttentionKind.FLASH
    assert block.attention_core.saved_bytes_per_sample == 4 * 8 * 256  # the fp32 log-sum-exp
    assert prof.layers[0].attention_core is None and prof.layers[-1].attention_core is None


def test_attention_option_refuses_unknown_kinds():
    with pytest.raises(PlannerInputError, match="--attention must be one of"):
        gpt_profile(layers=1, hidden=64, heads=4, seq=8, vocab=10, attention="sparse")


def test_version_2_profile_loads_without_levels():
    doc = profile_to_json(gpt_profile(layers=1, hidden=64, heads=4, seq=8, vocab=10))
    old = json.loads(json.dumps(doc))
    old["version"] = 2
    old.pop("attention")
    old.pop("shared_saved")
    for layer in old["layers"]:
        layer.pop("attention_core")
        layer.pop("saved_bytes_fixed")
    got = profile_from_json(old)
    assert got.attention is AttentionKind.UNKNOWN and not got.shared_saved
    assert all(layer.attention_core is None and layer.saved_bytes_fixed == 0.0 for layer in got.layers)


def test_version_3_plan_loads_without_selective_recomputation(small_plan):
    doc = json.loads(json.dumps(plan_to_json(small_plan)))
    assert doc["version"] == 6
    doc["version"] = 3
    for stage in doc["stages"]:
        stage.pop("recompute_selective")
        stage.pop("optimizer_ms")  # version 5's
    got = plan_from_json(doc)
    assert all(s.recompute_selective == () for s in got.stages)
    assert got.stages == tuple(dataclasses.replace(s, optimizer_ms=0.0) for s in small_plan.stages)


def test_plan_stage_refuses_a_layer_at_two_levels(small_plan):
    doc = json.loads(json.dumps(plan_to_json(small_plan)))
    stage = doc["stages"][0]
    stage["recompute"] = [stage["layer_start"]]
    stage["recompute_selective"] = [stage["layer_start"]]
    with pytest.raises(PlannerInputError, match="both recompute and recompute_selective"):
        plan_from_json(doc, "p.json")


def test_solver_picks_selective_where_it_is_enough():
    """GPT-3 13B's shape at t = 8 with sequence parallelism and materialised attention, under a
    cap its scores do not fit: recomputing the attention cores of some blocks is what fits at
    least cost (cheaper than whole blocks, as Korthikanti et al. 2022 found), and the plan says
    which blocks, at which level."""
    from planner.artifacts.request import PlanRequest
    from planner.solve import plan

    prof = gpt_profile(layers=40, hidden=5120, heads=40, seq=2048, vocab=51200, attention="materialised")
    req = PlanRequest(global_batch=8, tp_degrees=(8,), sequence_parallel=(True,), zero_stages=(0,),
                      microbatch_sizes=(1,), memory_cap_bytes=28 * 1024**3)
    got = plan(prof, CLUSTER, req)
    assert got.layout.tp_degree == 8 and got.layout.num_stages == 1
    stage = got.stages[0]
    assert stage.recompute == () and len(stage.recompute_selective) > 0
    assert all(stage.recompute_level(i) is RecomputeLevel.SELECTIVE for i in stage.recompute_selective)
    assert stage.memory_total_bytes <= 28 * 1024**3 < stage.memory_total_bytes + stage.memory.activation_bytes
    roomy = plan(prof, CLUSTER, dataclasses.replace(req, memory_cap_bytes=32 * 1024**3))
    assert roomy.stages[0].recompute_selective == () and math.isfinite(roomy.predicted.iteration_ms)
    assert roomy.predicted.iteration_ms < got.predicted.iteration_ms


def test_profile_refuses_shared_storages_beyond_a_layers_saves():
    """A layer's storages shared with later layers are bytes it saves (outside its attention
    core): a profile listing more is refused, naming the layer (two copies of one pair once
    made a stage's bytes negative); each pair alone, and a storage three layers save listed
    a-b, b-c, load."""
    doc = profile_to_json(gpt_profile(layers=3, hidden=64, heads=4, seq=8, vocab=10))
    layers = doc["layers"]
    free = min(layer["saved_bytes_per_sample"] - (layer["attention_core"] or {}).get("saved_bytes_per_sample", 0.0)
               for layer in layers[1:4])
    pair = {"first": 1, "second": 2, "bytes_per_sample": 0.75 * free, "bytes_fixed": 0.0}
    chain = [pair, {**pair, "first": 2, "second": 3}]  # the middle layer's on both sides: fine
    assert len(profile_from_json({**doc, "shared_saved": chain}).shared_saved) == 2
    with pytest.raises(PlannerInputError, match=f"layer {layers[1]['name']!r} shares .* with later layers, more than"):
        profile_from_json({**doc, "shared_saved": [pair, pair]})
