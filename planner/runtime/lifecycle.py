"""A rank's process lifecycle: its phase, the signals it takes, the death of its launcher, and
the one way it leaves.

**Phases** (:class:`Phase`): before training, training, after training (gathering and
writing the report). Failure lines name the phase ("before training" only before the first
step; "at step K" during a step; "after training" after the last).

**Signals** (SIGTERM, SIGINT, SIGHUP: what torchrun forwards to its workers). A Python signal
handler runs only when the main thread returns to the interpreter, never while it waits in a
collective or in the rendezvous, so :func:`install` blocks these signals in every thread and a
daemon thread takes them with ``sigtimedwait``; whatever the main thread is doing:

- while training, the first signal asks for a **stop**: the ranks agree on it at the next step
  boundary (:func:`stop_signal_everywhere`, one ``all_reduce`` of the flag, MAX over ranks, so
  all stop after the same step), write a final checkpoint when ``--checkpoint-dir`` is set
  and leave with 128 + the signal's number; a rank that does not reach a step boundary
  within :data:`STOP_GRACE_S` seconds (a peer hung, a step longer than that) leaves without
  one. torchrun sends SIGKILL 30 s after its own SIGTERM, so the grace is below that;
- after training, the first signal is noted and the report is finished (its results are what
  the run was for);
- before training, or a second signal: the rank leaves at once, with one line. A repeat that
  comes within :data:`REPEAT_WINDOW_S` of the first is the same request reaching the rank by a
  second path (measured: the launcher's parent-death SIGTERM reached each worker twice, 30 ms
  apart, and the workers, taking the second as "stop now", wrote no final checkpoint): it is
  ignored. A person's second Ctrl-C is slower than that, and ``planner run`` answers it by
  killing torchrun anyway;
- a rank that leaves without its final checkpoint says which step ``--resume`` continues from
  (:func:`committed`: the newest step this run wrote or resumed from).

**Launcher death**: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` on Linux (the kernel kills the rank
when its parent, the torchrun agent, dies, even by SIGKILL), and, on every platform, the
liveness thread leaves when the parent process changes or the agent's store stops answering
(``planner.runtime.liveness``). A worker is never left training alone.

**Leaving** (:func:`leave`): one line on stderr, the exit hooks (the liveness exit record),
then ``os._exit``: every thread ends at once, whichever called it (the main thread, the
signal thread, the liveness thread), and only one of them prints. Under torchrun a failing
rank also writes its line to torchrun's error file (``TORCHELASTIC_ERROR_FILE``), so the
launcher (``planner.runtime.launch``) can tell a failure the run has named in one line from
an unknown one, and print torchrun's traceback only for the latter.

SIGXFSZ is ignored, so a file-size limit (``ulimit -f``) makes a write fail with EFBIG, which
names the file, instead of killing the rank silently.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

__all__ = [
    "STOP_GRACE_S",
    "Phase",
    "StopRun",
    "at_exit",
    "committed",
    "install",
    "leave",
    "named_at_fault",
    "phase",
    "set_committed",
    "set_phase",
    "stop_signal",
    "stop_signal_everywhere",
]

#: seconds a rank asked to stop may take to reach a step boundary (torchrun kills at 30 s)
STOP_GRACE_S = 20.0
#: a second stop signal within this many seconds of the first is the same request (module docstring)
REPEAT_WINDOW_S = 1.0
#: what the error file of a rank that named its failure starts with (``planner.runtime.launch`` reads it)
NAMED = "planner.runtime:"

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1


class Phase(enum.Enum):
    BEFORE = "before training"
    TRAINING = "training"
    AFTER = "after training"


class StopRun(Exception):
    """Raised on every rank at the step boundary where the ranks agreed to stop on a signal."""

    def __init__(self, signum: int, completed_steps: int, checkpoint: str = "") -> None:
        self.signum = signum
        self.completed_steps = completed_steps
        self.checkpoint = checkpoint
        super().__init__(f"stopped by {signal.Signals(signum).name} after {completed_steps} completed steps")


class _State:
    def __init__(self) -> None:
        self.rank = 0
        self.phase = Phase.BEFORE
        self.step = -1
        self.stop_signal = 0
        self.stop_deadline = 0.0
        self.stop_at = 0.0
        self.committed = -1
        self.exit_lock = threading.Lock()
        self.hooks: list[Callable[[str], None]] = []
        self.installed = False


_state = _State()


def phase() -> Phase:
    return _state.phase


def set_phase(new: Phase, step: int = -1) -> None:
    _state.phase = new
    _state.step = step


def stop_signal() -> int:
    """The signal that asked this rank to stop (0: none)."""
    return _state.stop_signal


def set_committed(completed_steps: int) -> None:
    """The newest checkpoint step this run wrote (or resumed from): where a resume continues."""
    _state.committed = completed_steps


def committed() -> int:
    """:func:`set_committed`'s step (-1: none)."""
    return _state.committed


def _resume_note() -> str:
    step = _state.committed
    return f"; --resume continues from step {step}" if step >= 0 else "; no checkpoint was written"


