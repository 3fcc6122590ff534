"""Offloading as a plan choice (issue 49 item 3), side by side: ``planner plan`` with each
``--offload`` mode, which wins, and the memory objective's least peak with and without it.

Cases (the issue's "Done when"):

- ``llama-3-70b``: ``profiles/llama-3-70b-a100.json`` (seq 8192) on 16 A100 80 GB
  (``a100-80gb-2x8``), global batch 512;
- ``gpt3-175b``: ``profiles/gpt3-175b-a100.json`` (seq 2048) on 64 A100 80 GB (``a100-80gb-x8``
  grown to 8 nodes), global batch 512.

For each: the time objective's plan under ``none`` (recomputation the only memory lever),
``optimizer``, ``activations`` and ``both`` (what ``--offload auto`` chooses among: the fastest),
its layout, iteration time, peak device memory, host memory per device, recomputed and offloaded
layers; then the memory objective (the least peak within 10% of the fastest) under ``none`` and
``auto``, with the least peak of each Pareto front. Times are the planner's predictions (A100
host link: PCIe 4.0 x16, 25 GB/s per direction; host Adam: ZeRO-Offload's CPU-Adam figure), not
measurements.

Run: ``python benchmarks/offload.py [--cases llama-3-70b,gpt3-175b]`` (about a minute per case
and mode on one core).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.artifacts.cluster import load_cluster
from planner.artifacts.errors import InfeasibleError
from planner.artifacts.host import OffloadMode
from planner.artifacts.kinds import Objective
from planner.artifacts.plan import Plan
from planner.artifacts.profile import load_profile
from planner.artifacts.request import PlanRequest
from planner.solve import plan
from planner.solve.offload import MODES

GIB = 1024**3
CASES = {
    "llama-3-70b": ("profiles/llama-3-70b-a100.json", "a100-80gb-2x8", 16, 512),
    "gpt3-175b": ("profiles/gpt3-175b-a100.json", "a100-80gb-x8", 64, 512),
}


def _row(label: str, p: Plan | str) -> str:
    if isinstance(p, str):
        return f"  {label:<12} {p}"
    lay = p.layout
    rc = sum(len(s.recompute) + len(s.recompute_selective) for s in p.stages)
    off = sum(len(s.offload_layers) for s in p.stages)
    host = max(s.host_memory_bytes for s in p.stages) / GIB
    front = min((q.peak_memory_bytes for q in p.pareto), default=p.predicted.peak_memory_bytes) / GIB
    return (f"  {label:<12} {p.predicted.iteration_ms:>12.0f} {p.predicted.peak_memory_bytes / GIB:>8.2f} {host:>8.1f} "
            f"{rc:>4} {off:>4} {front:>10.2f}   {lay.describe()}, {p.schedule.value}, M={p.num_microbatches} x "
            f"{p.microbatch_size}")


def _plan(name: str, mode: OffloadMode, objective: Objective) -> Plan | str:
    path, cluster, devices, batch = CASES[name]
    request = PlanRequest(global_batch=batch, num_devices=devices, offload=mode, objective=objective)
    try:
        return plan(load_profile(ROOT / path), load_cluster(cluster).grown_to(devices), request)
    except InfeasibleError as err:
        return f"refused: {str(err)[:120]}"


def run_case(name: str) -> None:
    path, cluster, devices, batch = CASES[name]
    print(f"{name}: {path} on {devices} x {cluster}, global batch {batch}")
    head = f"  {'offload':<12} {'iter ms':>12} {'peak GiB':>8} {'host GiB':>8} {'rc':>4} {'off':>4} {'front GiB':>10}   layout"
    print("time objective\n" + head)
    plans = {}
    for mode in MODES:
        plans[mode] = _plan(name, mode, Objective.TIME)
        print(_row(mode.value, plans[mode]), flush=True)
    found = {m: p for m, p in plans.items() if not isinstance(p, str)}
    if found:
        best = min(found, key=lambda m: found[m].predicted.iteration_ms)
        base = found.get(OffloadMode.NONE)
        gain = f" ({base.predicted.iteration_ms / found[best].predicted.iteration_ms:.3f}x none)" if base else ""
        print(f"  winner: {best.value}{gain}")
    print("memory objective (least peak within 10% of the fastest)\n" + head)
    for mode in (OffloadMode.NONE, OffloadMode.AUTO):
        p = _plan(name, mode, Objective.MEMORY)
        label = mode.value if isinstance(p, str) else f"{mode.value}->{p.offload.value}"
        print(_row(label, p), flush=True)
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    print("columns: predicted iteration ms; peak device GiB; host GiB per device; recomputed layers; offloaded "
          "layers; least peak GiB on the plan's Pareto front\n")
    for name in args.cases.split(","):
        run_case(name)


if __name__ == "__main__":
    main()
