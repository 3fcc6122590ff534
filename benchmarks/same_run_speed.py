"""Solver time of this checkout against another checkout of the planner, measured side by side
in one run: for each case, whole child processes alternate (base, ours, ours, base, ...), each
timing one ``planner.plan`` call by its process CPU time (user + sys, ``time.process_time``;
steadier than wall time on this shared machine) after the planner is imported; the figure per
code version is the median over ``--pairs`` processes, and the ratio ours / base is the result.

Cases (the two the Layout refactor, issue 17, promised not to slow down):

- ``default``: the default request (GPT-3 13B analytic, one 8x A100-80GB node, global batch 512);
- ``gpt3-175b-1024``: GPT-3 175B analytic on 1,024 A100s (128 nodes of the a100-80gb-x8
  preset), global batch 1536 (Brown et al. 2020), tensor parallelism searched.

Each child uses its own checkout's ``profiles/`` (both read the other's profile versions) and
prints the plan's iteration time, so the two plans can be compared too.

Run: ``python benchmarks/same_run_speed.py --base /path/to/other/checkout [--pairs 3]
[--cases default,gpt3-175b-1024]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import dataclasses, json, sys, time
from planner.artifacts.cluster import PRESETS
from planner.artifacts.profile import load_profile
from planner.artifacts.request import PlanRequest
from planner.solve import plan
case = sys.argv[1]
if case == "default":
    prof, cluster, req = load_profile("profiles/gpt3-13b-a100.json"), PRESETS["a100-80gb-x8"], PlanRequest()
else:
    prof = load_profile("profiles/gpt3-175b-a100.json")
    cluster, req = dataclasses.replace(PRESETS["a100-80gb-x8"], num_nodes=128), PlanRequest(global_batch=1536)
t0 = time.process_time()
found = plan(prof, cluster, req)
print(json.dumps({"cpu_s": time.process_time() - t0, "iteration_ms": found.predicted.iteration_ms}))
"""
CASES = ("default", "gpt3-175b-1024")


def run_child(checkout: Path, case: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(checkout), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", CHILD, case], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    if proc.returncode:
        raise SystemExit(f"{checkout} {case}: {proc.stderr.strip().splitlines()[-1]}")
    out: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, required=True, help="the other checkout (its repository root)")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    print(f"{'case':16s} {'base CPU s':>10s} {'ours CPU s':>10s} {'ours/base':>9s}  plans (iteration ms)")
    for case in args.cases.split(","):
        base: list[dict[str, float]] = []
        ours: list[dict[str, float]] = []
        for i in range(args.pairs):
            order = ((args.base, base), (REPO, ours)) if i % 2 == 0 else ((REPO, ours), (args.base, base))
            for checkout, sink in order:
                sink.append(run_child(checkout, case))
        b = statistics.median(r["cpu_s"] for r in base)
        o = statistics.median(r["cpu_s"] for r in ours)
        same = "same" if base[0]["iteration_ms"] == ours[0]["iteration_ms"] else "DIFFER"
        print(f"{case:16s} {b:10.2f} {o:10.2f} {o / b:9.3f}  {same} ({ours[0]['iteration_ms']:.2f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
