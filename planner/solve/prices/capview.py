"""Cap views: what one memory cap lets each stage hold, as in-flight counts, so that a stage
table answers "does stage ``(i, j)`` fit ``k`` micro-batches?" for every count ``k`` by one
comparison instead of a matrix expression per count (:meth:`StageTable.could_fit`,
:meth:`StageTable.longest` of :mod:`planner.solve.prices.table`); and the one expression of a
stage's bytes over its cap that every fit test and recompute price reads (:func:`excess_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.artifacts.caches import Cache

__all__ = ["CapView", "cap_view", "excess_bytes"]

#: the most micro-batches in flight a cap view counts (a stage that fits this many fits any count asked)
MOST_INFLIGHT = float(2**40)


@dataclass(frozen=True, slots=True)
class CapView:
    """What one memory cap lets each stage ``(i, j)`` hold, as in-flight counts, so that a count's
    tables are a comparison each (:meth:`StageTable.base`, :meth:`StageTable.could_fit`):
    ``plain``, the most micro-batches it holds without recomputation (``static + k act - cap <= 0``
    exactly as :meth:`StageTable.base` evaluates it: that is monotone in ``k``, ``act >= 0``; -1
    where none or not a stage); ``leanest``, a count above which it cannot fit even with every
    layer at its leanest level (``k (act - gain) <= cap - static``, with 1e-9 of the cap to spare
    for rounding: :meth:`StageTable.could_fit` may only err towards "might fit"; -inf where not a
    stage); and per number of layers the largest of each over the stages that long."""

    plain: np.ndarray
    leanest: np.ndarray
    plain_by_length: np.ndarray
    leanest_by_length: np.ndarray


def excess_bytes(static: np.ndarray, act: np.ndarray, inflight: np.ndarray | int, cap: float) -> np.ndarray:
    """A stage's bytes without recomputation over ``cap`` with ``inflight`` micro-batches, element
    by element: the one expression every fit test and recompute price reads (the same floats
    whichever stages it is worked out for)."""
    out: np.ndarray = static + inflight * act - cap
    return out


def cap_view(static: np.ndarray, act: np.ndarray, gain: np.ndarray, valid: np.ndarray, cap: float) -> CapView:
    """The :class:`CapView` of ``cap`` for stages of ``static`` bytes, ``act`` bytes per
    micro-batch in flight and at most ``gain`` bytes per micro-batch freed by recomputation."""
    def fits(k: np.ndarray, at: tuple[np.ndarray, ...] | slice = slice(None)) -> np.ndarray:
        out: np.ndarray = excess_bytes(static[at], act[at], k, cap) <= 0
        return out

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        guess = np.where(act > 0, np.floor((cap - static) / act), np.where(static - cap <= 0, MOST_INFLIGHT, -1.0))
        k = np.clip(guess, -1.0, MOST_INFLIGHT)
        # the guess is off by the division's rounding where k + 1 fits or k does not (the test is
        # monotone in k, act >= 0): settle those few on the exact test, a step at a time, then
        # bisect any still off (k act below the rounding of static: tiny act)
        wrong = np.nonzero(((k < MOST_INFLIGHT) & fits(k + 1)) | ((k >= 0) & ~fits(k)))
        if len(wrong[0]):
            kw = k[wrong]
            for _ in range(2):
                up = (kw < MOST_INFLIGHT) & fits(kw + 1, wrong)
                kw = np.where(up, kw + 1, np.where((kw >= 0) & ~fits(kw, wrong), kw - 1, kw))
            k[wrong] = kw
            off = ((kw < MOST_INFLIGHT) & fits(kw + 1, wrong)) | ((kw >= 0) & ~fits(kw, wrong))
            wrong = (wrong[0][off], wrong[1][off])
        if len(wrong[0]):
            lo, hi = np.full(len(wrong[0]), -1.0), np.full(len(wrong[0]), MOST_INFLIGHT + 1)
            while np.any(hi - lo > 1):
                mid = np.floor((lo + hi) / 2)
                ok = fits(mid, wrong)
                lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
            k[wrong] = lo
        spare = cap - static + 1e-9 * abs(cap)
        tight = act - gain
        leanest = np.where(tight > 0, spare / tight, np.where(spare >= 0, np.inf, -np.inf))
    plain = np.where(valid, k, -1.0)
    leanest = np.where(valid, leanest, -np.inf)
    L = len(static) - 1
    return CapView(plain, leanest, _by_length(plain, L), _by_length(leanest, L))


def _by_length(m: np.ndarray, L: int) -> np.ndarray:
    """Per number of layers ``l`` (0 to ``L``), the largest ``m[i, i + l]`` (-inf for 0)."""
    order, starts = _diagonals(L)
    out = np.full(L + 1, -np.inf)
    out[1:] = np.maximum.reduceat(m.reshape(-1)[order], starts)
    return out


#: per L, the flat indices of an (L + 1) x (L + 1) matrix's entries above its diagonal, by
#: number of layers (j - i) and then by i, and where each number of layers starts among them
_DIAGONALS: Cache[int, tuple[np.ndarray, np.ndarray]] = Cache("solve.prices.diagonals", key="number of layers L", bound=16)


def _diagonals(L: int) -> tuple[np.ndarray, np.ndarray]:
    found = _DIAGONALS.get(L)
    if found is None:
        lengths = np.repeat(np.arange(1, L + 1), np.arange(L, 0, -1))
        first = np.concatenate([np.arange(L + 1 - n) for n in range(1, L + 1)])  # i of each entry
        order = first * (L + 1) + first + lengths
        starts = np.concatenate([[0], np.cumsum(np.arange(L, 1, -1))])
        found = _DIAGONALS.put(L, (order, starts))
    return found
