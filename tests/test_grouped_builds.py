"""The ME objective's builds over groups of layers (:mod:`planner.solve.grouped_builds`): the
floors over the layers it decides by are below every plan of the configuration the search
without pruning builds, and :class:`Built` holds only what plans built reach."""

from __future__ import annotations

import dataclasses

import pytest

from planner.artifacts.cluster import PRESETS, Cluster
from planner.artifacts.kinds import Objective, OptimizerKind, ScheduleKind, SolverKind
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.profiling.imported.pipedream import import_pipedream
from planner.solve.candidates import Candidate
from planner.solve.chain_dp import solve_chain
from planner.solve.grouped_builds import Built, LayerFloors
from planner.solve.problem import Problem, memory_cap_bytes
from planner.solve.search import search_plan
from tests.graph_fixtures import graph_path
from tests.test_search_pruning import EXHAUSTIVE


def _resnet(devices: int, cap_gib: int, fixed: int, optimizer: OptimizerKind) -> tuple[Profile, Cluster, PlanRequest]:
    """The ResNet-18-shaped fixture (71 layers: searched over groups of layers, then refined)."""
    return (import_pipedream(graph_path("resnet")), PRESETS["v100-16gb-2x8"].with_devices(devices),
            PlanRequest(global_batch=256, memory_cap_bytes=cap_gib * 2**30, fixed_boundaries=(fixed,),
                        objective=Objective.ME, optimizer=optimizer,
                        schedules=(ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED_1F1B)))


@pytest.mark.parametrize("case", ((8, 2, 70, OptimizerKind.ADAM_MIXED), (4, 4, 63, OptimizerKind.SGD_FP32)))
def test_layer_floors_are_below_every_plan_of_the_configuration(case: tuple[int, int, int, OptimizerKind],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Every plan the search without pruning builds (refined from a candidate over groups, mapped
    from a tighter cap's, the reference's): its time at least its configuration's time floor
    over the layers and its peak at least its memory floor; on draw 17's case (8 V100s, 2 GiB,
    a stage at 70) the floors of the chosen plan's configuration are 49.34 ms and 66.0 MB
    against 64.96 ms and 93.9 MB."""
    from planner.solve import build

    profile, cluster, request = _resnet(*case)
    built: list[tuple[CostModel, Candidate, Plan]] = []
    real = build.plan_of

    def capturing(problem: Problem, cm: CostModel, cand: Candidate) -> Plan:
        p = real(problem, cm, cand)
        built.append((cm, cand, p))
        return p

    monkeypatch.setattr(build, "plan_of", capturing)
    search_plan(profile, cluster, request, solver=SolverKind.DP, chain_solver=solve_chain, settings=EXHAUSTIVE)
    assert len(built) > 100
    floors: dict[tuple[int, int], LayerFloors] = {}
    tight = 0
    for cm, cand, p in built:
        c = cand.config
        ask = p.provenance.request
        key = (id(cm), id(ask))
        if key not in floors:
            floors[key] = LayerFloors(cm, ask, memory_cap_bytes(cm.cluster, ask))
        f = floors[key]
        t_floor, m_floor = f.time_ms(c), f.memory_bytes(c)
        assert t_floor <= p.predicted.iteration_ms and m_floor <= p.predicted.peak_memory_bytes, (c, t_floor, m_floor)
        tight += t_floor * m_floor >= 0.5 * p.predicted.iteration_ms * p.predicted.peak_memory_bytes
    assert tight > 0  # within 2x of a plan's product somewhere: the floors decide something


def test_built_holds_what_plans_reach() -> None:
    """:class:`Built` notes plans' own figures; a plan could hold them if its product is at most
    the least built (ties too), or where it could be the fastest (no reference plan) or the
    fastest on all the devices."""
    profile, cluster, request = _resnet(4, 4, 63, OptimizerKind.SGD_FP32)
    p = search_plan(profile, cluster, request, solver=SolverKind.DP, chain_solver=solve_chain)
    t, m = p.predicted.iteration_ms, p.predicted.peak_memory_bytes
    built = Built()
    assert built.could_hold(1e9, 1e18, False, True)  # nothing built: anything could
    built.note(p, on_all=False)
    assert built.product == t * m and built.fastest_ms == t and built.fastest_all_ms == float("inf")
    assert built.could_hold(t, m, False, True) and not built.could_hold(t * 1.01, m, False, True)
    assert built.could_hold(t, 2 * m, False, False) and not built.could_hold(t * 1.01, 2 * m, False, False)
    assert built.could_hold(t * 1.01, 2 * m, True, True)  # none on all the devices built yet
    built.note(dataclasses.replace(p, predicted=dataclasses.replace(p.predicted, iteration_ms=t / 2)), on_all=True)
    assert built.fastest_all_ms == t / 2 and not built.could_hold(t, 2 * m, True, True)


def test_me_without_a_reference_plan_chooses_the_unpruned_plan_on_a_grouped_profile() -> None:
    """Draw 17's case without GPipe among the schedules: no reference plan, so the index counts
    from the fastest plan built, which the bounds must keep too (:meth:`Built.could_hold`'s
    fastest). The pruned search chose 67.82 ms, 102.1 MB (index 5.18) when the groups' widened
    figures decided the builds; now both choose 64.96 ms, 93.9 MB (index 5.88)."""
    from tests.test_objectives import _me_found
    from tests.test_search_pruning import PRUNED, plan_or_refusal

    profile, cluster, request = _resnet(8, 2, 70, OptimizerKind.ADAM_MIXED)
    request = dataclasses.replace(request, schedules=(ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED_1F1B))
    pruned = plan_or_refusal(profile, cluster, request, PRUNED)
    assert _me_found(pruned) == _me_found(plan_or_refusal(profile, cluster, request, EXHAUSTIVE))
    assert isinstance(pruned, Plan) and pruned.predicted.iteration_ms == pytest.approx(64.9575, abs=1e-3)
