"""The memory and ME objectives choose among every plan the search built, over every degree
(the ME objective's index, against the fastest GPipe plan without recomputation of them all, is
checked by the golden case ``default-me``).

``Objective.MEMORY`` is the least peak memory within 10% of the fastest plan (or a time budget);
``Objective.ME`` the highest memory-efficiency index against the fastest GPipe plan without
recomputation. Each tensor- x context-parallel degree used to choose its own plan against its
own fastest, and the search then chose among those choices: the memory plan's 10% was counted
from the fastest of the degrees' lean choices (the default profile on 8 A100s: 63,054 ms against
a fastest plan of 55,046 ms, 1.145x), and the ME index against a degree's own reference. And
per-stage replication was searched for the time objective only, so the memory objective's
"fastest" could be a slower plan than the time objective's (PipeDream's alexnet on 8 V100s).
"""

from __future__ import annotations

import dataclasses

from planner.artifacts.cluster import PRESETS, Cluster
from planner.artifacts.kinds import Objective
from planner.artifacts.profile import Profile, load_profile
from planner.artifacts.request import PlanRequest
from planner.profiling.defaults import default_profile_path
from planner.solve import plan
from tests.pipedream_reference import REFERENCE, require_reference


def _default() -> tuple[Profile, Cluster]:
    return load_profile(default_profile_path()), PRESETS["a100-80gb-x8"]


def test_memory_objective_stays_within_ten_percent_of_the_fastest_plan() -> None:
    profile, cluster = _default()
    fastest = plan(profile, cluster, PlanRequest(global_batch=512))
    lean = plan(profile, cluster, PlanRequest(global_batch=512, objective=Objective.MEMORY))
    assert lean.predicted.iteration_ms <= fastest.predicted.iteration_ms * 1.10
    assert lean.predicted.peak_memory_bytes < fastest.predicted.peak_memory_bytes
    # no point of the time search's front within the budget holds less memory
    budget = fastest.predicted.iteration_ms * 1.10
    assert all(q.peak_memory_bytes >= lean.predicted.peak_memory_bytes
               for q in fastest.pareto if q.iteration_ms <= budget)


def test_memory_objective_counts_per_stage_replication_in_the_fastest() -> None:
    """PipeDream's alexnet on 8 V100s (a drawn case: 8 GiB per device, fp32 gradients, stages
    starting at layers 9 and 21): the fastest plan replicates its stages unevenly (4, 2, 1, 1
    copies); the memory objective's 10% is counted from it (it was counted from the fastest plan
    without replication, 6% slower)."""
    from planner.artifacts.kinds import OptimizerKind
    from planner.profiling.imported.pipedream import import_pipedream

    require_reference()  # ../shared/reference beside the clone, or a clear failure
    profile = import_pipedream(REFERENCE / "alexnet" / "graph.txt")
    cluster = PRESETS["v100-16gb-2x8"].with_devices(8)
    request = PlanRequest(global_batch=4096, memory_cap_bytes=8 * 2**30, fixed_boundaries=(9, 21),
                          optimizer=OptimizerKind.ADAM_MIXED_FP32_GRAD)
    fastest = plan(profile, cluster, request)
    lean = plan(profile, cluster, dataclasses.replace(request, objective=Objective.MEMORY))
    assert fastest.layout.stage_replicas  # the case is the one it claims
    assert lean.predicted.iteration_ms <= fastest.predicted.iteration_ms * 1.10
    assert lean.predicted.peak_memory_bytes < fastest.predicted.peak_memory_bytes
