"""The chain DP against the brute-force oracle on random small chains (hypothesis)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.artifacts.kinds import ZeroStage
from planner.artifacts.layout import Layout
from planner.artifacts.request import PlanRequest, ScheduleKind
from planner.cost import CostModel
from planner.solve import plan
from planner.solve.prices import StageTable
from planner.solve.recompute import choose_recompute
from tests.chains import chain_profile, layer_dicts, shared_pairs, small_cluster, solve_three_ways

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(
    layers=layer_dicts(6),
    num_stages=st.integers(1, 4),
    num_microbatches=st.integers(1, 6),
    microbatch_size=st.sampled_from([1, 2]),
    schedule=st.sampled_from([ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B]),
    cap_gb=st.floats(0.05, 2.0),
    dp_degree=st.sampled_from([1, 2, 3]),
    zero=st.sampled_from([0, 1, 2]),
)
def test_dp_equals_brute_force(layers, num_stages, num_microbatches, microbatch_size, schedule, cap_gb, dp_degree, zero):
    """Also under ZeRO: the DP reads the sharded memory and the reduce-scatter + all-gather
    pricing from its table, the oracles from the cost model (given the table's question only)."""
    prof = chain_profile(layers)
    cm = CostModel(prof, small_cluster(8))
    layout = Layout(num_stages=num_stages, dp_degree=dp_degree, zero=ZeroStage(zero))
    sharding = layout.sharding(0)
    table = StageTable(cm, microbatch_size, cap_gb * 1e9, sharding=sharding)
    kw = dict(layout=layout, num_microbatches=num_microbatches, schedule=schedule)
    dp = solve_three_ways(table, **kw)  # DP = brute force = CP-SAT (up to its integer rounding)
    if dp is None:
        return
    # the DP's own partition really fits and really costs what it says
    stops = list(dp.boundaries[1:]) + [cm.num_layers]
    for s, (a, z) in enumerate(zip(dp.boundaries, stops)):
        k = num_microbatches if schedule is ScheduleKind.GPIPE else min(num_stages - s, num_microbatches)
        assert cm.stage_memory(a, z, dp.recompute[s], microbatch_size, k, sharding).total_bytes <= table.cap


@SETTINGS
@given(
    layers=layer_dicts(7),
    num_stages=st.integers(2, 4),
    num_microbatches=st.integers(2, 6),
    schedule=st.sampled_from([ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B]),
    cap_gb=st.floats(0.05, 2.0),
    data=st.data(),
)
def test_dp_equals_brute_force_with_fixed_boundaries(layers, num_stages, num_microbatches, schedule, cap_gb, data):
    """Fixed boundaries make the whole model's span invalid (``compute[0, L] = inf``): the DP's
    bound on the largest stage used to become inf there, which stopped its scan of caps at the
    first and returned a partition short of the optimum."""
    prof = chain_profile(layers)
    L = prof.num_layers
    if L < 2:
        return  # no boundary to fix
    fixed = data.draw(st.lists(st.integers(1, L - 1), min_size=1, max_size=num_stages - 1, unique=True))
    cm = CostModel(prof, small_cluster(8))
    table = StageTable(cm, 1, cap_gb * 1e9, sorted(fixed))
    solve_three_ways(table, layout=Layout(num_stages=num_stages), num_microbatches=num_microbatches, schedule=schedule)


@SETTINGS
@given(
    fwd=st.lists(st.floats(0.1, 5.0), min_size=1, max_size=8),
    data=st.data(),
    inflight=st.integers(1, 4),
)
def test_recompute_knapsack_is_exact(fwd, data, inflight):
    import itertools

    n = len(fwd)
    saved = data.draw(st.lists(st.floats(0, 100.0), min_size=n, max_size=n))
    inp = data.draw(st.lists(st.floats(0, 30.0), min_size=n, max_size=n))
    excess = data.draw(st.floats(-10, 400.0))
    got = choose_recompute(fwd_ms=fwd, saved_bytes=saved, input_bytes=inp, first_layer=0, inflight=inflight,
                           excess_bytes=excess)
    # the same inequality; a subset whose gain meets its target only to within float rounding
    # (summed in another order: a drawn case's gains telescoped to exactly 36.0 = 18 + 18 here,
    # 35.99999999999999 in the solver) may go either way, so the least cost is bracketed between
    # the subsets that surely reach it and those that reach it to within rounding
    surely = within = math.inf
    for r in range(n + 1):
        for mask in itertools.combinations(range(n), r):
            gain = sum(inflight * (saved[i] - inp[i]) for i in mask)
            ws = max((saved[i] for i in mask), default=0.0)
            target = excess + ws
            slack = 1e-12 * max(abs(target), sum(inflight * abs(saved[i] - inp[i]) for i in mask), 1.0)
            cost = sum(fwd[i] for i in mask)
            if gain >= target + slack:
                surely = min(surely, cost)
            if gain >= target - slack:
                within = min(within, cost)
    if surely == within:
        assert (got.time_ms == surely) if surely == math.inf else math.isclose(got.time_ms, surely, rel_tol=1e-9,
                                                                               abs_tol=1e-12)
    else:
        assert within * (1 - 1e-9) <= got.time_ms <= surely * (1 + 1e-9)


@SETTINGS
@given(
    layers=layer_dicts(6, levels=True),
    data=st.data(),
    num_stages=st.integers(1, 3),
    num_microbatches=st.integers(1, 6),
    microbatch_size=st.sampled_from([1, 2, 3]),
    schedule=st.sampled_from([ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B]),
    cap_gb=st.floats(0.05, 2.0),
)
def test_dp_equals_brute_force_with_recompute_levels(
    layers, data, num_stages, num_microbatches, microbatch_size, schedule, cap_gb
):
    """Three recompute levels per layer (none, selective where a layer has an attention core,
    full), saved bytes that do not grow with the micro-batch, and storages two layers share
    (outside their cores: a shared storage inside a core made a stage's bytes negative):
    DP = CP-SAT = brute force, and the DP's choice fits and costs what it says."""
    # a shared storage lies outside both layers' attention cores (what a core saves is its own),
    # and a layer's storages shared with later (earlier) layers are no more than it saves (the
    # profile refuses more: two draws of one pair once made a stage's bytes negative)
    later = [d["saved"] - (d.get("core") or 0.0) for d in layers]
    earlier = list(later)
    shared = []
    for a, b, v in data.draw(shared_pairs(len(layers))):
        v = min(v, later[a], earlier[b])
        later[a] -= v
        earlier[b] -= v
        shared.append((a, b, v))
    prof = chain_profile(layers, shared=shared)
    cm = CostModel(prof, small_cluster(8))
    layout = Layout(num_stages=num_stages)
    table = StageTable(cm, microbatch_size, cap_gb * 1e9)
    kw = dict(layout=layout, num_microbatches=num_microbatches, schedule=schedule)
    dp = solve_three_ways(table, **kw)  # DP = brute force = CP-SAT (up to its integer rounding)
    if dp is None:
        return
    stops = list(dp.boundaries[1:]) + [cm.num_layers]
    for s, (a, z) in enumerate(zip(dp.boundaries, stops)):
        k = num_microbatches if schedule is ScheduleKind.GPIPE else min(num_stages - s, num_microbatches)
        sel = dp.selective[s]
        assert not set(sel) & set(dp.recompute[s]) and all(cm.has_core[i] for i in sel)
        assert cm.stage_memory(a, z, dp.recompute[s], microbatch_size, k, selective=sel).total_bytes <= table.cap
        t = cm.stage_fwd_ms(a, z, microbatch_size) + cm.stage_bwd_ms(a, z, microbatch_size)
        assert math.isclose(t + cm.recompute_ms(dp.recompute[s], microbatch_size, sel), dp.stage_times_ms[s], rel_tol=1e-12)


@SETTINGS
@given(
    fwd=st.lists(st.floats(0.1, 5.0), min_size=1, max_size=7),
    data=st.data(),
    inflight=st.integers(1, 4),
)
def test_recompute_knapsack_with_selective_level_is_exact(fwd, data, inflight):
    """Every assignment of none / selective / full per layer against the knapsack's choice
    (runs of identical layers included: the drawn layers repeat)."""
    import itertools

    n = len(fwd)
    kinds = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))  # few kinds: identical runs
    saved = [[100.0, 60.0, 30.0][k] for k in kinds]
    inp = [data.draw(st.sampled_from([5.0, 20.0]))] * n
    core = [[70.0, 0.0, 10.0][k] for k in kinds]  # kind 1 has no selective level
    core_ms = [[0.4, 0.0, 0.2][k] for k in kinds]
    fwd = [[1.0, 0.7, 0.5][k] for k in kinds]
    excess = data.draw(st.floats(-10, 500.0))
    got = choose_recompute(fwd_ms=fwd, saved_bytes=saved, input_bytes=inp, first_layer=0, inflight=inflight,
                           excess_bytes=excess, core_ms=core_ms, core_bytes=core)
    best = math.inf
    for pick in itertools.product(*[(0, 1, 2) if core[i] > 0 else (0, 1) for i in range(n)]):
        gain = sum(inflight * (saved[i] - inp[i]) if v == 1 else inflight * core[i] if v == 2 else 0.0
                   for i, v in enumerate(pick))
        ws = max([saved[i] for i, v in enumerate(pick) if v == 1] + [core[i] for i, v in enumerate(pick) if v == 2],
                 default=0.0)
        if gain >= excess + ws:
            best = min(best, sum(fwd[i] if v == 1 else core_ms[i] if v == 2 else 0.0 for i, v in enumerate(pick)))
    if excess <= 0:
        best = 0.0
    assert (got.time_ms == best) if best == math.inf else math.isclose(got.time_ms, best, rel_tol=1e-9, abs_tol=1e-12)
    if best < math.inf:  # the choice itself covers the excess with its own working set
        gain = sum(inflight * (saved[i] - inp[i]) for i in got.layers) + sum(inflight * core[i] for i in got.selective)
        ws = max([saved[i] for i in got.layers] + [core[i] for i in got.selective], default=0.0)
        assert excess <= 0 or gain >= excess + ws
        assert not set(got.layers) & set(got.selective)


