"""Solver speed: our default solver (``dp``) on PipeDream's 14 published profiles, the code
before the "closer to the machine's limit" change (``--base``, a checkout of fb39801: no ZeRO,
no per-stage replication) beside the code now (this repository), alternating in one run; beside
PipeDream's own optimizer, run here in the same run when ``--reference`` holds it
(``optimizer_src/``): ``benchmarks/pipedream_side_by_side.py``'s measurement of a case
(:func:`side_by_side`: ``--pd-pairs`` rounds of whole processes, PipeDream's optimizer and
``planner plan --profile graph.txt`` of this repository, alternating which goes first; medians
of each process's user + sys CPU and wall time, interpreter start and imports included), with
the ratios PipeDream / ours of CPU and of wall time per case (target 10); and on a
GPT-3-175B-class analytic profile (96 blocks) on 1,024 devices (target under 5 s). (Earlier
versions divided the wall times the reference README gives for PipeDream, from another machine
and the variant without ``--use_memory_constraint``, by a time measured here; those figures
stay in the README, not here.)

Setting (PipeDream's own): V100s, 8 per server (the ``v100-16gb-2x8`` preset grown to as many
servers as the device count needs), 4, 8, 16 and 32 devices.

Global batch: ``b0 x N``, where ``b0`` is the minibatch the profile was measured at (inferred
by the importer: 256 for alexnet, 128 for vgg16, ...) and ``N`` the device count. This is
PipeDream's own setting (every worker processes minibatches of ``b0`` samples, so N workers
process ``b0 x N`` per step); it is divisible by every data-parallel degree D (D divides N),
so every P x D = N split is searchable, and each replica's ``b0 x P`` samples leave the solver a
real micro-batch choice. The default request is used (the new code also searches ZeRO 0/1/2 and
per-stage replication there; the old one cannot).

GPT-3 175B: ``gpt3_profile("gpt3-175b", "a100-80gb")`` (98 layers: embedding, 96 blocks, head)
on the ``a100-80gb-x8`` preset grown to 128 nodes, GPT-3's global batch of 1536 sequences, with
the default optimizer (``adam-mixed``) and with ``sgd-fp32``. When a solver reports a case
infeasible, the ``uniform`` baseline is run on it as a witness of whether a plan exists.

What is timed, in a fresh subprocess (killed after ``--timeout-s``): the import of
``graph.txt`` (parse + convert) and then ``planner.plan(profile, cluster, request)``, after
the planner's modules are imported; ``plan`` runs ``--inner`` times in that process when its
first run is under ``--repeat-below-s`` (else once), and the child's figure is import + the
median run: the definition of the 2026-12-02 figures (the later runs of a process are warm,
so this is below a cold first run; ``cold new/old`` compares first runs). Each case starts
``--repeats`` such subprocesses per code version, old and new alternating (old-new,
new-old, ...), so both see the same background load, and reports the medians over them, of
wall time and of the child's process CPU time (``time.process_time``: what the solver itself
used, less sensitive to other jobs on this shared machine than wall time, though not immune:
two busy hyperthreads slow each other). ``12-02 s`` is the figure RESULTS.md recorded on
2026-12-02 for the code before the change (load average 0.1-0.8); the target is new <= 2 x
that, so the same-run new/old ratio is the like-for-like check. Peak RSS is the child's
maximum resident set (``ru_maxrss``).

Run: ``python benchmarks/solver_speed.py [--reference ../shared/reference/pipedream]
[--base /tmp/base] [--devices 4,8,16,32] [--models alexnet,vgg16] [--repeats 3] [--inner 3]
[--timeout-s 120] [--pd-pairs 3] [--no-pipedream] [--no-gpt3] [--no-base]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MODELS = (
    "alexnet", "vgg16", "squeezenet1_0", "resnet18", "resnet50", "resnext50", "resnet101", "resnext101",
    "densenet121", "inception_v3", "nasnetamobile", "nasnetalarge", "gnmt", "gnmt_large",
)
#: our import + plan seconds as RESULTS.md recorded them on 2026-12-02 (solver 175b4c5, load 0.1-0.8)
RECORDED_S: dict[str, tuple[float, float, float, float]] = {  # N = 4, 8, 16, 32
    "alexnet": (0.039, 0.076, 0.118, 0.136), "vgg16": (0.077, 0.140, 0.183, 0.260),
    "squeezenet1_0": (0.098, 0.115, 0.224, 0.137), "resnet18": (0.069, 0.130, 0.128, 0.173),
    "resnet50": (0.102, 0.201, 0.353, 0.546), "resnext50": (0.096, 0.167, 0.317, 0.513),
    "resnet101": (0.144, 0.233, 0.438, 0.682), "resnext101": (0.099, 0.174, 0.307, 0.603),
    "densenet121": (0.174, 0.177, 0.369, 0.706), "inception_v3": (0.118, 0.150, 0.201, 0.353),
    "nasnetamobile": (0.208, 0.226, 0.455, 0.719), "nasnetalarge": (0.227, 0.332, 0.509, 0.792),
    "gnmt": (0.051, 0.100, 0.137, 0.239), "gnmt_large": (0.082, 0.140, 0.168, 0.181),
}
RECORDED_DEVICES = (4, 8, 16, 32)
GPT3_DEVICES = 1024
GPT3_GLOBAL_BATCH = 1536  # Brown et al. 2020, table 2.1 (3.2M tokens / 2048)
TARGET_RATIO = 10.0
TARGET_SLOWDOWN = 2.0
TARGET_GPT3_S = 5.0


# ----------------------------------------------------------------------------- child side
def _summary(plan) -> dict:
    lay = getattr(plan, "layout", plan)  # before the Layout, a plan held these fields itself
    reps = getattr(lay, "stage_replicas", ())
    return {
        "num_stages": lay.num_stages,
        "dp_degree": lay.dp_degree,
        "replicas": list(reps) if getattr(lay, "replicated_per_stage", False) else [],
        "zero": int(getattr(lay, "zero", 0)),
        "microbatch_size": plan.microbatch_size,
        "num_microbatches": plan.num_microbatches,
        "schedule": plan.schedule.value,
        "recomputed_layers": sum(len(s.recompute) for s in plan.stages),
        "iteration_ms": plan.predicted.iteration_ms,
    }


def _run_case(spec: dict) -> dict:
    """Time one run of one case in this process, with the planner found at ``spec["code"]``."""
    sys.path.insert(0, spec["code"])
    import dataclasses
    import resource

    import networkx  # noqa: F401  (imported before timing: module loading is not solving)

    import planner
    import planner.profiling.imported.pipedream
    import planner.simulation
    import planner.solve.baselines
    import planner.solve.search
    from planner.artifacts.cluster import PRESETS
    from planner.artifacts.errors import PlannerError
    from planner.artifacts.request import OptimizerKind, PlanRequest
    from planner.solve import plan

    out: dict = {"planner": str(Path(planner.__file__).resolve().parents[1])}
    w0, c0 = time.perf_counter(), time.process_time()
    if spec["kind"] == "pipedream":
        from planner.profiling.imported.pipedream import import_pipedream

        profile = import_pipedream(Path(spec["reference"]) / spec["model"] / "graph.txt")
        base = PRESETS["v100-16gb-2x8"]
        n = spec["devices"]
        nodes = -(-n // base.devices_per_node)
        cluster = dataclasses.replace(base, num_nodes=max(nodes, base.num_nodes)).with_devices(n)
        batch = profile.microbatch_sizes[0] * n
        request = PlanRequest(global_batch=batch)
    else:
        from planner.profiling.analytic.gpt import gpt3_profile

        profile = gpt3_profile("gpt3-175b", "a100-80gb")
        base = PRESETS["a100-80gb-x8"]
        cluster = dataclasses.replace(base, num_nodes=GPT3_DEVICES // base.devices_per_node)
        batch = GPT3_GLOBAL_BATCH
        request = PlanRequest(global_batch=batch, optimizer=OptimizerKind(spec["optimizer"]))
    out["import_s"], import_cpu = time.perf_counter() - w0, time.process_time() - c0
    out["layers"] = profile.num_layers
    out["global_batch"] = batch
    walls, cpus = [], []
    for _ in range(spec["inner"]):
        w1, c1 = time.perf_counter(), time.process_time()
        try:
            out["plan"] = _summary(plan(profile, cluster, request))
        except PlannerError as exc:  # an infeasible request is a result too
            out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        walls.append(time.perf_counter() - w1)
        cpus.append(time.process_time() - c1)
        if walls[0] >= spec["repeat_below_s"]:
            break
    out["runs"] = len(walls)
    out["plan_s"] = statistics.median(walls)
    out["wall_s"] = out["import_s"] + statistics.median(walls)  # the 2026-12-02 figure's definition
    out["cold_s"] = out["import_s"] + walls[0]
    out["cpu_s"] = import_cpu + statistics.median(cpus)
    if "error" in out:  # does a plan exist at all? the uniform baseline, as a witness
        try:
            witness = plan(profile, cluster, dataclasses.replace(request, solver="uniform"))
            out["witness"] = _summary(witness)
        except PlannerError as exc:
            out["witness_error"] = str(exc).splitlines()[0]
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


# ---------------------------------------------------------------------------- parent side
def run_once(spec: dict, timeout_s: float) -> dict:
    """``_run_case`` in a fresh interpreter, killed after ``timeout_s``; with the load average
    just before it."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--case", json.dumps(spec)]
    load = os.getloadavg()[0]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd="/")
    except subprocess.TimeoutExpired:
        return {"timeout_s": timeout_s, "load": load}
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"crash": f"exit {proc.returncode}: {tail}", "load": load}
    return json.loads(proc.stdout.strip().splitlines()[-1]) | {"load": load}


