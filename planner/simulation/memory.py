"""Memory of a stage over a replayed iteration (the simulator's traces; see
:mod:`planner.simulation.simulator` for the model)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from planner.artifacts.plan import Plan, PlanStage
from planner.simulation.timeline import MemoryTrace

__all__ = ["memory_trace", "rank_peak", "summed_peak"]


def _stage_bytes(stage: PlanStage, split: bool) -> tuple[int, int, int, int]:
    """A stage's bytes over a replay: its static bytes, what a micro-batch in flight holds, the
    recompute workspace while a recomputed backward runs, and (``split``: the schedule runs W
    apart) what a micro-batch keeps from the end of its I pass until its W ends."""
    mem = stage.memory
    static = mem.param_bytes + mem.grad_bytes + mem.optimizer_bytes + mem.buffer_bytes
    act = stage.activation_bytes_per_microbatch
    recomputes = stage.recompute or stage.recompute_selective or stage.recompute_ms > 0
    work = mem.recompute_workspace_bytes if recomputes else 0
    keep = stage.wgrad_bytes_per_microbatch if split else 0  # W's inputs, recomputed or not
    return static, act, work, keep


def memory_trace(
    plan: Plan, s: int, rank: int, mbs: Sequence[int], fstart: list[float], bstart: list[float], bend: list[float],
    wend: list[float] | None = None,
) -> MemoryTrace:
    """Memory of stage ``s`` on ``rank``, which runs micro-batches ``mbs`` of it; with a split
    backward (``wend``), a micro-batch frees its activations at the end of its I pass but what
    W needs (``wgrad_bytes_per_microbatch``), which it frees at the end of its W."""
    m = plan.num_microbatches
    static, act, work, keep = _stage_bytes(plan.stages[s], wend is not None)
    # (time, order, d_bytes, d_inflight): at equal times frees (order 0) precede allocations.
    events: list[tuple[float, int, int, int]] = []
    for mb in (s * m + i for i in mbs):
        events.append((fstart[mb], 1, act, 1))
        if wend is not None:
            events.append((bend[mb], 0, -(act - keep) - work, 0))
            events.append((wend[mb], 0, -keep, -1))
        else:
            events.append((bend[mb], 0, -act - work, -1))
        if work:
            events.append((bstart[mb], 1, work, 0))
    events.sort()
    times = [0.0]
    values = [static]
    cur, inflight, peak_inflight = static, 0, 0
    for t, _, d_bytes, d_inflight in events:
        cur += d_bytes
        inflight += d_inflight
        peak_inflight = max(peak_inflight, inflight)
        if t == times[-1]:
            values[-1] = cur
        else:
            times.append(t)
            values.append(cur)
    return MemoryTrace(
        stage_idx=s, rank=rank, static_bytes=static, times_ms=tuple(times), bytes_=tuple(values),
        peak_bytes=max(values), peak_inflight_microbatches=peak_inflight,
    )


def summed_peak(trs: list[MemoryTrace]) -> int:
    """Peak of the summed memory of one rank's stages."""
    if len(trs) == 1:
        return trs[0].peak_bytes
    deltas: list[tuple[float, int]] = []
    for tr in trs:
        prev = 0
        for t, b in zip(tr.times_ms, tr.bytes_):
            deltas.append((t, b - prev))
            prev = b
    deltas.sort()
    cur = peak = 0
    i = 0
    while i < len(deltas):  # apply all changes at one instant before reading the level
        t = deltas[i][0]
        while i < len(deltas) and deltas[i][0] == t:
            cur += deltas[i][1]
            i += 1
        peak = max(peak, cur)
    return peak


def rank_peak(plan: Plan, by_stage: dict[int, list[int]], at: dict[str, np.ndarray], split: bool) -> int:
    """:func:`summed_peak` of one rank's memory traces (:func:`memory_trace`; its stages ``by_stage``, each with the
    micro-batches it runs there; ``at``: the replay's ``fstart``, ``bstart``, ``bend`` and
    ``wend`` as arrays), from their events at once: the level after all the changes of each
    instant, at its highest (integer bytes: the same peak in any order of summing)."""
    m = plan.num_microbatches
    static_total = 0
    times: list[np.ndarray] = []
    deltas: list[np.ndarray] = []
    for s, mbs in by_stage.items():
        static, act, work, keep = _stage_bytes(plan.stages[s], split)
        static_total += static
        idx = s * m + np.asarray(mbs, dtype=np.int64)
        events = [(at["fstart"], act), (at["bend"], -(act - keep) - work)]
        if split:
            events.append((at["wend"], -keep))
        if work:
            events.append((at["bstart"], work))
        for when, change in events:
            times.append(when[idx])
            deltas.append(np.full(len(idx), change, dtype=np.int64))
    t = np.concatenate(times)
    order = np.argsort(t, kind="stable")
    t = t[order]
    level = np.cumsum(np.concatenate(deltas)[order])
    last = np.append(t[1:] != t[:-1], True)  # each instant's last change
    return static_total + max(0, int(level[last].max()))
