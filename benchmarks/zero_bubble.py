"""Zero bubble (issues 21, 50): the best plan of the GPT-3 cases of ``benchmarks/plan_quality.py``
whose best plan pipelines, with the schedules of the default request before zero bubble joined
it (GPipe, 1F1B, interleaved 1F1B: ``before``), after each zero-bubble schedule joins those
(``+zb-h1``, ``+zbv``, ``+zb-h2``), and the default request now (all six: ``default``), priced
by the simulator. Each case ends with the line ``default / before``: the default plan's speed-up
over the best GPipe / 1F1B / interleaved plan, both found in this run. ``--stages P`` fixes
the pipeline depth (the issue's case: ``--cases gpt3-175b-a100:64:512 --stages 8``).

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

Run: ``python benchmarks/zero_bubble.py [--cases gpt3-175b-a100:64:512,gnmt:32,...] [--stages 8] [--fresh] [--only]``
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


#: the default request's schedules before zero bubble joined it
BEFORE = (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED_1F1B)
#: the searches after: those plus these (``default``: the request's own, all of them)
ADDED = (("+zb-h1", (ScheduleKind.ZB_H1,)), ("+zbv", (ScheduleKind.ZBV,)), ("+zb-h2", (ScheduleKind.ZB_H2,)),
         ("+dualpipe-v", (ScheduleKind.DUALPIPE_V,)), ("+dualpipe", (ScheduleKind.DUALPIPE,)), ("default", ()))


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
    ap.add_argument("--stages", type=int, default=0, help="pipeline stages (PlanRequest.num_stages; 0: searched)")
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
        req = PlanRequest(global_batch=int(g), num_stages=args.stages)
        t0 = time.process_time()
        before = plan(profile, cluster, dataclasses.replace(req, schedules=BEFORE))
        cpu = time.process_time() - t0
        if before.layout.pipeline_size == 1:
            print(f"{case}: {plan_text(before)}: one stage, skipped")
            continue
        print(f"{case}:")
        b0, ms0 = bubble_ms(before), before.predicted.iteration_ms
        print(row("before", before, b0, ms0, cpu))
        searches = list(ADDED)
        if args.only:
            searches += [(f"{k.value} alone", (k,)) for k in (ScheduleKind.ZB_H1, ScheduleKind.ZBV, ScheduleKind.ZB_H2,
                                                              ScheduleKind.DUALPIPE_V, ScheduleKind.DUALPIPE)]
        for label, added in searches:
            schedules = BEFORE + added if label.startswith("+") else added or req.schedules
            t0 = time.process_time()
            try:
                after = plan(profile, cluster, dataclasses.replace(req, schedules=schedules))
            except PlannerError as exc:  # a search that finds nothing is a row of its own
                print(f"  {label:12s} {type(exc).__name__}: {str(exc).splitlines()[0][:90]}")
                continue
            print(row(label, after, b0, ms0, time.process_time() - t0), flush=True)
            if label == "default":
                print(f"  default / before: {after.schedule.value} {after.predicted.iteration_ms:.1f} ms against "
                      f"{before.schedule.value} {ms0:.1f} ms: {ms0 / after.predicted.iteration_ms:.4f}x faster")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