@settings(max_examples=15, deadline=None)
@given(layers=layer_dicts(5), devices=st.sampled_from([1, 2, 4]), batch=st.sampled_from([4, 8]))
def test_plans_valid_and_deterministic(layers, devices, batch):
    prof = chain_profile(layers)
    cluster = small_cluster(devices, memory_bytes=4 * 10**9)
    req = PlanRequest(global_batch=batch)
    try:
        first = plan(prof, cluster, req)
    except Exception as exc:  # infeasible is a legitimate answer, anything else is a bug
        from planner.artifacts.errors import InfeasibleError

        assert isinstance(exc, InfeasibleError)
        return
    assert first == plan(prof, cluster, req)
    assert first.stages[0].layer_start == 0 and first.stages[-1].layer_stop == prof.num_layers
    for prev, nxt in zip(first.stages, first.stages[1:]):
        assert prev.layer_stop == nxt.layer_start
    assert first.layout.num_stages * first.layout.dp_degree == devices
    for st_ in first.stages:
        assert st_.memory_total_bytes <= st_.memory_cap_bytes
    assert first.predicted.partition_bound_ms <= first.predicted.iteration_ms * (1 + 1e-9)


def test_dp_plan_equals_bruteforce_plan():
    prof = chain_profile(
        [dict(fwd=1.0 + i % 3, bwd=2.0 + i % 2, params=10_000_000 * (i % 4), saved=3e8, inp=2e7, out=2e7) for i in range(6)]
    )
    cluster = small_cluster(4, memory_bytes=3 * 10**9)
    req = PlanRequest(global_batch=8, zero_stages=(0,))
    a = plan(prof, cluster, req)
    b = plan(prof, cluster, dataclasses.replace(req, solver="brute-force"))
    c = plan(prof, cluster, dataclasses.replace(req, solver="ilp"))
    assert math.isclose(a.predicted.iteration_ms, b.predicted.iteration_ms, rel_tol=1e-9)
    assert math.isclose(a.predicted.iteration_ms, c.predicted.iteration_ms, rel_tol=1e-6)
    assert any(s.recompute for s in a.stages), "the case should need recomputation"


