"""The device groups a search covers: every tensor-parallel degree ``t`` (with or without
sequence parallelism), context-parallel degree ``cp`` and expert layout ``ep x etp`` its request
and profile allow, as :class:`~planner.artifacts.layout.DeviceGroup` values, and the cluster their
device views are taken of. Each group's cost model (the per-device view of the profile) is
:func:`planner.cost.tensor_parallel.device_cost_model`'s; the degrees of context parallelism and of
the experts are their modules' (:func:`planner.cost.context_degrees.candidate_cp_degrees`,
:func:`planner.cost.expert_degrees.candidate_expert_degrees`: each needs its axis's facts of the profile).

Tensor parallelism's decisions (Shoeybi et al. 2019): ``t`` divides the devices per node (a
tensor-parallel group never spans the slow inter-node link); it divides every ``must_divide`` size
of every layer that declares a split (attention heads, key/value heads); per-stage replication is
not combined with ``t > 1``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

from planner.artifacts.cluster import Cluster
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.layout import DeviceGroup
from planner.artifacts.profile import Profile
from planner.artifacts.request import PlanRequest
from planner.cost.context_degrees import candidate_cp_degrees
from planner.cost.expert_degrees import candidate_expert_degrees

__all__ = ["base_cluster", "candidate_degrees", "device_groups", "refusal", "splittable", "tensor_settings"]


def splittable(profile: Profile) -> bool:
    """True when at least one layer declares how it splits over tensor-parallel devices."""
    return any(layer.tp is not None for layer in profile.layers)


def refusal(profile: Profile, cluster: Cluster, num_devices: int, t: int) -> str:
    """Why ``t`` cannot be used for ``profile`` on ``num_devices`` devices of ``cluster``
    ("" when it can)."""
    if t < 1:
        return f"tensor-parallel degree {t} must be >= 1"
    if t == 1:
        return ""
    if not splittable(profile):
        return f"no layer of profile {profile.model!r} declares a tensor-parallel split (Layer.tp)"
    per_node = min(cluster.devices_per_node, num_devices)
    if per_node % t or num_devices % t:
        return (
            f"tensor-parallel degree {t} does not divide the {per_node} devices per node used "
            f"(a tensor-parallel group stays inside one node)"
        )
    for layer in profile.layers:
        if layer.tp is not None:
            for size in layer.tp.must_divide:
                if size % t:
                    return f"tensor-parallel degree {t} does not divide {size} (layer {layer.name!r}: heads)"
    return ""


def candidate_degrees(profile: Profile, cluster: Cluster, num_devices: int, asked: Iterable[int] = ()) -> list[int]:
    """The tensor-parallel degrees to search: ``asked`` (every one must be usable, else
    :class:`PlannerInputError` says why), or every usable divisor of the devices per node."""
    asked = sorted(set(asked))
    if asked:
        for t in asked:
            why = refusal(profile, cluster, num_devices, t)
            if why:
                raise PlannerInputError(f"--tp {t}: {why}")
        return asked
    per_node = min(cluster.devices_per_node, num_devices)
    return [t for t in range(1, per_node + 1) if not refusal(profile, cluster, num_devices, t)]


def tensor_settings(profile: Profile, cluster: Cluster, num_devices: int, request: PlanRequest) -> Iterator[tuple[int, bool]]:
    """The (tensor-parallel degree, sequence parallelism) pairs searched: every degree the
    request and the profile allow; sequence parallelism is never slower and never larger under
    the cost model (same collective time, every split cost / t), so where both are allowed only
    "on" is searched."""
    for t in candidate_degrees(profile, cluster, num_devices, request.tp_degrees):
        for sp in ([max(request.sequence_parallel)] if t > 1 else [False]):
            yield t, sp


def device_groups(profile: Profile, cluster: Cluster, num_devices: int,
                  request: PlanRequest) -> tuple[Cluster, list[DeviceGroup]]:
    """The cluster the device views of a search over ``num_devices`` devices of ``cluster`` are
    taken of (:func:`base_cluster`), and every group searched on them, every cp = 1 group first
    (the incumbent a cp > 1 search prunes against), else in the order of the tensor-parallel
    settings."""
    base = base_cluster(cluster, num_devices)
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
    return base, groups


def base_cluster(cluster: Cluster, num_devices: int) -> Cluster:
    """The cluster a view of ``num_devices`` devices is taken of: part of one node when they fit
    in one, else the whole cluster."""
    return cluster.with_devices(num_devices) if num_devices <= cluster.devices_per_node else cluster
