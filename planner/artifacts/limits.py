"""The ranges every number read from a file or a flag must lie in, in one place.

The documents' own checks (``__post_init__``, run by the codec while decoding) and the CLI's
argument types test against these, so a value that is finite but absurd -- a time of 1e308 ms,
a bandwidth of 5e-324 GB/s, 2^70 devices -- is refused at the boundary with the field and the
value named, instead of overflowing to ``inf`` later in a product or a quotient (and then
being refused only when the plan is written, or hanging a loop). Decisions:

- each bound is far outside anything real (a layer taking 31 years, an exabyte per sample), so
  no real input meets one, and far enough inside float64 that sums over every layer and
  products with every micro-batch stay finite: ``MAX_MS x MAX_LAYERS x MAX_BATCH`` ~ 1e27;
- a quantity that divides (a bandwidth, a speed, a peak FLOP/s) has a floor as well as a
  ceiling (``MIN_RATE``), since a denormal divisor makes ``inf`` as surely as a huge numerator;
- counts that the solver or simulator loop over (devices, micro-batches, layers) are bounded so
  that loading a file never allocates or iterates more than the file itself holds.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable

__all__ = [
    "MAX_BATCH",
    "MAX_BYTES",
    "MAX_CHECKPOINT_FILE_BYTES",
    "MAX_COUNT",
    "MAX_DEVICES",
    "MAX_FLOPS",
    "MAX_FLOPS_PER_SAMPLE",
    "MAX_INPUT_BYTES",
    "MAX_LAYERS",
    "MAX_LOSS",
    "MAX_MS",
    "MAX_NAME_CHARS",
    "MAX_RATE",
    "MAX_SHAPE_DIMS",
    "MAX_THROUGHPUT",
    "MIN_RATE",
    "check_count",
    "check_fields",
    "check_name",
    "check_range",
    "check_ranges",
    "first_duplicate",
]

#: the largest input file read (JSON documents, PipeDream graphs, configs): parsing one takes
#: well under 1 GB of memory and a few seconds
MAX_INPUT_BYTES = 64 * 2**20
#: the largest checkpoint tensor file read (``torch.load``): one stage's weights and optimizer
#: state; 1 TiB is a stage of a model beyond any trained (a 1T-parameter model's whole Adam state
#: is 16 TB, split over its stages' files)
MAX_CHECKPOINT_FILE_BYTES = 2**40
#: any time in milliseconds (a layer's, a stage's, an iteration's): ~31,700 years
MAX_MS = 1e15
#: any byte count (per sample, per device, a cap): 2^62, ~4.6 exabytes
MAX_BYTES = 2**62
#: any element or parameter count: 2^53, the largest integer a float holds exactly
MAX_COUNT = 2**53
#: FLOPs of one iteration (and the bound of other derived ratios: MFU, ME index)
MAX_FLOPS = 1e30
#: FLOPs of one training sample: 10^5 times GPT-3 175B's 2e15 at 2,048 tokens
MAX_FLOPS_PER_SAMPLE = 1e20
#: a training loss: at least 0 (every loss the runtime trains is a mean or sum of per-token or
#: per-sample losses >= 0: cross-entropy, squared error), at most 1e15 (a run past it diverged)
MAX_LOSS = 1e15
#: samples per second a prediction may claim
MAX_THROUGHPUT = 1e18
#: devices of a cluster, a plan, a request: 2^20 (a million)
MAX_DEVICES = 2**20
#: samples of a global batch (and so micro-batches of one iteration): 2^24 (16.7 million)
MAX_BATCH = 2**24
#: layers of a profile
MAX_LAYERS = 100_000
#: a rate that divides a quantity (GB/s, TFLOP/s, relative speed) is in [MIN_RATE, MAX_RATE]
MIN_RATE = 1e-6
MAX_RATE = 1e9
#: dimensions of one parameter's shape (torch allows more; no layer of a real model has them)
MAX_SHAPE_DIMS = 32
#: a name (model, layer, cluster) printed in tables and messages
MAX_NAME_CHARS = 1_000


def check_range(name: str, value: float, lo: float, hi: float) -> None:
    """Refuse (ValueError naming ``name`` and the value) a number outside ``[lo, hi]`` or not
    finite; the codec prefixes the file and the path of the object holding it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number (got {value!r})")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite (got {value!r})")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{_g(lo)}, {_g(hi)}] (got {value!r})")


def check_ranges(lo: float, hi: float, **values: float) -> None:
    """:func:`check_range` of each keyword value."""
    for name, value in values.items():
        check_range(name, value, lo, hi)


def check_fields(obj: object, lo: float, hi: float, *names: str) -> None:
    """:func:`check_range` of each named attribute of ``obj``."""
    for name in names:
        check_range(name, getattr(obj, name), lo, hi)


def first_duplicate(items: Iterable[Hashable]) -> Hashable | None:
    """The first item seen twice (None when all differ), in linear time."""
    seen: set[Hashable] = set()
    for item in items:
        if item in seen:
            return item
        seen.add(item)
    return None


def check_count(name: str, value: int, lo: int = 0, hi: int = MAX_COUNT) -> None:
    """An integer count in ``[lo, hi]``."""
    check_range(name, value, lo, hi)


def check_name(what: str, value: str) -> None:
    """A name printed on one line: non-empty, printable, at most ``MAX_NAME_CHARS``."""
    if not value:
        raise ValueError(f"{what} must not be empty")
    if len(value) > MAX_NAME_CHARS:
        raise ValueError(f"{what} is {len(value):,} characters long (at most {MAX_NAME_CHARS:,}): {value[:40]!r}...")
    if not value.isprintable():
        raise ValueError(f"{what} must be printable text on one line (got {value[:80]!r})")


def _g(value: float) -> str:
    """A bound as a message shows it: 1e+15, 2^62, 100,000."""
    if isinstance(value, float):
        return f"{value:g}"
    if value >= 2**20 and value & (value - 1) == 0:
        return f"2^{value.bit_length() - 1}"
    return f"{value:,}"


def check_nonneg(owner: str, **values: float) -> None:
    """Raise ValueError naming ``owner.name`` for a value that is negative or not finite."""
    for name, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{owner}.{name} must be finite (got {value!r})")
        if value < 0:
            raise ValueError(f"{owner}.{name} must be >= 0 (got {value!r})")
