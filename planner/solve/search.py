"""The default solver: an exact DP per configuration, configurations enumerated, the best few
re-scored by the event simulator; the same search for every tensor-parallel degree.

Dimensions searched (:mod:`planner.solve.space` enumerates the layouts of one degree):

- tensor-parallel degree t and sequence parallelism (:func:`tensor_settings`), and the
  context-parallel degree cp (:func:`planner.cost.context.candidate_cp_degrees`): for each, a cost
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
  fits at the same time (:func:`planner.solve.candidates.least_zero`);
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
one incumbent (:class:`planner.solve.candidates.Incumbent`: the fastest simulated time found in
any degree, and the fastest on all the devices). A degree is opened (its cost model's
configurations listed and bounded, the coarse chain built) only when its bound
(:func:`degree_bound_ms`, below every configuration's) comes up in that order, and the
visit stops when the next bound exceeds the best time on all the devices. A configuration is
solved only if its bound does not exceed what it must beat (the best on all the devices for one
on all of them, else the best of any: ties are solved, so equal-time plans still meet the
tie-breaks). The bounds, each valid for every partition, recomputation and ZeRO variant solved:
:func:`planner.solve.space.config_lower_bound_ms` (average work), the fill of a one-chunk GPipe /
1F1B pipeline, and the memory floor (:meth:`planner.solve.candidates.ConfigSearch.memory_bound`:
the recomputation a rank must do to fit, at the cheapest ms per byte freed); a solved
configuration's proposals are simulated only if its busiest rank's ``M x`` work (the sum of its
chunks') does not exceed it. Then every opened degree with candidates builds its plans as before
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
budget; :class:`planner.solve.candidates.Budget`) searches the degrees one by one against one
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
recomputation, so the plan with the least ``t x m``) searches the degrees one by one against one
:class:`planner.solve.candidates.MeIncumbent` (with one incumbent of times): a configuration, in
every pass (the cap and the tighter caps), is solved only if its time bound times its memory floor
(the state's share of a rank, then the least over partitions of the largest stage's fewest bytes at
its leanest recomputation) is at most the least ``t x m`` found, or it could give a faster
reference (GPipe with a partition that fits without recomputation), the fastest plan (while no
reference is known) or the fastest on all the devices; configurations are visited by time bound
x state share, the leanest first; every configuration whose solution recomputes is rebalanced (as
without pruning); plans are built only for the candidates that could be one of those. Its plan,
index and reference are the search without pruning's (380 drawn cases, 0 differ; RESULTS 36);
its Pareto front holds fewer points (those built). On a grouped profile every figure a
configuration must beat is widened by ``budget_refine_slack`` (the refinement changes a
candidate's time and memory): a heuristic, as the memory objective's there.

The request's layout constraints hold for every candidate, not only the DP's: ``num_stages``
and ``dp_degree`` fix P and D (a forced D excludes per-stage replication), ``fixed_boundaries``
start a stage (a model chunk, interleaved) at each of those layers in the DP's table, in the
baseline partitions proposed beside it and in PipeDream's split; a request no plan can meet is
refused before the search (:func:`planner.solve.space.refuse_unmeetable`) or by the
infeasibility explanation (:mod:`planner.solve.infeasible`).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterator

from planner.artifacts.cluster import Cluster
from planner.artifacts.errors import InfeasibleError, PlannerInputError
from planner.artifacts.kinds import Objective, ScheduleKind, SolverKind
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile
from planner.artifacts.progress import note
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.cost.context import candidate_cp_degrees
from planner.cost.tensor_parallel import base_cluster, candidate_degrees, device_cost_model, stack_tp_view
from planner.graph import coarse_starts
from planner.solve.build import Problem, memory_cap_bytes
from planner.solve.candidates import (
    Budget,
    ChainSolver,
    ConfigSearch,
    Incumbent,
    MeIncumbent,
    Scored,
    score_key,
    simulated,
    solve_candidates,
)
from planner.solve.chain_dp import solve_chain
from planner.solve.coarsen import merged_model, refine, to_layers
from planner.solve.infeasible import explain_infeasible
from planner.solve.replicated_search import replicated_candidates
from planner.solve.select import build_best, merge_pareto, pareto_front, select
from planner.solve.settings import SETTINGS, SearchSettings
from planner.solve.space import (
    DP_SCHEDULES,
    SPLIT_SCHEDULES,
    configurations,
    microbatch_sizes,
    num_devices_of,
    refuse_unmeetable,
)


def tensor_settings(profile: Profile, cluster: Cluster, num_devices: int, request: PlanRequest) -> Iterator[tuple[int, bool]]:
    """The (tensor-parallel degree, sequence parallelism) pairs searched: every degree the
    request and the profile allow; sequence parallelism is never slower and never larger under
    the cost model (same collective time, every split cost / t), so where both are allowed only
    "on" is searched."""
    for t in candidate_degrees(profile, cluster, num_devices, request.tp_degrees):
        for sp in ([max(request.sequence_parallel)] if t > 1 else [False]):
            yield t, sp


def search_plan(
    profile: Profile, cluster: Cluster, request: PlanRequest, *, solver: SolverKind, chain_solver: ChainSolver,
    settings: SearchSettings = SETTINGS,
) -> Plan:
    """The best plan over every tensor-parallel degree (see the module docstring)."""
    n = num_devices_of(cluster, request)
    base = base_cluster(cluster, n)  # part of one node when the devices fit in one
    problem = Problem.of(profile, cluster, request, solver, n)  # plans record the cluster as given
    tensor = list(tensor_settings(profile, base, n, request))
    degrees = sorted(((cp, t, sp) for t, sp in tensor for cp in candidate_cp_degrees(profile, n, t, request.cp_degrees)),
                     key=lambda d: d[0])  # every cp = 1 first: the incumbent a cp > 1 search prunes against
    if not degrees:
        raise PlannerInputError(f"--cp {list(request.cp_degrees)}: no degree divides the {n} devices with a "
                                f"tensor-parallel degree searched")
    if request.objective is Objective.TIME and settings.prune_degrees and settings.prune_configs:
        plans = pruned_degrees(problem, base, degrees, n, chain_solver, settings)
    else:
        plans = degree_by_degree(problem, base, degrees, n, chain_solver, settings)
    # equal times (sequence parallelism often costs no time): no context parallelism, the leaner
    # plan, then the smaller t
    plans.sort(key=lambda p: (p.predicted.iteration_ms, p.layout.cp_degree, p.predicted.peak_memory_bytes,
                              p.layout.tp_degree))
    best = select(plans, request)
    return dataclasses.replace(best, pareto=merge_pareto(p for plan in plans for p in plan.pareto))


Degree = tuple[int, int, bool]  # (cp, t, sequence parallel)


def note_degree(degree: Degree) -> None:
    """The progress note of a degree's search."""
    cp, t, sp = degree
    note(f"searching tensor-parallel degree {t}{' (seq-par)' if sp else ''}{f', context-parallel {cp}' if cp > 1 else ''}")


