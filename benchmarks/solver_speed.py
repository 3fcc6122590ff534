"""Solver speed: our default solver (``dp``) on PipeDream's 14 published profiles, beside the wall
time of PipeDream's own optimizer (``../shared/reference/pipedream/README.md``), and on a
GPT-3-175B-class analytic profile (96 blocks) on 1,024 devices (target under 5 s).

Setting (PipeDream's own): V100s, 8 per server (the ``v100-16gb-2x8`` preset grown to as many
servers as the device count needs), 4, 8, 16 and 32 devices.

Global batch: ``b0 x N``, where ``b0`` is the minibatch the profile was measured at (inferred
by the importer: 256 for alexnet, 128 for vgg16, ...) and ``N`` the device count. This is
PipeDream's own setting (every worker processes minibatches of ``b0`` samples, so N workers
process ``b0 x N`` per step); it is divisible by every data-parallel degree D (D divides N),
so every P x D = N split is searchable, and each replica's ``b0 x P`` samples leave the solver a
real micro-batch choice (every divisor of ``b0 x P``, hence M from 1 to ``b0 x P``). With
recomputation allowed and micro-batch size 1 every case fits in 16 GB (an infeasible one would
be reported, not skipped).

GPT-3 175B: ``gpt3_profile("gpt3-175b", "a100-80gb")`` (98 layers: embedding, 96 blocks, head)
on the ``a100-80gb-x8`` preset grown to 128 nodes, GPT-3's global batch of 1536 sequences.
With pure pipeline + data parallelism (no tensor parallelism, no ZeRO), P must divide 1,024 and
not exceed 98 layers, so P <= 64 and 175B parameters at 16 bytes of Adam state each leave a
device at the edge of 80 GB: the default request (``adam-mixed``) is timed as it is, and again
with ``sgd-fp32`` (12 bytes per parameter), where it fits with room. When our solver reports a case infeasible, the
``uniform`` baseline is run on it as a witness of whether a plan exists.

What is timed: in a fresh subprocess per case (so a slow case cannot hang the script; it is
killed after ``--timeout-s``), the import of ``graph.txt`` (parse + convert) and then
``planner.plan(profile, cluster, request)``, after the planner's modules are imported. Fast
cases (first run under ``--repeat-below-s``) are run ``--repeats`` times and the median is
reported; slow ones once. The ratio is PipeDream's wall time over ours (import + plan); the
PipeDream figures include its own graph parsing, and neither includes interpreter start-up.
Peak RSS is the child process's maximum resident set (``ru_maxrss``).

Run: ``python benchmarks/solver_speed.py [--reference ../shared/reference/pipedream]
[--devices 4,8,16,32] [--models alexnet,vgg16] [--timeout-s 120] [--no-gpt3]``
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
sys.path.insert(0, str(REPO))

MODELS = (
    "alexnet", "vgg16", "squeezenet1_0", "resnet18", "resnet50", "resnext50", "resnet101", "resnext101",
    "densenet121", "inception_v3", "nasnetamobile", "nasnetalarge", "gnmt", "gnmt_large",
)
#: PipeDream optimizer wall times in seconds, from the reference README's table (model, devices)
PIPEDREAM_WALL_S: dict[tuple[str, int], float] = {
    ("resnet50", 16): 7.1, ("resnet50", 32): 14.8,
    ("resnext101", 16): 11.9, ("resnext101", 32): 57.8,
    ("densenet121", 16): 19.8, ("densenet121", 32): 93.8,
    ("gnmt_large", 16): 66.8, ("gnmt_large", 32): 192.6,
}
#: what the README says PipeDream does on cases without a figure
PIPEDREAM_NOTES = {"inception_v3": "OOM (221,564 states, > 20 GB)"}
GPT3_DEVICES = 1024
GPT3_GLOBAL_BATCH = 1536  # Brown et al. 2020, table 2.1 (3.2M tokens / 2048)
TARGET_RATIO = 10.0
TARGET_GPT3_S = 5.0


# ----------------------------------------------------------------------------- child side
def _summary(plan) -> dict:
    return {
        "num_stages": plan.num_stages,
        "dp_degree": plan.dp_degree,
        "microbatch_size": plan.microbatch_size,
        "num_microbatches": plan.num_microbatches,
        "schedule": plan.schedule.value,
        "recomputed_layers": sum(len(s.recompute) for s in plan.stages),
        "iteration_ms": plan.predicted.iteration_ms,
    }


def _run_case(spec: dict) -> dict:
    """Time one case in this process; the result is one JSON-able dict."""
    import dataclasses
    import resource

    import networkx  # noqa: F401  (imported before timing: module loading is not solving)

    import planner.importers.pipedream  # noqa: F401
    import planner.simulator  # noqa: F401
    import planner.solve.baselines  # noqa: F401
    import planner.solve.search  # noqa: F401
    from planner.artifacts.cluster import PRESETS
    from planner.artifacts.request import OptimizerKind, PlanRequest
    from planner.errors import PlannerError
    from planner.solve import plan

    out: dict = {"plan_s": []}
    t0 = time.perf_counter()
    if spec["kind"] == "pipedream":
        from planner.importers.pipedream import import_pipedream

        profile = import_pipedream(Path(spec["reference"]) / spec["model"] / "graph.txt")
        base = PRESETS["v100-16gb-2x8"]
        n = spec["devices"]
        nodes = -(-n // base.devices_per_node)
        cluster = dataclasses.replace(base, num_nodes=max(nodes, base.num_nodes)).with_devices(n)
        batch = profile.microbatch_sizes[0] * n
        request = PlanRequest(global_batch=batch)
    else:
        from planner.analytic import gpt3_profile

        profile = gpt3_profile("gpt3-175b", "a100-80gb")
        base = PRESETS["a100-80gb-x8"]
        cluster = dataclasses.replace(base, num_nodes=GPT3_DEVICES // base.devices_per_node)
        batch = GPT3_GLOBAL_BATCH
        request = PlanRequest(global_batch=batch, optimizer=OptimizerKind(spec["optimizer"]))
    out["import_s"] = time.perf_counter() - t0
    out["layers"] = profile.num_layers
    out["global_batch"] = batch
    for i in range(spec["repeats"]):
        t0 = time.perf_counter()
        try:
            result = plan(profile, cluster, request)
            out["plan"] = _summary(result)
        except PlannerError as exc:  # an infeasible request is a result too
            out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        out["plan_s"].append(time.perf_counter() - t0)
        if out["plan_s"][0] >= spec["repeat_below_s"]:
            break
    if "error" in out:  # does a plan exist at all? the uniform baseline, as a witness
        t0 = time.perf_counter()
        try:
            witness = plan(profile, cluster, dataclasses.replace(request, solver="uniform"))
            out["witness"] = _summary(witness) | {"peak_gib": witness.predicted.peak_memory_bytes / 2**30}
        except PlannerError as exc:
            out["witness_error"] = str(exc).splitlines()[0]
        out["witness_s"] = time.perf_counter() - t0
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


# ---------------------------------------------------------------------------- parent side
def run_case(spec: dict, timeout_s: float) -> dict:
    """``_run_case`` in a fresh interpreter, killed after ``timeout_s``."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--case", json.dumps(spec)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"timeout_s": timeout_s}
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"crash": f"exit {proc.returncode}: {tail}", "wall_s": time.perf_counter() - t0}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _plan_text(res: dict) -> str:
    if "plan" in res:
        p = res["plan"]
        return (f"P{p['num_stages']}xD{p['dp_degree']} b{p['microbatch_size']} M{p['num_microbatches']} "
                f"{p['schedule']} rc{p['recomputed_layers']} {p['iteration_ms']:.1f}ms")
    if "error" in res:
        return res["error"][:70]
    return ""


