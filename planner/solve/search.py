"""The default solver: an exact DP per configuration, configurations enumerated, the best few
re-scored by the event simulator.

Configurations: P x D = n for every divisor n of the N devices available (P <= layers),
micro-batch size b dividing the per-replica batch (hence M = G / (D b)), schedule. For each,
:func:`planner.solve.chain_dp.solve_chain` finds the exact optimum of the pipeline objective J
with per-stage recomputation. Across
configurations the objective alone is not comparable (it leaves out the data-parallel
all-reduce and the schedule's exact overlap), so every configuration's optimum is replayed by
the simulator and the fastest by simulation wins (ties: fewer stages, larger micro-batch,
schedule name). The (iteration time, peak memory) points seen on the way form the Pareto front.

A layout on fewer than N devices (ranks 0 .. n - 1) wins only by simulated time (on equal time
the one on more devices); configurations on all N are pruned only against the best of those, so the best
plan on all N is known and the plan records it (``predicted.all_devices_ms``). Device counts
are restricted to divisors of N (not every n <= N) to keep the search time: every count took
3x the solver time on GPT-3 175B over 1,024 devices, divisors about the same as N alone.
Per-stage replication uses up to N devices (the last ones may stay idle).

The request's layout constraints hold for every candidate, not only the DP's: ``num_stages``
and ``dp_degree`` fix P and D (a forced D excludes per-stage replication), ``fixed_boundaries``
start a stage (a model chunk, interleaved) at each of those layers in the DP's table, in the
baseline partitions proposed beside it and in PipeDream's split; a request no plan can meet is
refused before the search (:func:`refuse_unmeetable`) or by the infeasibility explanation.

Two more dimensions:

- ZeRO: every configuration with D > 1 is solved at the deepest stage the request allows
  (sharding frees memory and moves no more bytes, so that optimum is never slower), unless
  memory binds nowhere; the plan then keeps the least stage under which its partition still
  fits at the same time (:func:`least_zero`).
- per-stage replication (time objective, at most :data:`REPLICATED_MAX_DEVICES` devices): the
  exact DP over (layer, devices used) of :mod:`planner.solve.replicated` at the micro-batch
  sizes of the best uniform plans, plus PipeDream's own split; non-uniform layouts are
  simulated beside the uniform plans and win only by simulated time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

from planner.artifacts.cluster import Cluster
from planner.artifacts.plan import ParetoPoint, Plan
from planner.artifacts.profile import Profile
from planner.artifacts.request import Objective, PlanRequest, ScheduleKind
from planner.cost import CostModel, replicated_ranks
from planner.artifacts.errors import InfeasibleError, PlannerInputError
from planner.solve.build import build_plan, memory_cap_bytes
from planner.graph import coarse_starts, merge_layers
from planner.solve.chain_dp import ChainSolution, StageTable, inflight_counts, solve_chain
from planner.solve.partitions import WEIGHTS, honouring, minmax_partition, pipedream_split
from planner.solve.replicated import replica_counts

#: schedules the DP prices (interleaving changes the in-flight pattern; see the solver issue)
DP_SCHEDULES = (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B)
#: virtual stages per rank tried for interleaved 1F1B
INTERLEAVE_FACTORS = (2, 4)


#: tighter memory caps (fractions of the cap) searched for the Pareto front
MEMORY_CAP_FRACTIONS = (0.75, 0.5)
#: candidates replayed in full (Plan + Timeline) after the fast simulation
RESCORE_TOP = 4
#: configurations re-solved under tighter memory caps for the Pareto front (time objective)
PARETO_CONFIGS = 3
#: baseline partitions also proposed for every configuration the DP solves
ALTERNATIVE_PARTITIONS = ("time-balanced", "pipedream")
#: longest chain searched exactly over every configuration; longer profiles are grouped
CHAIN_MAX = 64
#: longest profile the infeasibility explanation searches layer by layer (else over groups)
EXPLAIN_MAX_LAYERS = 256
#: layers on each side of a coarse boundary that the refinement plans one by one
REFINE_RADIUS = 4
#: micro-batch sizes (of the best uniform plans) for which per-stage replication is searched
REPLICATED_SIZES = 2
#: most devices per-stage replication is searched for: its DP is over (layer, devices used),
#: O(L^2 x N x copy counts) per cap; on 1,024 devices that took ~80 s (GPT-3 175B), while the
#: clusters PipeDream's optimizer was built for (and evaluated on) have at most a few dozen
REPLICATED_MAX_DEVICES = 64


@dataclass(frozen=True, slots=True)
class Config:
    num_stages: int
    dp_degree: int
    microbatch_size: int
    num_microbatches: int
    schedule: ScheduleKind
    virtual_stages: int = 1  # stages per pipeline rank (interleaved schedules)
    zero: int = 0  # ZeRO stage over each stage's ranks (0 when they are one)
    replicas: tuple[int, ...] = ()  # per-stage copies (replicated per stage; dp_degree 1, M global)

    @property
    def total_stages(self) -> int:
        return self.num_stages * self.virtual_stages

    @property
    def num_devices(self) -> int:
        """Devices the layout occupies: P x D, or the sum of the stages' copies."""
        return sum(self.replicas) if self.replicas else self.num_stages * self.dp_degree

    @property
    def shard(self) -> int:
        """Ranks each stage's ZeRO-sharded state is divided over (uniform layouts)."""
        return self.dp_degree if self.zero else 1

    def stage_shard(self, stage_idx: int) -> int:
        """Ranks stage ``stage_idx``'s ZeRO-sharded state is divided over."""
        if not self.zero:
            return 1
        return self.replicas[stage_idx] if self.replicas else self.dp_degree

    def inflight(self) -> tuple[int, ...]:
        """Micro-batches one device of each stage holds at its peak."""
        return inflight_counts(self.schedule, self.total_stages, self.num_microbatches, self.virtual_stages, self.replicas)

    def layout(self) -> tuple[tuple[int, ...], ...] | None:
        """Every stage's ranks when replicated per stage (None: the uniform placement)."""
        return replicated_ranks(self.replicas) if self.replicas else None


