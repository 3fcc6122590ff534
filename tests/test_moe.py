"""Mixture-of-experts planned and priced (issue 48 items 1a, 1b, 2, 3, 4): the expert layout's
ranks, the analytic MoE profiles against the shapes transformers builds, the per-device expert
view of the cost model (grouped GEMMs, dispatch and combine, memory), the experts' state and
gradients over their own group, DP = brute force with experts, and the search over EP and ETP."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from planner.artifacts.cluster import PRESETS
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import OptimizerKind, ScheduleKind, SolverKind, ZeroStage
from planner.artifacts.layout import EXPERT_MESH_DIMS, DeviceGroup, Layout, Sharding
from planner.artifacts.moe import MoeBalance, MoeDispatcher, MoeStack
from planner.artifacts.plan import plan_from_json, plan_to_json
from planner.artifacts.profile import profile_from_json, profile_to_json
from planner.artifacts.request import PlanRequest
from planner.artifacts.stack import STACKS
from planner.cost.expert_degrees import candidate_expert_degrees
from planner.cost.experts import alltoall_ms, expert_links, remote_nodes
from planner.cost.tensor_parallel import device_cost_model, strip_experts
from planner.profiling.analytic.moe import moe_profile
from planner.solve import plan as solve
from planner.solve.bruteforce import solve_chain_bruteforce
from planner.solve.build import rebuild_plan
from planner.solve.chain_dp import solve_chain
from planner.solve.prices import StageTable

REPO = Path(__file__).resolve().parents[1]
H100 = PRESETS["h100-80gb-x8"]
ADAM = OptimizerKind.ADAM_MIXED_FP32_GRAD

#: a Qwen3-MoE shape small enough for the oracles: 4 layers of 8 experts, top-2
TINY = {"model_type": "qwen3_moe", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512, "moe_intermediate_size": 128,
        "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 1024, "max_position_embeddings": 256}


def config(name: str) -> dict[str, object]:
    data = json.loads((REPO / "configs" / f"{name}.json").read_text())
    assert isinstance(data, dict)
    return data


def tiny(**kw: object) -> dict[str, object]:
    return {**TINY, **kw}


# ---------------------------------------------------------------- the layout


@pytest.mark.parametrize("tp,cp,dp,ep,etp", [(2, 1, 16, 32, 1), (2, 1, 4, 8, 1), (4, 1, 8, 8, 1), (2, 2, 4, 4, 2),
                                             (1, 1, 8, 2, 4)])
def test_expert_ranks_fold_over_each_pipeline_rank(tp: int, cp: int, dp: int, ep: int, etp: int) -> None:
    """Megatron-Core's expert order tp-ep-dp-pp over the same ranks: within a pipeline rank's block,
    etp innermost, then ep, then edp; the ep, etp and edp groups each partition the block, and
    expert_coordinates inverts expert_rank_of."""
    lay = Layout(num_stages=2, dp_degree=dp, tp_degree=tp, cp_degree=cp, sequence_parallel=tp > 1, ep_degree=ep,
                 etp_degree=etp, zero=ZeroStage.OPTIMIZER)
    n = tp * cp * dp
    assert lay.edp_degree == n // (ep * etp) and EXPERT_MESH_DIMS == ("pp", "edp", "ep", "etp")
    assert lay.expert_mesh_shape == (2, lay.edp_degree, ep, etp)
    for s in range(2):
        block = set(lay.stage_ranks(s))
        for groups in ([lay.ep_group(s, d, k) for d in range(lay.edp_degree) for k in range(etp)],
                       [lay.etp_group(s, d, e) for d in range(lay.edp_degree) for e in range(ep)],
                       [lay.edp_group(s, e, k) for e in range(ep) for k in range(etp)]):
            seen = [r for g in groups for r in g]
            assert sorted(seen) == sorted(block) and len(seen) == len(block)
        assert lay.etp_group(s) == tuple(range(s * n, s * n + etp))  # consecutive, inside a node
        for r in block:
            p, d, e, k = lay.expert_coordinates(r)
            assert lay.expert_rank_of(stage_idx=s, edp_index=d, ep_index=e, etp_index=k) == r and p == s
    assert lay.sharding(0) == Sharding(ZeroStage.OPTIMIZER, dp * cp, lay.edp_degree if lay.edp_degree != dp * cp else 0)
    assert f"experts EP={ep} x ETP={etp} x EDP={lay.edp_degree}" in lay.describe()


def test_expert_layout_refusals_name_the_values() -> None:
    with pytest.raises(ValueError, match=r"ep_degree 16 x etp_degree 1 must divide .* = 8 devices"):
        Layout(num_stages=1, dp_degree=4, tp_degree=2, ep_degree=16)
    with pytest.raises(ValueError, match=r"per-stage replication .* needs ep_degree 1"):
        Layout(num_stages=2, stage_replicas=(2, 2), ep_degree=2)
    group = DeviceGroup(tp_degree=2, ep_degree=32)
    assert group.dp_multiple == 16 and group.admits(16) and not group.admits(8)


def test_plan_file_keeps_expert_degrees_and_dense_files_are_unchanged() -> None:
    profile = moe_profile(tiny(), seq=256, device_preset="h100-80gb")
    cluster = H100.with_devices(8)
    request = PlanRequest(global_batch=16, optimizer=ADAM, stack=STACKS["megatron-core-0.8"])
    lay = Layout(num_stages=2, dp_degree=2, tp_degree=2, sequence_parallel=True, ep_degree=4, zero=ZeroStage.OPTIMIZER)
    p = rebuild_plan(profile, cluster, request, layout=lay, boundaries=(0, 3), recompute=((), ()), microbatch_size=2,
                     schedule=ScheduleKind.ONE_F_ONE_B, solver=SolverKind.GIVEN)
    doc = plan_to_json(p)
    assert doc["ep_degree"] == 4 and "etp_degree" not in doc and all(st["alltoall_ms"] > 0 for st in doc["stages"])
    assert plan_from_json(json.loads(json.dumps(doc))).layout == lay
    dense = dataclasses.replace(lay, ep_degree=1)
    assert "ep_degree" not in json.dumps(plan_to_json(dataclasses.replace(p, layout=dense)))


# ---------------------------------------------------------------- the profiles


@pytest.mark.parametrize("name,total,active", [
    ("qwen3-235b-a22b", 235_093_634_560, 22.2e9), ("qwen3-30b-a3b", 30_532_122_624, 3.35e9),
    ("mixtral-8x7b", 46_702_792_704, 12.9e9), ("gpt-oss-120b", 116_829_156_672, 5.7e9)])
def test_parameters_as_published(name: str, total: int, active: float) -> None:
    """Parameters from the shapes, exactly what transformers builds from the same config (checked
    in test_parameters_are_what_transformers_builds), and the active ones as published: Qwen3
    22B and 3.3B (Qwen Team 2025 table 2), Mixtral 12.9B (Jiang et al. 2024), gpt-oss-120b 5.1B
    without its 0.58B embedding (OpenAI 2025 table 1)."""
    meta = moe_profile(config(name), seq=4096, device_preset="h100-80gb").metadata
    assert meta["param_count"] == total
    assert meta["active_param_count"] == pytest.approx(active, rel=0.01)


@pytest.mark.hf
@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-120b", "deepseek-v3"])
def test_parameters_are_what_transformers_builds(name: str) -> None:
    """Qwen3MoeConfig, MixtralConfig, GptOssConfig and DeepseekV3Config of the installed
    transformers build (on the meta device: no memory) exactly the profile's parameters;
    DeepSeek-V3's multi-token-prediction module, which transformers does not build, apart."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    data = config(name)
    cfg = transformers.AutoConfig.for_model(**{k: v for k, v in data.items() if not k.startswith("_")})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    built = sum(p.numel() for p in model.parameters())
    profile = moe_profile(data, seq=4096, device_preset="h100-80gb")
    shared = sum(t.param_count for t in profile.tied if "mtp" in t.name)  # its embedding: the main model's
    mtp = sum(layer.param_count for layer in profile.layers if layer.name.startswith("mtp_")) - shared
    assert profile.metadata["param_count"] - mtp == built


