"""Measure a torch model into a :class:`planner.artifacts.profile.Profile` (imports torch)."""

from planner.profiling.measured.profiler import detect_tied, profile_model

__all__ = ["detect_tied", "profile_model"]
