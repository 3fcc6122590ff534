"""PipeDream's optimizer, reimplemented: the stage boundaries and per-stage replication factors
its ``optimizer_graph_hierarchical.py`` chooses on a PipeDream ``graph.txt`` profile (Narayanan
et al., SOSP'19, sec. 3.1; msr-fiddle/pipedream ``optimizer/``, read in
``../shared/reference/pipedream/optimizer_src``; one level, ``final_level``, as that script runs
with one ``-n``/``-b`` pair).

States. The optimizer does not cut a chain of layers: its DP runs over the *antichain DAG* of
the node graph (``graph.py``: ``antichain_dag``). A state is an antichain of nodes; its
*augmented* antichain adds every predecessor ``p`` of an antichain node ``a`` with an edge leaving
``a``'s ancestors (``p`` still feeds something that runs after the cut); the successors of a
state replace one augmented node by one of its graph successors none of whose descendants is
in the augmented set, then drop the nodes that are ancestors of others (``deaugment``). A
state's figures are sums over its *downset* (the antichain and all its ancestors): compute
``(fwd + bwd) / 1000``, activation bytes, parameter bytes; its output activation is the sum over
the augmented antichain. A stage from state ``k`` to state ``j`` (``k`` an ancestor of ``j`` in
the antichain DAG) runs the nodes ``downset(j) - downset(k)``.

DP (``compute_partitioning``), ``A[j][m]``: the least slowest-stage time of the nodes of
``downset(j)`` on ``m + 1`` machines::

    A[j][m] = min( (C_j + 4 m P_j / (B (m + 1))) / (m + 1),                      one stage
                   min_{k < j, 1 <= r <= m} max(A[k][m - r], (C_jk + 4 (r - 1) P_jk / (B r)) / r,
                                                2 O_k / (B r c), 2 O_j / (B r c)) )  last stage

with ``O_j`` left out for the final state, the transfer terms only when an activation
compression ratio ``c`` is given, and (``use_memory_constraint``) a stage skipped when its stashed
bytes ``(Act + P) x ceil((N - (m + 1)) / r)`` exceed the memory size. ``straight_pipeline``
allows one machine per stage; ``use_fewer_machines`` lets ``A[j][m]`` take ``A[j][m - 1]``.
Ties: the first candidate found stays (a later one must be strictly less), as in the original;
the original visits ancestors in Python set order, we visit them by increasing state index
(states numbered in breadth-first discovery order from the first source, then topologically
sorted), so between equal objectives the two may pick different splits.

Inputs are the graph's nodes without its ``Input`` nodes (the optimizer zeroes and removes them;
they join stage 0) and without unused ``__getitem__`` sinks. From a Profile imported by
:mod:`planner.profiling.imported.pipedream`, layer 0 (the merged inputs) is left out and every
other layer is one node; the first source is the first layer after layer 0 (the source with the
smallest node id, which is the file's first source on all 14 published profiles).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.artifacts.profile import Profile

__all__ = [
    "Choice",
    "NodeGraph",
    "OptimizerArgs",
    "States",
    "TooManyStates",
    "antichain_states",
    "nodes_of_profile",
    "objective_of",
    "optimize",
    "prefix_bounds",
    "restricted",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeGraph:
    """The optimizer's input graph: per node (in a fixed order) its figures per minibatch and
    its successors (indices); node 0 is the antichain DAG's start (the first source)."""

    names: tuple[str, ...]
    compute_s: tuple[float, ...]  # (forward + backward ms) / 1000, as the optimizer sums it
    activation_bytes: tuple[float, ...]
    param_bytes: tuple[float, ...]
    succ: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        n = len(self.names)
        if not n or any(len(x) != n for x in (self.compute_s, self.activation_bytes, self.param_bytes, self.succ)):
            raise ValueError(f"NodeGraph: every per-node field needs {n} (> 0) entries")
        if any(not 0 <= v < n for s in self.succ for v in s):
            raise ValueError("NodeGraph: a successor index is out of range")


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerArgs:
    """The optimizer's command-line arguments (one level: ``-n N -b B -s S``)."""

    num_machines: int
    bandwidth_bytes_per_s: float
    memory_bytes: float = 16e9
    use_memory_constraint: bool = True
    straight_pipeline: bool = False
    use_fewer_machines: bool = False
    activation_compression_ratio: float | None = 1.0

    def __post_init__(self) -> None:
        if self.num_machines < 1:
            raise ValueError(f"num_machines must be >= 1 (got {self.num_machines})")
        if not self.bandwidth_bytes_per_s > 0 or not self.memory_bytes > 0:
            raise ValueError(f"bandwidth_bytes_per_s and memory_bytes must be > 0 "
                             f"(got {self.bandwidth_bytes_per_s}, {self.memory_bytes})")
        if self.activation_compression_ratio is not None and not self.activation_compression_ratio > 0:
            raise ValueError(f"activation_compression_ratio must be > 0 (got {self.activation_compression_ratio})")


