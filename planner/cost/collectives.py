"""Collective and point-to-point communication times on a cluster's links (pure functions).

- point-to-point: ``alpha + bytes / beta`` on the link two ranks share (intra- or inter-node);
- ring all-reduce (Patarasuk & Yuan 2009): ``2 (d-1)/d x bytes/beta + 2 (d-1) alpha``; when the
  ranks span ``n`` nodes with ``k`` per node, hierarchical (reduce-scatter in the node, ring
  across nodes on 1/k of the data, all-gather in the node; as NCCL's tree/2D algorithms, Jia et
  al. 2018 "Highly Scalable Deep Learning Training System with Mixed-Precision").
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.artifacts.caches import Cache
from planner.artifacts.cluster import Cluster
from planner.artifacts.layout import Layout


def p2p_ms(num_bytes: float, *, bandwidth_gb_per_s: float, latency_us: float) -> float:
    """Time of one point-to-point transfer: ``alpha + bytes / beta`` (0 for 0 bytes)."""
    if num_bytes <= 0:
        return 0.0
    return latency_us / 1e3 + num_bytes / (bandwidth_gb_per_s * 1e9) * 1e3


def ring_allreduce_ms(num_bytes: float, num_ranks: int, *, bandwidth_gb_per_s: float, latency_us: float) -> float:
    """Ring all-reduce: ``2 (d-1)/d x bytes/beta + 2 (d-1) alpha`` (Patarasuk & Yuan 2009)."""
    if num_ranks <= 1 or num_bytes <= 0:
        return 0.0
    d = num_ranks
    return 2 * (d - 1) / d * num_bytes / (bandwidth_gb_per_s * 1e9) * 1e3 + 2 * (d - 1) * latency_us / 1e3


def link_of(cluster: Cluster, rank_a: int, rank_b: int) -> tuple[float, float]:
    """(bandwidth GB/s, latency us) of the link between two ranks."""
    if cluster.node_of(rank_a) == cluster.node_of(rank_b):
        return cluster.intra_node_bandwidth_gb_per_s, cluster.intra_node_latency_us
    return cluster.inter_node_bandwidth_gb_per_s, cluster.inter_node_latency_us


def allreduce_line(cluster: Cluster, ranks: Sequence[int]) -> tuple[float, float]:
    """The all-reduce over ``ranks`` as a line in the bytes: (ms per byte, fixed ms) for any
    positive byte count. Ring inside a node (Patarasuk & Yuan 2009); across nodes
    hierarchical: an intra-node ring all-reduce's cost (reduce-scatter + all-gather) plus a
    ring all-reduce across the nodes on 1/k of the bytes (k ranks per node)."""
    if len(ranks) <= 1:
        return 0.0, 0.0
    per_node: dict[int, int] = {}
    for rank in ranks:
        node = cluster.node_of(rank)
        per_node[node] = per_node.get(node, 0) + 1

    def ring(d: int, bw: float, lat_us: float, share: float = 1.0) -> tuple[float, float]:
        if d <= 1:
            return 0.0, 0.0
        return 2 * (d - 1) / d * share / (bw * 1e9) * 1e3, 2 * (d - 1) * lat_us / 1e3

    intra = (cluster.intra_node_bandwidth_gb_per_s, cluster.intra_node_latency_us)
    inter = (cluster.inter_node_bandwidth_gb_per_s, cluster.inter_node_latency_us)
    if len(per_node) == 1:
        return ring(len(ranks), *intra)
    k, n = max(per_node.values()), len(per_node)
    a1, b1 = ring(k, *intra)
    a2, b2 = ring(n, *inter, share=1.0 / k)
    return a1 + a2, b1 + b2


def allreduce_ms(cluster: Cluster, num_bytes: float, ranks: Sequence[int]) -> float:
    """All-reduce of ``num_bytes`` over ``ranks`` (see :func:`allreduce_line`)."""
    if len(ranks) <= 1 or num_bytes <= 0:
        return 0.0
    per_byte, fixed = allreduce_line(cluster, ranks)
    return per_byte * num_bytes + fixed


#: allreduce_line of arithmetic progressions of ranks, by (the links, the first rank's place in
#: its node, stride, count): a search prices the gradient groups of thousands of layouts
_PROGRESSIONS: Cache[tuple[float | int, ...], tuple[float, float]] = Cache(
    "cost.collectives.progressions", key="(links, first rank's place in its node, stride, count)", bound=1 << 14)


def grad_group_line(cluster: Cluster, layout: Layout, stage_idx: int) -> tuple[float, float]:
    """:func:`allreduce_line` of stage ``stage_idx``'s gradient group (:meth:`Layout.grad_group`,
    tensor-parallel shard 0), without listing its ranks for a uniform layout: they are
    ``D x cp`` ranks from ``pipeline rank x D x cp x t`` in steps of ``t``, and the line depends
    only on how they fall into nodes, the same for every shift by whole nodes."""
    if layout.stage_replicas:
        return allreduce_line(cluster, layout.grad_group(stage_idx))
    n = layout.dp_degree * layout.cp_degree
    stride, per_node = layout.tp_degree, cluster.devices_per_node
    first = layout.pipeline_rank(stage_idx) * n * stride
    key = (cluster.intra_node_bandwidth_gb_per_s, cluster.intra_node_latency_us, cluster.inter_node_bandwidth_gb_per_s,
           cluster.inter_node_latency_us, per_node, first % per_node, stride, n)
    found = _PROGRESSIONS.get(key)
    if found is None:
        offset = first % per_node
        found = _PROGRESSIONS.put(key, allreduce_line(cluster, range(offset, offset + n * stride, stride)))
    return found
