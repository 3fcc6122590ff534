"""The search over layouts of one tensor- and context-parallel degree (a request none of whose
layouts can meet its constraints refused first, :func:`refuse_unmeetable`): its configurations
searched (:class:`~planner.solve.config_search.ConfigSearch`, over groups of layers on a long
profile), then its best candidates built as plans, as its objective's policy says
(:mod:`planner.solve.objectives`). The degrees together: :mod:`planner.solve.search`."""

from __future__ import annotations

import dataclasses

from planner.artifacts.errors import InfeasibleError, PlannerInputError
from planner.artifacts.kinds import ScheduleKind, SolverKind
from planner.artifacts.plan import Plan
from planner.artifacts.progress import note
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.graph import coarse_starts
from planner.solve.build import build_best
from planner.solve.candidates import Scored, busiest_rank, simulated, stage_needs
from planner.solve.ceiling import ChainBound, block_starts
from planner.solve.chain_dp import solve_chain
from planner.solve.coarsen import merged_model, refine, to_layers
from planner.solve.config_search import Found, SearchPass, config_search, over_layers
from planner.solve.grouped_builds import LayerFloors
from planner.solve.infeasible import explain_infeasible
from planner.solve.objectives import Builds, Policy
from planner.solve.optimum import ChainSolver
from planner.solve.problem import Problem
from planner.solve.replicated_search import replicated_candidates
from planner.solve.select import chosen
from planner.solve.settings import SETTINGS, SearchSettings
from planner.solve.space import DP_SCHEDULES, SPLIT_SCHEDULES, configurations


def score_key(tc: Scored) -> tuple[object, ...]:
    """The order of the candidates a search finds: simulated time, then the configuration's
    tie-break (:attr:`Config.sort_key <planner.solve.space.Config.sort_key>`)."""
    return (tc[0],) + tc[1].config.sort_key


def interleave_factors(request: PlanRequest, chain_solver: ChainSolver, settings: SearchSettings) -> tuple[int, ...]:
    """Chunks per rank the search tries (none unless it may interleave)."""
    if chain_solver is not solve_chain or ScheduleKind.INTERLEAVED_1F1B not in request.schedules:
        return ()
    return settings.interleave_factors


def wanted_chain(num_layers: int, num_groups: int, request: PlanRequest, chain_solver: ChainSolver,
                 settings: SearchSettings) -> int:
    """The chain a search on ``num_groups`` groups uses without a working-set ceiling: every
    layer, or enough groups that the deepest pipeline searched still has two groups per stage, an
    interleaved one two per chunk where the layers allow (on fewer than P v groups its P v
    chunks are never solved; on exactly P v each is one group, however the cuts merged them),
    and at least :attr:`SearchSettings.chain_max`."""
    depths = [P for P, _ in configurations(num_layers, num_groups, request)]
    chunks = [P * v for P in depths for v in interleave_factors(request, chain_solver, settings) if P * v <= num_layers]
    wanted = max(settings.chain_max, 2 * max(depths, default=1), min(num_layers, 2 * max(chunks, default=1)))
    return min(num_layers, wanted)


