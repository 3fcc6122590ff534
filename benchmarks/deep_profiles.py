"""Deep profiles on many devices (issue 52 item 5): CPU seconds, peak resident memory and the
outcome of ``planner plan`` for a Llama-3-8B-shaped profile stretched to 2,000 and 10,000
transformer blocks, on 64 and 1,024 H100s.

The profiles: ``configs/llama-3-8b.json`` (hidden 4,096, 32 heads, 8 key/value heads, FFN
14,336, vocabulary 128,256) with ``num_hidden_layers`` set to the depth, through the analytic
builder (:func:`planner.profiling.analytic.llama.llama_profile`, sequence 4,096, the h100-80gb
preset), written to a temporary directory. Each plan runs ``planner plan --profile P --cluster
h100-80gb-x8 --devices N`` (global batch 512, everything else default) in a child process of its
own, with its address space limited to ``--limit-gib`` (default 6) so that a runaway cannot take
the machine down; the child reports its own ``resource.getrusage`` (user + sys CPU, max RSS).

Beside each run: the working-set ceiling's estimate (:mod:`planner.solve.ceiling`) of the chain
the search wanted and of the chain it used, so the estimate can be read against the measured
peak (the peak also holds the profile, its per-degree views and the simulations, which the
estimate does not count).

Run: ``python benchmarks/deep_profiles.py [--layers 2000,10000] [--devices 64,1024]
[--limit-gib 6] [--timeout-s 900]``
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = r"""
import json, resource, sys
from planner.commands.cli import main
rc = main(sys.argv[1:])
ru = resource.getrusage(resource.RUSAGE_SELF)
print("RUSAGE " + json.dumps({"rc": rc, "cpu_s": ru.ru_utime + ru.ru_stime, "maxrss_mb": ru.ru_maxrss / 1024}),
      file=sys.stderr)
"""


def write_profile(layers: int, where: Path) -> Path:
    from planner.artifacts.profile import save_profile
    from planner.profiling.analytic.llama import llama_profile

    config = json.loads((ROOT / "configs" / "llama-3-8b.json").read_text())
    config["num_hidden_layers"] = layers
    path = where / f"llama-8b-shape-{layers}.json"
    save_profile(llama_profile(config, seq=4096, device_preset="h100-80gb", model=f"llama-8b-shape-{layers}"), path)
    return path


def estimates(path: Path, devices: int) -> tuple[float, int, float, int]:
    """The ceiling's estimate (GiB) of the chain the search wants at its longest, and of the chain it uses."""
    from planner.artifacts.profile import load_profile
    from planner.artifacts.request import PlanRequest
    from planner.commands.plan import cluster_for
    from planner.cost.groups import base_cluster, device_groups
    from planner.solve.ceiling import block_starts, bound_chain, working_set_bytes
    from planner.solve.chain_dp import solve_chain
    from planner.solve.layout_search import wanted_chain
    from planner.solve.settings import SETTINGS

    profile, request = load_profile(path), PlanRequest(global_batch=512)
    base = base_cluster(cluster_for("h100-80gb-x8", devices), devices)
    groups = tuple(g.groups_in(devices) for g in device_groups(profile, base, devices, request))
    bound = bound_chain(profile.num_layers, groups, request, SETTINGS)
    wanted = max(wanted_chain(profile.num_layers, n, request, solve_chain, SETTINGS) for n in groups)
    used = len(block_starts(profile.num_layers, bound.max_chain)) if wanted > bound.max_chain else wanted
    return working_set_bytes(wanted, bound.keys) / 2**30, wanted, working_set_bytes(used, bound.keys) / 2**30, used


def run_plan(path: Path, devices: int, limit_gib: float, timeout_s: float) -> dict[str, object]:
    limit = int(limit_gib * 2**30)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    argv = ["plan", "--profile", str(path), "--cluster", "h100-80gb-x8", "--devices", str(devices)]
    env = {"PLANNER_PROGRESS": "0", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, cwd=ROOT,
                              preexec_fn=cap, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"rc": "timeout", "cpu_s": float("nan"), "maxrss_mb": float("nan"), "outcome": f"over {timeout_s:.0f} s"}
    usage = next((json.loads(line[7:]) for line in done.stderr.splitlines() if line.startswith("RUSAGE ")), None)
    lines = [line for line in done.stderr.splitlines() if line and not line.startswith("RUSAGE ")]
    if usage is None:  # died before reporting: say how
        return {"rc": done.returncode, "cpu_s": float("nan"), "maxrss_mb": float("nan"),
                "outcome": f"died ({len(lines)} lines of stderr; last: {lines[-1][:100] if lines else ''})"}
    if usage["rc"] == 0:
        summary = next((line for line in done.stdout.splitlines() if line.startswith("iteration")), "")
        layout = next((line for line in done.stdout.splitlines() if "x D=" in line or "P=" in line), "")
        noted = " (coarsened)" if any("working-set ceiling" in line for line in lines) else ""
        outcome = f"planned{noted}: {layout.strip()[:70]} | {summary.split('|')[0].strip()}"
    else:
        outcome = f"exit {usage['rc']}, {len(lines)} line(s): {lines[-1][:110] if lines else ''}"
    usage["outcome"] = outcome
    usage["wall_s"] = time.monotonic() - start
    return usage


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="2000,10000")
    ap.add_argument("--devices", default="64,1024")
    ap.add_argument("--limit-gib", type=float, default=6.0)
    ap.add_argument("--timeout-s", type=float, default=900.0)
    args = ap.parse_args()
    print(f"{'layers':>7} {'devices':>7} {'CPU s':>7} {'max RSS':>9} {'wanted chain (est.)':>21} "
          f"{'used chain (est.)':>19}  outcome")
    with tempfile.TemporaryDirectory() as tmp:
        for layers in [int(x) for x in args.layers.split(",")]:
            path = write_profile(layers, Path(tmp))
            for devices in [int(x) for x in args.devices.split(",")]:
                want_gib, wanted, used_gib, used = estimates(path, devices)
                r = run_plan(path, devices, args.limit_gib, args.timeout_s)
                print(f"{layers:>7,} {devices:>7,} {r['cpu_s']:>7.1f} {r['maxrss_mb'] / 1024:>7.2f} GB "
                      f"{wanted:>6,} ({want_gib:>8.1f} GiB) {used:>5,} ({used_gib:>5.2f} GiB)  {r['outcome']}",
                      flush=True)


if __name__ == "__main__":
    main()
