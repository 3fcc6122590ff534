"""Issue 49: the newer device presets, precision as a plan choice (FP8 recipes priced by
``planner.cost.precision``), the optimizer-state precisions' memory in plans, and HSDP priced on
the links its groups span."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.artifacts.cluster import PRESETS, cluster_from_json, cluster_to_json
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import OptimizerKind, Precision, ScheduleKind, ZeroStage
from planner.artifacts.layout import Layout
from planner.artifacts.plan import plan_from_json, plan_to_json
from planner.artifacts.profile import load_profile
from planner.artifacts.request import PlanRequest
from planner.artifacts.stack import STACKS
from planner.cost import CostModel
from planner.cost.band import BandSetting, with_setting
from planner.cost.collectives import allreduce_line
from planner.cost.fsdp import hsdp_groups
from planner.cost.precision import (
    FP8_FIT_ROWS,
    FP8_GEMM_EFFICIENCY,
    QUANTISE_BYTES,
    at_precision,
    edge_blocks_of,
    precision_of,
    with_fp8_view,
)
from planner.cost.zero_comm import fsdp_line
from planner.profiling.analytic.gemm import DEVICE_GEMM, DEVICE_GEMM_LOSO
from planner.profiling.analytic.gpt import gpt_profile
from planner.profiling.analytic.llama import llama_profile
from planner.profiling.analytic.rebuild import rebuild_with
from planner.solve import plan
from planner.solve.space import Config

ROOT = Path(__file__).resolve().parents[1]
NEW = ("h200-141gb-x8", "b200-x8", "gb200-nvl72")


@pytest.mark.parametrize("name", NEW)
def test_new_presets_carry_sources_and_round_trip(name: str) -> None:
    c = PRESETS[name]
    for field in ("peak_tflops", "peak_fp8_tflops", "memory_bandwidth_gb_per_s", "device_memory_bytes",
                  "intra_node_bandwidth_gb_per_s", "inter_node_bandwidth_gb_per_s"):
        assert c.sources.get(field), f"{name}: {field} has no source"
    assert c.peak_fp8_tflops == pytest.approx(2 * c.peak_tflops, rel=1e-3)  # dense FP8 twice dense BF16 (1,979 / 989)
    assert cluster_from_json(json.loads(json.dumps(cluster_to_json(c)))) == c
    assert c.mxfp8 == (name != "h200-141gb-x8")
    if name == "gb200-nvl72":  # one NVLink domain of 72 GPUs: one "node"
        assert (c.num_nodes, c.devices_per_node) == (1, 72)


@pytest.mark.slow
@pytest.mark.parametrize("name", NEW)
def test_planner_plan_on_each_new_preset(name: str) -> None:
    out = subprocess.run([sys.executable, "-m", "planner", "plan", "--cluster", name, "--global-batch", "64"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "iteration" in out.stdout


def _block_gemm_share(precision: Precision, hidden: int, seq: int) -> tuple[float, float]:
    """(bf16, FP8) forward + backward ms of one block at micro-batch 1 on an H100 preset."""
    prof = gpt_profile(layers=2, hidden=hidden, heads=max(1, hidden // 128), seq=seq, vocab=1000,
                       device_preset="h100-80gb")
    fp8 = at_precision(prof, PRESETS["h100-80gb-x8"], precision)
    a, b = prof.layers[1], fp8.layers[1]
    return a.fwd_ms(1) + a.bwd_ms(1), b.fwd_ms(1) + b.bwd_ms(1)


@pytest.mark.parametrize("precision", [Precision.FP8_CURRENT, Precision.FP8_BLOCK])
def test_fp8_is_faster_at_large_shapes_and_quantisation_dominates_tiny_ones(precision: Precision) -> None:
    bf16, fp8 = _block_gemm_share(precision, hidden=8192, seq=4096)
    assert fp8 < 0.8 * bf16  # the GEMMs' share runs at the FP8 peak
    bf16, fp8 = _block_gemm_share(precision, hidden=128, seq=128)
    assert fp8 > bf16  # memory-bound casts cost more than the tiny GEMMs save


def test_current_scaling_quantises_with_more_bytes_than_block_scaling() -> None:
    assert QUANTISE_BYTES[Precision.FP8_CURRENT] > QUANTISE_BYTES[Precision.FP8_BLOCK]
    _, current = _block_gemm_share(Precision.FP8_CURRENT, hidden=1024, seq=1024)
    _, block = _block_gemm_share(Precision.FP8_BLOCK, hidden=1024, seq=1024)
    assert current > block


def test_fp8_keeps_head_embedding_and_edge_blocks_bf16_and_saves_fp8_inputs() -> None:
    config = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 1024, "num_attention_heads": 8,
              "num_key_value_heads": 8, "intermediate_size": 2816, "vocab_size": 1000, "max_position_embeddings": 512}
    prof = llama_profile(config, seq=512, device_preset="h100-80gb")
    cur = at_precision(prof, PRESETS["h100-80gb-x8"], Precision.FP8_CURRENT)
    blk = at_precision(prof, PRESETS["h100-80gb-x8"], Precision.FP8_BLOCK)
    for q in (cur, blk):
        assert q.layers[0] == prof.layers[0] and q.layers[-1] == prof.layers[-1]  # embedding, head
    # current scaling (Megatron-Bridge's recipe): the first and last block stay bf16
    assert cur.layers[1].fwd == prof.layers[1].fwd and cur.layers[4].fwd == prof.layers[4].fwd
    assert cur.layers[2].fwd != prof.layers[2].fwd
    assert blk.layers[1].fwd != prof.layers[1].fwd
    view = prof.layers[2].fp8
    assert view is not None
    assert blk.layers[2].saved_bytes_per_sample == pytest.approx(
        prof.layers[2].saved_bytes_per_sample - view.input_bytes_per_sample / 2)


def test_precision_refusals_name_the_device() -> None:
    prof = gpt_profile(layers=2, hidden=256, heads=4, seq=128, vocab=100, device_preset="h100-80gb")
    with pytest.raises(PlannerInputError, match="no FP8"):
        at_precision(prof, PRESETS["a100-80gb-x8"], Precision.FP8_CURRENT)
    with pytest.raises(PlannerInputError, match="MXFP8 needs Blackwell"):
        at_precision(prof, PRESETS["h100-80gb-x8"], Precision.MXFP8)
    assert precision_of(at_precision(prof, PRESETS["b200-x8"], Precision.MXFP8)) is Precision.MXFP8


def test_a_profile_without_an_fp8_view_is_refused_not_priced_as_bf16() -> None:
    """A profile whose layers carry no FP8 view (a measured one, or an analytic one written before
    the view existed) cannot be priced in FP8: the plan would be the bf16 one under an FP8 label."""
    prof = gpt_profile(layers=2, hidden=256, heads=4, seq=128, vocab=100, device_preset="h100-80gb")
    # as a measured profile: nothing to build it again from
    bare = dataclasses.replace(prof, source="measured",
                               layers=tuple(dataclasses.replace(layer, fp8=None) for layer in prof.layers))
    with pytest.raises(PlannerInputError, match="no FP8 view of its GEMMs"):
        plan(bare, PRESETS["h100-80gb-x8"], PlanRequest(global_batch=16, precisions=(Precision.FP8_CURRENT,)))
    assert plan(bare, PRESETS["h100-80gb-x8"], PlanRequest(global_batch=16)).precision is Precision.BF16


def test_a_plan_records_its_precision_and_any_picks_the_fastest() -> None:
    prof = gpt_profile(layers=4, hidden=2048, heads=16, seq=2048, vocab=1000, device_preset="h100-80gb")
    cluster = PRESETS["h100-80gb-x8"]
    bf16 = plan(prof, cluster, PlanRequest(global_batch=16, tp_degrees=(1,)))
    fp8 = plan(prof, cluster, PlanRequest(global_batch=16, tp_degrees=(1,), precisions=(Precision.FP8_CURRENT,)))
    both = plan(prof, cluster, PlanRequest(global_batch=16, tp_degrees=(1,),
                                           precisions=(Precision.BF16, Precision.FP8_CURRENT, Precision.FP8_BLOCK)))
    assert bf16.precision is Precision.BF16 and "precision" not in plan_to_json(bf16)  # bf16 plans as before
    assert fp8.precision is Precision.FP8_CURRENT
    assert fp8.predicted.iteration_ms < bf16.predicted.iteration_ms
    assert both.predicted.iteration_ms <= min(bf16.predicted.iteration_ms, fp8.predicted.iteration_ms) + 1e-9
    assert plan_from_json(plan_to_json(fp8)) == fp8


@pytest.mark.parametrize(("kind", "state_bytes"), [
    (OptimizerKind.ADAM_MIXED, 16), (OptimizerKind.ADAM_MIXED_BF16_MOMENTS, 12), (OptimizerKind.ADAM_BF16, 8)])
def test_plan_memory_follows_the_optimizer_state_precision(kind: OptimizerKind, state_bytes: int) -> None:
    prof = gpt_profile(layers=2, hidden=1024, heads=8, seq=512, vocab=1000, device_preset="h100-80gb")
    cm = CostModel(prof, PRESETS["h100-80gb-x8"], kind)
    mem = cm.stage_memory(0, prof.num_layers, (), 1, 1)
    params = cm.stage_param_count(0, prof.num_layers)
    assert mem.param_bytes + mem.grad_bytes + mem.optimizer_bytes == params * state_bytes
    assert cm.optimizer_step_ms(0, prof.num_layers) == pytest.approx(
        params * kind.step_bytes_per_param / (PRESETS["h100-80gb-x8"].memory_bandwidth_gb_per_s * 1e6))


def test_hsdp_gathers_inside_the_node_and_all_reduces_across_nodes() -> None:
    cluster = dataclasses.replace(PRESETS["a100-80gb-x8"], num_nodes=4)
    full = Layout(num_stages=1, dp_degree=32, zero=ZeroStage.PARAMETERS)
    hsdp = dataclasses.replace(full, shard_group_size=8)
    inside, across = hsdp_groups(hsdp, 0)
    assert inside == tuple(range(8)) and across == (0, 8, 16, 24)
    assert {cluster.node_of(r) for r in inside} == {0} and len({cluster.node_of(r) for r in across}) == 4
    intra = allreduce_line(cluster, inside)
    assert fsdp_line(cluster, hsdp) == pytest.approx((intra[0] / 2, intra[1] / 2))  # NVLink only
    assert fsdp_line(cluster, full)[0] > fsdp_line(cluster, hsdp)[0]  # the whole group crosses nodes
    prof = gpt_profile(layers=2, hidden=1024, heads=8, seq=512, vocab=1000, device_preset="a100-80gb")
    cm = CostModel(prof, cluster)
    params = cm.stage_param_count(0, prof.num_layers)
    per_byte, fixed = allreduce_line(cluster, across)
    assert cm.hsdp_allreduce_ms(0, prof.num_layers, 0, hsdp) == pytest.approx(per_byte * params * 2 / 8 + fixed)
    assert cm.hsdp_allreduce_ms(0, prof.num_layers, 0, full) == 0.0
    sharded = cm.stage_memory(0, prof.num_layers, (), 1, 1, full.sharding(0))
    grouped = cm.stage_memory(0, prof.num_layers, (), 1, 1, hsdp.sharding(0))
    assert grouped.optimizer_bytes == pytest.approx(4 * sharded.optimizer_bytes, rel=1e-6)  # 1/8 of it, not 1/32
    with pytest.raises(ValueError, match="shard_group_size"):
        Layout(num_stages=1, dp_degree=32, zero=ZeroStage.OPTIMIZER, shard_group_size=8)
    # the search's lower-ZeRO candidate of an HSDP configuration (least_zero) is plain ZeRO 1 over
    # the group, not an invalid layout (GPT-OSS 120B's own plan once stopped with this ValueError)
    c = Config(layout=hsdp, microbatch_size=1, num_microbatches=4, schedule=ScheduleKind.ONE_F_ONE_B)
    assert c.zero_variants(8).by_stage[ZeroStage.OPTIMIZER].layout.shard_group_size == 0
    assert c.zero_variants(8).by_stage[ZeroStage.OPTIMIZER].layout.zero is ZeroStage.OPTIMIZER
    assert c.zero_variants(8).by_stage[ZeroStage.PARAMETERS].layout == hsdp
    assert plan_from_json(plan_to_json(plan(prof, cluster, PlanRequest(global_batch=32, zero_stages=(3,), tp_degrees=(1,),
                                                                       cp_degrees=(1,), max_stages=1)))).layout.zero is ZeroStage.PARAMETERS


_SMALL_LLAMA = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 1024, "num_attention_heads": 8,
                "num_key_value_heads": 8, "intermediate_size": 2816, "vocab_size": 32000, "max_position_embeddings": 512}


def test_the_fp8_gemm_efficiency_is_measured_and_physical() -> None:
    """No FP8 row is fitted: the relative efficiency is the H100's measured maximum achievable matmul
    FLOPS in FP8 (1,402.6 of 1,979) over that in BF16 (794.5 of 989), below 1 as a GEMM's physics is."""
    assert FP8_FIT_ROWS == ()
    for precision in (Precision.FP8_CURRENT, Precision.FP8_BLOCK, Precision.MXFP8):
        assert FP8_GEMM_EFFICIENCY[precision] == pytest.approx((1402.6 / 1979.0) / (794.5 / 989.0))
        assert FP8_GEMM_EFFICIENCY[precision] < 1.0


