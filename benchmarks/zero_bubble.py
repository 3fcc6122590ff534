"""Zero bubble (issue 21): the best plan of the GPT-3 cases of ``benchmarks/plan_quality.py``
whose best plan pipelines, before (the default schedules: GPipe, 1F1B, interleaved 1F1B) and
after each zero-bubble schedule joins the search (``PlanRequest.schedules`` + ``zb-h1``, +
``zbv``, + ``zb-h2``, and all three), priced by the simulator.

Per case: the plans (``plan_quality.plan_text``; a ZBV plan prints its ``2P`` chunks as P),
their simulated iteration times, bubble fractions (the simulator's: idle / (ranks x compute
end)), the bubble in ms of rank time (``bubble_fraction x compute_end``) and how much of the
default plan's each removed, and each search's CPU time. A case whose best default plan has one
stage is skipped (nothing to remove). ``--only``: also the best plan of each zero-bubble
schedule searched alone (what it would give where the combined search picks another).

The shipped GPT-3 profiles predate the split fields: they carry the stated default (W = half
of each parameterised layer's backward, W keeps all its saved bytes); ``--fresh`` instead builds
the analytic profiles in memory with their per-GEMM split (``planner.profiling.analytic``).

PipeDream's imported profiles (``--cases vgg16:16,...``, batch as in plan_quality) carry the
default split too.

Run: ``python benchmarks/zero_bubble.py [--cases gpt3-175b-a100:64:512,gnmt:32,...] [--fresh] [--only]``
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from plan_quality import batches_of, plan_text, setting

from planner.artifacts.errors import PlannerError
from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.request import PlanRequest
from planner.simulation import simulate
from planner.solve import plan

CASES = ("gpt3-1.3b-a100:8:512", "gpt3-13b-a100:8:512", "gpt3-13b-a100:64:512", "gpt3-175b-a100:64:512",
         "gpt3-175b-h100:64:512")


def bubble_ms(p) -> float:
    t = simulate(p)
    return t.bubble_fraction * t.compute_end_ms


#: the searches after: the default schedules plus these
ADDED = (("+zb-h1", (ScheduleKind.ZB_H1,)), ("+zbv", (ScheduleKind.ZBV,)), ("+zb-h2", (ScheduleKind.ZB_H2,)),
         ("+all three", (ScheduleKind.ZB_H1, ScheduleKind.ZBV, ScheduleKind.ZB_H2)))


def row(label: str, p, base_bubble: float, base_ms: float, cpu_s: float) -> str:
    b = bubble_ms(p)
    removed = f"{(base_bubble - b) / base_bubble:+.1%}" if base_bubble > 0 else "n/a"
    return (f"  {label:12s} {plan_text(p):34s} {p.predicted.iteration_ms:10.1f} {p.predicted.bubble_fraction:7.1%} "
            f"{base_ms / p.predicted.iteration_ms:7.4f} {removed:>8s} {p.predicted.peak_memory_bytes / 2**30:7.1f} "
            f"{cpu_s:6.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES),
                    help="profile:devices[:global batch], comma-separated (batch: plan_quality's for the profile)")
    ap.add_argument("--reference", type=Path, default=REPO.parent / "shared" / "reference" / "pipedream", help="PipeDream's profiles")
    ap.add_argument("--fresh", action="store_true", help="analytic profiles built now, with their per-GEMM split")
    ap.add_argument("--only", action="store_true", help="also each zero-bubble schedule searched alone")
    args = ap.parse_args()
    print(f"zero_bubble: {time.strftime('%Y-%m-%d %H:%M')}; load average {os.getloadavg()[0]:.1f}; "
          f"profiles {'built now (per-GEMM split)' if args.fresh else 'shipped (default split)'}")
    head = (f"  {'search':12s} {'best plan':34s} {'ms':>10s} {'bubble':>7s} {'speedup':>7s} {'removed':>8s} "
            f"{'GiB':>7s} {'cpu s':>6s}")
    print(head)
    print("-" * len(head))
    for case in args.cases.split(","):
        name, n, *rest = case.split(":")
        g = rest[0] if rest else str(batches_of(name, int(n), args.reference, "strong", (512,))[0])
        case = f"{name}:{n}:{g}"
        profile, cluster = setting(name, int(n), args.reference)
        if args.fresh:
            from planner.profiling.analytic.gpt import gpt3_profile

            size, dev = name.rsplit("-", 1)
            profile = gpt3_profile(size, f"{dev}-80gb")
        req = PlanRequest(global_batch=int(g))
        t0 = time.process_time()
        before = plan(profile, cluster, req)
        cpu = time.process_time() - t0
        if before.layout.pipeline_size == 1:
            print(f"{case}: {plan_text(before)}: one stage, skipped")
            continue
        print(f"{case}:")
        b0, ms0 = bubble_ms(before), before.predicted.iteration_ms
        print(row("default", before, b0, ms0, cpu))
        searches = list(ADDED)
        if args.only:
            searches += [(f"{k.value} alone", (k,)) for k in (ScheduleKind.ZB_H1, ScheduleKind.ZBV, ScheduleKind.ZB_H2)]
        for label, added in searches:
            schedules = req.schedules + added if label.startswith("+") else added
            t0 = time.process_time()
            try:
                after = plan(profile, cluster, dataclasses.replace(req, schedules=schedules))
            except PlannerError as exc:  # a search that finds nothing is a row of its own
                print(f"  {label:12s} {type(exc).__name__}: {str(exc).splitlines()[0][:90]}")
                continue
            print(row(label, after, b0, ms0, time.process_time() - t0), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
