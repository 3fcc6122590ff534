"""Contiguous min-max partitions by a per-stage weight: the rules of the baselines (see
:mod:`planner.solve.baselines`), also proposed to the default search as extra candidates."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from planner.artifacts.kinds import SolverKind
from planner.cost import CostModel, link_of, p2p_ms

# weights(cm, b, P, D) -> per-(i, j) stage weight matrix whose max over stages is minimised
WeightFn = Callable[[CostModel, int, int, int], np.ndarray]


def minmax_partition(weight: np.ndarray, num_stages: int) -> tuple[int, ...] | None:
    """Contiguous partition of L layers into P stages minimising the largest ``weight[i, j]``.

    ``g[s][i] = min_j max(weight[i, j], g[s + 1][j])``, ties to the earliest cut.
    """
    L = weight.shape[0] - 1
    if num_stages > L:
        return None
    g = np.full(L + 1, np.inf)
    g[L] = 0.0
    args = []
    idx = np.arange(L + 1)
    upper = idx[None, :] > idx[:, None]
    for _ in range(num_stages):
        cand = np.where(upper, np.maximum(weight, g[None, :]), np.inf)
        arg = np.argmin(cand, axis=1)
        g = cand[idx, arg]
        args.append(arg)
    args.reverse()
    if not np.isfinite(g[0]):
        return None
    bounds, i = [], 0
    for s in range(num_stages):
        bounds.append(i)
        i = int(args[s][i])
    return tuple(bounds)


def honouring(weight: np.ndarray, fixed: Sequence[int]) -> np.ndarray:
    """``weight`` with every stage that spans a ``fixed`` boundary (starts before it and ends
    after it) made impossible (inf), so that :func:`minmax_partition` starts a stage there."""
    if not len(fixed):
        return weight
    idx = np.arange(weight.shape[0])
    spans = np.zeros(weight.shape, dtype=bool)
    for f in fixed:
        spans |= (idx[:, None] < f) & (idx[None, :] > f)
    return np.where(spans, np.inf, weight)


def _prefix_weight(values: np.ndarray) -> np.ndarray:
    p = np.concatenate([[0.0], np.cumsum(values)])
    out: np.ndarray = p[None, :] - p[:, None]
    return out


def _uniform(cm: CostModel, b: int, P: int, D: int) -> np.ndarray:
    return _prefix_weight(np.ones(cm.num_layers))


def _parameters(cm: CostModel, b: int, P: int, D: int) -> np.ndarray:
    return _prefix_weight(cm.param_count.astype(float))


def _time(cm: CostModel, b: int, P: int, D: int) -> np.ndarray:
    fwd, bwd = cm.at_batch(b).times_ms
    return _prefix_weight(fwd + bwd)


def _pipedream(cm: CostModel, b: int, P: int, D: int) -> np.ndarray:
    fwd, bwd = cm.at_batch(b).times_ms
    compute = _prefix_weight(fwd + bwd)
    # between the first devices of pipeline ranks 0 and 1 (D groups apart)
    second = cm.group.layout(num_stages=P, dp_degree=D).rank_of(stage_idx=1) if P > 1 else 0
    bw, lat = link_of(cm.cluster, 0, second) if P > 1 else (cm.cluster.intra_node_bandwidth_gb_per_s, 0.0)
    comm_in = np.array([2 * p2p_ms(c * b, bandwidth_gb_per_s=bw, latency_us=lat) for c in cm.cut_bytes_per_sample])
    comm = comm_in[:, None] + comm_in[None, :]
    params = _prefix_weight(cm.param_count.astype(float)) * cm.grad_bytes_per_param
    if D > 1:
        sync = 4.0 * (D - 1) * params / (D * cm.cluster.intra_node_bandwidth_gb_per_s * 1e9) * 1e3
    else:
        sync = np.zeros_like(params)
    weight: np.ndarray = np.maximum(compute, comm) + sync
    return weight


WEIGHTS: dict[SolverKind, WeightFn] = {
    SolverKind.UNIFORM: _uniform,
    SolverKind.PARAMETERS: _parameters,
    SolverKind.TIME_BALANCED: _time,
    SolverKind.PIPEDREAM: _pipedream,
}


def partition_by(kind: SolverKind, cm: CostModel, microbatch_size: int, num_stages: int, dp_degree: int,
                 fixed: Sequence[int] = ()) -> tuple[int, ...] | None:
    """The baseline ``kind``'s partition (:data:`WEIGHTS`, :func:`minmax_partition`) into
    ``num_stages`` stages, ``dp_degree`` copies each, starting a stage at every ``fixed``
    boundary (:func:`honouring`); None where no partition has a finite weight."""
    weight = honouring(WEIGHTS[kind](cm, microbatch_size, num_stages, dp_degree), fixed)
    return minmax_partition(weight, num_stages)


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
    compute = _prefix_weight(fwd + bwd)
    bw = cm.cluster.intra_node_bandwidth_gb_per_s
    comm_in = np.array([2 * p2p_ms(c * b, bandwidth_gb_per_s=bw, latency_us=0.0) for c in cm.cut_bytes_per_sample])
    comm = comm_in[:, None] + comm_in[None, :]
    weights = _prefix_weight(cm.param_count.astype(float)) * cm.grad_bytes_per_param

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