@pytest.mark.parametrize("zero", [1, 2])
def test_zero_priced_identically_by_dp_cpsat_and_bruteforce(zero):
    """A case where ZeRO is what lets the stages fit: the three solvers agree on it, and the
    plan it gives is faster than the best without sharding."""
    prof = chain_profile(
        [dict(fwd=1.0 + i % 3, bwd=2.0 + i % 2, params=40_000_000 * (1 + i % 2), saved=1e8, inp=2e7, out=2e7)
         for i in range(6)]
    )
    cluster = small_cluster(4, memory_bytes=3 * 10**9)
    # the schedules the CP-SAT model prices (not the zero-bubble ones of the default)
    req = PlanRequest(global_batch=8, zero_stages=(0, zero), per_stage_replication=False,
                      schedules=(ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED_1F1B))
    a = plan(prof, cluster, req)
    b = plan(prof, cluster, dataclasses.replace(req, solver="brute-force"))
    c = plan(prof, cluster, dataclasses.replace(req, solver="ilp"))
    assert a.layout.zero == zero and a.layout.dp_degree > 1, (a.layout.zero, a.layout.dp_degree)
    assert (b.layout.zero, c.layout.zero) == (zero, zero)
    assert math.isclose(a.predicted.iteration_ms, b.predicted.iteration_ms, rel_tol=1e-9)
    assert math.isclose(a.predicted.iteration_ms, c.predicted.iteration_ms, rel_tol=1e-6)
    plain = plan(prof, cluster, dataclasses.replace(req, zero_stages=(0,)))
    assert a.predicted.iteration_ms < plain.predicted.iteration_ms
    for st_ in a.stages:
        assert st_.memory_total_bytes <= st_.memory_cap_bytes
        assert st_.memory.optimizer_bytes == pytest.approx(plain_optimizer_bytes(st_) / len(st_.ranks), abs=8)


