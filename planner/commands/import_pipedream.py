"""``planner import-pipedream``: convert a PipeDream ``graph.txt`` into a profile JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.profile import save_profile
from planner.commands._args import Subcommand, batch_size, check_output


def _parser() -> argparse.ArgumentParser:
    """``planner import-pipedream``'s arguments (:data:`COMMAND`)."""
    parser = argparse.ArgumentParser(
        add_help=False,
        description=(
            "Convert PipeDream's graph.txt (per-minibatch layer times and fp32 sizes) into a "
            "planner profile: per-sample costs, inputs merged into a zero-cost first layer, "
            "leftover __getitem__ sinks dropped."
        ),
    )
    parser.add_argument("graph", metavar="GRAPH.txt", help="PipeDream graph.txt")
    parser.add_argument("--batch-size", type=batch_size, default=None,
                        help="minibatch size of the profile (default: inferred)")
    parser.add_argument("--name", default=None, help="model name (default: the folder holding GRAPH.txt)")
    parser.add_argument("--out", required=True, metavar="PATH", help="profile JSON to write")
    return parser


def run(args: argparse.Namespace) -> int:
    from planner.profiling.imported.pipedream import import_pipedream  # networkx and pandas: only when used

    check_output("--out", args.out)
    profile = import_pipedream(args.graph, batch_size=args.batch_size, name=args.name)
    out = Path(args.out)
    try:
        save_profile(profile, out)
    except OSError as exc:
        raise PlannerInputError(f"--out {out}: cannot write ({exc.strerror or exc})") from None
    meta = profile.metadata
    print(
        f"{profile.model}: {meta['raw_nodes']} nodes, {meta['raw_edges']} edges -> {profile.num_layers} layers "
        f"({meta['dropped_getitem_sinks']} __getitem__ sinks dropped, {meta['merged_inputs']} inputs merged), "
        f"batch size {meta['batch_size']} -> {out}"
    )
    return 0


COMMAND = Subcommand(name="import-pipedream", parser=_parser(), run=run,
                     help="convert a PipeDream graph.txt profile into a profile JSON")
