"""Array helpers the solvers share."""

from __future__ import annotations

import numpy as np


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values of ``values`` (any shape, no NaN), ascending: ``np.unique`` without
    its cost on the first call. NumPy 2's ``np.unique`` asks ``numpy.ma`` whether its input is
    masked, importing ``numpy.ma`` (about 20 ms of a process's first search) on first use; the
    search calls it a few thousand times on arrays of tens to thousands of values, where a sort
    and a comparison of neighbours is also faster than its hash table."""
    flat = np.sort(values, axis=None)
    if len(flat) < 2:
        return flat
    keep = np.empty(len(flat), dtype=bool)
    keep[0] = True
    np.not_equal(flat[1:], flat[:-1], out=keep[1:])
    out: np.ndarray = flat[keep]
    return out
