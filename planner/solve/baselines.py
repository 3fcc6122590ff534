"""Baseline partitioners, each producing a Plan scored by the same simulator as ours.

Every baseline searches the same configurations as the DP (P x D = n for each divisor n of N, micro-batch size,
schedule) and differs only in how it cuts the layers:

- ``uniform``: equal layer counts per stage (DeepSpeed ``partition_method="uniform"``);
- ``parameters``: least maximum parameter count per stage (DeepSpeed ``"parameters"``);
- ``time-balanced``: least maximum forward + backward time per stage (torchgpipe's
  ``balance_by_time``; here solved exactly as a min-max contiguous partition);
- ``pipedream``: on a profile imported from a PipeDream ``graph.txt`` (and a request that
  leaves the layout free), the choice of PipeDream's own optimizer, stage boundaries and copies
  per stage, reimplemented on the graph's antichain DAG (:mod:`planner.solve.pipedream_baseline`
  says when it applies and how its inputs come from the cluster); otherwise PipeDream's
  objective (Narayanan et al. SOSP'19, sec. 3.1) on the chain: least slowest stage, where a
  stage's time is the larger of its compute and its boundary communication plus its share of
  the weight synchronisation ``4 (r - 1) |w| / (r B)``, no micro-batching term, no
  recomputation;
- ``data-parallel``: one stage, every device a replica.

No baseline chooses recomputation per layer: when a stage does not fit, it recomputes every
layer of the stage (activation checkpointing as DeepSpeed and GPipe apply it), or the
configuration is skipped (or, with recomputation off, only skipped). Every baseline keeps the
least ZeRO stage the request allows (none unless ``zero_stages`` excludes 0).

The request's layout constraints hold for every baseline: the configurations are those of the
forced stage count and data-parallel degree, and each partition is the baseline's min-max over
the partitions that start a stage at every fixed boundary (``uniform`` with boundaries at 2
and 3 of 6 layers on 3 stages is 0-1 | 2 | 3-5); a request none can meet is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.artifacts.cluster import Cluster
from planner.artifacts.errors import InfeasibleError, PlannerInputError
from planner.artifacts.kinds import SolverKind, ZeroStage
from planner.artifacts.layout import ONE_DEVICE, Sharding
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.cost.groups import base_cluster
from planner.cost.tensor_parallel import device_cost_model
from planner.schedule import Held, held_counts
from planner.solve import pipedream_baseline
from planner.solve.build import build_best
from planner.solve.candidates import Candidate, Scored, simulated
from planner.solve.chain import ChainSolution
from planner.solve.held import held_memory
from planner.solve.layout_search import refuse_unmeetable
from planner.solve.partitions import partition_by
from planner.solve.problem import Problem, memory_cap_bytes
from planner.solve.search import num_devices_of
from planner.solve.select import select
from planner.solve.settings import SETTINGS
from planner.solve.space import (
    DP_SCHEDULES,
    Config,
    configurations,
    layout_of,
    microbatch_sizes,
    schedule_valid,
)


def _recompute_if_needed(
    cm: CostModel, bounds: Sequence[int], b: int, held: Sequence[Held], cap: float, allow: bool,
    sharding: Sharding | Sequence[Sharding],
) -> list[tuple[int, ...]] | None:
    """Per stage no recomputation, or all of its layers, whichever fits first (``sharding``: one
    for every stage, or each stage's own), each stage at the heaviest of its held states
    (:func:`planner.schedule.held_counts`, as the plan prices it)."""
    stops = list(bounds[1:]) + [cm.num_layers]
    out: list[tuple[int, ...]] = []
    for s, (start, stop) in enumerate(zip(bounds, stops)):
        sh = sharding if isinstance(sharding, Sharding) else sharding[s]
        if held_memory(cm, start, stop, (), b, held[s], sh).total_bytes <= cap:
            out.append(())
            continue
        everything = tuple(range(start, stop))
        if allow and held_memory(cm, start, stop, everything, b, held[s], sh).total_bytes <= cap:
            out.append(everything)
        else:
            return None
    return out


def baseline_plan(profile: Profile, cluster: Cluster, request: PlanRequest, *, kind: SolverKind) -> Plan:
    """The best plan (by simulation) that baseline ``kind`` finds over all configurations."""
    name = kind.value
    num_devices = num_devices_of(cluster, request)
    schedules = [s for s in request.schedules if s in DP_SCHEDULES]
    if not schedules:
        raise PlannerInputError(f"baseline {name!r} plans the gpipe and 1f1b schedules only "
                                f"(asked: {', '.join(s.value for s in request.schedules)})")
    if kind is SolverKind.DATA_PARALLEL:
        if request.num_stages > 1 or request.fixed_boundaries:
            raise InfeasibleError(f"baseline 'data-parallel' plans one stage: it cannot honour "
                                  f"{'--stages ' + str(request.num_stages) if request.num_stages > 1 else '--fixed-boundaries'}")
    refuse_unmeetable(profile.num_layers, num_devices, request, interleaved=False)
    # the cost model ours prices with (planner.solve.search): one device's view of the profile under the
    # stack (its attention kernel, a forced recompute level) on the devices used, so that a baseline's
    # layout, which is in the search's space, prices as the search prices it
    cm = device_cost_model(profile, base_cluster(cluster, num_devices), request.optimizer, ONE_DEVICE, request.stack)
    cap = memory_cap_bytes(cluster, request)
    pairs = list(configurations(cm.num_layers, num_devices, request))
    if kind is SolverKind.DATA_PARALLEL:
        pairs = [(P, D) for P, D in pairs if P == 1]
    fixed = request.fixed_boundaries
    zero = min(request.zero_stages)  # the least sharding the request allows (0 unless it is excluded)
    cands: list[Candidate] = []
    split = pipedream_baseline.choose(profile, cluster, request, cm, num_devices) if kind is SolverKind.PIPEDREAM else None
    if split is not None:
        pairs = []  # the optimizer's own choice replaces the configurations' min-max partitions
        cands = _split_candidates(cm, split, request, zero, cap)
    for P, D in pairs:
        per_replica = request.global_batch // D
        layout = layout_of(cm, P, D, 1, zero)
        for b in microbatch_sizes(request, per_replica):
            M = per_replica // b
            bounds = (0,) if P == 1 else partition_by(kind, cm, b, P, D, fixed)
            if bounds is None or not set(fixed) <= set(bounds):
                continue
            for schedule in schedules:
                if not schedule_valid(schedule, P, M):
                    continue
                held = held_counts(schedule, layout, M)
                sharding = Sharding(zero, D) if zero else Sharding()
                rc = _recompute_if_needed(cm, bounds, b, held, cap, request.recompute, sharding)
                if rc is None:
                    continue
                config = Config(layout, b, M, schedule)
                cands.append(Candidate(config, _solution(cm, config, bounds, rc)))
    if not cands:
        raise InfeasibleError(f"baseline {name!r}: no configuration fits in {cap / 1024**3:.2f} GiB per device")
    scored = scored_by_simulation(cm, cands)
    top = scored[: SETTINGS.rescore_top]
    on_all = [tc for tc in scored if tc[1].config.num_groups == num_devices]
    if on_all and not any(tc is on_all[0] for tc in top):
        top.append(on_all[0])  # the best on all the devices, which the plan table names
    problem = Problem.of(profile, cluster, request, kind, num_devices)
    return select(build_best(problem, cm, top, len(top)), request)


def _split_candidates(
    cm: CostModel, split: pipedream_baseline.Split, request: PlanRequest, zero: ZeroStage, cap: float
) -> list[Candidate]:
    """PipeDream's optimizer's split under each configuration it suits (InfeasibleError, saying
    why, when none is left)."""
    cands = []
    for config in pipedream_baseline.configs_of(split, cm, request, zero):
        shardings = [config.layout.sharding(s) for s in range(config.layout.num_stages)]
        rc = _recompute_if_needed(cm, split.starts, config.microbatch_size,
                                  held_counts(config.schedule, config.layout, config.num_microbatches), cap,
                                  request.recompute, shardings)
        if rc is not None:
            cands.append(Candidate(config, _solution(cm, config, split.starts, rc)))
    if not cands:
        raise InfeasibleError(pipedream_baseline.refusal(split, cm, request, cap))
    return cands


def scored_by_simulation(cm: CostModel, cands: list[Candidate]) -> list[Scored]:
    scored = [(simulated(cm, c), c) for c in cands]
    scored.sort(key=lambda tc: (tc[0], tc[1].config.pipeline_size, -tc[1].config.microbatch_size, tc[1].config.schedule.value))
    return scored


def _solution(cm: CostModel, config: Config, bounds: Sequence[int], recompute: Sequence[tuple[int, ...]]) -> ChainSolution:
    """The chain objective J of a fixed partition (see :mod:`planner.solve.chain_dp`)."""
    b, M = config.microbatch_size, config.num_microbatches
    stops = list(bounds[1:]) + [cm.num_layers]
    times = [
        sum(cm.stage_times_ms(a, z, b, s, config.layout)) + cm.recompute_ms(recompute[s], b, (), config.layout, s)
        for s, (a, z) in enumerate(zip(bounds, stops))
    ]
    comm = sum(2 * cm.boundary_transfer_ms(z, b, s, config.layout) for s, z in enumerate(stops))
    return ChainSolution(sum(times) + comm + (M - 1) * max(times), tuple(bounds), tuple(recompute), tuple(times), True,
                         ((),) * len(bounds))
