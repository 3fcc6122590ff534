"""Tensor parallelism as a view: a profile and cluster seen by one tensor-parallel group.

A plan with tensor-parallel degree ``t`` (Shoeybi et al. 2019, Megatron-LM) runs every stage
replica on ``t`` devices of one node. Seen from the pipeline and data-parallel axes, those
``t`` devices behave as *one* device of a cluster with ``devices_per_node / t`` devices per
node, running a model whose layers are the per-device shards. :func:`tensor_parallel_view`
builds that model and that cluster; the whole pipeline + data-parallel machinery (cost model,
DP / CP-SAT / brute-force solvers, simulator, bounds) then prices and searches it unchanged,
and :func:`lift` turns the plan found in the view back into a plan of real devices. So t is one
more dimension of the same search, not a special case beside it.

A layer that declares a :class:`~planner.artifacts.profile.TensorSplit` becomes, on each of
the ``t`` devices (``f`` = split_time_fraction, ``S`` = split parameters, ``A`` = split saved
bytes; with sequence parallelism ``f`` = 1 and everything saved is split):

- forward / backward time ``T x ((1 - f) + f / t)`` plus its collectives, each an all-reduce of
  ``collective_bytes_per_sample x b`` over the ``t`` devices on the intra-node ring
  (:func:`planner.cost.allreduce_line`): ``alpha`` terms in the intercept, bytes in the
  per-sample slope, so the time stays a line in the micro-batch size. With sequence
  parallelism each all-reduce is a reduce-scatter + all-gather of the same bytes, which a
  ring does in the same time (Korthikanti et al. 2022 section 4.2.2). They are on the
  critical path of every layer: nothing hides them;
- parameters ``P - S + ceil(S / t)``; saved activations ``(saved - A) + A / t`` (Korthikanti et
  al. 2022 eq. 2), or ``saved / t`` with sequence parallelism (eq. 4); the input kept by a
  recomputed layer is whole, or ``1 / t`` with sequence parallelism.

A layer without a declaration runs whole on every device of the group (replicated; same time,
same parameters, no collective). Tensors crossing a stage boundary are sent ``1 / t`` by
each of the group's devices over its own link (Narayanan et al. 2021 section 4.1, the
scatter/gather optimisation); the all-gather after the receive, over NVLink, is not priced.
A tied tensor whose every layer splits it (vocabulary-parallel embedding and head) is
divided by ``t``.

Devices: the view's device ``v`` is the real devices ``v t .. v t + t - 1`` (consecutive ranks,
so inside a node). Per-device memory, link bandwidths and latencies are unchanged: every
device of the group drives its own NVLink port and its own network interface (the cluster
presets give per-device inter-node bandwidth), so the ``t`` gradient all-reduces of a
tensor-parallel stage (one per shard, across its data-parallel replicas) run side by side,
each on its own devices' links, at the cost the view prices for one.

Decisions: ``t`` divides the devices per node (a tensor-parallel group never spans the slow
inter-node link); it divides every ``must_divide`` size of every declared layer (attention
heads, key/value heads); per-stage replication is not combined with ``t > 1``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Iterable

from planner.artifacts import codec
from planner.artifacts.cluster import Cluster, cluster_to_json
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Edge, Layer, Profile, TiedParams, TimeFit, profile_to_json
from planner.artifacts.errors import PlannerInputError

if TYPE_CHECKING:
    from planner.artifacts.request import PlanRequest


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


def _line(fit: TimeFit, scale: float, collectives: int, fixed_ms: float, per_sample_ms: float) -> TimeFit:
    return TimeFit(
        intercept_ms=fit.intercept_ms * scale + collectives * fixed_ms,
        per_sample_ms=fit.per_sample_ms * scale + collectives * per_sample_ms,
    )


def _layer_view(layer: Layer, t: int, sp: bool, ms_per_byte: float, fixed_ms: float) -> Layer:
    split = layer.tp
    if split is None:
        return dataclasses.replace(layer, output_bytes_per_sample=layer.output_bytes_per_sample / t, measured=())
    f = 1.0 if sp else split.split_time_fraction
    scale = (1.0 - f) + f / t
    per_sample = ms_per_byte * split.collective_bytes_per_sample
    params = layer.param_count - split.split_param_count + math.ceil(split.split_param_count / t)
    saved = layer.saved_bytes_per_sample / t if sp else (
        layer.saved_bytes_per_sample - split.split_saved_bytes_per_sample + split.split_saved_bytes_per_sample / t
    )
    return dataclasses.replace(
        layer,
        fwd=_line(layer.fwd, scale, split.collectives_fwd, fixed_ms, per_sample),
        bwd=_line(layer.bwd, scale, split.collectives_bwd, fixed_ms, per_sample),
        measured=(),
        param_count=params,
        param_bytes=round(layer.param_bytes * params / layer.param_count) if layer.param_count else 0,
        saved_bytes_per_sample=saved,
        input_bytes_per_sample=layer.input_bytes_per_sample / t if sp else layer.input_bytes_per_sample,
        output_bytes_per_sample=layer.output_bytes_per_sample / t,
        tp=None,
    )


def _tie_view(profile: Profile, tie: TiedParams, t: int) -> TiedParams:
    layers = [profile.layers[i] for i in tie.layers]
    if all(layer.tp is not None and layer.tp.split_param_count >= tie.param_count for layer in layers):
        count = math.ceil(tie.param_count / t)
        return dataclasses.replace(tie, param_count=count, param_bytes=round(tie.param_bytes * count / tie.param_count))
    return tie


def cluster_view(cluster: Cluster, t: int) -> Cluster:
    """``cluster`` with each group of ``t`` consecutive devices of a node as one device."""
    if t == 1:
        return cluster
    if cluster.devices_per_node % t:
        raise PlannerInputError(
            f"tensor-parallel degree {t} does not divide the {cluster.devices_per_node} devices per node "
            f"of cluster {cluster.name!r}"
        )
    return dataclasses.replace(
        cluster,
        name=f"{cluster.name}/tp{t}",
        devices_per_node=cluster.devices_per_node // t,
        peak_tflops=cluster.peak_tflops * t,
    )


def tensor_parallel_view(profile: Profile, cluster: Cluster, t: int, sp: bool = False) -> tuple[Profile, Cluster]:
    """The model and cluster as one tensor-parallel group of ``t`` devices sees them (see the
    module docstring); ``(profile, cluster)`` itself for ``t`` = 1."""
    if t == 1:
        if sp:
            raise PlannerInputError("sequence parallelism needs a tensor-parallel degree > 1")
        return profile, cluster
    from planner.cost import allreduce_line

    ms_per_byte, fixed_ms = allreduce_line(cluster, tuple(range(t)))
    speed = cluster.relative_speed  # collective times are on this cluster; layer times are divided by speed later
    layers = tuple(_layer_view(layer, t, sp, ms_per_byte * speed, fixed_ms * speed) for layer in profile.layers)
    edges = tuple(Edge(src=e.src, dst=e.dst, bytes_per_sample=e.bytes_per_sample / t) for e in profile.edges)
    view = dataclasses.replace(
        profile,
        layers=layers,
        edges=edges,
        tied=tuple(_tie_view(profile, tie, t) for tie in profile.tied),
        metadata={**profile.metadata, "tp_degree": t, "sequence_parallel": sp},
    )
    return view, cluster_view(cluster, t)


def real_ranks(view_ranks: Iterable[int], t: int) -> tuple[int, ...]:
    """The devices of view devices ``view_ranks``: ``v t .. v t + t - 1`` each, in rank order."""
    return tuple(sorted(v * t + k for v in view_ranks for k in range(t)))


def lift(view_plan: Plan, profile: Profile, cluster: Cluster, t: int, sp: bool, request: "PlanRequest") -> Plan:
    """A plan found in the view of ``t`` (and ``sp``) as a plan of ``cluster``'s devices:
    ranks expanded, provenance naming the real profile, cluster and ``request`` (the view's
    request counts view devices), the machine bound and FLOP figures over the real devices,
    predictions re-simulated."""
    if t == 1:
        return dataclasses.replace(view_plan, provenance=dataclasses.replace(view_plan.provenance, request=request))
    if view_plan.replicated_per_stage:
        raise PlannerInputError("per-stage replication is not combined with tensor parallelism")
    from planner.profiling.analytic.gpt import model_flops_per_sample
    from planner.simulate.bounds import machine_bound_ms
    from planner.simulate import predict

    stages = tuple(dataclasses.replace(s, ranks=real_ranks(s.ranks, t)) for s in view_plan.stages)
    prov = dataclasses.replace(
        view_plan.provenance,
        profile_sha256=codec.sha256_of(profile_to_json(profile)),
        cluster_name=cluster.name,
        cluster_sha256=codec.sha256_of(cluster_to_json(cluster)),
        request=request,
    )
    plan = dataclasses.replace(
        view_plan, provenance=prov, stages=stages, tp_degree=t, sequence_parallel=sp,
        devices_available=view_plan.devices_available * t,
        pareto=tuple(dataclasses.replace(p, tp_degree=t, sequence_parallel=sp) for p in view_plan.pareto),
    )
    num_devices = plan.num_devices
    pred = dataclasses.replace(
        plan.predicted,
        machine_bound_ms=machine_bound_ms(profile, cluster, plan.global_batch, num_devices),
        model_flops_per_iteration=model_flops_per_sample(profile) * plan.global_batch,
        device_peak_tflops=cluster.peak_tflops,
    )
    plan = dataclasses.replace(plan, predicted=pred)
    return dataclasses.replace(plan, predicted=predict(plan))


def base_cluster(cluster: Cluster, num_devices: int) -> Cluster:
    """The cluster a view of ``num_devices`` devices is taken of: part of one node when they fit
    in one, else the whole cluster."""
    return cluster.with_devices(num_devices) if num_devices <= cluster.devices_per_node else cluster


def build_tensor_parallel(
    profile: Profile, cluster: Cluster, request: "PlanRequest", *, tp_degree: int, sequence_parallel: bool,
    num_devices: int, **layout: Any,
) -> Plan:
    """:func:`planner.solve.build.build_plan` for a given layout with tensor parallelism:
    priced in the view of ``tp_degree`` (``num_devices`` real devices in all), lifted back.
    ``layout`` is build_plan's keywords (boundaries, recompute, dp_degree, ...)."""
    from planner.cost import CostModel
    from planner.solve.build import build_plan

    why = refusal(profile, cluster, num_devices, tp_degree)
    if why:
        raise PlannerInputError(why)
    vp, vc = tensor_parallel_view(profile, base_cluster(cluster, num_devices), tp_degree, sequence_parallel)
    view_request = dataclasses.replace(request, num_devices=num_devices // tp_degree)
    built = build_plan(CostModel(vp, vc, request.optimizer), view_request, **layout)
    return lift(built, profile, cluster, tp_degree, sequence_parallel, request)