def degree_models(problem: Problem, base: Cluster, degrees: list[Degree]) -> Iterator[CostModel]:
    """Each degree's cost model in order, built as it is asked for; the tensor-parallel view of
    each ``(t, sp)`` built once for all its context-parallel degrees."""
    request = problem.request
    views: dict[tuple[int, bool], Profile] = {}
    for cp, t, sp in degrees:
        if (t, sp) not in views:
            views[(t, sp)] = stack_tp_view(problem.profile, base, t, sp, request.stack)
        yield device_cost_model(problem.profile, base, request.optimizer, t, sp, request.stack, cp,
                                tp_view=views[(t, sp)])


def degree_by_degree(
    problem: Problem, base: Cluster, degrees: list[Degree], n: int, chain_solver: ChainSolver, settings: SearchSettings,
) -> list[Plan]:
    """Each degree searched on its own, in order (the search with ``prune_degrees`` off): every
    cp = 1 degree in full, each cp > 1 one against the fastest plan of those before it. (With
    ``prune_configs`` on, such a degree's configurations on all the devices are pruned against
    that plan too, and a degree whose machine bound is above it is skipped: a plan on fewer
    devices may then record no best time on all of them, or a slower one, where the default
    search (which prunes those against the best on all the devices) and the exhaustive one
    record the best.)"""
    request = problem.request
    plans: list[Plan] = []
    infeasible: list[InfeasibleError] = []
    # the memory objective prunes every degree against the fastest candidates of all of them
    # (what it keeps is within the budget of the fastest of all): one incumbent, shared
    memory = request.objective is Objective.MEMORY and settings.prune_configs
    # the ME objective prunes every degree against what it found in all of them (MeIncumbent)
    me = MeIncumbent() if request.objective is Objective.ME and settings.prune_configs else None
    shared = Incumbent() if memory or me is not None else None
    for (cp, t, sp), cm in zip(degrees, degree_models(problem, base, degrees)):
        note_degree((cp, t, sp))
        earlier = min((p.predicted.iteration_ms for p in plans), default=float("inf"))
        incumbent = earlier if cp > 1 or memory else float("inf")
        if (request.objective is Objective.TIME and settings.prune_configs
                and machine_bound_ms(cm, request.global_batch, n // (t * cp)) >= incumbent):
            continue  # no plan of these degrees can beat the incumbent (this view's work alone is slower)
        try:
            search = LayoutSearch(problem, cm, n // (t * cp), chain_solver, settings, incumbent, shared, me)
            search.configs.run()
            found = search.finish(incumbent, suggest=False)
        except InfeasibleError as exc:
            infeasible.append(exc)
            continue
        if found is not None:
            plans.append(found)
            if request.objective is not Objective.TIME:
                # the memory and ME objectives choose among every degree's plans: the least memory
                # within 10% of the fastest of all of them, the ME index against the fastest GPipe
                # plan of all of them (a degree's own choice is against its own fastest)
                plans += search.built
    if not plans:  # the explanation of the degree that came closest to fitting, with its suggestions
        raise min(infeasible, key=lambda exc: exc.need_bytes).complete()
    return plans


def pruned_degrees(
    problem: Problem, base: Cluster, degrees: list[Degree], n: int, chain_solver: ChainSolver, settings: SearchSettings,
) -> list[Plan]:
    """Every degree's configurations visited in one order, by increasing lower bound, against
    one incumbent (the time objective; see the module docstring): a degree is opened (its cost
    model built, its configurations bounded) when its bound (:func:`degree_bound_ms`) comes up, and the visit
    stops when the next bound exceeds the best time on all the devices (every configuration
    left is then pruned). Then each opened degree that found a candidate builds its plans, the
    cp = 1 ones first; a cp > 1 degree keeps only candidates faster than their best plan."""
    request = problem.request
    shared = Incumbent()
    # (bound, order, degree index): a degree's machine bound before it is opened, then the bound
    # of its next configuration
    heap: list[tuple[float, int, int]] = []
    models: dict[int, CostModel] = {}
    for i, (degree, cm) in enumerate(zip(degrees, degree_models(problem, base, degrees))):
        cp, t, _ = degree
        models[i] = cm
        heapq.heappush(heap, (degree_bound_ms(cm, request, n // (t * cp)), 0, i))
    searches: dict[int, LayoutSearch] = {}
    infeasible: dict[int, InfeasibleError] = {}  # by degree, as degree_by_degree meets them
    while heap:
        bound, opened, i = heapq.heappop(heap)
        if bound > shared.best_all:
            break  # every configuration left is bounded above the best on all the devices (>= the best)
        if not opened:
            cp, t, _ = degrees[i]
            note_degree(degrees[i])
            try:
                searches[i] = LayoutSearch(problem, models[i], n // (t * cp), chain_solver, settings, shared=shared)
            except InfeasibleError as exc:
                infeasible[i] = exc
                continue
        else:
            searches[i].configs.step()
        if not searches[i].configs.done:
            heapq.heappush(heap, (searches[i].configs.next_bound(), 1, i))
    plans: list[Plan] = []
    for i in sorted(searches, key=lambda i: (degrees[i][0] > 1, i)):  # cp = 1 first: the incumbent of cp > 1
        cp = degrees[i][0]
        incumbent = min((p.predicted.iteration_ms for p in plans), default=float("inf")) if cp > 1 else float("inf")
        try:
            found = searches[i].finish(incumbent, shared, suggest=False)
        except InfeasibleError as exc:
            infeasible[i] = exc
            continue
        if found is not None:
            plans.append(found)
    if not plans:  # the explanation of the degree that came closest to fitting (the first of equals), in full
        raise min((infeasible[i] for i in sorted(infeasible)), key=lambda exc: exc.need_bytes).complete()
    return plans


def degree_bound_ms(cm: CostModel, request: PlanRequest, num_groups: int) -> float:
    """No configuration of ``cm`` on at most ``num_groups`` groups has a lower bound below this
    (:func:`planner.solve.space.config_lower_bound_ms`, which the other bounds only raise): its
    ``M x work / P`` is ``G x work(b) / (b x P x D)`` with ``P x D <= num_groups``, at its
    micro-batch size ``b``, one of those dividing the global batch ``G``."""
    G = request.global_batch
    out = float("inf")
    for b in microbatch_sizes(request, G):
        out = min(out, G * cm.work_ms(b) / (b * num_groups))
    return out


def machine_bound_ms(cm: CostModel, global_batch: int, num_groups: int) -> float:
    """No plan priced by ``cm`` on ``num_groups`` groups runs faster: every sample's forward and
    backward on one of them, at the cheapest per-sample rate any micro-batch size gives (the
    lines' slopes, plus their intercepts where negative: ``(c + s b) / b >= s + min(c, 0)``).
    For views whose layer times are lines (the context-parallel ones)."""
    layers = cm.profile.layers
    slope = sum(layer.fwd.per_sample_ms + layer.bwd.per_sample_ms for layer in layers)
    intercept = sum(layer.fwd.intercept_ms + layer.bwd.intercept_ms for layer in layers)
    return global_batch * max(0.0, slope + min(intercept, 0.0)) / cm.cluster.relative_speed / num_groups


def interleave_factors(request: PlanRequest, chain_solver: ChainSolver, settings: SearchSettings) -> tuple[int, ...]:
    """Chunks per rank the search tries (none unless it may interleave)."""
    if chain_solver is not solve_chain or ScheduleKind.INTERLEAVED_1F1B not in request.schedules:
        return ()
    return settings.interleave_factors


class LayoutSearch:
    """The search over layouts of one tensor- and context-parallel degree (``cm``) on
    ``num_groups`` groups, in two halves: the constructor prepares the configurations (and the
    coarse chain) into :attr:`configs`, a :class:`~planner.solve.candidates.ConfigSearch` that
    the caller steps (alone, or interleaved with other degrees' against one shared incumbent);
    :meth:`finish` turns the candidates found into the degree's best plan, with its Pareto
    points. With a finite incumbent (the time objective only) configurations that cannot beat it
    are not solved; the memory objective prunes against its budget of the fastest it finds.

    Profiles with more than :attr:`SearchSettings.chain_max` layers (or twice the deepest
    pipeline searched) are searched over at most that many groups of consecutive layers (cut
    where the fewest bytes cross), then the best configurations are re-solved with single
    layers around their chosen boundaries (:mod:`planner.solve.coarsen`)."""

    def __init__(
        self, problem: Problem, cm: CostModel, num_groups: int, chain_solver: ChainSolver,
        settings: SearchSettings = SETTINGS, incumbent_ms: float = float("inf"), shared: Incumbent | None = None,
        me: MeIncumbent | None = None,
    ) -> None:
        request = problem.request
        profile = cm.profile
        self.problem, self.cm, self.num_groups, self.chain_solver, self.settings = (
            problem, cm, num_groups, chain_solver, settings)
        oracle = DP_SCHEDULES + (SPLIT_SCHEDULES if problem.solver is SolverKind.BRUTE_FORCE else ())
        if chain_solver is not solve_chain and not any(s in oracle for s in request.schedules):
            raise PlannerInputError(f"solver {problem.solver.value!r} plans the {', '.join(s.value for s in oracle)} "
                                    f"schedules only (asked: {', '.join(s.value for s in request.schedules)})")
        refuse_unmeetable(profile.num_layers, num_groups, request, interleaved=chain_solver is solve_chain,
                          settings=settings)
        self.cap = memory_cap_bytes(cm.cluster, request)
        self.by_time = request.objective is Objective.TIME
        self.built: list[Plan] = []  # every plan :meth:`finish` built (the fastest candidates', the tighter caps')
        self.starts: list[int] | None = None
        self.cm_search, self.req_search = cm, request
        # enough groups that the deepest pipeline searched still has two groups per stage, an
        # interleaved one two per chunk where the layers allow (on fewer than P v groups its P v
        # chunks are never solved; on exactly P v each is one group, however the cuts merged them)
        depths = [P for P, _ in configurations(profile.num_layers, num_groups, request)]
        max_stages = max(depths, default=1)
        chunks = [P * v for P in depths for v in interleave_factors(request, chain_solver, settings)
                  if P * v <= profile.num_layers]
        chain_max = max(settings.chain_max, 2 * max_stages, min(profile.num_layers, 2 * max(chunks, default=1)))
        if profile.num_layers > chain_max:
            self.starts = coarse_starts(profile, chain_max, request.fixed_boundaries)
            self.cm_search = merged_model(cm, self.starts)
            self.req_search = dataclasses.replace(
                request, fixed_boundaries=tuple(self.starts.index(f) for f in request.fixed_boundaries))
        # the memory objective prunes against its budget; over groups of layers against it widened
        # by budget_refine_slack (the refinement can speed a candidate up: a heuristic, as the time
        # objective's pruning of a grouped profile; see the module docstring)
        slack = 1.0 if self.starts is None else 1.0 + settings.refine_slack
        chooses = Budget.of_request(request)  # the memory objective's: what it may choose among
        self.budget = chooses if self.starts is None else chooses.widened_by(1.0 + settings.budget_refine_slack)
        # the ME objective prunes over groups of layers against its figures widened by
        # budget_refine_slack (a heuristic, as the memory objective's)
        self.me = me if settings.prune_configs else None
        self.me_widen = 1.0 if self.starts is None else 1.0 + settings.budget_refine_slack
        prune = (self.by_time or self.budget.widened or self.me is not None) and settings.prune_configs
        self.configs = ConfigSearch(
            self.cm_search, self.req_search, num_groups, self.cap, chain_solver, prune=prune, settings=settings,
            incumbent_ms=incumbent_ms if prune and self.by_time else float("inf"), shared=shared,
            fill=shared is not None, slack=slack, budget=self.budget, me=self.me, me_widen=self.me_widen)

    def fine(self, scored: list[Scored], keep: int, refined: bool) -> list[Scored]:
        """The ``keep`` best candidates over the layers themselves (re-solved around their
        boundaries with ``refined``, else mapped), and with ``refined`` the best on all the
        groups too (which the plan table names)."""
        cm, starts = self.cm, self.starts
        top = scored[:keep]
        on_all = [tc for tc in scored if tc[1].config.num_groups == self.num_groups]
        if self.by_time and refined and on_all and not any(tc is on_all[0] for tc in top):
            top.append(on_all[0])
        if starts is None:
            return top
        out = []
        for _, cand in top:
            if refined:
                mapped = refine(cm, starts, self.problem.request, cand, self.cap, self.chain_solver, self.settings)
            else:
                mapped = to_layers(cm, cand, starts, self.cap)
            out.append((simulated(cm, mapped), mapped))
        out.sort(key=score_key)
        return out

    def could_matter(self, scored: list[Scored]) -> list[Scored]:
        """The ME objective builds only the candidates that could be its choice, its reference, the
        fastest (while no reference is known) or the fastest on all the groups
        (:meth:`~planner.solve.candidates.MeIncumbent.matters`); the other objectives all."""
        me, inc = self.me, self.configs.incumbent
        if me is None:
            return scored
        return [tc for tc in scored
                if me.matters(self.cm_search, tc, inc, tc[1].config.num_groups == self.num_groups, self.me_widen)]

    def finish(self, incumbent_ms: float = float("inf"), shared: Incumbent | None = None,
               suggest: bool = True) -> Plan | None:
        """The degree's best plan from the candidates its configuration search found, with the
        Pareto points of its best configurations under tighter caps; with a finite
        ``incumbent_ms`` only candidates faster than it count (and no tighter caps are searched),
        besides the best on all the groups, whose plan is built for its time there (the chosen
        plan records the best time on all the devices when it uses fewer), None when there are
        neither. ``shared``: the incumbent the configuration search pruned
        against; None is returned (not a refusal) when it found nothing because of it.
        ``suggest``: a refusal comes with its suggestions (else they wait for
        :meth:`~planner.artifacts.errors.InfeasibleError.complete`, :func:`explain_infeasible`)."""
        problem, cm, settings, request = self.problem, self.cm, self.settings, self.problem.request
        by_time, num_groups, cap = self.by_time, self.num_groups, self.cap
        pruning = by_time and incumbent_ms < float("inf")
        scored = self.configs.result()
        # the best candidate on all the groups, built whatever its time: the chosen plan records the
        # best time on all the devices when it uses fewer (select.note_devices)
        on_all = next((tc for tc in scored if tc[1].config.num_groups == num_groups), None)
        if pruning:
            scored = [tc for tc in scored if tc[0] < incumbent_ms]
            if not scored and on_all is None:
                return None  # no configuration of these degrees beats the incumbent
        if self.chain_solver is solve_chain and (scored or not pruning):
            limit = self.budget.of(shared.best) if shared is not None and self.me is None else float("inf")
            scored += replicated_candidates(self.cm_search, self.req_search, num_groups, cap, scored, settings,
                                            incumbent_ms=limit)
            scored.sort(key=score_key)
        if pruning and on_all is not None and not any(tc is on_all for tc in scored):
            scored.append(on_all)  # slower than the incumbent: built for its time on all the devices only
        if not scored:
            if self.configs.pruned or not self.configs.done:
                return None  # every configuration pruned against another degree's plans
            # explained over the layers themselves unless the profile is very long
            if cm.profile.num_layers <= settings.explain_max_layers:
                raise explain_infeasible(cm, request, num_groups, cap, suggest=suggest)
            raise explain_infeasible(self.cm_search, self.req_search, num_groups, cap, suggest=suggest)
        budget, within = self.budget, float("inf")
        if budget.widened and self.configs.prune:
            # the memory objective builds only the candidates its budget can hold: no slower than
            # the budget of the fastest found (the fastest of every degree is no slower; a candidate's
            # simulated time is its plan's), and the best on all the groups
            within = budget.of(min(scored[0][0], incumbent_ms)) * (1 + 1e-9)
            kept = [tc for tc in scored if tc[0] <= within]
            scored = kept + [on_all] if on_all is not None and not any(tc is on_all for tc in kept) else kept
            if not scored:
                return None  # a cp > 1 degree with nothing within the budget of the degrees before it
        me = self.me
        scored = self.could_matter(scored)
        keep = settings.rescore_top if by_time else len(scored)
        plans = build_best(problem, cm, self.fine(scored, keep, True), keep + 1)
        # more points on the memory axis (the Pareto front, and the memory / ME objectives): the
        # same search under tighter caps; for the time objective only over the best configurations
        uniform = [cand.config for _, cand in scored if not cand.config.layout.stage_replicas]
        configs = uniform[: settings.pareto_configs] if by_time else None
        for frac in () if pruning else settings.memory_cap_fractions:  # a cp > 1 search: its own points only
            bounded = within < float("inf")  # pruned to the memory objective's budget (a tighter cap is never faster)
            tighter = solve_candidates(
                self.cm_search, self.req_search, num_groups, cap * frac, self.chain_solver,
                prune=bounded or me is not None, configs=configs, settings=settings, fsdp=not by_time, budget=budget,
                incumbent_ms=min(p.predicted.iteration_ms for p in plans) if bounded else float("inf"),
                me=me, shared=self.configs.incumbent if me is not None else None, me_widen=self.me_widen)
            tighter = self.could_matter([tc for tc in tighter if tc[0] <= within])
            k = 2 if by_time else len(tighter)
            plans += build_best(problem, cm, self.fine(tighter, k, False), k)
        if not plans:
            return None  # the ME objective: nothing of these degrees could be its choice (nor its references)
        front = pareto_front(plans)
        best = select(plans, request)
        self.built = plans
        return dataclasses.replace(best, pareto=front)

