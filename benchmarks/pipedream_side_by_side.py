"""PipeDream's own optimizer and ``planner`` side by side, whole processes, on PipeDream's profiles.

Issue 24's measurement: for each model and device count, ``--pairs`` rounds that each start
PipeDream's optimizer (``../shared/reference/pipedream/optimizer_src``, unmodified, run as its
README says, with ``--use_memory_constraint``) and ``planner`` on the same ``graph.txt``, in
alternating order (PipeDream first in even rounds, planner first in odd ones), so both see the
same background load. Each side's figure is whole-process CPU time (user + sys of the child,
interpreter start and imports included) and wall time; the table shows medians and the ratio
PipeDream / planner (above 1: planner is faster; the issue's target is 10).

The planner side is one process, ``planner plan --profile graph.txt`` (it parses and converts
the graph as ``planner import-pipedream`` does; PipeDream parses it on every run too), with the
default request (every schedule, micro-batch size, recomputation, ZeRO 0-2, per-stage
replication) on V100-16GB nodes of 8 (``v100-16gb-2x8`` grown to N devices), global batch
``b0 x N`` (``b0``: the minibatch the profile was measured at, PipeDream's own setting).

PipeDream's side: ``python optimizer_graph_hierarchical.py -f graph.txt -n N -b 10000000000
-s 16000000000 --activation_compression_ratio 1 --use_memory_constraint`` from its own folder
(one level, 10 GB/s, 16 GB per device: the reference README's setting), the command line and
environment ``benchmarks/pipedream_reference.py`` runs it with (one definition). Its ``graph`` module
imports the ``graphviz`` package only to draw (``-o``, not used here); where that package is not
installed a stand-in module of that name is put on PipeDream's path instead (PipeDream then skips
the real package's import time: its figure is, if anything, a little low).

:func:`side_by_side` is the measurement of one case; ``benchmarks/solver_speed.py`` calls it for
its PipeDream columns.

Run: ``python benchmarks/pipedream_side_by_side.py [--reference ../shared/reference/pipedream]
[--models alexnet,vgg16] [--devices 4,8,16,32] [--pairs 3] [--timeout-s 600]``
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.pipedream_reference import optimizer_command, optimizer_env, require_reference
from planner.profiling.imported.pipedream import import_pipedream

MODELS = ("alexnet", "vgg16", "resnet50", "resnext101", "densenet121", "gnmt_large")
TARGET_RATIO = 10.0


@dataclass(frozen=True)
class Run:
    cpu_s: float
    wall_s: float
    ok: bool
    summary: str


@dataclass(frozen=True)
class Case:
    """One model at one device count: medians over the pairs, and the last run of each side."""

    pd_cpu_s: float
    our_cpu_s: float
    pd_wall_s: float
    our_wall_s: float
    pd_ok: bool
    pd_last: Run
    our_last: Run

    @property
    def cpu_ratio(self) -> float:
        return self.pd_cpu_s / self.our_cpu_s

    @property
    def wall_ratio(self) -> float:
        return self.pd_wall_s / self.our_wall_s


def timed(cmd: list[str], cwd: Path, timeout_s: float, env: dict[str, str] | None = None) -> Run:
    """One whole child process: its user + sys CPU (``RUSAGE_CHILDREN`` before and after, the
    children run one at a time) and wall time; ``summary``: its output's last meaningful line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, env=env)
        ok, out = proc.returncode == 0, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired:
        ok, out = False, f"timed out after {timeout_s:.0f} s"
    wall = time.perf_counter() - w0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return Run(cpu_s=cpu, wall_s=wall, ok=ok, summary=lines[-1] if lines else "(no output)")


def planner_run(graph: Path, devices: int, timeout_s: float) -> Run:
    """``planner plan --profile graph.txt`` (it converts the graph as ``import-pipedream`` does)."""
    exe = str(Path(sys.executable).with_name("planner"))
    b0 = import_pipedream(graph).microbatch_sizes[0]  # the global batch, b0 x N (not timed)
    return timed([exe, "plan", "--profile", str(graph), "--cluster", "v100-16gb-2x8", "--devices", str(devices),
                  "--global-batch", str(b0 * devices)], ROOT, timeout_s)


def side_by_side(reference: Path, model: str, devices: int, pairs: int, timeout_s: float, env: dict[str, str]) -> Case:
    """``pairs`` rounds of PipeDream's optimizer and ``planner plan`` on ``model`` at ``devices``,
    alternating which goes first (``env``: :func:`optimizer_env`'s, for PipeDream)."""
    opt_dir = require_reference(reference)
    graph = reference / model / "graph.txt"
    pd_runs: list[Run] = []
    our_runs: list[Run] = []
    for r in range(pairs):
        for side in (("pd", "ours") if r % 2 == 0 else ("ours", "pd")):
            if side == "pd":
                pd_runs.append(timed(optimizer_command(model, devices, reference), opt_dir, timeout_s, env))
            else:
                our_runs.append(planner_run(graph, devices, timeout_s))
    return Case(
        pd_cpu_s=statistics.median(x.cpu_s for x in pd_runs), our_cpu_s=statistics.median(x.cpu_s for x in our_runs),
        pd_wall_s=statistics.median(x.wall_s for x in pd_runs), our_wall_s=statistics.median(x.wall_s for x in our_runs),
        pd_ok=all(x.ok for x in pd_runs), pd_last=pd_runs[-1], our_last=our_runs[-1],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", type=Path, default=ROOT.parent / "shared" / "reference" / "pipedream")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--devices", default="4,8,16,32")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=600.0)
    args = ap.parse_args()
    try:
        require_reference(args.reference)
    except AssertionError as exc:
        raise SystemExit(str(exc)) from None
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.1f}, "
          f"{args.pairs} pairs per case, medians; CPU = whole-process user + sys")
    print(f"{'model':12s} {'N':>3s} {'PD cpu s':>8s} {'ours cpu s':>10s} {'PD/ours cpu':>11s} "
          f"{'PD wall s':>9s} {'ours wall s':>11s} {'PD/ours wall':>12s}  PipeDream's last line | ours")
    ratios: list[tuple[str, int, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        env = optimizer_env(Path(tmp))
        for model in args.models.split(","):
            for n in (int(x) for x in args.devices.split(",")):
                c = side_by_side(args.reference, model, n, args.pairs, args.timeout_s, env)
                note = "" if c.pd_ok else " (PipeDream failed or timed out: its figure is a lower bound)"
                ratios.append((model, n, c.cpu_ratio))
                print(f"{model:12s} {n:3d} {c.pd_cpu_s:8.2f} {c.our_cpu_s:10.2f} {c.cpu_ratio:11.2f} "
                      f"{c.pd_wall_s:9.2f} {c.our_wall_s:11.2f} {c.wall_ratio:12.2f}  "
                      f"{c.pd_last.summary[:60]} | {c.our_last.summary[:70]}{note}", flush=True)
    below = [f"{m} N={n} ({r:.2f})" for m, n, r in ratios if r < TARGET_RATIO]
    print(f"\nPD/ours CPU: median {statistics.median(r for _, _, r in ratios):.2f}, "
          f"min {min(r for _, _, r in ratios):.2f}; below the target {TARGET_RATIO:.0f}x: "
          f"{', '.join(below) if below else 'none'}")


if __name__ == "__main__":
    main()
