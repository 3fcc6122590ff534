"""Least-squares lines through measured points: times (:func:`fit_time`) and bytes (:func:`fit_bytes`).

``t(b) = intercept + per_sample * b`` through measured (b, t) points,
in relative error: each point's residual is divided by its time, so that the small
micro-batch sizes (milliseconds) weigh as much as the large ones (tens of milliseconds). On a
CPU, times often grow faster than linearly in b (caches); an ordinary fit then follows the
large sizes and can predict b = 1 several times too fast (a zoo GPT block measured 0.94 ms at
b = 1 was fitted at 0.13 ms), which a plan at b = 1 then inherits."""

from __future__ import annotations

import numpy as np

from planner.artifacts.profile import TimeFit


def fit_time(microbatch_sizes: list[int], times_ms: list[float]) -> TimeFit:
    """Least squares on the points' relative errors, constrained to a valid :class:`TimeFit`.

    One point gives a line through the origin. A negative slope (noise on a flat curve)
    becomes a constant at the mean; a negative time at b = 1 raises the intercept to 0 there.
    """
    sizes = np.asarray(microbatch_sizes, dtype=float)
    times = np.asarray(times_ms, dtype=float)
    if len(set(microbatch_sizes)) < 2:
        return TimeFit(intercept_ms=0.0, per_sample_ms=float(times.mean() / sizes.mean()))
    weights = 1.0 / np.maximum(times, 1e-6)  # relative residuals (a zero time weighs as 1 ns)
    slope, intercept = np.polyfit(sizes, times, 1, w=weights)
    if slope < 0:
        slope, intercept = 0.0, float(times.mean())
    intercept = max(float(intercept), -float(slope))
    return TimeFit(intercept_ms=intercept, per_sample_ms=float(slope))


def fit_bytes(microbatch_sizes: list[int], num_bytes: list[int]) -> tuple[float, float]:
    """(fixed, per sample) bytes of the least-squares line through (b, bytes): what does not
    grow with the micro-batch and what does (bytes saved by a layer are such a line: a rotary
    table broadcast over the batch, plus the activations). One size gives a line through the
    origin; a negative intercept (never for bytes that are such a line) becomes a line through
    the origin, a negative slope a constant. Integral results are kept exact."""
    sizes = np.asarray(microbatch_sizes, dtype=float)
    values = np.asarray(num_bytes, dtype=float)
    if len(set(microbatch_sizes)) < 2:
        return 0.0, float(values.mean() / sizes.mean())
    slope, intercept = (float(v) for v in np.polyfit(sizes, values, 1))
    slope, intercept = _snap(slope), _snap(intercept)
    if intercept < 0:
        slope, intercept = float(sizes @ values / (sizes @ sizes)), 0.0
    if slope < 0:
        slope, intercept = 0.0, float(values.mean())
    return intercept, slope


def _snap(value: float) -> float:
    """``value`` rounded to a whole byte when within float noise of one (least squares leaves
    relative errors near 1e-12)."""
    nearest = round(value)
    return float(nearest) if abs(value - nearest) < 1e-9 * abs(value) + 1e-6 else value
