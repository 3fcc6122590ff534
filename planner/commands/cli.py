"""The ``planner`` command line. Each subcommand lives in ``planner/commands/<name>.py``
and is a value there, ``COMMAND`` (:class:`~planner.commands._args.Subcommand`: its name, help
line, parser and run function), which :func:`build_parser` adds under ``planner``.

Exit codes: 0 success, 2 invalid input, 3 infeasible request, 1 anything else the planner
reports deliberately. Errors are one line on stderr, never a traceback (set
``PLANNER_DEBUG=1`` to see one).

Start-up cost: a command line that names a subcommand builds only that subcommand's parser
(argparse needs no other to parse it), so ``planner plan`` imports neither the runtime's
nor the report's modules; ``planner --help`` and a line naming no known subcommand build them
all. The subcommand modules import what they plan or run with inside their ``run`` functions,
so building every parser (``--help``) imports no solver, simulator or NumPy
(``benchmarks/import_cost.py`` measures both). Run as a process, the subcommands that neither
run nor profile a model (:data:`NUMPY_ONE_THREAD`) load NumPy with one BLAS thread unless the
environment says otherwise: their arrays are a profile's layers long (the only BLAS calls are
dot products of such vectors, below OpenBLAS's threading threshold), and starting OpenBLAS's
thread pool is about a quarter of NumPy's import CPU (``import numpy``: 0.13 s of process CPU,
0.09 s with one thread, on the 2-core development machine).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from planner.artifacts.errors import PlannerError
from planner.commands._args import Subcommand

# Subcommand modules, in the order ``planner --help`` lists them.
COMMANDS = (
    "plan",
    "show",
    "profile",
    "import_pipedream",
    "simulate",
    "run",
    "compare",
    "calibrate",
    "export",
)


#: subcommands whose NumPy gets one BLAS thread (``OPENBLAS_NUM_THREADS=1`` unless set): not
#: ``run`` and ``profile``, which start torch (its processes inherit the environment)
NUMPY_ONE_THREAD = ("plan", "show", "import_pipedream", "simulate", "compare", "calibrate", "export")


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with a one-line message (argparse's default also prints the usage)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``planner`` parser with every subcommand, or with just ``only`` (a name of
    :data:`COMMANDS`) when given."""
    parser = _Parser(
        prog="planner",
        description="Pipeline + data + tensor parallel planner (with ZeRO, per-stage replication and recomputation): "
        "profile a model, plan it for a cluster, compare plans, and run a plan under torchrun. Profiles come from: "
        "a measured torch model (planner profile --model: the zoo, hf:CONFIG for a Hugging Face config, or your "
        "own package.module:callable), the analytic formulas (planner profile --analytic gpt for GPT, --analytic hf "
        "--config for a Llama-style Hugging Face config), or PipeDream's profiles (planner import-pipedream).",
        epilog="Errors are one line on stderr (exit 2 bad input, 3 infeasible); PLANNER_DEBUG=1 shows the traceback "
               "behind one.",
    )
    from planner import __version__

    parser.add_argument("--version", action="version", version=f"planner {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS if only is None else (only,):
        command: Subcommand = importlib.import_module(f"planner.commands.{name}").COMMAND
        own = command.parser
        p = sub.add_parser(command.name, help=command.help, parents=[own], description=own.description,
                           epilog=own.epilog, formatter_class=own.formatter_class)
        p.set_defaults(func=command.run)
    return parser


def command_named(argv: list[str]) -> str | None:
    """The module of the subcommand ``argv`` names first (``import-pipedream`` ->
    ``import_pipedream``), or None when its first argument is an option or no subcommand."""
    modules = {name.replace("_", "-"): name for name in COMMANDS}
    return modules.get(argv[0]) if argv else None


def main(argv: list[str] | None = None) -> int:
    """Run one command line: ``argv``, or this process's own when None (then, for the
    subcommands of :data:`NUMPY_ONE_THREAD`, with one BLAS thread; a call from Python with its
    own ``argv`` leaves the caller's environment as it is)."""
    own_process = argv is None
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(command_named(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if own_process and command_named(argv) in NUMPY_ONE_THREAD:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy's first import (module docstring)
    try:
        return int(args.func(args) or 0)
    except PlannerError as exc:
        if os.environ.get("PLANNER_DEBUG"):
            raise
        print(f"planner {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # e.g. piped into head
        sys.stderr.close()
        return 0
    except OSError as exc:  # a file that cannot be read or written: bad input, one line
        if os.environ.get("PLANNER_DEBUG"):
            raise
        where = f" {exc.filename}" if exc.filename else ""
        print(f"planner {args.command}: error:{where}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("planner: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
