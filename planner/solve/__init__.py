"""Solvers: from a Profile, a Cluster and a PlanRequest to a Plan.

``plan(profile, cluster, request)`` dispatches on ``request.solver``:

- ``dp`` (default): exact DP per configuration, re-scored by the simulator (:mod:`.search`);
- ``ilp``: the same problem as an OR-Tools CP-SAT model (:mod:`.ilp`);
- ``brute-force``: every cut set and recompute mask, for small cases (:mod:`.bruteforce`);
- baselines ``uniform``, ``parameters``, ``time-balanced``, ``pipedream``, ``data-parallel``
  (:mod:`.baselines`).

The tensor-parallel degree t (and sequence parallelism) is searched around the chosen solver:
for each t the solver plans the model and cluster as one tensor-parallel group sees them
(:func:`planner.cost.tensor_parallel.tensor_parallel_view`), the plan is lifted back onto real
devices, and the best over every t is selected by the request's objective. The baselines are
the peers' partition methods as published: they plan t = 1 only.
"""

from __future__ import annotations

import importlib
from typing import Callable

from planner.artifacts.cluster import DEFAULT_CLUSTER, PRESETS, Cluster
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile
from planner.artifacts.request import PlanRequest
from planner.artifacts.errors import InfeasibleError, PlannerInputError

BASELINES = ("uniform", "parameters", "time-balanced", "pipedream", "data-parallel")
SOLVERS = ("dp", "ilp", "brute-force") + BASELINES


def _solver(name: str) -> Callable[[Profile, Cluster, PlanRequest], Plan]:
    if name == "dp":
        from planner.solve.search import dp_plan

        return dp_plan
    if name in ("ilp", "brute-force"):
        module = importlib.import_module("planner.solve." + {"ilp": "ilp", "brute-force": "bruteforce"}[name])
        return module.solve_plan
    if name in BASELINES:
        from planner.solve.baselines import baseline_plan

        return lambda profile, cluster, request: baseline_plan(profile, cluster, request, name=name)
    raise PlannerInputError(f"unknown solver {name!r} (known: {', '.join(SOLVERS)})")


def plan(profile: Profile, cluster: Cluster | None = None, request: PlanRequest | None = None) -> Plan:
    """The best plan for ``profile`` on ``cluster`` under ``request`` (see module docstring)."""
    cluster = cluster or PRESETS[DEFAULT_CLUSTER]
    request = request or PlanRequest()
    solve = _solver(request.solver)
    if request.solver in BASELINES:
        if any(t != 1 for t in request.tp_degrees):
            raise PlannerInputError(f"solver {request.solver!r} is a baseline partition method: it plans --tp 1 only")
        return solve(profile, cluster, request)
    return _over_tensor_parallel(profile, cluster, request, solve)


def _over_tensor_parallel(
    profile: Profile, cluster: Cluster, request: PlanRequest, solve: Callable[[Profile, Cluster, PlanRequest], Plan]
) -> Plan:
    """The best plan over every tensor-parallel degree (and sequence-parallel setting) the
    request and the profile allow (see the module docstring)."""
    import dataclasses

    from planner.solve.search import merge_pareto, num_devices_of, select
    from planner.cost.tensor_parallel import base_cluster, candidate_degrees, lift, tensor_parallel_view

    n = num_devices_of(cluster, request)
    base = base_cluster(cluster, n)
    plans: list[Plan] = []
    infeasible: list[InfeasibleError] = []
    for t in candidate_degrees(profile, base, n, request.tp_degrees):
        # sequence parallelism is never slower and never larger under this cost model (same
        # collective time, every split cost / t), so where both are allowed only "on" is searched
        for sp in ([max(request.sequence_parallel)] if t > 1 else [False]):
            view_profile, view_cluster = tensor_parallel_view(profile, base, t, sp)
            sub = dataclasses.replace(
                request, num_devices=n // t, per_stage_replication=request.per_stage_replication and t == 1
            )
            try:
                found = solve(view_profile, view_cluster, sub)
            except InfeasibleError as exc:
                infeasible.append(exc)
                continue
            plans.append(lift(found, profile, cluster, t, sp, request))
    if not plans:
        raise infeasible[0]
    # equal times (sequence parallelism often costs no time): the leaner plan, then the smaller t
    plans.sort(key=lambda p: (p.predicted.iteration_ms, p.predicted.peak_memory_bytes, p.tp_degree))
    best = select(plans, request)
    return dataclasses.replace(best, pareto=merge_pareto(p for plan in plans for p in plan.pareto))
