"""``planner show``: the plan table of a saved plan."""

from __future__ import annotations

import argparse

from planner.artifacts.plan import load_plan
from planner.commands._args import Subcommand
from planner.report.table import format_pareto, format_plan


def _parser() -> argparse.ArgumentParser:
    """``planner show``'s arguments (:data:`COMMAND`)."""
    p = argparse.ArgumentParser(
        add_help=False,
        description="Print a saved plan JSON as a table.",
    )
    p.add_argument("plan", help="plan JSON written by 'planner plan --out'")
    p.add_argument("--pareto", action="store_true", help="also print the plan's Pareto front")
    return p


def run(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    print(format_plan(plan))
    if args.pareto and plan.pareto:
        print()
        print(format_pareto(plan.pareto))
    return 0


COMMAND = Subcommand(name="show", help="print a saved plan as a table", parser=_parser(), run=run)