def plain_optimizer_bytes(stage) -> float:
    """Adam-mixed keeps 12 bytes of optimizer state per parameter (the weights are 2)."""
    return stage.memory.param_bytes / 2 * 12


def test_interleaved_is_searched_and_wins_when_micro_batches_are_few():
    from planner.profiling.defaults import default_profile

    prof = default_profile()
    # without ZeRO or tensor parallelism (which let a shallower pipeline fit and win here otherwise)
    base = plan(prof, None, PlanRequest(global_batch=16, schedules=(ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B),
                                        zero_stages=(0,), tp_degrees=(1,)))
    req = PlanRequest(global_batch=16, schedules=(ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED_1F1B),
                      zero_stages=(0,), tp_degrees=(1,))
    inter = plan(prof, None, req)
    assert inter.schedule is ScheduleKind.INTERLEAVED_1F1B and inter.layout.virtual_stages_per_rank > 1
    assert inter.predicted.iteration_ms < base.predicted.iteration_ms
    assert inter.predicted.peak_memory_bytes <= inter.stages[0].memory_cap_bytes
    ranks = inter.layout.num_stages // inter.layout.virtual_stages_per_rank
    for st_ in inter.stages:
        assert inter.layout.coordinates(st_.ranks[0])[0] == st_.stage_idx % ranks  # round-robin chunks


