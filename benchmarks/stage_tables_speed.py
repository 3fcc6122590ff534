"""Stage-table speed (issue 24): process CPU of the default request and of GPT-3 175B on 1,024
A100s, the code of a base checkout beside this repository's, whole processes alternating.

Cases:

- ``default``: ``planner plan`` with no arguments (the embedded GPT-3 13B profile on one
  ``a100-80gb-x8`` node), run as ``python -m planner plan --json``.
- ``gpt3``: ``gpt3_profile("gpt3-175b", "a100-80gb")`` on the ``a100-80gb-x8`` preset grown to
  128 nodes, global batch 1536, the default request otherwise (every axis the default searches;
  the setting of ``benchmarks/solver_speed.py``), through ``planner.plan``.

Each run is a fresh interpreter; its figure is the child's whole process CPU time (user + sys
of the child, from ``os.wait4``: imports included), the machine being shared. Runs alternate
base, new, new, base, ... so both see the same load; the table shows the medians of
``--repeats`` runs each and whether the two plans are identical (JSON compared byte for byte).

Run: ``python benchmarks/stage_tables_speed.py --base /path/to/base/checkout [--repeats 3]
[--cases default,gpt3]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

GPT3_CHILD = """
import dataclasses, json, sys
from planner.artifacts.cluster import PRESETS
from planner.artifacts.plan import plan_to_json
from planner.artifacts.request import PlanRequest
from planner.profiling.analytic.gpt import gpt3_profile
from planner.solve import plan
profile = gpt3_profile("gpt3-175b", "a100-80gb")
base = PRESETS["a100-80gb-x8"]
cluster = dataclasses.replace(base, num_nodes=128)
sys.stdout.write(json.dumps(plan_to_json(plan(profile, cluster, PlanRequest(global_batch=1536))), sort_keys=True))
"""


def _command(case: str) -> list[str]:
    if case == "default":
        return [sys.executable, "-m", "planner", "plan", "--json"]
    if case == "gpt3":
        return [sys.executable, "-c", GPT3_CHILD]
    raise SystemExit(f"stage_tables_speed: unknown case {case!r} (default, gpt3)")


def run_once(case: str, tree: Path) -> tuple[float, str]:
    """(child CPU seconds, its stdout) for ``case`` with the planner of ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(_command(case), cwd=tree, env=env, stdout=out, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read().decode() if proc.stderr else ""
        out.seek(0)
        text = out.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"stage_tables_speed: {case} in {tree} failed: {err.strip().splitlines()[-1:]}")
    return usage.ru_utime + usage.ru_stime, text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="a checkout of the code to compare against")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cases", default="default,gpt3")
    args = ap.parse_args()
    trees = {"base": args.base.resolve(), "new": REPO}
    print(f"stage_tables_speed: base {trees['base']} vs new {REPO}; {args.repeats} runs each, alternating; "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'case':<10}{'base CPU s':>12}{'new CPU s':>12}{'base/new':>10}  plans")
    for case in args.cases.split(","):
        cpu: dict[str, list[float]] = {"base": [], "new": []}
        plans: dict[str, set[str]] = {"base": set(), "new": set()}
        for r in range(args.repeats):
            order = ("base", "new") if r % 2 == 0 else ("new", "base")
            for name in order:
                seconds, text = run_once(case, trees[name])
                cpu[name].append(seconds)
                plans[name].add(text)
        old, new = statistics.median(cpu["base"]), statistics.median(cpu["new"])
        same = "identical" if plans["base"] == plans["new"] and len(plans["new"]) == 1 else "DIFFER"
        print(f"{case:<10}{old:>12.2f}{new:>12.2f}{old / new:>10.2f}  {same}", flush=True)


if __name__ == "__main__":
    main()
