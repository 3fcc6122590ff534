"""Replicated proposals: pipelines whose stages have their own copy counts (PipeDream's
optimizer, Narayanan et al. 2019), searched exactly by :mod:`planner.solve.replicated` and
proposed beside the uniform layouts, which they beat only by simulated time, with PipeDream's
own split of the chain (:func:`pipedream_split`) proposed beside them."""

from __future__ import annotations

import dataclasses

import numpy as np

from planner.artifacts.kinds import ScheduleKind, ZeroStage
from planner.artifacts.layout import Sharding
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel, p2p_ms
from planner.solve.candidates import Candidate, Scored, fits, simulated
from planner.solve.floors import binds_nowhere
from planner.solve.partitions import span_sums
from planner.solve.prices import StageTable
from planner.solve.proposals import fixed_split
from planner.solve.replicated import solve_replicated
from planner.solve.settings import SETTINGS, SearchSettings
from planner.solve.space import DP_SCHEDULES, Config, layout_of, microbatch_sizes, searched_zero


def replica_counts(num_devices: int, num_microbatches: int) -> list[int]:
    """Copies a stage may have: every R <= N dividing M (round-robin needs M a multiple of R)."""
    return [d for d in range(1, num_devices + 1) if num_microbatches % d == 0]


def solve_replicated_config(
    cm: CostModel, request: PlanRequest, b: int, schedule: ScheduleKind, zero: ZeroStage, num_devices: int, cap: float,
    fixed: tuple[int, ...], limit_ms: float = float("inf"), spare: bool = False,
) -> Candidate | None:
    """The best pipeline replicated per stage for one micro-batch size, schedule and ZeRO stage
    (:mod:`planner.solve.replicated`; on up to ``num_devices`` devices with ``spare``), as a
    Candidate (None if nothing fits)."""
    m = request.global_batch // b

    def table(sharding: Sharding) -> StageTable:
        return StageTable(cm, b, cap, fixed, allow_recompute=request.recompute, sharding=sharding)

    plain = table(Sharding()) if not zero or ZeroStage.NONE in request.zero_stages else None
    if zero and plain is not None and binds_nowhere(plain, m):
        zero = ZeroStage.NONE  # memory binds nowhere: sharding cannot help
    # without sharding a stage's copies all price as one table
    tables = {
        d: plain if not zero and plain is not None else table(Sharding(zero, d) if zero else Sharding())
        for d in replica_counts(num_devices, m)
    }
    found = solve_replicated(tables, num_devices=num_devices, num_microbatches=m, schedule=schedule, limit_ms=limit_ms,
                             spare=spare)
    if found is None:
        return None
    config = Config(layout_of(cm, len(found.replicas), zero=zero, replicas=found.replicas), b, m, schedule)
    return Candidate(config, found.solution)


