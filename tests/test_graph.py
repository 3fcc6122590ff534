"""Cut sizes over the layer DAG, and merging layers into groups."""

from __future__ import annotations

import dataclasses

import numpy as np

from planner.artifacts.profile import Edge, TiedParams
from planner.graph import coarse_starts, cut_bytes_per_sample, layer_graph, merge_layers
from tests.chains import chain_profile


def _skip_profile():
    # 0 -> 1 -> 2 -> 3 with a skip 0 -> 3 (bytes 5) and a fan-out of 1's output to 2 and 3
    prof = chain_profile([dict(fwd=1, bwd=2, params=10, saved=100, inp=10, out=20)] * 4)
    edges = (
        Edge(src=0, dst=1, bytes_per_sample=20),
        Edge(src=0, dst=3, bytes_per_sample=5),
        Edge(src=1, dst=2, bytes_per_sample=7),
        Edge(src=1, dst=3, bytes_per_sample=7),
        Edge(src=2, dst=3, bytes_per_sample=3),
    )
    return dataclasses.replace(prof, edges=edges)


def test_cut_counts_skips_once_per_producer():
    cut = cut_bytes_per_sample(_skip_profile())
    # before 1: 0's tensor (max 20); before 2: 0's (skip, 5... max edge of producer 0 is 20) + 1's (7)
    assert list(cut) == [0.0, 20.0, 27.0, 30.0, 0.0]


def test_layer_graph_has_every_edge():
    g = layer_graph(_skip_profile())
    assert sorted(g.edges) == [(0, 1), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert g.nodes[3]["name"] == "l3"


def test_merge_preserves_cuts_times_and_params():
    prof = _skip_profile()
    merged = merge_layers(prof, [0, 2])
    assert merged.num_layers == 2
    assert list(cut_bytes_per_sample(merged)) == [0.0, 27.0, 0.0]
    assert merged.layers[0].fwd.per_sample_ms == 2 and merged.layers[1].bwd.per_sample_ms == 4
    assert sum(lay.param_count for lay in merged.layers) == 40
    assert merged.layers[0].input_bytes_per_sample == 20  # recomputing a group = each of its layers


def test_merge_counts_a_tied_tensor_once_inside_a_group():
    prof = dataclasses.replace(
        _skip_profile(), tied=(TiedParams(name="w", layers=(0, 1), param_count=4, param_bytes=16),)
    )
    merged = merge_layers(prof, [0, 2])
    assert merged.layers[0].param_count == 16 and merged.tied == ()
    split = merge_layers(prof, [0, 1, 2])
    assert split.tied[0].layers == (0, 1)


def test_coarse_starts_bounded_and_prefer_cheap_cuts():
    layers = [dict(fwd=1, bwd=2, params=1, saved=1, inp=1, out=(1e3 if i % 4 == 3 else 1e6)) for i in range(200)]
    prof = chain_profile(layers)
    starts = coarse_starts(prof, 20)
    assert starts[0] == 0 and len(starts) <= 20
    cut = cut_bytes_per_sample(prof)
    assert np.mean([cut[s] for s in starts[1:]]) < 2e5  # mostly at the cheap cuts
    assert coarse_starts(prof, 20, forced=(7,)).count(7) == 1