def test_moe_layer_fields_are_consistent_and_round_trip() -> None:
    profile = moe_profile(config("deepseek-v3"), seq=4096, device_preset="h100-80gb")
    names = profile.layer_names
    assert names[:5] == ("embed", "block_0", "block_1", "block_2", "block_3") and names[-2:] == ("mtp_0", "head")
    assert [profile.layers[i].moe is None for i in (1, 2, 3, 4)] == [True, True, True, False]  # 3 dense layers
    moe = profile.layers[4].moe
    assert moe is not None and (moe.num_experts, moe.top_k, moe.max_nodes_per_token, moe.shared_experts) == (256, 8, 4, 1)
    assert moe.expert_param_count == 256 * 3 * 7168 * 2048
    assert profile.tied[0].layers == (0, names.index("mtp_0"))  # the MTP module shares the embedding table
    again = profile_from_json(json.loads(json.dumps(profile_to_json(profile))))
    assert again == profile
    # a routed-expert part larger than its layer is refused, naming the field
    bad = profile_to_json(profile)
    bad["layers"][4]["moe"]["expert_param_count"] = bad["layers"][4]["param_count"] + 1
    with pytest.raises(PlannerInputError, match="expert_param_count exceeds param_count"):
        profile_from_json(bad)


def test_flops_count_each_active_expert() -> None:
    """Model FLOPs per token: 3 x forward, the routed experts counted per active expert (top-k x
    6 h F, Megatron-LM's convention): Qwen3-235B-A22B ~ 6 x 21.6B active matmul parameters plus
    attention's full s x s square (12 L s a d = 37.9 GFLOP at 4,096 tokens)."""
    profile = moe_profile(config("qwen3-235b-a22b"), seq=4096, device_preset="h100-80gb")
    per_token = profile.model_flops_per_sample / 4096
    matmul = profile.metadata["active_param_count"] - 151936 * 4096  # the embedding is a lookup
    assert per_token == pytest.approx(6 * matmul + 12 * 94 * 4096 * 64 * 128, rel=0.002)


