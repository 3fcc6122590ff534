"""Solvers: from a Profile, a Cluster and a PlanRequest to a Plan.

``plan(profile, cluster, request)`` dispatches on ``request.solver``:

- ``dp`` (default): exact DP per configuration, re-scored by the simulator (:mod:`.search`);
- ``ilp``: the same problem as an OR-Tools CP-SAT model (:mod:`.ilp`);
- ``brute-force``: every cut set and recompute mask, for small cases (:mod:`.bruteforce`);
- baselines ``uniform``, ``parameters``, ``time-balanced``, ``pipedream``, ``data-parallel``
  (:mod:`.baselines`).
"""

from __future__ import annotations

import importlib
from typing import Callable

from planner.artifacts.cluster import DEFAULT_CLUSTER, PRESETS, Cluster
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile
from planner.artifacts.request import PlanRequest
from planner.errors import PlannerInputError

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
    return _solver(request.solver)(profile, cluster, request)
