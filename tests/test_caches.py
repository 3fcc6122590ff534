"""The module caches' registry (planner.artifacts.caches): every cache bounded and keyed
explicitly, one reset clearing them all, and a process planning a hundred different requests
(a long-lived notebook) keeping every cache within its bound (entries counted, not memory),
with no cost model outliving its plan in the caches held per cost model."""

from __future__ import annotations

import gc
import json
import random

import pytest

from planner.artifacts import caches
from planner.artifacts.caches import Cache, OwnedCache
from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.plan import plan_to_json
from planner.artifacts.request import PlanRequest
from planner.solve import plan
from planner.solve.prices import fits as prices_fits
from tests.chains import chain_profile, small_cluster

#: caches of the stage prices, the recompute knapsack, the rank arithmetic and the schedules
#: (registered when their modules are imported)
PRICE_CACHES = ("solve.prices.layers", "solve.prices.fixed", "solve.prices.batches", "solve.prices.sync",
                "solve.prices.lengths", "solve.prices.diagonals", "cost.collectives.stage_links",
                "solve.recompute.one_group_levels", "solve.recompute.group_combos",
                "cost.collectives.progressions", "artifacts.layout.stage_ranks", "schedule.inflight.counted", "schedule.inflight.walked",
                "schedule.build.build", "schedule.build.build_replicated", "schedule.build.replicated_triples",
                "schedule.build.encoded_orders", "simulation.replay.compiled_schedule", "schedule.inflight.held",
                "solve.build.machine_bounds")


def _request(rng: random.Random, k: int) -> tuple[object, object, PlanRequest]:
    """The ``k``-th of many different small planning requests: its own profile (layers, sizes,
    a selective level on some), cluster size, memory, batch and schedules."""
    num_layers = rng.randint(4, 10)
    layers = []
    for _ in range(num_layers):
        saved = rng.uniform(1e6, 60e6)
        layer = {"fwd": rng.uniform(0.2, 4.0), "bwd": rng.uniform(0.4, 8.0), "params": rng.randint(1, 4) * 1_000_000,
                 "saved": saved, "inp": saved / 8, "out": saved / 8}
        if rng.random() < 0.4:
            layer |= {"core": saved * 0.5, "core_ms": layer["fwd"] * 0.3}
        layers.append(layer)
    devices = rng.choice([2, 4, 8])
    cluster = small_cluster(devices, memory_bytes=rng.choice([300, 600, 2000]) * 10**6)
    schedules = rng.choice([(ScheduleKind.ONE_F_ONE_B,), (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B)])
    request = PlanRequest(global_batch=rng.choice([8, 16, 32]), schedules=schedules, tp_degrees=(1,))
    return chain_profile(layers, name=f"chain{k}"), cluster, request


def _plan_json(profile: object, cluster: object, request: PlanRequest) -> str | None:
    from planner.artifacts.errors import InfeasibleError

    try:
        return json.dumps(plan_to_json(plan(profile, cluster, request)), sort_keys=True)  # type: ignore[arg-type]
    except InfeasibleError:
        return None


def test_a_hundred_requests_keep_every_cache_within_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hundred different requests planned in one process: after each, every registered cache
    holds at most its bound (per owner for the caches held per cost model), with the bounds of
    the stage prices' caches made small so that they are reached (and cap views used on these
    short chains); afterwards no cost model is
    left holding entries, and :func:`caches.reset` empties every cache."""
    registered = {size.name for size in caches.sizes()}
    assert set(PRICE_CACHES) <= registered, sorted(set(PRICE_CACHES) - registered)
    small = {"solve.prices.layers": 3, "solve.prices.lengths": 2, "solve.prices.diagonals": 2,
             "cost.collectives.stage_links": 8, "cost.collectives.progressions": 3, "artifacts.layout.stage_ranks": 8,
             "solve.prices.fixed": 2, "solve.prices.batches": 2}
    for name, bound in small.items():
        monkeypatch.setattr(caches._REGISTRY[name], "bound", bound)
    monkeypatch.setattr(prices_fits, "VIEW_MIN_LAYERS", 0)  # cap views (and their diagonals) on short chains too
    caches.reset()
    rng = random.Random(46)
    most: dict[str, int] = {}
    planned = 0
    for k in range(100):
        planned += _plan_json(*_request(rng, k)) is not None
        for size in caches.sizes():
            assert size.within_bound, size
            most[size.name] = max(most.get(size.name, 0), size.most_per_owner)
    assert planned >= 60  # most requests have a plan: the caches were really used
    for name, bound in small.items():
        assert most[name] == bound, (name, most[name])  # each bound was reached, and held
    gc.collect()
    for name in ("solve.prices.fixed", "solve.prices.batches", "solve.prices.sync"):
        assert len(caches._REGISTRY[name]) == 0, name  # no cost model outlives its plan here
    caches.reset()
    assert all(size.entries == 0 for size in caches.sizes())


def test_reset_changes_no_plan() -> None:
    """The caches memoise pure functions: a request planned cold (after the public
    ``planner.reset_caches``) and warm gives the same plan, byte for byte."""
    import planner

    profile, cluster, request = _request(random.Random(7), 0)
    planner.reset_caches()
    cold = _plan_json(profile, cluster, request)
    assert any(size.entries for size in planner.cache_sizes())
    warm = _plan_json(profile, cluster, request)
    assert cold is not None and cold == warm
    planner.reset_caches()
    assert not any(size.entries for size in planner.cache_sizes())
    assert _plan_json(profile, cluster, request) == cold


def test_cache_bounds_and_owners() -> None:
    """A cache cleared when a store would pass its bound; an owned cache bounded per owner and
    freed with its owner; a bound below one refused with the cache's name."""

    class Owner:
        pass

    plain: Cache[int, int] = Cache("test.plain", key="int", bound=3)
    owned: OwnedCache[Owner, int, int] = OwnedCache("test.owned", key="owner -> int", bound=2)
    try:
        for i in range(7):
            plain.put(i, i)
            assert len(plain) <= 3 and plain.get(i) == i
        plain.put(6, 60)  # a key already held is replaced without clearing
        assert plain.get(6) == 60 and len(plain) == 1
        a, b = Owner(), Owner()
        for i in range(4):  # the third store clears the owner's two
            owned.put(a, i, i)
            owned.put(b, i, -i)
        sizes = {s.name: s for s in caches.sizes()}
        assert sizes["test.owned"].most_per_owner == 2 and sizes["test.owned"].entries == 4
        assert owned.get(a, 3) == 3 and owned.get(b, 3) == -3 and owned.get(a, 0) is None
        del a
        gc.collect()
        assert len(owned) <= 2
        with pytest.raises(ValueError, match=r"'test\.bad': bound must be at least 1"):
            Cache("test.bad", key="int", bound=0)
    finally:
        for name in ("test.plain", "test.owned"):
            caches._REGISTRY.pop(name, None)
