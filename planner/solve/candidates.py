"""Building candidates: each configuration's exact optimum of the chain objective J (and the
baselines' partitions of it), with the least recomputation that fits and its simulated time.

Across configurations J alone is not comparable (it leaves out the data-parallel all-reduce's
exact overlap and the schedule's), so every candidate is replayed by the simulator's fast entry
(:func:`simulated`), and candidates are compared by that time.
"""

from __future__ import annotations

import copy
import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from planner.artifacts.kinds import MEMORY_OBJECTIVE_FACTOR, ChunkPlacement, Objective, ScheduleKind, ZeroStage
from planner.artifacts.layout import Layout
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.cost.fsdp import is_fsdp
from planner.simulation import simulate_iteration_ms
from planner.solve.arrays import distinct
from planner.solve.bruteforce import solve_chain_bruteforce
from planner.solve.chain_dp import (
    ChainSolution,
    RecentEntries,
    StageTable,
    could_partition,
    least_largest,
    solve_chain,
)
from planner.solve.partitions import WEIGHTS, honouring, minmax_partition
from planner.solve.recompute import choose_recompute
from planner.solve.settings import SETTINGS, SearchSettings
from planner.solve.space import Config, all_configs, config_lower_bound_ms, fsdp_searched

#: a configuration's place in the order (ConfigSearch.heap): its first bound; its memory floor
#: worked in; its ZeRO 3 variant alone, its own stage found not to fit; a solution's rebalancing
#: (:func:`rebalanced`), at the time the solution's partition simulates without recomputation
FRESH, MEMORY, FSDP, REBALANCE = 0, 1, 2, 3
#: schedules whose iteration is at least a full micro-batch plus M - 1 of the busiest stage's
FILL_BOUND = (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B)
#: a chain solver: (stage table, layout, micro-batches, schedule) -> the optimum of J, or None
ChainSolver = Callable[..., "ChainSolution | None"]


@dataclass(frozen=True, slots=True)
class Candidate:
    config: Config
    solution: ChainSolution


Scored = tuple[float, Candidate]


def score_key(tc: Scored) -> tuple[object, ...]:
    """Order of scored candidates: simulated time, then the configuration's tie-break."""
    return (tc[0],) + tc[1].config.sort_key()


def chunk_fill_bound_ms(cm: CostModel, c: Config) -> float:
    """No interleaved 1F1B plan of ``c`` simulates faster (whatever its partition). Pipeline rank
    ``r`` runs chunks ``r, r + P, ...``; its first operation is a forward, which waits for the
    forwards of chunks ``0 .. r - 1`` of that micro-batch, and after its last (a backward: every
    forward is followed by its backward on the same rank) the backwards of chunks ``r - 1 .. 0``
    of that micro-batch still run. Every chunk holds a layer, so those chunks hold at least the
    first ``r`` layers: ``T >= a_r + M W_r``, ``a_r`` the first ``r`` layers' forward + backward,
    ``W_r`` the rank's work per micro-batch. The ranks' works sum to at least the profile's
    ``W``, so the busiest of these bounds is at least the ``T`` at which ``sum_r max(0, T - a_r)
    = M W`` (recomputation, transfers and synchronisation only add). Against the average-work
    bound ``M W / P`` it adds about half the interleaved bubble when chunks are about a layer each
    (deep pipelines: e.g. +24% at P = 64, v = 2, M = 64)."""
    a = [float(x) for x in rank_fills_ms(cm, c)]  # ascending: layer work >= 0
    need = c.num_microbatches * cm.work_ms(c.microbatch_size)
    for k in range(len(a), 0, -1):  # the ranks whose a_r is below T share the work
        t = (need + sum(a[:k])) / k
        if t >= a[k - 1]:
            return t
    return need


def busiest_rank_floor_ms(work: np.ndarray, num_ranks: int) -> float:
    """No one of ``num_ranks`` ranks holding whole layers of ``work`` ms between them (in any
    chunks, contiguous or not) has less than this: among the ``k`` layers of most work some rank
    holds ``ceil(k / R)``, so at least the ``ceil(k / R)`` lightest of them (the classical bound
    of scheduling on identical machines, over every ``k``). With layers of about equal work it
    is ``ceil(L / R)`` layers where the average counts ``L / R``: 98 layers over 64 ranks, 2
    against 1.53."""
    desc = np.sort(np.asarray(work, dtype=float))[::-1]
    prefix = np.concatenate([[0.0], np.cumsum(desc)])
    k = np.arange(1, len(desc) + 1)
    q = -(-k // num_ranks)
    return float(np.max(prefix[k] - prefix[k - q], initial=0.0)) * (1 - 1e-9)


#: breakpoints (bytes freed per micro-batch, ms) of recompute_curve
Curve = tuple[np.ndarray, np.ndarray]


def recompute_curve(fwd: np.ndarray, gain: np.ndarray, core_ms: np.ndarray, core_bytes: np.ndarray) -> Curve:
    """Breakpoints ``(x, R(x))`` of the least ms per micro-batch in which recomputation frees
    ``x`` bytes per micro-batch, each layer at most once and in any fraction: a layer frees
    ``gain`` at its forward's ``fwd`` ms (full), or ``core_bytes`` at ``core_ms`` (selective),
    or nothing; its lower convex hull of those three points, every layer's segments taken
    cheapest first (a convex piecewise-linear ``R`` from ``(0, 0)``; past the last point, where
    nothing frees more, :func:`recompute_ms` goes on at the last slope)."""
    segments: list[tuple[float, float]] = []  # (ms per byte, bytes)
    layers = zip(fwd.tolist(), np.maximum(gain, 0.0).tolist(), core_ms.tolist(), core_bytes.tolist())
    for (f, g, t, c), count in Counter(layers).items():  # equal layers: one hull, its segments that many times
        hull = [(0.0, 0.0)]
        for x, y in sorted(p for p in ((c, t), (g, f)) if p[0] > 0):
            while len(hull) > 1 and _turn(hull[-2], hull[-1], (x, y)) <= 0:
                hull.pop()  # the point before lies on or above the chord: not on the lower hull
            if x > hull[-1][0]:
                hull.append((x, y))
            elif y < hull[-1][1]:
                hull[-1] = (x, y)
        segments += [((y1 - y0) / (x1 - x0), x1 - x0) for (x0, y0), (x1, y1) in itertools.pairwise(hull)] * count
    segments.sort()
    xs = np.concatenate([[0.0], np.cumsum([n for _, n in segments])])
    ys = np.concatenate([[0.0], np.cumsum([r * n for r, n in segments])])
    return xs, ys


def _turn(a: tuple[float, float], b: tuple[float, float], c: tuple[float, float]) -> float:
    """Positive when ``a -> b -> c`` turns left (``b`` below the chord ``a c``)."""
    return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])


