"""Assemble a Plan from a partition: price every stage with the cost model, then replay the
schedule in the event simulator for the plan's ``predicted`` figures."""

from __future__ import annotations

import dataclasses
import weakref
from typing import Sequence

from planner import __version__
from planner.artifacts import codec
from planner.artifacts.cluster import Cluster, cluster_to_json
from planner.artifacts.plan import Plan, PlanStage, Prediction, Provenance
from planner.artifacts.profile import profile_to_json
from planner.artifacts.request import PlanRequest, ScheduleKind
from planner.profiling.analytic.gpt import model_flops_per_sample
from planner.simulate.bounds import machine_bound_ms
from planner.cost import CostModel, layout_ranks
from planner.solve.chain_dp import inflight_counts


_SHAS: "weakref.WeakKeyDictionary[CostModel, tuple[str, str]]" = weakref.WeakKeyDictionary()


def artifact_shas(cm: CostModel) -> tuple[str, str]:
    """sha256 of the canonical JSON of the profile and the cluster (computed once per model)."""
    if cm not in _SHAS:
        _SHAS[cm] = (codec.sha256_of(profile_to_json(cm.profile)), codec.sha256_of(cluster_to_json(cm.cluster)))
    return _SHAS[cm]


def memory_cap_bytes(cluster: Cluster, request: PlanRequest) -> int:
    """The per-device memory the plan may use: an explicit cap, or device memory less headroom."""
    if request.memory_cap_bytes:
        return request.memory_cap_bytes
    return int(cluster.device_memory_bytes * (1.0 - request.memory_headroom_fraction))


def build_plan(
    cm: CostModel,
    request: PlanRequest,
    *,
    boundaries: Sequence[int],
    recompute: Sequence[Sequence[int]],
    dp_degree: int,
    microbatch_size: int,
    schedule: ScheduleKind,
    solver: str,
    virtual_stages_per_rank: int = 1,
    zero: int = 0,
    replicas: Sequence[int] = (),
) -> Plan:
    """A complete Plan (stages priced, predictions from the simulator) for one partition.

    ``boundaries`` are the stage start layers (the first is 0); ``recompute`` the recomputed
    layer indices of each stage; ``zero`` the ZeRO stage; ``replicas`` each stage's copies
    inside the pipeline (per-stage replication, with ``dp_degree`` 1; empty: one each).
    """
    profile, cluster = cm.profile, cm.cluster
    num_stages = len(boundaries)
    global_batch = request.global_batch
    num_microbatches = global_batch // (dp_degree * microbatch_size)
    v = virtual_stages_per_rank
    pr = num_stages // v if v > 1 else 0
    reps = tuple(replicas) if replicas and max(replicas) > 1 else ()
    ks = inflight_counts(schedule, num_stages, num_microbatches, v, reps)
    layout = layout_ranks(num_stages, dp_degree, pr, reps)
    stops = list(boundaries[1:]) + [cm.num_layers]
    cap = memory_cap_bytes(cluster, request)
    stages = []
    for s, (start, stop) in enumerate(zip(boundaries, stops)):
        rc = tuple(sorted(recompute[s]))
        cost = cm.stage_cost(start, stop, rc, microbatch_size, ks[s], s, dp_degree, pr, zero=zero,
                             ranks=layout if reps else None)
        stages.append(
            PlanStage(
                stage_idx=s,
                layer_start=start,
                layer_stop=stop,
                layer_names=profile.layer_names[start:stop],
                ranks=layout[s],
                replicas=reps[s] if reps else 1,
                recompute=rc,
                inflight_microbatches=ks[s],
                activation_bytes_per_microbatch=cost.activation_bytes_per_microbatch,
                fwd_ms=cost.fwd_ms,
                bwd_ms=cost.bwd_ms,
                recompute_ms=cost.recompute_ms,
                send_fwd_ms=cost.send_fwd_ms,
                send_bwd_ms=cost.send_bwd_ms,
                allreduce_ms=cost.allreduce_ms,
                memory=cost.memory,
                memory_total_bytes=cost.memory.total_bytes,
                memory_cap_bytes=cap,
            )
        )
    provenance = Provenance(
        model=profile.model,
        profile_sha256=artifact_shas(cm)[0],
        cluster_name=cluster.name,
        cluster_sha256=artifact_shas(cm)[1],
        planner_version=__version__,
        solver=solver,
        request=request,
        fingerprint_sha256=profile.fingerprint_sha256,
    )
    draft = Plan(
        provenance=provenance,
        num_stages=num_stages,
        dp_degree=dp_degree,
        num_microbatches=num_microbatches,
        microbatch_size=microbatch_size,
        global_batch=global_batch,
        schedule=schedule,
        virtual_stages_per_rank=v,
        zero=zero,
        dtype=profile.dtype,
        optimizer=request.optimizer.value,
        stages=tuple(stages),
        predicted=Prediction.unset(max(st.memory_total_bytes for st in stages)),
    )
    num_devices = draft.num_devices
    draft = dataclasses.replace(
        draft,
        predicted=dataclasses.replace(
            draft.predicted,
            machine_bound_ms=machine_bound_ms(profile, cluster, global_batch, num_devices),
            model_flops_per_iteration=model_flops_per_sample(profile) * global_batch,
            device_peak_tflops=cluster.peak_tflops,
        ),
    )
    from planner.simulate import predict

    return dataclasses.replace(draft, predicted=predict(draft))
