"""What the subcommands share: the record each one is (:class:`Subcommand`), and argument types
that raise argparse errors (exit 2, one line).

Every number a flag takes is finite and in a range (``planner.artifacts.limits``), written
as a number (``planner.artifacts.flag_values``: no ``nan``, ``1_000``, ``1e3`` for an
integer): a value such as ``--memory-cap-gib 1e308`` is refused here, naming the flag,
instead of overflowing later. Output paths are checked before any work (:func:`check_output`).
"""

from __future__ import annotations

import argparse
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.flag_values import parse_float, parse_int
from planner.artifacts.limits import MAX_BATCH, MAX_BYTES, MAX_DEVICES, MAX_MS

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Subcommand:
    """A subcommand as data, what ``planner`` reads of each ``planner/commands/<name>.py``
    (its ``COMMAND``): the name typed, the line ``planner --help`` lists, the parser of its
    arguments (``add_help=False``; its description, epilog and formatter are the subcommand's
    ``--help``), and the function that runs the parsed arguments, returning the exit code."""

    name: str
    help: str
    parser: argparse.ArgumentParser
    run: Callable[[argparse.Namespace], int]

#: the largest integer a count flag takes unless it names a tighter bound
MAX_FLAG_INT = 2**31 - 1


def _typed(parse: Callable[[str], T], name: str) -> Callable[[str], T]:
    """An argparse type of ``parse`` (``planner.artifacts.flag_values``): its ValueError is the
    one line argparse prints after the flag's name."""

    def typed(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    typed.__name__ = name
    return typed


def bounded_int(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an integer in ``[lo, hi]`` (ASCII digits: no ``1e3``, ``1_000``)."""
    return _typed(lambda text: parse_int(text, lo, hi), "integer")


#: an argparse type: an integer in [1, MAX_FLAG_INT]
positive_int = bounded_int(1, MAX_FLAG_INT)
#: an argparse type: an integer in [0, MAX_FLAG_INT]
nonneg_int = bounded_int(0, MAX_FLAG_INT)


def _int_items(text: str) -> tuple[int, ...]:
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or "" in items:
        where = "an empty item" if text.strip() else "nothing"
        raise ValueError(f"expected comma-separated integers in [0, {MAX_BATCH:,}], got {where} in {text[:40]!r}")
    return tuple(parse_int(t, 0, MAX_BATCH) for t in items)


#: an argparse type: comma-separated integers in [0, MAX_BATCH], none empty (``1,,2`` is refused)
int_list = _typed(_int_items, "integers")


def bounded_float(lo: float, hi: float, *, open_low: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in ``[lo, hi]`` (``(lo, hi]`` with ``open_low``)."""
    return _typed(lambda text: parse_float(text, lo, hi, open_low=open_low), "number")


def _fraction(text: str) -> float:
    try:
        value = parse_float(text, 0.0, 1.0)
    except ValueError:
        value = 1.0
    if value >= 1:
        raise ValueError(f"expected a number in [0, 1), got {text[:40]!r}")
    return value


#: an argparse type: a number in [0, 1)
fraction = _typed(_fraction, "number")


def nonneg_float(text: str) -> float:
    """A finite number in [0, 1e15] (times in ms; see the flag for its unit)."""
    return bounded_float(0.0, 1e15)(text)


def gib_amount(hi_gib: float) -> Callable[[str], float]:
    """An argparse type: GiB, 0 (unset) or at least one byte (2^-30 GiB) up to ``hi_gib``: a
    positive amount that rounds to 0 bytes would read as unset and silently use the default."""

    def parse(text: str) -> float:
        value = parse_float(text, 0.0, hi_gib)
        if 0 < value * 2**30 < 1:
            raise ValueError(f"expected 0 (unset) or at least one byte ({2**-30:.3g} GiB), got {text[:40]!r}")
        return value

    return _typed(parse, "GiB")


#: an argparse type: a count of devices (or of what they are split into: stages, pipelines,
#: processes), in [1, MAX_DEVICES]
device_count = bounded_int(1, MAX_DEVICES)
#: an argparse type: a batch in samples, in [1, MAX_BATCH]
batch_size = bounded_int(1, MAX_BATCH)
#: an argparse type: a device's memory in GiB, 0 (unset) or at least one byte, up to MAX_BYTES
memory_gib = gib_amount(MAX_BYTES / 2**30)
#: an argparse type: a time in ms, in [0, MAX_MS]
duration_ms = bounded_float(0.0, MAX_MS)


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