@dataclass(frozen=True, slots=True)
class Candidate:
    config: Config
    solution: ChainSolution


def schedule_valid(schedule: ScheduleKind, num_stages: int, num_microbatches: int) -> bool:
    """The schedule's own rules (as torch.distributed.pipelining enforces them)."""
    if schedule is ScheduleKind.ONE_F_ONE_B:
        return num_microbatches >= num_stages
    return True


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def num_devices_of(cluster: Cluster, request: PlanRequest) -> int:
    n = request.num_devices or cluster.num_devices
    if n > cluster.num_devices:
        raise PlannerInputError(
            f"--devices {n} is more than cluster {cluster.name!r} has ({cluster.num_devices})"
        )
    return n


def microbatch_sizes(request: PlanRequest, per_replica_batch: int) -> list[int]:
    sizes = request.microbatch_sizes or tuple(divisors(per_replica_batch))
    return sorted(b for b in set(sizes) if per_replica_batch % b == 0)


def device_counts(num_devices: int) -> list[int]:
    """The device counts a uniform layout may occupy, most first: the divisors of
    ``num_devices`` (a plan on fewer devices wins only by being faster; see the module
    docstring)."""
    return divisors(num_devices)[::-1]


def configurations(num_layers: int, num_devices: int, request: PlanRequest) -> Iterator[tuple[int, int]]:
    """(P, D) pairs with P x D <= N (every pair once), honouring the request's stage count,
    data-parallel degree and stage limit, in search order (all N devices first)."""
    for n in device_counts(num_devices):
        for P in divisors(n):
            D = n // P
            if P > num_layers or (request.max_stages and P > request.max_stages):
                continue
            if (request.num_stages and P != request.num_stages) or (request.dp_degree and D != request.dp_degree):
                continue
            if request.global_batch % D:
                continue
            yield P, D


ChainSolver = Callable[..., "ChainSolution | None"]


def searched_zero(request: PlanRequest, dp_degree: int) -> int:
    """The ZeRO stage a configuration is solved at: the deepest the request allows when there
    are replicas to shard over. Sharding only frees memory and moves no more bytes (see
    planner.cost), so its optimum is never slower; :func:`least_zero` then keeps the least
    sharding under which the chosen plan still fits. With one rank per stage sharding changes
    nothing; the plan records the least stage asked for."""
    return max(request.zero_stages) if dp_degree > 1 else min(request.zero_stages)


