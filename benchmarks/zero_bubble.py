"""Zero bubble (issue 21): the best plan of the GPT-3 cases of ``benchmarks/plan_quality.py``
whose best plan pipelines, before (the default schedules: GPipe, 1F1B, interleaved 1F1B) and
after ZB-H1 joins the search (``PlanRequest.schedules`` + ``zb-h1``), priced by the simulator.

Per case: the two plans (``plan_quality.plan_text``), their simulated iteration times, bubble
fractions (the simulator's: idle / (ranks x compute end)), the bubble in ms of rank time
(``bubble_fraction x compute_end``) and how much of it ZB-H1 removed, and each search's CPU time.
A case whose best default plan has one stage is skipped (nothing to remove).

The shipped GPT-3 profiles predate the split fields: they carry the stated default (W = half
of each parameterised layer's backward, W keeps all its saved bytes); ``--fresh`` instead builds
the analytic profiles in memory with their per-GEMM split (``planner.profiling.analytic``).

PipeDream's imported profiles (``--cases vgg16:16,...``, batch as in plan_quality) carry the
default split too.

Run: ``python benchmarks/zero_bubble.py [--cases gpt3-175b-a100:64:512,vgg16:16,...] [--fresh]``
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

from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.request import PlanRequest
from planner.simulation import simulate
from planner.solve import plan

CASES = ("gpt3-1.3b-a100:8:512", "gpt3-13b-a100:8:512", "gpt3-13b-a100:64:512", "gpt3-175b-a100:64:512",
         "gpt3-175b-h100:64:512")


def bubble_ms(p) -> float:
    t = simulate(p)
    return t.bubble_fraction * t.compute_end_ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES),
                    help="profile:devices[:global batch], comma-separated (batch: plan_quality's for the profile)")
    ap.add_argument("--reference", type=Path, default=REPO.parent / "shared" / "reference" / "pipedream")
    ap.add_argument("--fresh", action="store_true", help="analytic profiles built now, with their per-GEMM split")
    args = ap.parse_args()
    print(f"zero_bubble: {time.strftime('%Y-%m-%d %H:%M')}; load average {os.getloadavg()[0]:.1f}; "
          f"profiles {'built now (per-GEMM split)' if args.fresh else 'shipped (default split)'}")
    head = (f"{'case':24s} {'before':28s} {'ms':>8s} {'bubble':>7s} {'after':28s} {'ms':>8s} {'bubble':>7s} "
            f"{'speedup':>7s} {'bubble removed':>14s} {'cpu s':>11s}")
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
        t1 = time.process_time()
        if before.layout.pipeline_size == 1:
            print(f"{case:24s} {plan_text(before):28s} one stage: skipped")
            continue
        after = plan(profile, cluster, dataclasses.replace(req, schedules=req.schedules + (ScheduleKind.ZB_H1,)))
        t2 = time.process_time()
        b0, b1 = bubble_ms(before), bubble_ms(after)
        removed = f"{(b0 - b1) / b0:+.1%}" if b0 > 0 else "n/a"
        print(f"{case:24s} {plan_text(before):28s} {before.predicted.iteration_ms:8.1f} "
              f"{before.predicted.bubble_fraction:7.1%} {plan_text(after):28s} {after.predicted.iteration_ms:8.1f} "
              f"{after.predicted.bubble_fraction:7.1%} {before.predicted.iteration_ms / after.predicted.iteration_ms:7.3f} "
              f"{removed:>14s} {t1 - t0:5.1f}/{t2 - t1:5.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