def run_pair(spec: dict, codes: dict[str, str], repeats: int, timeout_s: float) -> dict[str, list[dict]]:
    """``repeats`` runs of each code version, alternating (ABBA...) so both share the load."""
    runs: dict[str, list[dict]] = {name: [] for name in codes}
    names = list(codes)
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            res = run_once(spec | {"code": codes[name]}, timeout_s)
            if "planner" in res and Path(res["planner"]) != Path(codes[name]).resolve():
                raise SystemExit(f"{name} run imported the planner from {res['planner']}, not {codes[name]}")
            runs[name].append(res)
    return runs


def med(runs: list[dict], key: str) -> float | None:
    """Median of ``key`` over the runs that finished (None if one did not)."""
    if not runs or any(key not in r for r in runs):
        return None
    return statistics.median(r[key] for r in runs)


def plan_text(res: dict) -> str:
    if "plan" in res:
        p = res["plan"]
        layout = (f"P{p['num_stages']} r{'+'.join(map(str, p['replicas']))}" if p["replicas"]
                  else f"P{p['num_stages']}xD{p['dp_degree']}")
        return (f"{layout} b{p['microbatch_size']} M{p['num_microbatches']} {p['schedule']} z{p['zero']} "
                f"rc{p['recomputed_layers']} {p['iteration_ms']:.1f}ms")
    if "error" in res:
        return res["error"][:70]
    return f"TIMEOUT > {res['timeout_s']:.0f} s" if "timeout_s" in res else f"CRASH {res.get('crash', '')}"


