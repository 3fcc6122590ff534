"""A time floor of the zero-bubble schedules (ZB-H1, ZB-H2, ZBV, DualPipe-V) with both their fill
and their memory in it: the search skips a configuration whose floor exceeds what it must beat
(:meth:`ConfigSearch.visit <planner.solve.config_search.ConfigSearch.visit>`), never reorders.

Why: the search's bounds of a zero-bubble configuration count either its fill without memory
(:func:`~planner.solve.floors.split_fill_bound_ms`, the order) or its memory without a fill
(:meth:`~planner.solve.floors.ConfigFacts.memory_floor_ms`, no waits: keep's check); a deep
pipeline of large layers that must recompute is bounded by neither where both bind.
"""

from __future__ import annotations

import numpy as np

from planner.solve.floors import ConfigFacts, fsdp_share_ms
from planner.solve.rank_memory import held_whole, works_reach_ms
from planner.solve.space import Config


def zero_bubble_floor_ms(facts: ConfigFacts, c: Config) -> float:
    """No plan of zero-bubble configuration ``c`` (any ZeRO variant the search solves of it, any
    partition, recomputation, chunk caps of a rebalancing or baseline partition) simulates
    faster; 0 for other schedules, copies per stage and profiles with shared saved storages.

    Proof. Rank ``r``'s first operation is a forward of its first chunk, stage ``r`` (one chunk
    per rank, and ZBV's / DualPipe-V's V alike), of micro-batch 0, which waits for the forwards
    of stages ``0 .. r - 1``; each holds at least a layer, so they hold at least the first ``r``
    layers: it starts no earlier than ``a_r = F_<r`` (the first ``r`` layers' forward). From then
    on it runs every forward, input- and weight-gradient pass and recomputation of its ``M``
    micro-batches one after another, at least ``M g_r(w_r)``, ``w_r`` its layers' work and
    ``g_r(w) = w + R(max(0, H(w) - cap) / k)`` the least time per micro-batch in which a share of
    the layers of work ``w`` fits the device's ``cap`` with ``k`` micro-batches of every layer
    held whole (:mod:`planner.solve.rank_memory`'s ``g``; ``H`` the least bytes of any share of
    that work, fractions allowed, ``R`` the least recomputation freeing the excess). Here ``k``
    is the fewest whole micro-batches any of the rank's chunks holds at a point of its walk
    (:func:`~planner.solve.rank_memory.held_whole`), and the cap is the device's whole cap: so it
    holds whichever way the rank's chunks share it (cap / 2 each, or a rebalancing's split).
    So ``T >= a_r + M g_r(w_r)`` on every rank, and the works sum to the profile's ``W``: ``T``
    is at least the least ``T`` at which ``sum_r g_r^-1((T - a_r) / M)`` reaches ``W``
    (:func:`~planner.solve.rank_memory.works_reach_ms`). Transfers, synchronisation and the
    bubble only add. Each ZeRO variant at its own state bytes per parameter: ``c``'s own, and
    where ZeRO 3 is solved too the less of that and ZeRO 3's (no lower than its collectives'
    share, :func:`~planner.solve.floors.fsdp_share_ms`), as
    :meth:`~planner.solve.floors.ConfigFacts.memory_floor_ms` counts them.

    Tested against the simulated time of the DP's optimum and of every proposal on small cases
    (``tests/test_bubble_floor.py``)."""
    cm, lay = facts.cm, c.layout
    if not c.schedule.splits_backward or lay.stage_replicas or cm.profile.shared_saved:
        return 0.0
    fp, _ = cm.at_batch(c.microbatch_size).prefix_ms
    waits = [float(fp[min(r, len(fp) - 1)]) for r in range(lay.pipeline_size)]
    found = _floor_at(facts, c, cm.least_state_bytes_per_param(lay.sharding(0)), waits)
    lean = facts.leanest(c)
    if lean != c:
        at_lean = _floor_at(facts, c, cm.least_state_bytes_per_param(lean.layout.sharding(0)), waits)
        found = min(found, max(fsdp_share_ms(cm, lean), at_lean))
    return found


def _floor_at(facts: ConfigFacts, c: Config, kappa: float, waits: list[float]) -> float:
    """:func:`zero_bubble_floor_ms` at ``kappa`` state bytes per parameter (0 where recomputation
    frees nothing or costs nothing, or a stage holds no whole micro-batch: not bounded here)."""
    ranks, lay = facts.ranks, c.layout
    key = (c.microbatch_size, kappa)
    work, _, curve, _, _, _ = ranks.layer_arrays(key)
    held = held_whole(c)
    if curve[1][-1] <= 0 or min(held) < 1:
        return 0.0
    groups: dict[int, list[float]] = {}
    for r in range(lay.pipeline_size):
        groups.setdefault(min(held[s] for s in lay.stage_indices(r)), []).append(waits[r])
    inverses = [(*ranks.inverse(key, k), np.array(a)) for k, a in groups.items()]
    return works_reach_ms(inverses, c.num_microbatches, work) * (1 - 1e-9)