# ---------------------------------------------------------------- the cost model's expert view


def _cm(group: DeviceGroup, nodes: int = 1, **moe: object):  # type: ignore[no-untyped-def]
    profile = moe_profile(config("qwen3-235b-a22b"), seq=4096, device_preset="h100-80gb")
    stack = dataclasses.replace(STACKS["megatron-core-0.8"], moe=MoeStack(**moe))  # type: ignore[arg-type]
    return device_cost_model(profile, dataclasses.replace(H100, num_nodes=nodes), ADAM, group, stack), profile


def test_expert_view_per_device_terms() -> None:
    """Per device: the experts' parameters / (ep etp); their time at the device's share of the
    tokens; no dispatch with every expert local; the view's layers keep the profile's names."""
    one, profile = _cm(DeviceGroup(tp_degree=2, sequence_parallel=True))
    eight, _ = _cm(DeviceGroup(tp_degree=2, sequence_parallel=True, ep_degree=8))
    moe = profile.layers[5].moe
    assert moe is not None
    assert one.profile.layers[5].moe.alltoall_fwd.at(1) == 0.0  # type: ignore[union-attr]
    assert eight.profile.layers[5].moe.expert_param_count == moe.expert_param_count // 8  # type: ignore[union-attr]
    assert eight.profile.layer_names == profile.layer_names
    assert eight.profile.layers[5].moe.alltoall_fwd.at(1) > 0  # type: ignore[union-attr]
    # the experts' compute on a device does not grow with ep (tokens per expert do: more efficient GEMMs)
    assert eight.profile.layers[5].moe.expert_fwd.at(1) < one.profile.layers[5].moe.expert_fwd.at(1)  # type: ignore[union-attr]


def test_dispatch_across_nodes_costs_more_and_deepep_moves_fewer_bytes() -> None:
    """NCCL's all-to-all: inside a node on NVLink, across nodes on the network; DeepEP sends a token
    once per remote node (fewer bytes), node-limited routing fewer still; a skew loads the
    busiest rank."""
    cluster = dataclasses.replace(H100, num_nodes=4)
    moe = moe_profile(config("qwen3-235b-a22b"), seq=4096, device_preset="h100-80gb").layers[5].moe
    assert moe is not None
    inside, across = (expert_links(cluster, DeviceGroup(tp_degree=2, ep_degree=ep)) for ep in (8, 32))
    nccl, deepep = MoeStack(), MoeStack(dispatcher=MoeDispatcher.DEEPEP)
    assert (inside.nodes, inside.per_node, across.nodes, across.per_node) == (1, 8, 4, 8)
    copies = 2048 * 8
    assert alltoall_ms(cluster, across, moe, nccl, copies) > 5 * alltoall_ms(cluster, inside, moe, nccl, copies)
    assert alltoall_ms(cluster, across, moe, deepep, copies) < alltoall_ms(cluster, across, moe, nccl, copies)
    # 8 of 128 experts over 4 nodes: 1 - C(96, 8) / C(128, 8) = 0.9066 of each node reached, 3 of them remote
    assert remote_nodes(128, 8, 4) == pytest.approx(4 * (1 - 0.09336) * 3 / 4, rel=1e-3)
    assert remote_nodes(256, 8, 8, max_nodes=4) < remote_nodes(256, 8, 8)
    skewed = MoeStack(balance=MoeBalance.DROPLESS, skew=0.5)
    assert alltoall_ms(cluster, across, moe, skewed, copies) == pytest.approx(
        1.5 * (alltoall_ms(cluster, across, moe, nccl, copies) - 0.005) + 0.005)