@pytest.mark.parametrize("stages", [(0,), (1,), (2,), (1, 2), (0, 2)])
def test_plan_zero_is_one_the_request_allows(stages):
    """Whatever fits and wins, the plan's ZeRO stage is one the request asked for (also where
    memory binds nowhere, and with one rank per stage, where sharding changes nothing)."""
    roomy = chain_profile([dict(fwd=1.0, bwd=2.0, params=1000, saved=1e3, inp=1e2, out=1e2)] * 4)
    for devices in (1, 4):
        p = plan(roomy, small_cluster(devices), PlanRequest(global_batch=8, zero_stages=stages))
        assert p.layout.zero in stages, (devices, p.layout.zero)


@SETTINGS
@given(
    layers=layer_dicts(9, levels=True),
    ranks=st.integers(2, 3),
    chunks=st.integers(1, 3),
    rounds=st.integers(1, 3),
    microbatch_size=st.sampled_from([1, 2]),
    cap_gb=st.floats(0.05, 2.0),
)
def test_band_priced_tables_solve_as_fully_priced_ones(layers, ranks, chunks, rounds, microbatch_size, cap_gb):
    """``solve_chain`` prices recomputation only over the stages its DP reads (each stage's band,
    :func:`planner.solve.chain_dp._stage_bands`): the same solution, bit for bit, as on a table
    whose every stage was priced first, interleaved (in-flight counts differ per chunk) or not;
    and a second configuration on the band-priced table (other bands) solves as on a fresh one."""
    from planner.schedule import inflight_counts
    from planner.solve.chain_dp import solve_chain

    prof = chain_profile(layers)
    cm = CostModel(prof, small_cluster(8))
    num_microbatches = ranks * rounds  # interleaved 1F1B runs rounds of one micro-batch per rank
    if ranks * chunks > cm.num_layers:
        return
    schedule = ScheduleKind.INTERLEAVED_1F1B if chunks > 1 else ScheduleKind.ONE_F_ONE_B
    layout = Layout(num_stages=ranks * chunks, virtual_stages_per_rank=chunks)
    kw = dict(layout=layout, num_microbatches=num_microbatches, schedule=schedule)
    full = StageTable(cm, microbatch_size, cap_gb * 1e9 / chunks)
    for k in set(inflight_counts(schedule, layout, num_microbatches)):
        full.table(k)  # every stage priced
    banded = StageTable(cm, microbatch_size, cap_gb * 1e9 / chunks)
    assert solve_chain(banded, **kw) == solve_chain(full, **kw)
    other = dict(layout=Layout(num_stages=2), num_microbatches=num_microbatches, schedule=ScheduleKind.ONE_F_ONE_B)
    assert solve_chain(banded, **other) == solve_chain(StageTable(cm, microbatch_size, cap_gb * 1e9 / chunks), **other)


