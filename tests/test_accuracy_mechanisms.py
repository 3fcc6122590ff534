"""Issue 47's mechanisms, each checked where it acts (every test fails without its mechanism):
NCCL's collective latencies across nodes, send/receive latency between nodes, the host's time
to issue kernels, the job's slowest GPU, the plan's overhead terms and band, ZeRO 2 sharding
gradients at the peak, the context-parallel overlap flag, forced recomputation, the relaxation
of an over-recomputed plan, refusals that quote the layout asked for, cluster files written
before the memory correction, the named stacks, and the FLOP conventions."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from planner.artifacts.cluster import PRESETS, cluster_from_json, cluster_to_json, predates_memory_correction
from planner.artifacts.errors import InfeasibleError, PlannerInputError
from planner.artifacts.kinds import (
    AttentionKernel,
    CollectiveModel,
    OptimizerKind,
    OverheadKind,
    RecomputeMode,
    ScheduleKind,
    SelectiveUnit,
    SolverKind,
    ZeroStage,
)
from planner.artifacts.layout import Layout, Sharding
from planner.artifacts.plan import dumps_plan, plan_from_json
from planner.artifacts.request import PlanRequest
from planner.artifacts.stack import STACK_ALIASES, STACKS, Stack, stack_named
from planner.cost import CostModel
from planner.cost.attention_kernels import efficiency_of
from planner.cost.collectives import NCCL_NET_US, allreduce_line, link_of, nccl_line
from planner.cost.context import context_parallel_view
from planner.cost.host import KERNELS, host_floor_ms
from planner.cost.overheads import straggler_fraction, z_max
from planner.cost.stage import price_stage
from planner.cost.tensor_parallel import device_cost_model
from planner.models.flops import AttentionFlops, attention_fwd_flops, block_fwd_flops
from planner.profiling.analytic.gpt import gpt_profile
from planner.profiling.analytic.llama import llama_profile
from planner.simulation.simulator import simulate_summary
from planner.solve import plan
from planner.solve.build import rebuild_plan
from planner.solve.relax import relax_recompute

A100 = PRESETS["a100-80gb-x8"]
H100 = PRESETS["h100-80gb-x8"]
GIB = 1024**3


def _gpt(layers: int = 8, hidden: int = 1024, heads: int = 16, seq: int = 1024, device: str = "a100-80gb"):
    return gpt_profile(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=32000, device_preset=device)


# ---------------------------------------------------------------- collectives and send/receive


def test_nccl_rings_pay_a_network_latency_per_step_and_trees_take_over_across_many_nodes() -> None:
    """Across 4 nodes NCCL's ring (8.4 us + 2 x 3 NVLink x 3.4 us + 2 x 3 network x 14 us, x 1.4) is
    the faster at a 64 MiB bucket; across 64 nodes its 2 x 63 network steps make the tree (log2 64 =
    6 steps) the faster, at 0.92 x 0.8 of the bandwidth. Plain alpha-beta rings pay the cluster's
    5 us per step and never switch."""
    per_byte = 4e-8  # 25 GB/s
    ring4 = nccl_line(per_byte, 4, 4)
    assert ring4 == (per_byte, pytest.approx(1.4 * (8.4 + 2 * 3 * NCCL_NET_US) / 1e3))
    tree64 = nccl_line(per_byte, 64, 64)
    assert tree64[0] == pytest.approx(per_byte / (0.92 * 0.8))
    assert tree64[1] == pytest.approx((8.4 + 2 * 6 * NCCL_NET_US) / 1e3)
    cluster = H100.grown_to(8 * 64)
    ranks = range(0, 8 * 64, 8)  # one GPU of each of 64 nodes: a data-parallel group under t = 8
    plain = allreduce_line(dataclasses.replace(cluster, collective_model=CollectiveModel.ALPHA_BETA), ranks)
    assert plain[1] == pytest.approx(2 * 63 * cluster.inter_node_latency_us / 1e3)
    assert allreduce_line(cluster, ranks) == pytest.approx(nccl_line(plain[0], 64, 64))


def test_sends_between_nodes_take_nccls_measured_send_recv_time() -> None:
    cluster = A100.grown_to(16)
    assert link_of(cluster, 7, 8) == (cluster.inter_node_bandwidth_gb_per_s, 31.0)
    assert link_of(cluster, 0, 7) == (cluster.intra_node_bandwidth_gb_per_s, cluster.intra_node_latency_us)
    off = dataclasses.replace(cluster, inter_node_p2p_latency_us=0.0)
    assert link_of(off, 7, 8)[1] == cluster.inter_node_latency_us == 5.0


@pytest.mark.parametrize("nodes", [1, 4])
def test_the_tied_exchange_is_a_ring_allreduce_over_two_ranks(nodes: int) -> None:
    """A stage holding one end of the tied embedding exchanges its gradients with the other end's
    stage: a ring all-reduce over the two ranks on the cluster's slowest link, ``2 (d-1)/d x
    bytes/beta + 2 (d-1) alpha`` at d = 2 (Patarasuk & Yuan 2009, written out here), bit for bit."""
    cluster = A100.grown_to(8 * nodes)
    cm = CostModel(_gpt(layers=4), cluster)
    assert cm.profile.tied
    tied = cm.tied_allreduce_bytes(0, 2)
    bw, lat = ((cluster.inter_node_bandwidth_gb_per_s, cluster.inter_node_latency_us) if nodes > 1
               else (cluster.intra_node_bandwidth_gb_per_s, cluster.intra_node_latency_us))
    d = 2
    assert tied > 0
    assert cm.tied_exchange_ms(0, 2) == 2 * (d - 1) / d * tied / (bw * 1e9) * 1e3 + 2 * (d - 1) * lat / 1e3
    assert cm.tied_exchange_ms(1, 3) == 0.0  # no end of the tie in layers 1-2


# ---------------------------------------------------------------- host, straggler


def test_a_small_layer_is_host_bound_a_large_one_is_not() -> None:
    """A pass takes max(GPU time, kernels x host time per kernel): a 256-wide GPT block at 32
    tokens is host-bound (13 kernels x 10 us forward), a 4096-wide one at 2048 tokens is not; a
    stack without host time, or a measured profile, prices none."""
    small = gpt_profile(layers=2, hidden=256, heads=4, seq=32, vocab=512, device_preset="h100-80gb")
    cm = CostModel(small, H100, stack=STACKS["planner"])
    fwd, bwd = cm.at_batch(1).times_ms
    assert fwd[1] == pytest.approx(KERNELS["TransformerBlock"][0] * 10e-3)
    assert bwd[1] == pytest.approx(KERNELS["TransformerBlock"][1] * 10e-3)
    assert CostModel(small, H100, stack=STACKS["none"]).at_batch(1).times_ms[0][1] < fwd[1]
    big = _gpt(layers=2, hidden=4096, heads=32, seq=2048)
    f_big, _ = CostModel(big, A100, stack=STACKS["planner"]).at_batch(1).times_ms
    assert f_big[1] == pytest.approx(CostModel(big, A100, stack=STACKS["none"]).at_batch(1).times_ms[0][1])
    measured = dataclasses.replace(small, source="measured")
    assert not host_floor_ms(measured, 10.0)[0].any()


def test_the_slowest_gpu_share_grows_with_the_gpu_count() -> None:
    """Sinha et al.'s 8% spread over Summit's 27,648 GPUs: sigma z(N) behind the median."""
    shares = [straggler_fraction(A100, n) for n in (1, 8, 64, 16384)]
    assert shares[0] == 0.0
    assert shares[1] == pytest.approx(0.04 * z_max(8) / z_max(27648))
    assert 0.012 < shares[1] < shares[2] < shares[3] < 0.04
    assert straggler_fraction(PRESETS["local-cpu"], 64) == 0.0


def test_a_plan_is_its_replay_lengthened_by_the_straggler_share_and_names_its_overheads() -> None:
    prof = _gpt(layers=4)
    cluster = A100.grown_to(16)
    request = PlanRequest(global_batch=64, num_devices=16, tp_degrees=(1,), per_stage_replication=False)
    p = plan(prof, cluster, request)
    f = p.predicted.straggler_fraction
    assert f == pytest.approx(straggler_fraction(cluster, p.num_devices)) and f > 0
    assert p.predicted.iteration_ms == pytest.approx(simulate_summary(p).iteration_ms * (1 + f))
    terms = {t.kind: t for t in p.predicted.overheads}
    assert terms[OverheadKind.STRAGGLER].ms == pytest.approx(p.predicted.iteration_ms * f / (1 + f))
    assert "Sinha" in terms[OverheadKind.STRAGGLER].source
    assert OverheadKind.HOST in terms and "Holistic Trace Analysis" in terms[OverheadKind.HOST].source
    assert OverheadKind.NCCL_COLLECTIVES in terms and "tuning.cc" in terms[OverheadKind.NCCL_COLLECTIVES].source
    band = p.predicted.band
    assert band.iteration_low_ms <= p.predicted.iteration_ms <= band.iteration_high_ms
    assert band.peak_memory_high_bytes == p.predicted.peak_memory_bytes + GIB and band.fits
    assert {i.name for i in band.inputs} >= {"host time per kernel", "GPU speed variation"}
    again = plan_from_json(json.loads(dumps_plan(p)))
    assert again.predicted.overheads == p.predicted.overheads and again.predicted.band == band


# ---------------------------------------------------------------- ZeRO 2


def test_zero2_keeps_a_gradient_shard_at_the_peak_and_pays_a_reduce_scatter_every_micro_batch() -> None:
    prof = _gpt(layers=4)
    cm = CostModel(prof, A100, stack=STACKS["planner"])
    lay = Layout(num_stages=1, dp_degree=8, zero=ZeroStage.GRADIENTS)
    one = cm.stage_memory(0, prof.num_layers, (), 1, 1, Sharding(ZeroStage.OPTIMIZER, 8))
    two = cm.stage_memory(0, prof.num_layers, (), 1, 1, Sharding(ZeroStage.GRADIENTS, 8))
    assert two.grad_bytes == pytest.approx(one.grad_bytes / 8, rel=1e-6) and two.optimizer_bytes == one.optimizer_bytes
    fwd, bwd = cm.stage_fwd_ms(0, prof.num_layers, 1), cm.stage_bwd_ms(0, prof.num_layers, 1)
    r = cm.microbatch_reduce_ms(0, prof.num_layers, 0, lay)
    assert r > 0
    cost = price_stage(cm, 0, prof.num_layers, 1, 0, lay)
    assert (cost.fwd_ms, cost.bwd_ms) == pytest.approx((fwd, bwd + r))  # not overlapped
    overlapped = CostModel(prof, A100, stack=STACKS["megatron-core-0.8"])  # the reduce-scatter beside the compute
    f_o, b_o = overlapped.stage_fwd_ms(0, prof.num_layers, 1), overlapped.stage_bwd_ms(0, prof.num_layers, 1)
    r_o = overlapped.microbatch_reduce_ms(0, prof.num_layers, 0, lay)
    cost = price_stage(overlapped, 0, prof.num_layers, 1, 0, lay)
    assert (cost.fwd_ms, cost.bwd_ms) == pytest.approx((f_o, b_o + max(0.0, r_o - f_o - b_o)))
    one_lay = dataclasses.replace(lay, zero=ZeroStage.OPTIMIZER)
    assert price_stage(cm, 0, prof.num_layers, 1, 0, one_lay).bwd_ms == pytest.approx(bwd)


# ---------------------------------------------------------------- context parallelism


def test_context_parallel_overlap_is_its_own_flag() -> None:
    """A stack overlapping tensor-parallel collectives but not context-parallel ones exposes the K/V
    gathers; one overlapping only the context-parallel ones hides them."""
    prof = gpt_profile(layers=2, hidden=2048, heads=16, seq=8192, vocab=32000, device_preset="a100-80gb")
    cluster = A100.grown_to(16)
    tp_only = Stack(name="tp", tp_overlap_forward=True, tp_overlap_backward=True)
    cp_only = Stack(name="cp", cp_overlap=True)
    exposed = context_parallel_view(prof, cluster, 4, stack=tp_only).profile.layers[1]
    hidden = context_parallel_view(prof, cluster, 4, stack=cp_only).profile.layers[1]
    assert hidden.fwd.at(1) < exposed.fwd.at(1) and hidden.bwd.at(1) < exposed.bwd.at(1)


# ---------------------------------------------------------------- recomputation


def test_forced_recomputation_from_the_request() -> None:
    prof = _gpt(layers=6)
    blocks = [i for i, layer in enumerate(prof.layers) if layer.attention_core is not None]
    base = PlanRequest(global_batch=32, tp_degrees=(1,), per_stage_replication=False)
    full = plan(prof, A100, dataclasses.replace(base, recompute_mode=RecomputeMode.FULL))
    assert sorted(i for s in full.stages for i in s.recompute) == blocks
    assert not any(s.recompute_selective for s in full.stages)
    assert full.provenance.request.recompute_mode is RecomputeMode.FULL
    sel = plan(prof, A100, dataclasses.replace(base, recompute_mode=RecomputeMode.SELECTIVE))
    assert sorted(i for s in sel.stages for i in s.recompute_selective) == blocks and not any(s.recompute for s in sel.stages)
    none = plan(prof, A100, dataclasses.replace(base, recompute_mode=RecomputeMode.NONE))
    assert not any(s.recompute or s.recompute_selective for s in none.stages) and not none.provenance.request.recompute
    for p in (full, sel):
        assert p.predicted.peak_memory_bytes <= p.stages[0].memory_cap_bytes
    assert none.predicted.iteration_ms < sel.predicted.iteration_ms < full.predicted.iteration_ms


def test_a_plan_that_recomputes_more_than_it_needs_is_relaxed_against_the_simulator() -> None:
    """Every block of an interleaved plan recomputed with memory to spare: the relaxation keeps the
    layout and partition, recomputes fewer blocks, fits the cap, and is faster."""
    prof = _gpt(layers=8, hidden=2048, heads=16, seq=2048)
    cluster = A100.with_devices(4)
    request = PlanRequest(global_batch=16, num_devices=4, memory_cap_bytes=12 * GIB)
    lay = Layout(num_stages=8, virtual_stages_per_rank=2)
    starts = [0, 2, 3, 4, 5, 6, 7, 8]
    stops = starts[1:] + [prof.num_layers]
    full = [[i for i in range(a, b) if prof.layers[i].attention_core is not None] for a, b in zip(starts, stops)]
    heavy = rebuild_plan(prof, cluster, request, layout=lay, boundaries=starts, recompute=full, microbatch_size=1,
                         schedule=ScheduleKind.INTERLEAVED_1F1B, solver=SolverKind.DP)
    relaxed = relax_recompute(heavy, prof, cluster, request)
    assert sum(len(s.recompute) for s in relaxed.stages) < sum(len(s.recompute) for s in heavy.stages)
    assert relaxed.layout == heavy.layout and [s.layer_start for s in relaxed.stages] == starts
    assert relaxed.predicted.peak_memory_bytes <= 12 * GIB
    assert relaxed.predicted.iteration_ms < heavy.predicted.iteration_ms


# ---------------------------------------------------------------- refusals, cluster files, stacks


def test_a_refusal_quotes_the_layout_asked_for() -> None:
    prof = gpt_profile(layers=48, hidden=12288, heads=96, seq=2048, vocab=51200, device_preset="a100-80gb")
    request = PlanRequest(global_batch=64, dp_degree=8, zero_stages=(ZeroStage.GRADIENTS,), tp_degrees=(1,))
    with pytest.raises(InfeasibleError) as refused:
        plan(prof, A100, request)
    assert "P=1 x D=8, ZeRO-2" in str(refused.value) and "no ZeRO" not in str(refused.value).splitlines()[0]


def test_cluster_files_written_before_the_memory_correction_are_refused() -> None:
    old = dataclasses.replace(A100, device_memory_bytes=80 * 10**9)
    why = predates_memory_correction(old)
    assert "predates the correction" in why and str(A100.device_memory_bytes) in why
    with pytest.raises(PlannerInputError, match=r"old\.json: device_memory_bytes 80000000000"):
        cluster_from_json(cluster_to_json(old), "old.json")
    assert not predates_memory_correction(A100) and not predates_memory_correction(PRESETS["v100-16gb-2x8"])
    assert cluster_from_json(cluster_to_json(A100), "new.json") == A100


def test_stacks_name_their_sources_and_old_names_resolve() -> None:
    for name, stack in STACKS.items():
        assert stack.name == name
        if name != "none":
            assert stack.source_of("overlaps") and stack.source_of("host_us_per_kernel")
    for old, new in STACK_ALIASES.items():
        assert stack_named(old) is STACKS[new]
    assert STACKS["megatron-core-0.8"].cp_overlap and not STACKS["megatron-lm-2022"].cp_overlap
    with pytest.raises(ValueError, match="unknown stack 'mpi'"):
        stack_named("mpi")


# ---------------------------------------------------------------- FLOPs and selective units


def test_attention_flops_convention_is_a_stated_choice() -> None:
    """The causal half differs from the full square by s / (6h + s) of a block: 4% at 8k tokens and
    29% at 131k for a 16,384-wide model (Llama 3 405B)."""
    for seq, share in ((8192, 0.038), (131072, 0.286)):
        full, causal = block_fwd_flops(seq, 16384), block_fwd_flops(seq, 16384, AttentionFlops.CAUSAL)
        assert 1 - causal / full == pytest.approx(share, abs=1e-3)
    assert attention_fwd_flops(8, 4, AttentionFlops.CAUSAL) == attention_fwd_flops(8, 4) / 2


def test_torchtitans_op_level_checkpointing_keeps_less_than_none_and_recomputes_three_gemms() -> None:
    config = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 4096, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000, "max_position_embeddings": 8192}
    core = llama_profile(config, device_preset="a100-80gb").layers[1]
    ops = llama_profile(config, device_preset="a100-80gb", selective=SelectiveUnit.OPS).layers[1]
    s, h, kd, i = 8192, 4096, 1024, 14336
    assert ops.attention_core.saved_bytes_per_sample == pytest.approx(4 * s * h + 2 * s * kd + 6 * s * i)
    assert ops.attention_core.fwd.at(1) > 0
    assert ops.fwd == core.fwd and ops.saved_bytes_per_sample == core.saved_bytes_per_sample
    assert not math.isclose(ops.attention_core.saved_bytes_per_sample, core.attention_core.saved_bytes_per_sample)


def test_the_stacks_attention_kernel_prices_the_attention_at_its_measured_efficiency() -> None:
    """FlashAttention-2 reaches 29-35% of an H100's peak (Shah et al. 2024) where the GEMM model
    gives the fused pair ~65%: a stack running it pays more for a long-sequence block than one
    priced by the model, and Transformer Engine's cuDNN attention (50-75%) less than FA2; the
    band spans the kernel's measured range."""
    prof = gpt_profile(layers=2, hidden=2048, heads=16, seq=8192, vocab=32000, device_preset="h100-80gb")
    times = {}
    for kernel in AttentionKernel:
        stack = dataclasses.replace(STACKS["none"], attention_kernel=kernel)
        fwd, bwd = device_cost_model(prof, H100, OptimizerKind.ADAM_MIXED, stack=stack).at_batch(1).times_ms
        times[kernel] = float(fwd.sum() + bwd.sum())
    assert times[AttentionKernel.FLASH_ATTN_2] > times[AttentionKernel.TRANSFORMER_ENGINE] > 0
    assert times[AttentionKernel.FLASH_ATTN_2] > times[AttentionKernel.MODEL]
    fwd_eff, rate = efficiency_of(AttentionKernel.FLASH_ATTN_2, "h100-80gb")
    assert fwd_eff == pytest.approx(math.sqrt(0.29 * 0.35)) and rate == pytest.approx(math.sqrt(0.66 * 0.86))
    assert efficiency_of(AttentionKernel.FLASH_ATTN_2, "v100") is None
    p = plan(prof, H100, PlanRequest(global_batch=8, stack=STACKS["megatron-core-0.8"], tp_degrees=(1,)))
    assert any(i.name == "attention kernel" and i.low_ms < i.high_ms for i in p.predicted.band.inputs)
