"""The expert layouts a search covers: the (``ep``, ``etp``) pairs its routed experts are laid out
over (the experts as one device of a layout runs them are :mod:`planner.cost.experts`').

``ep`` divides every MoE layer's experts, ``etp`` their FFN width and a node's devices (an expert
tensor-parallel group stays in one node), ``ep x etp`` the devices. Unless asked, ``ep`` runs over
the powers of two and ``etp`` is 1 or the tensor-parallel degree (Megatron-Core's two settings).
The other axes' degrees: tensor parallelism's and the groups a search forms of them all in
:mod:`planner.cost.groups`, context parallelism's in :mod:`planner.cost.context_degrees`.
"""

from __future__ import annotations

from planner.artifacts.cluster import Cluster
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.profile import Profile

__all__ = ["candidate_expert_degrees", "expert_refusal", "has_experts"]


def has_experts(profile: Profile) -> bool:
    """Some layer of ``profile`` has routed experts."""
    return any(layer.moe is not None for layer in profile.layers)


def expert_refusal(profile: Profile, cluster: Cluster, num_devices: int, ep: int, etp: int) -> str:
    """Why experts cannot be laid out over ``ep`` x ``etp`` devices for ``profile`` on
    ``num_devices`` of ``cluster`` ("" when they can): ``ep`` divides every MoE layer's experts,
    ``etp`` their FFN width and a node's devices, ``ep x etp`` the devices."""
    if ep < 1 or etp < 1:
        return f"expert degrees must be >= 1 (got ep {ep}, etp {etp})"
    if ep * etp == 1:
        return ""
    moes = [layer.moe for layer in profile.layers if layer.moe is not None]
    if not moes:
        return f"profile {profile.model!r} has no routed experts (Layer.moe)"
    for moe in moes:
        if moe.num_experts % ep:
            return f"expert-parallel degree {ep} does not divide the {moe.num_experts} routed experts"
        if moe.expert_ffn_hidden % etp:
            return f"expert tensor-parallel degree {etp} does not divide the experts' FFN width {moe.expert_ffn_hidden}"
    if min(cluster.devices_per_node, num_devices) % etp:
        return f"expert tensor-parallel degree {etp} does not divide the devices per node (its group stays in one node)"
    if num_devices % (ep * etp):
        return f"expert-parallel degree {ep} x expert tensor-parallel degree {etp} does not divide the {num_devices} devices"
    return ""


def candidate_expert_degrees(profile: Profile, cluster: Cluster, num_devices: int, asked_ep: tuple[int, ...] = (),
                             asked_etp: tuple[int, ...] = (), tp_degree: int = 1) -> list[tuple[int, int]]:
    """The (ep, etp) pairs searched with tensor-parallel degree ``tp_degree``: of ``asked_ep`` x
    ``asked_etp`` (each value usable with some other, else :class:`PlannerInputError` says why),
    or every usable (:func:`expert_refusal`) pair of a power of two ``ep`` and ``etp`` 1 or
    ``tp_degree`` (Megatron-Core's two settings: experts whole on each device, "parallel folding"'s
    recommendation, Liu et al. 2025 sec. 5; or split like the attention, its default before
    folding; others with ``--etp``); (1, 1) alone for a profile without experts."""
    if not has_experts(profile):
        bad = [d for d in asked_ep + asked_etp if d != 1]
        if bad:
            raise PlannerInputError(f"--ep/--etp {bad[0]}: profile {profile.model!r} has no routed experts (Layer.moe)")
        return [(1, 1)]
    eps = sorted(set(asked_ep)) or [d for d in _powers(num_devices)]
    etps = sorted(set(asked_etp)) or sorted({1, tp_degree})
    for flag, values, fixed in (("--ep", asked_ep, 1), ("--etp", asked_etp, 1)):
        for d in values:
            why = expert_refusal(profile, cluster, num_devices, d if flag == "--ep" else fixed, d if flag == "--etp" else fixed)
            if why:
                raise PlannerInputError(f"{flag} {d}: {why}")
    return [(ep, etp) for ep in eps for etp in etps if not expert_refusal(profile, cluster, num_devices, ep, etp)]


def _powers(limit: int) -> list[int]:
    """1, 2, 4, ... up to ``limit``."""
    out, d = [], 1
    while d <= limit:
        out.append(d)
        d *= 2
    return out