def all_configs(cm: CostModel, request: PlanRequest, num_devices: int, interleaved: bool = True) -> list[Config]:
    schedules = [s for s in request.schedules if s in DP_SCHEDULES]
    out = []
    for P, D in configurations(cm.num_layers, num_devices, request):
        z = searched_zero(request, D)
        for b in microbatch_sizes(request, request.global_batch // D):
            M = request.global_batch // (D * b)
            out.extend(Config(P, D, b, M, sch, zero=z) for sch in schedules if schedule_valid(sch, P, M))
            if interleaved and ScheduleKind.INTERLEAVED_1F1B in request.schedules and P > 1:
                out.extend(
                    Config(P, D, b, M, ScheduleKind.INTERLEAVED_1F1B, v, zero=z)
                    for v in INTERLEAVE_FACTORS
                    if P * v <= cm.num_layers and interleaving_valid(P, M, v)
                )
    return out


def interleaving_valid(num_ranks: int, num_microbatches: int, v: int) -> bool:
    from planner.schedule.build import check_schedule_rules

    try:
        check_schedule_rules(ScheduleKind.INTERLEAVED_1F1B, num_ranks * v, num_microbatches, v)
    except PlannerInputError:
        return False
    return num_microbatches >= num_ranks


def _solve_config(chain_solver: ChainSolver, table: StageTable, c: Config) -> ChainSolution | None:
    kw = dict(num_stages=c.total_stages, dp_degree=c.dp_degree, num_microbatches=c.num_microbatches, schedule=c.schedule)
    if c.virtual_stages > 1:
        kw["virtual_stages_per_rank"] = c.virtual_stages
    return chain_solver(table, **kw)


def config_lower_bound_ms(cm: CostModel, c: Config) -> float:
    """No plan of this configuration simulates faster: every replica does M micro-batches of
    at least the profile's forward + backward work, spread over P devices at best, and one
    micro-batch crosses all of it in sequence (planner.simulate.bounds' average-work bound)."""
    fp, bp = cm.time_prefix(c.microbatch_size)
    work = float(fp[-1] + bp[-1])
    return max(c.num_microbatches * work / c.num_stages, work)


def _sort_key(c: Config) -> tuple:
    return (c.num_stages, -c.microbatch_size, c.schedule.value, c.virtual_stages, c.zero, c.replicas)


def solve_candidates(
    cm: CostModel,
    request: PlanRequest,
    num_devices: int,
    cap_bytes: float,
    chain_solver: ChainSolver = solve_chain,
    *,
    prune: bool = True,
    configs: list[Config] | None = None,
) -> list[tuple[float, Candidate]]:
    """The J-optimum of each configuration by ``chain_solver``, with its simulated time.

    Configurations are visited by increasing lower bound; with ``prune``, one whose bound
    exceeds the best simulated time so far is skipped (it cannot win on time); configurations
    on all ``num_devices`` devices only against the best of those, so that the best plan on
    all of them is known when one on fewer wins.
    """
    interleaved_ok = chain_solver is solve_chain  # the oracles price one stage per rank only
    configs = configs if configs is not None else all_configs(cm, request, num_devices, interleaved_ok)
    ordered = sorted(configs, key=lambda c: (config_lower_bound_ms(cm, c),) + _sort_key(c))
    tables: dict[tuple[int, int, int, int], StageTable] = {}
    best = best_all = float("inf")
    out: list[tuple[float, Candidate]] = []

    def table_of(c: Config) -> StageTable:
        key = (c.microbatch_size, c.virtual_stages, c.shard, c.zero)
        if key not in tables:
            # a rank holding v chunks gives each cap / v (the sum of their peaks fits)
            tables[key] = StageTable(
                cm, c.microbatch_size, cap_bytes / c.virtual_stages, request.fixed_boundaries,
                allow_recompute=request.recompute, shard=c.shard, zero=c.zero,
            )
        return tables[key]

    for c in ordered:
        limit = best_all if c.num_devices == num_devices else best
        if prune and config_lower_bound_ms(cm, c) > limit:
            continue
        if c.zero and 0 in request.zero_stages and table_of(dataclasses.replace(c, zero=0)).fits_everywhere(max(c.inflight())):
            c = dataclasses.replace(c, zero=0)  # memory binds nowhere: sharding cannot help
        sol = _solve_config(chain_solver, table_of(c), c)
        if sol is None:
            continue
        proposals = [Candidate(c, sol)]
        if chain_solver is solve_chain:
            proposals += alternatives(cm, c, cap_bytes, request.recompute, request.fixed_boundaries)
        scored = []
        for cand in proposals:
            # the busiest rank does M x its stage's work: no faster than that
            if prune and c.num_microbatches * max(cand.solution.stage_times_ms) > limit:
                continue
            scored.append((_simulated(cm, cand), cand))
        if not scored:
            continue
        t, cand = min(scored, key=lambda tc: tc[0])
        out.append((t, cand))
        best = min(best, t)
        if c.num_devices == num_devices:
            best_all = min(best_all, t)
    out.sort(key=lambda tc: (tc[0],) + _sort_key(tc[1].config))
    return out


def stage_arrays(cm: CostModel, cand: Candidate) -> dict[str, list[float]]:
    """Per-stage times of a candidate, in the form the simulator's fast entry takes."""
    c, sol = cand.config, cand.solution
    stops = list(sol.boundaries[1:]) + [cm.num_layers]
    b, D = c.microbatch_size, c.dp_degree
    pr = c.num_stages if c.virtual_stages > 1 else 0
    layout = c.layout()
    out: dict[str, list[float]] = {k: [] for k in ("fwd_ms", "bwd_ms", "recompute_ms", "send_fwd_ms", "send_bwd_ms", "allreduce_ms")}
    for s, (start, stop) in enumerate(zip(sol.boundaries, stops)):
        out["fwd_ms"].append(cm.stage_fwd_ms(start, stop, b))
        out["bwd_ms"].append(cm.stage_bwd_ms(start, stop, b))
        out["recompute_ms"].append(cm.recompute_ms(sol.recompute[s], b))
        out["send_fwd_ms"].append(cm.boundary_transfer_ms(stop, b, s, D, pr, ranks=layout))
        out["send_bwd_ms"].append(cm.boundary_transfer_ms(start, b, s - 1, D, pr, ranks=layout))
        out["allreduce_ms"].append(
            cm.stage_allreduce_ms(start, stop, s, D, pr, zero=c.zero, ranks=layout[s] if layout else None)
        )
    return out


def _plan_of(cm: CostModel, request: PlanRequest, cand: Candidate, solver: str) -> Plan:
    """The Plan of a candidate, recording the devices the search had (see :func:`note_devices`)."""
    c = cand.config
    built = build_plan(
        cm,
        request,
        boundaries=cand.solution.boundaries,
        recompute=cand.solution.recompute,
        dp_degree=c.dp_degree,
        microbatch_size=c.microbatch_size,
        schedule=c.schedule,
        solver=solver,
        virtual_stages_per_rank=c.virtual_stages,
        zero=c.zero,
        replicas=c.replicas,
    )
    return dataclasses.replace(built, devices_available=request.num_devices or cm.cluster.num_devices)


def _tie_key(plan: Plan) -> tuple:
    # on equal time the plan on more devices (all of them, as asked) wins
    return (plan.predicted.iteration_ms, -plan.num_devices, plan.num_stages, -plan.microbatch_size, plan.schedule.value)


def pareto_front(plans: list[Plan]) -> tuple[ParetoPoint, ...]:
    """Non-dominated (iteration time, peak memory) points, fastest first."""
    pts = sorted(plans, key=lambda p: (p.predicted.iteration_ms, p.predicted.peak_memory_bytes))
    front, best_mem = [], None
    for p in pts:
        if best_mem is None or p.predicted.peak_memory_bytes < best_mem:
            best_mem = p.predicted.peak_memory_bytes
            front.append(
                ParetoPoint(
                    iteration_ms=p.predicted.iteration_ms,
                    peak_memory_bytes=p.predicted.peak_memory_bytes,
                    num_stages=p.num_stages,
                    dp_degree=p.dp_degree,
                    microbatch_size=p.microbatch_size,
                    schedule=p.schedule,
                    num_recomputed_layers=sum(len(s.recompute) for s in p.stages),
                    zero=p.zero,
                    stage_replicas=p.stage_replicas if p.replicated_per_stage else (),
                )
            )
    return tuple(front)


def merge_pareto(points: Iterable[ParetoPoint]) -> tuple[ParetoPoint, ...]:
    """The non-dominated points among several fronts (e.g. one per tensor-parallel degree)."""
    front, best_mem = [], None
    for p in sorted(points, key=lambda p: (p.iteration_ms, p.peak_memory_bytes, p.tp_degree)):
        if best_mem is None or p.peak_memory_bytes < best_mem:
            best_mem = p.peak_memory_bytes
            front.append(p)
    return tuple(front)


def fits(cm: CostModel, c: Config, solution: ChainSolution, cap: float) -> bool:
    """Every stage of ``solution``, with its recomputation, fits ``cap`` under ``c`` (schedule,
    in-flight counts, ZeRO sharding; a rank holding v chunks gives each cap / v)."""
    ks = c.inflight()
    stops = list(solution.boundaries[1:]) + [cm.num_layers]
    return all(
        cm.stage_memory(a, e, solution.recompute[s], c.microbatch_size, ks[s], c.stage_shard(s), c.zero).total_bytes
        <= cap / c.virtual_stages
        for s, (a, e) in enumerate(zip(solution.boundaries, stops))
    )


def least_zero(cm: CostModel, request: PlanRequest, cand: Candidate, cap: float) -> Candidate:
    """``cand`` with the least ZeRO stage the request allows under which its partition and
    recomputation still fit ``cap`` and it simulates no slower (for the time objective: the
    memory objectives keep the deepest sharding, which is what they minimise)."""
    c = cand.config
    if not c.zero or request.objective is not Objective.TIME:
        return cand
    base = _simulated(cm, cand)
    for z in sorted(request.zero_stages):
        if z >= c.zero:
            break
        lower = Candidate(dataclasses.replace(c, zero=z), cand.solution)
        if fits(cm, lower.config, cand.solution, cap) and _simulated(cm, lower) <= base * (1 + 1e-12):
            return lower
    return cand


def build_best(
    cm: CostModel, request: PlanRequest, scored: list[tuple[float, Candidate]], solver: str, keep: int
) -> list[Plan]:
    """Full Plans (Timeline-based predictions) for the ``keep`` fastest candidates."""
    cap = memory_cap_bytes(cm.cluster, request)
    return [_plan_of(cm, request, least_zero(cm, request, cand, cap), solver) for _, cand in scored[:keep]]


def _simulated(cm: CostModel, cand: Candidate) -> float:
    from planner.simulate import simulate_iteration_ms

    c = cand.config
    return simulate_iteration_ms(c.schedule, c.num_microbatches, **stage_arrays(cm, cand),
                                 virtual_stages_per_rank=c.virtual_stages, replicas=c.replicas)


def stage_recompute(
    cm: CostModel, start: int, stop: int, b: int, inflight: int, cap: float, shard: int = 1, zero: int = 0
) -> tuple[int, ...] | None:
    """The least-time recompute set that fits one stage in ``cap`` (None if none does)."""
    from planner.solve.recompute import choose_recompute

    excess = cm.stage_memory(start, stop, (), b, inflight, shard, zero).total_bytes - cap
    fwd, _ = cm.layer_times(b)
    choice = choose_recompute(
        fwd_ms=fwd[start:stop].tolist(),
        saved_bytes=(cm.saved_per_sample[start:stop] * b).tolist(),
        input_bytes=(cm.input_per_sample[start:stop] * b).tolist(),
        first_layer=start,
        inflight=inflight,
        excess_bytes=float(excess),
    )
    if choice.time_ms == float("inf") or cm.stage_memory(start, stop, choice.layers, b, inflight, shard, zero).total_bytes > cap:
        return None
    return choice.layers


def to_layers(cm: CostModel, cand: Candidate, starts: list[int], cap: float) -> Candidate:
    """A candidate over merged groups as one over the original layers: boundaries at the
    groups' first layers, and per stage the least-time recompute set over its own layers
    (or the groups' recompute sets mapped to their layers, if that is cheaper)."""
    L = cm.num_layers
    stops_of = starts[1:] + [L]
    bounds = tuple(starts[g] for g in cand.solution.boundaries)
    ends = list(bounds[1:]) + [L]
    c = cand.config
    ks = c.inflight()
    cap = cap / c.virtual_stages
    b = c.microbatch_size
    recompute = []
    for s, (a, z) in enumerate(zip(bounds, ends)):
        mapped = tuple(l for g in cand.solution.recompute[s] for l in range(starts[g], stops_of[g]))
        chosen = stage_recompute(cm, a, z, b, ks[s], cap, c.stage_shard(s), c.zero)
        recompute.append(chosen if chosen is not None and cm.recompute_ms(chosen, b) <= cm.recompute_ms(mapped, b) else mapped)
    sol = ChainSolution(cand.solution.objective_ms, bounds, tuple(recompute), cand.solution.stage_times_ms, False)
    return Candidate(c, sol)


def alternatives(
    cm: CostModel, c: Config, cap: float, allow_recompute: bool = True, fixed: Sequence[int] = ()
) -> list[Candidate]:
    """The baselines' partitions of one configuration (min-max by time, PipeDream's weight),
    with the least recompute that fits each stage: extra proposals for the simulator, which
    judges the all-reduce overlap more finely than the DP objective does. Stages start at the
    ``fixed`` boundaries (the min-max over the partitions that honour them)."""
    if c.virtual_stages > 1 or c.num_stages == 1 or c.replicas:
        return []
    out = []
    for name in ALTERNATIVE_PARTITIONS:
        weight = honouring(WEIGHTS[name](cm, c.microbatch_size, c.num_stages, c.dp_degree), fixed)
        bounds = minmax_partition(weight, c.num_stages)
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
    rc = []
    for s, (a, z) in enumerate(zip(bounds, stops)):
        chosen = stage_recompute(cm, a, z, b, ks[s], cap, c.stage_shard(s), c.zero)
        if chosen is None or (chosen and not allow_recompute):
            return None
        rc.append(chosen)
    times = tuple(
        cm.stage_fwd_ms(a, z, b) + cm.stage_bwd_ms(a, z, b) + cm.recompute_ms(rc[s], b)
        for s, (a, z) in enumerate(zip(bounds, stops))
    )
    return Candidate(c, ChainSolution(0.0, tuple(bounds), tuple(rc), times, True))


def refine(
    cm: CostModel, starts: list[int], request: PlanRequest, cand: Candidate, cap: float, chain_solver: ChainSolver
) -> Candidate:
    """Re-solve one configuration over a finer chain: single layers within
    :data:`REFINE_RADIUS` of each boundary the coarse solution chose, groups elsewhere."""
    L = cm.num_layers
    coarse = to_layers(cm, cand, starts, cap)
    finer = set(starts)
    for c in coarse.solution.boundaries[1:]:
        finer.update(range(max(1, c - REFINE_RADIUS), min(L - 1, c + REFINE_RADIUS) + 1))
    finer_starts = sorted(finer)
    merged = CostModel(merge_layers(cm.profile, finer_starts), cm.cluster, cm.optimizer)
    fixed = tuple(finer_starts.index(f) for f in request.fixed_boundaries)
    table = StageTable(merged, cand.config.microbatch_size, cap / cand.config.virtual_stages, fixed,
                       allow_recompute=request.recompute, shard=cand.config.shard, zero=cand.config.zero)
    c = cand.config
    if c.replicas:
        again = solve_replicated_config(merged, request, c.microbatch_size, c.schedule, c.zero, sum(c.replicas), cap, fixed,
                                        _simulated(cm, coarse))
        if again is None:
            return coarse
        fine = to_layers(cm, again, finer_starts, cap)
        return min((coarse, fine), key=lambda x: _simulated(cm, x))
    sol = _solve_config(chain_solver, table, c)
    if sol is None:
        return coarse
    fine = to_layers(cm, Candidate(c, sol), finer_starts, cap)
    return min((coarse, fine), key=lambda x: _simulated(cm, x))


def solve_replicated_config(
    cm: CostModel, request: PlanRequest, b: int, schedule: ScheduleKind, zero: int, num_devices: int, cap: float,
    fixed: tuple[int, ...], limit_ms: float = float("inf"), spare: bool = False,
) -> Candidate | None:
    """The best pipeline replicated per stage for one micro-batch size, schedule and ZeRO stage
    (:mod:`planner.solve.replicated`; on up to ``num_devices`` devices with ``spare``), as a
    Candidate (None if nothing fits)."""
    from planner.solve.replicated import solve_replicated

    m = request.global_batch // b

    def table(shard: int, z: int) -> StageTable:
        return StageTable(cm, b, cap, fixed, allow_recompute=request.recompute, shard=shard, zero=z)

    plain = table(1, 0) if not zero or 0 in request.zero_stages else None
    if zero and plain is not None and plain.fits_everywhere(m):
        zero = 0  # memory binds nowhere: sharding cannot help
    # without sharding a stage's copies all price as one table
    tables = {d: plain if not zero and plain is not None else table(d, zero) for d in replica_counts(num_devices, m)}
    found = solve_replicated(tables, num_devices=num_devices, num_microbatches=m, schedule=schedule, limit_ms=limit_ms,
                             spare=spare)
    if found is None:
        return None
    config = Config(len(found.replicas), 1, b, m, schedule, zero=zero, replicas=found.replicas)
    return Candidate(config, found.solution)


def replicated_candidates(
    cm: CostModel, request: PlanRequest, num_devices: int, cap: float, uniform: list[tuple[float, Candidate]]
) -> list[tuple[float, Candidate]]:
    """Pipelines whose stages have their own copy counts (PipeDream's optimizer), with their
    simulated times; only layouts that are not uniform (those are the P x D configurations
    already searched), on at most :data:`REPLICATED_MAX_DEVICES` devices. Searched for the
    micro-batch sizes of the :data:`REPLICATED_SIZES`
    best uniform plans (every size when none fits), each exactly over partitions and copy
    counts; sizes whose average-work bound cannot beat the best plan so far are skipped."""
    schedules = [s for s in request.schedules if s in DP_SCHEDULES]
    if not request.per_stage_replication or not 2 <= num_devices <= REPLICATED_MAX_DEVICES:
        return []
    if request.dp_degree or not schedules:  # a forced D means replicated pipelines only
        return []
    best_ms = uniform[0][0] if uniform else float("inf")
    sizes = list(dict.fromkeys(cand.config.microbatch_size for _, cand in uniform))[:REPLICATED_SIZES]
    zero = searched_zero(request, num_devices)
    out: list[tuple[float, Candidate]] = []
    for b in sizes or microbatch_sizes(request, request.global_batch):
        m = request.global_batch // b
        fp, bp = cm.time_prefix(b)
        work = float(fp[-1] + bp[-1])
        if m < 2 or max(m * work / num_devices, work) > best_ms:
            continue
        split = pipedream_split(cm, b, num_devices, replica_counts(num_devices, m))
        # J is the same for both schedules and 1F1B holds fewer micro-batches, so its optimum is
        # never worse: solved once (under 1F1B when allowed), the partition is proposed under
        # every allowed schedule it fits
        first = ScheduleKind.ONE_F_ONE_B if ScheduleKind.ONE_F_ONE_B in schedules else schedules[0]
        solved = solve_replicated_config(cm, request, b, first, zero, num_devices, cap,
                                         request.fixed_boundaries, best_ms, spare=True)
        for schedule in schedules:
            proposals = [] if solved is None else [
                c for c in [same_split(cm, solved, schedule, cap)] if c is not None
            ]
            proposals += pipedream_proposal(cm, request, b, schedule, zero, cap, split)
            for prop in proposals:
                reps = prop.config.replicas
                if len(set(reps)) == 1:
                    continue
                if request.max_stages and prop.config.num_stages > request.max_stages:
                    continue
                if request.num_stages and prop.config.num_stages != request.num_stages:
                    continue
                # the busiest copy does (M / R) x its stage's work: no faster than that
                if max(m // d * t for d, t in zip(reps, prop.solution.stage_times_ms)) > best_ms:
                    continue
                t = _simulated(cm, prop)
                out.append((t, prop))
                best_ms = min(best_ms, t)
    return out


def same_split(cm: CostModel, cand: Candidate, schedule: ScheduleKind, cap: float) -> Candidate | None:
    """``cand``'s partition and copies under ``schedule``, if its stages (recomputing as
    before) still fit; None otherwise."""
    if schedule is cand.config.schedule:
        return cand
    other = Candidate(dataclasses.replace(cand.config, schedule=schedule), cand.solution)
    return other if fits(cm, other.config, cand.solution, cap) else None


def pipedream_proposal(
    cm: CostModel, request: PlanRequest, b: int, schedule: ScheduleKind, zero: int, cap: float,
    split: tuple[tuple[int, ...], tuple[int, ...]] | None,
) -> list[Candidate]:
    """PipeDream's own replicated ``split`` (:func:`planner.solve.partitions.pipedream_split`,
    copy counts dividing M) with the least recomputation that fits each stage: one more
    proposal for the simulator, as :func:`alternatives` does for the uniform layouts."""
    if split is None or not all(f in split[0] for f in request.fixed_boundaries):
        return []
    bounds, reps = split
    config = Config(len(reps), 1, b, request.global_batch // b, schedule, zero=zero, replicas=reps)
    cand = fixed_split(cm, config, bounds, cap, request.recompute)
    return [cand] if cand is not None else []


def search_plan(
    profile: Profile, cluster: Cluster, request: PlanRequest, *, solver: str, chain_solver: ChainSolver
) -> Plan:
    """Solve every configuration with ``chain_solver``, re-score by simulation, select.

    Profiles with more than :data:`CHAIN_MAX` layers (or twice the deepest pipeline searched)
    are searched over at most that many groups of consecutive layers (cut where the fewest bytes cross), then the best
    configurations are re-solved with single layers around their chosen boundaries.
    """
    num_devices = num_devices_of(cluster, request)
    if chain_solver is not solve_chain and not any(s in DP_SCHEDULES for s in request.schedules):
        raise PlannerInputError(f"solver {solver!r} plans the gpipe and 1f1b schedules only "
                                f"(asked: {', '.join(s.value for s in request.schedules)})")
    refuse_unmeetable(profile.num_layers, num_devices, request, interleaved=chain_solver is solve_chain)
    cm = CostModel(profile, cluster, request.optimizer)
    cap = memory_cap_bytes(cluster, request)
    by_time = request.objective is Objective.TIME
    starts: list[int] | None = None
    cm_search, req_search = cm, request
    # enough groups that the deepest pipeline searched still has two groups per stage
    max_stages = max((P for P, _ in configurations(profile.num_layers, num_devices, request)), default=1)
    chain_max = max(CHAIN_MAX, 2 * max_stages)
    if profile.num_layers > chain_max:
        starts = coarse_starts(profile, chain_max, request.fixed_boundaries)
        cm_search = CostModel(merge_layers(profile, starts), cluster, request.optimizer)
        req_search = dataclasses.replace(request, fixed_boundaries=tuple(starts.index(f) for f in request.fixed_boundaries))

    def fine(scored: list[tuple[float, Candidate]], keep: int, refined: bool) -> list[tuple[float, Candidate]]:
        top = scored[:keep]
        on_all = [tc for tc in scored if tc[1].config.num_devices == num_devices]
        if by_time and refined and on_all and not any(tc is on_all[0] for tc in top):
            top.append(on_all[0])  # the best on all the devices, which the plan table names
        if starts is None:
            return top
        out = []
        for _, cand in top:
            mapped = refine(cm, starts, request, cand, cap, chain_solver) if refined else to_layers(cm, cand, starts, cap)
            out.append((_simulated(cm, mapped), mapped))
        out.sort(key=lambda tc: (tc[0],) + _sort_key(tc[1].config))
        return out

    scored = solve_candidates(cm_search, req_search, num_devices, cap, chain_solver, prune=by_time)
    if chain_solver is solve_chain and by_time:
        scored += replicated_candidates(cm_search, req_search, num_devices, cap, scored)
        scored.sort(key=lambda tc: (tc[0],) + _sort_key(tc[1].config))
    if not scored:
        from planner.solve.infeasible import explain_infeasible

        # explained over the layers themselves unless the profile is very long
        if profile.num_layers <= EXPLAIN_MAX_LAYERS:
            raise explain_infeasible(cm, request, num_devices, cap)
        raise explain_infeasible(cm_search, req_search, num_devices, cap)
    keep = RESCORE_TOP if by_time else len(scored)
    plans = build_best(cm, request, fine(scored, keep, True), solver, keep + 1)
    # more points on the memory axis (the Pareto front, and the memory / ME objectives): the
    # same search under tighter caps; for the time objective only over the best configurations
    configs = [cand.config for _, cand in scored if not cand.config.replicas][:PARETO_CONFIGS] if by_time else None
    for frac in MEMORY_CAP_FRACTIONS:
        tighter = solve_candidates(cm_search, req_search, num_devices, cap * frac, chain_solver, prune=False, configs=configs)
        k = 2 if by_time else len(tighter)
        plans += build_best(cm, request, fine(tighter, k, False), solver, k)
    front = pareto_front(plans)
    best = select(plans, request)
    return dataclasses.replace(best, pareto=front)


def refuse_unmeetable(num_layers: int, num_devices: int, request: PlanRequest, *, interleaved: bool = True) -> None:
    """Refuse, before searching, a request whose layout constraints (fixed boundaries, stage
    count, data-parallel degree) no plan on ``num_layers`` layers and ``num_devices`` devices can
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
    if P * max(D, 1) > num_devices or D > num_devices:
        asked = " x ".join(f"{flag} {v}" for flag, v in (("--stages", P), ("--dp-degree", D)) if v)
        raise InfeasibleError(f"{asked} needs {max(P, 1) * max(D, 1)} devices; {num_devices} are available")
    if not fixed:
        return
    limits = [(num_layers, f"the profile's {num_layers} layers")]
    ranks = [(num_devices // max(D, 1), f"{num_devices} devices" + (f" at --dp-degree {D}" if D else ""))]
    if P:
        ranks.append((P, f"--stages {P}"))
    if request.max_stages:
        ranks.append((request.max_stages, f"--max-stages {request.max_stages}"))
    r, why = min(ranks)
    # interleaving gives a rank several stages, on pipelines of more than one rank
    v = max(INTERLEAVE_FACTORS) if interleaved and ScheduleKind.INTERLEAVED_1F1B in request.schedules and r > 1 else 1
    limits.append((r * v, why + (f" (x {v} interleaved stages per rank)" if v > 1 else "")))
    most, why = min(limits)
    if len(fixed) + 1 > most:
        raise InfeasibleError(
            f"--fixed-boundaries {','.join(map(str, fixed))} need at least {len(fixed) + 1} stages, "
            f"but at most {most} are possible ({why})",
            suggestions=("fewer fixed boundaries", "more stages (--stages, --max-stages) or more devices"),
        )


def dp_plan(profile: Profile, cluster: Cluster, request: PlanRequest) -> Plan:
    """Plan with the exact DP (see module docstring)."""
    return search_plan(profile, cluster, request, solver="dp", chain_solver=solve_chain)


def select(plans: list[Plan], request: PlanRequest) -> Plan:
    """The plan the request's objective prefers among ``plans``, noting the best plan on all
    the devices when it uses fewer (:func:`note_devices`)."""
    return note_devices(_select(plans, request), plans)


def note_devices(best: Plan, plans: list[Plan]) -> Plan:
    """``best`` with ``predicted.all_devices_ms``: when it occupies fewer devices than were
    available, the fastest of ``plans`` on all of them (or the best such that any of them
    noted); 0 otherwise."""
    n = best.devices_available
    found = 0.0
    if n and best.num_devices < n:
        times = [p.predicted.iteration_ms for p in plans if p.num_devices == n]
        times += [p.predicted.all_devices_ms for p in plans if p.predicted.all_devices_ms > 0]
        found = min(times, default=0.0)
    if found == best.predicted.all_devices_ms:
        return best
    return dataclasses.replace(best, predicted=dataclasses.replace(best.predicted, all_devices_ms=found))


def _select(plans: list[Plan], request: PlanRequest) -> Plan:
    fastest = min(plans, key=_tie_key)
    if request.objective is Objective.TIME:
        return fastest
    if request.objective is Objective.MEMORY:
        budget = request.time_budget_ms or fastest.predicted.iteration_ms * 1.10
        within = [p for p in plans if p.predicted.iteration_ms <= budget] or [fastest]
        return min(within, key=lambda p: (p.predicted.peak_memory_bytes,) + _tie_key(p))
    # ME index against the fastest GPipe plan without recomputation (the seed's baseline)
    refs = [p for p in plans if p.schedule is ScheduleKind.GPIPE and not any(s.recompute for s in p.stages)]
    ref = min(refs, key=_tie_key) if refs else fastest

    def me(p: Plan) -> float:
        return (ref.predicted.iteration_ms / p.predicted.iteration_ms) / (
            p.predicted.peak_memory_bytes / ref.predicted.peak_memory_bytes
        )

    best = max(plans, key=lambda p: (me(p), -p.predicted.iteration_ms))
    pred = dataclasses.replace(best.predicted, me_index=me(best), me_reference="fastest gpipe plan without recompute")
    return dataclasses.replace(best, predicted=pred)