@pytest.mark.parametrize(("L", "P", "longest"), [(9, 3, 9), (9, 3, 2), (12, 6, 4), (7, 7, 1), (10, 1, 10)])
def test_stage_bands_are_the_stages_the_dp_reads(L, P, longest):
    """Each stage's band is exactly the (start, stop) pairs :class:`planner.solve.chain_dp._Bands`
    reads for it: start ``s + a`` (``a < w``), ``l + 1`` layers (``l < K``), not past the stage's
    last stop (``a + l < w``); stages with the same (in-flight count, cap) share one mask."""
    from planner.solve.chain_dp import _stage_bands
    from planner.solve.prices.fixed import lengths

    at = [(k % 2, 1.0) for k in range(P)]  # two tables, alternating stages
    bands = _stage_bands(at, lengths(L), longest)
    w = L - P + 1
    K = max(1, min(w, longest))
    for key in set(at):
        read = {(s + a, s + a + 1 + l) for s in range(P) if at[s] == key
                for a in range(w) for l in range(K) if a + l < w}
        assert {(int(i), int(j)) for i, j in zip(*bands[key].nonzero())} == read


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), L=st.integers(2, 11), P=st.integers(1, 5), M=st.integers(1, 9))
def test_useful_limit_keeps_the_dps_solution(data, L, P, M):
    """The chain DP visits no stage longer than any whose compute is within
    :func:`planner.solve.chain_dp._useful_limit` (a partition cutting at equal shares of the work
    bounds the optimum) and no cap above it: the same objective and partition, bit for bit, as
    over every stage, on integer times (many ties), random extra terms and infinite entries.
    Fails with the limit's ``sum_lb`` above the least sum (it would drop optimal stages)."""
    import numpy as np

    from planner.solve.chain_dp import INF, _heuristic_starts, _minimize, _useful_limit

    if P > L:
        return
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))  # integer entries: many ties
    work = np.array(data.draw(st.lists(st.integers(1, 9), min_size=L, max_size=L)), dtype=float)
    prefix = np.concatenate([[0.0], np.cumsum(work)])
    idx = np.arange(L + 1)
    valid = idx[None, :] > idx[:, None]
    compute = np.where(valid, prefix[None, :] - prefix[:, None], INF)
    tables, extra = [], []
    for _ in range(data.draw(st.integers(1, 3))):  # a few distinct tables, shared by several stages
        table = compute + rng.integers(0, 7, (L + 1, L + 1))
        gone = rng.random((L + 1, L + 1)) < data.draw(st.sampled_from([0.0, 0.0, 0.2, 0.6]))
        tables.append(np.where(gone, INF, table))
        extra.append(rng.integers(0, 7, (L + 1, L + 1)).astype(float))
    pick = data.draw(st.lists(st.integers(0, len(tables) - 1), min_size=P, max_size=P))
    tables, extra = [tables[k] for k in pick], [extra[k] for k in pick]
    cap_lb = max(float(work.max()), float(work.sum()) / P)
    full = _minimize(tables, extra, L, M, INF, cap_lb)
    limit = _useful_limit(tables, extra, _heuristic_starts(work, L, P), L, M, float(work.sum()))
    longest = int(np.max((compute <= limit) * (idx[None, :] - idx[:, None]))) if limit < INF else None
    narrowed = _minimize(tables, extra, L, M, limit, cap_lb, longest)
    if full is None:
        assert narrowed is None or limit == INF
        return
    assert narrowed is not None
    assert (narrowed[0], narrowed[2]) == (full[0], full[2])


def test_ilp_hides_the_reduction_behind_the_stages_own_backward_as_the_dp_does():
    """Found by ``test_dp_equals_brute_force``: under a stack that overlaps the gradient reduction
    with the backward (``small_cluster``'s), a stage's reduction hides behind its own backward
    too (``prices.extras.hidden_backward``); CP-SAT counted only the stages' before it, so it moved
    the layer with parameters off the first stage at the price of a larger transfer (10.19175
    against the optimum's 10.19163 ms)."""
    layer = {"fwd": 1.0, "bwd": 1.0, "params": 0, "saved": 0.0, "inp": 0.0, "out": 0.0}
    layers = [dict(layer, out=858734.0), dict(layer, params=2097126, out=858138.0), layer, layer, layer]
    cm = CostModel(chain_profile(layers), small_cluster(8))
    assert cm.stack.reduce_overlap(False)
    layout = Layout(num_stages=4, dp_degree=2)
    table = StageTable(cm, 1, 1e9, sharding=layout.sharding(0))
    dp = solve_three_ways(table, layout=layout, num_microbatches=1, schedule=ScheduleKind.GPIPE)
    assert dp is not None and dp.boundaries == (0, 2, 3, 4)
