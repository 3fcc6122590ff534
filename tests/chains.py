"""Small random chain profiles for solver tests (hypothesis strategies and a plain builder)."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

from planner.artifacts.cluster import Cluster
from planner.artifacts.kinds import DType
from planner.artifacts.profile import AttentionCore, Edge, Layer, Profile, SharedSaved, TimeFit
from planner.solve.bruteforce import solve_chain_bruteforce
from planner.solve.chain_dp import solve_chain
from planner.solve.ilp import solve_chain_ilp


def chain_profile(layers: list[dict], name: str = "chain", shared: list[tuple[int, int, float]] = ()) -> Profile:
    """A chain profile from per-layer dicts: fwd, bwd (ms per sample), params, saved, inp, out
    (bytes); optionally saved0 (saved bytes whatever the micro-batch), core (the attention
    core's saved bytes: a selective level) with core_ms (its forward ms per sample), wfrac /
    wsaved (the weight-gradient pass's share of the backward / of the saved bytes). ``shared``:
    (first, second, bytes per sample) storages two layers both save."""
    out = []
    for i, d in enumerate(layers):
        core = None
        if d.get("core") is not None:
            core = AttentionCore(saved_bytes_per_sample=d["core"], fwd=TimeFit(intercept_ms=0.0, per_sample_ms=d["core_ms"]))
        out.append(
            Layer(
                name=f"l{i}",
                fwd=TimeFit(intercept_ms=d.get("fwd0", 0.0), per_sample_ms=d["fwd"]),
                bwd=TimeFit(intercept_ms=d.get("bwd0", 0.0), per_sample_ms=d["bwd"]),
                param_count=d["params"],
                param_bytes=4 * d["params"],
                saved_bytes_per_sample=d["saved"],
                saved_bytes_fixed=d.get("saved0", 0.0),
                input_bytes_per_sample=d["inp"],
                output_bytes_per_sample=d["out"],
                attention_core=core,
                weight_grad_fraction=d.get("wfrac"),
                weight_grad_saved_fraction=d.get("wsaved"),
            )
        )
    edges = tuple(Edge(src=i, dst=i + 1, bytes_per_sample=out[i].output_bytes_per_sample) for i in range(len(out) - 1))
    return Profile(
        model=name, source="synthetic", device="test", dtype=DType.FLOAT32, microbatch_sizes=(1,),
        layers=tuple(out), edges=edges,
        shared_saved=tuple(SharedSaved(first=a, second=b, bytes_per_sample=v) for a, b, v in shared),
    )


def layer_dicts(max_layers: int = 6, levels: bool = False):
    """Random layers; with ``levels`` some have a selective level (an attention core of a
    fraction of their saved bytes, recomputed in a fraction of their forward) and saved bytes
    that do not grow with the micro-batch."""
    fields = {
        "fwd": st.floats(0.1, 10.0),
        "bwd": st.floats(0.1, 20.0),
        "params": st.integers(0, 5_000_000),
        "saved": st.floats(0, 50e6),
        "inp": st.floats(0, 10e6),
        "out": st.floats(0, 10e6),
    }
    if levels:
        fields["saved0"] = st.sampled_from([0.0, 0.0, 1e6, 7e6])
        fields["core_frac"] = st.one_of(st.none(), st.floats(0.05, 0.95))
        fields["core_ms_frac"] = st.floats(0.05, 0.6)
    layer = st.fixed_dictionaries(fields).map(_with_core)
    return st.lists(layer, min_size=1, max_size=max_layers)


def _with_core(d: dict) -> dict:
    frac = d.pop("core_frac", None)
    ms_frac = d.pop("core_ms_frac", None)
    if frac is not None and d["saved"] > 0:
        d["core"] = d["saved"] * frac
        d["core_ms"] = d["fwd"] * ms_frac
    return d


def shared_pairs(num_layers: int):
    """Random storages shared by consecutive layers (a strategy of ``chain_profile``'s ``shared``)."""
    pair = st.tuples(st.integers(0, max(0, num_layers - 2)), st.floats(0, 2e6))
    return st.lists(pair, max_size=2).map(
        lambda ps: [(a, a + 1, v) for a, v in ps if a + 1 < num_layers]
    )


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


#: DP against brute force: the table's matrices and the cost model's per-stage methods sum the
#: same floats in other orders (prefix differences against sums over a stage's layers,
#: ``np.dot`` against a prefix of products for ZB-H1's W, ZeRO 3's closed form against an event
#: replay), so the two objectives agree to the last few bits, not bit for bit; a pricing bug
#: shows as a difference far above this
DP_REL_TOL = 1e-9


def solve_three_ways(table: Any, **kw: Any) -> Any:
    """The chain DP on one stage table, and the brute force and CP-SAT on its question alone
    (``table.question``: they price every stage from the cost model, so this checks the table's
    prices too): the same optimum (CP-SAT up to its integer ns and bytes) or all three
    infeasible. Returns the DP's solution (None when infeasible)."""
    question = table.question
    dp, bf, ilp = solve_chain(table, **kw), solve_chain_bruteforce(question, **kw), solve_chain_ilp(question, **kw)
    if bf is None:
        assert dp is None and ilp is None
        return None
    assert dp is not None and ilp is not None
    assert math.isclose(dp.objective_ms, bf.objective_ms, rel_tol=DP_REL_TOL, abs_tol=1e-9)
    assert math.isclose(ilp.objective_ms, bf.objective_ms, rel_tol=1e-6, abs_tol=1e-4)
    return dp
