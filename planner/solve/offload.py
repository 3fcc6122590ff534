"""Offloading as a plan choice (``--offload``; pricing: :mod:`planner.cost.offload`).

A request's mode other than ``none`` is searched on the profile carrying it
(:func:`planner.cost.offload.with_offload`), so that the search's layouts, partitions, micro-batches
and recomputation are chosen for it: under ``optimizer`` every device keeps only its 16-bit weights
and gradients; under ``activations`` every layer that saves anything is offloaded while the search
runs. Then, per stage, from the stage with the fewest micro-batches in flight (the last) to the
first, the stage keeps its activations instead where the plan still fits the cap and is no slower
(the time and ME objectives: a stage whose copies are hidden and whose memory allows gains nothing
from offloading; the memory objective keeps every stage offloaded) -- so that each stage ends with
one of keeping, recomputing (the search's recomputation) and offloading. ``auto`` plans each of
none, optimizer, activations and both and chooses among them by the request's objective (time: the
fastest, on equal times the first of that order; memory: the least peak within the objective's
budget of the fastest; me: the highest index), their Pareto fronts merged.

Host memory: each stage records what one of its devices keeps on the host
(``PlanStage.host_memory_bytes``: the optimizer state and master weights of its parameters, and
the offloaded saves of its micro-batches in flight). Where a node needs more than its host has
(:func:`planner.artifacts.host.host_memory_bytes`, devices per node x the largest stage's), the
search runs again on fewer offloaded layers (:func:`spread` evenly over the model, their share
cut by the excess), at most :data:`ROUNDS` times, then the mode is refused naming the bytes. The
search itself does not see the host's memory: a greedy rerun, not an optimum under that bound.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from planner.artifacts.cluster import Cluster
from planner.artifacts.errors import InfeasibleError
from planner.artifacts.host import OffloadMode, host_memory_bytes
from planner.artifacts.kinds import Objective
from planner.artifacts.plan import Plan, PlanStage
from planner.artifacts.plan_summary import ParetoPoint
from planner.artifacts.profile import Profile
from planner.artifacts.request import PlanRequest
from planner.cost.groups import base_cluster
from planner.cost.offload import offloadable_layers, offloaded_layers, optimizer_offloaded, with_offload
from planner.cost.tensor_parallel import device_cost_model
from planner.solve.account import with_accounts
from planner.solve.build import rebuild_plan
from planner.solve.objectives import Budget
from planner.solve.problem import Problem, memory_cap_bytes

__all__ = ["MODES", "plan_offload"]

GIB = 1024**3
#: searches of one mode at most (host memory: :func:`_plan_mode`)
ROUNDS = 4
#: the modes ``auto`` plans, in the order that breaks ties
MODES = (OffloadMode.NONE, OffloadMode.OPTIMIZER, OffloadMode.ACTIVATIONS, OffloadMode.BOTH)

PlanOne = Callable[[Profile, PlanRequest], Plan]


def plan_offload(profile: Profile, cluster: Cluster, request: PlanRequest, plan_one: PlanOne) -> Plan:
    """The best plan under the request's offload mode (module docstring); ``plan_one`` plans a
    profile without offloading choices of its own (the search, recomputation settled, accounts)."""
    modes = MODES if request.offload is OffloadMode.AUTO else (request.offload,)
    plans: list[Plan] = []
    refusal: InfeasibleError | None = None
    for mode in modes:
        try:
            plans.append(_plan_mode(profile, cluster, request, mode, plan_one))
        except InfeasibleError as err:
            refusal = refusal or err
    if not plans:
        assert refusal is not None
        raise refusal
    chosen = choose(plans, request)
    if len(plans) > 1:
        chosen = dataclasses.replace(chosen, pareto=_merged_front(plans))
    return chosen


def choose(plans: list[Plan], request: PlanRequest) -> Plan:
    """The plan the request's objective prefers (module docstring); ``plans`` in :data:`MODES` order."""
    if request.objective is Objective.ME:
        return max(plans, key=lambda p: p.predicted.me_index)
    fastest = min(plans, key=lambda p: p.predicted.iteration_ms)
    if request.objective is Objective.TIME:
        return fastest
    best_ms = min(min([p.predicted.iteration_ms] + [q.iteration_ms for q in p.pareto]) for p in plans)
    within = [p for p in plans if p.predicted.iteration_ms <= Budget.of_request(request).of(best_ms) * (1 + 1e-12)]
    return min(within, key=lambda p: p.predicted.peak_memory_bytes) if within else fastest


def _plan_mode(profile: Profile, cluster: Cluster, request: PlanRequest, mode: OffloadMode, plan_one: PlanOne) -> Plan:
    """The plan under one mode; with activations offloaded, the search runs again on fewer
    offloaded layers (spread evenly, :func:`spread`) while a node's host does not hold the plan's
    (at most :data:`ROUNDS` times), the share cut by the excess."""
    if mode is OffloadMode.NONE:
        return _marked_front(plan_one(profile, request), mode)
    every = offloadable_layers(profile) if mode.activations else ()
    share = 1.0
    for _ in range(ROUNDS):
        marked = with_offload(profile, optimizer=mode.optimizer, layers=spread(every, share))
        plan = plan_one(marked, request)
        if every and request.objective is not Objective.MEMORY:
            plan, marked = _keep_where_room(plan, marked, cluster, request)
        plan = _with_host(plan, marked, cluster, request, mode)
        need = cluster.devices_per_node * max(st.host_memory_bytes for st in plan.stages)
        have = host_memory_bytes(cluster)
        if need <= have:
            return _marked_front(plan, mode)
        offloaded = sum(len(st.offload_layers) for st in plan.stages)
        if not offloaded:
            break
        share = min(share, offloaded / len(every)) * have / need * 0.95
    raise InfeasibleError(f"offload {mode.value}: a node's {cluster.devices_per_node} devices keep up to "
                          f"{need / GIB:.1f} GiB on the host, more than its {have / GIB:.1f} GiB "
                          f"(cluster {cluster.name!r}: host_memory_bytes)")