def our_seconds(res: dict) -> float | None:
    """Import + median plan time, or None when the case did not finish."""
    if "plan_s" not in res or not res["plan_s"]:
        return None
    return res["import_s"] + statistics.median(res["plan_s"])


HEADER = (f"{'model':14s} {'layers':>6s} {'N':>5s} {'G':>6s} {'import s':>9s} {'plan s':>9s} {'runs':>4s} "
          f"{'ours s':>8s} {'PipeDream s':>11s} {'PD/ours':>8s} {'RSS MB':>7s}  plan")


def row(model: str, n: int, res: dict) -> str:
    ours = our_seconds(res)
    pd = PIPEDREAM_WALL_S.get((model, n))
    pd_text = f"{pd:.1f}" if pd is not None else PIPEDREAM_NOTES.get(model, "-")
    if ours is None:
        what = f"TIMEOUT > {res['timeout_s']:.0f} s" if "timeout_s" in res else f"CRASH {res.get('crash', '')}"
        return f"{model:14s} {'':>6s} {n:5d} {'':>6s} {'':>9s} {'':>9s} {'':>4s} {'':>8s} {pd_text:>11s} {'':>8s} {'':>7s}  {what}"
    ratio = f"{pd / ours:.1f}x" if pd is not None else "-"
    return (f"{model:14s} {res['layers']:6d} {n:5d} {res['global_batch']:6d} {res['import_s']:9.3f} "
            f"{statistics.median(res['plan_s']):9.3f} {len(res['plan_s']):4d} {ours:8.3f} {pd_text:>11s} {ratio:>8s} "
            f"{res['peak_rss_mb']:7.0f}  {_plan_text(res)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", type=Path, default=REPO.parent / "shared" / "reference" / "pipedream")
    ap.add_argument("--devices", default="4,8,16,32")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--timeout-s", type=float, default=120.0, help="per case (subprocess killed after this)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of a fast case (median reported)")
    ap.add_argument("--repeat-below-s", type=float, default=2.0, help="a case is fast when its first run is shorter")
    ap.add_argument("--no-gpt3", action="store_true", help="skip the GPT-3 175B case")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        print(json.dumps(_run_case(json.loads(args.case))))
        return 0

    devices = [int(d) for d in args.devices.split(",")]
    models = [m for m in args.models.split(",") if m]
    print(f"solver_speed: {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} CPUs; v100-16gb-2x8 grown to N devices; "
          f"G = b0 x N; timeout {args.timeout_s:.0f} s per case; load average {os.getloadavg()[0]:.1f}")
    print(HEADER)
    ratios: list[tuple[str, int, float | None]] = []
    for model in models:
        if not (args.reference / model / "graph.txt").exists():
            print(f"{model:14s} missing {args.reference / model / 'graph.txt'}")
            continue
        for n in devices:
            spec = {"kind": "pipedream", "reference": str(args.reference), "model": model, "devices": n,
                    "repeats": args.repeats, "repeat_below_s": args.repeat_below_s}
            res = run_case(spec, args.timeout_s)
            print(row(model, n, res), flush=True)
            if (model, n) in PIPEDREAM_WALL_S:
                ours = our_seconds(res)
                ratios.append((model, n, None if ours is None else PIPEDREAM_WALL_S[(model, n)] / ours))

    gpt3: dict[str, dict] = {}
    if not args.no_gpt3:
        print(f"\ngpt3-175b (analytic, 98 layers) on {GPT3_DEVICES} A100-80GB (a100-80gb-x8 x 128 nodes), G = {GPT3_GLOBAL_BATCH}")
        print(f"{'optimizer':22s} {'plan s':>9s} {'runs':>4s} {'RSS MB':>7s}  result")
        for opt in ("adam-mixed", "sgd-fp32"):
            spec = {"kind": "gpt3", "optimizer": opt, "repeats": args.repeats, "repeat_below_s": args.repeat_below_s}
            res = gpt3[opt] = run_case(spec, args.timeout_s)
            if our_seconds(res) is None:
                print(f"{opt:22s} TIMEOUT > {args.timeout_s:.0f} s" if "timeout_s" in res else f"{opt:22s} CRASH {res.get('crash')}")
            else:
                print(f"{opt:22s} {statistics.median(res['plan_s']):9.3f} {len(res['plan_s']):4d} {res['peak_rss_mb']:7.0f}  "
                      f"{_plan_text(res) if 'plan' in res else res['error']}")
                if "witness" in res:
                    w = res["witness"]
                    print(f"{'':22s} but the uniform baseline finds a plan ({res['witness_s']:.2f} s): "
                          f"{_plan_text({'plan': w})}, peak {w['peak_gib']:.2f} GiB  <- solver misses a feasible plan")
                elif "witness_error" in res:
                    print(f"{'':22s} the uniform baseline is infeasible too: {res['witness_error'][:100]}")

    print()
    done = [(m, n, r) for m, n, r in ratios if r is not None]
    met = [x for x in done if x[2] >= TARGET_RATIO]
    parts = [f">= {TARGET_RATIO:.0f}x faster than PipeDream: {len(met)}/{len(ratios)} cases with a PipeDream figure"]
    if done:
        worst = min(done, key=lambda x: x[2])
        parts.append(f"min ratio {worst[2]:.1f}x ({worst[0]} N={worst[1]})")
    missed = [f"{m} N={n} ({'timeout' if r is None else f'{r:.1f}x'})" for m, n, r in ratios if r is None or r < TARGET_RATIO]
    if missed:
        parts.append("missed: " + ", ".join(missed))
    for opt, res in gpt3.items():
        s = our_seconds(res)
        if s is None:
            parts.append(f"175B/{GPT3_DEVICES} {opt}: did not finish")
        else:
            t = statistics.median(res["plan_s"])
            what = ", plan" if "plan" in res else (
                ", says infeasible but the uniform baseline finds a plan" if "witness" in res else ", infeasible, explained")
            parts.append(f"175B/{GPT3_DEVICES} {opt}: {t:.2f} s ({'<' if t < TARGET_GPT3_S else '>='} {TARGET_GPT3_S:.0f} s{what})")
    print("summary: " + "; ".join(parts))
    print(f"(load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs: wall times scale with other jobs' load)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