@dataclass(frozen=True, slots=True, kw_only=True)
class States:
    """The antichain DAG's states in topological order: each one's downset (a bit mask over the
    graph's nodes), augmented antichain, and ancestors (state indices, increasing)."""

    downsets: tuple[int, ...]
    augmented: tuple[frozenset[int], ...]
    ancestors: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """The optimizer's answer: per stage its nodes (indices into the graph) and copies, and the
    slowest stage's time (seconds per minibatch, the script's "Time per stage in pipeline")."""

    stage_nodes: tuple[frozenset[int], ...]
    replicas: tuple[int, ...]
    objective_s: float
    boundary_downsets: tuple[int, ...]  # the downset (bit mask) of each stage's last state


def nodes_of_profile(profile: Profile) -> NodeGraph:
    """The node graph of a Profile imported from a PipeDream ``graph.txt`` (see the module
    docstring): layers 1.. as nodes, figures at the profile's minibatch ``microbatch_sizes[0]``
    (its measured point where kept, else the fitted time)."""
    if profile.source != "pipedream" or profile.num_layers < 2:
        raise ValueError(f"profile {profile.model!r} was not imported from a PipeDream graph.txt")
    b0 = profile.microbatch_sizes[0]
    layers = profile.layers[1:]

    def ms(layer_idx: int) -> float:
        layer = layers[layer_idx]
        point = next((p for p in layer.measured if p.microbatch_size == b0), None)
        return point.fwd_ms + point.bwd_ms if point else layer.fwd_ms(b0) + layer.bwd_ms(b0)

    succ: list[dict[int, None]] = [{} for _ in layers]
    for e in profile.edges:
        if e.src > 0:
            succ[e.src - 1][e.dst - 1] = None
    return NodeGraph(
        names=tuple(layer.name for layer in layers),
        compute_s=tuple(ms(i) / 1000.0 for i in range(len(layers))),
        activation_bytes=tuple(layer.output_bytes_per_sample * b0 for layer in layers),
        param_bytes=tuple(float(layer.param_bytes) for layer in layers),
        succ=tuple(tuple(s) for s in succ),
    )


def _closures(graph: NodeGraph) -> tuple[list[int], list[int]]:
    """Per node the bit masks of its strict ancestors and strict descendants."""
    n = len(graph.names)
    pred: list[list[int]] = [[] for _ in range(n)]
    for u, vs in enumerate(graph.succ):
        for v in vs:
            pred[v].append(u)
    order, indeg = [], [len(p) for p in pred]
    ready = [u for u in range(n) if not indeg[u]]
    while ready:
        u = ready.pop()
        order.append(u)
        for v in graph.succ[u]:
            indeg[v] -= 1
            if not indeg[v]:
                ready.append(v)
    if len(order) < n:
        raise ValueError("the node graph has a cycle")
    anc, desc = [0] * n, [0] * n
    for u in order:
        for p in pred[u]:
            anc[u] |= anc[p] | (1 << p)
    for u in reversed(order):
        for v in graph.succ[u]:
            desc[u] |= desc[v] | (1 << v)
    return anc, desc


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class TooManyStates(ValueError):
    """The antichain DAG grows past the limit asked for (graphs with much branching, e.g.
    Inception and NASNet: PipeDream's README says its optimizer does not work on them)."""


def antichain_states(graph: NodeGraph, max_states: int | None = None) -> States:
    """The antichain DAG from node 0 (``graph.py``'s ``antichain_dag``, see the module docstring),
    its states numbered in breadth-first discovery order, then put in topological order;
    :class:`TooManyStates` once it passes ``max_states``."""
    anc, desc = _closures(graph)

    def augment(antichain: frozenset[int]) -> frozenset[int]:
        extra = {p for a in antichain for p in _bits(anc[a])
                 if any(o != a and not (anc[a] >> o) & 1 for o in graph.succ[p])}
        return frozenset(extra) | antichain

    def deaugment(nodes: frozenset[int]) -> frozenset[int]:
        return frozenset(x for x in nodes if not any((desc[x] >> y) & 1 for y in nodes if y != x))

    start = frozenset({0})
    index = {start: 0}
    keys, succ = [start], [[]]  # type: ignore[var-annotated]
    queue = [start]
    while queue:
        antichain = queue.pop(0)
        aug = augment(antichain)
        aug_mask = sum(1 << x for x in aug)
        for a in sorted(aug):
            for v in graph.succ[a]:
                if v in antichain or desc[v] & aug_mask:
                    continue
                nxt = deaugment((aug - {a}) | {v})
                if nxt not in index:
                    if max_states is not None and len(keys) >= max_states:
                        raise TooManyStates(f"the antichain DAG has more than {max_states} states")
                    index[nxt] = len(keys)
                    keys.append(nxt)
                    succ.append([])
                    queue.append(nxt)
                if index[nxt] not in succ[index[antichain]]:
                    succ[index[antichain]].append(index[nxt])
    topo = _topological(succ)
    rank = {old: new for new, old in enumerate(topo)}
    ancestors: list[int] = [0] * len(keys)  # bit masks over new indices
    for old in topo:
        for child in succ[old]:
            ancestors[rank[child]] |= ancestors[rank[old]] | (1 << rank[old])
    downsets = []
    for old in topo:
        mask = 0
        for a in keys[old]:
            mask |= anc[a] | (1 << a)
        downsets.append(mask)
    return States(downsets=tuple(downsets), augmented=tuple(augment(keys[old]) for old in topo),
                  ancestors=tuple(tuple(_bits(ancestors[i])) for i in range(len(keys))))


