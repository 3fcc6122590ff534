"""Assemble a Plan from a partition under a layout (for a :class:`~planner.solve.problem.Problem`):
price every stage with the cost model, then replay the schedule in the event simulator for the
plan's ``predicted`` figures; the plans of a search's best candidates (:func:`build_best`), each
at the least ZeRO stage that keeps its time (:func:`least_zero`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from planner import __version__
from planner.artifacts.caches import Cache
from planner.artifacts.cluster import Cluster
from planner.artifacts.errors import InfeasibleError
from planner.artifacts.kinds import Objective, ScheduleKind, SolverKind
from planner.artifacts.layout import Layout
from planner.artifacts.plan import Plan, PlanStage
from planner.artifacts.plan_summary import Prediction, Provenance
from planner.artifacts.profile import Profile
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel, price_stage
from planner.cost.groups import base_cluster
from planner.cost.overheads import straggler_fraction
from planner.cost.tensor_parallel import device_cost_model
from planner.cost.ties import on_ranks
from planner.schedule import held_counts
from planner.simulation.bounds import machine_bound_ms
from planner.simulation.predict import predict
from planner.solve.candidates import Candidate, Scored, fits, simulated
from planner.solve.held import held_memory
from planner.solve.problem import Problem

GIB = 1024**3


#: :func:`machine_bound_of` by (profile, cluster, global batch, devices)
_MACHINE_BOUNDS: Cache[tuple[str, str, int, int], float] = Cache(
    "solve.build.machine_bounds", key="(profile sha256, cluster sha256, global batch, devices)", bound=256)


def machine_bound_of(problem: Problem, num_devices: int) -> float:
    """:func:`planner.simulation.bounds.machine_bound_ms` of the problem's model, cluster and
    global batch on ``num_devices`` (worked out once per problem and count: every plan built)."""
    key = (problem.profile_sha256, problem.cluster_sha256, problem.request.global_batch, num_devices)
    found = _MACHINE_BOUNDS.get(key)
    if found is None:
        found = _MACHINE_BOUNDS.put(key, machine_bound_ms(problem.profile, problem.cluster,
                                                          problem.request.global_batch, num_devices))
    return found


def build_plan(
    problem: Problem,
    cm: CostModel,
    *,
    layout: Layout,
    boundaries: Sequence[int],
    recompute: Sequence[Sequence[int]],
    microbatch_size: int,
    schedule: ScheduleKind,
    selective: Sequence[Sequence[int]] = (),
) -> Plan:
    """A complete Plan (stages priced by ``cm`` under ``layout``, predictions from the
    simulator) for one partition: ``boundaries`` are the stage start layers (the first is 0),
    ``recompute`` the fully and ``selective`` the selectively recomputed layer indices of each
    stage (``()``: none anywhere)."""
    request = problem.request
    cm = on_ranks(cm, layout, boundaries)  # a tie inside one rank: one copy, no exchange
    num_microbatches = request.global_batch // (layout.dp_degree * microbatch_size)
    held = held_counts(schedule, layout, num_microbatches)
    stops = list(boundaries[1:]) + [cm.num_layers]
    cap = problem.cap_bytes
    stages = []
    split = schedule.splits_backward
    for s, (start, stop) in enumerate(zip(boundaries, stops)):
        rc = tuple(sorted(recompute[s]))
        sel = tuple(sorted(selective[s])) if selective else ()
        terms = price_stage(cm, start, stop, microbatch_size, s, layout, recompute=rc, selective=sel,
                            split_backward=split)
        memory = held_memory(cm, start, stop, rc, microbatch_size, held[s], layout.sharding(s), sel)
        activation = int(round(cm.activation_bytes(start, stop, rc, microbatch_size, sel)))
        stages.append(
            PlanStage(
                stage_idx=s,
                layer_start=start,
                layer_stop=stop,
                layer_names=problem.profile.layer_names[start:stop],
                ranks=layout.stage_ranks(s),
                replicas=layout.replicas_of(s),
                recompute=rc,
                recompute_selective=sel,
                inflight_microbatches=held[s].inflight,
                activation_bytes_per_microbatch=activation,
                fwd_ms=terms.fwd_ms,
                bwd_ms=terms.bwd_ms,
                recompute_ms=terms.recompute_ms,
                send_fwd_ms=terms.send_fwd_ms,
                send_bwd_ms=terms.send_bwd_ms,
                allreduce_ms=terms.allreduce_ms,
                sync_early_ms=terms.sync_early_ms,
                gather_ahead_ms=terms.gather_ahead_ms,
                gather_bound_ms=terms.gather_bound_ms,
                optimizer_ms=terms.optimizer_ms,
                wgrad_ms=terms.wgrad_ms,
                wgrad_bytes_per_microbatch=int(round(cm.keep_bytes(start, stop, microbatch_size))) if split else 0,
                alltoall_ms=terms.alltoall_ms,
                memory=memory,
                memory_total_bytes=memory.total_bytes,
                memory_cap_bytes=cap,
            )
        )
    profile, cluster = problem.profile, problem.cluster
    provenance = Provenance(
        model=profile.model,
        profile_sha256=problem.profile_sha256,
        cluster_name=cluster.name,
        cluster_sha256=problem.cluster_sha256,
        planner_version=__version__,
        solver=problem.solver,
        request=request,
        fingerprint_sha256=profile.fingerprint_sha256,
    )
    draft = Plan(
        provenance=provenance,
        layout=layout,
        num_microbatches=num_microbatches,
        microbatch_size=microbatch_size,
        global_batch=request.global_batch,
        schedule=schedule,
        dtype=profile.dtype,
        optimizer=request.optimizer,
        devices_available=problem.devices_available,
        stack=cm.stack,
        stages=tuple(stages),
        predicted=Prediction.unset(max(st.memory_total_bytes for st in stages)),
    )
    draft = dataclasses.replace(
        draft,
        predicted=dataclasses.replace(
            draft.predicted,
            # on every device available, not the plan's own: no plan on them runs faster (a plan on
            # half of them is at most half the machine)
            machine_bound_ms=machine_bound_of(problem, max(problem.devices_available, layout.world_size)),
            model_flops_per_iteration=profile.model_flops_per_sample * request.global_batch,
            device_peak_tflops=cluster.peak_tflops,
            straggler_fraction=straggler_fraction(cluster, layout.world_size),
        ),
    )
    return dataclasses.replace(draft, predicted=predict(draft))


def rebuild_plan(
    profile: Profile, cluster: Cluster, request: PlanRequest, *, layout: Layout, boundaries: Sequence[int],
    recompute: Sequence[Sequence[int]], microbatch_size: int, schedule: ScheduleKind, solver: SolverKind,
    selective: Sequence[Sequence[int]] = (),
) -> Plan:
    """A plan of a given layout and partition priced from scratch (calibration re-prices plans
    this way, ``benchmarks/published_runs.py`` prices published runs so): the cost model of
    one device of ``layout``'s tensor-parallel group; ``recompute`` / ``selective`` the fully /
    selectively recomputed layers of each stage."""
    n = layout.world_size
    cm = device_cost_model(profile, base_cluster(cluster, n), request.optimizer, layout.group, request.stack)
    problem = Problem.of(profile, cluster, request, solver, request.num_devices or n)
    return build_plan(problem, cm, layout=layout, boundaries=boundaries, recompute=recompute,
                      microbatch_size=microbatch_size, schedule=schedule, selective=selective)


def plan_of(problem: Problem, cm: CostModel, cand: Candidate) -> Plan:
    """The Plan of a candidate."""
    c = cand.config
    return build_plan(problem, cm, layout=c.layout, boundaries=cand.solution.boundaries,
                      recompute=cand.solution.recompute, microbatch_size=c.microbatch_size, schedule=c.schedule,
                      selective=cand.solution.selective)


def build_best(problem: Problem, cm: CostModel, scored: list[Scored], keep: int, refuse: bool = True) -> list[Plan]:
    """Full Plans (Timeline-based predictions) for the ``keep`` fastest candidates, each with
    the least ZeRO stage that keeps its time. The search's memory tables fit every candidate in
    the cap; a plan whose simulated peak is over it all the same (the tables and the simulator
    disagree) is never returned: the next candidate takes its place, and where none is left
    (with ``refuse``) the search refuses naming the disagreement (:func:`over_cap`)."""
    cap = problem.cap_bytes
    plans: list[Plan] = []
    over: list[Plan] = []
    for _, cand in scored:
        if len(plans) >= keep:
            break
        plan = plan_of(problem, cm, least_zero(cm, problem.request, cand, cap))
        (over if plan.predicted.peak_memory_bytes > cap else plans).append(plan)
    if over and not plans and refuse:
        raise over_cap(over[0], cap)
    return plans


def least_zero(cm: CostModel, request: PlanRequest, cand: Candidate, cap: float) -> Candidate:
    """``cand`` with the least ZeRO stage the request allows under which its partition and
    recomputation still fit ``cap`` and it simulates no slower (for the time objective: the
    memory objectives keep the deepest sharding, which is what they minimise)."""
    c = cand.config
    if not c.layout.zero or request.objective is not Objective.TIME:
        return cand
    base = simulated(cm, cand)
    for z in sorted(request.zero_stages):
        if z >= c.layout.zero:
            break
        lower = Candidate(c.zero_variants(cm.cluster.devices_per_node).by_stage[z], cand.solution)
        if fits(cm, lower.config, cand.solution, cap) and simulated(cm, lower) <= base * (1 + 1e-12):
            return lower
    return cand


def over_cap(plan: Plan, cap: float) -> InfeasibleError:
    """The refusal of a plan the search's memory tables fit in ``cap`` and the simulator does not
    (one line: the plan's layout, its simulated peak and the cap)."""
    lay = plan.layout
    return InfeasibleError(
        f"the search's plan (T={lay.tp_degree} x {lay.num_stages} stages on P={lay.pipeline_size} x D={lay.dp_degree}, "
        f"{plan.schedule.value}, M={plan.num_microbatches} x {plan.microbatch_size}) fits the cap of {cap / GIB:.2f} GiB "
        f"by its memory tables but peaks at {plan.predicted.peak_memory_bytes / GIB:.2f} GiB by the simulator: "
        f"the two disagree (a planner defect; please report it)", need_bytes=float(plan.predicted.peak_memory_bytes))