def refuse_unmeetable(
    num_layers: int, num_groups: int, request: PlanRequest, *, interleaved: bool = True, settings: SearchSettings = SETTINGS
) -> None:
    """Refuse, before searching, a request whose layout constraints (fixed boundaries, stage
    count, data-parallel degree) no plan on ``num_layers`` layers and ``num_groups`` groups can
    meet: :class:`InfeasibleError` naming the constraint and the limit it runs into
    (:class:`PlannerInputError` for a boundary that is not a layer). ``interleaved``: the
    solver may interleave stages (a rank holding several model chunks)."""
    fixed = sorted(set(request.fixed_boundaries))
    beyond = [f for f in fixed if f >= num_layers]
    if beyond:
        raise PlannerInputError(
            f"fixed boundaries {beyond}: a stage can start at layers 1..{num_layers - 1} ({num_layers} layers)"
        )
    P, D = request.num_stages, request.dp_degree
    if P > num_layers:
        raise InfeasibleError(f"--stages {P}: the profile has {num_layers} layers (a stage holds at least one)")
    if P * max(D, 1) > num_groups or D > num_groups:
        asked = " x ".join(f"{flag} {v}" for flag, v in (("--stages", P), ("--dp-degree", D)) if v)
        raise InfeasibleError(f"{asked} needs {max(P, 1) * max(D, 1)} devices; {num_groups} are available")
    if not fixed:
        return
    limits = [(num_layers, f"the profile's {num_layers} layers")]
    ranks = [(num_groups // max(D, 1), f"{num_groups} devices" + (f" at --dp-degree {D}" if D else ""))]
    if P:
        ranks.append((P, f"--stages {P}"))
    if request.max_stages:
        ranks.append((request.max_stages, f"--max-stages {request.max_stages}"))
    r, why = min(ranks)
    # interleaving gives a rank several stages, on pipelines of more than one rank
    inter = interleaved and ScheduleKind.INTERLEAVED_1F1B in request.schedules and r > 1
    v = max(settings.interleave_factors) if inter else 1
    limits.append((r * v, why + (f" (x {v} interleaved stages per rank)" if v > 1 else "")))
    most, why = min(limits)
    if len(fixed) + 1 > most:
        raise InfeasibleError(
            f"--fixed-boundaries {','.join(map(str, fixed))} need at least {len(fixed) + 1} stages, "
            f"but at most {most} are possible ({why})",
            suggestions=("fewer fixed boundaries", "more stages (--stages, --max-stages) or more devices"),
        )


class LayoutSearch:
    """The search over layouts of one tensor- and context-parallel degree (``cm``) on
    ``num_groups`` groups, in two halves: the constructor prepares the configurations (and the
    coarse chain) into :attr:`visits`, the configuration search
    (:func:`~planner.solve.config_search.config_search`) that the caller drives (alone, or
    interleaved with other degrees' against one shared incumbent), what it keeps going into
    :attr:`found`; :meth:`finish` turns those candidates into the degree's best plan, with its
    Pareto points. What is pruned, kept and built is the objective's ``policy``'s.

    Profiles with more than :attr:`SearchSettings.chain_max` layers (or twice the deepest
    pipeline searched) are searched over at most that many groups of consecutive layers (cut
    where the fewest bytes cross), then the best configurations are re-solved with single
    layers around their chosen boundaries (:mod:`planner.solve.coarsen`). ``bound``: the
    working-set ceiling's longest chain (:mod:`planner.solve.ceiling`); a longer chain is
    coarsened to it."""

    def __init__(
        self, problem: Problem, cm: CostModel, num_groups: int, chain_solver: ChainSolver, policy: Policy,
        settings: SearchSettings = SETTINGS, bound: ChainBound | None = None,
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
        self.cap = problem.cap_bytes
        self.built: list[Plan] = []  # every plan :meth:`finish` built (the fastest candidates', the tighter caps')
        self.starts: list[int] | None = None
        self.cm_search, self.req_search = cm, request
        chain_max = wanted_chain(profile.num_layers, num_groups, request, chain_solver, settings)
        self.max_refined = profile.num_layers  # the longest chain a refinement may solve over
        blocks = bound is not None and chain_max > bound.max_chain
        if bound is not None and blocks:
            note(bound.note(chain_max))
            chain_max = self.max_refined = bound.max_chain
        if profile.num_layers > chain_max:
            self.starts = (block_starts(profile.num_layers, chain_max, request.fixed_boundaries) if blocks
                           else coarse_starts(profile, chain_max, request.fixed_boundaries))
            self.cm_search = merged_model(cm, self.starts)
            self.req_search = dataclasses.replace(
                request, fixed_boundaries=tuple(self.starts.index(f) for f in request.fixed_boundaries))
        # over groups of layers the policy's figures are widened (Policy.for_groups: a heuristic, as
        # the time objective's pruning of a grouped profile; see planner.solve.search; the ME
        # objective's builds are bounded over the layers instead: build_bounded), and a
        # proposal is simulated unless its busiest rank exceeds what it must beat by refine_slack
        self.policy = policy if self.starts is None else policy.for_groups(settings)
        slack = 1.0 if self.starts is None else 1.0 + settings.refine_slack
        where = SearchPass(num_groups=num_groups, cap_bytes=self.cap, chain_solver=chain_solver, settings=settings,
                           slack=slack)
        # zero-bubble configurations over the layers themselves (config_search)
        self.layers = None if self.starts is None else (cm, request)
        self.found = Found()
        self.visits = config_search(self.cm_search, self.req_search, where, self.policy, self.found, self.layers)
        self.floors: LayerFloors | None = None  # over the layers, for bounded builds (worked out when asked)

    def fine(self, scored: list[Scored], keep: int, best_on_all: bool, *, refined: bool = True) -> list[Scored]:
        """The ``keep`` best candidates over the layers themselves (re-solved around their
        boundaries with ``refined``, else mapped), and with ``best_on_all`` the best on all the
        groups too (which the plan table names)."""
        cm, starts = self.cm, self.starts
        top = scored[:keep]
        on_all = [tc for tc in scored if tc[1].config.num_groups == self.num_groups]
        if best_on_all and on_all and not any(tc is on_all[0] for tc in top):
            top.append(on_all[0])
        if starts is None:
            return top
        out = []
        for tc in top:
            cand = tc[1]
            if over_layers(cand.config):
                out.append(tc)  # searched over the layers (config_search): its time is its plan's
                continue
            if refined:
                mapped = refine(cm, starts, self.problem.request, cand, self.cap, self.chain_solver, self.settings,
                                max_chain=self.max_refined)
            else:
                mapped = to_layers(cm, cand, starts, self.cap)
            out.append((simulated(cm, mapped), mapped))
        out.sort(key=score_key)
        return out

    def finish(self, earlier_ms: float = float("inf"), suggest: bool = True) -> Plan | None:
        """The degree's best plan from the candidates its configuration search found, with the
        Pareto points of its best configurations under tighter caps, None when there are none
        (not a refusal: every configuration was pruned against other degrees' finds). The
        policy says which candidates count: for the time objective, on a context-parallel degree,
        only those faster than ``earlier_ms`` (the fastest plan of the degrees before; then no
        tighter caps are searched) besides the best on all the groups, whose plan is built for
        its time there (the chosen plan records the best time on all the devices when it uses
        fewer); for the memory objective those within the budget of the fastest of every degree
        (``earlier_ms`` the fastest before); for the ME objective those that could matter.
        ``suggest``: a refusal comes with its suggestions (else they wait for
        :meth:`~planner.artifacts.errors.InfeasibleError.complete`, :func:`explain_infeasible`)."""
        policy, num_groups = self.policy, self.num_groups
        rules = policy.builds(earlier_ms, self.cm.group.cp_degree, self.settings)
        threshold = rules.pruning_ms
        pruning = threshold < float("inf")
        scored = sorted(self.found.candidates, key=score_key)
        # the best candidate on all the groups, built whatever its time: the chosen plan records the
        # best time on all the devices when it uses fewer (select.note_devices)
        on_all = next((tc for tc in scored if tc[1].config.num_groups == num_groups), None)
        if pruning:
            scored = [tc for tc in scored if tc[0] < threshold]
            if not scored and on_all is None:
                return None  # no configuration of these degrees beats the incumbent
        if self.chain_solver is solve_chain and (scored or not pruning):
            scored += replicated_candidates(self.cm_search, self.req_search, num_groups, self.cap, scored,
                                            self.settings, incumbent_ms=rules.replicated_limit_ms)
            scored.sort(key=score_key)
        if pruning and on_all is not None and not any(tc is on_all for tc in scored):
            scored.append(on_all)  # slower than the incumbent: built for its time on all the devices only
        if not scored:
            self.refuse(suggest)
            return None  # every configuration pruned against another degree's plans
        # only those within the objective's budget (Builds.budget: the memory objective's)
        scored, within = rules.budget.within(scored, earlier_ms, on_all) if rules.budget is not None else (scored, float("inf"))
        if not scored:
            return None  # a cp > 1 degree with nothing within the budget of the degrees before it
        return self.build(self.could_matter(scored, rules), within, rules)

    def searched(self, where: SearchPass, policy: Policy) -> list[Scored]:
        """Every configuration of ``where`` visited under ``policy``: the candidates found, best first."""
        found = Found()
        for _ in config_search(self.cm_search, self.req_search, where, policy, found, self.layers):
            pass  # (each step visits one configuration)
        return sorted(found.candidates, key=score_key)

    def could_matter(self, scored: list[Scored], rules: Builds) -> list[Scored]:
        """Those of ``scored`` that could be the objective's choice (or what it records): where
        ``rules`` name the ME state, :meth:`MeIncumbent.kept
        <planner.solve.objectives.MeIncumbent.kept>` (over the layers themselves: a policy over
        groups of layers names none, it decides build by build, :meth:`Policy.could_build`)."""
        if rules.me_state is None or rules.incumbent is None:
            return scored
        assert self.layers is None, "over groups of layers the ME objective decides build by build"
        return rules.me_state.kept(self.cm_search, scored, rules.incumbent, self.num_groups)

    @staticmethod
    def noted(rules: Builds, plans: list[Plan]) -> list[Plan]:
        """``plans``, noted where ``rules`` say (:attr:`Builds.built <planner.solve.objectives.Builds.built>`)."""
        if rules.built is not None:
            rules.built.note_plans(plans)
        return plans

    def refuse(self, suggest: bool) -> None:
        """No candidate: nothing where configurations were pruned (against another degree's
        plans), else the infeasibility explained (over the layers themselves unless the profile is
        very long), raised."""
        if self.found.pruned or not self.found.done:
            return
        request, cap = self.problem.request, self.cap
        if self.cm.profile.num_layers <= self.settings.explain_max_layers:
            raise explain_infeasible(self.cm, request, self.num_groups, cap, suggest=suggest)
        raise explain_infeasible(self.cm_search, self.req_search, self.num_groups, cap, suggest=suggest)

    def build_bounded(self, scored: list[Scored], rules: Builds, *, refined: bool) -> list[Plan]:
        """Plans for those of ``scored`` (candidates over groups of layers) whose plans could
        matter against the plans built so far (:meth:`Policy.could_build`, noted as they are
        built, as ``rules`` say), the most promising first (least time x busiest rank's memory over the groups):
        with ``refined``, by ``c``'s floors over the layers (:class:`LayerFloors`) before it is
        refined; else mapped to the layers first, by its time and its largest stage's peak
        there. In the order :meth:`fine` gives; where every one built is over the cap (and
        ``refined``), the refusal naming that (:func:`build_best`). See
        :mod:`planner.solve.grouped_builds`."""
        problem, cm, policy, starts = self.problem, self.cm, self.policy, self.starts
        assert starts is not None, "bounded builds are for a search over groups of layers"
        if self.floors is None:
            self.floors = LayerFloors(cm, problem.request, self.cap)
        floors = self.floors

        def promise(tc: Scored) -> tuple[object, ...]:
            c = tc[1].config
            return (tc[0] * busiest_rank(c.layout, stage_needs(self.cm_search, c, tc[1].solution)),) + score_key(tc)

        done: list[tuple[Scored, list[Plan]]] = []
        for tc in sorted(scored, key=promise):
            c = tc[1].config
            on_all = c.num_groups == self.num_groups
            if refined and not policy.could_build(floors.time_ms(c), floors.memory_bytes(c), on_all):
                continue
            mapped = (refine(cm, starts, problem.request, tc[1], self.cap, self.chain_solver, self.settings)
                      if refined else to_layers(cm, tc[1], starts, self.cap))
            t = simulated(cm, mapped)
            if not refined and not policy.could_build(t, max(stage_needs(cm, c, mapped.solution)), on_all):
                continue
            plans = self.noted(rules, build_best(problem, cm, [(t, mapped)], 1, refuse=False))
            done.append(((t, mapped), plans))
        done.sort(key=lambda d: score_key(d[0]))
        plans = [p for _, built in done for p in built]
        if refined and done and not plans:
            build_best(problem, cm, [done[0][0]], 1)  # every plan over the cap: refused, naming the first
        return plans

    def build(self, scored: list[Scored], within: float, rules: Builds) -> Plan | None:
        """Plans for ``scored`` as ``rules`` say and, unless they prune by time, for the same
        search under tighter caps (more points on the memory axis: the Pareto front, the memory
        and ME objectives' choice), each pass as the policy says (:attr:`Builds.tighter
        <planner.solve.objectives.Builds.tighter>`); the
        objective's choice among them, with their front."""
        problem, cm, policy, settings = self.problem, self.cm, self.policy, self.settings
        keep = rules.rescore if rules.rescore is not None else len(scored)
        if policy.bounds_builds:
            plans = self.build_bounded(scored, rules, refined=True)
        else:
            plans = self.noted(rules, build_best(problem, cm, self.fine(scored, keep, rules.adds_best_on_all), keep + 1))
        uniform = [cand.config for _, cand in scored if not cand.config.layout.stage_replicas]
        for tighter in rules.tighter:  # none on a cp > 1 search: its own points only
            if tighter.seeded:  # its pruning starts from the fastest plan built
                tighter.policy.incumbent.note(min((p.predicted.iteration_ms for p in plans), default=float("inf")), True)
            limit = tighter.config_limit
            where = SearchPass(num_groups=self.num_groups, cap_bytes=self.cap * tighter.cap_fraction,
                               chain_solver=self.chain_solver, settings=settings, fsdp=tighter.fsdp,
                               configs=tuple(uniform[:limit]) if limit is not None else None)
            found = self.could_matter([tc for tc in self.searched(where, tighter.policy) if tc[0] <= within], rules)
            k = tighter.builds if tighter.builds is not None else len(found)
            if policy.bounds_builds:
                plans += self.build_bounded(found, rules, refined=False)
                continue
            plans += self.noted(rules, build_best(problem, cm, self.fine(found, k, False, refined=False), k, refuse=False))
        if not plans:
            return None  # the ME objective: nothing of these degrees could be its choice (nor its references)
        self.built = plans
        return chosen(plans, problem.request)