def recompute_ms(curve: Curve, freed: np.ndarray | float) -> np.ndarray:
    """``R(freed)`` of :func:`recompute_curve`, past its last point at its last slope (a floor:
    nothing frees that much)."""
    xs, ys = curve
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
    x = np.asarray(freed, dtype=float)
    out: np.ndarray = np.where(x <= xs[-1], np.interp(x, xs, ys), ys[-1] + slope * (x - xs[-1]))
    return out


def rank_fills_ms(cm: CostModel, c: Config) -> np.ndarray:
    """Per pipeline rank ``r``, ``a_r``: the first ``r`` layers' forward + backward, what rank
    ``r`` waits at least before its first operation and after its last (the chunks before its
    first hold a layer each)."""
    fp, bp = cm.time_prefix(c.microbatch_size)
    P = min(c.layout.pipeline_size, len(fp))
    fills: np.ndarray = fp[:P] + bp[:P]
    return fills


def solve_config(chain_solver: ChainSolver, table: StageTable, c: Config) -> ChainSolution | None:
    return chain_solver(table, layout=c.layout, num_microbatches=c.num_microbatches, schedule=c.schedule)


def least_bytes(work: np.ndarray, nbytes: np.ndarray, cap: float) -> tuple[np.ndarray, np.ndarray]:
    """The least bytes any share of the layers with total work ``w`` holds, ``H(w)``, layer
    ``i`` holding ``nbytes[i]`` for its ``work[i] > 0`` and taken in any fraction (so the fewest
    bytes per ms first): breakpoints ``(w, H(w))`` of a convex piecewise-linear function from
    ``(0, 0)`` to the whole profile, with the point where ``H`` reaches ``cap`` among them."""
    order = np.argsort(nbytes / work, kind="stable")
    w = np.concatenate([[0.0], np.cumsum(work[order])])
    h = np.concatenate([[0.0], np.cumsum(nbytes[order])])
    k = int(np.searchsorted(h, cap))
    if 0 < k < len(h) and h[k] > cap > h[k - 1]:
        at = w[k - 1] + (w[k] - w[k - 1]) * (cap - h[k - 1]) / (h[k] - h[k - 1])
        w, h = np.insert(w, k, at), np.insert(h, k, cap)
    return w, h


@dataclass(slots=True)
class Incumbent:
    """The best simulated times found so far, shared by the searches of several degrees (one
    per tensor- x context-parallel degree, :func:`planner.solve.search.search_plan`): ``best``
    over every candidate, ``best_all`` over those on all the devices. Mutable on purpose: every
    search prunes against what the others found."""

    best: float = float("inf")
    best_all: float = float("inf")

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


def gives_reference(cand: Candidate) -> bool:
    """The candidate's plan could be the ME index's reference: GPipe, nothing recomputed."""
    sol = cand.solution
    return cand.config.schedule is ScheduleKind.GPIPE and not any(sol.recompute) and not sol.selective


#: the ME objective's memory figures agree to this fraction: a stage's peak (its parts each rounded
#: to bytes) against its plan's (rounded once), e.g. 1,073,456,098 against 1,073,456,096 bytes
BYTES_SLACK = 1e-6


@dataclass(slots=True)
class MeIncumbent:
    """The ME objective's pruning state, shared by every configuration search of one request
    (every degree, every memory cap). The index is ``(ref time / t) / (m / ref memory)``, so the
    plan it chooses has the least ``t x m`` (iteration time x peak memory) whatever the
    reference: ``product`` is the least ``t x m`` of a candidate found so far, its memory each
    rank's chunks' peaks summed (no less than its plan's peak, so the winner's product is at most
    this); ``reference_ms`` the fastest GPipe candidate without recomputation so far (the index's
    reference, :func:`planner.solve.select.select`). A configuration is solved only if it could
    hold the winner (its time bound x its memory floor at most ``product``), a faster
    reference (a GPipe one with a partition that fits without recomputation, its time bound at
    most ``reference_ms``), the fastest candidate
    (while no reference is known: the reference falls back to it) or the fastest on all the
    devices (the plan records it): :meth:`limit_ms`, the time its bound must not exceed."""

    product: float = math.inf
    reference_ms: float = math.inf

    def limit_ms(self, floor_bytes: float, reference: bool, inc: Incumbent, on_all: bool, widen: float = 1.0) -> float:
        """The time bound above which a configuration cannot hold any of those, its plans' peak
        memory at least ``floor_bytes``, ``reference``: it might give a reference (with a
        relative 1e-9 to spare for rounding); ``widen``: every figure it must beat that much
        wider (over groups of layers, whose candidates the refinement changes)."""
        out = self.product * widen / floor_bytes if floor_bytes > 0 else math.inf
        if reference:
            out = max(out, self.reference_ms * widen)
        if self.reference_ms == math.inf:
            out = max(out, inc.best * widen)
        if on_all:
            out = max(out, inc.best_all * widen)
        return out * (1 + 1e-9)

    def note(self, cand: Candidate, time_ms: float, product: float) -> None:
        """A candidate kept, simulated at ``time_ms``, ``product`` its time x its busiest rank's
        memory (its chunks' peaks summed; with a relative 1e-6 to spare for the bytes each stage's
        parts are rounded to)."""
        self.product = min(self.product, product * (1 + BYTES_SLACK))
        if gives_reference(cand):
            self.reference_ms = min(self.reference_ms, time_ms)

    def matters(self, cm: CostModel, scored: Scored, inc: Incumbent, on_all: bool, widen: float = 1.0) -> bool:
        """The candidate could be the plan the objective chooses, its reference, the fastest
        while no reference is known, or the fastest on all the devices (else no plan is built for
        it): its memory at least its largest stage's peak; ``widen`` as :meth:`limit_ms`'s."""
        t, cand = scored
        c, sol = cand.config, cand.solution
        slack = (1 + 1e-9) * widen
        if t * max(stage_needs(cm, c, sol)) <= self.product * (1 + BYTES_SLACK) * widen:
            return True
        if gives_reference(cand) and t <= self.reference_ms * slack:
            return True
        return (self.reference_ms == math.inf and t <= inc.best * slack) or (on_all and t <= inc.best_all * slack)


