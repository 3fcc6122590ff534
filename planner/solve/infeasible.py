"""Why a request cannot be planned, and the cheapest changes that would make it fit."""

from __future__ import annotations

import math

from planner.artifacts.errors import InfeasibleError
from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.solve.chain_dp import StageTable, solve_chain
from planner.solve.space import layout_of


def _fits(cm: CostModel, request: PlanRequest, cap: float, P: int, b: int, recompute: bool) -> bool:
    table = StageTable(cm, b, cap, request.fixed_boundaries, allow_recompute=recompute)
    M = max(1, request.global_batch // b)
    return solve_chain(table, layout=layout_of(cm, P), num_microbatches=M, schedule=_leanest(P, M)) is not None


def _leanest(P: int, M: int) -> ScheduleKind:
    """The schedule holding the fewest micro-batches in flight that is valid for (P, M)."""
    return ScheduleKind.ONE_F_ONE_B if M >= P else ScheduleKind.GPIPE


def least_cap_bytes(cm: CostModel, request: PlanRequest, P: int, b: int, recompute: bool) -> float:
    """The smallest per-device memory cap under which P stages fit (bisection on the cap)."""
    lo, hi = 0.0, float(max(1, cm.total_params)) * 64 + 1e12
    while not _fits(cm, request, hi, P, b, recompute):
        hi *= 4
        if hi > 1e22:
            return math.inf
    for _ in range(40):
        mid = (lo + hi) / 2
        if _fits(cm, request, mid, P, b, recompute):
            hi = mid
        else:
            lo = mid
        if hi - lo < 1e6:
            break
    return hi


def explain_infeasible(cm: CostModel, request: PlanRequest, num_devices: int, cap: float) -> InfeasibleError:
    """An InfeasibleError naming the tightest stage, the bytes over, and what would fit."""
    P = min(num_devices // max(1, request.dp_degree), cm.num_layers)
    if request.max_stages:
        P = min(P, request.max_stages)
    if request.num_stages:
        P = request.num_stages
    b = min(request.microbatch_sizes or (1,))
    fixed = set(request.fixed_boundaries)
    if len(fixed) + 1 > P:  # only interleaved stages could start at every fixed boundary
        return InfeasibleError(
            f"--fixed-boundaries {','.join(map(str, sorted(fixed)))} need at least {len(fixed) + 1} stages: more than "
            f"the {P} pipeline ranks available, and no interleaved configuration (2 or 4 stages per rank) is valid",
            suggestions=("fewer fixed boundaries", "more devices or stages (--stages, --max-stages)"),
        )
    need = least_cap_bytes(cm, request, P, b, request.recompute)
    gib = 1024**3
    if not math.isfinite(need):
        return InfeasibleError("no partition of this profile fits any memory cap (check the profile's sizes)")
    table = StageTable(cm, b, need, request.fixed_boundaries, allow_recompute=request.recompute)
    M = max(1, request.global_batch // b)
    sol = solve_chain(table, layout=layout_of(cm, P), num_microbatches=M, schedule=_leanest(P, M))
    tight = ""
    if sol is not None:
        stops = list(sol.boundaries[1:]) + [cm.num_layers]
        k = [min(P - s, M) for s in range(P)]
        mems = [
            cm.stage_memory(a, z, sol.recompute[s], b, k[s]).total_bytes for s, (a, z) in enumerate(zip(sol.boundaries, stops))
        ]
        s = max(range(P), key=lambda i: mems[i])
        tight = (
            f" Tightest stage: stage {s} (layers {sol.boundaries[s]}..{stops[s] - 1}, "
            f"{cm.profile.layer_names[sol.boundaries[s]]}..{cm.profile.layer_names[stops[s] - 1]}) "
            f"needs {mems[s] / gib:.2f} GiB."
        )
    if need <= cap:
        return InfeasibleError(
            f"no configuration fits, although {P} stages of micro-batch {b} would need only {need / gib:.2f} GiB "
            f"per device (cap {cap / gib:.2f} GiB): a layout P x D occupies a divisor of the {num_devices} devices, "
            f"the replicas must divide the global batch ({request.global_batch}), and 1F1B needs at least as "
            "many micro-batches as stages"
            + "".join(f"; {flag} {v} was asked" for flag, v in (("--stages", request.num_stages),
                      ("--dp-degree", request.dp_degree), ("--max-stages", request.max_stages)) if v)
            + (f"; micro-batch sizes {','.join(map(str, request.microbatch_sizes))} were asked"
               if request.microbatch_sizes else "") + ".",
            suggestions=(
                f"a device count with more divisors up to {cm.num_layers} (e.g. a power of two)",
                "a global batch divisible by more replica counts",
                "allow gpipe (--schedules gpipe,1f1b)",
            ),
        )
    over = need - cap
    msg = (
        f"no plan fits: even with {P} pipeline stages, micro-batch size {b}, 1F1B"
        f"{' and recomputation' if request.recompute else ''}, a device needs {need / gib:.2f} GiB "
        f"but the cap is {cap / gib:.2f} GiB ({over / gib:.2f} GiB = {int(over)} bytes over).{tight}"
    )
    suggestions = []
    for mult in (2, 4, 8, 16):
        more = min(cm.num_layers, P * mult)
        if more == P:
            break
        if least_cap_bytes(cm, request, more, b, request.recompute) <= cap:
            suggestions.append(f"more devices: {num_devices * mult} (allows {more} pipeline stages)")
            break
    if not request.recompute:
        with_rc = least_cap_bytes(cm, request, P, b, True)
        if with_rc <= cap:
            suggestions.append(f"allow recomputation (needs {with_rc / gib:.2f} GiB per device)")
    if b > 1:
        suggestions.append("a smaller micro-batch size (--microbatch-sizes 1)")
    if request.memory_headroom_fraction > 0 and not request.memory_cap_bytes and need <= cm.cluster.device_memory_bytes:
        suggestions.append(f"less memory headroom (now {request.memory_headroom_fraction:.0%})")
    suggestions.append("a device with more memory, or an optimizer with less state (e.g. --optimizer sgd-fp32)")
    return InfeasibleError(msg, suggestions=tuple(suggestions))
