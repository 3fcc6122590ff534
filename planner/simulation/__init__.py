"""The event simulator, its timeline, and the bounds and indices computed from plans (no torch)."""

from planner.simulation.predict import me_index, predict
from planner.simulation.replay import simulate_iteration_ms
from planner.simulation.simulator import check_schedule, simulate
from planner.simulation.timeline import ActionTiming, MemoryTrace, Segment, SegmentKind, StageTimeline, Timeline

__all__ = [
    "ActionTiming", "MemoryTrace", "Segment", "SegmentKind", "StageTimeline", "Timeline", "check_schedule",
    "me_index", "predict", "simulate", "simulate_iteration_ms",
]