def test_bf16_edge_blocks_as_the_caller_chose_them_survive_the_band_rebuild() -> None:
    """Megatron-Bridge's perf scripts run every block in FP8 (first_last_layers_bf16 off): chosen by the
    caller, recorded on the profile, kept where a band builds the profile again with other constants."""
    prof = llama_profile(_SMALL_LLAMA, seq=512, device_preset="h100-80gb")
    cluster = PRESETS["h100-80gb-x8"]
    recipe = at_precision(prof, cluster, Precision.FP8_CURRENT)
    every = at_precision(prof, cluster, Precision.FP8_CURRENT, bf16_edge_blocks=0)
    assert recipe.layers[1].fwd == prof.layers[1].fwd and every.layers[1].fwd != prof.layers[1].fwd
    assert every.layers[2].fwd == recipe.layers[2].fwd
    assert edge_blocks_of(every) == 0 and edge_blocks_of(recipe) is None
    other = DEVICE_GEMM_LOSO["h100-80gb"][0]
    banded, _, _ = with_setting(BandSetting(gemm=other), every, cluster, STACKS["megatron-core-0.8"])
    direct = at_precision(llama_profile(_SMALL_LLAMA, seq=512, device_preset="h100-80gb", gemm=other), cluster,
                          Precision.FP8_CURRENT, bf16_edge_blocks=0)
    assert banded.layers[1].fwd == direct.layers[1].fwd != prof.layers[1].fwd


