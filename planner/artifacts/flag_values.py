"""Numbers given as text (command-line flags), read strictly: the CLI's argument types
(``planner.commands._args``) and the runtime's own parser (``planner.runtime.main``) both
read through here, so ``planner run`` refuses a flag before torchrun starts exactly as a rank
would.

Python's ``int`` and ``float`` accept more than a number written on a command line:
``int("1_000")``, ``float(" 1e3 ")``, ``int("١٢")`` (Arabic-Indic digits), ``float("nan")``,
``float("1e400")`` (inf). Here an integer is ASCII digits with an optional sign, a number the
decimal form with an optional exponent; it is finite and in its range, or refused with
:class:`ValueError` saying the range and the text given (the caller names the flag).
"""

from __future__ import annotations

import math
import re

__all__ = ["parse_float", "parse_int"]

_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _shown(text: str) -> str:
    return repr(text[:40] + ("..." if len(text) > 40 else ""))


def parse_int(text: str, lo: int, hi: int) -> int:
    """An integer in ``[lo, hi]`` written as ASCII digits (no ``1e3``, ``1_000``, ``1.0``)."""
    if len(text) > 64 or not _INT.fullmatch(text) or not lo <= int(text) <= hi:
        raise ValueError(f"expected an integer in [{lo:,}, {hi:,}], got {_shown(text)}")
    return int(text)


def parse_float(text: str, lo: float, hi: float, *, open_low: bool = False) -> float:
    """A finite number in ``[lo, hi]`` (``(lo, hi]`` with ``open_low``) in decimal notation
    (no ``nan``, ``inf``, ``1_000``; ``1e400`` is out of range)."""
    shown = f"{'(' if open_low else '['}{lo:g}, {hi:g}]"
    value = float(text) if len(text) <= 400 and _FLOAT.fullmatch(text) else math.nan
    if not math.isfinite(value) or not lo <= value <= hi or (open_low and value == lo):
        raise ValueError(f"expected a number in {shown}, got {_shown(text)}")
    return value