def _topological(succ: list[list[int]]) -> list[int]:
    """Kahn's algorithm over state indices, the smallest ready index first."""
    indeg = [0] * len(succ)
    for vs in succ:
        for v in vs:
            indeg[v] += 1
    ready = [u for u in range(len(succ)) if not indeg[u]]
    out = []
    while ready:
        u = heapq.heappop(ready)
        out.append(u)
        for v in succ[u]:
            indeg[v] -= 1
            if not indeg[v]:
                heapq.heappush(ready, v)
    return out


@dataclass(frozen=True, slots=True)
class _Sums:
    compute: np.ndarray
    activation: np.ndarray
    params: np.ndarray
    output: np.ndarray


def _sums(graph: NodeGraph, states: States) -> _Sums:
    def total(values: Sequence[float], mask: int) -> float:
        return float(sum(values[x] for x in _bits(mask)))

    return _Sums(
        compute=np.array([total(graph.compute_s, d) for d in states.downsets]),
        activation=np.array([total(graph.activation_bytes, d) for d in states.downsets]),
        params=np.array([total(graph.param_bytes, d) for d in states.downsets]),
        output=np.array([sum(graph.activation_bytes[x] for x in aug) for aug in states.augmented], dtype=float),
    )


def _stage_terms(
    s: _Sums, args: OptimizerArgs, j: int, ks: np.ndarray, r: np.ndarray, used: np.ndarray, final: bool
) -> np.ndarray:
    """The slowest of a last stage's terms (from states ``ks`` to ``j`` on ``r`` copies, ``used``
    machines up to and including it; inf where it breaks the memory constraint), broadcast."""
    bw, n = args.bandwidth_bytes_per_s, args.num_machines
    params = s.params[j] - s.params[ks]
    t = (s.compute[j] - s.compute[ks] + 4.0 * (r - 1) * params / (bw * r)) / r
    if args.activation_compression_ratio is not None:
        t = np.maximum(t, 2.0 * s.output[ks] / (bw * r) / args.activation_compression_ratio)
        if not final:
            t = np.maximum(t, 2.0 * s.output[j] / (bw * r) / args.activation_compression_ratio)
    if args.use_memory_constraint:
        stashed = (s.activation[j] - s.activation[ks] + params) * np.ceil((n - used) / r)
        t = np.where(stashed > args.memory_bytes, np.inf, t)
    out: np.ndarray = t
    return out


