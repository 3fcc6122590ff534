"""Collective and point-to-point communication times on a cluster's links (pure functions).

- point-to-point: ``alpha + bytes / beta`` on the link two ranks share (intra- or inter-node);
- ring all-reduce (Patarasuk & Yuan 2009): ``2 (d-1)/d x bytes/beta + 2 (d-1) alpha``; when the
  ranks span ``n`` nodes with ``k`` per node, hierarchical (reduce-scatter in the node, ring
  across nodes on 1/k of the data, all-gather in the node; as NCCL's tree/2D algorithms, Jia et
  al. 2018 "Highly Scalable Deep Learning Training System with Mixed-Precision").
- with ``Cluster.collective_model`` ``nccl``, a collective takes the fixed time NCCL's own tuning
  model gives it (inside a node: ``8.4 us + 2 (n - 1) x 3.4 us``, its ring's base and NVLink step
  latencies, where the alpha-beta ring charges the cluster's small-message latency per step); one
  whose ranks span nodes (``src/graph/tuning.cc`` of NVIDIA/nccl at 5067397; the
  Simple protocol, which NCCL uses for buffers of megabytes): a ring all-reduce over ``n``
  ranks on ``N`` nodes pays ``8.4 us`` (its base latency) ``+ 2 (n - N) x 3.4 us`` (NVLink
  steps) ``+ 2 (N - 1) x 14 us`` (network steps), times 1.4 (the "plateau effect of ring" it
  applies across nodes on sm80 and later); a tree all-reduce ``8.4 + 2 ((n / N - 1) x 4.0 +
  log2(N) x 14) us`` at ``0.92 x`` the ring's bandwidth, times its size correction
  (``treeCorrectionFactor``, Simple). NCCL picks the faster per call; here per group, at
  :data:`REFERENCE_BYTES`, the size of a gradient bucket (PyTorch DDP's 25 MiB, Megatron-Core's
  40 M bf16 elements = 80 MB), so that every caller prices a group with one line. Rings' latency
  grows with the node count, trees' with its logarithm: past a few dozen nodes the tree wins,
  at 92% (or less) of the bandwidth -- the bus bandwidth falling with node count that
  nccl-tests measure. The reduce-scatter and all-gather halves (ZeRO, FSDP, context
  parallelism) take half the all-reduce's line (NCCL runs them on rings, and on one GPU per
  node on its logarithmic PAT algorithm): ZeRO 3's per-layer gathers and reduce-scatters take
  half the ring's line (:func:`gather_line`), never the tree's.

A layout's stages ask the same questions of the cluster's links wherever they are priced (the
stage tables' transfers and exposed synchronisation, ZeRO 3's line, a plan's stages): each
stage's gradient group's line and the link to the next stage are one :class:`StageLinks`,
worked out once per layout by :func:`stage_links`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.artifacts.caches import Cache
from planner.artifacts.cluster import Cluster
from planner.artifacts.kinds import CollectiveModel
from planner.artifacts.layout import Layout

#: NCCL's tuning constants (src/graph/tuning.cc at 5067397), us: base latency of the Simple
#: protocol (ring and tree), per-step hardware latency of a ring step on NVLink, of a tree step on
#: NVLink and of a network step (both), the ring's plateau factor across nodes (sm80+) and the
#: tree's bandwidth factor for all-reduce
NCCL_BASE_US, NCCL_RING_NVLINK_US, NCCL_TREE_NVLINK_US, NCCL_NET_US = 8.4, 3.4, 4.0, 14.0
NCCL_RING_PLATEAU, NCCL_TREE_BW = 1.4, 0.92
#: treeCorrectionFactor[Simple] by log2(bytes / 64), for 64 B .. 256 MB (and beyond: its last entry)
NCCL_TREE_CORRECTION = (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9)
#: the message size at which a group's algorithm is chosen: a gradient bucket (see the module docstring)
REFERENCE_BYTES = 64 << 20

Line = tuple[float, float]  # (ms per byte, fixed ms) of a collective, for any positive byte count
Link = tuple[float, float]  # (bandwidth GB/s, latency us) of a point-to-point transfer (link_of)


def p2p_ms(num_bytes: float, *, bandwidth_gb_per_s: float, latency_us: float) -> float:
    """Time of one point-to-point transfer: ``alpha + bytes / beta`` (0 for 0 bytes)."""
    if num_bytes <= 0:
        return 0.0
    return latency_us / 1e3 + num_bytes / (bandwidth_gb_per_s * 1e9) * 1e3


def link_of(cluster: Cluster, rank_a: int, rank_b: int) -> tuple[float, float]:
    """(bandwidth GB/s, latency us) of a point-to-point transfer between two ranks: across nodes
    the fixed time NCCL's send/recv takes (``Cluster.inter_node_p2p_latency_us``) where the
    cluster gives it, else the link's latency."""
    if cluster.node_of(rank_a) == cluster.node_of(rank_b):
        return cluster.intra_node_bandwidth_gb_per_s, cluster.intra_node_latency_us
    return cluster.inter_node_bandwidth_gb_per_s, cluster.inter_node_p2p_latency_us or cluster.inter_node_latency_us


