"""Small random chain profiles for solver tests (hypothesis strategies and a plain builder)."""

from __future__ import annotations

from hypothesis import strategies as st

from planner.artifacts.cluster import Cluster
from planner.artifacts.kinds import DType
from planner.artifacts.profile import Edge, Layer, Profile, TimeFit


def chain_profile(layers: list[dict], name: str = "chain") -> Profile:
    """A chain profile from per-layer dicts: fwd, bwd (ms per sample), params, saved, inp, out (bytes)."""
    out = []
    for i, d in enumerate(layers):
        out.append(
            Layer(
                name=f"l{i}",
                fwd=TimeFit(intercept_ms=d.get("fwd0", 0.0), per_sample_ms=d["fwd"]),
                bwd=TimeFit(intercept_ms=d.get("bwd0", 0.0), per_sample_ms=d["bwd"]),
                param_count=d["params"],
                param_bytes=4 * d["params"],
                saved_bytes_per_sample=d["saved"],
                input_bytes_per_sample=d["inp"],
                output_bytes_per_sample=d["out"],
            )
        )
    edges = tuple(Edge(src=i, dst=i + 1, bytes_per_sample=out[i].output_bytes_per_sample) for i in range(len(out) - 1))
    return Profile(
        model=name, source="synthetic", device="test", dtype=DType.FLOAT32, microbatch_sizes=(1,),
        layers=tuple(out), edges=edges,
    )


def layer_dicts(max_layers: int = 6):
    layer = st.fixed_dictionaries(
        {
            "fwd": st.floats(0.1, 10.0),
            "bwd": st.floats(0.1, 20.0),
            "params": st.integers(0, 5_000_000),
            "saved": st.floats(0, 50e6),
            "inp": st.floats(0, 10e6),
            "out": st.floats(0, 10e6),
        }
    )
    return st.lists(layer, min_size=1, max_size=max_layers)


def small_cluster(num_devices: int = 4, memory_bytes: int = 2 * 10**9, per_node: int = 2) -> Cluster:
    per_node = min(per_node, num_devices)
    return Cluster(
        name="test",
        device_name="test-gpu",
        num_nodes=max(1, num_devices // per_node),
        devices_per_node=per_node,
        device_memory_bytes=memory_bytes,
        intra_node_bandwidth_gb_per_s=100.0,
        intra_node_latency_us=5.0,
        inter_node_bandwidth_gb_per_s=10.0,
        inter_node_latency_us=10.0,
    )
