"""The default solver: an exact DP per configuration, configurations enumerated, the best few
re-scored by the event simulator; the same search for every tensor-parallel degree.

Dimensions searched (:mod:`planner.solve.space` enumerates the layouts of one degree):

- tensor-parallel degree t and sequence parallelism (:func:`planner.cost.groups.tensor_settings`), and the
  context-parallel degree cp (:func:`planner.cost.context_degrees.candidate_cp_degrees`): for each, a cost
  model of one device of a t-device group, cp such groups splitting each sequence
  (:func:`planner.cost.tensor_parallel.device_cost_model`), and the search below over layouts of
  t x cp-device groups; the best over every (t, cp) is selected by the request's objective
  (on equal times cp = 1 wins, then the leaner plan, then the smaller t). How the degrees are
  searched together: see "Pruning across degrees" below;
- pipeline ranks P, replicated pipelines D (P x D groups, every divisor of the N available),
  chunks per rank v (interleaved 1F1B), micro-batch size b (hence M = G / (D b)), schedule;
- ZeRO: every configuration with D > 1 is solved at the deepest stage the request allows
  (sharding frees memory and moves no more bytes, so that optimum is never slower), unless
  memory binds nowhere; the plan then keeps the least stage under which its partition still
  fits at the same time (:func:`planner.solve.build.least_zero`);
- per-stage replication (every objective: the memory objective's 10% counts from the fastest plan,
  replicated or not; t = 1, at most
  :attr:`SearchSettings.replicated_max_devices` devices): the exact DP over (layer, devices
  used) of :mod:`planner.solve.replicated` at the micro-batch sizes of the best uniform plans,
  plus PipeDream's own split (:mod:`planner.solve.replicated_search`).

For each configuration :func:`planner.solve.chain_dp.solve_chain` finds the exact optimum of
the pipeline objective J with per-stage recomputation (the baselines' partitions are proposed
beside it); every optimum is replayed by the simulator and the fastest by simulation wins (ties:
fewer stages, larger micro-batch, schedule name). The (iteration time, peak memory) points seen
on the way, and the same search under tighter memory caps, form the Pareto front.

A layout on fewer than N groups (ranks 0 .. n - 1) wins only by simulated time (on equal time
the one on more devices); configurations on all N are pruned only against the best of those, so
the best plan on all N is known and the plan records it (``predicted.all_devices_ms``).

Pruning across degrees (issue 24; the time objective, :func:`pruned_degrees`): the
configurations of every (t, cp) are visited in one order, by increasing lower bound, against
one incumbent (:class:`planner.solve.objectives.Incumbent`: the fastest simulated time found in
any degree, and the fastest on all the devices). A degree is opened (its cost model's
configurations listed and bounded, the coarse chain built) only when its bound
(the bound of :class:`planner.solve.degrees.Degree`, below every configuration's) comes up in that order, and the
visit stops when the next bound exceeds the best time on all the devices. A configuration is
solved only if its bound does not exceed what it must beat (the best on all the devices for one
on all of them, else the best of any: ties are solved, so equal-time plans still meet the
tie-breaks). The bounds, each valid for every partition, recomputation and ZeRO variant solved:
:func:`planner.solve.floors.config_lower_bound_ms` (average work), the fill of a one-chunk GPipe /
1F1B pipeline, and the memory floor (:meth:`planner.solve.floors.ConfigFacts.memory_bound`:
the recomputation a rank must do to fit, at the cheapest ms per byte freed); a solved
configuration's proposals are simulated only if its busiest rank's ``M x`` work (the sum of its
chunks') does not exceed it, and a configuration of one chunk per rank whose every partition has
a stage slower than ``1 / M`` of it, and that surely fits, is not solved at all
(:mod:`planner.solve.stage_floor`). Then every opened degree with candidates builds its plans as before
(refinement of coarse candidates, re-scoring, the tighter memory caps over its best
configurations), the cp = 1 degrees first; a cp > 1 degree keeps only candidates faster than the
best plan before it and searches no tighter caps (as before issue 24), and builds its best
candidate on all the devices whatever its time (else a plan on fewer devices could record no
plan, or a slower one, as the best on all of them). When no degree finds a
candidate nothing was pruned, and the refusal explains the degree that came closest, as before.
``SearchSettings(prune_degrees=False)`` restores the search before issue 24 (every cp = 1
degree searched on its own in full, :func:`degree_by_degree`); with ``prune_configs=False``
too, nothing is pruned (the exhaustive search :mod:`tests.test_search_pruning` compares with).

Decision (the Pareto front): a degree whose configurations are all pruned contributes no
points, and a degree's "best configurations" re-solved under tighter caps are the best of
those solved under the shared incumbent, so the front can differ from the per-degree search's
(fewer points at the lean-memory end, where a larger t that never competes on time had them).
Keeping every degree's own front would need every degree's own search, the cost this removes.
Pruning never skips a configuration that could beat, or tie, the incumbent it is bounded against,
so the chosen plan and ``all_devices_ms`` are the exhaustive search's but where that plan is one
no configuration's own solve proposes: a partition forced by a tighter cap's Pareto pass (over
configurations the searches rank differently), or a memory rebalancing whose gate (the
candidate without its recomputation, a heuristic and not a bound: the rebalancing re-solves the
partition) the pruned search tests against a lower incumbent. Measured on 3,000 drawn small
GPT cases: 6 differ (the pruned plan 0.01-5.8% slower), each asking for interleaved 1F1B only
(460 of the 3,000 did); on 400 drawn requests with more of the request's knobs, 2 (0.4%, 0.5%),
each asking for ZBV only (two chunks per rank, rebalanced alike; RESULTS 33). The golden corpus's
differing fronts are listed in RESULTS section 22.

The memory objective (the least memory within 10% of the fastest plan, or within its time
budget; :class:`planner.solve.objectives.Budget`) searches the degrees one by one against one
incumbent, the fastest candidates of every degree so far: each configuration is pruned with
the same bounds against the budget of that (``1.1 x`` it, or the time budget where that is
more; a configuration on all the devices against the fastest on all of them), as are the
tighter-cap passes; it builds plans only for the candidates within that budget (and each
degree's best on all the devices). Pruned or not, it rebalances every configuration whose
solution recomputes (the time objective's gate is a heuristic, and it depends on the order of the
visit) and keeps, beside each configuration's fastest proposal, every proposal leaner than each
faster one (a rebalancing or another partition can be slower and leaner; the ME objective
alike). Every candidate it could choose is still found, so its plan is the search without
pruning's (``prune_configs=False``);
its Pareto front holds the points within the budget only. On a grouped profile (more layers
than ``chain_max``) the candidates over groups are pruned against the budget widened by
``budget_refine_slack`` (20%) and every one within it is refined and built: a heuristic, as the
time objective's pruning there (the refinement of a candidate can speed it up by more than
``refine_slack``; on a drawn ResNet-18 the leanest plan within the budget needed 10%). GPT-3
175B on 64 A100s: 224 s of CPU before, 25 s (RESULTS 35).

The ME objective (the index ``(t_ref / t) / (m / m_ref)`` against the fastest GPipe plan without
recomputation, so the plan with the least ``t x m``) finds that reference first, by the time
objective's search restricted to it (:func:`me_reference`: the same plan whether or not the ME
search prunes), then searches the degrees one by one against one
:class:`planner.solve.objectives.MeIncumbent` (with one incumbent of times): a configuration, in
every pass (the cap and the tighter caps), is solved only if its time bound times its memory floor
(the state's share of a rank, then the least over partitions of the largest stage's fewest bytes at
its leanest recomputation) is at most the least ``t x m`` found, or it could give the fastest plan
(where there is no reference plan) or the fastest on all the devices; configurations are visited by time bound
x state share, the leanest first; every configuration whose solution recomputes is rebalanced (as
without pruning); plans are built only for the candidates that could be one of those. Its plan,
index and reference are the search without pruning's (380 drawn cases, 0 differ; RESULTS 36;
the reference, when it was the fastest GPipe candidate without recomputation the ME search
itself kept, differed on the cnn and resnet fixtures: tests/test_objectives.py);
its Pareto front holds fewer points (those built). On a grouped profile every figure a
configuration must beat is widened by ``budget_refine_slack`` (the refinement changes a
candidate's time and memory): a heuristic, as the memory objective's there, for which
configurations are solved; which of their candidates are refined and built is decided by bounds
instead (:mod:`planner.solve.grouped_builds`: a candidate's configuration's time and memory floors
over the layers themselves against what the plans already built reach), so among the candidates
found over groups none whose plan could be the choice is left unbuilt.

Memory: before any stage table is built, the working-set ceiling (:mod:`planner.solve.ceiling`)
bounds the chain every degree searches over; a longer one is coarsened into blocks, and the
chosen plan's ``provenance.search_notes`` says so in one line.

The request's layout constraints hold for every candidate, not only the DP's: ``num_stages``
and ``dp_degree`` fix P and D (a forced D excludes per-stage replication), ``fixed_boundaries``
start a stage (a model chunk, interleaved) at each of those layers in the DP's table, in the
baseline partitions proposed beside it and in PipeDream's split; a request no plan can meet is
refused before the search (:func:`planner.solve.layout_search.refuse_unmeetable`) or by the
infeasibility explanation (:mod:`planner.solve.infeasible`).
"""

