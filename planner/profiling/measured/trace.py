"""Finer, operator-level graphs of the layers with ``torch.fx`` (PyTorch docs, "torch.fx").

A layer that ``torch.fx.symbolic_trace`` cannot trace (data-dependent control flow, say)
stays at module granularity: it is one node, and a warning names it.
"""

from __future__ import annotations

import warnings

import networkx as nx
import torch.fx
from torch import nn


def op_graph(layer: nn.Module, name: str) -> nx.DiGraph | None:
    """The layer's operator DAG (nodes: fx node names with ``op`` and ``target``), or None
    with a warning when the layer cannot be traced."""
    try:
        traced = torch.fx.symbolic_trace(layer)
    except Exception as exc:
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:160]
        warnings.warn(
            f"layer {name!r} ({type(layer).__name__}) cannot be traced by torch.fx ({reason}); "
            "kept at module granularity",
            stacklevel=2,
        )
        return None
    graph = nx.DiGraph()
    for node in traced.graph.nodes:
        graph.add_node(node.name, op=node.op, target=str(node.target))
        for arg in node.all_input_nodes:
            graph.add_edge(arg.name, node.name)
    return graph
