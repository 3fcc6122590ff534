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


def span_sums(values: np.ndarray) -> np.ndarray:
    """``out[i, j]``: the sum of ``values[i:j]`` (a stage ``[i, j)``'s total; negative below the diagonal)."""
    p = np.concatenate([[0.0], np.cumsum(values)])
    out: np.ndarray = p[None, :] - p[:, None]
    return out


def _uniform(cm: CostModel, b: int, P: int, D: int) -> np.ndarray:
    return span_sums(np.ones(cm.num_layers))


def _parameters(cm: CostModel, b: int, P: int, D: int) -> np.ndarray:
    return span_sums(cm.param_count.astype(float))


def _time(cm: CostModel, b: int, P: int, D: int) -> np.ndarray:
    fwd, bwd = cm.at_batch(b).times_ms
    return span_sums(fwd + bwd)


def _pipedream(cm: CostModel, b: int, P: int, D: int) -> np.ndarray:
    fwd, bwd = cm.at_batch(b).times_ms
    compute = span_sums(fwd + bwd)
    # between the first devices of pipeline ranks 0 and 1 (D groups apart)
    second = cm.group.layout(num_stages=P, dp_degree=D).rank_of(stage_idx=1) if P > 1 else 0
    bw, lat = link_of(cm.cluster, 0, second) if P > 1 else (cm.cluster.intra_node_bandwidth_gb_per_s, 0.0)
    comm_in = np.array([2 * p2p_ms(c * b, bandwidth_gb_per_s=bw, latency_us=lat) for c in cm.cut_bytes_per_sample])
    comm = comm_in[:, None] + comm_in[None, :]
    params = span_sums(cm.param_count.astype(float)) * cm.grad_bytes_per_param
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