from __future__ import annotations

import dataclasses
import heapq

from planner.artifacts.cluster import Cluster
from planner.artifacts.errors import InfeasibleError, PlannerInputError
from planner.artifacts.kinds import Objective, RecomputeMode, ScheduleKind, SolverKind
from planner.artifacts.layout import DeviceGroup
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile
from planner.artifacts.progress import note
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.cost.groups import device_groups
from planner.solve.build import over_cap
from planner.solve.ceiling import ChainBound, bound_chain
from planner.solve.degrees import degree_models
from planner.solve.layout_search import LayoutSearch, wanted_chain
from planner.solve.objectives import Incumbent, TimePolicy, policy_for
from planner.solve.optimum import ChainSolver
from planner.solve.problem import Problem
from planner.solve.select import chosen
from planner.solve.settings import SETTINGS, SearchSettings


def num_devices_of(cluster: Cluster, request: PlanRequest) -> int:
    """The devices a request plans on (all the cluster's unless it names fewer), refused where it
    names more than the cluster has."""
    n = request.num_devices or cluster.num_devices
    if n > cluster.num_devices:
        raise PlannerInputError(
            f"--devices {n} is more than cluster {cluster.name!r} has ({cluster.num_devices})"
        )
    return n


def search_plan(
    profile: Profile, cluster: Cluster, request: PlanRequest, *, solver: SolverKind, chain_solver: ChainSolver,
    settings: SearchSettings = SETTINGS,
) -> Plan:
    """The best plan over every tensor-parallel degree (see the module docstring)."""
    n = num_devices_of(cluster, request)
    problem = Problem.of(profile, cluster, request, solver, n)  # plans record the cluster as given
    reference = me_reference(profile, cluster, request, solver, chain_solver, settings)
    base, groups = device_groups(profile, cluster, n, request)  # base: part of one node when the devices fit in one
    # the working-set ceiling, before any stage table is built (planner.solve.ceiling)
    bound = bound_chain(profile.num_layers, tuple(g.groups_in(n) for g in groups), request, settings)
    if request.objective is Objective.TIME and settings.prune_degrees and settings.prune_configs:
        plans = pruned_degrees(problem, base, groups, n, chain_solver, settings, bound)
    else:
        plans = degree_by_degree(problem, base, groups, n, chain_solver, settings, bound, reference is not None)
    # equal times (sequence parallelism often costs no time): no context parallelism, the leaner
    # plan, then the smaller t
    plans.sort(key=lambda p: (p.predicted.iteration_ms, p.layout.cp_degree, p.predicted.peak_memory_bytes,
                              p.layout.tp_degree))
    best = chosen(plans, request, reference, [p for plan in plans for p in plan.pareto])
    cap = problem.cap_bytes
    if best.predicted.peak_memory_bytes > cap:  # never returned (build_best drops such plans)
        raise over_cap(best, cap)
    # a coarsened search says so on its plan, once (the longest chain any degree wanted)
    wanted = max(wanted_chain(profile.num_layers, g.groups_in(n), request, chain_solver, settings) for g in groups)
    if wanted > bound.max_chain:
        best = dataclasses.replace(best, provenance=dataclasses.replace(
            best.provenance, search_notes=best.provenance.search_notes + (bound.note(wanted),)))
    return best


