"""A time as a line in the micro-batch size (part of the Profile artifact,
:mod:`planner.artifacts.profile`, and of its MoE layers, :mod:`planner.artifacts.moe`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.artifacts.limits import MAX_MS, check_range

__all__ = ["TimeFit"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeFit:
    """A time as a line in the micro-batch size: ``intercept_ms + per_sample_ms * b``."""

    intercept_ms: float
    per_sample_ms: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.intercept_ms) and math.isfinite(self.per_sample_ms)):
            raise ValueError("time fit must be finite")
        if self.per_sample_ms < 0:
            raise ValueError(f"per_sample_ms must be >= 0 (got {self.per_sample_ms!r})")
        if self.intercept_ms + self.per_sample_ms < 0:
            raise ValueError("time fit is negative at micro-batch size 1")
        check_range("intercept_ms", self.intercept_ms, -MAX_MS, MAX_MS)
        check_range("per_sample_ms", self.per_sample_ms, 0, MAX_MS)

    def at(self, microbatch_size: int) -> float:
        """Time in ms for one micro-batch of ``microbatch_size`` samples (never negative)."""
        return max(0.0, self.intercept_ms + self.per_sample_ms * microbatch_size)
