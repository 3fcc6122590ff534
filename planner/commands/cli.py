"""The ``planner`` command line. Each subcommand lives in ``planner/commands/<name>.py``
and exposes ``register(subparsers)``, which adds its parser and sets ``func``.

Exit codes: 0 success, 2 invalid input, 3 infeasible request, 1 anything else the planner
reports deliberately. Errors are one line on stderr, never a traceback (set
``PLANNER_DEBUG=1`` to see one).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from planner.artifacts.errors import PlannerError

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


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with a one-line message (argparse's default also prints the usage)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="planner",
        description="Pipeline + data + tensor parallel planner (with ZeRO, per-stage replication and recomputation): "
        "profile a model, plan it for a cluster, compare plans, and run a plan under torchrun.",
    )
    from planner import __version__

    parser.add_argument("--version", action="version", version=f"planner {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        importlib.import_module(f"planner.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
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
