"""Less recomputation where the chosen plan's devices have room for it (issue 47).

Why the search can recompute more than a plan needs: it checks memory one model chunk at a
time, each at its own peak (:func:`planner.schedule.inflight_counts`), and an interleaved rank
must fit the sum of its chunks' peaks, which do not coincide: the simulated peak of the rank is
lower (a Llama-3-405B-sized model on 128 H100s with two chunks per rank: 76.4 GiB summed for a
simulated 73.7). Above 64 candidate layers of several kinds its recompute cover is a greedy
upper bound, too. Either way the chosen plan can leave memory unused that less recomputation
would fill, faster.

So the chosen plan's recomputation is relaxed against the simulator, its layout, partition,
micro-batch and schedule unchanged: each pipeline rank's recomputed layers are ordered by the
recompute ms a step saves per byte it adds (a fully recomputed layer with an attention core
first to selective, then to none; others straight to none), and the longest prefix of those
steps whose simulated peak of the rank still fits the cap is taken -- by bisection, every rank
at once (a rank's memory depends on its own chunks and the schedule's order only). The relaxed
plan is kept if it fits and is no slower (for the time objective only: the others weigh memory
too), with the search's Pareto front and figures on all devices.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner.artifacts.cluster import Cluster
from planner.artifacts.kinds import Objective
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.cost.groups import base_cluster
from planner.cost.tensor_parallel import device_cost_model
from planner.simulation import simulate
from planner.solve.build import rebuild_plan
from planner.solve.problem import memory_cap_bytes

__all__ = ["relax_recompute"]


@dataclass(frozen=True, slots=True)
class _Step:
    stage_idx: int
    layer: int
    to: str  # "selective" or "none"
    key: float  # ms saved per byte added (larger first)


def _steps(cm: CostModel, plan: Plan, rank: int) -> list[_Step]:
    """Rank ``rank``'s relaxation steps, best first (module docstring)."""
    b = plan.microbatch_size
    fwd, _ = cm.at_batch(b).times_ms
    core, saved, core_bytes = cm.at_batch(b).core_ms, cm.at_batch(b).saved_bytes, cm.at_batch(b).core_bytes
    steps: list[tuple[float, int, _Step]] = []
    for s in plan.layout.stage_indices(rank):
        stage = plan.stages[s]
        k = max(1, stage.inflight_microbatches)
        for layer in stage.recompute:
            kept = float(cm.input_per_sample[layer]) * b
            if cm.has_core[layer]:
                first = (float(fwd[layer] - core[layer])) / max(1.0, k * (float(saved[layer] - core_bytes[layer]) - kept))
                second = float(core[layer]) / max(1.0, k * float(core_bytes[layer]))
                steps.append((first, len(steps), _Step(s, layer, "selective", first)))
                steps.append((min(first, second), len(steps), _Step(s, layer, "none", min(first, second))))
            else:
                ratio = float(fwd[layer]) / max(1.0, k * (float(saved[layer]) - kept))
                steps.append((ratio, len(steps), _Step(s, layer, "none", ratio)))
        for layer in stage.recompute_selective:
            ratio = float(core[layer]) / max(1.0, k * float(core_bytes[layer]))
            steps.append((ratio, len(steps), _Step(s, layer, "none", ratio)))
    return [step for _, _, step in sorted(steps, key=lambda t: (-t[0], t[1]))]


def _with_steps(plan: Plan, steps: list[_Step]) -> tuple[list[list[int]], list[list[int]]]:
    """Each stage's fully and selectively recomputed layers after ``steps``."""
    full = [set(s.recompute) for s in plan.stages]
    sel = [set(s.recompute_selective) for s in plan.stages]
    for step in steps:
        full[step.stage_idx].discard(step.layer)
        sel[step.stage_idx].discard(step.layer)
        if step.to == "selective":
            sel[step.stage_idx].add(step.layer)
    return [sorted(f) for f in full], [sorted(x) for x in sel]


def relax_recompute(plan: Plan, profile: Profile, cluster: Cluster, request: PlanRequest) -> Plan:
    """``plan`` with less recomputation where its ranks' simulated peaks leave room (module
    docstring); ``plan`` itself when nothing can be relaxed."""
    lay = plan.layout
    if (lay.stage_replicas or request.objective is not Objective.TIME
            or not any(s.recompute or s.recompute_selective for s in plan.stages)):
        return plan
    cap = memory_cap_bytes(cluster, request)
    cm = device_cost_model(profile, base_cluster(cluster, lay.world_size), request.optimizer, lay.group, plan.stack)
    ranks = range(lay.pipeline_size)
    steps = {r: _steps(cm, plan, r) for r in ranks}
    lo = {r: 0 for r in ranks}
    hi = {r: len(steps[r]) for r in ranks}

    def build(prefix: dict[int, int]) -> Plan:
        full, sel = _with_steps(plan, [st for r in ranks for st in steps[r][:prefix[r]]])
        return rebuild_plan(profile, cluster, request, layout=lay, boundaries=[s.layer_start for s in plan.stages],
                            recompute=full, selective=sel, microbatch_size=plan.microbatch_size, schedule=plan.schedule,
                            solver=plan.provenance.solver)

    while any(lo[r] < hi[r] for r in ranks):
        mid = {r: (lo[r] + hi[r] + 1) // 2 if lo[r] < hi[r] else lo[r] for r in ranks}
        peaks = simulate(build(mid)).rank_peak_memory_bytes
        for r in ranks:
            if lo[r] < hi[r]:
                lo[r], hi[r] = (mid[r], hi[r]) if peaks[r] <= cap else (lo[r], mid[r] - 1)
    if not any(lo.values()):
        return plan
    relaxed = build(lo)
    if relaxed.predicted.peak_memory_bytes > cap or relaxed.predicted.iteration_ms > plan.predicted.iteration_ms:
        return plan
    predicted = dataclasses.replace(relaxed.predicted, all_devices_ms=plan.predicted.all_devices_ms)
    return dataclasses.replace(relaxed, predicted=predicted, pareto=plan.pareto, devices_available=plan.devices_available)
