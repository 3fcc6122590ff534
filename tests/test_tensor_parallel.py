"""Tensor parallelism in the cost model and the search: the per-device view of a layer against
Megatron's formulas, the solvers agreeing with t > 1, the plan's rank layout, and refusals."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest

from planner.artifacts.cluster import PRESETS
from planner.artifacts.codec import parse_text
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ScheduleKind, SequenceParallelRuntime
from planner.artifacts.plan import dumps_plan, plan_from_json
from planner.artifacts.plan_summary import Band
from planner.artifacts.request import PlanRequest
from planner.artifacts.tensor_split import SplitDegree
from planner.cost import allreduce_ms
from planner.cost.groups import candidate_degrees
from planner.cost.tensor_parallel import tensor_parallel_view
from planner.profiling.analytic.gemm import GemmModel
from planner.profiling.analytic.gpt import gpt_profile
from planner.simulation import simulate
from planner.solve import plan
from tests.chains import chain_profile, small_cluster

S, H, A, V = 128, 256, 8, 1000


#: a device whose GEMMs all run at half of peak and whose element-wise work runs at the full
#: HBM bandwidth (no shape dependence: the per-degree entries are the 1/t rule exactly)
FLAT = GemmModel(max_efficiency=0.5, half_intensity=0.0, memory_efficiency=1.0)


def small_gpt(layers: int = 4):
    """Materialised attention: the block Korthikanti et al. 2022 eq. 1 counts."""
    return gpt_profile(layers=layers, hidden=H, heads=A, seq=S, vocab=V, device_preset="a100-80gb", gemm=FLAT,
                       attention="materialised")


@pytest.mark.parametrize("t", [2, 4])
def test_block_view_is_megatron_on_each_device(t):
    prof, cluster = small_gpt(), PRESETS["a100-80gb-x8"]
    block = prof.layers[1]
    view = tensor_parallel_view(prof, cluster, t, sp=False)
    vb = view.layers[1]
    # Korthikanti et al. 2022 eq. 2: s h (10 + 24 / t + 5 a s / (h t)) bytes per sample
    assert vb.saved_bytes_per_sample == pytest.approx(S * H * (10 + 24 / t + 5 * A * S / (H * t)))
    assert vb.param_count == (12 * H * H + 7 * H) // t + 6 * H
    assert vb.input_bytes_per_sample == block.input_bytes_per_sample
    # the matmuls and the memory-bound work on the split activations / t, the rest (on the
    # 10 s h replicated bytes) whole, plus two all-reduces of the block's 2 s h bytes over t
    # devices of one node
    matmul_ms = (24 * S * H * H + 4 * S * S * H) / (312e12 * 0.5 / 1e3)
    split_bytes, per_ms = 24 * S * H + 5 * A * S * S, 2039e9 / 1e3
    f = block.tp.split_time_fraction
    assert f == pytest.approx((matmul_ms + split_bytes / per_ms) / block.fwd_ms(1))
    assert block.fwd_ms(1) == pytest.approx(matmul_ms + block.saved_bytes_per_sample / per_ms)
    ar = allreduce_ms(cluster, 2 * S * H, tuple(range(t)))
    assert vb.fwd_ms(1) == pytest.approx(block.fwd_ms(1) * (1 - f + f / t) + 2 * ar)
    assert vb.bwd_ms(1) == pytest.approx(block.bwd_ms(1) * (1 - f + f / t) + 2 * ar)
    ar4 = allreduce_ms(cluster, 4 * 2 * S * H, tuple(range(t)))
    assert vb.fwd_ms(4) == pytest.approx(block.fwd_ms(4) * (1 - f + f / t) + 2 * ar4)
    assert view.edges[0].bytes_per_sample == prof.edges[0].bytes_per_sample / t
    # the vocabulary-parallel embedding and head share one tied table, split t ways
    assert view.tied[0].param_count == math.ceil(V * H / t)
    # sequence parallelism (eq. 4): everything saved, and the recompute input, split t ways
    sp = tensor_parallel_view(prof, cluster, t, sp=True)
    assert sp.layers[1].saved_bytes_per_sample == pytest.approx(S * H * (34 + 5 * A * S / H) / t)
    assert sp.layers[1].input_bytes_per_sample == block.input_bytes_per_sample / t
    assert sp.layers[1].fwd_ms(1) == pytest.approx(block.fwd_ms(1) / t + 2 * ar)
    assert sp.layers[1].fwd_ms(1) < vb.fwd_ms(1)


@pytest.mark.parametrize("t", [2, 4])
def test_torch_dtensor_split_keeps_the_gathered_inputs_whole(t):
    """A measured (torch-dtensor) split: without sequence parallelism ``(saved - A) + A / t``; with
    it the split and sequence bytes divide by t and the rest (the column splits' gathered inputs,
    masks) stays whole, as do the fixed bytes; a degree the profile measured replaces ``A / t``,
    and what it saves below ``A / t`` comes off the attention core (issue 51)."""
    prof, cluster = small_gpt(), PRESETS["a100-80gb-x8"]
    block = prof.layers[1]
    saved, split = block.saved_bytes_per_sample, block.tp.split_saved_bytes_per_sample
    seq = (saved - split) / 3  # a third of the rest from the stream, the rest gathered or built whole
    dtensor = dataclasses.replace(block.tp, sequence_runtime=SequenceParallelRuntime.DTENSOR,
                                  sequence_saved_bytes_per_sample=seq)
    layers = list(prof.layers)
    layers[1] = dataclasses.replace(block, tp=dtensor, saved_bytes_fixed=64.0)
    measured = dataclasses.replace(prof, layers=tuple(layers))
    off = tensor_parallel_view(measured, cluster, t, sp=False).layers[1]
    on = tensor_parallel_view(measured, cluster, t, sp=True).layers[1]
    assert off.saved_bytes_per_sample == pytest.approx(saved - split + split / t)
    assert on.saved_bytes_per_sample == pytest.approx(saved - split - seq + (split + seq) / t)
    assert on.saved_bytes_per_sample > saved / t  # what Megatron-LM's rule (the analytic profile) says
    assert on.saved_bytes_fixed == 64.0 and off.saved_bytes_fixed == 64.0
    megatron = tensor_parallel_view(prof, cluster, t, sp=True).layers[1]
    assert megatron.saved_bytes_per_sample == pytest.approx(saved / t)
    # a degree measured below A / t (grouped-query K/V kept as views)
    fewer = 1000.0
    degree = SplitDegree(degree=t, time_scale=1.0, split_saved_bytes_per_sample=split / t - fewer)
    layers[1] = dataclasses.replace(block, tp=dataclasses.replace(dtensor, degrees=(degree,)))
    gqa = tensor_parallel_view(dataclasses.replace(prof, layers=tuple(layers)), cluster, t, sp=True).layers[1]
    assert gqa.saved_bytes_per_sample == pytest.approx(on.saved_bytes_per_sample - fewer)
    assert gqa.attention_core.saved_bytes_per_sample == pytest.approx(block.attention_core.saved_bytes_per_sample / t - fewer)


def test_degrees_and_refusals():
    prof, cluster = small_gpt(), PRESETS["a100-80gb-x8"]
    assert candidate_degrees(prof, cluster, 8) == [1, 2, 4, 8]
    assert candidate_degrees(prof, cluster, 4) == [1, 2, 4]
    with pytest.raises(PlannerInputError, match="inside one node"):
        candidate_degrees(prof, cluster, 8, (16,))
    six_heads = gpt_profile(layers=2, hidden=96, heads=6, seq=16, vocab=50)
    assert candidate_degrees(six_heads, cluster, 8) == [1, 2]
    with pytest.raises(PlannerInputError, match=r"--tp 4: .*does not divide 6"):
        plan(six_heads, cluster, PlanRequest(global_batch=8, tp_degrees=(4,)))
    two_nodes = dataclasses.replace(small_cluster(8, per_node=4), name="2x4")
    with pytest.raises(PlannerInputError, match="inside one node"):
        plan(prof, two_nodes, PlanRequest(global_batch=8, tp_degrees=(8,)))
    chain = chain_profile([dict(fwd=1.0, bwd=2.0, params=10, saved=1e3, inp=1e2, out=1e2)] * 3)
    with pytest.raises(PlannerInputError, match="declares a tensor-parallel split"):
        plan(chain, small_cluster(4), PlanRequest(global_batch=8, tp_degrees=(2,)))
    with pytest.raises(PlannerInputError, match="baseline"):
        plan(prof, cluster, PlanRequest(global_batch=8, tp_degrees=(2,), solver="uniform"))


@pytest.mark.parametrize("sp", [False, True])
def test_dp_cpsat_and_bruteforce_agree_with_tensor_parallelism(sp):
    prof = gpt_profile(layers=4, hidden=1024, heads=16, seq=1024, vocab=8000)
    cluster = dataclasses.replace(PRESETS["a100-80gb-x8"], device_memory_bytes=3 * 10**9)
    req = PlanRequest(global_batch=8, num_devices=4, tp_degrees=(2,), sequence_parallel=(sp,), zero_stages=(0,),
                      per_stage_replication=False)
    a = plan(prof, cluster, req)
    b = plan(prof, cluster, dataclasses.replace(req, solver="brute-force"))
    c = plan(prof, cluster, dataclasses.replace(req, solver="ilp"))
    assert a.layout.tp_degree == b.layout.tp_degree == c.layout.tp_degree == 2
    assert a.layout.sequence_parallel is sp
    assert math.isclose(a.predicted.iteration_ms, b.predicted.iteration_ms, rel_tol=1e-9)
    assert math.isclose(a.predicted.iteration_ms, c.predicted.iteration_ms, rel_tol=1e-6)


def test_plan_with_tensor_parallelism_lays_out_real_ranks():
    prof, cluster = small_gpt(6), PRESETS["a100-80gb-x8"]
    # P and D forced: layers this small are host-bound (planner.cost.overheads), so a plan on fewer
    # devices is as fast and would be chosen
    # (one chunk per rank: stage s on pipeline rank s; ZBV's V, in the default schedules, puts two there)
    req = PlanRequest(global_batch=16, tp_degrees=(2,), per_stage_replication=False, num_stages=2, dp_degree=2,
                      schedules=(ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.ZB_H1, ScheduleKind.ZB_H2))
    p = plan(prof, cluster, req)
    t, D = p.layout.tp_degree, p.layout.dp_degree
    assert t == 2 and p.layout.num_stages * D * t == p.num_devices == 8
    for s, stage in enumerate(p.stages):
        # rank = (pipeline rank x D + replica) x t + tp index: a (pp, dp, tp) mesh in row-major order
        assert stage.ranks == tuple(range(s * D * t, (s + 1) * D * t))
    assert p.provenance.cluster_name == cluster.name and p.provenance.request == req
    again = plan_from_json(parse_text(dumps_plan(p), "plan"))
    assert again == p
    # the prediction is the replay lengthened by the slowest GPU's share (planner.cost.overheads)
    assert simulate(again).iteration_ms * (1 + p.predicted.straggler_fraction) == pytest.approx(p.predicted.iteration_ms)
    # the timeline's rows are tensor-parallel groups, and its figure says so
    import matplotlib

    matplotlib.use("Agg")
    from planner.report.figures import plot_timeline

    tl = simulate(again)
    assert tl.layout.tp_degree == 2 and tl.num_ranks == p.layout.num_stages  # one pipeline replica
    fig = plot_timeline(tl)
    assert "tensor-parallel group of 2 devices" in fig.axes[0].get_title()
    # re-pricing the plan's own layout (planner.report.calibrate.repredict) gives the plan back
    from planner.report.calibrate import repredict

    # (the overhead terms and band are worked out for the plan a user gets: planner.solve.account)
    assert repredict(p, prof, cluster).predicted == dataclasses.replace(p.predicted, overheads=(), band=Band())
    # the machine bound is over the 8 real devices, the same with or without t
    one = plan(prof, cluster, dataclasses.replace(req, tp_degrees=(1,), dp_degree=4))
    assert p.predicted.machine_bound_ms == pytest.approx(one.predicted.machine_bound_ms)
    assert p.predicted.mfu == pytest.approx(
        p.predicted.model_flops_per_iteration / (p.predicted.iteration_ms / 1e3) / 8 / 1e12 / 312.0
    )


def test_search_takes_the_fastest_degree_and_the_leaner_of_equal_times():
    prof, cluster = gpt3_13b(), PRESETS["a100-80gb-x8"]
    req = PlanRequest(global_batch=64)
    best = plan(prof, cluster, req)
    for t in (1, 2, 4, 8):
        only = plan(prof, cluster, dataclasses.replace(req, tp_degrees=(t,)))
        assert best.predicted.iteration_ms <= only.predicted.iteration_ms * (1 + 1e-12)
    off = plan(prof, cluster, dataclasses.replace(req, tp_degrees=(best.layout.tp_degree,), sequence_parallel=(False,)))
    if best.layout.tp_degree > 1 and math.isclose(off.predicted.iteration_ms, best.predicted.iteration_ms):
        assert best.layout.sequence_parallel and best.predicted.peak_memory_bytes < off.predicted.peak_memory_bytes
    assert {(q.tp_degree, q.sequence_parallel) for q in best.pareto} - {(1, False)}, "t > 1 is on the front"


def gpt3_13b():
    from planner.profiling.analytic.gpt import gpt3_profile

    return gpt3_profile("gpt3-13b")


def test_cli_plan_shows_t_and_refuses_in_one_line(tmp_path):
    out = tmp_path / "p.json"
    ok = subprocess.run(
        [sys.executable, "-m", "planner", "plan", "--global-batch", "64", "--tp", "2", "--sequence-parallel", "on",
         "--no-stage-replication", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert "T=2 (seq-par) x P=" in ok.stdout
    saved = plan_from_json(parse_text(out.read_text(), "p"))
    assert saved.layout.tp_degree == 2 and saved.layout.sequence_parallel
    bad = subprocess.run([sys.executable, "-m", "planner", "plan", "--tp", "3"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "--tp 3" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_torchtitan_export_carries_every_degree(tmp_path):
    import tomllib

    from planner.commands.cli import main
    from planner.report.export import torchtitan_config

    prof, cluster = small_gpt(6), PRESETS["a100-80gb-x8"]
    p = plan(prof, cluster, PlanRequest(global_batch=16, tp_degrees=(2,), sequence_parallel=(True,), zero_stages=(0,),
                                        per_stage_replication=False, max_stages=2))
    cfg = tomllib.loads(torchtitan_config(p))
    par = cfg["parallelism"]
    assert par["tensor_parallel_degree"] == 2 and par["enable_sequence_parallel"] is True
    assert par["pipeline_parallel_degree"] == p.layout.num_stages
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == p.layout.dp_degree
    assert par["tensor_parallel_degree"] * par["pipeline_parallel_degree"] * p.layout.dp_degree == p.num_devices
    assert par["pipeline_parallel_microbatch_size"] == p.microbatch_size
    assert [name for part in par["module_fqns_per_model_part"] for name in part] == list(prof.layer_names)
    assert cfg["training"]["local_batch_size"] * p.layout.dp_degree == cfg["training"]["global_batch_size"] == 16
    path = tmp_path / "p.json"
    path.write_text(dumps_plan(p))
    assert main(["export", str(path), "--torchtitan", str(tmp_path / "t.toml")]) == 0
    assert tomllib.loads((tmp_path / "t.toml").read_text()) == cfg
    from planner.artifacts.kinds import ScheduleKind, SolverKind
    from planner.artifacts.layout import Layout
    from planner.solve.build import rebuild_plan

    replicated = rebuild_plan(prof, cluster, PlanRequest(global_batch=16), layout=Layout(num_stages=2, stage_replicas=(2, 1)),
                              boundaries=(0, 4), recompute=[(), ()], microbatch_size=1, schedule=ScheduleKind.GPIPE,
                              solver=SolverKind.GIVEN)
    with pytest.raises(PlannerInputError, match="per stage"):
        torchtitan_config(replicated)


@pytest.mark.parametrize("loss", [0.0, 24 / 132, 0.5])
def test_hidden_collectives_take_their_share_of_the_gemms_beside_them(loss):
    """With the stack's tensor-parallel overlap each collective hides behind GEMMs; a cluster's
    ``overlap_compute_loss`` charges that share of every hidden ms back (the SMs the collective's
    kernels hold): the layer's time is the overlapped time + loss x what overlap hid, for every
    micro-batch size whose hidden time is a line (all of them here: the collectives are shorter
    than their windows)."""
    prof = gpt_profile(layers=2, hidden=2048, heads=16, seq=2048, vocab=V, device_preset="h100-80gb")
    cluster = dataclasses.replace(PRESETS["h100-80gb-x8"], overlap_compute_loss=loss)
    plain = tensor_parallel_view(prof, cluster, 4, True, (False, False)).layers[1]
    free = tensor_parallel_view(prof, dataclasses.replace(cluster, overlap_compute_loss=0.0), 4, True, (True, True)).layers[1]
    got = tensor_parallel_view(prof, cluster, 4, True, (True, True)).layers[1]
    for b in (1, 2, 8):
        for kind in ("fwd", "bwd"):
            hidden = getattr(plain, kind).at(b) - getattr(free, kind).at(b)
            assert hidden > 0
            assert getattr(got, kind).at(b) == pytest.approx(getattr(free, kind).at(b) + loss * hidden, rel=1e-9)


def test_overlap_compute_loss_is_a_cluster_field_checked_and_kept():
    """The presets' value is NCCL's 24 blocks over the device's SMs; a cluster file without the
    field (written before it existed) reads as 0; out of [0, 1) is refused naming the field."""
    from planner.artifacts.cluster import cluster_from_json, cluster_to_json

    assert PRESETS["a100-80gb-x8"].overlap_compute_loss == pytest.approx(24 / 108)
    assert PRESETS["h100-80gb-x8"].overlap_compute_loss == pytest.approx(24 / 132)
    assert PRESETS["local-cpu"].overlap_compute_loss == 0.0
    data = cluster_to_json(PRESETS["h100-80gb-x8"])
    assert cluster_from_json(data) == PRESETS["h100-80gb-x8"]
    old = dict(data)
    del old["overlap_compute_loss"]
    assert cluster_from_json(old).overlap_compute_loss == 0.0
    with pytest.raises(ValueError, match="overlap_compute_loss"):
        dataclasses.replace(PRESETS["h100-80gb-x8"], overlap_compute_loss=1.0)
