"""The context-parallel degrees a search covers (its device view is :mod:`planner.cost.context`'s).

A degree ``cp`` splits every sample's sequence into ``2 cp`` load-balanced chunks (Dubey et al.
2024, sec. 3.3.2), so it must cut the profile's sequence into whole chunks, and ``cp`` groups of
``t`` tensor-parallel devices must divide the devices. Only a profile that declares what scales
with its sequence (:func:`planner.profiling.analytic.sequence.sequence_shape`: the analytic GPT and
Llama profiles) is searched with ``cp`` > 1. The other axes' degrees: tensor parallelism's and the
groups a search forms of them all in :mod:`planner.cost.groups`, the expert layouts in
:mod:`planner.cost.expert_degrees`.
"""

from __future__ import annotations

from collections.abc import Iterable

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.profile import Profile
from planner.profiling.analytic.sequence import sequence_shape

__all__ = ["candidate_cp_degrees", "refusal"]


def refusal(profile: Profile, num_devices: int, tp_degree: int, cp: int) -> str:
    """Why ``cp`` cannot be used for ``profile`` on ``num_devices`` devices with tensor-parallel
    degree ``tp_degree`` ("" when it can)."""
    if cp < 1:
        return f"context-parallel degree {cp} must be >= 1"
    if cp == 1:
        return ""
    shape = sequence_shape(profile)
    if shape is None:
        return (f"profile {profile.model!r} does not declare what scales with the sequence (only analytic GPT and "
                f"Llama profiles do: planner profile --analytic); context parallelism is not searched for it")
    if shape.seq % (2 * cp):
        return (f"context-parallel degree {cp} does not cut the {shape.seq}-token sequence into {2 * cp} whole "
                f"load-balanced chunks")
    if num_devices % (cp * tp_degree):
        return f"context-parallel degree {cp} x tensor-parallel degree {tp_degree} does not divide the {num_devices} devices"
    return ""


def candidate_cp_degrees(profile: Profile, num_devices: int, tp_degree: int, asked: Iterable[int] = ()) -> list[int]:
    """The context-parallel degrees searched with ``tp_degree``: those of ``asked`` that divide
    the devices with it (one unusable with any, ``tp_degree`` 1, is refused naming why), else 1
    and every degree :func:`refusal` allows."""
    asked = sorted(set(asked))
    for cp in asked:
        why = refusal(profile, num_devices, 1, cp)
        if why:
            raise PlannerInputError(f"--cp {cp}: {why}")
    candidates = asked or range(1, num_devices // tp_degree + 1)
    return [cp for cp in candidates if not refusal(profile, num_devices, tp_degree, cp)]
