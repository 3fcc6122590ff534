"""Import PipeDream's ``graph.txt`` layer profiles (msr-fiddle/pipedream, ``profiler/*/profiles``).

Format (see ``../shared/reference/pipedream/README.md``; ``tests/graph_fixtures.py`` writes it): node lines
``id -- description -- forward_compute_time=F, backward_compute_time=B, activation_size=A,
parameter_size=P`` (times in ms per minibatch, bytes per minibatch in fp32, a tuple output
written ``[a; b; c]``), then tab-indented edge lines ``src -- dst``.

Conversion choices:

- every node is one layer, in a deterministic topological order
  (Kahn's algorithm taking the smallest numeric node id first, input nodes before the rest:
  the order ``networkx.lexicographical_topological_sort`` gives with that key, without
  importing networkx on the planning path);
- the input nodes are merged into layer 0, ``input``, with zero cost: their "forward time"
  is data loading, and they are pinned to the first stage;
- ``__getitem__`` nodes left without consumers are dropped (repeatedly);
- per-sample times and bytes are the minibatch figures divided by the batch size;
- bytes saved for backward by a node are estimated as its output activation (PipeDream
  records nothing finer); bytes kept when recomputed are its inputs' activations.
"""

from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass
from pathlib import Path

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import DType
from planner.artifacts.limits import MAX_BYTES, MAX_MS
from planner.artifacts.profile import Edge, Layer, Profile, TimeFit, TimePoint, profile_fingerprint
from planner.artifacts.reading import read_text

FP32_BYTES = 4
# bytes per sample of an fp32 RGB image input at the sizes PipeDream's image models use
IMAGE_INPUT_BYTES = {side: 3 * side * side * FP32_BYTES for side in (224, 299, 331)}
_KEYS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")
_NODE_ID = re.compile(r"^node(\d+)$")
_LSTM = re.compile(r"^LSTM\((\d+), (\d+)")


@dataclass(frozen=True, slots=True, kw_only=True)
class PipeDreamNode:
    """One node line of ``graph.txt``: costs are per minibatch."""

    node_id: str
    description: str
    fwd_ms: float
    bwd_ms: float
    activation_parts_bytes: tuple[float, ...]
    param_bytes: float
    line: int

    @property
    def activation_bytes(self) -> float:
        return float(sum(self.activation_parts_bytes))

    @property
    def is_input(self) -> bool:
        return self.description.startswith("Input")

    @property
    def kind(self) -> str:
        return self.description.split("(", 1)[0].strip()


@dataclass(frozen=True, slots=True, kw_only=True)
class PipeDreamGraph:
    """A parsed ``graph.txt``: its nodes (file order) and edges, nothing dropped."""

    source: str
    nodes: tuple[PipeDreamNode, ...]
    edges: tuple[tuple[str, str], ...]

    def counts(self) -> tuple[int, int]:
        """Raw ``(nodes, edges)`` as in the file (the README table's numbers)."""
        return len(self.nodes), len(self.edges)


def _fail(source: str, line: int, message: str) -> PlannerInputError:
    return PlannerInputError(f"{source}:{line}: {message}")


