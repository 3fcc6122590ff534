"""From a Profile's layer DAG to the chain of cut points the solver works on.

Layers are stored in a topological order, so every prefix ``layers[:i]`` is a downward-closed
set and a stage boundary may fall before any layer ``i`` in ``1..L-1``. The bytes crossing the
boundary before layer ``i`` are the tensors produced before ``i`` and consumed at or after it:
for each producing layer, the largest edge it sends past the boundary (fan-out of one tensor
to several consumers crosses once). Skip connections therefore count on every cut they span.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from planner.artifacts.profile import AttentionCore, Edge, Layer, Profile, SharedSaved, TiedParams, TimeFit

if TYPE_CHECKING:
    import networkx as nx


def layer_graph(profile: Profile) -> nx.DiGraph:
    """The layer DAG: nodes are layer indices (with names), edges carry ``bytes_per_sample``."""
    import networkx as nx  # imported here: planning itself never needs it

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


def merge_layers(profile: Profile, starts: list[int] | tuple[int, ...]) -> Profile:
    """The profile with consecutive layers merged into groups beginning at ``starts``.

    A group's times, parameters and saved bytes are sums; its bytes kept when recomputed are
    the sum of its layers' inputs (recomputing a group = recomputing each of its layers, so a
    plan over groups maps onto layers with the same or less memory); the tensors crossing a
    group boundary are exactly those crossing that cut of the original DAG, so the merged
    profile is a chain whose edges carry the original cut sizes. Tied tensors inside one
    group are counted once, and so are storages two of its layers both save
    (``Profile.shared_saved``); pairs across groups become pairs of groups. A group's attention
    core (its selective level) is its members' cores together.
    """
    L = profile.num_layers
    starts = sorted(set(starts) | {0})
    if starts[-1] >= L or starts[0] != 0:
        raise ValueError(f"group starts must lie in [0, {L})")
    cut = cut_bytes_per_sample(profile)
    stops = starts[1:] + [L]
    group_of = np.zeros(L, dtype=int)
    for g, (a, z) in enumerate(zip(starts, stops)):
        group_of[a:z] = g
    inner = [0.0] * len(starts)
    inner_fixed = [0.0] * len(starts)
    shared: dict[tuple[int, int], tuple[float, float]] = {}
    for pair in profile.shared_saved:
        g1, g2 = int(group_of[pair.first]), int(group_of[pair.second])
        if g1 == g2:
            inner[g1] += pair.bytes_per_sample
            inner_fixed[g1] += pair.bytes_fixed
        else:
            per, fixed = shared.get((g1, g2), (0.0, 0.0))
            shared[(g1, g2)] = (per + pair.bytes_per_sample, fixed + pair.bytes_fixed)
    layers = []
    for g, (a, z) in enumerate(zip(starts, stops)):
        members = profile.layers[a:z]
        params = sum(m.param_count for m in members)
        pbytes = sum(m.param_bytes for m in members)
        for tie in profile.tied:
            inside = sum(1 for i in tie.layers if a <= i < z)
            if inside >= 2:
                params -= (inside - 1) * tie.param_count
                pbytes -= (inside - 1) * tie.param_bytes
        layers.append(
            Layer(
                name=members[0].name if z - a == 1 else f"{members[0].name}..{members[-1].name}",
                kind="group" if z - a > 1 else members[0].kind,
                fwd=TimeFit(intercept_ms=sum(m.fwd.intercept_ms for m in members),
                            per_sample_ms=sum(m.fwd.per_sample_ms for m in members)),
                bwd=TimeFit(intercept_ms=sum(m.bwd.intercept_ms for m in members),
                            per_sample_ms=sum(m.bwd.per_sample_ms for m in members)),
                param_count=params,
                param_bytes=pbytes,
                saved_bytes_per_sample=max(0.0, sum(m.saved_bytes_per_sample for m in members) - inner[g]),
                saved_bytes_fixed=max(0.0, sum(m.saved_bytes_fixed for m in members) - inner_fixed[g]),
                input_bytes_per_sample=sum(m.input_bytes_per_sample for m in members),
                output_bytes_per_sample=float(cut[z]) if z < L else members[-1].output_bytes_per_sample,
                attention_core=_merged_core(members),
            )
        )
    edges = tuple(Edge(src=g, dst=g + 1, bytes_per_sample=float(cut[stops[g]])) for g in range(len(starts) - 1))
    tied = []
    for tie in profile.tied:
        groups = sorted({int(group_of[i]) for i in tie.layers})
        if len(groups) >= 2:
            tied.append(TiedParams(name=tie.name, layers=tuple(groups), param_count=tie.param_count,
                                   param_bytes=tie.param_bytes))
    pairs = tuple(SharedSaved(first=g1, second=g2, bytes_per_sample=per, bytes_fixed=fixed)
                  for (g1, g2), (per, fixed) in sorted(shared.items()))
    from dataclasses import replace

    return replace(profile, layers=tuple(layers), edges=edges, tied=tuple(tied), shared_saved=pairs)


def _merged_core(members: tuple[Layer, ...]) -> AttentionCore | None:
    """The attention cores of a group's layers as one (None when none has one)."""
    cores = [m.attention_core for m in members if m.attention_core is not None]
    if not cores:
        return None
    return AttentionCore(
        saved_bytes_per_sample=sum(c.saved_bytes_per_sample for c in cores),
        saved_bytes_fixed=sum(c.saved_bytes_fixed for c in cores),
        fwd=TimeFit(intercept_ms=sum(c.fwd.intercept_ms for c in cores), per_sample_ms=sum(c.fwd.per_sample_ms for c in cores)),
    )


def coarse_starts(profile: Profile, max_groups: int, forced: tuple[int, ...] = ()) -> list[int]:
    """At most ``max_groups`` group starts: near-equal compute per group, each boundary moved
    to the cheapest cut (fewest bytes crossing) within a window around its ideal position.
    ``forced`` starts (user-fixed stage boundaries) are always kept."""
    L = profile.num_layers
    if L <= max_groups:
        return list(range(L))
    work = np.array([lay.fwd_ms(1) + lay.bwd_ms(1) for lay in profile.layers]) + 1e-9
    prefix = np.concatenate([[0.0], np.cumsum(work)])
    cut = cut_bytes_per_sample(profile)
    k = max(1, max_groups - len(forced))
    ideal = np.searchsorted(prefix, prefix[-1] * np.arange(1, k) / k)
    half = max(1, L // (2 * k))
    starts = {0, *forced}
    for pos in ideal:
        lo, hi = max(1, int(pos) - half), min(L - 1, int(pos) + half)
        window = np.arange(lo, hi + 1)
        best = window[np.lexsort((np.abs(window - pos), cut[window]))[0]]
        starts.add(int(best))
    return sorted(starts)