def test_overlap_hides_dispatch_behind_the_other_micro_batch() -> None:
    plain, _ = _cm(DeviceGroup(tp_degree=2, sequence_parallel=True, ep_degree=32), nodes=4,
                   dispatcher=MoeDispatcher.DEEPEP)
    over, _ = _cm(DeviceGroup(tp_degree=2, sequence_parallel=True, ep_degree=32), nodes=4,
                  dispatcher=MoeDispatcher.DEEPEP, a2a_overlap=True)
    a, b = plain.profile.layers[5], over.profile.layers[5]
    assert b.fwd_ms(1) + b.bwd_ms(1) < a.fwd_ms(1) + a.bwd_ms(1)
    assert b.moe.alltoall_fwd.at(1) < a.moe.alltoall_fwd.at(1)  # type: ignore[union-attr]


def test_strip_experts_leaves_the_rest() -> None:
    profile = moe_profile(tiny(), seq=256, device_preset="h100-80gb")
    rest = strip_experts(profile)
    layer, stripped = profile.layers[2], rest.layers[2]
    assert layer.moe is not None and stripped.moe is None
    assert stripped.param_count == layer.param_count - layer.moe.expert_param_count
    assert stripped.fwd_ms(1) == pytest.approx(layer.fwd_ms(1) - layer.moe.expert_fwd.at(1))


def test_expert_state_and_gradients_over_their_own_group() -> None:
    """ZeRO 1 shards the experts' optimizer state over EDP and the rest over dp x cp; with EDP = 1
    the experts' gradients are not synchronised at all."""
    profile = moe_profile(tiny(), seq=256, device_preset="h100-80gb")
    cluster = H100.with_devices(8)
    group = DeviceGroup(tp_degree=2, sequence_parallel=True, ep_degree=8)
    cm = device_cost_model(profile, cluster, ADAM, group, STACKS["megatron-core-0.8"])
    lay = Layout(num_stages=1, dp_degree=4, tp_degree=2, sequence_parallel=True, ep_degree=8, zero=ZeroStage.OPTIMIZER)
    sharding = lay.sharding(0)
    assert (sharding.ranks, sharding.expert_shards) == (4, 1)
    n = cm.num_layers
    experts, params = cm.stage_expert_param_count(0, n), cm.stage_param_count(0, n)
    memory = cm.stage_memory(0, n, (), 1, 1, sharding)
    assert memory.optimizer_bytes == int((params - experts) * 12 / 4 + experts * 12)
    assert cm.stage_state_bytes(0, n, sharding) == pytest.approx(
        (params - experts) * (2 + 4 + 12 / 4) + experts * (2 + 4 + 12))
    assert cm.expert_grad_line(lay, 0) == (0.0, 0.0)
    wider = dataclasses.replace(lay, ep_degree=2)
    assert wider.edp_degree == 4 and cm.has_experts


# ---------------------------------------------------------------- the solvers


@pytest.mark.parametrize("zero,ep", [(ZeroStage.NONE, 2), (ZeroStage.OPTIMIZER, 4), (ZeroStage.PARAMETERS, 2)])
def test_dp_equals_brute_force_with_experts(zero: ZeroStage, ep: int) -> None:
    """The chain DP's tables (expert state, the experts' synchronisation on their own line, ZeRO 3's
    expert gathers) against the brute force, which prices each stage from the cost model."""
    profile = moe_profile(tiny(num_hidden_layers=3), seq=256, device_preset="h100-80gb")
    cluster = H100.with_devices(8)
    group = DeviceGroup(ep_degree=ep)
    cm = device_cost_model(profile, cluster, ADAM, group, STACKS["megatron-core-0.8"])
    lay = group.layout(num_stages=2, dp_degree=4, zero=zero)
    full = cm.stage_memory(0, cm.num_layers, (), 2, 2, lay.sharding(0)).total_bytes
    solved = 0
    for cap in (full * 2, full * 0.6):
        line = cm.fsdp_line(lay) if zero is ZeroStage.PARAMETERS else (0.0, 0.0)
        table = StageTable(cm, 2, cap, sharding=lay.sharding(0), fsdp_line=line)
        dp = solve_chain(table, layout=lay, num_microbatches=4, schedule=ScheduleKind.ONE_F_ONE_B)
        bf = solve_chain_bruteforce(table.question, layout=lay, num_microbatches=4, schedule=ScheduleKind.ONE_F_ONE_B)
        assert (dp is None) == (bf is None)
        if dp is not None and bf is not None:
            assert dp.objective_ms == pytest.approx(bf.objective_ms, rel=1e-9)
            solved += 1
    assert solved == 2  # both caps fit some partition (the tighter one by recomputing)


