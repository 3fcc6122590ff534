"""Device efficiency by GEMM shape (issue 19): planner.profiling.analytic.gemm, the analytic
layers built from it, their per-degree tensor-parallel entries and the overlap of
tensor-parallel collectives in the per-device view."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from planner.artifacts.cluster import PRESETS
from planner.artifacts.profile import profile_from_json, profile_to_json
from planner.cost.collectives import allreduce_line
from planner.cost.tensor_parallel import tensor_parallel_view
from planner.models.flops import block_fwd_flops, head_fwd_flops
from planner.profiling.analytic.common import DEVICE_PRESETS, FIT_SIZES, device_rates
from planner.profiling.analytic.gemm import DEVICE_GEMM, Gemm, GemmModel
from planner.profiling.analytic.gpt import attention_gemms, block_gemms, gpt_profile, head_gemms
from planner.profiling.analytic.llama import LlamaShape

MODEL = GemmModel(max_efficiency=0.8, half_intensity=100.0, memory_efficiency=0.5)


def test_efficiency_is_the_saturating_roofline_of_the_intensity() -> None:
    # a 4096 x 4096 x 4096 product: intensity 4096 / 3; a fused pair 1 / (1/m + 1/n)
    i = 4096 / 3
    assert MODEL.efficiency(4096, 4096, 4096) == pytest.approx(0.8 * i / (i + 100))
    assert MODEL.efficiency(4096, 4096, 128, fused=True) == pytest.approx(0.8 * 2048 / 2148)
    # growing any dimension never lowers the efficiency; the smallest one dominates
    assert MODEL.efficiency(8192, 768, 6144) > MODEL.efficiency(2048, 768, 6144) > MODEL.efficiency(2048, 96, 6144)
    assert MODEL.efficiency(1e9, 1e9, 1e9) == pytest.approx(0.8, rel=1e-6)


def test_block_gemms_count_the_published_flops() -> None:
    for s, h, a in ((2048, 12288, 96), (4096, 2048, 16), (2048, 6144, 64)):
        for flash in (False, True):
            assert sum(g.flops for g in block_gemms(s, h, a, flash)) == pytest.approx(block_fwd_flops(s, h))
        assert sum(g.flops for g in head_gemms(s, h, 51200)) == pytest.approx(head_fwd_flops(s, h, 51200))
    shape = LlamaShape(layers=2, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256,
                       seq=8192)
    assert sum(g.flops for g in shape.block_gemms()) == pytest.approx(shape.block_fwd_flops())


def test_gemm_time_is_at_its_shape_on_one_device_of_the_degree() -> None:
    # micro-batch 4 grows the batch dimension, degree 8 divides the split one: the FLOPs and the
    # efficiency are those of the per-device shape; backward twice the forward
    rates = device_rates("a100-80gb", MODEL)
    qkv = Gemm(name="qkv", m=2048, n=3 * 6144, k=6144, split="n")
    m, n, k = 8192, 3 * 6144 / 8, 6144
    want = 2 * m * n * k / (rates.peak_flops_per_ms * MODEL.efficiency(m, n, k))
    assert rates.gemm_ms(qkv, 4, 8) == pytest.approx(want)
    assert rates.gemm_ms(qkv, 4, 8, backward=True) == pytest.approx(2 * want)
    heads = Gemm(name="scores", m=2048, n=2048, k=96, count=64, batch="count", split="count")
    want = 2 * 2048 * 2048 * 96 * 32 / (rates.peak_flops_per_ms * MODEL.efficiency(2048, 2048, 96))
    assert rates.gemm_ms(heads, 4, 8) == pytest.approx(want)


def test_analytic_layer_is_its_gemms_and_bytes_at_the_fit_sizes() -> None:
    prof = gpt_profile(layers=2, hidden=1024, heads=16, seq=1024, vocab=1000, gemm=MODEL, attention="materialised")
    rates = device_rates("a100-80gb", MODEL)
    block = prof.layers[1]
    saved = block.saved_bytes_per_sample
    for b in FIT_SIZES:
        want = rates.gemms_ms(block_gemms(1024, 1024, 16), b) + saved * b / rates.bytes_per_ms
        assert block.fwd_ms(b) == pytest.approx(want)
        assert block.bwd_ms(b) == pytest.approx(2 * want)
    meta = prof.metadata
    assert (meta["gemm_max_efficiency"], meta["gemm_half_intensity_flop_per_byte"], meta["memory_efficiency"]) == (
        0.8, 100.0, 0.5)


def test_flash_block_and_its_attention_core_are_priced_by_their_gemms() -> None:
    """FlashAttention (the analytic default): the block is its GEMMs with the fused causal
    attention pair plus the 34 s h bytes its element-wise kernels move (no s x s tensor), its
    backward each GEMM's backward (the pair's 2.5 x) plus twice the bytes; the selective level
    re-runs the attention core: the same fused pair plus the core's saved bytes (4 a s, the
    log-sum-exp), which is all the block saves beyond 34 s h."""
    s, h, a = 1024, 1024, 16
    prof = gpt_profile(layers=2, hidden=h, heads=a, seq=s, vocab=1000, gemm=MODEL)
    rates = device_rates("a100-80gb", MODEL)
    block = prof.layers[1]
    assert block.saved_bytes_per_sample == pytest.approx(34.0 * s * h + 4.0 * a * s)
    core = block.attention_core
    assert core is not None and core.saved_bytes_per_sample == pytest.approx(4.0 * a * s)
    for b in FIT_SIZES:
        moved = 34.0 * s * h * b / rates.bytes_per_ms
        gemms = block_gemms(s, h, a, flash=True)
        assert block.fwd_ms(b) == pytest.approx(rates.gemms_ms(gemms, b) + moved)
        assert block.bwd_ms(b) == pytest.approx(rates.gemms_ms(gemms, b, backward=True) + 2 * moved)
        want_core = rates.gemms_ms(attention_gemms(s, a, h // a, flash=True), b) + 4.0 * a * s * b / rates.bytes_per_ms
        assert core.fwd.at(b) == pytest.approx(want_core)
    materialised = gpt_profile(layers=2, hidden=h, heads=a, seq=s, vocab=1000, gemm=MODEL, attention="materialised")
    assert materialised.layers[1].attention_core.saved_bytes_per_sample == pytest.approx(5.0 * a * s * s)


def test_split_degrees_price_the_per_device_shapes() -> None:
    """On one of t devices a block's split GEMMs have their per-device shape: the view's time at
    the fit sizes is the split GEMMs at that shape + the split bytes / t + the rest whole
    (materialised attention: its element-wise kernels move the saved bytes)."""
    prof = gpt_profile(layers=2, hidden=6144, heads=64, seq=2048, vocab=51200, gemm=MODEL, attention="materialised")
    rates = device_rates("a100-80gb", MODEL)
    cluster = PRESETS["a100-80gb-x8"]
    block = prof.layers[1]
    assert [d.degree for d in block.tp.degrees] == [2, 4, 8]
    view = tensor_parallel_view(prof, cluster, 8)
    per_byte, fixed = allreduce_line(cluster, tuple(range(8)))
    gemms = block_gemms(2048, 6144, 64)
    for b in (1, 8):
        split = rates.gemms_ms(gemms, b, 8, split=True) + block.tp.split_saved_bytes_per_sample * b / rates.bytes_per_ms / 8
        rest = (block.saved_bytes_per_sample - block.tp.split_saved_bytes_per_sample) * b / rates.bytes_per_ms
        coll = 2 * (fixed + per_byte * block.tp.collective_bytes_per_sample * b)
        assert view.layers[1].fwd_ms(b) == pytest.approx(split + rest + coll, rel=0.01)
    # smaller per-device GEMMs run less efficiently: more than 1/t of the time
    assert block.tp.degree(8).time_scale > block.tp.degree(2).time_scale > 1.0


def test_tensor_parallel_overlap_hides_at_most_the_gemm_beside_each_collective() -> None:
    prof = gpt_profile(layers=2, hidden=6144, heads=64, seq=2048, vocab=51200, gemm=MODEL)
    cluster = PRESETS["a100-80gb-x8"]
    plain = tensor_parallel_view(prof, cluster, 8)
    bwd_only = tensor_parallel_view(prof, cluster, 8, comm_overlap=(False, True))
    both = tensor_parallel_view(prof, cluster, 8, comm_overlap=(True, True))
    per_byte, fixed = allreduce_line(cluster, tuple(range(8)))
    block = prof.layers[1]
    entry = block.tp.degree(8)
    for b in (1, 8):
        coll = fixed + per_byte * block.tp.collective_bytes_per_sample * b
        split_bwd = block.tp.split_time_fraction * block.bwd_ms(b) * entry.time_scale / 8
        hidden = sum(min(coll, w * split_bwd) for w in entry.bwd_overlap)
        # what overlap hides, less the share of the GEMMs the collectives take (the preset's loss)
        saved = (1.0 - cluster.overlap_compute_loss) * hidden
        assert 0 < saved < hidden
        assert plain.layers[1].bwd_ms(b) - bwd_only.layers[1].bwd_ms(b) == pytest.approx(saved, rel=1e-9)
        assert bwd_only.layers[1].fwd_ms(b) == pytest.approx(plain.layers[1].fwd_ms(b))
        assert both.layers[1].fwd_ms(b) < plain.layers[1].fwd_ms(b)
        assert plain.layers[1].bwd_ms(b) - hidden >= plain.layers[1].bwd_ms(b) - 2 * coll  # at most the collectives


def test_profiles_record_the_fitted_constants_and_round_trip() -> None:
    for preset in DEVICE_PRESETS:
        model = DEVICE_GEMM[preset]
        assert model.fitted_on and model.source  # every shipped constant says where it comes from
        prof = gpt_profile(layers=2, hidden=512, heads=8, seq=256, vocab=100, device_preset=preset)
        assert prof.metadata["gemm_fitted_on"] == "; ".join(model.fitted_on)
        assert profile_from_json(profile_to_json(prof)) == prof


def test_the_recorded_constants_read_back_and_travel_to_worker_processes() -> None:
    # GemmModel.metadata is made with the model: of_metadata reads its constants back; a changed
    # model records its own; a pickled one (published_runs.py --jobs) keeps it
    for preset, model in DEVICE_GEMM.items():
        back = GemmModel.of_metadata(model.metadata)
        assert back is not None and back == GemmModel(max_efficiency=model.max_efficiency,
                                                      half_intensity=model.half_intensity,
                                                      memory_efficiency=model.memory_efficiency)
        assert device_rates(preset).metadata["gemm_max_efficiency"] == model.max_efficiency
        assert pickle.loads(pickle.dumps(model)).metadata == model.metadata
    halved = dataclasses.replace(MODEL, max_efficiency=0.4)
    assert halved.metadata["gemm_max_efficiency"] == 0.4 and MODEL.metadata["gemm_max_efficiency"] == 0.8