def spread(layers: tuple[int, ...], share: float) -> tuple[int, ...]:
    """About ``share`` of ``layers``, spread evenly (the i-th taken where ``floor((i + 1) share)``
    steps up)."""
    if share >= 1.0:
        return layers
    return tuple(x for i, x in enumerate(layers) if int((i + 1) * share) > int(i * share))


def _rebuilt(plan: Plan, profile: Profile, cluster: Cluster, request: PlanRequest) -> Plan:
    """``plan``'s layout, partition and recomputation priced on ``profile``."""
    out = rebuild_plan(profile, cluster, request, layout=plan.layout, boundaries=[s.layer_start for s in plan.stages],
                       recompute=[s.recompute for s in plan.stages],
                       selective=[s.recompute_selective for s in plan.stages], microbatch_size=plan.microbatch_size,
                       schedule=plan.schedule, solver=plan.provenance.solver)
    return dataclasses.replace(out, pareto=plan.pareto, devices_available=plan.devices_available,
                               predicted=dataclasses.replace(out.predicted, all_devices_ms=plan.predicted.all_devices_ms))


def _keep_where_room(plan: Plan, marked: Profile, cluster: Cluster, request: PlanRequest) -> tuple[Plan, Profile]:
    """Each stage, last first, keeping its activations where the plan still fits and is no slower;
    the plan and the profile marking what stays offloaded."""
    cap = memory_cap_bytes(cluster, request)
    optimizer = optimizer_offloaded(marked)
    chosen = set(offloaded_layers(marked))
    best, profile = plan, marked
    for stage in reversed(plan.stages):
        inside = {i for i in chosen if stage.layer_start <= i < stage.layer_stop}
        if not inside:
            continue
        trial_profile = with_offload(marked, optimizer=optimizer, layers=chosen - inside)
        trial = _rebuilt(plan, trial_profile, cluster, request)
        if (trial.predicted.peak_memory_bytes <= cap
                and trial.predicted.iteration_ms <= best.predicted.iteration_ms * (1 + 1e-9)):
            chosen -= inside
            best, profile = trial, trial_profile
    if best is plan:
        return plan, marked
    return with_accounts(best, profile, cluster, request), profile


def _with_host(plan: Plan, marked: Profile, cluster: Cluster, request: PlanRequest, mode: OffloadMode) -> Plan:
    """``plan`` recording the mode, each stage's offloaded layers and host bytes."""
    chosen = set(offloaded_layers(marked)) if mode.activations else set()
    lay = plan.layout
    plain = with_offload(marked, optimizer=False)
    cm = device_cost_model(plain, base_cluster(cluster, lay.world_size), request.optimizer, lay.group, plan.stack)
    b = plan.microbatch_size
    saves = cm.saved_per_sample * b + cm.saved_fixed
    stages: list[PlanStage] = []
    for s, stage in enumerate(plan.stages):
        layers = tuple(i for i in range(stage.layer_start, stage.layer_stop) if i in chosen)
        host = sum(float(saves[i]) for i in layers) * stage.inflight_microbatches
        if mode.optimizer:
            host += cm.stage_param_count(stage.layer_start, stage.layer_stop) * cm.state_bytes_per_param(
                lay.sharding(s))[2]
        stages.append(dataclasses.replace(stage, offload_layers=layers, host_memory_bytes=int(host)))
    sha = _sha_of_plain(plan, marked, cluster, request)
    provenance = dataclasses.replace(plan.provenance, profile_sha256=sha)
    return dataclasses.replace(plan, offload=mode, stages=tuple(stages), provenance=provenance)


def _sha_of_plain(plan: Plan, marked: Profile, cluster: Cluster, request: PlanRequest) -> str:
    """The sha256 of the profile without the offload marks (what a runtime checks a plan against)."""
    plain = with_offload(marked, optimizer=False)
    return Problem.of(plain, cluster, request, plan.provenance.solver, 1).profile_sha256


def _marked_front(plan: Plan, mode: OffloadMode) -> Plan:
    return dataclasses.replace(plan, pareto=tuple(dataclasses.replace(p, offload=mode) for p in plan.pareto))


def _merged_front(plans: list[Plan]) -> tuple[ParetoPoint, ...]:
    """The non-dominated (iteration time, peak memory) points of every plan's front."""
    points = sorted({p for plan in plans for p in plan.pareto}, key=lambda p: (p.iteration_ms, p.peak_memory_bytes))
    front: list[ParetoPoint] = []
    for p in points:
        if not front or p.peak_memory_bytes < front[-1].peak_memory_bytes:
            front.append(p)
    return tuple(front)
