"""The degrees the search spans: each tensor- x context-parallel group
(:class:`~planner.artifacts.layout.DeviceGroup`) a request's layouts may have, with the expert
layout of a profile with routed experts (expert-parallel x expert tensor-parallel degrees,
:func:`planner.cost.experts.candidate_expert_degrees`), its cost model, and the bounds below
every configuration of it (:mod:`planner.solve.search` searches them)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from planner.artifacts.cluster import Cluster
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.layout import DeviceGroup
from planner.artifacts.profile import Profile
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.cost.context import ContextView, candidate_cp_degrees, context_parallel_view
from planner.cost.experts import candidate_expert_degrees
from planner.cost.tensor_parallel import candidate_degrees, device_cost_model, stack_tp_view
from planner.solve.build import Problem
from planner.solve.space import microbatch_sizes


def tensor_settings(profile: Profile, cluster: Cluster, num_devices: int, request: PlanRequest) -> Iterator[tuple[int, bool]]:
    """The (tensor-parallel degree, sequence parallelism) pairs searched: every degree the
    request and the profile allow; sequence parallelism is never slower and never larger under
    the cost model (same collective time, every split cost / t), so where both are allowed only
    "on" is searched."""
    for t in candidate_degrees(profile, cluster, num_devices, request.tp_degrees):
        for sp in ([max(request.sequence_parallel)] if t > 1 else [False]):
            yield t, sp


def device_groups(profile: Profile, base: Cluster, num_devices: int, request: PlanRequest) -> list[DeviceGroup]:
    """Every group searched on ``num_devices`` devices of ``base``, every cp = 1 group first
    (the incumbent a cp > 1 search prunes against), else in the order of the tensor-parallel
    settings."""
    tensor = list(tensor_settings(profile, base, num_devices, request))
    experts = {t: candidate_expert_degrees(profile, base, num_devices, request.ep_degrees, request.etp_degrees, t)
               for t, _ in tensor}
    groups = sorted((DeviceGroup(tp_degree=t, cp_degree=cp, sequence_parallel=sp, ep_degree=ep, etp_degree=etp)
                     for t, sp in tensor for cp in candidate_cp_degrees(profile, num_devices, t, request.cp_degrees)
                     for ep, etp in experts[t] if num_devices % (t * cp * ep * etp // math.gcd(t * cp, ep * etp)) == 0),
                    key=lambda g: g.cp_degree)
    if not groups:
        raise PlannerInputError(f"--cp {list(request.cp_degrees)}: no degree divides the {num_devices} devices with a "
                                f"tensor-parallel degree searched")
    return groups


@dataclass(frozen=True, slots=True, kw_only=True)
class Degree:
    """One group searched: its cost model (the per-device tables), how many such groups the
    devices hold, and the bounds below every plan of it (:func:`degree_bound_ms`,
    :func:`machine_bound_ms`)."""

    group: DeviceGroup
    cost_model: CostModel
    num_groups: int
    bound_ms: float
    machine_bound_ms: float


def degree_models(problem: Problem, base: Cluster, groups: list[DeviceGroup], num_devices: int) -> Iterator[Degree]:
    """Each group's :class:`Degree` in order, built as it is asked for; the tensor-parallel view of
    each ``(t, sp)`` built once for all its context-parallel degrees, the context-parallel view of
    each ``(t, sp, cp)`` once for all its expert layouts."""
    request = problem.request
    views: dict[tuple[int, bool], Profile] = {}
    contexts: dict[tuple[int, bool, int], ContextView] = {}  # per (t, sp, cp): the same for every expert layout
    for group in groups:
        t, sp, cp = group.tp_degree, group.sequence_parallel, group.cp_degree
        if (t, sp) not in views:
            views[(t, sp)] = stack_tp_view(problem.profile, base, t, sp, request.stack)
        if (t, sp, cp) not in contexts:
            contexts[(t, sp, cp)] = context_parallel_view(views[(t, sp)], base, cp, t, request.stack)
        cm = device_cost_model(problem.profile, base, request.optimizer, group, request.stack, tp_view=views[(t, sp)],
                               cp_view=contexts[(t, sp, cp)])
        num_groups = group.groups_in(num_devices)
        yield Degree(group=group, cost_model=cm, num_groups=num_groups, bound_ms=degree_bound_ms(cm, request, num_groups),
                     machine_bound_ms=machine_bound_ms(cm, request.global_batch, num_groups))


def degree_bound_ms(cm: CostModel, request: PlanRequest, num_groups: int) -> float:
    """No configuration of ``cm`` on at most ``num_groups`` groups has a lower bound below this
    (:func:`planner.solve.space.config_lower_bound_ms`, which the other bounds only raise): its
    ``M x work / P`` is ``G x work(b) / (b x P x D)`` with ``P x D <= num_groups``, at its
    micro-batch size ``b``, one of those dividing the global batch ``G``."""
    G = request.global_batch
    out = float("inf")
    for b in microbatch_sizes(request, G):
        out = min(out, G * cm.at_batch(b).work_ms / (b * num_groups))
    return out


def machine_bound_ms(cm: CostModel, global_batch: int, num_groups: int) -> float:
    """No plan priced by ``cm`` on ``num_groups`` groups runs faster: every sample's forward and
    backward on one of them, at the cheapest per-sample rate any micro-batch size gives (the
    lines' slopes, plus their intercepts where negative: ``(c + s b) / b >= s + min(c, 0)``).
    For views whose layer times are lines (the context-parallel ones)."""
    layers = cm.profile.layers
    slope = sum(layer.fwd.per_sample_ms + layer.bwd.per_sample_ms for layer in layers)
    intercept = sum(layer.fwd.intercept_ms + layer.bwd.intercept_ms for layer in layers)
    return global_batch * max(0.0, slope + min(intercept, 0.0)) / cm.cluster.relative_speed / num_groups
