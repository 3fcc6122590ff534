"""The busiest stage's floor (:mod:`planner.solve.stage_floor`) is below every proposal of a
configuration, its witness of a plan is never wrong, and the search that skips configurations by
them chooses the plan it chose without.

Against the solve itself: every proposal a configuration's search makes with nothing pruned (the
chain DP's optimum, its re-solve at a zero-bubble stage's conservative counts, the baselines'
partitions, each ZeRO 3 variant's), on small GPT cases where memory binds and drawn ones."""

from __future__ import annotations

import pytest

from planner.artifacts.plan import dumps_plan
from planner.schedule import held_counts
from planner.solve.chain_dp import solve_chain
from planner.solve.optimum import solve_config
from planner.solve.stage_floor import busiest_stage_above, largest_workspace, surely_fits, table_curve
from tests.test_search_pruning import CASES, PRUNED, _configs, _every_proposal, _random_case, _search_now


def _moe_configs():  # type: ignore[no-untyped-def]
    """A small Qwen3-MoE (8 layers of 8 experts) on 8 devices, its experts over 2 of them, at two
    memory caps where most configurations recompute: ``(cm, cap, facts, 1, config)``."""
    from planner.artifacts.cluster import PRESETS
    from planner.artifacts.layout import DeviceGroup
    from planner.artifacts.request import PlanRequest
    from planner.cost.groups import base_cluster
    from planner.cost.tensor_parallel import device_cost_model
    from planner.profiling.analytic.moe import moe_profile
    from planner.solve.floors import ConfigFacts
    from planner.solve.problem import memory_cap_bytes
    from planner.solve.space import all_configs
    from tests.test_moe import tiny

    profile = moe_profile(tiny(num_hidden_layers=8, hidden_size=512, max_position_embeddings=4096), seq=4096,
                          device_preset="h100-80gb")
    cluster = base_cluster(PRESETS["h100-80gb-x8"].with_devices(8), 8)
    for mib in (600, 1200):
        request = PlanRequest(global_batch=16, memory_cap_bytes=mib * 2**20)
        cm = device_cost_model(profile, cluster, request.optimizer, DeviceGroup(ep_degree=2), request.stack)
        cap = memory_cap_bytes(cm.cluster, request)
        facts = ConfigFacts(cm, request, cap)
        for c in all_configs(cm, request, 8):
            yield request, 8, (cm, cap, facts, 1, c)


def _one_chunk_configs():  # type: ignore[no-untyped-def]
    """Every configuration of one chunk per rank (not copied per stage) of small GPT cases, drawn
    ones and a mixture of experts: ``(cm, request, groups, cap, facts, config)``."""
    cases = [(*CASES[name], tps) for name, tps in (("tensor-zero-interleaved", (1, 2)), ("zero3", (1,)))]
    cases += [(*_random_case(seed), (1,)) for seed in (1, 4, 9, 13)]
    found = [(request, cluster.num_devices, row) for profile, cluster, request, degrees in cases
             for row in _configs(profile, cluster, request, cluster.num_devices, degrees)]
    for request, n, (cm, cap, facts, tp, c) in found + list(_moe_configs()):
        if c.layout.virtual_stages_per_rank == 1 and not c.layout.stage_replicas:
            yield cm, request, n // tp, cap, facts, c


def test_floor_is_below_every_proposals_busiest_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    """At the busiest stage time of any proposal (one chunk per rank), some partition might have
    every stage that fast: the floor never says otherwise. And it is above some proposals'
    (the check skips something), for a zero-bubble schedule too."""
    checked = above = above_split = 0
    for cm, request, num_groups, cap, facts, c in _one_chunk_configs():
        for cand in _every_proposal(cm, request, num_groups, cap, c, monkeypatch):
            config, sol = cand.config, cand.solution  # type: ignore[attr-defined]
            if config.layout.virtual_stages_per_rank > 1:
                continue
            table = facts.table_of(config)
            held = held_counts(config.schedule, config.layout, config.num_microbatches)
            busiest = max(sol.stage_times_ms)
            assert not busiest_stage_above(table, table_curve(table), held, busiest), (config, sol)
            checked += 1
            slower = busiest_stage_above(table, table_curve(table), held, busiest * 0.9)
            above += slower
            above_split += slower and config.schedule.splits_backward
    assert checked > 300
    assert above > 0 and above_split > 0


def test_witness_of_a_plan_is_never_wrong() -> None:
    """Where :func:`surely_fits` (at a zero-bubble stage's conservative counts) holds, the solve
    finds a plan; it holds on most configurations that have one, and on some that need
    recomputation to fit."""
    witnessed = solvable = recomputing = 0
    for _, _, _, _, facts, c in _one_chunk_configs():
        for v in facts.variants(c):
            table = facts.table_of(v)
            held = held_counts(v.schedule, v.layout, v.num_microbatches)
            counts = tuple(h.conservative for h in held) if v.schedule.splits_backward else held
            sol = solve_config(solve_chain, table, v)
            solvable += sol is not None
            if surely_fits(table, counts, largest_workspace(table)):
                assert sol is not None, v
                witnessed += 1
                recomputing += any(sol.recompute) or any(sol.selective)
    assert witnessed > solvable / 2
    assert recomputing > 0


