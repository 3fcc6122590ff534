"""Argument types shared by subcommands: they raise argparse errors (exit 2, one line).

Every number a flag takes is finite and in a range (``planner.artifacts.limits``): a value
such as ``--memory-cap-gib 1e308`` is refused here, naming the flag, instead of overflowing
later. Output paths are checked before any work (:func:`check_output`).
"""

from __future__ import annotations

import argparse
import math
import os
import stat
from collections.abc import Callable
from pathlib import Path

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.limits import MAX_BATCH

#: the largest integer a count flag takes unless it names a tighter bound
MAX_FLAG_INT = 2**31 - 1


def bounded_int(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an integer in ``[lo, hi]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in [{lo:,}, {hi:,}], got {text[:40]!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer in [{lo:,}, {hi:,}], got {text[:40]!r}")
        return value

    parse.__name__ = "integer"
    return parse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text[:40]!r}") from None
    if not 1 <= value <= MAX_FLAG_INT:
        raise argparse.ArgumentTypeError(f"expected a positive integer (at most {MAX_FLAG_INT:,}), got {text[:40]!r}")
    return value


def nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text[:40]!r}") from None
    if not values or min(values) < 0 or max(values) > MAX_BATCH:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated non-negative integers (at most {MAX_BATCH:,}), got {text[:40]!r}"
        )
    return values


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text[:40]!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text[:40]!r}")
    return value


def bounded_float(lo: float, hi: float, *, open_low: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in ``[lo, hi]`` (``(lo, hi]`` with ``open_low``)."""
    shown = f"{'(' if open_low else '['}{lo:g}, {hi:g}]"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number in {shown}, got {text[:40]!r}") from None
        if not math.isfinite(value) or not lo <= value <= hi or (open_low and value == lo):
            raise argparse.ArgumentTypeError(f"expected a number in {shown}, got {text[:40]!r}")
        return value

    parse.__name__ = "number"
    return parse


def nonneg_float(text: str) -> float:
    """A finite number in [0, 1e15] (times in ms; see the flag for its unit)."""
    return bounded_float(0.0, 1e15)(text)


def check_output(flag: str, path: str | os.PathLike[str] | None, *, directory: bool = False) -> None:
    """Refuse, before any work, an output path whose folder does not exist, or that names
    something the output cannot be written to without blocking or clobbering: a FIFO, a
    socket, a directory (for a file) or a file (for a directory). ``/dev/null`` is fine."""
    if not path:
        return
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise PlannerInputError(f"{flag} {p}: cannot use it ({exc.strerror or exc})") from None
    if mode is None:
        parent = p.resolve().parent
        if not directory and not parent.is_dir():
            raise PlannerInputError(f"{flag} {p}: the folder does not exist ({parent})")
        return
    if directory:
        if not stat.S_ISDIR(mode):
            raise PlannerInputError(f"{flag} {p}: exists and is not a directory")
        return
    if stat.S_ISDIR(mode):
        raise PlannerInputError(f"{flag} {p}: is a directory, expected a file to write")
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket"
        raise PlannerInputError(f"{flag} {p}: is {kind}; writing to it could block: give a regular file")