def test_fused_cross_entropy_moves_fewer_bytes_and_keeps_bf16_logits() -> None:
    """Transformer Engine's fused cross entropy (6 + 4 bytes per token and vocabulary entry on bf16
    logits) in place of torch's fp32 one (22 + 14), the bf16 gradient buffer kept (2 s V, not 4 s V);
    the blocks are untouched and a rebuild keeps the choice."""
    torch_ce = llama_profile(_SMALL_LLAMA, seq=512, device_preset="h100-80gb")
    te_ce = llama_profile(_SMALL_LLAMA, seq=512, device_preset="h100-80gb", fused_cross_entropy=True)
    a, b = torch_ce.layers[-1], te_ce.layers[-1]
    assert b.fwd_ms(1) < a.fwd_ms(1) and b.bwd_ms(1) < a.bwd_ms(1)
    assert a.saved_bytes_per_sample - b.saved_bytes_per_sample == pytest.approx(2.0 * 512 * 32000)
    assert te_ce.layers[:-1] == torch_ce.layers[:-1]
    rebuilt = rebuild_with(te_ce, DEVICE_GEMM["h100-80gb"])
    assert rebuilt is not None and rebuilt.layers == te_ce.layers


@pytest.mark.parametrize("name", ["llama-3-8b-h100", "gpt3-1.3b-h100"])
def test_a_shipped_analytic_profile_gets_its_fp8_view_at_load_time(name: str) -> None:
    """Profiles written before Layer.fp8: the view derived by building them again from what they
    record, only where the rebuilt layers are theirs; the file is not touched, an A100 one gets none
    (no FP8), and one whose layers differ from the rebuild is refused as before."""
    path = ROOT / "profiles" / f"{name}.json"
    before = path.read_bytes()
    shipped = load_profile(path)
    assert not any(layer.fp8 for layer in shipped.layers)
    viewed = with_fp8_view(shipped)
    blocks = [layer for layer in viewed.layers if layer.fp8 is not None]
    assert len(blocks) == len(viewed.layers) - 2  # every block; the embedding and the head stay bf16
    assert [dataclasses.replace(layer, fp8=None) for layer in viewed.layers] == list(shipped.layers)
    assert path.read_bytes() == before
    fp8 = plan(shipped, PRESETS["h100-80gb-x8"], PlanRequest(global_batch=16, precisions=(Precision.FP8_CURRENT,)))
    bf16 = plan(shipped, PRESETS["h100-80gb-x8"], PlanRequest(global_batch=16))
    assert fp8.precision is Precision.FP8_CURRENT and fp8.predicted.iteration_ms < bf16.predicted.iteration_ms
    a100 = load_profile(ROOT / "profiles" / f"{name.rsplit('-', 1)[0]}-a100.json")
    assert with_fp8_view(a100) is a100
    block = shipped.layers[1]
    other = dataclasses.replace(block, fwd=dataclasses.replace(block.fwd, per_sample_ms=block.fwd.per_sample_ms * 1.01))
    edited = dataclasses.replace(shipped, layers=(shipped.layers[0], other, *shipped.layers[2:]))
    assert with_fp8_view(edited) is edited
    with pytest.raises(PlannerInputError, match="no FP8 view of its GEMMs"):
        plan(edited, PRESETS["h100-80gb-x8"], PlanRequest(global_batch=16, precisions=(Precision.FP8_CURRENT,)))