def me_reference(
    profile: Profile, cluster: Cluster, request: PlanRequest, solver: SolverKind, chain_solver: ChainSolver,
    settings: SearchSettings,
) -> Plan | None:
    """The ME index's reference plan: the fastest GPipe plan without recomputation (the seed's
    baseline), found by the time objective's search restricted to those, so that it is the same
    whatever the ME search prunes (and does not depend on which candidates that search keeps or
    refines). None for the other objectives, a request without GPipe, or where no such plan fits
    (the index then counts from the fastest plan found)."""
    if request.objective is not Objective.ME or ScheduleKind.GPIPE not in request.schedules:
        return None
    ask = dataclasses.replace(request, objective=Objective.TIME, schedules=(ScheduleKind.GPIPE,),
                              recompute_mode=RecomputeMode.NONE, time_budget_ms=0.0)
    try:
        return search_plan(profile, cluster, ask, solver=solver, chain_solver=chain_solver, settings=settings)
    except InfeasibleError:
        return None


def degree_by_degree(
    problem: Problem, base: Cluster, groups: list[DeviceGroup], n: int, chain_solver: ChainSolver,
    settings: SearchSettings, chain_bound: ChainBound | None = None, referenced: bool = False,
) -> list[Plan]:
    """Each degree searched on its own, in order (the search with ``prune_degrees`` off, and
    the memory and ME objectives'): every cp = 1 degree in full, each cp > 1 one against the
    fastest plan of those before it (:func:`~planner.solve.objectives.policy_for`: the memory
    and ME objectives prune every degree against what they found in all of them). (With
    ``prune_configs`` on, such a degree's configurations on all the devices are pruned against
    that plan too, and a degree whose machine bound is above it is skipped: a plan on fewer
    devices may then record no best time on all of them, or a slower one, where the default
    search (which prunes those against the best on all the devices) and the exhaustive one
    record the best.)"""
    request = problem.request
    plans: list[Plan] = []
    infeasible: list[InfeasibleError] = []
    root = policy_for(request, settings, referenced)
    for degree in degree_models(problem, base, groups, n):
        group, cm, num_groups = degree.group, degree.cost_model, degree.num_groups
        note(f"searching {group.describe()}")
        earlier = min((p.predicted.iteration_ms for p in plans), default=float("inf"))
        policy = root.for_degree(earlier, group.cp_degree)
        if policy.skips_degree(degree.machine_bound_ms, earlier, group.cp_degree):
            continue  # no plan of these degrees can beat the incumbent (this view's work alone is slower)
        try:
            search = LayoutSearch(problem, cm, num_groups, chain_solver, policy, settings, chain_bound)
            for _ in search.visits:
                pass  # (each step visits one configuration)
            found = search.finish(earlier, suggest=False)
        except InfeasibleError as exc:
            infeasible.append(exc)
            continue
        if found is not None:
            plans.append(found)
            if policy.chooses_among_degrees:
                # the memory and ME objectives choose among every degree's plans: the least memory
                # within 10% of the fastest of all of them, the ME index against the fastest GPipe
                # plan of all of them (a degree's own choice is against its own fastest)
                plans += search.built
    if not plans:  # the explanation of the degree that came closest to fitting, with its suggestions
        raise min(infeasible, key=lambda exc: exc.need_bytes).complete()
    return plans