def allreduce_line(cluster: Cluster, ranks: Sequence[int], ring_only: bool = False) -> tuple[float, float]:
    """The all-reduce over ``ranks`` as a line in the bytes: (ms per byte, fixed ms) for any
    positive byte count. Ring inside a node (Patarasuk & Yuan 2009); across nodes
    hierarchical: an intra-node ring all-reduce's cost (reduce-scatter + all-gather) plus a
    ring all-reduce across the nodes on 1/k of the bytes (k ranks per node). ``ring_only``: under
    NCCL's model the ring's line even where its tree would be faster (what an all-gather's or a
    reduce-scatter's half takes: :func:`gather_line`)."""
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
        per_byte, fixed = ring(len(ranks), *intra)
        if cluster.collective_model is CollectiveModel.NCCL:  # NCCL's ring over NVLink, Simple protocol
            fixed = (NCCL_BASE_US + 2 * (len(ranks) - 1) * NCCL_RING_NVLINK_US) / 1e3
        return per_byte, fixed
    k, n = max(per_node.values()), len(per_node)
    a1, b1 = ring(k, *intra)
    a2, b2 = ring(n, *inter, share=1.0 / k)
    if cluster.collective_model is CollectiveModel.NCCL:
        return nccl_line(a1 + a2, len(ranks), n, ring_only)
    return a1 + a2, b1 + b2


def gather_line(cluster: Cluster, ranks: Sequence[int]) -> tuple[float, float]:
    """One all-gather or reduce-scatter over ``ranks`` as a line in the bytes of the whole
    (gathered) buffer: half the ring all-reduce's line. NCCL runs these on rings (or, one rank
    per node, on PAT, whose bandwidth term is the ring's): its tuning model has no tree
    all-gather or reduce-scatter (``src/graph/tuning.cc``: the tree is an all-reduce algorithm
    only), so the tree's line an all-reduce across many nodes takes is not theirs."""
    per_byte, fixed = allreduce_line(cluster, ranks, ring_only=True)
    return 0.5 * per_byte, 0.5 * fixed


