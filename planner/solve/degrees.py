"""The degrees the search spans: each tensor- x context-parallel group a request's layouts may
have (:func:`planner.cost.groups.device_groups`, with the expert layout of a profile with
routed experts) as a :class:`Degree`: its cost model and the bounds below every configuration of
it (:mod:`planner.solve.search` searches them)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from planner.artifacts.cluster import Cluster
from planner.artifacts.layout import DeviceGroup
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.cost.tensor_parallel import device_cost_models
from planner.solve.problem import Problem
from planner.solve.space import microbatch_sizes


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
    """Each group's :class:`Degree` in order, built as it is asked for (its cost model by
    :func:`planner.cost.tensor_parallel.device_cost_models`)."""
    request = problem.request
    models = device_cost_models(problem.profile, base, request.optimizer, groups, request.stack)
    for group, cm in zip(groups, models):
        num_groups = group.groups_in(num_devices)
        yield Degree(group=group, cost_model=cm, num_groups=num_groups, bound_ms=degree_bound_ms(cm, request, num_groups),
                     machine_bound_ms=machine_bound_ms(cm, request.global_batch, num_groups))


def degree_bound_ms(cm: CostModel, request: PlanRequest, num_groups: int) -> float:
    """No configuration of ``cm`` on at most ``num_groups`` groups has a lower bound below this
    (:func:`planner.solve.floors.config_lower_bound_ms`, which the other bounds only raise): its
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
