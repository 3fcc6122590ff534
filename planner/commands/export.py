"""``planner export PLAN [--stages-json OUT] [--schedule-csv OUT] [--torchtitan OUT]``: a plan in the forms other
tools take (:mod:`planner.report.export`). With neither flag, prints the stage module names."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from planner.artifacts.plan import load_plan
from planner.commands._args import Subcommand, check_output


def _parser() -> argparse.ArgumentParser:
    """``planner export``'s arguments (:data:`COMMAND`)."""
    p = argparse.ArgumentParser(
        add_help=False,
        description="Write a plan's per-stage layer names as a JSON list of lists, its per-rank schedule as CSV, "
                    "or a torchtitan job config. With no flag, prints the stage names (a JSON list of lists of layer "
                    "names, one list per stage) on stdout.",
    )
    p.add_argument("plan", help="plan JSON")
    p.add_argument("--stages-json", metavar="OUT", help="JSON list of lists of layer names, one list per stage")
    p.add_argument("--schedule-csv", metavar="OUT", help="compute-only schedule CSV, one row per rank")
    p.add_argument("--torchtitan", metavar="OUT",
                   help="torchtitan job config TOML: parallelism degrees (tp, pp, dp, and cp when the plan has "
                        "context parallelism), schedule, micro-batch, stage split")
    return p


def run(args: argparse.Namespace) -> int:
    from planner.report.export import (  # here, not at the top: see planner.commands.cli
        stage_module_names,
        torchtitan_config,
        write_plan_schedule_csv,
        write_stage_module_names,
    )

    for flag in ("stages_json", "schedule_csv", "torchtitan"):
        check_output(f"--{flag.replace('_', '-')}", getattr(args, flag))
    plan = load_plan(args.plan)
    if args.stages_json:
        write_stage_module_names(plan, args.stages_json)
        print(f"stage module names: {args.stages_json}")
    if args.schedule_csv:
        write_plan_schedule_csv(plan, args.schedule_csv)
        print(f"schedule CSV: {args.schedule_csv}")
    if args.torchtitan:
        Path(args.torchtitan).write_text(torchtitan_config(plan))
        print(f"torchtitan config: {args.torchtitan}")
    if not (args.stages_json or args.schedule_csv or args.torchtitan):
        print(json.dumps(stage_module_names(plan)))
    return 0


COMMAND = Subcommand(name="export", parser=_parser(), run=run,
                     help="export a plan: per-stage module names (torchtitan), schedule CSV (torch.distributed.pipelining)")
