"""Build small Plans directly from per-stage numbers, for the schedule/simulator/bounds tests."""

from __future__ import annotations

from collections.abc import Sequence

from planner.artifacts.kinds import ScheduleKind, SolverKind
from planner.artifacts.layout import Layout
from planner.artifacts.plan import Plan, PlanStage, StageMemory
from planner.artifacts.plan_summary import Prediction, Provenance
from planner.artifacts.request import PlanRequest
from planner.cost.stage import StageTerms


def stage_terms(
    fwd_ms: Sequence[float],
    bwd_ms: Sequence[float],
    recompute_ms: Sequence[float] | None = None,
    send_fwd_ms: Sequence[float] | None = None,
    send_bwd_ms: Sequence[float] | None = None,
    allreduce_ms: Sequence[float] | None = None,
    *,
    wgrad_ms: Sequence[float] | None = None,
) -> list[StageTerms]:
    """One :class:`StageTerms` per stage from per-stage columns (None: zeros)."""
    n = len(fwd_ms)
    z = [0.0] * n
    cols = [c if c is not None else z for c in (recompute_ms, send_fwd_ms, send_bwd_ms, allreduce_ms, wgrad_ms)]
    if any(len(c) != n for c in [bwd_ms, *cols]):
        raise ValueError(f"every column needs {n} entries (one per stage)")
    return [StageTerms(fwd_ms=fwd_ms[s], bwd_ms=bwd_ms[s], recompute_ms=cols[0][s], send_fwd_ms=cols[1][s],
                       send_bwd_ms=cols[2][s], allreduce_ms=cols[3][s], wgrad_ms=cols[4][s]) for s in range(n)]


def make_plan(
    kind: ScheduleKind,
    num_microbatches: int,
    fwd_ms: Sequence[float],
    bwd_ms: Sequence[float],
    *,
    recompute_ms: Sequence[float] | None = None,
    send_fwd_ms: Sequence[float] | None = None,
    send_bwd_ms: Sequence[float] | None = None,
    allreduce_ms: Sequence[float] | None = None,
    activation_bytes: Sequence[int] | None = None,
    static_bytes: Sequence[int] | None = None,
    workspace_bytes: Sequence[int] | None = None,
    virtual_stages_per_rank: int = 1,
    dp_degree: int = 1,
) -> Plan:
    n = len(fwd_ms)
    zeros = [0.0] * n
    rc = list(recompute_ms) if recompute_ms is not None else zeros
    act = list(activation_bytes) if activation_bytes is not None else [1000] * n
    static = list(static_bytes) if static_bytes is not None else [4000] * n
    work = list(workspace_bytes) if workspace_bytes is not None else [0] * n
    stages = []
    for s in range(n):
        memory = StageMemory(
            param_bytes=static[s] // 4,
            grad_bytes=static[s] // 4,
            optimizer_bytes=static[s] // 4,
            activation_bytes=act[s] * num_microbatches,
            recompute_workspace_bytes=work[s],
            buffer_bytes=static[s] - 3 * (static[s] // 4),
        )
        stages.append(
            PlanStage(
                stage_idx=s,
                layer_start=s,
                layer_stop=s + 1,
                layer_names=(f"layer{s}",),
                ranks=Layout(num_stages=n, virtual_stages_per_rank=virtual_stages_per_rank,
                             dp_degree=dp_degree, placement=kind.placement).stage_ranks(s),
                recompute=(s,) if rc[s] > 0 else (),
                inflight_microbatches=num_microbatches,
                activation_bytes_per_microbatch=act[s],
                fwd_ms=float(fwd_ms[s]),
                bwd_ms=float(bwd_ms[s]),
                recompute_ms=float(rc[s]),
                send_fwd_ms=float((send_fwd_ms or zeros)[s]),
                send_bwd_ms=float((send_bwd_ms or zeros)[s]),
                allreduce_ms=float((allreduce_ms or zeros)[s]),
                memory=memory,
                memory_total_bytes=memory.total_bytes,
                memory_cap_bytes=10**12,
            )
        )
    return hand_plan(
        stages,
        dp_degree=dp_degree,
        num_microbatches=num_microbatches,
        microbatch_size=1,
        schedule=kind,
        virtual_stages_per_rank=virtual_stages_per_rank,
        model="toy",
        cluster_name="toy",
        sha="0" * 64,
    )


def hand_plan(
    stages: list[PlanStage],
    *,
    dp_degree: int,
    num_microbatches: int,
    microbatch_size: int,
    schedule: ScheduleKind,
    virtual_stages_per_rank: int = 1,
    model: str = "toy",
    cluster_name: str = "toy",
    sha: str = "",
    fingerprint: str = "",
    tp_degree: int = 1,
    sequence_parallel: bool = False,
    cp_degree: int = 1,
) -> Plan:
    """A Plan around hand-made stages, with zero predictions (tests fill in what they need);
    ``tp_degree`` tensor-parallel (``cp_degree`` context-parallel) devices per stage replica
    (the stages' ranks must list them)."""
    global_batch = num_microbatches * microbatch_size * dp_degree
    layout = Layout(num_stages=len(stages), virtual_stages_per_rank=virtual_stages_per_rank, dp_degree=dp_degree,
                    stage_replicas=tuple(st.replicas for st in stages), tp_degree=tp_degree,
                    sequence_parallel=sequence_parallel, cp_degree=cp_degree, placement=schedule.placement)
    return Plan(
        provenance=Provenance(
            model=model,
            profile_sha256=sha,
            cluster_name=cluster_name,
            cluster_sha256=sha,
            planner_version="test",
            solver=SolverKind.GIVEN,
            request=PlanRequest(global_batch=global_batch, num_devices=layout.world_size),
            fingerprint_sha256=fingerprint,
        ),
        layout=layout,
        num_microbatches=num_microbatches,
        microbatch_size=microbatch_size,
        global_batch=global_batch,
        schedule=schedule,
        stages=tuple(stages),
        predicted=Prediction.unset(),
    )