class ConfigSearch:
    """The configurations of one cost model visited by increasing lower bound, one step at a
    time (:meth:`step`), so that several such searches can be interleaved in one order
    (:func:`planner.solve.search.search_plan`); :func:`solve_candidates` runs one to the end.
    Arguments as :func:`solve_candidates`'s; ``shared``: the incumbent pruned against (and
    updated), else one of its own starting at ``incumbent_ms``; ``fill``: the one-chunk fill
    bound (:meth:`bound`) also without an outside incumbent."""

    def __init__(
        self,
        cm: CostModel,
        request: PlanRequest,
        num_groups: int,
        cap_bytes: float,
        chain_solver: ChainSolver = solve_chain,
        *,
        prune: bool = True,
        configs: list[Config] | None = None,
        settings: SearchSettings = SETTINGS,
        fsdp: bool = True,
        incumbent_ms: float = float("inf"),
        shared: Incumbent | None = None,
        fill: bool = False,
        slack: float = 1.0,
        budget: Budget | None = None,
        me: MeIncumbent | None = None,
        me_widen: float = 1.0,
    ) -> None:
        self.cm, self.request, self.num_groups, self.cap_bytes = cm, request, num_groups, cap_bytes
        self.budget = budget if budget is not None else Budget()
        self.me = me if prune else None  # the ME objective's pruning (:class:`MeIncumbent`)
        self.me_widen = me_widen  # its figures widened (over groups of layers: MeIncumbent.limit_ms)
        # the memory and ME objectives (pruned or not): every configuration whose solution recomputes
        # rebalanced, and every proposal leaner than the faster ones kept beside the fastest (:meth:`keep`)
        self.lean = request.objective in (Objective.MEMORY, Objective.ME)
        self.floors: dict[Config, float] = {}  # per configuration, its memory floor (memory_floor_bytes)
        self.references: dict[Config, bool] = {}  # per configuration, whether it might give the ME reference
        self.least: dict[tuple[int, int], np.ndarray | None] = {}  # StageTable.least_bytes per (table, count)
        self.chain_solver, self.prune, self.settings, self.fsdp = chain_solver, prune, settings, fsdp
        # a proposal is simulated unless its busiest rank exceeds what it must beat times this
        # (a grouped profile's best candidates are refined, which can reorder them)
        self.slack = slack
        # a budget, or the ME objective, prunes with every bound from the start
        bounded = fill or self.budget.widened or self.me is not None
        self.fill = bounded or incumbent_ms < float("inf")
        self.tight = bounded  # also the memory floor (memory_bound)
        self.per_size: dict[tuple[int, float], tuple[float, float, Curve, np.ndarray, np.ndarray, np.ndarray]] = {}
        # breakpoints (t, w) of a rank's g^-1 per (micro-batch size, state bytes per parameter, k_min)
        self.inverses: dict[tuple[tuple[int, float], int], tuple[np.ndarray, np.ndarray]] = {}
        self.unique_params = float(cm.stage_param_count(0, cm.num_layers))
        self.chunk_fills: dict[tuple[int, int, int], float] = {}  # chunk_fill_bound_ms per (b, P, M)
        self.rank_floors: dict[tuple[int, int], float] = {}  # busiest_rank_floor_ms per (micro-batch size, P)
        interleaved_ok = chain_solver is solve_chain  # the oracles price one stage per rank only
        split_ok = chain_solver in (solve_chain, solve_chain_bruteforce)  # the CP-SAT model: not ZB-H1's objective
        configs = configs if configs is not None else all_configs(cm, request, num_groups, interleaved_ok, settings,
                                                                  split_ok)
        self.configs = configs
        # (order, tie-break, index, phase, bound): a heap, so that a configuration whose memory bound
        # (worked out when the order reaches it) is higher goes back in (phase MEMORY), and so does
        # its ZeRO 3 variant when its own stage does not fit and ZeRO 3's bound is higher (phase FSDP);
        # the order is the bound, for the ME objective the bound x the state's share of memory (:meth:`order`)
        self.scales = [self.state_floor_bytes(c) if self.me is not None else 1.0 for c in configs]
        self.heap = [(self.order(lb, i), c.sort_key(), i, FRESH, lb)
                     for i, (c, lb) in enumerate((c, self.bound(c)) for c in configs)]
        heapq.heapify(self.heap)
        self.pruned = 0  # configurations skipped by their bound
        start = incumbent_ms if prune else float("inf")
        self.incumbent = shared if shared is not None and prune else Incumbent(start, start)
        self.tables: dict[tuple[object, ...], StageTable] = {}
        self.recent = RecentEntries()  # their entries per in-flight count and cap, the recent ones kept
        self.out: list[Scored] = []
        # rebalancings waiting in the order (phase REBALANCE, by index): the configuration, its
        # solution, and the place in ``out`` of the candidate kept for it (None: none was)
        self.pending: list[tuple[Config, ChainSolution, int | None] | None] = []

    def bound(self, c: Config) -> float:
        """:func:`config_lower_bound_ms`; with ``fill`` also the fill of a one-chunk GPipe /
        1F1B pipeline: a micro-batch crosses every stage, the other M - 1 wait behind the
        busiest, ``work + (M - 1) work / P`` at best."""
        cm = self.cm
        lb = config_lower_bound_ms(cm, c)
        if self.fill and c.schedule in FILL_BOUND and c.layout.virtual_stages_per_rank == 1:
            work = cm.work_ms(c.microbatch_size)
            lb = max(lb, work + (c.num_microbatches - 1) * work / c.pipeline_size)
        elif self.fill and c.schedule is ScheduleKind.INTERLEAVED_1F1B and not c.layout.stage_replicas:
            # the same for every chunk count (and ZeRO stage): worked out once per (b, P, M)
            key = (c.microbatch_size, c.pipeline_size, c.num_microbatches)
            if key not in self.chunk_fills:
                self.chunk_fills[key] = chunk_fill_bound_ms(cm, c)
            lb = max(lb, self.chunk_fills[key])
        return lb

    def rank_floor_ms(self, c: Config) -> float:
        """No proposal of ``c`` passes :meth:`keep`'s check when this exceeds what it must beat:
        its busiest rank runs its layers M times, whichever whole layers it holds
        (:func:`busiest_rank_floor_ms`), over groups of layers divided by the check's slack. 0
        where the check counts one stage, not a rank's chunks (without ``tight``), or copies."""
        if not self.tight or c.layout.stage_replicas:
            return 0.0
        key = (c.microbatch_size, c.pipeline_size)
        if key not in self.rank_floors:
            fwd, bwd = self.cm.layer_times(c.microbatch_size)
            self.rank_floors[key] = busiest_rank_floor_ms(fwd + bwd, c.pipeline_size)
        return c.num_microbatches * self.rank_floors[key] / self.slack

    def memory_bound(self, c: Config) -> float:
        """The memory floor as time (GPipe, 1F1B, interleaved 1F1B; 0 for profiles with shared
        saved storages, not bounded here). Devices short of memory recompute: a layer
        recomputed (a fraction ``z`` of it, fully or selectively) still holds ``a - z g >= 0``
        of its saved bytes ``a`` per micro-batch in flight (``g``: what that level frees), at
        ``z f`` ms per micro-batch. Counting every layer's held bytes for ``k_min`` micro-batches,
        no more than any stage of the devices holds, they still fit ``cap`` only if the
        recomputation frees at least ``(H - cap) / k_min`` bytes per micro-batch (``H``: their
        bytes counted so, without any), which takes at least ``R`` of it: the least time any
        layers' recomputation freeing that much per micro-batch takes (:func:`recompute_curve`,
        each layer once, fractions allowed; its first slope is the cheapest ms per byte of any
        layer, the one figure this took before: GPT-3's head frees bytes at 28 ms / GB, its blocks
        at 50, so past the head's 0.1 GB the old floor counted half). (Counted at ``k_min``, freeing is priced at
        ``k_min`` too: pricing it at the largest count, as before, divided this floor by up to
        ``k_max / k_min``, 16 on an interleaved rank.) Two relaxations, the larger counts:

        - summed over the ranks: every rank fits ``cap``, so all recomputation together frees
          at least what the stages would hold without any (the model state once, sharded as
          the leanest variant solved, plus every layer's saved bytes for the fewest
          micro-batches any stage holds) less ``P x cap``, over that fewest count; the busiest
          rank does at least 1 / P of the pipeline's ``M x (work + recomputation)``;
        - rank by rank: a rank given work ``w`` holding at least ``k_min`` micro-batches in every
          stage holds at least ``H(w)`` bytes, the least any share of the layers with that work
          holds (layer ``i``: ``kappa p_i + k_min a_i`` bytes for its work ``w_i``, state and
          saved activations; fractions of layers allowed, so the lightest bytes per ms are
          taken first: a convex piecewise-linear ``H``, :func:`least_bytes`). It takes ``g_r(w) =
          w + R(max(0, H(w) - cap) / k_min)`` per micro-batch (convex, increasing), ``M g_r(w)`` between its first
          operation and its last, and waits ``a_r`` besides, the first ``r`` layers' forward and
          backward (:func:`chunk_fill_bound_ms`'s argument: the chunks before its first hold at
          least a layer each; one stage per rank alike), so ``T >= a_r + M g_r(w_r)``. The
          ranks' works sum to the profile's, so ``T`` is at least the ``T`` at which the works
          ``g_r^-1((T - a_r) / M)`` sum to it: both the fill and the memory floor of each rank
          count (the deep ranks, whose last chunks hold few micro-batches and so bound little
          memory, are the ones that wait). (Taking each layer's share at the least bytes per ms
          of any layer instead, one atypical layer, a GPT's embedding with its few saved bytes
          per ms, made the floor vanish.)"""
        cm, b, lay = self.cm, c.microbatch_size, c.layout
        if (cm.profile.shared_saved or lay.stage_replicas
                or c.schedule not in FILL_BOUND + (ScheduleKind.INTERLEAVED_1F1B,)):
            return 0.0
        leanest = c.with_zero(ZeroStage.PARAMETERS) if (self.fsdp and fsdp_searched(self.request, lay)) else c
        kappa = sum(cm.state_bytes_per_param(leanest.sharding()))
        key = (b, kappa)
        if key not in self.per_size:
            fwd, bwd = cm.layer_times(b)
            saved = cm.saved_bytes(b)
            gain_full = saved - cm.input_per_sample * b
            cores = (cm.core_ms(b), cm.core_bytes(b)) if cm.selective else (np.zeros_like(fwd), np.zeros_like(fwd))
            curve = recompute_curve(fwd, gain_full, *cores)
            layer_work = fwd + bwd
            busy = layer_work > 0
            params = cm.param_count.astype(float)
            for tie in cm.profile.tied:  # a stage holding several of a tie's layers counts it once
                params[list(tie.layers)] -= tie.param_count
            params = np.maximum(params, 0.0)
            self.per_size[key] = (float(layer_work.sum()), float(saved.sum()), curve,
                                  layer_work[busy], kappa * params[busy], saved[busy])
        work, saved_total, curve, layer_work, state, saved = self.per_size[key]
        if curve[1][-1] <= 0:
            return 0.0  # recomputation frees nothing, or costs nothing: not bounded here
        ks = c.inflight()
        P, M, cap = lay.pipeline_size, c.num_microbatches, self.cap_bytes
        out = 0.0
        floor = kappa * self.unique_params + lay.num_stages * cm.gather_bytes_per_sample * b + min(ks) * saved_total
        if floor > P * cap:
            out = M * (work + float(recompute_ms(curve, (floor - P * cap) / min(ks)))) / P
        # rank by rank: rank r waits a_r (the first r layers' forward and backward, see
        # chunk_fill_bound_ms) besides M g_r(w_r); each distinct k_min's breakpoints (t, w) of its
        # g^-1, a piecewise-linear increasing function (w <= the profile's work)
        fills = rank_fills_ms(cm, c)  # P of them: a stage holds a layer
        ranks: dict[int, list[float]] = {}
        # rank r holds chunks r, r + P, ... (GPipe, 1F1B, interleaved: the loop placement)
        for r, kmin in enumerate(np.asarray(ks).reshape(-1, P).min(axis=0).tolist()):
            ranks.setdefault(kmin, []).append(float(fills[r]))
        inverses = []
        for kmin, waits in ranks.items():
            found = self.inverses.get((key, kmin))
            if found is None:
                at_w, at_h = least_bytes(layer_work, state + kmin * saved, cap)
                # g at H's breakpoints and where (H - cap) / k_min reaches the curve's: linear between
                xs = cap + kmin * curve[0][1:]
                w = distinct(np.concatenate([at_w, np.interp(xs[(xs > cap) & (xs < at_h[-1])], at_h, at_w)]))
                h = np.interp(w, at_w, at_h)
                found = self.inverses[(key, kmin)] = (w + recompute_ms(curve, np.maximum(0.0, h - cap) / kmin), w)
            inverses.append((*found, np.array(waits)))
        # works(T) = sum over ranks of g_r^-1((T - a_r) / M): piecewise linear between the ranks'
        # breakpoints a_r + M t
        Ts = distinct(np.concatenate([(a[:, None] + M * g[None, :]).ravel() for g, _, a in inverses]))

        def works(at: np.ndarray) -> np.ndarray:  # works(T) at breakpoints Ts[at]
            T = Ts[at]
            total: np.ndarray = sum(np.interp((T[None, :] - a[:, None]) / M, g, w).sum(axis=0) for g, w, a in inverses)
            return total

        # the first breakpoint where the works reach the profile's: works(T) is increasing, so a
        # search over at most 32 probes a round (a call per group of ranks a round, not per probe)
        target, lo, hi = work * (1 - 1e-12), 0, len(Ts)
        while lo < hi:
            probes = distinct(np.linspace(lo, hi - 1, num=min(32, hi - lo)).astype(np.int64))
            reached = np.flatnonzero(works(probes) >= target)
            if not len(reached):
                lo = int(probes[-1]) + 1
            else:
                j = int(reached[0])
                lo, hi = (int(probes[j - 1]) + 1 if j else lo), int(probes[j])
        k = lo
        if k == 0:
            return max(out, float(Ts[0]))
        if k >= len(Ts):  # unreachable: at the largest breakpoint some rank takes all the work
            return out
        (w0, w1), T0, T1 = works(np.array([k - 1, k])), float(Ts[k - 1]), float(Ts[k])
        return max(out, T0 + (T1 - T0) * (float(work) - float(w0)) / (float(w1) - float(w0)))

    def order(self, lb: float, i: int) -> float:
        """Configuration ``i``'s place in the order at bound ``lb``: the bound, or for the ME
        objective the bound x its state floor (a bound of its product, no floor: first)."""
        return lb * self.scales[i]

    def next_bound(self) -> float:
        """The bound of the next configuration to visit (inf when all are visited)."""
        return self.heap[0][0] if self.heap else float("inf")

    @property
    def done(self) -> bool:
        return not self.heap

    def limit(self, c: Config, lb: float | None = None) -> float:
        """What ``c`` must beat: the best on all the groups for a configuration on all of them
        (so that the best plan on all of them is known), else the best of any; widened to the
        search's :class:`Budget` (the memory objective's). The ME objective's
        (:meth:`MeIncumbent.limit_ms`) counts ``c``'s memory floor: the state's share
        (:meth:`state_floor_bytes`), and where ``c``'s bound ``lb`` is within that, the stages'
        least bytes too (:meth:`memory_floor_bytes`, worked out once per configuration)."""
        inc = self.incumbent
        on_all = c.num_groups == self.num_groups
        if self.me is None:
            return self.budget.of(inc.best_all if on_all else inc.best)
        reference = self.references.get(c)
        if reference is None:
            # a GPipe configuration gives a reference only if some partition fits without recomputation
            reference = self.references[c] = c.schedule is ScheduleKind.GPIPE and could_partition(
                self.table_of(self.leanest(c)), c.inflight(), recompute=False)
        floor = self.floors.get(c)
        if floor is None:
            floor = self.state_floor_bytes(c)
            limit = self.me.limit_ms(floor, reference, inc, on_all, self.me_widen)
            if lb is None or lb > limit:
                return limit
            floor = self.floors[c] = max(floor, self.memory_floor_bytes(c))
        return self.me.limit_ms(floor, reference, inc, on_all, self.me_widen)

    def leanest(self, c: Config) -> Config:
        """``c`` at the deepest sharding any of its variants is solved at (:meth:`variants`)."""
        return c.with_zero(ZeroStage.PARAMETERS) if (self.fsdp and fsdp_searched(self.request, c.layout)) else c

    def state_floor_bytes(self, c: Config) -> float:
        """No plan of ``c`` (any variant, partition, recomputation or cap) peaks below this on its
        busiest device: the ranks hold the model state at least once between them, sharded as
        the leanest variant (0 for per-stage replication, not bounded here)."""
        lay = c.layout
        if lay.stage_replicas:
            return 0.0
        kappa = sum(self.cm.state_bytes_per_param(self.leanest(c).sharding()))
        return kappa * self.unique_params / lay.pipeline_size * (1 - 1e-9)

    def memory_floor_bytes(self, c: Config) -> float:
        """No plan of ``c`` peaks below this on its busiest device: the least over the partitions
        of the largest stage's fewest bytes with its in-flight count, at its leanest recomputation
        (:meth:`StageTable.least_bytes`; a rank's chunks hold at least their largest), the less of
        ``c``'s own sharding and its ZeRO 3 variant's where that is solved too (ZeRO 3 gathers each
        layer's weights whole: PipeDream's alexnet, its fully connected layers, peaks higher under
        it); 0 where those are not worked out."""
        lay, L = c.layout, self.cm.num_layers
        ks = c.inflight()
        if lay.stage_replicas or len(ks) > L:
            return 0.0
        variants = dict.fromkeys([c, self.leanest(c)])
        out = math.inf
        for v in variants:
            table = self.table_of(v)
            needs = []
            for k in ks:
                key = (id(table), k)
                if key not in self.least:
                    self.least[key] = table.least_bytes(k)
                found = self.least[key]
                if found is None:
                    return 0.0
                needs.append(found)
            out = min(out, least_largest(needs, L))
        return max(out, 0.0) * (1 - 1e-9)

    def table_of(self, c: Config) -> StageTable:
        cm, tables = self.cm, self.tables
        v = c.layout.virtual_stages_per_rank
        line = cm.fsdp_line(c.layout) if is_fsdp(c.sharding()) else (0.0, 0.0)
        key = (c.microbatch_size, v, c.sharding(), line)
        if key not in tables:
            # a rank holding v chunks gives each cap / v (the sum of their peaks fits)
            tables[key] = StageTable(
                cm, c.microbatch_size, self.cap_bytes / v, self.request.fixed_boundaries,
                allow_recompute=self.request.recompute, sharding=c.sharding(), fsdp_line=line, recent=self.recent,
            )
        return tables[key]

    def variants(self, c: Config) -> list[Config]:
        """``c`` at its searched ZeRO stage (none where memory binds nowhere, or both where the cluster
        prices the optimizer step, which sharding shortens) and, where memory
        binds and the request allows it, at ZeRO 3 too (its collectives cost time: it is a
        configuration of its own, not a free deepening). The ZeRO 3 variant is solved only if
        ``c`` does not fit at its own stage: where ZeRO 1/2 fits (with recomputation), ZeRO 3 could
        only trade recomputation for gathers, and solving it there too took the solver 1.7 to 2.6x
        its time on GPT-3 175B over 1,024 GPUs, no plan changed (RESULTS 13); a request for
        ZeRO 3 alone (``--zero 3``) solves it everywhere."""
        request, cm = self.request, self.cm
        fsdp_too = self.fsdp and fsdp_searched(request, c.layout) and c.layout.zero is not ZeroStage.PARAMETERS
        if (c.layout.zero or fsdp_too) and ZeroStage.NONE in request.zero_stages:
            plain = c.with_zero(ZeroStage.NONE)
            if self.table_of(plain).fits_everywhere(max(c.inflight())):
                # memory binds nowhere: sharding can only shorten the optimizer step (where priced)
                return [plain, c] if c.layout.zero and cm.cluster.memory_bandwidth_gb_per_s else [plain]
        if fsdp_too and not self.table_of(c).fits_everywhere(max(c.inflight())):
            return [c, c.with_zero(ZeroStage.PARAMETERS)]
        return [c]

    def step(self) -> None:
        """Visit the next configuration: skip it if its bound exceeds what it must beat, else
        solve its variants and keep the fastest candidate (or run a rebalancing that waited)."""
        cm, request, prune, settings = self.cm, self.request, self.prune, self.settings
        _, key, i, phase, lb = heapq.heappop(self.heap)
        if phase == REBALANCE:
            self.rebalance(lb, i)
            return
        c0 = self.configs[i]
        limit = self.limit(c0, lb)
        if prune and self.tight and self.request.recompute and phase == FRESH and lb <= limit:
            # the memory bound, worked out only for configurations the order reaches: higher, the
            # configuration goes back in its place
            mem = self.memory_bound(c0)
            if mem > lb:
                heapq.heappush(self.heap, (self.order(mem, i), key, i, MEMORY, mem))
                return
        if prune and (lb > limit or self.rank_floor_ms(c0) > limit):
            # the rank floor only skips, not reorders: a configuration it skips would have given no
            # candidate (keep), and one visited later can be kept against a tighter limit (the
            # Pareto points are the best configurations', RESULTS 37)
            self.pruned += 1
            return
        fitted = False  # this configuration at its searched stage
        for c in [c0.with_zero(ZeroStage.PARAMETERS)] if phase == FSDP else self.variants(c0):
            if is_fsdp(c.sharding()) and phase != FSDP:
                # ZeRO 3 where nothing else fits (see variants); where its own bound (its collectives
                # too; the memory floor already counts its sharding) is higher, back in the order
                if fitted:
                    continue
                own = max(lb, config_lower_bound_ms(cm, c))
                if prune and own > lb:
                    heapq.heappush(self.heap, (self.order(own, i), key, i, FSDP, own))
                    continue
            sol = solve_config(self.chain_solver, self.table_of(c), c)
            if sol is None:
                continue
            fitted = True
            proposals = [Candidate(c, sol)]
            # the gate of a rebalancing: the candidate without its recomputation (no faster than M x
            # its busiest rank's compute, checked first: no simulation). A heuristic, not a bound: a
            # rebalancing re-solves the partition, which can then simulate faster than this one
            # unrecomputed (RESULTS 25, 33); always rebalancing took 2x the CPU
            unrec = float("inf")
            widened = self.budget.widened or self.lean  # no gate: rebalanced now, pruned or not
            rebalancing = rebalances(c, sol)
            if not widened and rebalancing and unrecomputed_floor_ms(cm, c, sol) < limit:
                unrec = unrecomputed(cm, proposals[0])
            if (widened and rebalancing) or (unrec < limit and not prune):
                proposals += rebalanced(cm, request, c, sol, self.cap_bytes, settings.rebalance_rounds,
                                        self.table_of(c))
            if self.chain_solver is solve_chain:
                proposals += alternatives(cm, c, self.cap_bytes, request.recompute, request.fixed_boundaries, settings)
            kept = self.keep(c, proposals, limit)
            if unrec < limit and prune and not widened:
                # rebalanced when the order reaches that time, if it still could win then: no rebalancing
                # of a configuration beaten meanwhile
                heapq.heappush(self.heap, (unrec, key, len(self.pending), REBALANCE, unrec))
                self.pending.append((c, sol, kept))
            limit = self.limit(c0, lb)

    def keep(self, c: Config, proposals: list[Candidate], limit: float, slot: int | None = None) -> int | None:
        """Simulate ``proposals`` of ``c`` and keep the fastest (the first of equals) as its
        candidate, in place of the one at ``slot`` of :attr:`out` when faster than it; the
        candidate's place in :attr:`out` (None: none kept). The memory and ME objectives also keep
        every proposal leaner than each faster one (a rebalancing or another partition can be
        slower and leaner: on a drawn case the ME objective's winner was such a one, RESULTS 36)."""
        scored = []
        for cand in proposals:
            # the busiest rank does M x its stage's work (its chunks', interleaved): no faster than that
            if self.prune and c.num_microbatches * self.busiest_ms(c, cand.solution) > limit * self.slack:
                continue
            scored.append((simulated(self.cm, cand), cand))
        if not scored:
            return slot
        t, cand = min(scored, key=lambda tc: tc[0])
        if self.lean:
            # the memory objectives: the fastest and every proposal leaner than each faster one (the
            # proposals' time x memory front, memory as the busiest rank's chunks' peaks summed;
            # rebalanced at once, so a kept candidate is never replaced)
            mems = [busiest_rank(c.layout, stage_needs(self.cm, c, tc[1].solution)) for tc in scored]
            fastest = next(j for j, tc in enumerate(scored) if tc[1] is cand)
            front, least = [fastest], mems[fastest]
            for j in sorted(range(len(scored)), key=lambda j: (scored[j][0], mems[j])):
                if mems[j] < least:
                    front.append(j)
                    least = mems[j]
            for j in front:
                self.out.append(scored[j])
                if self.me is not None:
                    self.me.note(scored[j][1], scored[j][0], scored[j][0] * mems[j])
            self.incumbent.note(t, c.num_groups == self.num_groups)
            return len(self.out) - 1
        if slot is None:
            self.out.append((t, cand))
            slot = len(self.out) - 1
        elif t < self.out[slot][0]:
            self.out[slot] = (t, cand)
        self.incumbent.note(t, c.num_groups == self.num_groups)
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
        proposals = rebalanced(self.cm, self.request, c, sol, self.cap_bytes, self.settings.rebalance_rounds,
                               self.table_of(c))
        self.keep(c, proposals, limit, slot)

    def busiest_ms(self, c: Config, solution: ChainSolution) -> float:
        """The most per-micro-batch work of one rank: its stage's (with ``tight``, the sum of
        its chunks' when it holds several)."""
        times = solution.stage_times_ms
        return busiest_rank(c.layout, times) if self.tight else max(times)

    def run(self) -> list[Scored]:
        """Visit every configuration left; the candidates found, fastest first."""
        while not self.done:
            self.step()
        return self.result()

    def result(self) -> list[Scored]:
        return sorted(self.out, key=score_key)


