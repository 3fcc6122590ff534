"""From a Profile's layer DAG to the chain of cut points the solver works on.

Layers are stored in a topological order, so every prefix ``layers[:i]`` is a downward-closed
set and a stage boundary may fall before any layer ``i`` in ``1..L-1``. The bytes crossing the
boundary before layer ``i`` are the tensors produced before ``i`` and consumed at or after it:
for each producing layer, the largest edge it sends past the boundary (fan-out of one tensor
to several consumers crosses once). Skip connections therefore count on every cut they span.
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from planner.artifacts.profile import Profile


def layer_graph(profile: Profile) -> nx.DiGraph:
    """The layer DAG: nodes are layer indices (with names), edges carry ``bytes_per_sample``."""
    graph = nx.DiGraph()
    for idx, layer in enumerate(profile.layers):
        graph.add_node(idx, name=layer.name)
    for edge in profile.edges:
        prev = graph.get_edge_data(edge.src, edge.dst, default={}).get("bytes_per_sample", 0.0)
        graph.add_edge(edge.src, edge.dst, bytes_per_sample=max(prev, edge.bytes_per_sample))
    return graph


def cut_bytes_per_sample(profile: Profile) -> np.ndarray:
    """``cut[i]`` = bytes per sample crossing the boundary just before layer ``i``.

    ``cut[0]`` and ``cut[L]`` are 0 (the batch and the loss are not pipeline transfers).
    Runs in O(E + L) with a difference array over each producer's live range.
    """
    num_layers = profile.num_layers
    # per producer: the furthest consumer and the bytes of its (largest) outgoing tensor
    reach: dict[int, tuple[int, float]] = {}
    for edge in profile.edges:
        last, size = reach.get(edge.src, (edge.src, 0.0))
        reach[edge.src] = (max(last, edge.dst), max(size, edge.bytes_per_sample))
    diff = np.zeros(num_layers + 2)
    for src, (last, size) in reach.items():
        # live across boundaries src+1 .. last
        diff[src + 1] += size
        diff[last + 1] -= size
    cut = np.cumsum(diff)[: num_layers + 1]
    cut[0] = 0.0
    cut[num_layers] = 0.0
    return cut