def test_tensor_parallel_overlap_windows_shrink_with_the_fp8_gemms() -> None:
    """A collective hides behind the GEMMs beside it: in FP8 they run 1 / speedup as long, so its window
    (a fraction of the layer's re-priced split work) is the bf16 one x (bf16 / FP8 layer time) / speedup."""
    prof = llama_profile(_SMALL_LLAMA, seq=512, device_preset="h100-80gb")
    cluster = PRESETS["h100-80gb-x8"]
    fp8 = at_precision(prof, cluster, Precision.FP8_BLOCK)
    a, b = prof.layers[2], fp8.layers[2]
    assert a.tp is not None and b.tp is not None and a.tp.degrees
    speedup = cluster.peak_fp8_tflops / cluster.peak_tflops * FP8_GEMM_EFFICIENCY[Precision.FP8_BLOCK]
    for da, db in zip(a.tp.degrees, b.tp.degrees):
        assert db.fwd_overlap == pytest.approx([w * a.fwd_ms(1) / b.fwd_ms(1) / speedup for w in da.fwd_overlap])
        assert db.bwd_overlap == pytest.approx([w * a.bwd_ms(1) / b.bwd_ms(1) / speedup for w in da.bwd_overlap])
        assert all(x < y for x, y in zip(db.fwd_overlap, da.fwd_overlap))


