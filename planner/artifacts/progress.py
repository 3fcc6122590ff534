"""Progress of long work on stderr, whether or not stderr is a terminal.

On a terminal: a ``tqdm`` bar. Otherwise (a log file, a CI job, a pipe): one line every
``PLANNER_PROGRESS_EVERY_S`` seconds (default 5), the first after two seconds (or the period,
if shorter), from a daemon thread, so that the lines keep coming while one long step runs (a solver search, a
layer's timing) and say the work is alive and where it is::

    planner: profile gpt: 8/25 layers timed, micro-batch 2 (10 s)
    planner: plan: searching tensor-parallel degree 2 (seq-par) (15 s)

and, when any line was written, a last one with the total time. Work that ends within two
seconds prints nothing. While an inner Progress runs (a command's phases around a library's
own), only the inner one writes. ``PLANNER_PROGRESS=0`` turns it off (as ``--no-progress`` does for
``planner profile``). :func:`note` lets code deep in a step say what it is doing without
holding the :class:`Progress` (a no-op when none is active).

No torch; ``tqdm`` is imported only for a terminal.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from types import TracebackType
from typing import Any, TextIO

__all__ = ["Progress", "note"]

#: the seconds of work before the first line, when stderr is not a terminal
FIRST_AFTER_S = 2.0
_ACTIVE: list[Progress] = []


def _every_s() -> float:
    try:
        value = float(os.environ.get("PLANNER_PROGRESS_EVERY_S", "5"))
    except ValueError:
        return 5.0
    return min(max(value, 0.05), 3600.0) if value == value else 5.0  # NaN -> the default


def note(detail: str) -> None:
    """Say what the innermost active :class:`Progress` is doing now (no-op without one)."""
    if _ACTIVE:
        _ACTIVE[-1].detail = detail


class Progress:
    """A unit of long work with ``total`` steps (0 = unknown); use as a context manager and
    call :meth:`update` as steps finish (see the module docstring)."""

    def __init__(self, what: str, total: int = 0, *, unit: str = "", enabled: bool = True,
                 stream: TextIO | None = None, every_s: float | None = None) -> None:
        self.what = what
        self.total = total
        self.unit = unit
        self.done = 0
        self.detail = ""
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and os.environ.get("PLANNER_PROGRESS", "1") != "0"
        self.every_s = every_s if every_s is not None else _every_s()
        self._tty = self.enabled and bool(getattr(self.stream, "isatty", lambda: False)())
        self._bar: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = 0.0
        self._handed_over = False
        self.lines = 0

    def __enter__(self) -> Progress:
        self._start = time.monotonic()
        _ACTIVE.append(self)
        if not self.enabled:
            return self
        if self._tty:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total or None, desc=self.what, unit=self.unit or "it", file=self.stream)
        else:
            self._thread = threading.Thread(target=self._beat, name="planner-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        if self._bar is not None:
            self._bar.close()
        if self.lines and kind is None and not self._handed_over:
            self._write(f"planner: {self.what}: done ({self._elapsed()})")

    def hand_over(self) -> None:
        """Stop now, without the last line: the work goes on where another progress speaks for
        it (``planner run``'s launch, once rank 0 of the workers has started its own)."""
        self._handed_over = True
        self.__exit__(None, None, None)

    def update(self, n: int = 1, detail: str | None = None) -> None:
        """``n`` more steps done; ``detail`` (if given) says where the work is now."""
        self.done += n
        if detail is not None:
            self.detail = detail
        if self._bar is not None:
            self._bar.update(n)
            if detail:
                self._bar.set_postfix_str(detail, refresh=False)

    def line(self) -> str:
        """The line a heartbeat writes now."""
        count = f"{self.done}/{self.total}{' ' + self.unit if self.unit else ''}" if self.total else ""
        body = ", ".join(part for part in (count, self.detail) if part)
        return f"planner: {self.what}: {body or 'working'} ({self._elapsed()})"

    def _elapsed(self) -> str:
        seconds = time.monotonic() - self._start
        return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"

    def _beat(self) -> None:
        wait = min(FIRST_AFTER_S, self.every_s)  # a shorter period asked for shortens the first wait too
        while not self._stop.wait(wait):
            if not _ACTIVE or _ACTIVE[-1] is self:  # an inner Progress speaks for the work while it lasts
                self._write(self.line())
            wait = self.every_s

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
            self.lines += 1
        except (OSError, ValueError):  # a closed or broken stream: progress is not worth failing for
            self._stop.set()
