"""Baseline partitioners, each producing a Plan scored by the same simulator as ours.

Every baseline searches the same configurations as the DP (P x D = N, micro-batch size,
schedule) and differs only in how it cuts the layers:

- ``uniform``: equal layer counts per stage (DeepSpeed ``partition_method="uniform"``);
- ``parameters``: least maximum parameter count per stage (DeepSpeed ``"parameters"``);
- ``time-balanced``: least maximum forward + backward time per stage (torchgpipe's
  ``balance_by_time``; here solved exactly as a min-max contiguous partition);
- ``pipedream``: PipeDream's objective (Narayanan et al. SOSP'19, sec. 3.1): least slowest
  stage, where a stage's time is the larger of its compute and its boundary communication
  plus its share of the weight synchronisation ``4 (r - 1) |w| / (r B)``, no micro-batching
  term, no recomputation;
- ``data-parallel``: one stage, every device a replica.

No baseline chooses recomputation per layer: when a stage does not fit, it recomputes every
layer of the stage (activation checkpointing as DeepSpeed and GPipe apply it), or the
configuration is skipped.
"""

from __future__ import annotations

from planner.artifacts.cluster import Cluster
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.errors import InfeasibleError
from planner.solve.build import memory_cap_bytes
from planner.solve.chain_dp import ChainSolution, inflight_counts
from planner.solve.partitions import WEIGHTS, minmax_partition
from planner.solve.search import (
    DP_SCHEDULES,
    RESCORE_TOP,
    Candidate,
    Config,
    build_best,
    configurations,
    microbatch_sizes,
    num_devices_of,
    schedule_valid,
    select,
    stage_arrays,
)

def _recompute_if_needed(cm: CostModel, bounds, b: int, ks, cap: float) -> list[tuple[int, ...]] | None:
    stops = list(bounds[1:]) + [cm.num_layers]
    out = []
    for s, (start, stop) in enumerate(zip(bounds, stops)):
        if cm.stage_memory(start, stop, (), b, ks[s]).total_bytes <= cap:
            out.append(())
            continue
        everything = tuple(range(start, stop))
        if cm.stage_memory(start, stop, everything, b, ks[s]).total_bytes <= cap:
            out.append(everything)
        else:
            return None
    return out


def baseline_plan(profile: Profile, cluster: Cluster, request: PlanRequest, *, name: str) -> Plan:
    """The best plan (by simulation) that baseline ``name`` finds over all configurations."""
    num_devices = num_devices_of(cluster, request)
    cm = CostModel(profile, cluster, request.optimizer)
    cap = memory_cap_bytes(cluster, request)
    schedules = [s for s in request.schedules if s in DP_SCHEDULES]
    pairs = list(configurations(cm.num_layers, num_devices, request))
    if name == "data-parallel":
        pairs = [(P, D) for P, D in pairs if P == 1]
    cands: list[Candidate] = []
    for P, D in pairs:
        per_replica = request.global_batch // D
        for b in microbatch_sizes(request, per_replica):
            M = per_replica // b
            bounds = (0,) if P == 1 else minmax_partition(WEIGHTS[name](cm, b, P, D), P)
            if bounds is None:
                continue
            for schedule in schedules:
                if not schedule_valid(schedule, P, M):
                    continue
                ks = inflight_counts(schedule, P, M)
                rc = _recompute_if_needed(cm, bounds, b, ks, cap)
                if rc is None:
                    continue
                cands.append(Candidate(Config(P, D, b, M, schedule), _solution(cm, bounds, rc, b, M, D)))
    if not cands:
        raise InfeasibleError(f"baseline {name!r}: no configuration fits in {cap / 1024**3:.2f} GiB per device")
    return select(build_best(cm, request, scored_by_simulation(cm, cands), name, RESCORE_TOP), request)


def scored_by_simulation(cm: CostModel, cands: list[Candidate]) -> list[tuple[float, Candidate]]:
    from planner.simulator import simulate_iteration_ms

    scored = [
        (simulate_iteration_ms(c.config.schedule, c.config.num_microbatches, **stage_arrays(cm, c)), c) for c in cands
    ]
    scored.sort(key=lambda tc: (tc[0], tc[1].config.num_stages, -tc[1].config.microbatch_size, tc[1].config.schedule.value))
    return scored


def _solution(cm: CostModel, bounds, recompute, b: int, M: int, D: int) -> ChainSolution:
    """The chain objective J of a fixed partition (see :mod:`planner.solve.chain_dp`)."""
    stops = list(bounds[1:]) + [cm.num_layers]
    times = [
        cm.stage_fwd_ms(a, z, b) + cm.stage_bwd_ms(a, z, b) + cm.recompute_ms(recompute[s], b)
        for s, (a, z) in enumerate(zip(bounds, stops))
    ]
    comm = sum(2 * cm.boundary_transfer_ms(z, b, s, D) for s, z in enumerate(stops))
    return ChainSolution(sum(times) + comm + (M - 1) * max(times), tuple(bounds), tuple(recompute), tuple(times), True)
