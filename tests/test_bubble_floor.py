"""The zero-bubble schedules' floor of fill and memory together (:mod:`planner.solve.bubble_floor`)
is below the simulated time of every proposal of a configuration (the chain DP's optimum, its
re-solve at a zero-bubble stage's conservative counts, its rebalancings, the baselines'
partitions, each ZeRO 3 variant's), on small GPT cases where memory binds, drawn ones and a
mixture of experts; and it is above both bounds it joins somewhere (it can skip something)."""

from __future__ import annotations

import pytest

from planner.solve.bubble_floor import zero_bubble_floor_ms
from tests.test_search_pruning import CASES, _configs, _random_case
from tests.test_stage_floor import _moe_configs


def _split_configs():  # type: ignore[no-untyped-def]
    """Every zero-bubble configuration (not copied per stage) of the cases:
    ``(cm, request, groups, cap, facts, config)``."""
    cases = [(*CASES[name], tps) for name, tps in (("tensor-zero-interleaved", (1, 2)), ("zero3", (1,)))]
    cases += [(*_random_case(seed), (1,)) for seed in (1, 4, 9, 13)]
    found = [(request, cluster.num_devices, row) for profile, cluster, request, degrees in cases
             for row in _configs(profile, cluster, request, cluster.num_devices, degrees)]
    for request, n, (cm, cap, facts, tp, c) in found + list(_moe_configs()):
        if c.schedule.splits_backward and not c.layout.stage_replicas:
            yield cm, request, n // tp, cap, facts, c


def _simulated_proposals(cm, request, num_groups, cap, c, monkeypatch: pytest.MonkeyPatch) -> list[float]:  # type: ignore[no-untyped-def]
    """The simulated time of every proposal ``c``'s search makes with nothing pruned."""
    import planner.solve.config_search as config_search
    from tests.test_search_pruning import solved

    times: list[float] = []
    real = config_search.simulated

    def recording(cm_: object, cand: object) -> float:
        t = real(cm_, cand)  # type: ignore[arg-type]
        times.append(t)
        return t

    monkeypatch.setattr(config_search, "simulated", recording)
    solved(cm, request, num_groups, cap, c)
    monkeypatch.setattr(config_search, "simulated", real)
    return times


def test_floor_is_below_every_proposals_simulated_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proposal of a zero-bubble configuration simulates faster than its floor; the floor is
    above both the fill without memory and the memory floor without waits somewhere, on ZBV too."""
    checked = above = above_v = 0
    for cm, request, num_groups, cap, facts, c in _split_configs():
        floor = zero_bubble_floor_ms(facts, c)
        for t in _simulated_proposals(cm, request, num_groups, cap, c, monkeypatch):
            assert floor <= t * (1 + 1e-9), (c, floor, t)
            checked += 1
        higher = floor > max(facts.split_fill_ms(c), facts.memory_floor_ms(c, 1.0)) * (1 + 1e-6) and floor < float("inf")
        above += higher
        above_v += higher and c.layout.virtual_stages_per_rank > 1
    assert checked > 100
    assert above > 0 and above_v > 0


def test_floor_is_zero_for_other_schedules() -> None:
    """Only the zero-bubble schedules are bounded here."""
    seen = 0
    for _cm, _cap, facts, _tp, c in _configs(*CASES["tensor-zero-interleaved"], 8, (1,)):
        if not c.schedule.splits_backward:
            assert zero_bubble_floor_ms(facts, c) == 0.0
            seen += 1
    assert seen > 0