def _s(x: float | None, width: int = 6, digits: int = 2) -> str:
    return f"{x:{width}.{digits}f}" if x is not None else f"{'-':>{width}s}"


def _x(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


HEADER = (f"{'model':14s} {'N':>3s} {'G':>5s} | {'old s':>6s} {'new s':>6s} {'new/old':>7s} | {'old cpu':>7s} "
          f"{'new cpu':>7s} {'new/old':>7s} | {'cold new/old':>12s} | {'12-02 s':>7s} {'new/12-02':>9s} | {'PD cpu':>6s} {'plan cpu':>8s} "
          f"{'PD/plan cpu':>11s} {'PD/plan wall':>12s} | "
          f"{'load':>4s} {'RSS MB':>6s}  old plan -> new plan")


def row(model: str, n: int, runs: dict[str, list[dict]], pd=None) -> tuple[str, dict]:
    """One case's line; ``pd``: its side-by-side measurement against PipeDream (a
    ``pipedream_side_by_side.Case``), or None where it was not run."""
    old, new = runs.get("old", []), runs["new"]
    ow, nw, oc, nc = med(old, "wall_s"), med(new, "wall_s"), med(old, "cpu_s"), med(new, "cpu_s")
    cold = _x(med(new, "cold_s"), med(old, "cold_s"))
    recorded = RECORDED_S[model][RECORDED_DEVICES.index(n)] if model in RECORDED_S and n in RECORDED_DEVICES else None
    if pd is None:
        pd_text = f"{'-':>6s} {'-':>8s} {'-':>11s} {'-':>12s}"
    else:
        failed = "" if pd.pd_ok else ">"  # PipeDream failed or timed out: its figure is a lower bound
        pd_text = (f"{pd.pd_cpu_s:6.2f} {pd.our_cpu_s:8.2f} {failed + f'{pd.cpu_ratio:.2f}x':>11s} "
                   f"{failed + f'{pd.wall_ratio:.2f}x':>12s}")
    load = statistics.mean(r["load"] for r in old + new)
    g = next((r["global_batch"] for r in new + old if "global_batch" in r), 0)
    rss = max((r.get("peak_rss_mb", 0) for r in new), default=0)
    plans = f"{plan_text(old[-1]) if old else '-'} -> {plan_text(new[-1])}"
    text = (f"{model:14s} {n:3d} {g:5d} | {_s(ow)} {_s(nw)} {_x(nw, ow):>7s} | {_s(oc, 7)} {_s(nc, 7)} {_x(nc, oc):>7s} | {cold:>12s} | "
            f"{_s(recorded, 7, 3)} {_x(nw, recorded):>9s} | {pd_text} | {load:4.1f} {rss:6.0f}  {plans}")
    return text, {"old_wall": ow, "new_wall": nw, "old_cpu": oc, "new_cpu": nc, "recorded": recorded,
                  "pd_cpu_ratio": pd.cpu_ratio if pd else None, "pd_wall_ratio": pd.wall_ratio if pd else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", type=Path, default=REPO.parent / "shared" / "reference" / "pipedream")
    ap.add_argument("--base", type=Path, default=Path("/tmp/base"), help="checkout of the code before the change")
    ap.add_argument("--devices", default="4,8,16,32")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--timeout-s", type=float, default=120.0, help="per run (subprocess killed after this)")
    ap.add_argument("--repeats", type=int, default=3, help="subprocesses per case and code version (medians reported)")
    ap.add_argument("--inner", type=int, default=3, help="plan runs per subprocess (median; the 12-02 definition)")
    ap.add_argument("--repeat-below-s", type=float, default=2.0, help="a subprocess repeats plan only below this")
    ap.add_argument("--pd-pairs", type=int, default=3, help="rounds of PipeDream's optimizer and planner plan per case")
    ap.add_argument("--no-pipedream", action="store_true", help="do not run PipeDream's optimizer beside ours")
    ap.add_argument("--no-gpt3", action="store_true", help="skip the GPT-3 175B case")
    ap.add_argument("--no-base", action="store_true", help="time only the code in this repository")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        print(json.dumps(_run_case(json.loads(args.case))))
        return 0

    codes = {"new": str(REPO)} if args.no_base else {"old": str(args.base), "new": str(REPO)}
    if not args.no_base and not (args.base / "planner" / "solve" / "search.py").exists():
        raise SystemExit(f"--base {args.base} is not a planner checkout (use --no-base to time only the new code)")
    devices = [int(d) for d in args.devices.split(",")]
    models = [m for m in args.models.split(",") if m]
    print(f"solver_speed: {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} CPUs; v100-16gb-2x8 grown to N devices; "
          f"G = b0 x N; old = {args.base}, new = {REPO}; {args.repeats} runs each, alternating, medians; "
          f"s = import + plan; timeout {args.timeout_s:.0f} s per run; load average {os.getloadavg()[0]:.1f}")
    pd_env, sbs, shim = None, None, None
    have_pd = (args.reference / "optimizer_src" / "optimizer" / "optimizer_graph_hierarchical.py").is_file()
    if not args.no_pipedream and have_pd:
        # here, not at the top: a --case child imports the planner of its own --code only
        import pipedream_side_by_side as sbs

        shim = tempfile.TemporaryDirectory()  # the graphviz stand-in, removed at exit
        pd_env = sbs.optimizer_env(Path(shim.name))
        print(f"PipeDream: its optimizer from {args.reference / 'optimizer_src'} beside `planner plan` (this repository), "
              f"{args.pd_pairs} pairs of whole processes per case, alternating; medians; PD/plan above 1: ours faster")
    elif not args.no_pipedream:
        print(f"PipeDream: its optimizer is not under {args.reference / 'optimizer_src'}: not run (no PipeDream columns)")
    print(HEADER)
    figures: list[tuple[str, int, dict]] = []
    inner = {"inner": args.inner, "repeat_below_s": args.repeat_below_s}
    for model in models:
        if not (args.reference / model / "graph.txt").exists():
            print(f"{model:14s} missing {args.reference / model / 'graph.txt'}")
            continue
        for n in devices:
            spec = {"kind": "pipedream", "reference": str(args.reference), "model": model, "devices": n} | inner
            runs = run_pair(spec, codes, args.repeats, args.timeout_s)
            pd = None
            if sbs is not None and pd_env is not None:
                pd = sbs.side_by_side(args.reference, model, n, args.pd_pairs, args.timeout_s, pd_env)
            text, fig = row(model, n, runs, pd)
            print(text, flush=True)
            figures.append((model, n, fig))

    gpt3: dict[str, dict[str, list[dict]]] = {}
    if not args.no_gpt3:
        print(f"\ngpt3-175b (analytic, 98 layers) on {GPT3_DEVICES} A100-80GB (a100-80gb-x8 x 128 nodes), G = {GPT3_GLOBAL_BATCH}")
        print(f"{'optimizer':12s} {'code':4s} {'plan s':>7s} {'cpu s':>7s} {'runs':>4s} {'load':>4s}  result")
        for opt in ("adam-mixed", "sgd-fp32"):
            runs = gpt3[opt] = run_pair({"kind": "gpt3", "optimizer": opt} | inner, codes, args.repeats, args.timeout_s)
            for name, rs in runs.items():
                last = rs[-1]
                witness = ""
                if "witness" in last:
                    witness = f"; uniform baseline finds {plan_text({'plan': last['witness']})} <- solver misses a plan"
                print(f"{opt:12s} {name:4s} {_s(med(rs, 'plan_s'), 7)} {_s(med(rs, 'cpu_s'), 7)} {sum(r.get('runs', 0) for r in rs):4d} "
                      f"{statistics.mean(r['load'] for r in rs):4.1f}  {plan_text(last)}{witness}")

    print()
    parts = []
    if not args.no_base:
        for key in ("wall", "cpu"):
            pairs = [(m, n, f[f"new_{key}"] / f[f"old_{key}"]) for m, n, f in figures if f[f"new_{key}"] and f[f"old_{key}"]]
            if pairs:
                worst = max(pairs, key=lambda x: x[2])
                over = [f"{m} N={n} {r:.2f}x" for m, n, r in pairs if r > TARGET_SLOWDOWN]
                parts.append(f"new/old {key} (same run): median {statistics.median(r for *_, r in pairs):.2f}x, "
                             f"max {worst[2]:.2f}x ({worst[0]} N={worst[1]}); over {TARGET_SLOWDOWN:.0f}x: "
                             f"{', '.join(over) if over else 'none'}")
    drift = [f["old_wall"] / f["recorded"] for _, _, f in figures if f["old_wall"] and f["recorded"]]
    if drift:
        parts.append(f"old wall now / its 12-02 figure (same code, this machine's state): median "
                     f"{statistics.median(drift):.2f}x, range {min(drift):.2f}-{max(drift):.2f}x")
    rec = [(m, n, f["new_wall"] / f["recorded"]) for m, n, f in figures if f["new_wall"] and f["recorded"]]
    if rec:
        worst = max(rec, key=lambda x: x[2])
        over = [f"{m} N={n} {r:.2f}x" for m, n, r in rec if r > TARGET_SLOWDOWN]
        parts.append(f"new wall / 12-02 figure: max {worst[2]:.2f}x ({worst[0]} N={worst[1]}); over "
                     f"{TARGET_SLOWDOWN:.0f}x: {', '.join(over) if over else 'none'}")
    for key in ("cpu", "wall"):
        side = [(m, n, f[f"pd_{key}_ratio"]) for m, n, f in figures if f[f"pd_{key}_ratio"] is not None]
        if side:
            worst = min(side, key=lambda x: x[2])
            met = sum(r >= TARGET_RATIO for *_, r in side)
            parts.append(f"PipeDream / planner plan, whole-process {key}, same run: >= {TARGET_RATIO:.0f}x in {met}/{len(side)} "
                         f"cases; median {statistics.median(r for *_, r in side):.2f}x, min {worst[2]:.2f}x ({worst[0]} N={worst[1]})")
    for opt, runs in gpt3.items():
        t = med(runs["new"], "plan_s")
        parts.append(f"175B/{GPT3_DEVICES} {opt}: new {'-' if t is None else f'{t:.2f} s'} "
                     f"({'no result' if t is None else '<' if t < TARGET_GPT3_S else '>='} {TARGET_GPT3_S:.0f} s)")
    for p in parts:
        print(f"summary: {p}")
    print(f"(load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs: wall times scale with other jobs' load)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