def solve_candidates(
    cm: CostModel,
    request: PlanRequest,
    num_groups: int,
    cap_bytes: float,
    chain_solver: ChainSolver = solve_chain,
    *,
    prune: bool = True,
    configs: list[Config] | None = None,
    settings: SearchSettings = SETTINGS,
    fsdp: bool = True,
    incumbent_ms: float = float("inf"),
    budget: Budget | None = None,
    me: MeIncumbent | None = None,
    shared: Incumbent | None = None,
    me_widen: float = 1.0,
) -> list[Scored]:
    """The J-optimum of each configuration by ``chain_solver``, with its simulated time.

    Configurations are visited by increasing lower bound; with ``prune``, one whose bound
    exceeds the best simulated time so far is skipped (it cannot win on time); configurations
    on all ``num_groups`` groups only against the best of those, so that the best plan on
    all of them is known when one on fewer wins. ``fsdp``: also solve the ZeRO 3 variants
    (:meth:`ConfigSearch.variants`); the time objective's extra points on the memory axis do
    without them. ``incumbent_ms``: with ``prune``, the best time of another search (another
    context-parallel degree), which every configuration is also pruned against. ``budget``:
    with ``prune``, what is kept beside the fastest (:class:`Budget`; with it the fill and
    memory bounds are used too). ``me``, ``shared``: with ``prune``, the ME objective's pruning
    state and the incumbent of times it goes with (:class:`MeIncumbent`), ``me_widen`` its widening.
    """
    return ConfigSearch(cm, request, num_groups, cap_bytes, chain_solver, prune=prune, configs=configs,
                        settings=settings, fsdp=fsdp, incumbent_ms=incumbent_ms, budget=budget, me=me,
                        shared=shared, me_widen=me_widen).run()