def nccl_line(per_byte: float, num_ranks: int, num_nodes: int, ring_only: bool = False) -> tuple[float, float]:
    """The (ms per byte, fixed ms) line of an all-reduce across ``num_nodes`` nodes under NCCL's
    tuning model (module docstring): the ring's or the tree's, whichever is faster at
    :data:`REFERENCE_BYTES` (the ring's with ``ring_only``); ``per_byte`` the ring's bandwidth term."""
    ring_us = NCCL_RING_PLATEAU * (NCCL_BASE_US + 2 * (num_ranks - num_nodes) * NCCL_RING_NVLINK_US
                                   + 2 * (num_nodes - 1) * NCCL_NET_US)
    per_node = max(1, num_ranks // num_nodes)
    tree_us = NCCL_BASE_US + 2 * ((per_node - 1) * NCCL_TREE_NVLINK_US + int(math.log2(num_nodes)) * NCCL_NET_US)
    tree_per_byte = per_byte / (NCCL_TREE_BW * tree_correction(REFERENCE_BYTES))
    ring, tree = (per_byte, ring_us / 1e3), (tree_per_byte, tree_us / 1e3)
    if ring_only:
        return ring
    return min(ring, tree, key=lambda line: line[0] * REFERENCE_BYTES + line[1])


def tree_correction(num_bytes: float) -> float:
    """NCCL's tree bandwidth correction (Simple protocol) for a message of ``num_bytes``."""
    index = int(math.log2(max(1.0, num_bytes / 64)))
    return NCCL_TREE_CORRECTION[min(index, len(NCCL_TREE_CORRECTION) - 1)]


def allreduce_ms(cluster: Cluster, num_bytes: float, ranks: Sequence[int]) -> float:
    """All-reduce of ``num_bytes`` over ``ranks`` (see :func:`allreduce_line`)."""
    if len(ranks) <= 1 or num_bytes <= 0:
        return 0.0
    per_byte, fixed = allreduce_line(cluster, ranks)
    return per_byte * num_bytes + fixed


#: allreduce_line of arithmetic progressions of ranks, by (the links, the first rank's place in
#: its node, stride, count): a search prices the gradient groups of thousands of layouts
_PROGRESSIONS: Cache[tuple[float | int | str, ...], tuple[float, float]] = Cache(
    "cost.collectives.progressions", key="(links, collective model, first rank's place in its node, stride, count)",
    bound=1 << 14)


def grad_group_line(cluster: Cluster, layout: Layout, stage_idx: int, ring_only: bool = False) -> tuple[float, float]:
    """:func:`allreduce_line` of stage ``stage_idx``'s gradient group (:meth:`Layout.grad_group`,
    tensor-parallel shard 0), without listing its ranks for a uniform layout: they are
    ``D x cp`` ranks from ``pipeline rank x D x cp x t`` in steps of ``t``, and the line depends
    only on how they fall into nodes, the same for every shift by whole nodes."""
    if layout.stage_replicas:
        return allreduce_line(cluster, layout.grad_group(stage_idx), ring_only)
    n = layout.dp_degree * layout.cp_degree
    stride, per_node = layout.tp_degree, cluster.devices_per_node
    first = layout.pipeline_rank(stage_idx) * n * stride
    key = (cluster.intra_node_bandwidth_gb_per_s, cluster.intra_node_latency_us, cluster.inter_node_bandwidth_gb_per_s,
           cluster.inter_node_latency_us, cluster.collective_model.value, per_node, first % per_node, stride, n,
           int(ring_only))
    found = _PROGRESSIONS.get(key)
    if found is None:
        offset = first % per_node
        found = _PROGRESSIONS.put(key, allreduce_line(cluster, range(offset, offset + n * stride, stride), ring_only))
    return found


@dataclass(frozen=True, slots=True, kw_only=True)
class StageLinks:
    """What the stages of one layout communicate over on one cluster (:func:`stage_links`), per
    stage: its gradient group's all-reduce line (:func:`grad_group_line`), that group's ring line
    (``ring_only``: what ZeRO 3's all-gathers and reduce-scatters take half of), and the link its
    activations cross to the next stage (:func:`link_of`; None for the last stage and at the turn
    of a V, whose two chunks share a rank)."""

    grad_lines: tuple[Line, ...]
    ring_lines: tuple[Line, ...]
    next_links: tuple[Link | None, ...]


#: per layout (of one cluster object) its StageLinks: rank arithmetic a search would otherwise redo
#: for every table, bound and stage a layout is priced in
_STAGE_LINKS: Cache[Layout, tuple[Cluster, StageLinks]] = Cache(
    "cost.collectives.stage_links", key="layout (the cluster object checked on a hit)", bound=4096)


def stage_links(cluster: Cluster, layout: Layout) -> StageLinks:
    """The :class:`StageLinks` of ``layout``'s stages on ``cluster`` (kept per layout)."""
    found = _STAGE_LINKS.get(layout)
    if found is None or found[0] is not cluster:
        stages = range(layout.num_stages)
        links: list[Link | None] = []
        for s in stages:
            src = layout.rank_of(stage_idx=s)
            dst = layout.rank_of(stage_idx=s + 1) if s + 1 < layout.num_stages else src
            links.append(None if src == dst else link_of(cluster, src, dst))
        found = _STAGE_LINKS.put(layout, (cluster, StageLinks(
            grad_lines=tuple(grad_group_line(cluster, layout, s) for s in stages),
            ring_lines=tuple(grad_group_line(cluster, layout, s, ring_only=True) for s in stages),
            next_links=tuple(links))))
    return found[1]