def optimize(graph: NodeGraph, args: OptimizerArgs, states: States | None = None) -> Choice | None:
    """The optimizer's choice on all ``args.num_machines`` machines (or fewer, with
    ``use_fewer_machines``), or None where no split meets the memory constraint (the original
    then fails in its traceback)."""
    states = states or antichain_states(graph)
    s = _sums(graph, states)
    S, N, bw = len(states.downsets), args.num_machines, args.bandwidth_bytes_per_s
    A = np.full((S, N), np.inf)
    arg_k = np.full((S, N), -1, dtype=np.int64)  # -1: one stage
    arg_m = np.zeros((S, N), dtype=np.int64)  # the machines index of the part before the last stage
    arg_r = np.zeros((S, N), dtype=np.int64)
    for m in range(1 if args.straight_pipeline else N):
        one = (s.compute + 4.0 * m * s.params / (bw * (m + 1))) / (m + 1)
        if args.use_memory_constraint:
            stashed = math.ceil((N - (m + 1)) / (m + 1)) * (s.activation + s.params)
            one = np.where(stashed > args.memory_bytes, np.inf, one)
        A[:, m], arg_r[:, m] = one, m + 1
    rs = np.arange(1, 2 if args.straight_pipeline else N)  # copies of the last stage
    ms = np.arange(1, N)  # machines index m: m + 1 machines in all
    before = ms[:, None] - rs[None, :]  # (m, r): the machines index of the part before
    for j in range(1, S if N > 1 else 1):
        ks = np.array(states.ancestors[j], dtype=np.int64)
        if len(ks):
            # (k, m, r): the pipeline of k on m - r, then the last stage k -> j on r copies
            prev = np.where(before >= 0, A[ks[:, None, None], np.maximum(before, 0)[None]], np.inf)
            last = _stage_terms(s, args, j, ks[:, None, None], rs[None, None, :], ms[None, :, None] + 1, j == S - 1)
            t = np.maximum(prev, last).transpose(1, 0, 2).reshape(len(ms), -1)  # per m, in (k, r) order
            flat = np.argmin(t, axis=1)  # the first least, the original's loop order
        for m in range(1, N):
            if args.use_fewer_machines and A[j, m - 1] < A[j, m]:  # also when A[j, m] is None (inf)
                A[j, m], arg_k[j, m], arg_m[j, m], arg_r[j, m] = A[j, m - 1], arg_k[j, m - 1], arg_m[j, m - 1], arg_r[j, m - 1]
            if len(ks) and t[m - 1, flat[m - 1]] < A[j, m]:
                k_at, r_at = divmod(int(flat[m - 1]), len(rs))
                A[j, m], arg_k[j, m], arg_m[j, m], arg_r[j, m] = t[m - 1, flat[m - 1]], ks[k_at], m - rs[r_at], rs[r_at]
    if not np.isfinite(A[S - 1, N - 1]):
        return None
    bounds, reps, j, m = [], [], S - 1, N - 1
    while True:
        bounds.append(states.downsets[j])
        reps.append(int(arg_r[j, m]))
        if arg_k[j, m] < 0:
            break
        j, m = int(arg_k[j, m]), int(arg_m[j, m])
    bounds.reverse()
    reps.reverse()
    nodes = tuple(frozenset(_bits(d & ~prev)) for d, prev in zip(bounds, [0] + bounds[:-1]))
    return Choice(stage_nodes=nodes, replicas=tuple(reps), objective_s=float(A[S - 1, N - 1]),
                  boundary_downsets=tuple(bounds))


def objective_of(
    graph: NodeGraph, args: OptimizerArgs, stage_nodes: Sequence[frozenset[int]], replicas: Sequence[int],
    states: States | None = None,
) -> float:
    """The optimizer's objective of a given split (its slowest stage, seconds): inf when the
    stages are not a path of the antichain DAG from its start to its last state, or break the
    memory constraint (how ties between the original's choice and ours are judged)."""
    states = states or antichain_states(graph)
    s = _sums(graph, states)
    where = {d: i for i, d in enumerate(states.downsets)}
    path, mask = [], 0
    for nodes in stage_nodes:
        mask |= sum(1 << x for x in nodes)
        if mask not in where:
            return math.inf
        path.append(where[mask])
    last = len(states.downsets) - 1
    if len(path) != len(replicas) or path[-1] != last:
        return math.inf
    if any(k not in states.ancestors[j] for k, j in itertools.pairwise(path)):
        return math.inf
    n, bw = args.num_machines, args.bandwidth_bytes_per_s
    used = replicas[0]
    r0 = replicas[0]
    worst = (s.compute[path[0]] + 4.0 * (r0 - 1) * s.params[path[0]] / (bw * r0)) / r0
    if args.use_memory_constraint and math.ceil((n - r0) / r0) * (s.activation[path[0]] + s.params[path[0]]) > args.memory_bytes:
        return math.inf
    for k, j, r in zip(path, path[1:], replicas[1:]):
        used += r
        term = _stage_terms(s, args, j, np.array(k), np.array(r), np.array(used), j == last)
        worst = max(worst, float(term))
    return float(worst) if used <= n else math.inf


def restricted(states: States, keep: Sequence[bool]) -> States:
    """The states kept (in the same order), each with its kept ancestors: the DP over them
    chooses among the splits whose boundaries are all kept states."""
    new = {old: i for i, old in enumerate(i for i, k in enumerate(keep) if k)}
    return States(downsets=tuple(states.downsets[i] for i in new), augmented=tuple(states.augmented[i] for i in new),
                  ancestors=tuple(tuple(new[a] for a in states.ancestors[i] if a in new) for i in new))


def prefix_bounds(choice: Choice) -> tuple[int, ...] | None:
    """Stage starts as node indices where every stage boundary is a prefix of the node order
    (downset = nodes ``0 .. c - 1``), else None."""
    starts = [0]
    for d in choice.boundary_downsets[:-1]:
        if d & (d + 1):  # not of the form 2^c - 1
            return None
        starts.append(d.bit_length())
    return tuple(starts)