def test_search_picks_an_expert_layout_and_prints_its_all_to_all(capsys: pytest.CaptureFixture[str]) -> None:
    """A model whose experts do not fit whole on a device: the search spreads them (EP > 1), the plan
    records the layout, and the table prints the dispatch and combine."""
    from planner.report.table import format_plan

    profile = moe_profile(tiny(num_experts=64, moe_intermediate_size=2048), seq=256, device_preset="h100-80gb")
    cluster = H100.with_devices(8)
    request = PlanRequest(global_batch=32, memory_cap_bytes=int(1.0 * 2**30), stack=STACKS["megatron-core-0.8"],
                          schedules=(ScheduleKind.ONE_F_ONE_B,), cp_degrees=(1,))
    p = solve(profile, cluster, request)
    assert p.layout.ep_degree * p.layout.etp_degree > 1
    text = format_plan(p)
    assert "a2a ms" in text and f"EP={p.layout.ep_degree}" in text
    assert p.predicted.peak_memory_bytes <= request.memory_cap_bytes


def test_expert_degrees_asked_for_are_checked() -> None:
    profile = moe_profile(tiny(), seq=256, device_preset="h100-80gb")
    cluster = H100.with_devices(8)
    with pytest.raises(PlannerInputError, match="--ep 3: expert-parallel degree 3 does not divide the 8 routed experts"):
        candidate_expert_degrees(profile, cluster, 8, (3,))
    with pytest.raises(PlannerInputError, match="--etp 3"):
        candidate_expert_degrees(profile, cluster, 8, (), (3,))
    dense = strip_experts(profile)
    with pytest.raises(PlannerInputError, match="has no routed experts"):
        candidate_expert_degrees(dense, cluster, 8, (2,))
    assert candidate_expert_degrees(dense, cluster, 8) == [(1, 1)]
    assert (8, 2) in candidate_expert_degrees(profile, cluster, 16, tp_degree=2)


def test_cli_expert_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``planner plan``'s expert flags: a degree that cannot divide the experts is refused in one
    line (exit 2), a balance that does not parse likewise; a plan with a skew and DeepEP records
    them in its stack and its expert layout at the top level."""
    from planner.artifacts.profile import save_profile
    from planner.commands.cli import main

    path = tmp_path / "tiny.json"
    save_profile(moe_profile(tiny(), seq=256, device_preset="h100-80gb"), path)
    base = ["plan", "--profile", str(path), "--cluster", "h100-80gb-x8", "--global-batch", "16", "--cp", "1"]
    assert main([*base, "--ep", "3"]) == 2
    assert "--ep 3: expert-parallel degree 3 does not divide the 8 routed experts" in capsys.readouterr().err
    assert main([*base, "--moe-balance", "dropless"]) == 2
    assert "--moe-balance 'dropless': expected forced, dropless:SKEW or capacity:FACTOR" in capsys.readouterr().err
    out = tmp_path / "plan.json"
    assert main([*base, "--ep", "4", "--etp", "1", "--moe-dispatcher", "deepep", "--moe-balance", "dropless:0.25",
                 "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    moe = doc["stack"]["moe"]
    assert doc["ep_degree"] == 4 and (moe["dispatcher"], moe["balance"], moe["skew"]) == ("deepep", "dropless", 0.25)
    assert "MoE deepep, dropless (skew 0.25)" in capsys.readouterr().out


def test_published_moe_layouts_price_and_fit() -> None:
    """Every published MoE layout of benchmarks/published_moe.py is expressible (EP, ETP, EDP,
    VPP, FSDP over EDP, the dispatcher and the overlap), fits in an H100's memory as it ran, and
    the overlap and DeepEP rows are priced faster than their plain counterpart."""
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    import published_moe

    plans = {run.label: published_moe.config_plan(run) for run in published_moe.ROWS}
    for run in published_moe.ROWS:
        p = plans[run.label]
        assert (p.layout.ep_degree, p.layout.etp_degree, p.layout.edp_degree) == (run.ep, run.etp, run.edp)
        assert p.predicted.peak_memory_bytes <= published_moe.usable_bytes(), run.label
    assert (plans["Q DeepEP EP32 ovl"].predicted.iteration_ms < plans["Q DeepEP EP32 PP8"].predicted.iteration_ms)
