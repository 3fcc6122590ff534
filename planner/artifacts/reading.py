"""Reading input files: the one path every file the planner opens goes through.

Profiles, clusters, plans, run reports, PipeDream graphs, ``hf:`` configs, schedule CSVs and a
checkpoint directory's manifests, ``latest.json`` and tensor files are all opened here:

- :func:`open_input`: a **regular file** of at most ``limit`` bytes, opened for reading, or one
  :class:`PlannerInputError` line naming the file and the cause. A FIFO, ``/dev/zero`` (or a
  symlink to it), a directory or a socket is refused from ``stat`` before anything is opened,
  and the open itself is ``O_NONBLOCK`` and checked again with ``fstat``, so a FIFO swapped in
  between cannot block it and a device cannot fill memory: the refusal costs two system calls.
- :func:`read_input`: its bytes (at most ``limit``, read once: a file that grows past the
  limit while read is refused too); :func:`read_text`: those bytes as UTF-8 (a leading
  byte-order mark dropped, RFC 8259), invalid bytes refused naming their offset.

``what`` names the file's role in messages (``"JSON file"``, ``"checkpoint manifest"``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.limits import MAX_INPUT_BYTES

__all__ = ["open_input", "read_input", "read_text"]

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def kind_of(mode: int) -> str:
    """What a non-regular file is, for a message: ``a FIFO (named pipe)``, ``a character device``."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _cannot(p: Path, exc: OSError) -> PlannerInputError:
    return PlannerInputError(f"{p}: cannot read: {exc.strerror or exc}")


@contextmanager
def open_input(path: str | Path, what: str = "file", limit: int = MAX_INPUT_BYTES) -> Iterator[BinaryIO]:
    """The open file at ``path``: regular, at most ``limit`` bytes (see the module docstring)."""
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        raise PlannerInputError(f"{p}: no such file") from None
    except OSError as exc:
        raise _cannot(p, exc) from None
    if not stat.S_ISREG(mode):
        raise PlannerInputError(f"{p}: is {kind_of(mode)}, expected a {what}")
    try:  # O_NONBLOCK: a FIFO swapped in after the check still cannot block the open
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise _cannot(p, exc) from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise PlannerInputError(f"{p}: is {kind_of(st.st_mode)}, expected a {what}")
        if st.st_size > limit:
            raise PlannerInputError(f"{p}: {st.st_size:,} bytes is larger than the {limit:,} bytes a {what} may have")
        yield fh


def read_input(path: str | Path, what: str = "file", limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of an input file (:func:`open_input`), read once, at most ``limit``."""
    with open_input(path, what, limit) as fh:
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise _cannot(Path(path), exc) from None
    if len(data) > limit:
        raise PlannerInputError(f"{path}: larger than the {limit:,} bytes a {what} may have")
    return data


def read_text(path: str | Path, what: str = "file", limit: int = MAX_INPUT_BYTES) -> str:
    """:func:`read_input` decoded as UTF-8 (a leading byte-order mark is dropped: RFC 8259
    lets a parser ignore it); invalid bytes are refused naming their offset."""
    raw = read_input(path, what, limit)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PlannerInputError(
            f"{path}: not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 4]!r}); save it as UTF-8"
        ) from None
