"""The event simulator, its timeline, and the bounds and indices computed from plans (no torch)."""

from planner.simulate.simulator import check_schedule, predict, simulate, simulate_iteration_ms
from planner.simulate.timeline import ActionTiming, MemoryTrace, Segment, SegmentKind, StageTimeline, Timeline

__all__ = [
    "ActionTiming", "MemoryTrace", "Segment", "SegmentKind", "StageTimeline", "Timeline", "check_schedule",
    "predict", "simulate", "simulate_iteration_ms",
]
