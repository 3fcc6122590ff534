"""``python -m planner.runtime.launch TORCHRUN-ARGS``: torchrun, left through ``os._exit``.

``planner run`` starts torchrun this way. It is ``torch.distributed.run`` itself (same flags,
same agent, same exit codes: 0, or 1 when a worker failed or a signal stopped it), except that
once the agent has returned -- every worker ended, the failure trailer printed -- the process
leaves with ``os._exit`` instead of the interpreter's teardown of torch, which took 3-5 s on
this busy 2-core machine (measured: a bare ``torchrun`` of a script that exits 1 printed its
trailer, then took 3.7 and 5.2 s to end). That time counted against "the run ends within
``--timeout-s`` + 5 s". When a worker failed, torchrun's failure trailer (a ``ChildFailedError``
traceback with each failure's summary) is one line of exit codes instead: every worker has said
its cause in one line already (``PLANNER_DEBUG=1`` prints the trailer); a stop signal torchrun
received (``SignalException``) prints no traceback: ``planner run`` and the workers say it. With
``PLANNER_QUIET_TORCHRUN`` (``planner run`` without ``--verbose``) torchrun's own log lines
("Sending process ... closing signal SIGTERM", "failed (exitcode: 1) local_rank: 0 ...") are
silenced too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback


def _run() -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main

    sys.argv[0] = "torchrun"
    if os.environ.get("PLANNER_QUIET_TORCHRUN"):  # planner run without --verbose: the workers say what happened
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        main()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except SignalException:  # planner run forwarded a stop signal and says so itself; the workers said where they stopped
        if os.environ.get("PLANNER_DEBUG"):
            traceback.print_exc()
        return 1
    except ChildFailedError as exc:  # each worker said why, in one line: the exit codes, not the trailer
        if os.environ.get("PLANNER_DEBUG"):
            traceback.print_exc()
        else:
            codes = ", ".join(f"rank {rank} {f.exitcode if f.exitcode >= 0 else f.signal_name()}"
                              for rank, f in sorted(exc.failures.items()))
            print(f"planner.runtime: torchrun: workers ended with exit codes: {codes}", file=sys.stderr)
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
