"""The files of a checkpoint directory: hashed atomic writes, the manifest that commits a
step, verification on load, pruning and the directory lock. ``planner.runtime.checkpoint``
says what goes into the files.

Layout::

    DIR/.lock                  held (``flock``) by rank 0 of the run writing DIR
    DIR/step_<k>/*.pt          the ranks' files after k completed steps
    DIR/step_<k>/manifest.json written last, by rank 0: the step is complete
    DIR/latest.json            {"completed_steps": k}: the newest complete step (a pointer)

**Writes** (:func:`write_hashed`): ``torch.save`` streams through a writer that hashes
(sha256) and counts the bytes on their way to ``.<name>.<pid>.tmp`` in the same directory;
then ``fsync``, ``os.replace`` and an ``fsync`` of the directory. A failing write (ENOSPC,
EFBIG, EACCES, EIO) removes the temporary file and raises :class:`CheckpointError` naming the
file and the cause (torch would say only ``enforce fail at inline_container.cc``).

**Manifest** (``planner.checkpoint`` version 1): ``completed_steps``, per file its sha256 and
size, and ``settings`` (:func:`run_settings_record`): what the run trained with. A step
directory without a readable manifest is partial (a run died while writing it) and is never
loaded. Before a step's files are rewritten (a resumed run reaching a step again) rank 0
removes its manifest first.

**Reading**: every file of the directory -- manifests, ``latest.json``, the ``.pt`` files
before ``torch.load(weights_only=True)`` -- is opened through ``planner.artifacts.reading``,
the path every input of the planner takes: a regular file of bounded size
(:data:`MAX_MANIFEST_BYTES`, :data:`MAX_POINTER_BYTES`,
``planner.artifacts.limits.MAX_CHECKPOINT_FILE_BYTES``), never a FIFO or a device (a FIFO
named ``manifest.json`` blocked a resume for ever; a link to ``/dev/zero`` grew without bound),
refused in one line naming the file.

**Verification** (:func:`verify_file`): the file is listed, is a regular file, has the listed
size and sha256; otherwise it is corrupt, truncated (a 0-byte file included), missing or a
special file, said in one line naming it. The step the ranks resume from is the newest one
whose files verify on every rank (``planner.runtime.checkpoint.resume_chunks``); a skipped
step is a warning naming its bad file. A directory with no manifest at all (written before
manifests, or with them deleted) is not loaded unless the run says so explicitly
(``--trust-unverified-checkpoint``): its files cannot be told from damaged ones. torch's own
load errors (``PytorchStreamReader failed reading zip archive``, an ``EOFError``, a refused
unpickling) are translated into one line naming the file.

**Pruning** (``--keep-last K``, default :data:`DEFAULT_KEEP_LAST`; 0 keeps all): after a step
is committed, rank 0 removes the older complete steps beyond the newest K, and partial step
directories older than the newest complete step. K >= 2 keeps a fallback for a corrupt newest
step.

**Lock** (:class:`DirectoryLock`): ``flock`` on ``DIR/.lock`` (released by the kernel when
its holder dies, so a killed run leaves no stale lock) holds off a second run; the holder's
pid, host and start are in the file for the refusal. On a filesystem without ``flock``
across hosts (some NFS setups) the lock holds on one host only. Taking it also removes the
``.tmp`` files a killed run left.

The run settings a resume must match are ``planner.runtime.checkpoint_settings``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import stat
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from planner.artifacts.codec import parse_text
from planner.artifacts.errors import PlannerError, PlannerInputError
from planner.artifacts.files import atomic_write_text, fsync_dir, os_error_text, temp_path
from planner.artifacts.limits import MAX_CHECKPOINT_FILE_BYTES
from planner.artifacts.reading import kind_of, open_input, read_text
from planner.runtime import lifecycle

__all__ = [
    "DEFAULT_KEEP_LAST",
    "CheckpointError",
    "DirectoryLock",
    "Manifest",
    "complete_steps",
    "load_verified",
    "prune",
    "read_manifest",
    "unverified_step",
    "verify_file",
    "write_hashed",
    "write_manifest",
]

SCHEMA = "planner.checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
LATEST = "latest.json"
LOCK = ".lock"
#: the largest manifest read (a manifest lists each file of a step in ~120 bytes)
MAX_MANIFEST_BYTES = 16 * 2**20
#: the largest ``latest.json`` read (it holds one number)
MAX_POINTER_BYTES = 4096
DEFAULT_KEEP_LAST = 3


class CheckpointError(PlannerError):
    """A checkpoint file that cannot be written or read: names the file and the cause (exit 1)."""


def step_dir(root: Path, completed_steps: int) -> Path:
    return root / f"step_{completed_steps}"


# ---------------------------------------------------------------------- writes
class _HashingWriter:
    """A file object for ``torch.save``: bytes go to ``raw``, through sha256, counted; the
    first ``OSError`` is kept (torch reports it only as an ``inline_container`` failure)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw, self.sha, self.size = raw, hashlib.sha256(), 0
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            self.raw.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise
        self.sha.update(data)
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        self.raw.flush()


