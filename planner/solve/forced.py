"""Plans with recomputation forced on every transformer block (``--recompute full|selective``).

The request's level is folded into the model the search prices (:mod:`planner.cost.recompute_view`)
and the search runs with recomputation otherwise off, so that its layouts, partitions and
micro-batches are chosen for that level; the chosen plan is priced again on the model itself
with the level's layers as each stage's recomputed layers (what the runtime reads). That adds
the working set of the layer being recomputed, which the folded model does not hold: where the
plan then exceeds the cap, the search runs again on a cap lowered by the excess (at most
:data:`ROUNDS` times), and refuses naming the excess if it still does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from planner.artifacts.cluster import Cluster
from planner.artifacts.errors import InfeasibleError
from planner.artifacts.kinds import RecomputeMode
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile
from planner.artifacts.request import PlanRequest
from planner.cost.recompute_view import forced_layers, with_forced
from planner.solve.build import rebuild_plan
from planner.solve.problem import memory_cap_bytes

__all__ = ["ROUNDS", "plan_forced"]

ROUNDS = 3
GIB = 1024**3


def _as_forced(plan: Plan, profile: Profile, cluster: Cluster, request: PlanRequest, layers: tuple[int, ...]) -> Plan:
    """``plan`` (searched on the folded model) priced on ``profile`` with ``layers`` recomputed at the
    request's level."""
    full = request.recompute_mode is RecomputeMode.FULL
    chosen = [[i for i in layers if s.layer_start <= i < s.layer_stop] for s in plan.stages]
    none: list[list[int]] = [[] for _ in plan.stages]
    rebuilt = rebuild_plan(profile, cluster, request, layout=plan.layout, boundaries=[s.layer_start for s in plan.stages],
                           recompute=chosen if full else none, selective=none if full else chosen,
                           microbatch_size=plan.microbatch_size, schedule=plan.schedule, solver=plan.provenance.solver)
    predicted = dataclasses.replace(rebuilt.predicted, all_devices_ms=plan.predicted.all_devices_ms)
    return dataclasses.replace(rebuilt, predicted=predicted, pareto=plan.pareto, devices_available=plan.devices_available)


def plan_forced(profile: Profile, cluster: Cluster, request: PlanRequest,
                search: Callable[[Profile, Cluster, PlanRequest], Plan]) -> Plan:
    """The best plan with the request's recompute level on every block (module docstring)."""
    layers = forced_layers(profile, request.recompute_mode)
    folded = with_forced(profile, request.recompute_mode)
    cap = memory_cap_bytes(cluster, request)
    trial = cap
    for _ in range(ROUNDS):
        searched = search(folded, cluster, dataclasses.replace(request, recompute=False,
                                                               recompute_mode=RecomputeMode.NONE, memory_cap_bytes=trial))
        out = _as_forced(searched, profile, cluster, request, layers)
        over = out.predicted.peak_memory_bytes - cap
        if over <= 0:
            return out
        trial -= over
    raise InfeasibleError(
        f"no plan with --recompute {request.recompute_mode.value} fits: the best found needs "
        f"{out.predicted.peak_memory_bytes / GIB:.2f} GiB per device with its recomputed layer's working set, "
        f"over the cap of {cap / GIB:.2f} GiB by {over / GIB:.2f} GiB",
        suggestions=("more devices", "--recompute auto (the solver's choice per layer)", "a smaller micro-batch size"))
