"""Why a request cannot be planned, and the cheapest changes that would make it fit.

The leanest layouts are tried: every group a pipeline stage (no data parallelism), and, where
the request allows ZeRO 3, each P x D split of the groups with the parameters sharded over the
D replicas (FSDP); the one needing the least memory is named, with what would fit (more
devices and the layout that fits on them, less headroom)."""

from __future__ import annotations

import math

import numpy as np

from planner.artifacts.errors import InfeasibleError
from planner.artifacts.kinds import ScheduleKind, ZeroStage
from planner.artifacts.layout import Layout
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.cost.sharding import is_fsdp
from planner.schedule import Held, held_counts
from planner.solve.chain import ChainSolution
from planner.solve.chain_dp import least_largest, solve_chain
from planner.solve.held import held_memory
from planner.solve.prices import StageTable
from planner.solve.space import divisors, layout_of, schedule_valid


def _chain(cm: CostModel, request: PlanRequest, cap: float, layout: Layout, b: int,
           recompute: bool) -> tuple[StageTable, int, ScheduleKind]:
    """The stage table, micro-batch count and (leanest) schedule ``layout`` is tried with."""
    sharding = layout.sharding(0)
    line = cm.fsdp_line(layout) if is_fsdp(sharding) else (0.0, 0.0)
    table = StageTable(cm, b, cap, request.fixed_boundaries, allow_recompute=recompute, sharding=sharding, fsdp_line=line)
    return (table, *_priced(request, layout, b))


