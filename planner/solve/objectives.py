"""One policy per objective: what a configuration search prunes against, which proposals it
keeps, when it rebalances, how its figures widen over groups of layers, and which candidates it
builds plans for.

- :class:`TimePolicy` (the fastest plan): a configuration must beat the fastest simulated time
  found (the fastest on all the devices for one on all of them); the fastest proposal of each
  configuration is kept; a memory rebalancing waits in the order until the candidate without
  its recomputation could still win (a heuristic gate, RESULTS 25, 33); plans are built for the
  few fastest candidates.
- :class:`MemoryPolicy` (the least memory within 10% of the fastest, or within a time budget):
  a configuration must beat its :class:`Budget` of the fastest found; every proposal leaner
  than each faster one is kept, every configuration whose solution recomputes is rebalanced at
  once; plans are built for every candidate within the budget.
- :class:`MePolicy` (the ME index): a configuration must be able to hold the least time x
  memory found, the fastest where the request has no reference plan, or the fastest on all the
  devices (:class:`MeIncumbent`); kept and rebalanced as the memory objective; plans are built
  for the candidates that could matter (over groups of layers: :mod:`planner.solve.grouped_builds`).

Each policy holds the incumbent it prunes against (one shared by several searches, or its
own), and whether it prunes at all (``SearchSettings.prune_configs``); :func:`policy_for` gives
a request's. A search asks it two questions per configuration (:meth:`Policy.limit`,
:meth:`Policy.keep`) and, per degree, which candidates to build as one value
(:meth:`Policy.builds` -> :class:`Builds`, with each tighter cap's pass, :class:`Tighter`).
The search itself (the heap and its phases) is
:class:`planner.solve.config_search.ConfigSearch`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner.artifacts.kinds import MEMORY_OBJECTIVE_FACTOR, Objective
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.solve.candidates import Scored, busiest_rank, stage_needs
from planner.solve.floors import ConfigFacts
from planner.solve.grouped_builds import BYTES_SLACK, Built
from planner.solve.settings import SearchSettings
from planner.solve.space import Config

INF = float("inf")


@dataclass(slots=True)
class Incumbent:
    """The best simulated times found so far, shared by the searches of several degrees (one
    per tensor- x context-parallel degree, :func:`planner.solve.search.search_plan`): ``best``
    over every candidate, ``best_all`` over those on all the devices. Mutable on purpose: every
    search prunes against what the others found."""

    best: float = INF
    best_all: float = INF

    def note(self, time_ms: float, on_all: bool) -> None:
        self.best = min(self.best, time_ms)
        if on_all:
            self.best_all = min(self.best_all, time_ms)


@dataclass(frozen=True)
class Budget:
    """What a search keeps beside the fastest: every candidate no slower than ``factor`` x the
    fastest found, or than ``floor_ms`` where that is more (the memory objective: the least
    memory within 10% of the fastest plan, or within its time budget). A configuration is
    pruned only when its bound exceeds that, so every candidate the objective could choose is
    still found; such a search rebalances every configuration whose solution recomputes, as the
    search without pruning does (the time objective's gate, the candidate without its
    recomputation against the incumbent, is a heuristic: RESULTS 25, 33)."""

    factor: float = 1.0
    floor_ms: float = 0.0

    @property
    def widened(self) -> bool:
        return self.factor != 1.0 or self.floor_ms > 0.0

    def of(self, fastest_ms: float) -> float:
        """The slowest time kept when the fastest found is ``fastest_ms``."""
        return max(self.floor_ms, fastest_ms * self.factor)

    def within(self, scored: list[Scored], earlier_ms: float, on_all: Scored | None) -> tuple[list[Scored], float]:
        """Of ``scored`` (fastest first), those no slower than this budget of the fastest found
        (the fastest of the degrees before, ``earlier_ms``, is no slower; a candidate's simulated
        time is its plan's), and the best on all the groups; with that slowest time."""
        within = self.of(min(scored[0][0], earlier_ms)) * (1 + 1e-9)
        kept = [tc for tc in scored if tc[0] <= within]
        return (kept + [on_all] if on_all is not None and not any(tc is on_all for tc in kept) else kept), within

    def widened_by(self, slack: float) -> Budget:
        """This budget kept ``slack`` x wider (the same where it keeps only the fastest)."""
        return Budget(self.factor * slack, self.floor_ms * slack) if self.widened else self

    @classmethod
    def of_request(cls, request: PlanRequest) -> Budget:
        """The memory objective's budget (none for the other objectives)."""
        if request.objective is not Objective.MEMORY:
            return cls()
        if request.time_budget_ms:
            return cls(1.0, request.time_budget_ms)
        return cls(MEMORY_OBJECTIVE_FACTOR, 0.0)


@dataclass(slots=True)
class MeIncumbent:
    """The ME objective's pruning state, shared by every configuration search of one request
    (every degree, every memory cap). The index is ``(ref time / t) / (m / ref memory)``, so the
    plan it chooses has the least ``t x m`` (iteration time x peak memory) whatever the
    reference: ``product`` is the least ``t x m`` of a candidate found so far, its memory each
    rank's chunks' peaks summed (no less than its plan's peak, so the winner's product is at most
    this); ``referenced``: the request has a reference plan, searched on its own before
    (:func:`planner.solve.search.me_reference`: the same whatever this search prunes; noting the
    GPipe candidates found here instead lost it where a bound asked ZeRO 3 alone whether a
    partition fits, and over groups of layers, where a candidate without recomputation refines
    into a plan with some). A configuration is solved only if it could hold the winner (its time
    bound x its memory floor at most ``product``), the fastest candidate (with no reference plan:
    the index counts from it) or the fastest on all the devices (the plan records it):
    :meth:`limit_ms`, the time its bound must not exceed. ``built``: what the plans built reach
    (over groups of layers, where a candidate's figures are not its plan's, it decides which are
    built: :mod:`planner.solve.grouped_builds`)."""

    product: float = math.inf
    referenced: bool = False
    built: Built = field(default_factory=Built)

    def limit_ms(self, floor_bytes: float, inc: Incumbent, on_all: bool, widen: float = 1.0) -> float:
        """The time bound above which a configuration cannot hold any of those, its plans' peak
        memory at least ``floor_bytes`` (with a relative 1e-9 to spare for rounding); ``widen``:
        every figure it must beat that much wider (over groups of layers, whose candidates the
        refinement changes)."""
        out = self.product * widen / floor_bytes if floor_bytes > 0 else math.inf
        if not self.referenced:
            out = max(out, inc.best * widen)
        if on_all:
            out = max(out, inc.best_all * widen)
        return out * (1 + 1e-9)

    def note(self, product: float) -> None:
        """A candidate kept, ``product`` its time x its busiest rank's memory (its chunks' peaks
        summed; with a relative 1e-6 to spare for the bytes each stage's parts are rounded to)."""
        self.product = min(self.product, product * (1 + BYTES_SLACK))

    def kept(self, cm: CostModel, scored: list[Scored], inc: Incumbent, num_groups: int) -> list[Scored]:
        """Of ``scored`` (over the layers themselves), those that could be the objective's choice,
        the fastest with no reference plan, or the fastest on all ``num_groups`` groups
        (:meth:`matters`)."""
        return [tc for tc in scored if self.matters(cm, tc, inc, tc[1].config.num_groups == num_groups)]

    def matters(self, cm: CostModel, scored: Scored, inc: Incumbent, on_all: bool) -> bool:
        """The candidate (over the layers themselves) could be the plan the objective chooses, the
        fastest with no reference plan, or the fastest on all the devices (else no plan is built
        for it): its memory at least its largest stage's peak."""
        t, cand = scored
        if t * max(stage_needs(cm, cand.config, cand.solution)) <= self.product * (1 + BYTES_SLACK):
            return True
        return (not self.referenced and t <= inc.best * (1 + 1e-9)) or (on_all and t <= inc.best_all * (1 + 1e-9))


@dataclass(frozen=True, slots=True, kw_only=True)
class Builds:
    """Which of a degree's candidates its objective builds plans for, as values: only those
    faster than ``pruning_ms`` (inf: all; then no tighter caps are searched either), per-stage
    replication's no slower than ``replicated_limit_ms``, the ``rescore`` best (None: every
    one), with the best on all the groups besides where ``adds_best_on_all``; only those within
    ``budget`` of the fastest (:meth:`Budget.within`, the memory objective's; None: every one)
    and, where ``me_state`` is given, only those that could be the ME objective's choice or
    what it records (:meth:`MeIncumbent.kept` against ``incumbent``; None: every one). The plans
    built are noted in ``built`` (:class:`~planner.solve.grouped_builds.Built`, the ME state's,
    which decides builds over groups of layers; None: nowhere). ``tighter``: the passes under
    tighter memory caps (more points on the memory axis), one per cap fraction in order (none
    where only candidates faster than ``pruning_ms`` count)."""

    pruning_ms: float
    replicated_limit_ms: float
    rescore: int | None
    adds_best_on_all: bool
    budget: Budget | None = None
    me_state: MeIncumbent | None = None
    incumbent: Incumbent | None = None
    built: Built | None = None
    tighter: tuple[Tighter, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Tighter:
    """A pass of the search under a tighter memory cap, ``cap_fraction`` of the cap: its policy
    (its own, fresh for the pass), the configurations it is restricted to (``config_limit``: the
    first that many of the degree's uniform candidates' configurations, best first; None: every
    one), whether it solves the ZeRO 3 variants, how many of its candidates are built (None:
    every one), and whether its policy prunes from the fastest plan built before the pass
    (``seeded``: the caller notes that time in :attr:`Policy.incumbent` before the pass)."""

    cap_fraction: float
    policy: Policy
    config_limit: int | None
    fsdp: bool
    builds: int | None  # None: every candidate
    seeded: bool = False


class Policy:
    """What every objective's policy answers (the time objective's rules unless a subclass
    says otherwise). ``prune``: configurations are skipped by their bound; ``incumbent``: the
    incumbent pruned against and updated, shared with other searches (used only with
    ``prune``), else one of the policy's own starting at ``start_ms``; ``fill``: the one-chunk
    fill bound is used also without an outside incumbent."""

    #: keeps every proposal leaner than each faster one, and rebalances at once (no gate)
    lean = False
    #: over groups of layers, plans are built one by one where bounds over the layers could still
    #: hold what the plans built reach (:mod:`planner.solve.grouped_builds`)
    bounds_builds = False
    #: the objective chooses among every degree's plans (not each degree's best only)
    chooses_among_degrees = False
    #: configurations are visited by bound x their state's share of memory
    #: (:meth:`~planner.solve.floors.ConfigFacts.state_floor_bytes`: a bound of their time x memory,
    #: the leanest first), not by bound alone
    orders_by_state = False

    def __init__(self, *, prune: bool = True, incumbent: Incumbent | None = None, start_ms: float = INF,
                 fill: bool = False) -> None:
        self.prune = prune
        self.shared, self.start_ms, self.fill_asked = incumbent, start_ms, fill  # as given (for_groups)
        start = start_ms if prune else INF
        self.incumbent = incumbent if incumbent is not None and prune else Incumbent(start, start)
        #: every bound from the start: the memory floor, the busiest rank's floor and a rank's
        #: chunks summed in :meth:`ConfigSearch.keep`'s check (else one stage's)
        self.tight = fill or self.bounded
        self.fill = self.tight or start_ms < INF  # the fill bound of :meth:`ConfigFacts.bound`

    @property
    def bounded(self) -> bool:
        """The objective prunes with every bound from the start (a budget, the ME state)."""
        return False

    def limit(self, facts: ConfigFacts, c: Config, lb: float | None, on_all: bool) -> float:
        """What ``c`` (at bound ``lb``, None when not known) must beat: the best on all the groups
        for a configuration on all of them (so that the best plan on all of them is known), else
        the best of any."""
        inc = self.incumbent
        return inc.best_all if on_all else inc.best

    def keep(self, cm: CostModel, c: Config, scored: list[Scored], fastest: Scored, on_all: bool) -> list[Scored] | None:
        """Of a configuration's simulated proposals (``fastest`` the first of the fastest), those
        kept as candidates (None: the fastest only, in place of an earlier candidate of the
        configuration where faster), the incumbent noting the fastest (``on_all``: the
        configuration is on all the groups)."""
        self.incumbent.note(fastest[0], on_all)
        return None

    def for_groups(self, settings: SearchSettings) -> Policy:
        """This policy over groups of layers (a long profile, whose candidates are refined
        before the objective chooses): the same for the time objective (its proposals' check is
        widened by ``refine_slack`` in the search)."""
        return self

    def for_degree(self, earlier_ms: float, cp_degree: int) -> Policy:
        """The policy of one degree searched on its own after others whose fastest plan is
        ``earlier_ms``: the time objective's own incumbent starts at :meth:`pruning_ms`."""
        return TimePolicy(prune=self.prune, start_ms=self.pruning_ms(earlier_ms, cp_degree) if self.prune else INF)

    # ---------------------------------------------------------------- what it builds
    def pruning_ms(self, earlier_ms: float, cp_degree: int) -> float:
        """Only candidates faster than this count (the fastest plan of the degrees before, for a
        context-parallel degree: it keeps no candidate slower than the plans without)."""
        return earlier_ms if cp_degree > 1 else INF

    def builds(self, earlier_ms: float, cp_degree: int, settings: SearchSettings) -> Builds:
        """The time objective builds the ``rescore_top`` fastest and the best on all the groups;
        on a context-parallel degree only candidates faster than ``earlier_ms``; with the degrees
        searched together, per-stage replication's no slower than the fastest of all; without
        pruning by time, the passes under tighter caps over its best configurations, nothing
        pruned, two plans built each, no ZeRO 3 variant."""
        pruning = self.pruning_ms(earlier_ms, cp_degree)
        passes = () if pruning < INF else tuple(
            Tighter(cap_fraction=f, policy=TimePolicy(prune=False), config_limit=settings.pareto_configs, fsdp=False,
                    builds=2) for f in settings.memory_cap_fractions)
        return Builds(pruning_ms=pruning, replicated_limit_ms=self.incumbent.best if self.shared is not None else INF,
                      rescore=settings.rescore_top, adds_best_on_all=True, tighter=passes)

    def skips_degree(self, machine_bound_ms: float, earlier_ms: float, cp_degree: int) -> bool:
        """A degree whose machine bound is this can be skipped: its work alone is no faster than
        the plan it must beat (:meth:`pruning_ms`)."""
        return self.prune and machine_bound_ms >= self.pruning_ms(earlier_ms, cp_degree)

    def could_build(self, time_ms: float, memory_bytes: float, on_all: bool) -> bool:
        """A plan no faster than ``time_ms`` and peaking no lower than ``memory_bytes`` could
        matter against the plans built (with :attr:`bounds_builds`)."""
        return True


class TimePolicy(Policy):
    """The fastest plan (the base rules)."""


class MemoryPolicy(Policy):
    """The least memory within the :class:`Budget` of the fastest plan."""

    lean = True
    chooses_among_degrees = True

    def __init__(self, budget: Budget, *, prune: bool = True, incumbent: Incumbent | None = None,
                 start_ms: float = INF, fill: bool = False) -> None:
        self.budget = budget
        super().__init__(prune=prune, incumbent=incumbent, start_ms=start_ms, fill=fill)

    @property
    def bounded(self) -> bool:
        return self.budget.widened

    def limit(self, facts: ConfigFacts, c: Config, lb: float | None, on_all: bool) -> float:
        inc = self.incumbent
        return self.budget.of(inc.best_all if on_all else inc.best)

    def keep(self, cm: CostModel, c: Config, scored: list[Scored], fastest: Scored, on_all: bool) -> list[Scored] | None:
        """The fastest and every proposal leaner than each faster one (the proposals' time x
        memory front, memory as the busiest rank's chunks' peaks summed; rebalanced at once, so a
        kept candidate is never replaced); a rebalancing or another partition can be slower and
        leaner (on a drawn case the ME objective's winner was such one, RESULTS 36)."""
        mems = [busiest_rank(c.layout, stage_needs(cm, c, tc[1].solution)) for tc in scored]
        first = next(j for j, tc in enumerate(scored) if tc[1] is fastest[1])
        front, least = [first], mems[first]
        for j in sorted(range(len(scored)), key=lambda j: (scored[j][0], mems[j])):
            if mems[j] < least:
                front.append(j)
                least = mems[j]
        self.noted([scored[j] for j in front], [mems[j] for j in front])
        self.incumbent.note(fastest[0], on_all)
        return [scored[j] for j in front]

    def noted(self, kept: list[Scored], mems: list[float]) -> None:
        """The kept candidates (their busiest ranks' memory ``mems``) noted where the objective
        keeps a state of its own."""

    def for_groups(self, settings: SearchSettings) -> Policy:
        """The budget widened by ``budget_refine_slack`` (the refinement can speed a candidate
        up: a heuristic, as the time objective's pruning of a grouped profile)."""
        return MemoryPolicy(self.budget.widened_by(1.0 + settings.budget_refine_slack), prune=self.prune,
                            incumbent=self.shared, start_ms=self.start_ms, fill=self.fill_asked)

    def for_degree(self, earlier_ms: float, cp_degree: int) -> Policy:
        """The same policy for every degree (one incumbent: what it keeps is within the budget of
        the fastest of all of them)."""
        return self

    def builds(self, earlier_ms: float, cp_degree: int, settings: SearchSettings) -> Builds:
        """Every candidate the budget can hold (where it prunes: :meth:`Budget.within`), none
        pruned by time; the passes under tighter caps over every configuration, where this search
        prunes pruned to the budget from the fastest plan built (a tighter cap is never faster),
        every candidate within it built."""
        bounded = self.budget.widened and self.prune
        passes = tuple(Tighter(cap_fraction=f, policy=MemoryPolicy(self.budget, prune=bounded), config_limit=None,
                               fsdp=True, builds=None, seeded=bounded) for f in settings.memory_cap_fractions)
        return Builds(pruning_ms=INF, replicated_limit_ms=INF, rescore=None, adds_best_on_all=False,
                      budget=self.budget if bounded else None, tighter=passes)

    def skips_degree(self, machine_bound_ms: float, earlier_ms: float, cp_degree: int) -> bool:
        return False


class MePolicy(MemoryPolicy):
    """The best ME index: ``state`` (with ``prune``) the pruning state every search of the
    request shares; ``widen``: its figures widened over groups of layers."""

    def __init__(self, state: MeIncumbent | None, *, widen: float = 1.0, prune: bool = True,
                 incumbent: Incumbent | None = None, fill: bool = False, grouped: bool = False) -> None:
        self.state = state if prune else None
        self.widen, self.grouped = widen, grouped
        self.bounds_builds = grouped and self.state is not None
        self.orders_by_state = self.state is not None
        super().__init__(Budget(), prune=prune, incumbent=incumbent, fill=fill)

    @property
    def bounded(self) -> bool:
        return self.state is not None

    def limit(self, facts: ConfigFacts, c: Config, lb: float | None, on_all: bool) -> float:
        """:meth:`MeIncumbent.limit_ms` with ``c``'s memory floor: the state's share, and where
        ``c``'s bound ``lb`` is within that, the stages' least bytes too (worked out once)."""
        state, inc = self.state, self.incumbent
        if state is None:
            return super().limit(facts, c, lb, on_all)
        floor = facts.known_floor_bytes(c)
        if floor is None:
            limit = state.limit_ms(facts.state_floor_bytes(c), inc, on_all, self.widen)
            if lb is None or lb > limit:
                return limit
            floor = facts.memory_floor_once(c)
        return state.limit_ms(floor, inc, on_all, self.widen)

    def noted(self, kept: list[Scored], mems: list[float]) -> None:
        if self.state is not None:
            for (t, _), mem in zip(kept, mems):
                self.state.note(t * mem)

    def for_groups(self, settings: SearchSettings) -> Policy:
        """Every figure a configuration must beat widened by ``budget_refine_slack`` (the
        refinement changes a candidate's time and memory: a heuristic, as the memory
        objective's, for which configurations are solved); which candidates' plans are built is
        decided by bounds over the layers instead (:mod:`planner.solve.grouped_builds`)."""
        return MePolicy(self.state, widen=1.0 + settings.budget_refine_slack, prune=self.prune, incumbent=self.shared,
                        fill=self.fill_asked, grouped=True)

    def builds(self, earlier_ms: float, cp_degree: int, settings: SearchSettings) -> Builds:
        """Every candidate that could be its choice, the fastest (with no reference plan) or the
        fastest on all the groups (:meth:`MeIncumbent.kept`; over groups of layers decided
        candidate by candidate as plans are built instead, :meth:`could_build`), the plans built
        noted in the state; the passes under tighter caps over every configuration, pruned by the
        same state (and incumbent) as this search."""
        state = self.state
        passes = tuple(Tighter(cap_fraction=f, policy=MePolicy(state, widen=self.widen, prune=state is not None,
                                                               incumbent=self.incumbent if state is not None else None),
                               config_limit=None, fsdp=True, builds=None) for f in settings.memory_cap_fractions)
        return Builds(pruning_ms=INF, replicated_limit_ms=INF, rescore=None, adds_best_on_all=False,
                      me_state=state if not self.grouped else None, incumbent=self.incumbent,
                      built=state.built if state is not None else None, tighter=passes)


    def could_build(self, time_ms: float, memory_bytes: float, on_all: bool) -> bool:
        """:meth:`Built.could_hold` against the plans built for the request."""
        return self.state is None or self.state.built.could_hold(time_ms, memory_bytes, on_all, self.state.referenced)


def policy_for(request: PlanRequest, settings: SearchSettings, referenced: bool = False) -> Policy:
    """The policy a request's degrees are searched with one by one
    (:func:`planner.solve.search.degree_by_degree`, each degree's by :meth:`Policy.for_degree`):
    the memory and ME objectives share one incumbent (and the ME state) over every degree; the
    time objective's is per degree. ``referenced``: the ME index has its reference plan."""
    prune = settings.prune_configs
    if request.objective is Objective.MEMORY:
        return MemoryPolicy(Budget.of_request(request), prune=prune, incumbent=Incumbent() if prune else None,
                            fill=prune)
    if request.objective is Objective.ME:
        return MePolicy(MeIncumbent(referenced=referenced) if prune else None, prune=prune, incumbent=Incumbent() if prune else None,
                        fill=prune)
    return TimePolicy(prune=prune)
