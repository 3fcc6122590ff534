"""``planner calibrate RUNREPORT... --plan PLAN... --profile P --out P2 [--cluster C]
[--cluster-out C2] [--granularity stage|global] [--residual auto|links|overhead|none]``: refit the profile's layer
times and the cluster's links to measured runs (:mod:`planner.report.calibrate`).

A RunReport does not carry the partition it ran, so the plans are given too; each report is
matched to its plan by signature. The cluster defaults to the preset the first plan names.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from planner.artifacts.cluster import save_cluster
from planner.artifacts.kinds import CALIBRATION_GRANULARITIES, CALIBRATION_RESIDUALS
from planner.artifacts.plan import load_plan
from planner.artifacts.profile import load_profile, save_profile
from planner.commands._args import Subcommand, check_output

if TYPE_CHECKING:
    from planner.report.calibrate import CalibrationResult


def _parser() -> argparse.ArgumentParser:
    """``planner calibrate``'s arguments (:data:`COMMAND`)."""
    p = argparse.ArgumentParser(
        add_help=False,
        description="Scale the profile's layer times (least squares of measured vs predicted stage compute) and the "
        "cluster's communication so that the measured plans, re-predicted, match their runs.",
    )
    p.add_argument("reports", nargs="+", metavar="RUNREPORT", help="RunReport JSON files")
    p.add_argument("--plan", nargs="+", required=True, metavar="PLAN", help="the plans the reports ran")
    p.add_argument("--profile", required=True, help="the profile the plans were made from")
    p.add_argument("--out", required=True, help="calibrated profile JSON to write")
    p.add_argument("--cluster", help="the plans' cluster (default: the preset the first plan names)")
    p.add_argument("--cluster-out", help="calibrated cluster JSON to write")
    p.add_argument("--granularity", default="stage", choices=CALIBRATION_GRANULARITIES,
                   help="one time scale per stage or one overall (default: %(default)s)")
    p.add_argument("--residual", default="auto", choices=CALIBRATION_RESIDUALS,
                   help="what explains the time left after the compute scale: slower links, a per-layer overhead, "
                   "the better fit of the two (auto), or nothing (default: %(default)s)")
    return p


def run(args: argparse.Namespace) -> int:
    from planner.report.calibrate import calibrate  # here, not at the top: see planner.commands.cli
    from planner.report.resolve import find_cluster, load_reports

    for flag in ("out", "cluster_out"):
        check_output(f"--{flag.replace('_', '-')}", getattr(args, flag))
    plans = [load_plan(p) for p in args.plan]
    profile = load_profile(args.profile)
    cluster = find_cluster(plans[0], args.cluster)
    result = calibrate(load_reports(args.reports), plans, profile, cluster,
                       granularity=args.granularity, residual=args.residual, report_names=args.reports)
    print(format_calibration(result, args.reports))
    save_profile(result.profile, args.out)
    print(f"\ncalibrated profile: {args.out}")
    if args.cluster_out:
        save_cluster(result.cluster, args.cluster_out)
        print(f"calibrated cluster: {args.cluster_out}")
    return 0


def format_calibration(result: CalibrationResult, names: list[str]) -> str:
    c = result.calibration
    scales = c.layer_time_scales
    lines = [
        f"compute time scale {c.time_scale:.4f} overall; per layer ({c.granularity}) "
        f"{min(scales):.4f} .. {max(scales):.4f}",
        {"links": f"rest of the iteration: communication x {c.link_scale:.4g} (latency x c, bandwidth / c)",
         "overhead": f"rest of the iteration: {c.overhead_ms_per_layer:.4g} ms per layer and micro-batch, forward and backward",
         "none": "rest of the iteration: not fitted"}[c.residual],
        "",
        "run                     measured ms  predicted before  error  predicted after  error",
    ]
    rows = zip(names, c.iteration_ms_measured, c.iteration_rel_error_before, c.iteration_rel_error_after, result.plans)
    for name, measured, before, after, plan in rows:
        lines.append(
            f"{Path(name).name:<22}  {measured:11.2f}  {measured / (1 + before):16.2f}  {before:+6.1%}  "
            f"{plan.predicted.iteration_ms:15.2f}  {after:+6.1%}"
        )
    return "\n".join(lines)


COMMAND = Subcommand(name="calibrate", parser=_parser(), run=run,
                     help="refit a profile's layer times (and a cluster's links) to measured runs")
