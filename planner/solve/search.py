"""The default solver: an exact DP per configuration, configurations enumerated, the best few
re-scored by the event simulator.

Configurations: P x D = N (P <= layers), micro-batch size b dividing the per-replica batch
(hence M = G / (D b)), schedule. For each, :func:`planner.solve.chain_dp.solve_chain` finds the
exact optimum of the pipeline objective J with per-stage recomputation. Across
configurations the objective alone is not comparable (it leaves out the data-parallel
all-reduce and the schedule's exact overlap), so every configuration's optimum is replayed by
the simulator and the fastest by simulation wins (ties: fewer stages, larger micro-batch,
schedule name). The (iteration time, peak memory) points seen on the way form the Pareto front.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterator

from planner.artifacts.cluster import Cluster
from planner.artifacts.plan import ParetoPoint, Plan
from planner.artifacts.profile import Profile
from planner.artifacts.request import Objective, PlanRequest, ScheduleKind
from planner.cost import CostModel
from planner.errors import InfeasibleError, PlannerInputError
from planner.solve.build import build_plan, memory_cap_bytes
from planner.solve.chain_dp import ChainSolution, StageTable, solve_chain

#: schedules the DP prices (interleaving changes the in-flight pattern; see the solver issue)
DP_SCHEDULES = (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B)


#: tighter memory caps (fractions of the cap) searched for the Pareto front
MEMORY_CAP_FRACTIONS = (0.75, 0.5)
#: candidates replayed in full (Plan + Timeline) after the fast simulation
RESCORE_TOP = 4
#: configurations re-solved under tighter memory caps for the Pareto front (time objective)
PARETO_CONFIGS = 3


@dataclass(frozen=True, slots=True)
class Config:
    num_stages: int
    dp_degree: int
    microbatch_size: int
    num_microbatches: int
    schedule: ScheduleKind


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


def configurations(num_layers: int, num_devices: int, request: PlanRequest) -> Iterator[tuple[int, int]]:
    """(P, D) pairs in search order."""
    for P in divisors(num_devices):
        if P > num_layers or (request.max_stages and P > request.max_stages):
            continue
        D = num_devices // P
        if request.global_batch % D:
            continue
        yield P, D


ChainSolver = Callable[..., "ChainSolution | None"]


def all_configs(cm: CostModel, request: PlanRequest, num_devices: int) -> list[Config]:
    schedules = [s for s in request.schedules if s in DP_SCHEDULES]
    out = []
    for P, D in configurations(cm.num_layers, num_devices, request):
        for b in microbatch_sizes(request, request.global_batch // D):
            M = request.global_batch // (D * b)
            out.extend(Config(P, D, b, M, sch) for sch in schedules if schedule_valid(sch, P, M))
    return out


def config_lower_bound_ms(cm: CostModel, c: Config) -> float:
    """No plan of this configuration simulates faster: every replica does M micro-batches of
    at least the profile's forward + backward work, spread over P devices at best, and one
    micro-batch crosses all of it in sequence (planner.bounds' average-work bound)."""
    fp, bp = cm.time_prefix(c.microbatch_size)
    work = float(fp[-1] + bp[-1])
    return max(c.num_microbatches * work / c.num_stages, work)


def _sort_key(c: Config) -> tuple:
    return (c.num_stages, -c.microbatch_size, c.schedule.value)


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
    exceeds the best simulated time so far is skipped (it cannot win on time).
    """
    from planner.simulator import simulate_iteration_ms

    configs = configs if configs is not None else all_configs(cm, request, num_devices)
    ordered = sorted(configs, key=lambda c: (config_lower_bound_ms(cm, c),) + _sort_key(c))
    tables: dict[int, StageTable] = {}
    best = float("inf")
    out: list[tuple[float, Candidate]] = []
    for c in ordered:
        if prune and config_lower_bound_ms(cm, c) > best:
            continue
        if c.microbatch_size not in tables:
            tables[c.microbatch_size] = StageTable(
                cm, c.microbatch_size, cap_bytes, request.fixed_boundaries, allow_recompute=request.recompute
            )
        sol = chain_solver(
            tables[c.microbatch_size], num_stages=c.num_stages, dp_degree=c.dp_degree,
            num_microbatches=c.num_microbatches, schedule=c.schedule,
        )
        if sol is None:
            continue
        cand = Candidate(c, sol)
        t = simulate_iteration_ms(c.schedule, c.num_microbatches, **stage_arrays(cm, cand))
        out.append((t, cand))
        best = min(best, t)
    out.sort(key=lambda tc: (tc[0],) + _sort_key(tc[1].config))
    return out


def stage_arrays(cm: CostModel, cand: Candidate) -> dict[str, list[float]]:
    """Per-stage times of a candidate, in the form the simulator's fast entry takes."""
    c, sol = cand.config, cand.solution
    stops = list(sol.boundaries[1:]) + [cm.num_layers]
    b, D = c.microbatch_size, c.dp_degree
    out: dict[str, list[float]] = {k: [] for k in ("fwd_ms", "bwd_ms", "recompute_ms", "send_fwd_ms", "send_bwd_ms", "allreduce_ms")}
    for s, (start, stop) in enumerate(zip(sol.boundaries, stops)):
        out["fwd_ms"].append(cm.stage_fwd_ms(start, stop, b))
        out["bwd_ms"].append(cm.stage_bwd_ms(start, stop, b))
        out["recompute_ms"].append(cm.recompute_ms(sol.recompute[s], b))
        out["send_fwd_ms"].append(cm.boundary_transfer_ms(stop, b, s, D))
        out["send_bwd_ms"].append(cm.boundary_transfer_ms(start, b, s - 1, D))
        out["allreduce_ms"].append(cm.stage_allreduce_ms(start, stop, s, D))
    return out


def _plan_of(cm: CostModel, request: PlanRequest, cand: Candidate, solver: str) -> Plan:
    c = cand.config
    return build_plan(
        cm,
        request,
        boundaries=cand.solution.boundaries,
        recompute=cand.solution.recompute,
        dp_degree=c.dp_degree,
        microbatch_size=c.microbatch_size,
        schedule=c.schedule,
        solver=solver,
    )


def _tie_key(plan: Plan) -> tuple:
    return (plan.predicted.iteration_ms, plan.num_stages, -plan.microbatch_size, plan.schedule.value)


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
                )
            )
    return tuple(front)


