"""The layer graph as a chain of cut points: bytes crossing each cut, merged layer groups."""

from planner.graph.cuts import coarse_starts, cut_bytes_per_sample, layer_graph, merge_layers

__all__ = ["coarse_starts", "cut_bytes_per_sample", "layer_graph", "merge_layers"]
