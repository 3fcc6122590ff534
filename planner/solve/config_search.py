"""The configuration search of one cost model: configurations visited by increasing lower bound
(a heap), each solved unless its bound exceeds what its objective's policy says it must beat
(:mod:`planner.solve.objectives`), its proposals simulated and the policy's keep kept. Its caller
drives it (:func:`config_search`, an iterator that yields each configuration's bound before
visiting it) and reads what it found as it goes (:class:`Found`).

What is known of a configuration before it is solved (bounds, floors, tables, ZeRO variants)
is :class:`~planner.solve.floors.ConfigFacts`'; what a solved configuration proposes is
:mod:`planner.solve.proposals`' (one call per visit). Across configurations the
chain objective J alone is not comparable (it leaves out the data-parallel all-reduce's exact
overlap and the schedule's), so every proposal is replayed by the simulator's fast entry
(:func:`~planner.solve.candidates.simulated`) and candidates are compared by that time.

Phases of a configuration's place in the heap: its first bound (``FRESH``); its memory floor
worked in (``MEMORY``); its ZeRO 3 variant alone, its own stage found not to fit (``FSDP``); a
solution's rebalancing (:func:`~planner.solve.proposals.offer`), at the time the
solution's partition simulates without recomputation (``REBALANCE``; the time objective's gate).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.cost.sharding import is_fsdp
from planner.schedule import held_counts
from planner.solve.bruteforce import solve_chain_bruteforce
from planner.solve.candidates import Candidate, Scored, busiest_rank, simulated
from planner.solve.chain import ChainSolution
from planner.solve.chain_dp import solve_chain
from planner.solve.floors import ConfigFacts, config_lower_bound_ms
from planner.solve.objectives import Policy
from planner.solve.optimum import ChainSolver, Solved, solve_config
from planner.solve.proposals import offer
from planner.solve.settings import SETTINGS, SearchSettings
from planner.solve.space import Config, all_configs
from planner.solve.stage_floor import skippable

FRESH, MEMORY, FSDP, REBALANCE = 0, 1, 2, 3
INF = float("inf")


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchPass:
    """Where and how far one configuration search looks (its objective's rules are its
    :class:`~planner.solve.objectives.Policy`)."""

    num_groups: int  # tensor- x context-parallel groups available; configurations on all of them are pruned apart
    cap_bytes: float  # per-device memory cap
    chain_solver: ChainSolver = solve_chain  # the optimum of J per configuration
    configs: Sequence[Config] | None = None  # the configurations visited (None: the whole space)
    settings: SearchSettings = SETTINGS
    fsdp: bool = True  # also solve the ZeRO 3 variants (ConfigFacts.variants)
    # over groups of layers: a proposal is simulated unless its busiest rank exceeds what it must
    # beat times this (a grouped profile's best candidates are refined, which can reorder them)
    slack: float = 1.0


@dataclass(slots=True)
class Found:
    """What a configuration search has found so far, filled as it goes (its caller may stop it
    at any point and read this): the candidates kept, in the order kept (each with its simulated
    time; the caller orders them), the configurations skipped by their bound, and whether every
    configuration was visited."""

    candidates: list[Scored] = field(default_factory=list)
    pruned: int = 0
    done: bool = False


class ConfigSearch:
    """The configurations of one cost model visited by increasing lower bound (:meth:`visits`),
    what is kept going into ``found``. ``cm`` and ``request`` are the searched ones (over groups
    of layers on a long profile)."""

    def __init__(self, cm: CostModel, request: PlanRequest, where: SearchPass, policy: Policy, found: Found) -> None:
        self.cm, self.request, self.where, self.policy, self.found = cm, request, where, policy, found
        self.num_groups, self.cap_bytes, self.settings = where.num_groups, where.cap_bytes, where.settings
        self.configs = configs = searched_configs(cm, request, where)
        self.facts = ConfigFacts(cm, request, where.cap_bytes, where.fsdp, configs, policy.fill, policy.orders_by_state)
        # ZBV's and DualPipe-V's configurations share one DP (planner.solve.optimum.remembered)
        self.chain = where.chain_solver
        self.solved: Solved | None = {} if where.chain_solver is solve_chain else None
        # (order, tie-break, index, phase, bound): a heap, so that a configuration whose memory bound
        # (worked out when the order reaches it) is higher goes back in (phase MEMORY), and so does
        # its ZeRO 3 variant when its own stage does not fit and ZeRO 3's bound is higher (phase FSDP);
        # the order is the bound, times the state's share of memory where the policy orders so (the ME objective)
        self.scales = self.facts.scales
        self.heap: list[tuple[float, tuple[object, ...], int, int, float]] = [
            (lb * self.scales[i], c.sort_key, i, FRESH, lb) for i, (c, lb) in enumerate(zip(configs, self.facts.first_ms))]
        heapq.heapify(self.heap)
        # per stage table (by id: the facts keep them), its recomputation curve and largest working sets
        self.curves: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.workspaces: dict[int, np.ndarray] = {}
        self.out = found.candidates  # (several searches may keep into one)
        # rebalancings waiting in the order (phase REBALANCE, by index): the configuration, its
        # solution, and the place in ``out`` of the candidate kept for it (None: none was)
        self.pending: list[tuple[Config, ChainSolution, int | None] | None] = []

    def visits(self) -> Iterator[float]:
        """Every configuration in the order of its bound, the bound yielded before each is visited
        (:meth:`visit`: the caller may stop there)."""
        while self.heap:
            yield self.heap[0][0]
            self.visit()

    def limit(self, c: Config, lb: float | None = None) -> float:
        """What ``c`` (at bound ``lb``) must beat, by the policy."""
        return self.policy.limit(self.facts, c, lb, c.num_groups == self.num_groups)

    def visit(self) -> None:
        """Visit the next configuration: skip it if its bound exceeds what it must beat, else
        solve its variants and keep the policy's candidates (or run a rebalancing that waited)."""
        facts, policy = self.facts, self.policy
        _, key, i, phase, lb = heapq.heappop(self.heap)
        if phase == REBALANCE:
            self.rebalance(lb, i)
            return
        c0 = self.configs[i]
        limit = self.limit(c0, lb)
        # the memory bound (and a zero-bubble configuration's fill, ConfigFacts.split_fill_ms),
        # worked out only for configurations the order reaches (when first reached): higher, the
        # configuration goes back in its place; else its busiest rank's floor (with tight)
        fresh = phase == FRESH
        seen = facts.reached(c0, lb, limit, self.where.slack, prune=policy.prune, fsdp_only=phase == FSDP,
                             memory=fresh and policy.tight and self.request.recompute, fill=fresh and policy.fill,
                             floors=policy.tight)
        if seen.bound_ms > lb:
            heapq.heappush(self.heap, (seen.bound_ms * self.scales[i], key, i, MEMORY, seen.bound_ms))
            return
        if not seen.variants:
            # the rank floors (whole layers; memory) only skip, not reorder: a configuration they skip
            # would have given no candidate (keep), and one visited later can be kept against a
            # tighter limit (the Pareto points are the best configurations', RESULTS 37); an infinite
            # memory floor is no bound but a configuration none of whose variants fits (not counted
            # as pruned: solved, it would have given none)
            self.found.pruned += lb > limit or seen.busiest_ms < INF
            return
        # this configuration at its searched stage: the variant that fitted, and its solution (None:
        # not solved, no proposal of it could pass keep's check: :meth:`hopeless`)
        fitted: tuple[Config, ChainSolution | None] | None = None
        for c in seen.variants:
            if is_fsdp(c.layout.sharding(0)) and phase != FSDP:
                # ZeRO 3 where nothing else fits (see variants); where its own bound (its collectives
                # too; the memory floor already counts its sharding) is higher, back in the order. The
                # whole group's ZeRO 3 also where HSDP fitted only by recomputing: it holds 1/D of the
                # state, not 1/node's, and may fit without (torchtitan's Llama 2 13B, 64 A100s, b=2)
                if fitted is not None and not (fitted[0].layout.shard_group_size and _recomputes(fitted[1])
                                               and not c.layout.shard_group_size):
                    continue
                own = max(lb, config_lower_bound_ms(self.cm, c))
                if policy.prune and own > lb:
                    heapq.heappush(self.heap, (own * self.scales[i], key, i, FSDP, own))
                    continue
            if self.hopeless(c, limit, read=phase != FSDP and bool(c.layout.shard_group_size)):
                fitted = (c, None)  # it fits, and whatever it proposes is slower than the limit
                continue
            sol = solve_config(self.chain, facts.table_of(c), c, self.solved)
            if sol is None:
                continue
            fitted = (c, sol)
            self.propose(c, sol, key, limit)
            limit = self.limit(c0, lb)

    def hopeless(self, c: Config, limit: float, read: bool = False) -> bool:
        """``c`` (one chunk per rank) has a plan, and no proposal of it passes :meth:`keep`'s check
        against ``limit``: every partition has a stage slower than ``limit / M``
        (:func:`~planner.solve.stage_floor.busiest_stage_above`) and some partition surely fits
        (:func:`~planner.solve.stage_floor.surely_fits`, at a zero-bubble stage's conservative
        counts: then :func:`solve_config` returns a solution). Solving it would only tell the
        variants after it that it fits (``read``: a variant after it reads its solution, whose
        recomputation decides whether to solve that one; then, and for copies per stage, solved as
        before)."""
        lay = c.layout
        if (read or not self.policy.prune or limit == float("inf") or lay.virtual_stages_per_rank > 1
                or lay.stage_replicas or self.cm.profile.shared_saved):
            return False
        held = held_counts(c.schedule, c.layout, c.num_microbatches)
        return skippable(self.facts.table_of(c), held, tuple(h.conservative for h in held) if c.schedule.splits_backward
                         else held, limit * self.where.slack / c.num_microbatches, self.curves, self.workspaces)

    def propose(self, c: Config, sol: ChainSolution, key: tuple[object, ...], limit: float) -> None:
        """Keep the policy's candidates among ``sol`` and what it offers now
        (:func:`~planner.solve.proposals.offer`: the baselines' partitions, where this search's chain
        solver is the DP, and its memory rebalancings when due); a rebalancing gated by a later time
        waits in the order (phase ``REBALANCE``)."""
        policy = self.policy
        checked = None
        if self.where.chain_solver is solve_chain:
            checked = limit * self.where.slack if policy.prune else INF  # keep's check, below
        offered = offer(self.cm, self.request, c, sol, self.facts.table_of(c), self.settings, cap=self.cap_bytes,
                        limit_ms=limit, lean=policy.lean, prune=policy.prune, alternatives_below_ms=checked)
        kept = self.keep(c, [Candidate(c, sol), *offered.candidates], limit)
        if offered.rebalance_at_ms < INF:
            # rebalanced when the order reaches that time, if it still could win then: no rebalancing
            # of a configuration beaten meanwhile
            at = offered.rebalance_at_ms
            heapq.heappush(self.heap, (at, key, len(self.pending), REBALANCE, at))
            self.pending.append((c, sol, kept))

    def keep(self, c: Config, proposals: list[Candidate], limit: float, slot: int | None = None) -> int | None:
        """Simulate ``proposals`` of ``c`` and keep the policy's candidates among them (the
        fastest, the first of equals, in place of the one at ``slot`` of :attr:`out` when faster
        than it; or what :meth:`Policy.kept` says); the candidate's place in :attr:`out` (None:
        none kept)."""
        scored = []
        for cand in proposals:
            # the busiest rank does M x its stage's work (its chunks', interleaved): no faster than that
            if self.policy.prune and c.num_microbatches * self.busiest_ms(c, cand.solution) > limit * self.where.slack:
                continue
            scored.append((simulated(self.cm, cand), cand))
        if not scored:
            return slot
        fastest = min(scored, key=lambda tc: tc[0])
        kept = self.policy.keep(self.cm, c, scored, fastest, c.num_groups == self.num_groups)
        if kept is not None:
            self.out += kept
            return len(self.out) - 1
        if slot is None:
            self.out.append(fastest)
            slot = len(self.out) - 1
        elif fastest[0] < self.out[slot][0]:
            self.out[slot] = fastest
        return slot

    def rebalance(self, unrec: float, index: int) -> None:
        """Run the rebalancing waiting at ``index`` of :attr:`pending` if its solution without
        recomputation (``unrec``) still beats what its configuration must beat."""
        found = self.pending[index]
        self.pending[index] = None
        assert found is not None, "a rebalancing was visited twice"
        c, sol, slot = found
        limit = self.limit(c)
        if not unrec < limit:
            return
        offered = offer(self.cm, self.request, c, sol, self.facts.table_of(c), self.settings, cap=self.cap_bytes,
                        limit_ms=limit, lean=self.policy.lean, prune=self.policy.prune, alternatives_below_ms=None,
                        due=True)
        self.keep(c, list(offered.candidates), limit, slot)

    def busiest_ms(self, c: Config, solution: ChainSolution) -> float:
        """The most per-micro-batch work of one rank: its stage's (with the policy's ``tight``,
        the sum of its chunks' when it holds several)."""
        times = solution.stage_times_ms
        return busiest_rank(c.layout, times) if self.policy.tight else max(times)


