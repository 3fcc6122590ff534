"""Selection: the plan the objective prefers among the plans built (:func:`planner.solve.build.build_best`),
and the (iteration time, peak memory) Pareto front found on the way.

A plan on fewer devices than were available wins only by simulated time (on equal time the one
on more devices); the chosen plan records the best time found on all of them
(``predicted.all_devices_ms``, :func:`note_devices`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from planner.artifacts.kinds import MEMORY_OBJECTIVE_FACTOR, Objective, ScheduleKind
from planner.artifacts.plan import Plan
from planner.artifacts.plan_summary import ParetoPoint
from planner.artifacts.request import PlanRequest


def tie_key(plan: Plan) -> tuple[float, int, int, int, str]:
    # on equal time the plan on more devices (all of them, as asked) wins
    return (plan.predicted.iteration_ms, -plan.num_devices, plan.layout.num_stages, -plan.microbatch_size,
            plan.schedule.value)


def pareto_point(plan: Plan) -> ParetoPoint:
    """The front's row for one plan: its predicted time and memory, and its layout."""
    lay = plan.layout
    return ParetoPoint(
        iteration_ms=plan.predicted.iteration_ms,
        peak_memory_bytes=plan.predicted.peak_memory_bytes,
        num_stages=lay.num_stages,
        dp_degree=lay.dp_degree,
        microbatch_size=plan.microbatch_size,
        schedule=plan.schedule,
        num_recomputed_layers=sum(len(s.recompute) + len(s.recompute_selective) for s in plan.stages),
        zero=lay.zero,
        stage_replicas=lay.stage_replicas,
        tp_degree=lay.tp_degree,
        sequence_parallel=lay.sequence_parallel,
        cp_degree=lay.cp_degree,
    )


def pareto_front(plans: list[Plan]) -> tuple[ParetoPoint, ...]:
    """Non-dominated (iteration time, peak memory) points, fastest first."""
    pts = sorted(plans, key=lambda p: (p.predicted.iteration_ms, p.predicted.peak_memory_bytes))
    front: list[ParetoPoint] = []
    best_mem: int | None = None
    for p in pts:
        if best_mem is None or p.predicted.peak_memory_bytes < best_mem:
            best_mem = p.predicted.peak_memory_bytes
            front.append(pareto_point(p))
    return tuple(front)


def merge_pareto(points: Iterable[ParetoPoint]) -> tuple[ParetoPoint, ...]:
    """The non-dominated points among several fronts (e.g. one per tensor-parallel degree)."""
    front: list[ParetoPoint] = []
    best_mem: int | None = None
    for p in sorted(points, key=lambda p: (p.iteration_ms, p.peak_memory_bytes, p.tp_degree)):
        if best_mem is None or p.peak_memory_bytes < best_mem:
            best_mem = p.peak_memory_bytes
            front.append(p)
    return tuple(front)


def select(plans: list[Plan], request: PlanRequest, reference: Plan | None = None) -> Plan:
    """The plan the request's objective prefers among ``plans``, noting the best plan on all
    the devices when it uses fewer (:func:`note_devices`); ``reference``: the ME index's, searched
    on its own (:func:`planner.solve.search.me_reference`; None: the fastest GPipe plan without
    recomputation among ``plans``, else the fastest of them)."""
    return note_devices(_select(plans, request, reference), plans)


def chosen(plans: list[Plan], request: PlanRequest, reference: Plan | None = None,
           points: Iterable[ParetoPoint] | None = None) -> Plan:
    """:func:`select`'s plan with its Pareto front: that of ``plans`` (:func:`pareto_front`), or
    the one merged from ``points`` (:func:`merge_pareto`: several searches' fronts)."""
    front = pareto_front(plans) if points is None else merge_pareto(points)
    return dataclasses.replace(select(plans, request, reference), pareto=front)


def note_devices(best: Plan, plans: list[Plan]) -> Plan:
    """``best`` with ``predicted.all_devices_ms``: when it occupies fewer devices than were
    available, the fastest of ``plans`` on all of them (or the best such that any of them
    noted); 0 otherwise."""
    n = best.devices_available
    found = 0.0
    if n and best.num_devices < n:
        times = [p.predicted.iteration_ms for p in plans if p.num_devices == n]
        times += [p.predicted.all_devices_ms for p in plans if p.predicted.all_devices_ms > 0]
        found = min(times, default=0.0)
    if found == best.predicted.all_devices_ms:
        return best
    return dataclasses.replace(best, predicted=dataclasses.replace(best.predicted, all_devices_ms=found))


def _select(plans: list[Plan], request: PlanRequest, reference: Plan | None) -> Plan:
    fastest = min(plans, key=tie_key)
    if request.objective is Objective.TIME:
        return fastest
    if request.objective is Objective.MEMORY:
        budget = request.time_budget_ms or fastest.predicted.iteration_ms * MEMORY_OBJECTIVE_FACTOR
        within = [p for p in plans if p.predicted.iteration_ms <= budget] or [fastest]
        return min(within, key=lambda p: (p.predicted.peak_memory_bytes,) + tie_key(p))
    # ME index against the fastest GPipe plan without recomputation (the seed's baseline)
    refs = [p for p in plans if p.schedule is ScheduleKind.GPIPE and not any(s.recompute or s.recompute_selective for s in p.stages)]
    ref = reference or (min(refs, key=tie_key) if refs else fastest)

    def me(p: Plan) -> float:
        return (ref.predicted.iteration_ms / p.predicted.iteration_ms) / (
            p.predicted.peak_memory_bytes / ref.predicted.peak_memory_bytes
        )

    best = max(plans, key=lambda p: (me(p), -p.predicted.iteration_ms))
    pred = dataclasses.replace(best.predicted, me_index=me(best), me_reference="fastest gpipe plan without recompute")
    return dataclasses.replace(best, predicted=pred)
