"""What a search is asked (:class:`Problem`): the model and cluster as given, the request, the
solver, the devices it had, and the memory a device may use, with the digests every plan built
for it records; made once per search (:meth:`Problem.of`) and read by every step after
(the degrees, the layout searches, the plans built, :mod:`planner.solve.build`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner.artifacts import codec
from planner.artifacts.caches import Cache
from planner.artifacts.cluster import Cluster, cluster_to_json
from planner.artifacts.kinds import SolverKind
from planner.artifacts.profile import Profile, profile_to_json
from planner.artifacts.request import PlanRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """What plans are built for and record: the model and cluster as given (provenance, the
    machine bound, model FLOPs), the request, the solver, the devices it had, and the memory a
    device may use (:func:`memory_cap_bytes`, worked out once by :meth:`of`)."""

    profile: Profile
    cluster: Cluster
    request: PlanRequest
    solver: SolverKind
    devices_available: int
    profile_sha256: str
    cluster_sha256: str
    cap_bytes: int

    @classmethod
    def of(
        cls, profile: Profile, cluster: Cluster, request: PlanRequest, solver: SolverKind, devices_available: int
    ) -> Problem:
        return cls(
            profile=profile, cluster=cluster, request=request, solver=solver, devices_available=devices_available,
            profile_sha256=_digest(profile, profile_to_json), cluster_sha256=_digest(cluster, cluster_to_json),
            cap_bytes=memory_cap_bytes(cluster, request),
        )


#: the sha256 of a document's canonical JSON by the object's identity (the object kept beside it, so
#: an id is never reused while its entry lives): a search rebuilds plans of one profile many times,
#: and a 96-layer profile's JSON takes ~80 ms to write
_DIGESTS: Cache[int, tuple[object, str]] = Cache("solve.problem.digests", key="id of a profile or cluster object",
                                                 bound=16)


def _digest(document: object, to_json: Callable[[Any], object]) -> str:
    """``codec.sha256_of(to_json(document))``, once per object."""
    found = _DIGESTS.get(id(document))
    if found is not None and found[0] is document:
        return found[1]
    return _DIGESTS.put(id(document), (document, codec.sha256_of(to_json(document))))[1]


def memory_cap_bytes(cluster: Cluster, request: PlanRequest) -> int:
    """The per-device memory the plan may use: an explicit cap, or device memory less headroom."""
    if request.memory_cap_bytes:
        return request.memory_cap_bytes
    return int(cluster.device_memory_bytes * (1.0 - request.memory_headroom_fraction))
