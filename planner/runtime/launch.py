"""``python -m planner.runtime.launch TORCHRUN-ARGS``: torchrun, left through ``os._exit``.

``planner run`` starts torchrun this way. It is ``torch.distributed.run`` itself (same flags,
same agent, same exit codes: 0, or 1 when a worker failed or a signal stopped it), except:

- once the agent has returned -- every worker ended -- the process leaves with ``os._exit``
  instead of the interpreter's teardown of torch, which took 3-5 s on this busy 2-core
  machine (measured: a bare ``torchrun`` of a script that exits 1 printed its trailer, then
  took 3.7 and 5.2 s to end). That time counted against "the run ends within
  ``--timeout-s`` + 5 s";
- torchrun's tracebacks are kept only for failures nobody has named. A worker that fails
  through ``planner.runtime.lifecycle.leave`` has printed one line naming the cause and left
  it in torchrun's error file; when any failed worker's record holds such a line, the ~35-line
  ``ChildFailedError`` traceback would repeat it in torchrun's words, so one line gives the
  workers' exit codes and says the cause was named. A signal that stops torchrun (its
  ``SignalException``: the workers were asked to stop and said where they stopped) is one line
  too. A failure no worker named (a worker killed before it could say anything, with no peer
  to name it) keeps torchrun's full report; ``PLANNER_DEBUG=1`` keeps it always;
- with ``PLANNER_QUIET_TORCHRUN`` (``planner run`` without ``--verbose``) torchrun's own log
  lines ("Sending process ... closing signal SIGTERM", "failed (exitcode: 1) local_rank: 0 ...")
  are silenced.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import traceback
from typing import Any

from planner.runtime.lifecycle import NAMED


def named_failures(failures: dict[int, Any]) -> list[str]:
    """The lines of the failed workers (torchrun's ``ProcessFailure`` records) that named their
    failure (``planner.runtime.lifecycle.leave`` wrote them to the error file)."""
    lines = []
    for failure in failures.values():
        message = getattr(failure, "message", "")
        if isinstance(message, dict):  # torchelastic's structured record: {"message": ..., "extraInfo": ...}
            message = message.get("message", "")
        if isinstance(message, str) and message.startswith(NAMED):
            lines.append(message)
    return lines


def _say(line: str) -> None:
    print(f"torchrun: {line}", file=sys.stderr, flush=True)


def _run() -> int:
    from torch.distributed.run import main

    sys.argv[0] = "torchrun"
    if os.environ.get("PLANNER_QUIET_TORCHRUN"):  # planner run without --verbose: the workers say what happened
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    # torchrun copies the first failed worker's error file into its own; without one of its own
    # it logs an error line saying so, for every failure (the workers' files are set apart)
    own = tempfile.mkdtemp(prefix="planner-launch-")
    os.environ.setdefault("TORCHELASTIC_ERROR_FILE", os.path.join(own, "error.json"))
    try:
        return _agent(main)
    finally:
        shutil.rmtree(own, ignore_errors=True)


def _agent(main: Any) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        main()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except SignalException as exc:
        if os.environ.get("PLANNER_DEBUG"):
            traceback.print_exc()
        _say(f"stopped by {exc.sigval.name}: its workers were asked to stop (their lines say where)")
        return 1
    except ChildFailedError as exc:
        if named_failures(exc.failures) and not os.environ.get("PLANNER_DEBUG"):
            ranks = sorted(exc.failures)
            codes = ", ".join(f"rank {rank} {f.exitcode if f.exitcode >= 0 else f.signal_name()}"
                              for rank, f in sorted(exc.failures.items())[:8])
            _say(f"{len(ranks)} worker(s) ended with an error (exit codes: {codes}); the cause is named above")
            return 1
        traceback.print_exc()
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    code = _run()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