def _priced(request: PlanRequest, layout: Layout, b: int) -> tuple[int, ScheduleKind]:
    """The micro-batch count and the (leanest) schedule ``layout`` is priced with."""
    M = max(1, request.global_batch // (layout.dp_degree * b))
    return M, _leanest(layout.num_stages, M, request.schedules)


def _solve(cm: CostModel, request: PlanRequest, cap: float, layout: Layout, b: int, recompute: bool) -> ChainSolution | None:
    table, M, schedule = _chain(cm, request, cap, layout, b, recompute)
    return solve_chain(table, layout=layout, num_microbatches=M, schedule=schedule)


def _fits(cm: CostModel, request: PlanRequest, cap: float, layout: Layout, b: int, recompute: bool) -> bool:
    """``_solve(...) is not None``, answered without pricing recomputation where a partition
    fits without any (the solver then finds a plan) or none fits even with every layer at its
    leanest level (it finds none); only the cases between are solved."""
    table, M, schedule = _chain(cm, request, cap, layout, b, recompute)
    held = held_counts(schedule, layout, M)  # the DP's own counts (a zero-bubble stage's past I keep W's inputs)
    ks, per = [h.whole for h in held], [table.held(h.pending) for h in held]
    if not table.could_partition(ks, tables=per):
        return False
    if table.could_partition(ks, recompute=False, tables=per):
        return True
    return solve_chain(table, layout=layout, num_microbatches=M, schedule=schedule) is not None


def lean_layouts(cm: CostModel, request: PlanRequest, num_groups: int) -> list[Layout]:
    """The layouts tried: ``num_groups`` pipeline stages (at most the layers, the request's
    limits honoured) -- or, where the request asks for D replicas, ``num_groups / D`` stages of D
    replicas at the deepest ZeRO stage below 3 it allows (the layout asked for, not another: issue
    47) -- and with ZeRO 3 allowed every P x D = ``num_groups`` with D > 1 dividing the global batch.
    An expert layout folds over at least ``cm.group.dp_multiple`` replicas (1 without experts)."""
    D = max(1, cm.group.dp_multiple, request.dp_degree)
    P = min(num_groups // D, cm.num_layers)
    if request.max_stages:
        P = min(P, request.max_stages)
    if request.num_stages:
        P = request.num_stages
    sharded = [z for z in request.zero_stages if z < ZeroStage.PARAMETERS]
    asked = request.dp_degree > 1  # the layout asked for: at the deepest ZeRO stage below 3 it allows
    zero = max(sharded) if asked and sharded else ZeroStage.NONE
    out = [layout_of(cm, max(P, 1), D, 1, zero)] if not asked or sharded else []
    if ZeroStage.PARAMETERS in request.zero_stages:
        for p in divisors(num_groups):
            d = num_groups // p
            if d < 2 or p > cm.num_layers or request.global_batch % d or (request.num_stages and p != request.num_stages) \
                    or (request.dp_degree and d != request.dp_degree) or (request.max_stages and p > request.max_stages) \
                    or not cm.group.admits(d):
                continue
            out.append(layout_of(cm, p, d, 1, ZeroStage.PARAMETERS))
    return out


def least_need(cm: CostModel, request: PlanRequest, num_groups: int, b: int, recompute: bool) -> tuple[float, Layout]:
    """The least per-device memory over :func:`lean_layouts`, and the layout needing it."""
    return min(((least_cap_bytes(cm, request, lay, b, recompute), lay) for lay in lean_layouts(cm, request, num_groups)),
               key=lambda nl: (nl[0], nl[1].dp_degree))


#: one-chunk-per-rank schedules from the fewest micro-batches held to the most: each holds at
#: least as many whole micro-batches as the one before, and at least as many past I
#: (:func:`planner.schedule.held_counts`; GPipe holds all M whole)
_LEANNESS = (ScheduleKind.ONE_F_ONE_B, ScheduleKind.ZB_H1, ScheduleKind.ZB_H2, ScheduleKind.GPIPE)


def _leanest(P: int, M: int, asked: tuple[ScheduleKind, ...] = ()) -> ScheduleKind:
    """The schedule holding the fewest micro-batches that is valid for (P, M): the leanest of
    those ``asked`` (a zero-bubble one priced with its exact held counts, as the DP prices it),
    else 1F1B, or GPipe where M < P. ZB-H1 and ZB-H2 need P > 1 (one stage is 1F1B)."""
    for kind in _LEANNESS:
        if kind in asked and schedule_valid(kind, P, M) and (P > 1 or not kind.splits_backward):
            return kind
    return ScheduleKind.ONE_F_ONE_B if M >= P else ScheduleKind.GPIPE


def _unasked(request: PlanRequest, schedule: ScheduleKind) -> str:
    """What the explanation's figures mean when they are priced with a schedule the request does
    not allow (the explanation prices the one holding the fewest micro-batches in flight; "" when
    it is asked for)."""
    if schedule in request.schedules:
        return ""
    asked = ", ".join(s.value for s in request.schedules)
    if schedule is ScheduleKind.ONE_F_ONE_B:  # every other schedule holds at least 1F1B's micro-batches
        return (f" (Priced with 1f1b, which was not asked ({asked}): the schedules asked hold at least as many "
                "micro-batches in flight, so they need at least this much.)")
    return f" (Priced with {schedule.value}, which was not asked ({asked}).)"


def least_cap_bytes(cm: CostModel, request: PlanRequest, layout: Layout, b: int, recompute: bool) -> float:
    """The smallest per-device memory cap under which ``layout`` fits: the least over its
    partitions of its largest stage's fewest bytes (:meth:`StageTable.least_bytes`, the min-max
    DP over them), where the solver agrees that the layout fits there; else a bisection on the
    cap (to within a megabyte above)."""
    direct = _least_cap_direct(cm, request, layout, b, recompute)
    if direct is not None:
        for cap in (direct, direct * (1 + 1e-9) + 1.0):  # the float sums of the solver's covers
            if _fits(cm, request, cap, layout, b, recompute):
                return cap
    lo, hi = 0.0, float(max(1, cm.total_params)) * 64 + 1e12
    while not _fits(cm, request, hi, layout, b, recompute):
        hi *= 4
        if hi > 1e22:
            return math.inf
    for _ in range(40):
        mid = (lo + hi) / 2
        if _fits(cm, request, mid, layout, b, recompute):
            hi = mid
        else:
            lo = mid
        if hi - lo < 1e6:
            break
    return hi


def _least_cap_direct(cm: CostModel, request: PlanRequest, layout: Layout, b: int, recompute: bool) -> float | None:
    """:func:`least_cap_bytes` as the min-max over partitions of the stages' fewest bytes (None
    where a stage's fewest bytes are not worked out)."""
    table, M, schedule = _chain(cm, request, 0.0, layout, b, recompute)
    held = held_counts(schedule, layout, M)
    if len(held) > cm.num_layers:
        return math.inf
    needs: dict[Held, np.ndarray] = {}
    for h in dict.fromkeys(held):  # past I: in the held table's static bytes (StageTable.held)
        found = table.held(h.pending).least_bytes(h.whole)
        if found is None:
            return None
        needs[h] = found
    return max(least_largest([needs[h] for h in held], cm.num_layers), 0.0)


def explain_infeasible(cm: CostModel, request: PlanRequest, num_devices: int, cap: float,
                       *, suggest: bool = True) -> InfeasibleError:
    """An InfeasibleError naming the tightest stage, the bytes over, and what would fit. Without
    ``suggest`` the suggestions that search more layouts (more devices, recomputation) are left
    to :meth:`InfeasibleError.complete`: a search refusing measures the least memory of every
    degree it tried, and explains only the closest in full (GPT-3 175B on 8 A100s: 10 degrees,
    the more-devices searches were 7.3 of the refusal's 9.0 s)."""
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
    need, lay = least_need(cm, request, num_devices, b, request.recompute)
    P = lay.num_stages
    gib = 1024**3
    if not math.isfinite(need):
        return InfeasibleError("no partition of this profile fits any memory cap (check the profile's sizes)")
    sol = _solve(cm, request, need, lay, b, request.recompute)
    M, schedule = _priced(request, lay, b)
    unasked = _unasked(request, schedule)
    tight = ""
    if sol is not None:
        stops = list(sol.boundaries[1:]) + [cm.num_layers]
        held = held_counts(schedule, lay, M)
        mems = [  # each stage at the heaviest of its held states, as the plan's stages are priced
            held_memory(cm, a, z, sol.recompute[s], b, held[s], lay.sharding(s), sol.selective[s]).total_bytes
            for s, (a, z) in enumerate(zip(sol.boundaries, stops))
        ]
        s = max(range(P), key=lambda i: mems[i])
        tight = (
            f" Tightest stage: stage {s} (layers {sol.boundaries[s]}..{stops[s] - 1}, "
            f"{cm.profile.layer_names[sol.boundaries[s]]}..{cm.profile.layer_names[stops[s] - 1]}) "
            f"needs {mems[s] / gib:.2f} GiB."
        )
    group = cm.group.size  # devices per group: a layout's rank
    if need <= cap:
        counted = f"{num_devices} devices" if group == 1 else f"{num_devices} groups of {group} devices"
        return InfeasibleError(
            f"no configuration fits, although {P} stages of micro-batch {b} would need only {need / gib:.2f} GiB "
            f"per device (cap {cap / gib:.2f} GiB): a layout P x D occupies a divisor of the {counted}, "
            f"the replicas must divide the global batch ({request.global_batch}), and 1F1B needs at least as "
            "many micro-batches as stages"
            + "".join(f"; {flag} {v} was asked" for flag, v in (("--stages", request.num_stages),
                      ("--dp-degree", request.dp_degree), ("--max-stages", request.max_stages)) if v)
            + (f"; micro-batch sizes {','.join(map(str, request.microbatch_sizes))} were asked"
               if request.microbatch_sizes else "") + "." + unasked,
            suggestions=(
                f"a device count with more divisors up to {cm.num_layers} (e.g. a power of two)",
                "a global batch divisible by more replica counts",
                "allow gpipe (--schedules gpipe,1f1b)",
            ),
        )
    over = need - cap
    where = f"{P} pipeline stages" if lay.dp_degree == 1 and group == 1 else lay.describe()
    msg = (
        f"no plan fits: even with {where}, micro-batch size {b}, {schedule.value}"
        f"{' and recomputation' if request.recompute else ''}, a device needs {need / gib:.2f} GiB "
        f"but the cap is {cap / gib:.2f} GiB ({over / gib:.2f} GiB = {int(over)} bytes over).{tight}{unasked}"
    )

    def explained() -> InfeasibleError:
        return InfeasibleError(msg, suggestions=_suggestions(cm, request, num_devices, cap, need, lay, b), need_bytes=need)

    return explained() if suggest else InfeasibleError(msg, need_bytes=need, more=explained)


def _suggestions(cm: CostModel, request: PlanRequest, num_devices: int, cap: float, need: float, lay: Layout,
                 b: int) -> tuple[str, ...]:
    """What would make a layout needing ``need`` bytes per device (``lay``, micro-batch ``b``) fit ``cap``."""
    gib = 1024**3
    P, group = lay.num_stages, cm.group.size  # devices per group
    suggestions = []
    for mult in (2, 4, 8, 16):
        more_need, more = least_need(cm, request, num_devices * mult, b, request.recompute)
        if more.num_stages == P and more.dp_degree == 1 and lay.dp_degree == 1:
            break
        if more_need <= cap:
            what = (f"allows {more.num_stages} pipeline stages" if more.dp_degree == 1 and group == 1
                    else f"{more.describe()} needs {more_need / gib:.2f} GiB")
            schedule = _priced(request, more, b)[1]
            if schedule not in request.schedules:  # priced with a schedule not asked: it may not fit as asked
                what += f" with {schedule.value}, which was not asked"
            suggestions.append(f"more devices: {num_devices * mult * group} ({what})")
            break
    if not request.recompute:
        with_rc = least_cap_bytes(cm, request, lay, b, True)
        if with_rc <= cap:
            suggestions.append(f"allow recomputation (needs {with_rc / gib:.2f} GiB per device)")
    if b > 1:
        suggestions.append("a smaller micro-batch size (--microbatch-sizes 1)")
    if request.memory_headroom_fraction > 0 and not request.memory_cap_bytes and need <= cm.cluster.device_memory_bytes:
        room = math.floor((1.0 - need / cm.cluster.device_memory_bytes) * 1000) / 1000
        suggestions.append(f"less memory headroom: --memory-headroom {room:.3f} fits {lay.describe()} "
                           f"(now {request.memory_headroom_fraction:.0%})")
    suggestions.append("a device with more memory, or an optimizer with less state (e.g. --optimizer sgd-fp32)")
    if request.offload.value == "none":
        suggestions.append("or host memory for the optimizer state or activations: try --offload auto")
    return tuple(suggestions)