_IN_FLIGHT: set[Path] = set()


def _remove_in_flight(_line: str) -> None:
    """Exit hook: the temporary files of writes the process leaves in the middle of."""
    for tmp in list(_IN_FLIGHT):
        with contextlib.suppress(OSError):
            tmp.unlink()


lifecycle.at_exit(_remove_in_flight)


def write_hashed(path: Path, save: Callable[[Any], None]) -> dict[str, Any]:
    """Write a file with ``save(file object)`` atomically (see the module docstring); return
    its record ``{"sha256", "bytes"}``. A process that leaves in the middle (a peer's failure
    named, a second signal) removes the temporary file on its way out."""
    tmp = temp_path(path)
    _IN_FLIGHT.add(tmp)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as raw:
            writer = _HashingWriter(raw)
            try:
                save(writer)
                raw.flush()
                os.fsync(raw.fileno())
            except OSError:
                raise
            except Exception as exc:
                if writer.error is not None:
                    raise writer.error from exc
                raise
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise CheckpointError(f"{path}: cannot write the checkpoint: {os_error_text(exc)}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    finally:
        _IN_FLIGHT.discard(tmp)
    fsync_dir(path.parent)
    return {"sha256": writer.sha.hexdigest(), "bytes": writer.size}


# ---------------------------------------------------------------------- manifests
Manifest = dict[str, Any]


def write_manifest(
    root: Path, completed_steps: int, files: dict[str, dict[str, Any]], settings: dict[str, Any]
) -> None:
    """Commit step ``completed_steps``: its manifest, then ``latest.json``."""
    directory = step_dir(root, completed_steps)
    manifest = {
        "schema": SCHEMA, "version": VERSION, "completed_steps": completed_steps,
        "files": dict(sorted(files.items())), "settings": settings,
    }
    latest = json.dumps({"completed_steps": completed_steps})
    for name, text in ((directory / MANIFEST, json.dumps(manifest, indent=1)), (root / LATEST, latest)):
        try:
            atomic_write_text(name, text + "\n")
        except OSError as exc:
            raise CheckpointError(f"{name}: cannot write: {os_error_text(exc)}") from None


def uncommit(root: Path, completed_steps: int) -> None:
    """Remove step ``completed_steps``'s manifest before its files are written again."""
    with contextlib.suppress(FileNotFoundError):
        (step_dir(root, completed_steps) / MANIFEST).unlink()
        fsync_dir(step_dir(root, completed_steps))


def _read_json(path: Path, what: str, limit: int) -> Any:
    """A small JSON file of the directory, read through ``planner.artifacts.reading`` (a FIFO,
    a device or an oversized file refused at once); :class:`CheckpointError` naming it."""
    try:
        return parse_text(read_text(path, what, limit), str(path))
    except PlannerInputError as exc:
        raise CheckpointError(f"unreadable: {exc}" if str(exc).startswith(str(path)) else f"{path}: unreadable: {exc}") from None


def read_manifest(root: Path, completed_steps: int) -> Manifest:
    """The step's manifest; :class:`CheckpointError` naming it when missing or unreadable."""
    path = step_dir(root, completed_steps) / MANIFEST
    if not os.path.lexists(path):
        raise CheckpointError(f"{path}: missing (the step was not completely written)")
    data = _read_json(path, "checkpoint manifest", MAX_MANIFEST_BYTES)
    ok = isinstance(data, dict) and data.get("schema") == SCHEMA and data.get("version") == VERSION
    if not ok or data.get("completed_steps") != completed_steps or not isinstance(data.get("files"), dict):
        raise CheckpointError(f"{path}: not a {SCHEMA} version {VERSION} manifest of step {completed_steps}")
    bad = next((name for name, record in data["files"].items() if not (
        isinstance(record, dict) and isinstance(record.get("sha256"), str) and type(record.get("bytes")) is int)), None)
    if bad is not None:
        raise CheckpointError(f"{path}: files.{bad[:60]}: not a {{\"sha256\": <hex>, \"bytes\": <size>}} record")
    if not isinstance(data.get("settings", {}), dict):
        raise CheckpointError(f"{path}: settings: not an object (got {str(data['settings'])[:40]!r})")
    return data


def complete_steps(root: Path) -> list[int]:
    """Steps with a manifest file, newest first (readability is checked when one is used)."""
    steps = []
    for entry in root.glob("step_*"):
        suffix = entry.name[len("step_") :]
        if suffix.isdigit() and os.path.lexists(entry / MANIFEST):
            steps.append(int(suffix))
    return sorted(steps, reverse=True)


def legacy_step(root: Path) -> int | None:
    """The step ``latest.json`` names in a directory without manifests (None when there is no
    ``latest.json``); :class:`CheckpointError` naming it when it cannot be read or names none."""
    path = root / LATEST
    if not os.path.lexists(path):
        return None
    data = _read_json(path, "checkpoint pointer", MAX_POINTER_BYTES)
    step = data.get("completed_steps") if isinstance(data, dict) else None
    if type(step) is not int or step < 0:
        raise CheckpointError(f"{path}: not {{\"completed_steps\": <steps>}} (got {str(data)[:60]!r})")
    return step


def unverified_step(root: Path, trust_unverified: bool) -> int:
    """The step a directory without any manifest resumes from: refused (one line) unless
    ``trust_unverified`` (``--trust-unverified-checkpoint``), since no file of it can be told
    from a damaged one; with it, ``latest.json``'s step, loaded with a warning."""
    try:
        legacy = legacy_step(root)
    except CheckpointError as exc:
        raise PlannerInputError(f"--resume: {exc}") from None
    if legacy is None:
        raise PlannerInputError(f"--resume: no checkpoint in {root} (no step directory with a {MANIFEST})")
    if not trust_unverified:
        raise PlannerInputError(
            f"--resume: {root} has no step with a {MANIFEST} ({LATEST} names step {legacy}): its files "
            f"cannot be verified, and a damaged one would train silently; pass --trust-unverified-checkpoint to load "
            f"step {legacy} unverified"
        )
    return legacy


def _sha256(fh: IO[bytes]) -> str:
    sha = hashlib.sha256()
    for block in iter(lambda: fh.read(1 << 20), b""):
        sha.update(block)
    return sha.hexdigest()


def verify_file(manifest: Manifest, path: Path) -> str:
    """Why ``path`` does not match its manifest record ("" when it does); a special file (a
    FIFO, a link to ``/dev/zero``) is named as such, never opened for reading."""
    record = manifest["files"].get(path.name)
    if record is None:
        return f"{path}: not in the step's manifest"
    try:
        st = path.stat()
    except FileNotFoundError:
        return f"{path}: missing"
    except OSError as exc:
        return f"{path}: unreadable: {os_error_text(exc)}"
    if not stat.S_ISREG(st.st_mode):
        return f"{path}: is {kind_of(st.st_mode)}, not a checkpoint file"
    if st.st_size != record.get("bytes"):
        cause = "empty (0 bytes)" if st.st_size == 0 else f"{st.st_size} bytes"
        return f"{path}: truncated or overwritten: {cause}, the manifest says {record.get('bytes')}"
    try:
        with open_input(path, "checkpoint file", st.st_size) as fh:
            digest = _sha256(fh)
    except PlannerInputError as exc:
        return str(exc)
    except OSError as exc:
        return f"{path}: unreadable: {os_error_text(exc)}"
    if digest != record.get("sha256"):
        return f"{path}: corrupt: sha256 {digest[:12]}... differs from the manifest's {str(record.get('sha256'))[:12]}..."
    return ""


def load_verified(path: Path) -> Any:
    """``torch.load(weights_only=True)`` of a regular file of bounded size, opened through
    ``planner.artifacts.reading``; its errors as one line naming the file."""
    import pickle

    import torch

    try:
        with open_input(path, "checkpoint file", MAX_CHECKPOINT_FILE_BYTES) as fh, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(fh, weights_only=True, map_location="cpu")
    except PlannerInputError as exc:
        raise CheckpointError(str(exc)) from None
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: unreadable: {os_error_text(exc)}") from None
    except EOFError:
        raise CheckpointError(f"{path}: truncated (ends before its data; {path.stat().st_size} bytes)") from None
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: refused (weights_only=True loads tensors and plain containers only): {first}") from None
    except RuntimeError as exc:
        text = str(exc)
        if "PytorchStreamReader" in text or "zip archive" in text or "inline_container" in text:
            raise CheckpointError(f"{path}: truncated or not a torch checkpoint ({text.split('.')[0]})") from None
        raise CheckpointError(f"{path}: cannot be loaded: {text.splitlines()[0] if text else type(exc).__name__}") from None


# ---------------------------------------------------------------------- pruning
def prune(root: Path, keep_last: int) -> list[str]:
    """Remove complete steps beyond the newest ``keep_last`` (0: keep all) and partial step
    directories older than the newest complete one; return warnings for what could not go."""
    complete = complete_steps(root)
    if not complete:
        return []
    drop = complete[keep_last:] if keep_last > 0 else []
    newest = complete[0]
    for entry in root.glob("step_*"):
        suffix = entry.name[len("step_") :]
        if suffix.isdigit() and int(suffix) < newest and int(suffix) not in complete:
            drop.append(int(suffix))
    problems = []
    for step in sorted(set(drop)):
        directory = step_dir(root, step)
        with contextlib.suppress(FileNotFoundError):
            (directory / MANIFEST).unlink()  # uncommitted first: a half-removed step is partial
        try:
            shutil.rmtree(directory)
        except FileNotFoundError:
            pass
        except OSError as exc:
            problems.append(f"warning: could not remove old checkpoint {directory}: {os_error_text(exc)}")
    fsync_dir(root)
    return problems


def remove_temporaries_of(root: Path, pid: int) -> None:
    """Remove the temporary files process ``pid`` (of this host) left under ``root``: it died
    in the middle of a write (see ``planner.artifacts.files.temp_path`` for the names)."""
    for tmp in [*root.glob(f".*.{pid}.tmp"), *root.glob(f"step_*/.*.{pid}.tmp")]:
        with contextlib.suppress(OSError):
            tmp.unlink()


def remove_temporaries(root: Path) -> None:
    """Remove the ``.tmp`` files a killed run left under ``root`` (call with the lock held)."""
    for tmp in [*root.glob(".*.tmp"), *root.glob("step_*/.*.tmp"), *root.glob("step_*/*.tmp"), *root.glob("*.tmp")]:
        with contextlib.suppress(OSError):
            tmp.unlink()


# ---------------------------------------------------------------------- the lock
class DirectoryLock:
    """``flock`` on ``DIR/.lock`` (see the module docstring); :meth:`acquire` raises
    :class:`PlannerInputError` naming the holder when another run has it."""

    def __init__(self, directory: str | Path) -> None:
        self.root = Path(directory)
        self.fd: int | None = None

    def acquire(self) -> DirectoryLock:
        path = self.root / LOCK
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise PlannerInputError(f"--checkpoint-dir {self.root}: cannot be used: {os_error_text(exc)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = ""
            with contextlib.suppress(OSError):
                holder = os.pread(fd, 512, 0).decode(errors="replace").strip()
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise PlannerInputError(
                    f"--checkpoint-dir {self.root}: in use by another run ({holder or 'holder unknown'}); "
                    f"two runs cannot write one checkpoint directory"
                ) from None
            raise PlannerInputError(f"--checkpoint-dir {self.root}: cannot lock {path}: {os_error_text(exc)}") from None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            started = time.strftime("%Y-%m-%d %H:%M:%S")
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {started}\n".encode(), 0)
        self.fd = fd
        remove_temporaries(self.root)
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None
