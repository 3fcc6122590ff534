"""``planner compare PLAN... [--baselines] [--report [N=]RUNREPORT...] [--csv OUT] [--markdown]
[--figures DIR]``: plans side by side (:func:`planner.report.compare.compare`).

Prints one row per plan with the headline columns (the CSV has all of them). A run report is
matched to the plan it ran by signature; ``N=PATH`` pairs it with the N-th plan (0-based)
explicitly. ``--figures DIR`` writes ``timelines.png``, ``memory.png`` and ``pareto.png``
(the first plan's Pareto front, the other plans marked).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING

from planner.artifacts.errors import PlannerInputError
from planner.commands._args import Subcommand, check_output
from planner.report.table import format_table

if TYPE_CHECKING:  # pandas and the comparison load when the command runs, not with the CLI
    import pandas as pd

    from planner.report.compare import PlanEntry

# (column, header, format) of the printed table; memory columns get a unit at print time
_SHOWN = (
    ("solver", "solver", "s"),
    ("T", "T", "d"),
    ("P", "P", "d"),
    ("D", "D", "d"),
    ("replicas", "replicas", "s"),
    ("M", "M", "d"),
    ("microbatch_size", "mb", "d"),
    ("schedule", "schedule", "s"),
    ("zero", "zero", "d"),
    ("recomputed_layers", "rc", "d"),
    ("iteration_ms", "iter ms", "ms"),
    ("throughput_samples_per_s", "samples/s", ".4g"),
    ("speedup", "speedup", ".3f"),
    ("peak_memory_gib", "peak {unit}", "mem"),
    ("activations_gib", "activ {unit}", "mem"),
    ("bubble_fraction", "bubble", ".1%"),
    ("exposed_allreduce_ms", "exp AR ms", ".3g"),
    ("limit_over_time", "limit/time", ".3f"),
    ("partition_bound_over_time", "part/time", ".3f"),
    ("mfu", "MFU", ".1%"),
    ("me_index", "ME", ".3f"),
)
_SHOWN_MEASURED = (
    ("measured_iteration_ms", "meas ms", "ms"),
    ("iteration_rel_error", "err", "+.1%"),
    ("measured_activations_gib", "meas activ {unit}", "mem"),
    ("activation_rel_error", "activ err", "+.1%"),
)


def _parser() -> argparse.ArgumentParser:
    """``planner compare``'s arguments (:data:`COMMAND`)."""
    p = argparse.ArgumentParser(
        add_help=False,
        description="One row per plan: configuration, predicted time, memory by kind, bubble, bound, ME index; "
        "with --report, measured figures beside the predictions.",
    )
    p.add_argument("plans", nargs="+", metavar="PLAN", help="plan JSON files")
    p.add_argument("--baselines", action="store_true", help="add every built-in baseline for the first plan's request")
    p.add_argument("--profile", help="the plans' profile (default: found by sha256 next to the plan or in profiles/)")
    p.add_argument("--cluster", help="the plans' cluster (default: the preset named in the plan)")
    p.add_argument("--reference", help="label or solver of the ME index's reference row (default: the first plan)")
    p.add_argument("--report", nargs="+", default=[], metavar="[N=]RUNREPORT",
                   help="run reports; matched to plans by signature, or N=PATH for the N-th plan")
    p.add_argument("--csv", metavar="OUT", help="write every column as CSV")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.add_argument("--figures", metavar="DIR",
                   help="write timelines.png, memory.png and pareto.png here (the folder is made if it does not exist)")
    return p


def _reports(items: list[str]) -> list[str] | dict[str | int, list[str]] | None:
    if not items:
        return None
    explicit = [i for i in items if "=" in i]
    if not explicit:
        return items
    if len(explicit) != len(items):
        raise PlannerInputError("--report: give every report as N=PATH, or none")
    paired: dict[str | int, list[str]] = {}
    for item in items:
        index, _, path = item.partition("=")
        if not index.isdigit():
            raise PlannerInputError(f"--report {item!r}: expected N=PATH with N a plan index")
        paired.setdefault(int(index), []).append(path)
    return paired