def build_best(
    cm: CostModel, request: PlanRequest, scored: list[tuple[float, Candidate]], solver: str, keep: int
) -> list[Plan]:
    """Full Plans (Timeline-based predictions) for the ``keep`` fastest candidates."""
    return [_plan_of(cm, request, cand, solver) for _, cand in scored[:keep]]


def search_plan(
    profile: Profile, cluster: Cluster, request: PlanRequest, *, solver: str, chain_solver: ChainSolver
) -> Plan:
    """Solve every configuration with ``chain_solver``, re-score by simulation, select."""
    num_devices = num_devices_of(cluster, request)
    cm = CostModel(profile, cluster, request.optimizer)
    cap = memory_cap_bytes(cluster, request)
    by_time = request.objective is Objective.TIME
    scored = solve_candidates(cm, request, num_devices, cap, chain_solver, prune=by_time)
    if not scored:
        from planner.solve.infeasible import explain_infeasible

        raise explain_infeasible(cm, request, num_devices, cap)
    plans = build_best(cm, request, scored, solver, RESCORE_TOP if by_time else len(scored))
    # more points on the memory axis (the Pareto front, and the memory / ME objectives): the
    # same search under tighter caps; for the time objective only over the best configurations
    configs = [cand.config for _, cand in scored[:PARETO_CONFIGS]] if by_time else None
    for frac in MEMORY_CAP_FRACTIONS:
        tighter = solve_candidates(cm, request, num_devices, cap * frac, chain_solver, prune=False, configs=configs)
        plans += build_best(cm, request, tighter, solver, 2 if by_time else len(tighter))
    front = pareto_front(plans)
    best = select(plans, request)
    return dataclasses.replace(best, pareto=front)


def dp_plan(profile: Profile, cluster: Cluster, request: PlanRequest) -> Plan:
    """Plan with the exact DP (see module docstring)."""
    return search_plan(profile, cluster, request, solver="dp", chain_solver=solve_chain)


def select(plans: list[Plan], request: PlanRequest) -> Plan:
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