def stage_arrays(cm: CostModel, cand: Candidate) -> dict[str, list[float]]:
    """Per-stage times of a candidate, in the form the simulator's fast entry takes."""
    c, sol = cand.config, cand.solution
    stops = list(sol.boundaries[1:]) + [cm.num_layers]
    b, lay = c.microbatch_size, c.layout
    keys = ("fwd_ms", "bwd_ms", "recompute_ms", "send_fwd_ms", "send_bwd_ms", "allreduce_ms", "sync_early_ms",
            "gather_ahead_ms", "gather_bound_ms", "wgrad_ms", "optimizer_ms")
    out: dict[str, list[float]] = {k: [] for k in keys}
    for s, (start, stop) in enumerate(zip(sol.boundaries, stops)):
        fwd, bwd = cm.stage_times_ms(start, stop, b, s, lay)
        out["fwd_ms"].append(fwd)
        out["bwd_ms"].append(bwd + cm.zero2_exposed_ms(start, stop, s, lay, fwd, bwd))  # as the plan's stage has it
        out["recompute_ms"].append(cm.recompute_ms(sol.recompute[s], b, sol.selective_of(s)))
        out["send_fwd_ms"].append(cm.boundary_transfer_ms(stop, b, s, lay))
        out["send_bwd_ms"].append(cm.boundary_transfer_ms(start, b, s - 1, lay))
        sync = cm.stage_sync(start, stop, s, lay, sol.recompute[s], b, sol.selective_of(s))
        out["allreduce_ms"].append(sync.total_ms)
        out["sync_early_ms"].append(sync.early_ms)
        out["gather_ahead_ms"].append(sync.gather_ahead_ms)
        out["gather_bound_ms"].append(sync.gather_bound_ms)
        out["wgrad_ms"].append(cm.stage_wgrad_ms(start, stop, b) if c.schedule.splits_backward else 0.0)
        out["optimizer_ms"].append(cm.optimizer_step_ms(start, stop, c.sharding(s)))
    return out


