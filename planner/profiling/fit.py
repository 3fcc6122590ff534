"""Least-squares line ``t(b) = intercept + per_sample * b`` through measured (b, t) points."""

from __future__ import annotations

import numpy as np

from planner.artifacts.profile import TimeFit


def fit_time(microbatch_sizes: list[int], times_ms: list[float]) -> TimeFit:
    """Ordinary least squares on the points, constrained to a valid :class:`TimeFit`.

    One point gives a line through the origin. A negative slope (noise on a flat curve)
    becomes a constant at the mean; a negative time at b = 1 raises the intercept to 0 there.
    """
    sizes = np.asarray(microbatch_sizes, dtype=float)
    times = np.asarray(times_ms, dtype=float)
    if len(set(microbatch_sizes)) < 2:
        return TimeFit(intercept_ms=0.0, per_sample_ms=float(times.mean() / sizes.mean()))
    slope, intercept = np.polyfit(sizes, times, 1)
    if slope < 0:
        slope, intercept = 0.0, float(times.mean())
    intercept = max(float(intercept), -float(slope))
    return TimeFit(intercept_ms=intercept, per_sample_ms=float(slope))
