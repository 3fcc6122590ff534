"""Writing output files safely: atomically, with every failure naming the file and its cause.

- :func:`atomic_write_bytes` / :func:`atomic_write_text`: the bytes go to a temporary file in
  the target's own directory (``.<name>.<pid>.tmp``), are flushed and ``fsync``-ed, then
  ``os.replace`` puts them in place (atomic on POSIX within one filesystem) and the directory
  is ``fsync``-ed. A reader sees the old file or the new one, never a part; a failure (a full
  disk, a file-size limit, a directory that went away) leaves the old file untouched and
  removes the temporary file, so nothing ``.tmp`` is left behind.
- :func:`check_output_path`: before any work, whether a file can be written there: the path
  is not a directory or a device (``/dev/full`` accepts ``open`` and fails every write; an
  atomic replace would swap the device node itself), its directory exists and a file can be
  created in it (``/proc``, a read-only mount, a path under a regular file fail here), and
  the filesystem has room. Each refusal is one :class:`PlannerInputError` line naming the path
  and the cause.
- :func:`os_error_text`: ``"No space left on device (ENOSPC)"``: the strerror and the errno's
  name, the form every file error of the runtime uses.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from planner.artifacts.errors import PlannerInputError

__all__ = ["atomic_write_bytes", "atomic_write_text", "check_output_path", "free_bytes", "fsync_dir", "os_error_text"]

#: room a small output (a report, a manifest) needs on its filesystem
SMALL_FILE_BYTES = 1 << 16


def os_error_text(exc: OSError) -> str:
    """``strerror (ERRNO)``, e.g. ``No space left on device (ENOSPC)``."""
    code = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno is not None else ""
    text = exc.strerror or str(exc) or type(exc).__name__
    return f"{text} ({code})" if code else text


def temp_path(path: Path) -> Path:
    """The temporary file a write to ``path`` goes through (same directory, so the rename is atomic)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink in ``directory`` durable (best effort: some filesystems refuse)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see the module docstring); raises ``OSError``."""
    target = Path(path)
    tmp = temp_path(target)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(target.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    """:func:`atomic_write_bytes` of UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def free_bytes(directory: str | Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem of ``directory``."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_output_path(path: str | Path, what: str, *, need_bytes: int = SMALL_FILE_BYTES) -> None:
    """Refuse, with one line naming ``what`` (e.g. ``--report``), the path and the cause, a
    file that cannot be written atomically at ``path`` with ``need_bytes`` free (see the
    module docstring). Creates and removes one empty temporary file in the directory."""
    target = Path(path)
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:  # e.g. ENOTDIR: a path under a regular file
        raise PlannerInputError(f"{what} {target}: cannot be written: {os_error_text(exc)}") from None
    if mode is not None and not stat.S_ISREG(mode):
        raise PlannerInputError(f"{what} {target}: is {_kind(mode)}, not a file that can be replaced")
    parent = target.parent
    if not parent.is_dir():
        cause = "does not exist" if not parent.exists() else "is not a directory"
        raise PlannerInputError(f"{what} {target}: its directory {parent} {cause}")
    probe = temp_path(target)
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.close(fd)
        probe.unlink()
    except OSError as exc:
        raise PlannerInputError(f"{what} {target}: cannot create a file in {parent}: {os_error_text(exc)}") from None
    free = free_bytes(parent)
    if free < need_bytes:
        raise PlannerInputError(
            f"{what} {target}: {parent} has {free} bytes free, {need_bytes} needed (No space left on device (ENOSPC))"
        )
