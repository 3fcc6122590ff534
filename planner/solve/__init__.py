"""Solvers: from a Profile, a Cluster and a PlanRequest to a Plan.

``plan(profile, cluster, request)`` dispatches on ``request.solver``
(:class:`~planner.artifacts.kinds.SolverKind`):

- ``dp`` (default): exact DP per configuration, re-scored by the simulator (:mod:`.search`);
- ``ilp``: the same problem as an OR-Tools CP-SAT model (:mod:`.ilp`);
- ``brute-force``: every cut set and recompute mask, for small cases (:mod:`.bruteforce`);
- baselines ``uniform``, ``parameters``, ``time-balanced``, ``pipedream``, ``data-parallel``
  (:mod:`.baselines`): the peers' partition methods as published, t = 1 only.

The three exact solvers search the same space (every tensor-parallel degree and layout,
:mod:`.space`) and differ only in the chain solver each configuration's partition comes from.

Modules, in the order the search uses them: :mod:`.settings` (tuning constants), :mod:`.problem`
(what a search is asked), :mod:`.space` (configurations), :mod:`.chain` (one configuration's
question and answer), :mod:`.prices` (the stage tables: what every stage costs and whether it
fits), one configuration's optimum (:mod:`.optimum`) by :mod:`.chain_dp` (the DP's recurrence
over the tables) or by the oracles :mod:`.ilp` / :mod:`.bruteforce` (priced from the cost model
directly), :mod:`.recompute` (the per-stage knapsack), :mod:`.candidates` (scoring a solution:
its simulated time and memory), :mod:`.proposals` (what a solved configuration proposes beside
its optimum), :mod:`.replicated` / :mod:`.replicated_search` (per-stage replication),
:mod:`.coarsen` (long profiles), :mod:`.build` (a Plan from a partition; the best candidates'
plans), :mod:`.select` (the chosen plan, the Pareto front), :mod:`.search` (all of it),
:mod:`.infeasible` (why nothing fits), :mod:`.forced` (recomputation forced on every block),
:mod:`.relax` (less recomputation where the chosen plan has room), :mod:`.account`
(the chosen plan's overhead terms and band).
"""

from __future__ import annotations

import dataclasses
import importlib

from planner.artifacts.cluster import DEFAULT_CLUSTER, PRESETS, Cluster
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.host import OffloadMode
from planner.artifacts.kinds import BASELINES, REQUESTABLE_SOLVERS, Objective, Precision, RecomputeMode, SolverKind
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile
from planner.artifacts.request import PlanRequest
from planner.cost.precision import at_precision, check_precision, check_profile, with_fp8_view
from planner.solve.account import with_accounts
from planner.solve.bruteforce import solve_chain_bruteforce
from planner.solve.chain_dp import solve_chain
from planner.solve.forced import plan_forced
from planner.solve.offload import plan_offload
from planner.solve.optimum import ChainSolver
from planner.solve.relax import relax_recompute
from planner.solve.search import search_plan

__all__ = ["BASELINES", "SOLVERS", "plan"]

#: every solver name a request may give, as the CLI lists them
SOLVERS: tuple[str, ...] = tuple(k.value for k in REQUESTABLE_SOLVERS)


def chain_solver_of(kind: SolverKind) -> ChainSolver:
    """The chain solver of an exact solver kind. CP-SAT is imported only when asked for
    (importing OR-Tools costs about a second)."""
    if kind is SolverKind.DP:
        return solve_chain
    if kind is SolverKind.BRUTE_FORCE:
        return solve_chain_bruteforce
    if kind is SolverKind.ILP:
        return importlib.import_module("planner.solve.ilp").solve_chain_ilp  # type: ignore[no-any-return]
    raise PlannerInputError(f"solver {kind.value!r} is not an exact solver")


def plan(profile: Profile, cluster: Cluster | None = None, request: PlanRequest | None = None) -> Plan:
    """The best plan for ``profile`` on ``cluster`` under ``request`` (see module docstring); with
    several precisions asked, the best over them (each priced by :func:`planner.cost.precision.at_precision`)."""
    cluster = cluster or PRESETS[DEFAULT_CLUSTER]
    request = request or PlanRequest()
    if request.precisions == (Precision.BF16,):
        return _plan_at(profile, cluster, request)
    if any(p.fp8 for p in request.precisions):
        profile = with_fp8_view(profile)  # an analytic profile written before the FP8 view: derived at load time
    for p in request.precisions:
        check_precision(cluster, p)
        check_profile(profile, p)
    plans = [dataclasses.replace(_plan_at(at_precision(profile, cluster, p), cluster, request), precision=p)
             for p in request.precisions]
    if request.objective is Objective.TIME:
        return min(plans, key=lambda p: p.predicted.iteration_ms)
    return min(plans, key=lambda p: (p.predicted.peak_memory_bytes, p.predicted.iteration_ms))


def _plan_at(profile: Profile, cluster: Cluster, request: PlanRequest) -> Plan:
    kind = request.solver
    if kind.is_baseline:
        if any(t != 1 for t in request.tp_degrees):
            raise PlannerInputError(f"solver {kind.value!r} is a baseline partition method: it plans --tp 1 only")
        from planner.solve.baselines import baseline_plan  # with PipeDream's optimizer: not imported for the search

        return with_accounts(baseline_plan(profile, cluster, request, kind=kind), profile, cluster, request)
    notes: list[str] = []  # what the searches noted (a coarsened chain), kept on the plan however it is rebuilt

    def search(prof: Profile, clu: Cluster, req: PlanRequest) -> Plan:
        found = search_plan(prof, clu, req, solver=kind, chain_solver=chain_solver_of(kind))
        notes.extend(n for n in found.provenance.search_notes if n not in notes)
        return found

    def plan_one(prof: Profile, req: PlanRequest) -> Plan:
        if req.recompute_mode in (RecomputeMode.FULL, RecomputeMode.SELECTIVE):
            chosen = plan_forced(prof, cluster, req, search)
        else:
            chosen = relax_recompute(search(prof, cluster, req), prof, cluster, req)
        chosen = with_accounts(chosen, prof, cluster, req)
        if tuple(notes) != chosen.provenance.search_notes:
            chosen = dataclasses.replace(chosen, provenance=dataclasses.replace(chosen.provenance, search_notes=tuple(notes)))
        return chosen

    if request.offload is OffloadMode.NONE:
        return plan_one(profile, request)
    return plan_offload(profile, cluster, request, plan_one)