def test_routed_experts_run_their_grouped_gemms_in_fp8() -> None:
    """An MoE block's routed experts (Layer.moe, outside Layer.fp8): their grouped GEMMs' bf16 time x (1 -
    1 / speedup) saved, the casts of their inputs (s k (h + F)) and output gradients (s k (2F + h)) added,
    their inputs kept in FP8 (s k (h + F) bytes fewer); the dispatch stays bf16."""
    from planner.profiling.analytic.grouped import expert_gemm_ms
    from planner.profiling.analytic.moe import moe_profile

    config = json.loads((ROOT / "configs" / "qwen3-30b-a3b.json").read_text())
    prof = moe_profile(config, seq=4096, device_preset="h100-80gb", model="qwen3-30b-a3b")
    cluster = PRESETS["h100-80gb-x8"]
    fp8 = at_precision(prof, cluster, Precision.FP8_CURRENT, bf16_edge_blocks=0)
    i = next(j for j, layer in enumerate(prof.layers) if layer.moe is not None)
    a, b = prof.layers[i].moe, fp8.layers[i].moe
    assert a is not None and b is not None
    s, k, e, h, f = a.tokens_per_sample, a.top_k, a.num_experts, a.hidden, a.expert_ffn_hidden
    speedup = cluster.peak_fp8_tflops / cluster.peak_tflops * FP8_GEMM_EFFICIENCY[Precision.FP8_CURRENT]
    ms_per_byte = 1.0 / (cluster.memory_bandwidth_gb_per_s * 1e6 * float(prof.metadata["memory_efficiency"]))
    gemm = expert_gemm_ms(DEVICE_GEMM["h100-80gb"], cluster.peak_tflops * 1e9, tokens_per_expert=8 * s * k / e, experts=e,
                          hidden=h, ffn=f)
    quant = 8 * 2.0 * s * k * (h + f) * QUANTISE_BYTES[Precision.FP8_CURRENT] * ms_per_byte
    assert b.expert_fwd.at(8) == pytest.approx(a.expert_fwd.at(8) - (1 - 1 / speedup) * gemm + quant, rel=1e-6)
    assert a.expert_saved_bytes_per_sample - b.expert_saved_bytes_per_sample == pytest.approx(s * k * (h + f))
    assert b.dispatch_bytes_per_element == 2
    # the layer's time moves by the experts' change plus its own FP8 view's (the attention's GEMMs)
    assert prof.layers[i].fp8 is not None and fp8.layers[i].fwd.at(8) - b.expert_fwd.at(8) != pytest.approx(
        prof.layers[i].fwd.at(8) - a.expert_fwd.at(8))
