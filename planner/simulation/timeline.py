"""The simulator's result: when each action ran, what the ranks and stages did, memory over time.

Produced by :func:`planner.simulation.simulate`; read by :mod:`planner.report.figures` and the
``planner simulate`` command. Definitions (``bubble_fraction``, ``idle_ms``,
``exposed_allreduce_ms``) are documented in :mod:`planner.simulation`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field

from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.layout import Layout
from planner.schedule import Action, ActionKind, Schedule

__all__ = ["ActionTiming", "MemoryTrace", "Segment", "SegmentKind", "StageTimeline", "Timeline"]


class SegmentKind(enum.Enum):
    """What a bar of the timeline is: compute (forward, recompute, backward) or communication."""

    FORWARD = "forward"
    RECOMPUTE = "recompute"
    BACKWARD = "backward"
    BACKWARD_INPUT = "backward-input"  # a zero-bubble schedule's I pass (the paper's B) ...
    BACKWARD_WEIGHT = "backward-weight"  # ... and its W pass
    SEND_FWD = "send-fwd"
    SEND_BWD = "send-bwd"
    ALLREDUCE = "allreduce"
    REDUCE_SCATTER = "reduce-scatter"  # ZeRO: gradients, then ...
    ALL_GATHER = "all-gather"  # ... the updated weights
    OPTIMIZER = "optimizer"


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionTiming:
    """One action of the schedule as it ran (a backward's first ``recompute_ms`` re-run the forward)."""

    action: Action
    rank: int
    start_ms: float
    end_ms: float
    recompute_ms: float = 0.0  # the first part of a backward that re-runs the forward


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    """A coloured bar of the Gantt chart. ``mb_idx`` is -1 for all-reduce and optimizer."""

    kind: SegmentKind
    rank: int
    stage_idx: int
    mb_idx: int
    start_ms: float
    end_ms: float


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryTrace:
    """A step function: ``bytes_[i]`` holds from ``times_ms[i]`` to ``times_ms[i+1]``."""

    stage_idx: int
    rank: int
    static_bytes: int
    times_ms: tuple[float, ...]
    bytes_: tuple[int, ...]
    peak_bytes: int
    peak_inflight_microbatches: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTimeline:
    """One stage's per-micro-batch costs (as replayed) and what it did over the iteration."""

    stage_idx: int
    rank: int
    fwd_ms: float
    bwd_ms: float
    recompute_ms: float
    send_fwd_ms: float
    send_bwd_ms: float
    busy_ms: float
    wgrad_ms: float = 0.0  # of bwd_ms, the W pass when the schedule splits the backward
    idle_ms: float  # of its rank, over [0, compute_end_ms]
    last_backward_end_ms: float
    allreduce_start_ms: float
    allreduce_end_ms: float
    peak_memory_bytes: int
    peak_inflight_microbatches: int
    ranks: tuple[int, ...] = ()  # every rank running this stage (its copies), when more than ``rank``


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """A replayed iteration. ``start_ms[r][i]`` / ``end_ms[r][i]`` time ``orders[r][i]``;
    ``compute_end_ms`` ends the last compute action, ``iteration_ms`` the last optimizer step
    (all-reduces included); ``peak_memory_bytes`` is the largest device's peak."""

    schedule: ScheduleKind
    layout: Layout
    num_ranks: int = field(metadata={"doc": "rows of ``orders``: pipeline ranks of one replica (devices when replicated per stage)"})
    num_microbatches: int
    orders: Schedule
    start_ms: tuple[tuple[float, ...], ...]  # aligned with ``orders``
    end_ms: tuple[tuple[float, ...], ...]
    stages: tuple[StageTimeline, ...]
    memory: tuple[MemoryTrace, ...]  # one per stage
    rank_busy_ms: tuple[float, ...]
    rank_idle_ms: tuple[float, ...]
    rank_peak_memory_bytes: tuple[int, ...]
    optimizer_ms: tuple[float, ...]  # per rank
    compute_end_ms: float
    iteration_ms: float
    bubble_fraction: float
    exposed_allreduce_ms: float
    peak_memory_bytes: int

    def actions(self) -> Iterator[ActionTiming]:
        """Every action with its rank, start and end."""
        for rank, acts in enumerate(self.orders):
            for a, start, end in zip(acts, self.start_ms[rank], self.end_ms[rank]):
                rc = self.stages[a.stage_idx].recompute_ms if a.kind.sends_grad else 0.0
                yield ActionTiming(action=a, rank=rank, start_ms=start, end_ms=end, recompute_ms=rc)

    def segments(self) -> tuple[Segment, ...]:
        """Compute, transfer, all-reduce and optimizer bars, for figures."""
        out: list[Segment] = []
        last = self.layout.num_stages - 1
        for t in self.actions():
            a, st = t.action, self.stages[t.action.stage_idx]
            seg = dict(rank=t.rank, stage_idx=a.stage_idx, mb_idx=a.mb_idx)
            if a.kind is ActionKind.FORWARD:
                out.append(Segment(kind=SegmentKind.FORWARD, start_ms=t.start_ms, end_ms=t.end_ms, **seg))
                if a.stage_idx < last and st.send_fwd_ms > 0:
                    out.append(Segment(kind=SegmentKind.SEND_FWD, start_ms=t.end_ms, end_ms=t.end_ms + st.send_fwd_ms, **seg))
                continue
            if a.kind is ActionKind.BACKWARD_WEIGHT:
                out.append(Segment(kind=SegmentKind.BACKWARD_WEIGHT, start_ms=t.start_ms, end_ms=t.end_ms, **seg))
                continue
            bar = SegmentKind.BACKWARD_INPUT if a.kind is ActionKind.BACKWARD_INPUT else SegmentKind.BACKWARD
            if t.recompute_ms > 0:
                mid = t.start_ms + t.recompute_ms
                out.append(Segment(kind=SegmentKind.RECOMPUTE, start_ms=t.start_ms, end_ms=mid, **seg))
                out.append(Segment(kind=bar, start_ms=mid, end_ms=t.end_ms, **seg))
            else:
                out.append(Segment(kind=bar, start_ms=t.start_ms, end_ms=t.end_ms, **seg))
            if a.stage_idx > 0 and st.send_bwd_ms > 0:
                out.append(Segment(kind=SegmentKind.SEND_BWD, start_ms=t.end_ms, end_ms=t.end_ms + st.send_bwd_ms, **seg))
        for st in self.stages:
            if st.allreduce_end_ms <= st.allreduce_start_ms:
                continue
            lo, hi = st.allreduce_start_ms, st.allreduce_end_ms
            # ZeRO's pair moves (grad + weight bytes) / 2 each way at the all-reduce's rate
            # (planner.cost): drawn as two halves
            bars: list[tuple[SegmentKind, float, float]] = [(SegmentKind.ALLREDUCE, lo, hi)] if not self.layout.zero else [
                (SegmentKind.REDUCE_SCATTER, lo, (lo + hi) / 2), (SegmentKind.ALL_GATHER, (lo + hi) / 2, hi)]
            for rank in st.ranks or (st.rank,):
                for kind, start, end in bars:
                    out.append(Segment(kind=kind, rank=rank, stage_idx=st.stage_idx, mb_idx=-1, start_ms=start, end_ms=end))
        for rank, opt in enumerate(self.optimizer_ms):
            if opt > 0:
                out.append(
                    Segment(kind=SegmentKind.OPTIMIZER, rank=rank, stage_idx=-1, mb_idx=-1,
                            start_ms=self.iteration_ms - opt, end_ms=self.iteration_ms)
                )
        return tuple(out)