def test_search_skips_hopeless_configurations_and_keeps_its_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search skips configurations unsolved by the floor and the witness
    (:meth:`ConfigSearch.hopeless`), and chooses the plan (and best time on all the devices) it
    chooses solving each of them."""
    from planner.solve.config_search import ConfigSearch

    real = ConfigSearch.hopeless
    skipped: list[bool] = []

    def counting(self: ConfigSearch, c: object, limit: float, read: bool = False) -> bool:
        found = real(self, c, limit, read)  # type: ignore[arg-type]
        skipped.append(found)
        return found

    monkeypatch.setattr(ConfigSearch, "hopeless", counting)
    with_floor = _search_now("tensor-zero-interleaved", PRUNED)
    assert any(skipped)
    monkeypatch.setattr(ConfigSearch, "hopeless", lambda self, c, limit, read=False: False)
    without = _search_now("tensor-zero-interleaved", PRUNED)
    assert dumps_plan(with_floor) == dumps_plan(without)


def test_baseline_partitions_left_out_are_those_the_check_drops() -> None:
    """:func:`~planner.solve.proposals.alternatives` given what the search's check lets through
    leaves out exactly the partitions whose proposal the check would drop (``M x`` its busiest
    stage above it), each before its recomputation is chosen; the others are the same proposals."""
    from planner.solve.proposals import alternatives

    left_out = kept = 0
    for cm, request, _, cap, _, c in _one_chunk_configs():
        every = alternatives(cm, c, cap, request.recompute)
        if not every:
            continue
        busiest = sorted(c.num_microbatches * max(cand.solution.stage_times_ms) for cand in every)
        for limit in (busiest[0] * 0.999, busiest[-1]):
            some = alternatives(cm, c, cap, request.recompute, busiest_limit_ms=limit)
            through = [cand for cand in every if c.num_microbatches * max(cand.solution.stage_times_ms) <= limit]
            assert [cand.solution for cand in some if c.num_microbatches * max(cand.solution.stage_times_ms) <= limit] \
                == [cand.solution for cand in through]
            left_out += len(every) - len(some)
            kept += len(some)
    assert left_out > 0 and kept > 0


def test_memory_floor_is_infinite_only_where_nothing_fits() -> None:
    """Where the ranks cannot hold the profile's work at their leanest between them
    (:func:`~planner.solve.rank_memory.stages_hold_work`, each stage at every held state), the
    memory floor is infinite and the search skips the configuration: then none of its variants
    (its own ZeRO stage, ZeRO 3 and HSDP) has a solution. Every schedule, small GPTs, drawn cases
    and a small Qwen3-MoE; it is infinite somewhere for a zero-bubble schedule and another."""

    cases = [(*CASES[name], tps) for name, tps in (("tensor-zero-interleaved", (1, 2)), ("zero3", (1,)))]
    cases += [(*_random_case(seed), (1,)) for seed in (1, 4, 9, 13)]
    rows = [row for profile, cluster, request, degrees in cases
            for row in _configs(profile, cluster, request, cluster.num_devices, degrees)]
    rows += [row for _, _, row in _moe_configs()]
    infinite, split, other = 0, 0, 0
    for _, _, facts, _, c in rows:
        if facts.memory_floor_ms(c, 1.0) < float("inf"):
            continue
        variants = facts.variants(c) + (facts.fsdp_variants(c) if c.fsdp_searched else [])
        for v in variants:
            assert solve_config(solve_chain, facts.table_of(v), v) is None, v
        infinite += 1
        split += c.schedule.splits_backward
        other += not c.schedule.splits_backward
    assert infinite > 0 and split > 0 and other > 0


def test_a_curve_whose_last_segment_has_no_width_extends_at_the_one_before() -> None:
    """Bytes too small to move a float (1.5e-200 after 1.0) leave a last segment of no width: the
    curve extends at the slope of the last segment that has one (it divided by zero before)."""
    import numpy as np

    from planner.solve.rank_memory import last_slope, recompute_ms

    xs, ys = np.array([0.0, 1.0, 1.0 + 1.5e-200]), np.array([0.0, 2.0, 2.0 + 3e-200])
    assert xs[-1] == xs[-2]
    assert last_slope(xs, ys) == 2.0
    assert float(recompute_ms((xs, ys), 3.0)) == 6.0
    assert last_slope(np.array([0.0]), np.array([0.0])) == 0.0
