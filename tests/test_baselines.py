"""The baselines (:mod:`planner.solve.baselines`) price their plans as the search prices its own:
a baseline's layout is in the search's space, so the search is never slower than a baseline."""

from __future__ import annotations

import dataclasses

import pytest

from planner.artifacts.cluster import PRESETS
from planner.artifacts.kinds import SolverKind
from planner.artifacts.request import PlanRequest
from planner.profiling.analytic.gpt import gpt_profile
from planner.solve import plan
from planner.solve.build import rebuild_plan

BASELINES = (SolverKind.UNIFORM, SolverKind.PARAMETERS, SolverKind.TIME_BALANCED)


@pytest.fixture(scope="module")
def case():
    profile = gpt_profile(layers=8, hidden=1024, heads=8, seq=2048, vocab=32000, device_preset="h100-80gb")
    return profile, PRESETS["h100-80gb-x8"], PlanRequest(global_batch=64, tp_degrees=(1,))


def test_a_baseline_plan_prices_as_the_search_prices_its_layout(case):
    """GPT-3 13B on 8 H100s (plan_quality): the time-balanced plan was priced on the profile as
    measured (its own attention) where the search prices one device's view under the stack
    (FlashAttention-2's kernel): 20,409 ms against 21,421 for the same plan as the search prices it,
    and ours (20,423) read as slower than a baseline whose layout it searches."""
    profile, cluster, request = case
    for kind in BASELINES:
        p = plan(profile, cluster, _with_solver(request, kind))
        again = rebuild_plan(profile, cluster, p.provenance.request, layout=p.layout,
                             boundaries=[s.layer_start for s in p.stages], recompute=[s.recompute for s in p.stages],
                             selective=[s.recompute_selective for s in p.stages], microbatch_size=p.microbatch_size,
                             schedule=p.schedule, solver=kind)
        assert p.predicted.iteration_ms == pytest.approx(again.predicted.iteration_ms, rel=1e-9), kind


def test_the_search_is_no_slower_than_any_baseline(case):
    profile, cluster, request = case
    ours = plan(profile, cluster, request).predicted.iteration_ms
    for kind in BASELINES:
        assert ours <= plan(profile, cluster, _with_solver(request, kind)).predicted.iteration_ms * (1 + 1e-9), kind


def _with_solver(request: PlanRequest, kind: SolverKind) -> PlanRequest:
    return dataclasses.replace(request, solver=kind)
