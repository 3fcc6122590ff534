"""Solver CPU with zero-bubble schedules in the default request (issue 50 item 2): another
checkout's planner (``--base``, e.g. main before the change) and this one, alternating in one run
(base, here, base, here, ...; ``--repeats`` runs each), each run a fresh subprocess timing
``planner.solve.plan`` with ``time.process_time`` (the child's CPU, imports and profile building
excluded), the plan each finds beside its CPU.

Cases (each with the checkout's own default request, so the schedules it searches by default):

- ``default``: ``planner plan`` with no arguments (GPT-3 13B analytic on one 8x A100-80GB node,
  global batch 512);
- ``gpt3-175b-64``: the shipped GPT-3 175B A100 profile on ``a100-80gb-x8`` grown to 64
  devices, global batch 512, ``--stages 8`` (the issue's done-when case);
- ``gpt3-175b-1024``: ``gpt3_profile("gpt3-175b", "a100-80gb")`` on ``a100-80gb-x8`` grown to 128
  nodes (1,024 GPUs), global batch 1536 (as ``benchmarks/search_scale.py``).

``--classic`` also runs the base with the zero-bubble schedules taken out of its request (the
default before they joined it; the issue's target is here within 1.3x of that), alternating
with the other two.

Run: ``python benchmarks/zero_bubble_speed.py --base ../main [--cases default,gpt3-175b-64,gpt3-175b-1024]
[--repeats 3] [--classic]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = ("default", "gpt3-175b-64", "gpt3-175b-1024")

CHILD = r"""
import dataclasses, json, sys, time
sys.path.insert(0, sys.argv[1])
from planner.artifacts.cluster import PRESETS
from planner.artifacts.request import PlanRequest
from planner.solve import plan
case = sys.argv[2]
if case == "default":
    from planner.profiling.defaults import DEFAULT_GLOBAL_BATCH, default_profile
    profile, cluster, request = default_profile(), PRESETS["a100-80gb-x8"], PlanRequest(global_batch=DEFAULT_GLOBAL_BATCH)
elif case == "gpt3-175b-64":
    from planner.artifacts.profile import load_profile
    profile = load_profile(sys.argv[1] + "/profiles/gpt3-175b-a100.json")
    cluster = dataclasses.replace(PRESETS["a100-80gb-x8"], num_nodes=8)
    request = PlanRequest(global_batch=512, num_stages=8)
else:
    from planner.profiling.analytic.gpt import gpt3_profile
    profile = gpt3_profile("gpt3-175b", "a100-80gb")
    cluster = dataclasses.replace(PRESETS["a100-80gb-x8"], num_nodes=128)
    request = PlanRequest(global_batch=1536)
if sys.argv[3] == "classic":  # the default request's schedules less the zero-bubble ones (the default before them)
    request = dataclasses.replace(request, schedules=tuple(s for s in request.schedules if not s.splits_backward))
c0 = time.process_time()
p = plan(profile, cluster, request)
cpu = time.process_time() - c0
lay = p.layout
print(json.dumps({"cpu_s": cpu, "ms": p.predicted.iteration_ms, "plan": f"T{lay.tp_degree}xP{lay.pipeline_size}"
                  f"xD{lay.dp_degree} v{lay.virtual_stages_per_rank} b{p.microbatch_size} {p.schedule.value}",
                  "schedules": [s.value for s in request.schedules]}))
"""


def run_once(repo: Path, case: str, timeout_s: float, classic: bool = False) -> dict[str, object]:
    python = repo / ".venv" / "bin" / "python"
    exe = str(python) if python.exists() else sys.executable
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(repo))
    try:
        argv = [exe, "-c", CHILD, str(repo), case, "classic" if classic else "default"]
        out = subprocess.run(argv, capture_output=True, text=True, env=env,
                             timeout=timeout_s, cwd=repo, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout_s:.0f} s"}
    if out.returncode:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, required=True, help="the checkout to compare with (its .venv if it has one)")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--classic", action="store_true",
                    help="also run the base with the zero-bubble schedules taken out of its request (the default "
                         "before they joined it), the issue's 1.3x target's reference")
    args = ap.parse_args()
    base = args.base.resolve()
    print(f"zero_bubble_speed: {time.strftime('%Y-%m-%d %H:%M')}; load average {os.getloadavg()[0]:.1f}; "
          f"base {base}, here {REPO}; {args.repeats} runs each, alternating; child process CPU s")
    for case in args.cases.split(","):
        labels = ("base", "here") + (("classic",) if args.classic else ())
        runs: dict[str, list[dict[str, object]]] = {label: [] for label in labels}
        for i in range(args.repeats):
            order = labels if i % 2 == 0 else labels[::-1]
            for label in order:
                runs[label].append(run_once(REPO if label == "here" else base, case, args.timeout_s, label == "classic"))
        print(f"{case}:")
        med = {}
        for label in labels:
            ok = [r for r in runs[label] if "cpu_s" in r]
            if not ok:
                print(f"  {label:7s} {runs[label][0].get('error')}")
                continue
            med[label] = statistics.median(float(r["cpu_s"]) for r in ok)  # type: ignore[arg-type]
            cpus = " ".join(f"{float(r['cpu_s']):6.2f}" for r in ok)  # type: ignore[arg-type]
            print(f"  {label:7s} cpu s {cpus} (median {med[label]:6.2f})  {ok[0]['plan']}  "
                  f"{float(ok[0]['ms']):.1f} ms  schedules {','.join(ok[0]['schedules'])}")  # type: ignore[arg-type]
        if "here" in med and "base" in med:
            print(f"  here / base CPU: {med['here'] / med['base']:.2f}x")
        if "here" in med and "classic" in med:
            print(f"  here / classic CPU (the 1.3x target): {med['here'] / med['classic']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
