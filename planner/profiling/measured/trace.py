"""Finer, operator-level graphs of the layers with ``torch.fx`` (PyTorch docs, "torch.fx").

A layer that ``torch.fx.symbolic_trace`` cannot trace (data-dependent control flow, say; every
Hugging Face block, and :func:`planner.models.chain` layers) stays at module granularity: it is
one node; the profile's metadata names it (``fx_untraced_layers``), and with ``warn`` (``planner
profile --verbose``) a warning does too.
"""

from __future__ import annotations

import warnings

import networkx as nx
import torch.fx
from torch import nn


def op_graph(layer: nn.Module, name: str, warn: bool = False) -> nx.DiGraph | None:
    """The layer's operator DAG (nodes: fx node names with ``op`` and ``target``), or None
    when the layer cannot be traced (with a warning when ``warn``)."""
    try:
        traced = torch.fx.symbolic_trace(layer)
    except Exception as exc:
        if not warn:
            return None
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
