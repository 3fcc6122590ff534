"""The objective's terms beside the stage times, per stage of a uniform layout, as matrices over
the stages ``[i, j)`` the chain DP adds to its table (:mod:`planner.solve.chain_dp`):

- ``c_s(j)``: the forward + backward transfer across the cut before layer ``j`` after stage
  ``s`` (zero after the last stage and at the turn of a V, whose two chunks share a rank);
- ``X_s(i, j)``: the part of stage ``s``'s gradient synchronisation the pipeline cannot hide
  (:meth:`planner.cost.CostModel.stage_exposed_sync_ms` prices one stage; zero under ZeRO 3);
- ``Z_s(i, j)``: ZB-H1's bubble fill (:meth:`planner.cost.CostModel.stage_bubble_fill_ms`),
  subtracted with schedules that split the backward.

Stages over the same link and gradient line share one read-only matrix. The rank arithmetic
behind them (each stage's gradient line and the link to the next) is the layout's
:class:`planner.cost.collectives.StageLinks`.
"""

from __future__ import annotations

import numpy as np

from planner.artifacts.kinds import ScheduleKind, ZeroStage
from planner.artifacts.layout import Layout
from planner.cost import CostModel, p2p_ms, stage_links
from planner.solve.prices.table import StageTable

__all__ = ["exposure", "hidden_backward", "stage_extras"]

Line = tuple[float, float]  # (ms per byte, ms) of a collective or a link's (GB/s, us)


def hidden_backward(table: StageTable) -> np.ndarray:
    """The backward work a stage ``(i, j)``'s synchronisation can overlap in the objective's
    proxy ``X_s``: the layers' before it (``B_<i``), and with the stack's overlapped
    gradient reduction also its own (``B_<j``); broadcastable to ``(L + 1) x (L + 1)``."""
    overlap = table.cm.stack.reduce_overlap(table.sharding.zero is not ZeroStage.NONE)
    return table.bwd_prefix[None, :] if overlap else table.bwd_prefix[:, None]


def exposure(table: StageTable, line: Line, expert_line: Line = (0.0, 0.0)) -> np.ndarray:
    """``X(i, j)`` of a stage of ``table`` whose gradient group's all-reduce line is ``line`` (ms
    per byte, ms): its bytes synchronised after its last backward on that line, less the backward
    work it overlaps (:func:`hidden_backward`), at least 0 (zeros where the line is (0, 0): no
    group); as :meth:`planner.cost.CostModel.stage_exposed_sync_ms` prices one stage. With
    routed experts, theirs on ``expert_line`` (their expert data-parallel group's)."""
    per_byte, fixed = line
    if table.cm.has_experts:  # of sync_bytes, the routed experts' (on their own group's line)
        experts = table.cm.stage_expert_param_matrix() * table.sync_bytes_per_param
        e_byte, e_fixed = expert_line
        out_e: np.ndarray = np.maximum(0.0, per_byte * (table.sync_bytes - experts) + fixed + e_byte * experts
                                       + np.where(experts > 0, e_fixed, 0.0) - hidden_backward(table))
        return out_e
    if per_byte == 0.0 and fixed == 0.0:
        return np.zeros_like(table.sync_bytes)
    out: np.ndarray = np.maximum(0.0, per_byte * table.sync_bytes + fixed - hidden_backward(table))
    return out


def _exposure_matrices(table: StageTable, layout: Layout) -> list[np.ndarray]:
    """``X_s(i, j)`` for every stage (:func:`exposure` of its gradient line, and of its
    routed experts' group's; zeros under ZeRO 3, whose collectives are in the stage times)."""
    out = []
    by_line: dict[tuple[Line, Line], np.ndarray] = {}
    cm = table.cm
    for s, line in enumerate(stage_links(cm.cluster, layout).grad_lines):
        expert = cm.expert_grad_line(layout, s) if cm.has_experts else (0.0, 0.0)
        if (line, expert) not in by_line:
            m = np.zeros_like(table.sync_bytes) if layout.zero is ZeroStage.PARAMETERS else exposure(table, line, expert)
            m.flags.writeable = False
            by_line[(line, expert)] = m
        out.append(by_line[(line, expert)])
    return out


def _comm_vectors(cm: CostModel, layout: Layout, b: int) -> list[np.ndarray]:
    """``c_s(j)`` for every stage (module docstring), as a vector over ``j``."""
    cut = cm.cut_bytes_per_sample
    by_link: dict[Line | None, np.ndarray] = {}
    out = []
    for link in stage_links(cm.cluster, layout).next_links:
        if link not in by_link:
            if link is None:
                vec = np.zeros(cm.num_layers + 1)
            else:
                bw, lat = link
                vec = np.array([2.0 * p2p_ms(c * b, bandwidth_gb_per_s=bw, latency_us=lat) for c in cut])
            vec.flags.writeable = False
            by_link[link] = vec
        out.append(by_link[link])
    return out


def _bubble_fill_matrix(table: StageTable) -> np.ndarray:
    """``Z_s(i, j)`` for every stage (0 where the stage is not valid)."""
    _, bwd = table.cm.at_batch(table.b).times_ms
    wp = np.concatenate([[0.0], np.cumsum(bwd * table.cm.wgrad_fraction)])
    fill = np.minimum(2.0 * (wp[None, :] - wp[:, None]), np.where(table.valid, table.compute, 0.0))
    out: np.ndarray = np.where(table.valid, fill, 0.0)
    return out


def stage_extras(table: StageTable, layout: Layout, schedule: ScheduleKind) -> list[np.ndarray]:
    """Per stage ``s`` of ``layout``, ``c_s + X_s`` (less ``Z_s`` when ``schedule`` splits the
    backward) at ``[i, j]``: what the DP adds to a stage's time in the sum of its objective.
    Stages over the same link and line share one matrix (the same object)."""
    comm = _comm_vectors(table.cm, layout, table.b)
    exposure = _exposure_matrices(table, layout)
    fill = _bubble_fill_matrix(table) if schedule.splits_backward else None
    by_parts: dict[tuple[int, int], np.ndarray] = {}
    extra = []
    for s in range(layout.num_stages):
        key = (id(comm[s]), id(exposure[s]))
        if key not in by_parts:
            e = comm[s][None, :] + exposure[s]
            by_parts[key] = e if fill is None else e - fill
        extra.append(by_parts[key])
    return extra