def busiest_compute_ms(cm: CostModel, c: Config, solution: ChainSolution) -> float:
    """The most compute (forward + backward as the simulator takes them, no recomputation) per
    micro-batch of one rank of ``solution`` (its chunks' summed): every rank runs it M times, so
    no replay of the solution, with or without its recomputation, is faster than M times this."""
    return busiest_rank(c.layout, stage_compute_ms(cm, c, solution))


def stage_compute_ms(cm: CostModel, c: Config, solution: ChainSolution) -> list[float]:
    """Per stage of ``solution``, its forward + backward per micro-batch as the simulator takes
    them (no recomputation)."""
    stops = list(solution.boundaries[1:]) + [cm.num_layers]
    return [sum(cm.stage_times_ms(a, e, c.microbatch_size, s, c.layout))
            for s, (a, e) in enumerate(zip(solution.boundaries, stops))]


def unrecomputed_floor_ms(cm: CostModel, c: Config, solution: ChainSolution) -> float:
    """No replay of ``solution`` without its recomputation (:func:`unrecomputed`) is faster, on
    one chunk or several per rank in the loop placement: rank ``r`` runs its chunks' compute M
    times, after the forwards of chunks ``0 .. r - 1`` of the first micro-batch and before the
    backwards of chunks ``r - 1 .. 0`` of the last (:func:`chunk_fill_bound_ms`'s argument, on
    the solution's own chunks): at least ``M x`` :func:`busiest_compute_ms`, and on uniform
    chunks of ``t`` the interleaved schedule's ``(M v + P - 1) t``."""
    lay = c.layout
    work = stage_compute_ms(cm, c, solution)
    if lay.stage_replicas or lay.placement is not ChunkPlacement.LOOP or c.schedule.splits_backward:
        return c.num_microbatches * busiest_rank(lay, work)  # (a split backward's W can run after)
    before = np.concatenate([[0.0], np.cumsum(work)])  # the first r chunks' forward + backward
    P = lay.pipeline_size
    return max(float(before[r]) + c.num_microbatches * sum(work[s] for s in lay.stage_indices(r)) for r in range(P))


