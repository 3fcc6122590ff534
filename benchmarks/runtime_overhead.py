"""Our runtime against plain ``torch.distributed.pipelining``, same split, same schedule.

Two modes. ``--compute emulate`` (default): both sides stretch each stage chunk to the toy
GPT's synthetic profile times (``planner.runtime.emulate``), so host work inside a chunk is
hidden as it would be behind a GPU, and the difference is what the runtime adds outside:
per-step reductions, barrier, data-parallel and tied-gradient work. ``--compute real``: the
toy model's real CPU compute, no sleeps, so every microsecond of host work the runtime adds
(saved-bytes hooks, compute timers, checks) shows; noisier (real compute on 2 shared cores
varies run to run). Launches alternate (plain, ours) over ``--rounds`` to share the
machine's load drift; the figure is the ratio of median step times. Target (issue 6): <= 5%.

Usage: python benchmarks/runtime_overhead.py [--compute emulate|real] [--rounds 2] [--steps 6] [--warmup 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from emulated_setup import MODEL_SPEC, emulated_plan, emulated_profile

from planner.artifacts.plan import save_plan
from planner.artifacts.profile import save_profile
from planner.artifacts.report import load_report
from planner.artifacts.request import ScheduleKind

CONFIGS = ((2, 8, ScheduleKind.GPIPE), (2, 8, ScheduleKind.ONE_F_ONE_B), (4, 8, ScheduleKind.GPIPE), (4, 8, ScheduleKind.ONE_F_ONE_B))


def _torchrun(nproc: int, args: list[str]) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compute", choices=["emulate", "real"], default="emulate")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        profile = emulated_profile()
        save_profile(profile, work / "profile.json")
        print(f"{'config':<16} {'plain ms':>9} {'ours ms':>9} {'overhead':>9}")
        for num_stages, num_mb, schedule in CONFIGS:
            plan = emulated_plan(profile, num_stages=num_stages, dp_degree=1, num_microbatches=num_mb, schedule=schedule, recompute=False)
            save_plan(plan, work / "plan.json")
            plain, ours = [], []
            emulate = ["--emulate", "--profile", str(work / "profile.json")] if args.compute == "emulate" else []
            for _ in range(args.rounds):
                _torchrun(num_stages, ["benchmarks/plain_pipeline.py", str(work / "plan.json"), MODEL_SPEC,
                                       str(work / "profile.json"), str(args.steps), str(args.warmup),
                                       str(work / "plain.json"), args.compute])
                plain += json.loads((work / "plain.json").read_text())["step_ms"]
                _torchrun(num_stages, ["-m", "planner.runtime", "--plan", str(work / "plan.json"), "--model", MODEL_SPEC,
                                       *emulate, "--steps", str(args.steps), "--warmup-steps", str(args.warmup),
                                       "--report", str(work / "ours.json")])
                ours += [s.wall_ms for s in load_report(work / "ours.json").steps[args.warmup :]]
            p, o = statistics.median(plain), statistics.median(ours)
            ratios.append(o / p)
            print(f"P{num_stages} M{num_mb} {schedule.value:<6} {p:>9.1f} {o:>9.1f} {100 * (o / p - 1):>8.1f}%", flush=True)
    median, worst = 100 * (statistics.median(ratios) - 1), 100 * (max(ratios) - 1)
    print(f"\n{args.compute} compute: median overhead {median:.1f}% (target <= 5%), max {worst:.1f}%")


if __name__ == "__main__":
    main()
