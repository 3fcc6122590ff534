"""ZeRO 3 (FSDP): the closed form of its times against an event replay, its memory formula,
the three solvers agreeing under it, a plan it makes possible, its refusal, its exports."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.artifacts.errors import InfeasibleError
from planner.artifacts.kinds import ZeroStage
from planner.artifacts.layout import Layout
from planner.artifacts.plan import plan_from_json, plan_to_json
from planner.artifacts.request import PlanRequest, ScheduleKind
from planner.artifacts.stack import STACKS
from planner.cost import CostModel
from planner.cost.fsdp import fsdp_terms, replay
from planner.report.export import torchtitan_config
from planner.solve import plan
from planner.solve.infeasible import explain_infeasible
from planner.solve.prices import StageTable
from tests.chains import chain_profile, layer_dicts, small_cluster, solve_three_ways

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
times = st.lists(st.floats(0.0, 5.0), min_size=1, max_size=7)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), prefetch=st.booleans())
def test_closed_form_equals_event_replay(data, prefetch):
    n = data.draw(st.integers(1, 7))
    f, b, a, r = (np.array(data.draw(st.lists(st.floats(0.0, 5.0), min_size=n, max_size=n))) for _ in range(4))
    terms = fsdp_terms(f, b, a, r, prefetch)
    matrix = terms.matrix()
    for i in range(n):
        for j in range(i + 1, n + 1):
            want = replay(f[i:j].tolist(), b[i:j].tolist(), a[i:j].tolist(), r[i:j].tolist(), prefetch)
            got = terms.stage(i, j)
            assert got == pytest.approx(want, abs=1e-9)
            assert matrix[i, j] == pytest.approx(sum(want), abs=1e-9)
    if not prefetch:  # each collective waits for and is waited for by its layer
        assert terms.stage(0, n) == pytest.approx((f.sum() + a.sum(), b.sum() + a.sum() + r.sum()))
    else:  # never slower than not overlapping, never faster than computing alone
        no = fsdp_terms(f, b, a, r, False).stage(0, n)
        assert sum(terms.stage(0, n)) <= sum(no) + 1e-9
        assert sum(terms.stage(0, n)) >= f.sum() + b.sum() - 1e-9


@pytest.mark.parametrize("stack", ["planner", "megatron-core-0.8"])
def test_memory_is_sharded_state_plus_gathered_units(stack):
    prof = chain_profile([dict(fwd=1.0, bwd=2.0, params=p, saved=1e7, inp=1e6, out=1e6)
                          for p in (10_000_000, 30_000_000, 20_000_000)])
    cm = CostModel(prof, small_cluster(4), stack=STACKS[stack])
    lay = Layout(num_stages=1, dp_degree=4, zero=ZeroStage.PARAMETERS)
    mem = cm.stage_memory(0, 3, (), 1, 1, lay.sharding(0))
    w, g, o = 2, 2, 12  # adam-mixed
    units = 2 if stack == "megatron-core-0.8" else 1
    assert mem.param_bytes == 60_000_000 * w // 4 + units * 30_000_000 * w
    assert mem.grad_bytes == 60_000_000 * g // 4 + units * 30_000_000 * g
    assert mem.optimizer_bytes == 60_000_000 * o // 4
    one = Layout(num_stages=1, dp_degree=1, zero=ZeroStage.PARAMETERS)  # one rank shards nothing
    assert cm.stage_memory(0, 3, (), 1, 1, one.sharding(0)) == cm.stage_memory(0, 3, (), 1, 1)
    # ZeRO 3's collectives are in the stage's times, not after its last backward
    assert cm.stage_sync(0, 3, 0, lay).total_ms == 0.0
    fwd, bwd = cm.stage_times_ms(0, 3, 1, 0, lay)
    assert fwd > cm.stage_fwd_ms(0, 3, 1) and bwd > cm.stage_bwd_ms(0, 3, 1)


@SETTINGS
@given(
    layers=layer_dicts(6),
    num_stages=st.integers(1, 3),
    num_microbatches=st.integers(1, 5),
    microbatch_size=st.sampled_from([1, 2]),
    schedule=st.sampled_from([ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B]),
    cap_gb=st.floats(0.05, 2.0),
    dp_degree=st.sampled_from([2, 3]),
    stack=st.sampled_from(["planner", "megatron-core-0.8"]),
)
def test_dp_equals_cpsat_equals_brute_force_under_zero3(
    layers, num_stages, num_microbatches, microbatch_size, schedule, cap_gb, dp_degree, stack
):
    """The DP's table (closed form, vectorised), CP-SAT (linear in first/last indicators) and the
    brute force (event replay per stage) price ZeRO 3 alike and find the same optimum."""
    prof = chain_profile(layers)
    cm = CostModel(prof, small_cluster(8), stack=STACKS[stack])
    layout = Layout(num_stages=num_stages, dp_degree=dp_degree, zero=ZeroStage.PARAMETERS)
    sharding = layout.sharding(0)
    table = StageTable(cm, microbatch_size, cap_gb * 1e9, sharding=sharding, fsdp_line=cm.fsdp_line(layout))
    kw = dict(layout=layout, num_microbatches=num_microbatches, schedule=schedule)
    dp = solve_three_ways(table, **kw)
    if dp is None:
        return
    stops = list(dp.boundaries[1:]) + [cm.num_layers]
    for s, (a, z) in enumerate(zip(dp.boundaries, stops)):
        k = num_microbatches if schedule is ScheduleKind.GPIPE else min(num_stages - s, num_microbatches)
        assert cm.stage_memory(a, z, dp.recompute[s], microbatch_size, k, sharding).total_bytes <= table.cap


def _big_state_case():
    """Six layers whose model state (adam-mixed, 16 bytes per parameter) cannot fit on 4 devices
    of 2.92 GB in one stage unless the parameters are sharded too: 600M parameters are 9.6 GB
    (ZeRO 1 over the 4 replicas: 4.2 GB; ZeRO 2, gradients sharded too: 3.3 GB; ZeRO 3: 2.4 GB + a
    gathered layer)."""
    prof = chain_profile([dict(fwd=1.0 + i % 2, bwd=2.0, params=100_000_000, saved=2e7, inp=2e6, out=2e6)
                          for i in range(6)])
    return prof, small_cluster(4, memory_bytes=int(2.92e9))


def test_zero3_plans_what_nothing_else_fits_and_the_solvers_agree():
    prof, cluster = _big_state_case()
    req = PlanRequest(global_batch=8, per_stage_replication=False, memory_headroom_fraction=0.0, num_stages=1)
    with pytest.raises(InfeasibleError):
        plan(prof, cluster, dataclasses.replace(req, zero_stages=(0, 1, 2)))
    a = plan(prof, cluster, req)
    b = plan(prof, cluster, dataclasses.replace(req, solver="brute-force"))
    c = plan(prof, cluster, dataclasses.replace(req, solver="ilp"))
    assert a.layout.zero is ZeroStage.PARAMETERS and a.layout.dp_degree > 1
    assert (b.layout.zero, c.layout.zero) == (ZeroStage.PARAMETERS, ZeroStage.PARAMETERS)
    assert math.isclose(a.predicted.iteration_ms, b.predicted.iteration_ms, rel_tol=1e-9)
    assert math.isclose(a.predicted.iteration_ms, c.predicted.iteration_ms, rel_tol=1e-6)
    for stage in a.stages:
        assert stage.memory_total_bytes <= stage.memory_cap_bytes
        assert stage.allreduce_ms == 0.0  # its collectives are in fwd_ms / bwd_ms
    # the plan carries it: JSON round trip, the layout's name, torchtitan's dp_shard
    assert plan_from_json(plan_to_json(a)) == a
    assert "ZeRO-3" in a.layout.describe()
    toml = torchtitan_config(a)
    assert f"data_parallel_shard_degree = {a.layout.dp_degree}" in toml
    assert 'fsdp_reshard_after_forward = "always"' in toml


def test_refusal_says_its_schedule_was_not_asked_and_counts_context_parallel_devices():
    """The explanation prices the leanest schedule (1F1B where it runs): a request for interleaved
    1F1B only is told that its figures are 1F1B's, a lower bound of what it needs, and so is each
    "more devices" suggestion; and a suggestion for a context-parallel layout counts its groups'
    devices (t x cp, not t alone: it said "more devices: 8" to a request already on 16). Drawn
    case: a GPT of 11 layers (hidden 4,096, sequence 8,192) on 16 H100s, 6 GiB per device,
    interleaved only, two replicas."""
    from planner.artifacts.cluster import PRESETS
    from planner.profiling.analytic.gpt import gpt_profile

    profile = gpt_profile(layers=11, hidden=4096, heads=32, seq=8192, vocab=32000, device_preset="h100-80gb",
                          attention="materialised")
    request = PlanRequest(global_batch=64, memory_cap_bytes=6 * 2**30, schedules=(ScheduleKind.INTERLEAVED_1F1B,),
                          dp_degree=2)
    with pytest.raises(InfeasibleError) as info:
        plan(profile, PRESETS["h100-80gb-x8"].with_devices(16), request)
    exc = info.value.complete()
    text = str(exc)
    assert "CP=4" in text and "1f1b" in text
    assert "Priced with 1f1b, which was not asked (interleaved-1f1b)" in text
    more = [s for s in exc.suggestions if s.startswith("more devices: ")]
    assert more and all("with 1f1b, which was not asked" in s for s in more)
    assert all(int(s.split()[2]) > 16 for s in more)  # more than the 16 it has


def test_refusal_names_the_fsdp_layout_and_what_would_fit():
    prof, cluster = _big_state_case()
    tight = PlanRequest(global_batch=8, per_stage_replication=False, memory_cap_bytes=int(1.2e9))
    with pytest.raises(InfeasibleError) as info:
        plan(prof, cluster, tight)
    text = str(info.value)
    assert "ZeRO-3" in text, text  # the leanest layout tried is the sharded one
    assert "more devices: 8" in text or "more devices: 16" in text, text
    # measured without its suggestions (a search measures every degree and explains the closest),
    # the same refusal once completed
    cm = CostModel(prof, cluster)
    n = cluster.num_devices
    cap = float(tight.memory_cap_bytes)
    full = explain_infeasible(cm, tight, n, cap)
    short = explain_infeasible(cm, tight, n, cap, suggest=False)
    assert not short.suggestions and short.need_bytes == full.need_bytes and str(short) == str(full).split("\n")[0]
    assert str(short.complete()) == str(full) and full.complete() is full


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=layer_dicts(6, levels=True), stages=st.integers(1, 4), microbatches=st.integers(1, 6),
       recompute=st.booleans(), fsdp=st.booleans())
def test_least_cap_is_where_the_solver_starts_to_fit(layers, stages, microbatches, recompute, fsdp):
    """A refusal's least memory (:func:`least_cap_bytes`, the min-max over partitions of each
    stage's fewest bytes at its leanest recomputation) is a cap at which the solver finds a plan
    and a millionth below it finds none (the bisection it replaces stopped within a megabyte
    above), with and without recomputation, ZeRO 3 too."""
    from planner.solve.infeasible import _fits, least_cap_bytes
    from planner.solve.space import layout_of

    prof = chain_profile(layers)
    stages = min(stages, len(layers))
    cm = CostModel(prof, small_cluster(8))
    request = PlanRequest(global_batch=microbatches * (2 if fsdp else 1), recompute=recompute)
    layout = layout_of(cm, stages, 2, 1, ZeroStage.PARAMETERS) if fsdp else layout_of(cm, stages)
    need = least_cap_bytes(cm, request, layout, 1, recompute)
    assert _fits(cm, request, need, layout, 1, recompute)
    assert not _fits(cm, request, need * (1 - 1e-6) - 1.0, layout, 1, recompute)


def test_a_lower_zero_stage_of_an_hsdp_candidate_shards_over_the_whole_group() -> None:
    """The time objective tries a chosen ZeRO 3 candidate at the lower stages the request allows
    (:func:`planner.solve.build.least_zero`); an HSDP candidate's shard groups go with ZeRO 3
    (a layout keeps them only under it), as the full published-runs table needs for torchtitan's
    Llama 2 70B on 64 A100s, which raised before."""
    from planner.artifacts.cluster import PRESETS
    from planner.profiling.analytic.gpt import gpt_profile
    from planner.solve.build import least_zero
    from planner.solve.candidates import Candidate
    from planner.solve.chain import ChainSolution
    from planner.solve.space import Config

    cluster = dataclasses.replace(PRESETS["a100-80gb-x8"], num_nodes=4)
    cm = CostModel(gpt_profile(layers=2, hidden=1024, heads=8, seq=512, vocab=1000, device_preset="a100-80gb"), cluster)
    hsdp = Config(Layout(num_stages=1, dp_degree=32, zero=ZeroStage.PARAMETERS, shard_group_size=8), 1, 1,
                  ScheduleKind.ONE_F_ONE_B)
    assert hsdp.zero_variants(8).by_stage[ZeroStage.PARAMETERS].layout.shard_group_size == 8
    assert hsdp.zero_variants(8).by_stage[ZeroStage.OPTIMIZER].layout.shard_group_size == 0
    solution = ChainSolution(objective_ms=0.0, boundaries=(0,), recompute=((),), stage_times_ms=(0.0,), exact=True,
                             selective=((),))
    got = least_zero(cm, PlanRequest(global_batch=32, zero_stages=(0, 1, 2, 3)), Candidate(hsdp, solution), 1e15)
    assert got.config.layout.zero < ZeroStage.PARAMETERS and got.config.layout.shard_group_size == 0


def test_a_configurations_zero_variants_are_one_record_kept_on_it() -> None:
    """``Config.zero_variants``: the configuration at each ZeRO stage (below ZeRO 3 without shard
    groups, ZeRO 3 keeping its own) and under HSDP (a node's share of each gradient group; None where
    the group fits in a node), worked out once per node size and kept on the configuration."""
    from planner.solve.space import Config

    c = Config(Layout(num_stages=2, dp_degree=16, zero=ZeroStage.GRADIENTS), 1, 8, ScheduleKind.ONE_F_ONE_B)
    at = c.zero_variants(8)
    assert [v.layout.zero for v in at.by_stage] == list(ZeroStage) and at.by_stage[ZeroStage.GRADIENTS] is c
    assert all(v.layout.shard_group_size == 0 and (v.layout.dp_degree, v.layout.num_stages) == (16, 2) for v in at.by_stage)
    assert at.hsdp is not None and at.hsdp.layout.zero is ZeroStage.PARAMETERS and at.hsdp.layout.shard_group_size == 8
    assert c.zero_variants(8) is at and c.zero_variants(32) is not at and c.zero_variants(32).hsdp is None
    hsdp = at.hsdp.zero_variants(8)
    assert hsdp.by_stage[ZeroStage.PARAMETERS] is at.hsdp and hsdp.by_stage[ZeroStage.OPTIMIZER].layout.shard_group_size == 0


def test_a_configurations_fields_are_its_own_and_its_variants() -> None:
    """``Config``'s fields are worked out where it is built (``__post_init__``), so a ZeRO
    variant's tie-break and figures are the variant's own (the heap's order and the plans' ties
    read them), and whether ZeRO 3 is searched beside it, set where the space is listed
    (``all_configs``: the request allows ZeRO 3 and there are replicas), is kept by its variants."""
    from planner.solve.space import all_configs

    cm = CostModel(chain_profile([dict(fwd=1.0, bwd=2.0, params=1000, saved=1e6, inp=1e5, out=1e5)] * 4), small_cluster(8))
    request = PlanRequest(global_batch=8, zero_stages=(0, 1, 3))
    configs = all_configs(cm, request, 8, interleaved=False)
    assert configs and all(c.fsdp_searched == (c.layout.dp_degree > 1) for c in configs)
    c = next(c for c in configs if c.layout.dp_degree > 1 and c.layout.zero is ZeroStage.OPTIMIZER)
    for z in (ZeroStage.NONE, ZeroStage.PARAMETERS):
        v = c.zero_variants(8).by_stage[z]
        assert v.sort_key == c.sort_key[:4] + (int(z),) + c.sort_key[5:] and v.fsdp_searched
        assert (v.pipeline_size, v.num_groups) == (c.layout.pipeline_size, c.layout.num_groups)
    smaller = dataclasses.replace(c, microbatch_size=2 * c.microbatch_size)
    assert smaller.sort_key[1] == -2 * c.microbatch_size and smaller.fsdp_searched
    assert not all_configs(cm, dataclasses.replace(request, zero_stages=(0, 1)), 8, interleaved=False)[-1].fsdp_searched


@pytest.mark.parametrize("stack", ["planner", "megatron-core-0.8"])
def test_a_split_backward_gathers_the_weights_again_for_w(stack):
    """ZeRO 3 under a split backward prices a third gather per micro-batch, W's (``planner.cost.fsdp``,
    what the runtime does: ``tests/test_runtime_fsdp.py`` counts its gathers): on every stage but
    the first (torch runs no I there) unless the first rebuilds recomputed layers at its I; W's
    own time carries it; nothing changes off ZeRO 3 or without the split. Without prefetching it
    is the stage's gathers, ``sum a_k``; with it, never more."""
    from planner.cost.fsdp import gathers_per_microbatch
    from planner.cost.stage import price_stage

    prof = chain_profile([dict(fwd=1.0, bwd=2.0, params=p, saved=1e7, inp=1e6, out=1e6, wfrac=0.4)
                          for p in (10_000_000, 30_000_000, 20_000_000, 40_000_000)])
    cm = CostModel(prof, small_cluster(8), stack=STACKS[stack])
    lay = Layout(num_stages=2, dp_degree=4, zero=ZeroStage.PARAMETERS)
    terms = cm.fsdp_terms(1, cm.fsdp_line(lay), lay.sharding(1))
    for idx, (start, stop) in enumerate([(0, 2), (2, 4)]):
        for rc in ((), (start,)):
            plain = price_stage(cm, start, stop, 1, idx, lay, recompute=rc)
            split = price_stage(cm, start, stop, 1, idx, lay, recompute=rc, split_backward=True)
            again = split.bwd_ms - plain.bwd_ms
            assert split.wgrad_ms == pytest.approx(cm.stage_wgrad_ms(start, stop, 1) + again)
            assert split.fwd_ms == plain.fwd_ms
            if gathers_per_microbatch(True, idx == 0, bool(rc)) == 2:
                assert again == 0.0 and idx == 0 and not rc
            elif cm.stack.fsdp_prefetch:
                assert 0.0 < again <= terms.gather[start:stop].sum() + 1e-12
            else:
                assert again == pytest.approx(terms.gather[start:stop].sum())
    flat = Layout(num_stages=2, dp_degree=4, zero=ZeroStage.OPTIMIZER)
    assert price_stage(cm, 2, 4, 1, 1, flat, split_backward=True).bwd_ms == price_stage(cm, 2, 4, 1, 1, flat).bwd_ms


def test_w_reads_the_saved_weight_so_zero3_gathers_it():
    """Why W gathers the weights (``planner.cost.fsdp``): with a LayerNorm's weight freed as ZeRO 3
    frees it (storage resized to 0), torch's weight-only pass (``stage_backward_weight``) fails --
    the CPU kernel takes the weight's data pointer though dW needs only the saved input and the
    output gradient -- while a Linear's W runs without it. (Should torch stop reading it, the
    runtime could gather twice under a split backward.)"""
    import torch
    from torch import nn
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    for module, fails in ((nn.Linear(8, 8), False), (nn.LayerNorm(8), True), (nn.GroupNorm(2, 8), True)):
        x = torch.randn(4, 8, requires_grad=True)
        params = list(module.parameters())
        loss = (module(x * 1.0) ** 2).sum()
        _, groups = stage_backward_input([loss], None, [x], iter(params))
        for p in params:
            p.untyped_storage().resize_(0)
        if fails:
            with pytest.raises(RuntimeError, match="data is not allocated"):
                stage_backward_weight(iter(params), groups)
        else:
            stage_backward_weight(iter(params), groups)
            assert all(p.grad is not None for p in params)