def _write_error_file(code: int, line: str) -> None:
    """torchrun's error file for this worker (when under torchrun): the line that names the failure."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or code == 0 or not line:
        return
    with contextlib.suppress(OSError), open(path, "w") as fh:
        json.dump({"message": {"message": line, "extraInfo": {"timestamp": str(int(time.time()))}}}, fh)


def at_exit(hook: Callable[[str], None]) -> None:
    """Call ``hook(line)`` just before the process leaves through :func:`leave`."""
    _state.hooks.append(hook)


def leave(code: int, line: str = "") -> NoReturn:
    """Print ``line`` (if any), run the exit hooks and end the process with ``code`` (see the
    module docstring); a second caller blocks until the first has ended the process."""
    _state.exit_lock.acquire()
    if line:
        with contextlib.suppress(Exception):  # stderr may be a closed pipe (its reader gone)
            print(line, file=sys.stderr, flush=True)
        _write_error_file(code, line)
    for hook in _state.hooks:
        with contextlib.suppress(Exception):
            hook(line)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _set_parent_death_signal() -> None:
    """``PR_SET_PDEATHSIG`` = SIGKILL (Linux); leave at once if the parent is already gone."""
    parent = os.getppid()
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent died between the two reads: the signal came too late
        leave(1, f"planner.runtime: rank {_state.rank}: its launcher (process {parent}) is gone; leaving")


def install(rank: int) -> None:
    """Block :data:`SIGNALS` in this thread (and so in every thread started after it), take
    them on a daemon thread, set the parent-death signal and ignore SIGXFSZ. Call first thing
    in a rank's ``main``, before torch starts its threads."""
    _state.rank = rank
    if _state.installed:
        return
    _state.installed = True
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    _set_parent_death_signal()
    threading.Thread(target=_take_signals, name="planner-signals", daemon=True).start()


def _say(line: str) -> None:
    with contextlib.suppress(Exception):  # stderr may be a closed pipe: the signal thread must live on
        print(line, file=sys.stderr, flush=True)


def _take_signals() -> None:
    while True:
        info = signal.sigtimedwait(SIGNALS, 0.25)
        if info is not None:
            _on_signal(info.si_signo)
        elif _state.stop_signal and time.monotonic() > _state.stop_deadline and _state.phase is Phase.TRAINING:
            name = signal.Signals(_state.stop_signal).name
            leave(
                128 + _state.stop_signal,
                f"planner.runtime: rank {_state.rank} stopped by {name} at step {_state.step}: no step boundary "
                f"reached within {STOP_GRACE_S:g} s, left without a final checkpoint{_resume_note()}",
            )


def _on_signal(signum: int) -> None:
    name = signal.Signals(signum).name
    first = not _state.stop_signal
    if not first and time.monotonic() - _state.stop_at < REPEAT_WINDOW_S:
        return  # the same request by a second path (module docstring)
    if first:
        _state.stop_at = time.monotonic()
    if first and _state.phase is Phase.TRAINING:
        _state.stop_signal = signum
        _state.stop_deadline = time.monotonic() + STOP_GRACE_S
        if _state.rank == 0:
            _say(f"planner.runtime: {name}: stopping at the end of step {_state.step}")
        return
    if first and _state.phase is Phase.AFTER:
        _state.stop_signal = signum
        if _state.rank == 0:
            _say(f"planner.runtime: {name} after training: writing the results first")
        return
    where = f"at step {_state.step}" if _state.phase is Phase.TRAINING else _state.phase.value
    again = "" if first else " (a second signal)"
    note = _resume_note() if _state.phase is Phase.TRAINING else ""
    leave(128 + signum, f"planner.runtime: rank {_state.rank} stopped by {name} {where}{again}{note}")


def stop_signal_everywhere(device: object, world_size: int) -> int:
    """The ranks' agreement at a step boundary: the largest stop signal any rank has been
    asked (0: go on). Collective over the default group when ``world_size`` > 1."""
    mine = _state.stop_signal
    if world_size <= 1:
        return mine
    import torch
    import torch.distributed as dist

    flag = torch.tensor([mine], dtype=torch.int64, device=device)  # type: ignore[call-overload]
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


def named_at_fault(output: str) -> set[str]:
    """The ranks a run's own lines name as the one at fault (the inverse of the line formats of
    :mod:`planner.runtime.liveness` and :mod:`planner.runtime.main`): ``rank R failed ...``
    names R; ``rank Q stopped: rank R ...`` and ``rank Q leaves, named at fault: rank R ...``
    name R. Used by the fault benchmark and the survival tests to judge a run from outside."""
    named = set()
    for line in output.splitlines():
        if not line.startswith("planner.runtime: rank "):
            continue
        words = line.split()
        if words[3] == "failed":
            named.add(words[2])
        elif words[3] in ("stopped:", "leaves,") and "rank" in words[4:7]:
            named.add(words[words.index("rank", 4) + 1])
    return named