def _number(text: str, source: str, line: int, key: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _fail(source, line, f"{key} is not a number ({text[:40]!r})") from None
    if not math.isfinite(value) or value < 0:
        raise _fail(source, line, f"{key} must be finite and >= 0 ({text[:40]!r})")
    limit = MAX_MS if key.endswith("_time") else MAX_BYTES  # planner.artifacts.limits
    if value > limit:
        raise _fail(source, line, f"{key} must be at most {limit:g} ({text[:40]!r})")
    return value


def _parse_node(text: str, source: str, line: int) -> PipeDreamNode:
    node_id, sep, rest = text.partition(" -- ")
    description, sep2, fields = rest.rpartition(" -- ")
    if not sep or not sep2 or not _NODE_ID.match(node_id.strip()):
        raise _fail(source, line, f"expected 'nodeN -- description -- key=value, ...' (got {text[:60]!r})")
    values: dict[str, str] = {}
    for item in re.split(r",\s*(?![^\[]*\])", fields):
        key, eq, value = item.strip().partition("=")
        if eq:
            values[key] = value.strip()
    missing = [k for k in _KEYS if k not in values]
    if missing:
        raise _fail(source, line, f"node {node_id.strip()} lacks {missing[0]}")
    act = values["activation_size"]
    parts = act[1:-1].split(";") if act.startswith("[") and act.endswith("]") else [act]
    return PipeDreamNode(
        node_id=node_id.strip(),
        description=description.strip(),
        fwd_ms=_number(values["forward_compute_time"], source, line, "forward_compute_time"),
        bwd_ms=_number(values["backward_compute_time"], source, line, "backward_compute_time"),
        activation_parts_bytes=tuple(_number(p.strip(), source, line, "activation_size") for p in parts),
        param_bytes=_number(values["parameter_size"], source, line, "parameter_size"),
        line=line,
    )


def parse_graph(path: str | Path) -> PipeDreamGraph:
    """Parse ``graph.txt``; malformed content raises PlannerInputError naming file and line."""
    source = str(path)
    lines = read_text(path, "PipeDream graph.txt").splitlines()  # a regular UTF-8 file of bounded size
    nodes: dict[str, PipeDreamNode] = {}
    edges: list[tuple[str, str]] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        if raw[0] in " \t":
            src, sep, dst = raw.strip().partition(" -- ")
            if not sep or not _NODE_ID.match(src) or not _NODE_ID.match(dst.strip()):
                raise _fail(source, number, f"expected an edge 'nodeA -- nodeB' (got {raw.strip()[:60]!r})")
            for end in (src, dst.strip()):
                if end not in nodes:
                    raise _fail(source, number, f"edge names unknown node {end}")
            edges.append((src, dst.strip()))
            continue
        node = _parse_node(raw, source, number)
        if node.node_id in nodes:
            raise _fail(source, number, f"node {node.node_id} is defined twice")
        nodes[node.node_id] = node
    if not nodes:
        raise PlannerInputError(f"{source}: no nodes")
    graph = PipeDreamGraph(source=source, nodes=tuple(nodes.values()), edges=tuple(edges))
    _check_whole(graph)
    return graph


def _check_whole(graph: PipeDreamGraph) -> None:
    """Refuse a graph that cannot be a whole profile: nodes but no edges (a file cut before its
    edge lines: "24 nodes, 0 edges" converted to 14 unconnected layers), a node that computes
    or emits something but has no producer and is no Input (its incoming edges cut off: the
    profiles PipeDream wrote start only at Inputs, or at constants of no time and no size), or
    no compute time in any node."""
    source = graph.source
    if len(graph.nodes) > 1 and not graph.edges:
        raise PlannerInputError(f"{source}: {len(graph.nodes)} nodes but no edge lines ('\\tnodeA -- nodeB'): "
                                f"the file is cut short or not a PipeDream graph.txt")
    fed = {dst for _, dst in graph.edges}
    for node in graph.nodes:
        if node.node_id not in fed and not node.is_input and (node.fwd_ms or node.bwd_ms or node.activation_bytes):
            raise PlannerInputError(
                f"{source}: line {node.line}: node {node.node_id} ({node.description[:40]}) has no producer and is no "
                f"Input: an edge into it is missing (is the file cut short?)"
            )
    if not any(node.fwd_ms or node.bwd_ms for node in graph.nodes):
        raise PlannerInputError(f"{source}: every node's forward_compute_time and backward_compute_time is 0: "
                                f"no time to plan with")


def infer_batch_size(graph: PipeDreamGraph) -> int | None:
    """The minibatch size baked into the profile, or None when it cannot be told.

    Image models: the input's bytes over an fp32 RGB image of 224, 299 or 331 pixels, when
    that divides exactly. Sequence models (inputs of size 0): the batch of the first
    ``LSTM(in, hidden)`` node, from its h_n output part (1 x batch x hidden fp32 values).
    """
    inputs = [n for n in graph.nodes if n.is_input]
    total = sum(n.activation_bytes for n in inputs)
    if total > 0:
        for per_sample in IMAGE_INPUT_BYTES.values():
            if total % per_sample == 0:
                return int(total // per_sample)
        return None
    for node in sorted(graph.nodes, key=lambda n: _numeric(n.node_id)):
        match = _LSTM.match(node.description)
        if match and len(node.activation_parts_bytes) == 3:
            hidden = int(match.group(2))
            h_n = node.activation_parts_bytes[1]
            if h_n > 0 and h_n % (FP32_BYTES * hidden) == 0:
                return int(h_n // (FP32_BYTES * hidden))
    return None


def _numeric(node_id: str) -> int:
    return int(node_id[4:])


@dataclass
class _Dag:
    """The node graph: nodes and each node's successors and predecessors in the file's order
    (a repeated edge counts once)."""

    nodes: dict[str, PipeDreamNode]
    succ: dict[str, dict[str, None]]
    pred: dict[str, dict[str, None]]

    @classmethod
    def of(cls, graph: PipeDreamGraph) -> _Dag:
        dag = cls(nodes={node.node_id: node for node in graph.nodes}, succ={}, pred={})
        dag.succ = {n: {} for n in dag.nodes}
        dag.pred = {n: {} for n in dag.nodes}
        for u, v in graph.edges:
            dag.succ[u][v] = None
            dag.pred[v][u] = None
        return dag

    def edges(self) -> list[tuple[str, str]]:
        return [(u, v) for u in self.nodes for v in self.succ[u]]

    def remove(self, dropped: list[str]) -> None:
        for n in dropped:
            for p in self.pred.pop(n):
                del self.succ[p][n]
            for c in self.succ.pop(n):
                del self.pred[c][n]
            del self.nodes[n]

    def order(self, source: Path | str) -> list[str]:
        """Kahn's algorithm, the smallest key (input nodes first, then by numeric id) first;
        a cycle is an input error naming it."""
        index = {n: i for i, n in enumerate(self.nodes)}

        def entry(n: str) -> tuple[bool, int, int, str]:
            return (not self.nodes[n].is_input, _numeric(n), index[n], n)

        waiting = {n: len(self.pred[n]) for n in self.nodes}
        ready = [entry(n) for n, k in waiting.items() if k == 0]
        heapq.heapify(ready)
        order: list[str] = []
        while ready:
            n = heapq.heappop(ready)[-1]
            order.append(n)
            for c in self.succ[n]:
                waiting[c] -= 1
                if waiting[c] == 0:
                    heapq.heappush(ready, entry(c))
        if len(order) < len(self.nodes):
            left = set(self.nodes) - set(order)
            walk = [min(left, key=_numeric)]
            while True:  # every node left has a predecessor left: walk back until one repeats
                prev = next(p for p in self.pred[walk[-1]] if p in left)
                if prev in walk:
                    cycle = walk[walk.index(prev):][::-1]
                    break
                walk.append(prev)
            raise PlannerInputError(f"{source}: the graph has a cycle ({' -> '.join(cycle)})")
        return order


def _kept_dag(graph: PipeDreamGraph) -> _Dag:
    """The node graph without leftover ``__getitem__`` sinks (dropped until none is left)."""
    dag = _Dag.of(graph)
    while True:
        sinks = [n for n in dag.nodes if not dag.succ[n] and dag.nodes[n].description.startswith("__getitem__")]
        if not sinks:
            return dag
        dag.remove(sinks)


def to_profile(graph: PipeDreamGraph, *, batch_size: int, name: str) -> Profile:
    """Convert a parsed graph into a Profile (see the module docstring for the choices); a
    value the Profile refuses (e.g. a model name that is not one printable line) is an input error."""
    if batch_size < 1:
        raise PlannerInputError(f"--batch-size must be >= 1 (got {batch_size})")
    try:
        return _to_profile(graph, batch_size=batch_size, name=name)
    except ValueError as exc:
        if isinstance(exc, PlannerInputError):
            raise
        raise PlannerInputError(f"{graph.source}: {' '.join(str(exc).split())}") from None


def _to_profile(graph: PipeDreamGraph, *, batch_size: int, name: str) -> Profile:
    dag = _kept_dag(graph)
    nodes = dag.nodes
    order = dag.order(graph.source)
    inputs = [n for n in order if nodes[n].is_input]
    if not inputs:
        raise PlannerInputError(f"{graph.source}: no Input node")
    layer_of = {n: 0 for n in inputs}
    computes = [n for n in order if not nodes[n].is_input]
    for idx, n in enumerate(computes, start=1):
        layer_of[n] = idx
    per = float(batch_size)
    incoming = {n: sum(nodes[p].activation_bytes for p in dag.pred[n]) for n in computes}
    layers = [
        Layer(
            name="input",
            kind="Input",
            fwd=TimeFit(intercept_ms=0.0, per_sample_ms=0.0),
            bwd=TimeFit(intercept_ms=0.0, per_sample_ms=0.0),
            param_count=0,
            param_bytes=0,
            saved_bytes_per_sample=0.0,
            input_bytes_per_sample=0.0,
            output_bytes_per_sample=sum(nodes[n].activation_bytes for n in inputs) / per,
        )
    ]
    for n in computes:
        node = nodes[n]
        layers.append(
            Layer(
                name=n,
                kind=node.kind,
                fwd=TimeFit(intercept_ms=0.0, per_sample_ms=node.fwd_ms / per),
                bwd=TimeFit(intercept_ms=0.0, per_sample_ms=node.bwd_ms / per),
                measured=(TimePoint(microbatch_size=batch_size, fwd_ms=node.fwd_ms, bwd_ms=node.bwd_ms),),
                param_count=int(round(node.param_bytes / FP32_BYTES)),
                param_bytes=int(round(node.param_bytes)),
                saved_bytes_per_sample=node.activation_bytes / per,
                input_bytes_per_sample=incoming[n] / per,
                output_bytes_per_sample=node.activation_bytes / per,
            )
        )
    edges = sorted(
        {(layer_of[u], layer_of[v]): nodes[u].activation_bytes / per for u, v in dag.edges() if layer_of[u] != layer_of[v]}.items()
    )
    raw_nodes, raw_edges = graph.counts()
    return Profile(
        model=name,
        source="pipedream",
        device="gpu (PipeDream published profile)",
        dtype=DType.FLOAT32,
        microbatch_sizes=(batch_size,),
        metadata={
            "source_file": Path(graph.source).name,
            "raw_nodes": raw_nodes,
            "raw_edges": raw_edges,
            "dropped_getitem_sinks": raw_nodes - len(dag.nodes),
            "merged_inputs": len(inputs),
            "batch_size": batch_size,
            "per_sample": "minibatch times and bytes divided by batch_size",
            "saved_bytes_estimate": "a node's output activation (PipeDream records nothing finer)",
            "input_cost": "inputs merged into layer 0 with zero cost (data loading), pinned to the first stage",
        },
        fingerprint_sha256=profile_fingerprint(tuple(layer.name for layer in layers), tuple(() for _ in layers)),
        layers=tuple(layers),
        edges=tuple(Edge(src=s, dst=d, bytes_per_sample=b) for (s, d), b in edges),
    )


def import_pipedream(path: str | Path, *, batch_size: int | None = None, name: str | None = None) -> Profile:
    """Parse and convert ``graph.txt``; the batch size is inferred unless given."""
    graph = parse_graph(path)
    if batch_size is None:
        batch_size = infer_batch_size(graph)
        if batch_size is None:
            raise PlannerInputError(f"{path}: cannot infer the batch size; pass --batch-size")
    return to_profile(graph, batch_size=batch_size, name=name or Path(path).parent.name or "pipedream")
