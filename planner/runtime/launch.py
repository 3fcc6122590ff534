"""``python -m planner.runtime.launch TORCHRUN-ARGS``: torchrun, left through ``os._exit``.

``planner run`` starts torchrun this way. It is ``torch.distributed.run`` itself (same flags,
same agent, same exit codes: 0, or 1 when a worker failed or a signal stopped it), except that
once the agent has returned -- every worker ended, the failure trailer printed -- the process
leaves with ``os._exit`` instead of the interpreter's teardown of torch, which took 3-5 s on
this busy 2-core machine (measured: a bare ``torchrun`` of a script that exits 1 printed its
trailer, then took 3.7 and 5.2 s to end). That time counted against "the run ends within
``--timeout-s`` + 5 s".
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback


def _run() -> int:
    from torch.distributed.run import main

    sys.argv[0] = "torchrun"
    try:
        main()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
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
