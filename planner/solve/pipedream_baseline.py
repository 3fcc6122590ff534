"""The ``pipedream`` baseline on a PipeDream profile: the choice of PipeDream's own optimizer
(:mod:`planner.solve.pipedream_optimizer`), stage boundaries and copies per stage, turned into
candidate plans that our simulator scores like every baseline's.

When it applies: the profile was imported from a PipeDream ``graph.txt`` (``source ==
"pipedream"``: the optimizer needs the node graph, which such a profile keeps as layers and
edges), the request leaves the layout free (no ``--stages``, ``--dp``, ``--max-stages``, fixed
boundaries, tensor parallelism; per-stage replication allowed; not ZeRO 3 only, which per-stage
replication is not priced with), and the antichain DAG has at most
:data:`MAX_STATES` states. Otherwise :func:`choose` returns None and the baseline keeps its
weight rule (:func:`planner.solve.partitions.WEIGHTS`), which works on any chain.

The optimizer's inputs come from the cluster and profile:

- bandwidth: PipeDream's one figure is our intra-node link when the ``N`` devices fit in one
  node, else the inter-node link (the slowest link the pipeline crosses);
- memory: the device memory; ``--use_memory_constraint`` on, activation compression ratio 1
  (transfers priced), the setting ``benchmarks/pipedream_side_by_side.py`` runs it with;
- times and bytes: the profile's figures at its minibatch (``microbatch_sizes[0]``).

Layer prefixes: a plan's stage is a range of the profile's layers, which are the graph's nodes in
one topological order (the importer's), while the optimizer cuts at antichains, whose downsets
need not be prefixes of that order. When every boundary of its choice is a prefix (node ``c``
ends one: layer ``c + 1`` starts the next, layer 0 being the merged inputs), the choice is used
as it is; otherwise the DP is run again over the states whose downsets are prefixes (the same
optimizer, over the cuts a plan can express), and its choice is used.

Each candidate: micro-batch size ``b`` (every size the request allows), ``M = G / b`` micro-batches
(a multiple of every stage's copies, for round-robin), each allowed schedule of
``planner.solve.space.DP_SCHEDULES``, no recomputation unless a stage does not fit (then all of
its layers, as the other baselines do). One stage with ``N`` copies is plain data parallelism.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.artifacts.cluster import Cluster
from planner.artifacts.kinds import ZeroStage
from planner.artifacts.profile import Profile
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.solve.pipedream_optimizer import (
    Choice,
    OptimizerArgs,
    TooManyStates,
    antichain_states,
    nodes_of_profile,
    optimize,
    prefix_bounds,
    restricted,
)
from planner.solve.space import DP_SCHEDULES, Config, layout_of, microbatch_sizes, schedule_valid

#: the antichain DAGs of the 11 published profiles PipeDream's optimizer handles have at most
#: ~1,500 states; Inception and NASNet grow past any budget (its README: "won't work")
MAX_STATES = 5000


@dataclass(frozen=True, slots=True)
class Split:
    """The optimizer's choice on layer ranges: stage starts (layer indices) and copies."""

    starts: tuple[int, ...]
    replicas: tuple[int, ...]
    objective_s: float
    prefix_only: bool  # chosen among prefix boundaries only (the full choice was not a prefix chain)


def optimizer_args(cluster: Cluster, num_devices: int) -> OptimizerArgs:
    """PipeDream's arguments from the cluster (see the module docstring)."""
    link = (cluster.intra_node_bandwidth_gb_per_s if num_devices <= cluster.devices_per_node
            else cluster.inter_node_bandwidth_gb_per_s)
    return OptimizerArgs(num_machines=num_devices, bandwidth_bytes_per_s=link * 1e9,
                         memory_bytes=float(cluster.device_memory_bytes))


def applies(profile: Profile, request: PlanRequest, cm: CostModel) -> bool:
    return (profile.source == "pipedream" and profile.num_layers >= 2 and cm.group.tp_degree == 1
            and not (request.num_stages or request.dp_degree or request.max_stages or request.fixed_boundaries)
            and request.per_stage_replication and min(request.zero_stages) != ZeroStage.PARAMETERS)


def choose(profile: Profile, cluster: Cluster, request: PlanRequest, cm: CostModel, num_devices: int) -> Split | None:
    """The optimizer's split on layer ranges, or None where it does not apply (module docstring)."""
    if not applies(profile, request, cm):
        return None
    graph = nodes_of_profile(profile)
    try:
        states = antichain_states(graph, MAX_STATES)
    except TooManyStates:
        return None
    args = optimizer_args(cluster, num_devices)
    choice: Choice | None = optimize(graph, args, states)
    starts = None if choice is None else prefix_bounds(choice)
    prefix_only = choice is not None and starts is None
    if prefix_only:
        last = len(states.downsets) - 1
        keep = [not (d & (d + 1)) or i == last for i, d in enumerate(states.downsets)]
        choice = optimize(graph, args, restricted(states, keep))
        starts = None if choice is None else prefix_bounds(choice)
    if choice is None or starts is None:
        return None
    return Split(starts=(0,) + tuple(c + 1 for c in starts[1:]), replicas=choice.replicas,
                 objective_s=choice.objective_s, prefix_only=prefix_only)


def configs_of(split: Split, cm: CostModel, request: PlanRequest, zero: ZeroStage) -> list[Config]:
    """The configurations the split is priced under (module docstring), search order; only
    the schedules the baselines plan (``schedules`` of the request within DP_SCHEDULES)."""
    n = sum(split.replicas)
    single = len(split.replicas) == 1
    layout = layout_of(cm, 1, n, 1, zero) if single else layout_of(cm, len(split.replicas), zero=zero,
                                                                      replicas=split.replicas)
    per_pipeline = request.global_batch // n if single else request.global_batch
    if single and request.global_batch % n:
        return []
    step = 1 if single else math.lcm(*split.replicas)
    out = []
    for b in microbatch_sizes(request, per_pipeline):
        m = per_pipeline // b
        if m % step:
            continue
        for schedule in request.schedules:
            if schedule in DP_SCHEDULES and schedule_valid(schedule, layout.pipeline_size, m):
                out.append(Config(layout, b, m, schedule))
    return out



def refusal(split: Split, cm: CostModel, request: PlanRequest, cap_bytes: float) -> str:
    """Why no candidate of the optimizer's split is left: no micro-batch count that its copies
    divide, or stages that do not fit even recomputing."""
    ranges = " ".join(f"[{a},{z})x{r}" for a, z, r in zip(split.starts, split.starts[1:] + (cm.num_layers,), split.replicas))
    head = f"baseline 'pipedream': PipeDream's optimizer chose {ranges}"
    step = math.lcm(*split.replicas) if len(split.replicas) > 1 else 1
    if not configs_of(split, cm, request, min(request.zero_stages)):
        return (f"{head}; round-robin over its copies needs a micro-batch count that is a multiple of {step}, "
                f"which no allowed micro-batch size of global batch {request.global_batch} gives "
                f"(a global batch of {cm.profile.microbatch_sizes[0] * step} would)")
    return f"{head}, which does not fit in {cap_bytes / 1024**3:.2f} GiB per device, even recomputing"