def searched_configs(cm: CostModel, request: PlanRequest, where: SearchPass) -> list[Config]:
    """The configurations ``where`` visits: its own list, else the whole space its chain solver
    prices (the oracles one stage per rank only; the CP-SAT model not the split schedules)."""
    if where.configs is not None:
        return list(where.configs)
    solver = where.chain_solver
    split_ok = solver in (solve_chain, solve_chain_bruteforce)
    return all_configs(cm, request, where.num_groups, solver is solve_chain, where.settings, split_ok)


def over_layers(c: Config) -> bool:
    """On a grouped profile, ``c`` is searched over the layers themselves (:func:`config_search`):
    the zero-bubble schedules (their backward split into I and W)."""
    return c.schedule.splits_backward


def config_search(
    cm: CostModel, request: PlanRequest, where: SearchPass, policy: Policy, found: Found,
    layers: tuple[CostModel, PlanRequest] | None = None,
) -> Iterator[float]:
    """The search of ``where``'s configurations under ``policy``, driven by its caller: the
    iterator yields the bound of the next configuration before visiting it, so that a caller can
    stop where that exceeds what it needs (every configuration left is bounded at least as high)
    or interleave several searches in one order (:func:`planner.solve.search.pruned_degrees`);
    what is kept goes into ``found`` (``found.done`` once every configuration is visited).

    With ``layers`` (the model and request over single layers, ``cm`` and ``request`` being over
    groups of layers) the zero-bubble configurations (:func:`over_layers`) are searched over the
    layers themselves, the others over the groups (refined afterwards, :mod:`planner.solve.coarsen`),
    the two searches visited in one order of bound against one policy (and incumbent). Why: over
    groups a stage's length moves in steps of whole groups, and a zero-bubble stage holds more
    than 1F1B's (its micro-batches past I), so the grid can force it to recompute where a layer
    more or less would fit: GPT-3 175B on 64 A100s (T4 x P8 x D2) simulated 106.9 s for ZB-H1
    over its 64 groups, 90.3 s over its 98 layers, and 1F1B 99.0 s over the groups: its
    candidate was never refined. Over the layers its time is the plan's, so the pruning's bounds
    (each a bound over every partition) hold for it as they are, without the refinement's slack.
    Its DP over 98 layers cost about what it did over 64 groups."""
    configs = searched_configs(cm, request, where)
    split = [c for c in configs if over_layers(c)]
    if layers is None or not split:
        yield from ConfigSearch(cm, request, dataclasses.replace(where, configs=configs), policy, found).visits()
    else:
        coarse = ConfigSearch(cm, request, dataclasses.replace(where, configs=[c for c in configs if not over_layers(c)]),
                              policy, found)
        fine = ConfigSearch(*layers, dataclasses.replace(where, configs=split, slack=1.0), policy, found)
        yield from in_one_order([coarse.visits(), fine.visits()])
    found.done = True


def in_one_order(parts: list[Iterator[float]]) -> Iterator[float]:
    """Several searches' visits in one order: each step the search whose next bound is the least
    (the first of equals) visits its next configuration."""
    heads: list[float | None] = [next(part, None) for part in parts]
    while True:
        live = [(bound, i) for i, bound in enumerate(heads) if bound is not None]
        if not live:
            return
        bound, i = min(live)
        yield bound
        heads[i] = next(parts[i], None)


def _recomputes(sol: ChainSolution | None) -> bool:
    """Whether ``sol`` recomputes any layer (fully or selectively)."""
    assert sol is not None, "a configuration not solved (hopeless) decides no variant by its recomputation"
    return any(sol.recompute) or any(sol.selective)