def _mem_unit(frame: pd.DataFrame) -> tuple[float, str]:
    peak = frame["peak_memory_gib"].max()
    if not peak or math.isnan(peak) or peak >= 1:
        return 1.0, "GiB"
    return (1 / 1024, "MiB") if peak >= 1 / 1024 else (1 / 1024**2, "KiB")


def _cell(value: object, fmt: str, scale: float) -> str:
    import pandas as pd

    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return "-"
    if fmt == "s":
        return str(value) or "-"
    if fmt == "d":
        return str(int(value))  # type: ignore[call-overload]
    if fmt == "ms":
        v = float(value)  # type: ignore[arg-type]
        return f"{v:.1f}" if v >= 100 else f"{v:.4g}"
    if fmt == "mem":
        return f"{float(value) / scale:.4g}"  # type: ignore[arg-type]
    return format(float(value), fmt)  # type: ignore[arg-type]


def format_comparison(frame: pd.DataFrame, *, markdown: bool = False) -> str:
    """The headline columns as a text (or Markdown) table, then the notes."""
    scale, unit = _mem_unit(frame)
    shown = list(_SHOWN) + ([c for c in _SHOWN_MEASURED] if "measured_iteration_ms" in frame else [])
    if "selective_layers" in frame and frame["selective_layers"].fillna(0).astype(int).any():
        at = [c for c, _, _ in shown].index("recomputed_layers") + 1
        shown.insert(at, ("selective_layers", "sel", "d"))  # shown where some plan recomputes selectively
    headers = ["plan"] + [h.format(unit=unit) for _, h, _ in shown]
    rows = [[str(label)] + [_cell(row[c], f, scale) for c, _, f in shown] for label, row in frame.iterrows()]
    if markdown:
        align = ["---" if f == "s" else "---:" for _, _, f in shown]
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] + align) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        text = "\n".join(lines)
    else:
        left = {i + 1 for i, (_, _, f) in enumerate(shown) if f == "s"}
        text = format_table(headers, rows, right=set(range(1, len(headers))) - left)
    ref = frame["me_reference"].iloc[0]
    text += (
        f"\n\nspeedup and ME index against {ref!r}; limit/time = machine bound (any plan on these devices) / "
        "predicted iteration; part/time = the plan's own partition bound / predicted iteration"
    )
    notes = [f"{label}: {note}" for label, note in frame["note"].items() if note]
    return text + ("\n" + "\n".join(notes) if notes else "")


def run(args: argparse.Namespace) -> int:
    check_output("--csv", args.csv)
    check_output("--figures", args.figures, directory=True)  # made (with its parents) when the figures are drawn
    from planner.artifacts.progress import Progress

    with Progress("compare") as progress:  # planning baselines and drawing figures: seconds (issue 51)
        progress.detail = "loading the plans" + (" and planning the baselines" if args.baselines else "")
        from planner.report.compare import compare_entries, gather_plans

        entries = gather_plans(args.plans, baselines=args.baselines, profile=args.profile, cluster=args.cluster)
        progress.detail = "building the table"
        frame = compare_entries(entries, reference=args.reference, reports=_reports(args.report))
        print(format_comparison(frame, markdown=args.markdown), flush=True)
        if args.csv:
            frame.to_csv(args.csv, index=False)
            print(f"\nCSV: {args.csv}")
        if args.figures:
            progress.detail = "drawing the figures"
            Path(args.figures).mkdir(parents=True, exist_ok=True)
            for path in write_figures(entries, Path(args.figures)):
                print(f"figure: {path}", flush=True)
    return 0


def write_figures(entries: list[PlanEntry], out: Path) -> list[Path]:
    """timelines.png, memory.png and pareto.png of the rows that have a plan."""
    from planner.report.figures_compare import plot_pareto, plot_stage_memory, plot_timelines

    rows = [(e.label, e.plan) for e in entries if e.plan is not None]
    labels = [label for label, _ in rows]
    plans = [plan for _, plan in rows]
    paths = [out / "timelines.png", out / "memory.png", out / "pareto.png"]
    plot_timelines(plans, labels, paths[0])
    plot_stage_memory(plans, labels, paths[1])
    plot_pareto(plans[0], paths[2], others=dict(zip(labels[1:], plans[1:])))
    return paths


COMMAND = Subcommand(name="compare", parser=_parser(), run=run,
                     help="compare plans (and baselines, and measured runs) side by side")