def busiest_rank(layout: Layout, per_stage: Sequence[float]) -> float:
    """The largest sum of ``per_stage`` over one device's stages: a pipeline rank's chunks (one
    stage each without interleaving), or one copy of a stage replicated per stage."""
    if layout.stage_replicas:
        return max(per_stage)
    return max(sum(per_stage[s] for s in layout.stage_indices(r)) for r in range(layout.pipeline_size))


def unrecomputed(cm: CostModel, cand: Candidate) -> float:
    """The candidate's simulated time were nothing recomputed (a memory rebalancing's best case
    on its partition)."""
    c = cand.config
    arrays = stage_arrays(cm, cand)
    arrays["recompute_ms"] = [0.0] * len(arrays["recompute_ms"])
    return simulate_iteration_ms(c.schedule, c.num_microbatches, **arrays,
                                 virtual_stages_per_rank=c.layout.virtual_stages_per_rank, replicas=c.layout.stage_replicas)


def simulated(cm: CostModel, cand: Candidate) -> float:
    """The candidate's iteration time by the simulator's fast entry."""
    c = cand.config
    return simulate_iteration_ms(c.schedule, c.num_microbatches, **stage_arrays(cm, cand),
                                 virtual_stages_per_rank=c.layout.virtual_stages_per_rank,
                                 replicas=c.layout.stage_replicas)


def stage_needs(cm: CostModel, c: Config, solution: ChainSolution) -> list[int]:
    """Per stage of ``solution`` under ``c``, one device's memory at its peak (with its
    recomputation, in-flight count and ZeRO sharding)."""
    ks = c.inflight()
    stops = list(solution.boundaries[1:]) + [cm.num_layers]
    return [cm.stage_memory(a, e, solution.recompute[s], c.microbatch_size, ks[s], c.sharding(s),
                            solution.selective_of(s)).total_bytes for s, (a, e) in enumerate(zip(solution.boundaries, stops))]


def fits(cm: CostModel, c: Config, solution: ChainSolution, cap: float) -> bool:
    """Every device of ``solution`` fits ``cap`` under ``c`` (a rank holding v chunks: their
    memory summed; a stage's copies: each)."""
    return busiest_rank(c.layout, stage_needs(cm, c, solution)) <= cap


def rebalances(c: Config, solution: ChainSolution) -> bool:
    """:func:`rebalanced` has something to re-solve: an interleaved configuration (not replicated
    per stage) whose solution recomputes something (else no chunk's share of memory binds)."""
    lay = c.layout
    return lay.virtual_stages_per_rank > 1 and not lay.stage_replicas and bool(any(solution.recompute) or solution.selective)


