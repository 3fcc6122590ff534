"""A chosen plan's account: the overhead terms its iteration includes and the band its inputs
leave it (issue 47), each worked out by pricing the same plan again -- its layout, partition,
recomputation, micro-batch and schedule as they are, nothing re-searched:

- each overhead term of :mod:`planner.cost.overheads` is the iteration with the term priced less
  the iteration without it (the cluster's collectives as alpha-beta rings, its send/receive
  latency across nodes the link's, the stack's host time per kernel 0); the straggler share is
  the simulated replay's ``straggler_fraction`` (exactly additive);
- the band (:mod:`planner.cost.band`): the plan priced with each uncertain input at the ends of
  its range, deviations added in quadrature; its memory top is the peak plus what the process
  holds outside the allocator.

Run once per plan a user gets (:func:`planner.solve.plan`), not per candidate of a search.
"""

from __future__ import annotations

import dataclasses

from planner.artifacts.cluster import Cluster
from planner.artifacts.kinds import CollectiveModel, OverheadKind
from planner.artifacts.plan import Plan
from planner.artifacts.plan_summary import Band, OverheadTerm
from planner.artifacts.profile import Profile
from planner.artifacts.request import PlanRequest
from planner.artifacts.stack import Stack
from planner.cost.band import band_ends, band_of
from planner.cost.offload import plan_profile
from planner.solve.build import rebuild_plan

__all__ = ["reprice", "with_accounts"]


def reprice(plan: Plan, profile: Profile, cluster: Cluster, request: PlanRequest, stack: Stack) -> Plan:
    """``plan`` priced again from scratch on ``profile`` and ``cluster`` under ``stack``."""
    stages = plan.stages
    return rebuild_plan(plan_profile(plan, profile), cluster, dataclasses.replace(request, stack=stack), layout=plan.layout,
                        boundaries=[s.layer_start for s in stages], recompute=[s.recompute for s in stages],
                        selective=[s.recompute_selective for s in stages], microbatch_size=plan.microbatch_size,
                        schedule=plan.schedule, solver=plan.provenance.solver)


def _overheads(plan: Plan, profile: Profile, cluster: Cluster, request: PlanRequest, nominal: float) -> list[OverheadTerm]:
    stack = plan.stack
    off: list[tuple[OverheadKind, Cluster, Stack, str]] = []
    if cluster.collective_model is CollectiveModel.NCCL:
        off.append((OverheadKind.NCCL_COLLECTIVES, dataclasses.replace(cluster, collective_model=CollectiveModel.ALPHA_BETA),
                    stack, cluster.sources.get("collective_model", "NCCL's tuning model")))
    if cluster.num_nodes > 1 and cluster.inter_node_p2p_latency_us:
        off.append((OverheadKind.P2P_LATENCY, dataclasses.replace(cluster, inter_node_p2p_latency_us=0.0), stack,
                    cluster.sources.get("inter_node_p2p_latency_us", "the cluster's send/receive latency")))
    if (stack.host_us_per_kernel or stack.moe.prices_host) and profile.source == "analytic":
        src = stack.source_of("host_us_per_kernel") or f"{stack.host_us_per_kernel:g} us per kernel"
        if stack.moe.prices_host:
            src += f"; {stack.source_of('moe.host_ms_per_layer') or 'the MoE layers host time'}"
        host_off = dataclasses.replace(stack, host_us_per_kernel=0.0, moe=dataclasses.replace(
            stack.moe, host_ms_per_layer=0.0, alltoall_host_ms_per_local_expert=0.0, fp8_host_us_per_expert_gemm=0.0))
        off.append((OverheadKind.HOST, cluster, host_off, src))
    terms = [OverheadTerm(kind=kind, ms=nominal - reprice(plan, profile, c, request, s).predicted.iteration_ms,
                          source=src) for kind, c, s, src in off]
    f = plan.predicted.straggler_fraction
    if f:
        terms.append(OverheadTerm(kind=OverheadKind.STRAGGLER, ms=plan.predicted.iteration_ms * f / (1.0 + f),
                                  source=cluster.sources.get("gpu_speed_variation", "the cluster's GPU speed variation")))
    return terms


def _band(plan: Plan, profile: Profile, cluster: Cluster, request: PlanRequest, nominal: float) -> Band:
    t = plan.predicted.iteration_ms
    priced = [(entry, [t * end if isinstance(end, float) else t + reprice(plan, *end[:2], request, end[2]).predicted.iteration_ms - nominal
                       for end in ends]) for entry, ends in band_ends(profile, cluster, plan.stack)]
    return band_of(t, priced, plan.predicted.peak_memory_bytes, cluster)


def with_accounts(plan: Plan, profile: Profile, cluster: Cluster, request: PlanRequest | None = None) -> Plan:
    """``plan`` with its overhead terms and band in its prediction (module docstring)."""
    request = request or plan.provenance.request
    nominal = reprice(plan, profile, cluster, request, plan.stack).predicted.iteration_ms
    predicted = dataclasses.replace(plan.predicted, overheads=tuple(_overheads(plan, profile, cluster, request, nominal)),
                                    band=_band(plan, profile, cluster, request, nominal))
    return dataclasses.replace(plan, predicted=predicted)