def replicated_candidates(
    cm: CostModel, request: PlanRequest, num_devices: int, cap: float, uniform: list[Scored],
    settings: SearchSettings = SETTINGS, *, incumbent_ms: float = float("inf"),
) -> list[Scored]:
    """Pipelines whose stages have their own copy counts, with their simulated times; only
    layouts that are not uniform (those are the P x D configurations already searched), on at
    most :attr:`SearchSettings.replicated_max_devices` devices, without tensor parallelism.
    Searched for the micro-batch sizes of the :attr:`SearchSettings.replicated_sizes` best
    uniform plans (every size when none fits), each exactly over partitions and copy counts;
    sizes whose average-work bound cannot beat the best plan so far (or ``incumbent_ms``, the
    best of every degree searched) are skipped."""
    schedules = [s for s in request.schedules if s in DP_SCHEDULES]
    if not request.per_stage_replication or cm.group.size > 1 or cm.group.experts_size > 1:  # copies: one device each
        return []
    if not 2 <= num_devices <= settings.replicated_max_devices:
        return []
    if request.dp_degree or not schedules:  # a forced D means replicated pipelines only
        return []
    best_ms = min(uniform[0][0] if uniform else float("inf"), incumbent_ms)
    sizes = list(dict.fromkeys(cand.config.microbatch_size for _, cand in uniform))[: settings.replicated_sizes]
    zero = searched_zero(request, num_devices)
    if zero is ZeroStage.PARAMETERS:  # ZeRO 3 is not priced for per-stage replication
        return []
    out: list[Scored] = []
    for b in sizes or microbatch_sizes(request, request.global_batch):
        m = request.global_batch // b
        fp, bp = cm.at_batch(b).prefix_ms
        work = float(fp[-1] + bp[-1])
        if m < 2 or max(m * work / num_devices, work) > best_ms:
            continue
        split = pipedream_split(cm, b, num_devices, replica_counts(num_devices, m))
        # J is the same for both schedules and 1F1B holds fewer micro-batches, so its optimum is
        # never worse: solved once (under 1F1B when allowed), the partition is proposed under
        # every allowed schedule it fits
        first = ScheduleKind.ONE_F_ONE_B if ScheduleKind.ONE_F_ONE_B in schedules else schedules[0]
        solved = solve_replicated_config(cm, request, b, first, zero, num_devices, cap,
                                         request.fixed_boundaries, best_ms, spare=True)
        for schedule in schedules:
            proposals = [] if solved is None else [
                c for c in [same_split(cm, solved, schedule, cap)] if c is not None
            ]
            proposals += pipedream_proposal(cm, request, b, schedule, zero, cap, split)
            for prop in proposals:
                lay = prop.config.layout
                if len(set(lay.stage_replicas)) <= 1:
                    continue
                if request.max_stages and lay.num_stages > request.max_stages:
                    continue
                if request.num_stages and lay.num_stages != request.num_stages:
                    continue
                # the busiest copy does (M / R) x its stage's work: no faster than that
                if max(m // d * t for d, t in zip(lay.stage_replicas, prop.solution.stage_times_ms)) > best_ms:
                    continue
                t = simulated(cm, prop)
                out.append((t, prop))
                best_ms = min(best_ms, t)
    return out


def same_split(cm: CostModel, cand: Candidate, schedule: ScheduleKind, cap: float) -> Candidate | None:
    """``cand``'s partition and copies under ``schedule``, if its stages (recomputing as
    before) still fit; None otherwise."""
    if schedule is cand.config.schedule:
        return cand
    other = Candidate(dataclasses.replace(cand.config, schedule=schedule), cand.solution)
    return other if fits(cm, other.config, cand.solution, cap) else None


def pipedream_proposal(
    cm: CostModel, request: PlanRequest, b: int, schedule: ScheduleKind, zero: ZeroStage, cap: float,
    split: tuple[tuple[int, ...], tuple[int, ...]] | None,
) -> list[Candidate]:
    """PipeDream's own replicated ``split`` (:func:`pipedream_split`,
    copy counts dividing M) with the least recomputation that fits each stage: one more
    proposal for the simulator, as :func:`planner.solve.proposals.alternatives` does for the
    uniform layouts."""
    if split is None or not all(f in split[0] for f in request.fixed_boundaries):
        return []
    bounds, reps = split
    config = Config(layout_of(cm, len(reps), zero=zero, replicas=reps), b, request.global_batch // b, schedule)
    cand = fixed_split(cm, config, bounds, cap, request.recompute)
    return [cand] if cand is not None else []


def pipedream_split(
    cm: CostModel, b: int, num_devices: int, counts: list[int] | None = None
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """PipeDream's optimizer with per-stage replication (Narayanan et al. SOSP'19, sec. 3.1;
    one level of its ``optimizer_graph_hierarchical.py``) on the chain: stage boundaries and
    copy counts minimising the slowest stage, where ``r`` copies of layers ``[i, j)`` take
    ``max(compute / r, boundary transfer) + 4 (r - 1) |w| / (r B)`` (the same stage weight as
    the ``pipedream`` baseline). Over prefixes ``[0, j)`` on ``m`` devices::

        A[j][m] = min( T(0, j, m), min_{i < j, r < m} max(A[i][m - r], T(i, j, r)) )

    ``counts`` restricts the copy counts (round-robin needs them to divide M); returns
    (stage starts, copies per stage), or None if no split uses exactly ``num_devices``."""
    L, N = cm.num_layers, num_devices
    allowed = sorted(set(counts)) if counts is not None else list(range(1, N + 1))
    fwd, bwd = cm.at_batch(b).times_ms
    compute = span_sums(fwd + bwd)
    bw = cm.cluster.intra_node_bandwidth_gb_per_s
    comm_in = np.array([2 * p2p_ms(c * b, bandwidth_gb_per_s=bw, latency_us=0.0) for c in cm.cut_bytes_per_sample])
    comm = comm_in[:, None] + comm_in[None, :]
    weights = span_sums(cm.param_count.astype(float)) * cm.grad_bytes_per_param

    def stage(r: int) -> np.ndarray:
        sync = 4.0 * (r - 1) * weights / (r * bw * 1e9) * 1e3
        weight: np.ndarray = np.maximum(compute / r, comm) + sync
        return weight

    times = {r: stage(r) for r in allowed}
    A = np.full((L + 1, N + 1), np.inf)
    arg_i = np.zeros((L + 1, N + 1), dtype=np.int64)  # 0: one stage [0, j) replicated m times
    arg_r = np.zeros((L + 1, N + 1), dtype=np.int64)
    for j in range(1, L + 1):
        for r in allowed:
            if r <= N:
                A[j, r], arg_r[j, r] = times[r][0, j], r
        for r in allowed:
            if r >= N or j < 2:
                continue
            # last stage [i, j) with r copies after a prefix [0, i) on m - r devices, all m > r at once
            cand = np.maximum(A[1:j, 1 : N + 1 - r], times[r][1:j, j][:, None])  # rows i = 1..j-1, cols m = r+1..N
            i = np.argmin(cand, axis=0)
            val = cand[i, np.arange(cand.shape[1])]
            better = val < A[j, r + 1 :]
            A[j, r + 1 :] = np.where(better, val, A[j, r + 1 :])
            arg_i[j, r + 1 :] = np.where(better, i + 1, arg_i[j, r + 1 :])
            arg_r[j, r + 1 :] = np.where(better, r, arg_r[j, r + 1 :])
    if not np.isfinite(A[L, N]):
        return None
    starts, copies, j, m = [], [], L, N
    while j > 0:
        i, r = int(arg_i[j, m]), int(arg_r[j, m])
        starts.append(i)
        copies.append(r)
        j, m = i, m - r
    return tuple(reversed(starts)), tuple(reversed(copies))