def rebalanced(
    cm: CostModel, request: PlanRequest, c: Config, solution: ChainSolution, cap: float, rounds: int,
    base: StageTable | None = None,
) -> list[Candidate]:
    """An interleaved configuration re-solved with its chunks' memory rebalanced. The chain DP
    checks one stage at a time, so it first gives each of a rank's v chunks cap / v; but
    interleaved 1F1B keeps more micro-batches in flight on a rank's first chunk than on its last
    (:func:`planner.schedule.inflight_counts`), so that split starves the first chunk (more
    recomputation, or no plan) while the last leaves memory unused. Each round splits every
    rank's ``cap`` over its chunks in proportion to what each stage of the last solution needs
    at the cheapest level that recomputes no layer fully (selective where a layer has an
    attention core, else none), and solves again, until the solution repeats or ``rounds`` are
    done. A rank's shares sum to ``cap``, so every solution fits; all are proposed to the
    simulator, which judges them with the first. ``base``: the configuration's own table (each
    chunk ``cap / v``); each round's table is a shallow copy of it with the chunks' shares, so
    that the stage times and recomputation choices worked out for one cap are shared by every
    round and configuration that meets it again (they are kept per cap)."""
    lay = c.layout
    if not rebalances(c, solution):
        return []  # nothing recomputed: no share binds
    line = cm.fsdp_line(lay) if is_fsdp(c.sharding()) else (0.0, 0.0)
    ks = c.inflight()
    out: list[Candidate] = []
    for _ in range(rounds):
        stops = list(solution.boundaries[1:]) + [cm.num_layers]
        lean = [cm.stage_memory(a, e, (), c.microbatch_size, ks[s], c.sharding(s),
                                [i for i in range(a, e) if cm.has_core[i]]).total_bytes
                for s, (a, e) in enumerate(zip(solution.boundaries, stops))]
        caps = [0.0] * len(lean)
        for r in range(lay.pipeline_size):
            chunks = lay.stage_indices(r)
            for s in chunks:  # rounded down to 1/256 of the cap: tables and knapsacks shared
                caps[s] = math.floor(256 * lean[s] / sum(lean[x] for x in chunks)) * cap / 256
        if base is not None:
            table = copy.copy(base)
            table.stage_caps = tuple(caps)
        else:
            table = StageTable(cm, c.microbatch_size, cap / len(chunks), request.fixed_boundaries,
                               allow_recompute=request.recompute, sharding=c.sharding(), fsdp_line=line,
                               stage_caps=caps)
        again = solve_config(solve_chain, table, c)
        if again is None or (again.boundaries, again.recompute, again.selective) == (
                solution.boundaries, solution.recompute, solution.selective):
            break
        out.append(Candidate(c, again))
        solution = again
    return out


def least_zero(cm: CostModel, request: PlanRequest, cand: Candidate, cap: float) -> Candidate:
    """``cand`` with the least ZeRO stage the request allows under which its partition and
    recomputation still fit ``cap`` and it simulates no slower (for the time objective: the
    memory objectives keep the deepest sharding, which is what they minimise)."""
    c = cand.config
    if not c.layout.zero or request.objective is not Objective.TIME:
        return cand
    base = simulated(cm, cand)
    for z in sorted(request.zero_stages):
        if z >= c.layout.zero:
            break
        lower = Candidate(c.with_zero(z), cand.solution)
        if fits(cm, lower.config, cand.solution, cap) and simulated(cm, lower) <= base * (1 + 1e-12):
            return lower
    return cand


def stage_recompute(
    cm: CostModel, start: int, stop: int, b: int, inflight: int, cap: float, c: Config, stage_idx: int
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The least-time recompute levels that fit stage ``stage_idx`` of ``c`` in ``cap``: (fully,
    selectively recomputed layers), or None if none do."""
    sharding = c.sharding(stage_idx)
    excess = cm.stage_memory(start, stop, (), b, inflight, sharding).total_bytes - cap
    fwd, _ = cm.layer_times(b)
    choice = choose_recompute(
        fwd_ms=fwd[start:stop].tolist(),
        saved_bytes=cm.saved_bytes(b)[start:stop].tolist(),
        input_bytes=(cm.input_per_sample[start:stop] * b).tolist(),
        first_layer=start,
        inflight=inflight,
        excess_bytes=float(excess),
        core_ms=cm.core_ms(b)[start:stop].tolist() if cm.selective else None,
        core_bytes=cm.core_bytes(b)[start:stop].tolist() if cm.selective else None,
        shared_bytes=cm.shared_out(start, stop, b).tolist() if cm.profile.shared_saved else None,
    )
    if choice.time_ms == float("inf") or cm.stage_memory(
        start, stop, choice.layers, b, inflight, sharding, choice.selective
    ).total_bytes > cap:
        return None
    return choice.layers, choice.selective


def alternatives(
    cm: CostModel, c: Config, cap: float, allow_recompute: bool = True, fixed: Sequence[int] = (),
    settings: SearchSettings = SETTINGS,
) -> list[Candidate]:
    """The baselines' partitions of one configuration (min-max by time, PipeDream's weight),
    with the least recompute that fits each stage: extra proposals for the simulator, which
    judges the all-reduce overlap more finely than the DP objective does. Stages start at the
    ``fixed`` boundaries (the min-max over the partitions that honour them)."""
    lay = c.layout
    if lay.virtual_stages_per_rank > 1 or lay.num_stages == 1 or lay.stage_replicas:
        return []
    out = []
    for kind in settings.alternative_partitions:
        weight = honouring(WEIGHTS[kind](cm, c.microbatch_size, lay.pipeline_size, lay.dp_degree), fixed)
        bounds = minmax_partition(weight, lay.pipeline_size)
        cand = None if bounds is None else fixed_split(cm, c, bounds, cap, allow_recompute)
        if cand is not None:
            out.append(cand)
    return out


def fixed_split(
    cm: CostModel, c: Config, bounds: Sequence[int], cap: float, allow_recompute: bool = True
) -> Candidate | None:
    """A given partition under configuration ``c``, each stage with the least recomputation
    that fits ``cap`` (None if a stage cannot fit, or would need recomputation that is not
    allowed)."""
    ks = c.inflight()
    b = c.microbatch_size
    stops = list(bounds[1:]) + [cm.num_layers]
    rc, sel = [], []
    for s, (a, z) in enumerate(zip(bounds, stops)):
        chosen = stage_recompute(cm, a, z, b, ks[s], cap, c, s)
        if chosen is None or ((chosen[0] or chosen[1]) and not allow_recompute):
            return None
        rc.append(chosen[0])
        sel.append(chosen[1])
    times = tuple(
        sum(cm.stage_times_ms(a, z, b, s, c.layout)) + cm.recompute_ms(rc[s], b, sel[s])
        for s, (a, z) in enumerate(zip(bounds, stops))
    )
    return Candidate(c, ChainSolution(0.0, tuple(bounds), tuple(rc), times, True, tuple(sel) if any(sel) else ()))