def pruned_degrees(
    problem: Problem, base: Cluster, groups: list[DeviceGroup], n: int, chain_solver: ChainSolver,
    settings: SearchSettings, chain_bound: ChainBound | None = None,
) -> list[Plan]:
    """Every degree's configurations visited in one order, by increasing lower bound, against
    one incumbent (the time objective; see the module docstring): a degree is opened (its cost
    model built, its configurations bounded) when its bound (:func:`degree_bound_ms`) comes up, and the visit
    stops when the next bound exceeds the best time on all the devices (every configuration
    left is then pruned). Then each opened degree that found a candidate builds its plans, the
    cp = 1 ones first; a cp > 1 degree keeps only candidates faster than their best plan."""
    shared = Incumbent()
    policy = TimePolicy(incumbent=shared, fill=True)
    # (bound, order, degree index): a degree's machine bound before it is opened, then the bound
    # of its next configuration
    heap: list[tuple[float, int, int]] = []
    models: dict[int, CostModel] = {}
    for i, degree in enumerate(degree_models(problem, base, groups, n)):
        models[i] = degree.cost_model
        heapq.heappush(heap, (degree.bound_ms, 0, i))
    searches: dict[int, LayoutSearch] = {}
    infeasible: dict[int, InfeasibleError] = {}  # by degree, as degree_by_degree meets them
    while heap:
        bound, opened, i = heapq.heappop(heap)
        if bound > shared.best_all:
            break  # every configuration left is bounded above the best on all the devices (>= the best)
        if not opened:
            note(f"searching {groups[i].describe()}")
            try:
                searches[i] = LayoutSearch(problem, models[i], groups[i].groups_in(n), chain_solver, policy, settings,
                                           chain_bound)
                following = next(searches[i].visits, None)  # its first configuration's bound
            except InfeasibleError as exc:
                infeasible[i] = exc
                continue
        else:
            following = next(searches[i].visits, None)  # visits the configuration at ``bound``: the next one's
        if following is not None:  # (None: every configuration visited)
            heapq.heappush(heap, (following, 1, i))
    plans: list[Plan] = []
    for i in sorted(searches, key=lambda i: (groups[i].cp_degree > 1, i)):  # cp = 1 first: the incumbent of cp > 1
        earlier = min((p.predicted.iteration_ms for p in plans), default=float("inf"))
        try:
            found = searches[i].finish(earlier, suggest=False)
        except InfeasibleError as exc:
            infeasible[i] = exc
            continue
        if found is not None:
            plans.append(found)
    if not plans:  # the explanation of the degree that came closest to fitting (the first of equals), in full
        raise min((infeasible[i] for i in sorted(infeasible)), key=lambda exc: exc.need_bytes).complete()
    return plans
