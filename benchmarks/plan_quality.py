"""Plan quality: the simulated iteration time of our plan (solver ``dp``) against every baseline
(``uniform``, ``parameters``, ``time-balanced``, ``pipedream``, ``data-parallel``) and against the
lower bound, on the same profile, cluster and request.

Profiles and settings (``default`` request otherwise: time objective, GPipe and 1F1B, recompute
allowed, 10% memory headroom, Adam with mixed precision):

- PipeDream's published V100 profiles (imported from ``--reference``) on the ``v100-16gb-2x8``
  preset grown to N devices (8 per server), global batch ``b0 x 8`` (``b0``: the minibatch the
  profile was measured at, so G is what one 8-GPU server trains per step in PipeDream's setting);
- the shipped measured zoo CPU profiles (``profiles/zoo-*-cpu.json``) on ``local-cpu`` grown to N
  processes (4 per node), global batch ``8 x 8 = 64`` (8: the largest micro-batch size profiled);
- the shipped analytic GPT-3 13B / 175B profiles on ``a100-80gb-x8`` / ``h100-80gb-x8`` grown to
  N devices, GPT-3's global batch of 1536 sequences.

For N in {4, 8, 16, 32, 64}. The global batch is fixed per profile (strong scaling: more devices,
fewer samples each, so communication and pipelining matter more as N grows); every G above is
divisible by every D <= 64. ``--scaling weak`` instead uses ``b0 x N`` and ``8 x N`` (PipeDream's
weak scaling, as in ``solver_speed.py``), where pure data parallelism wins almost every case
and all solvers tie. A case where every solver (ours and all baselines) is infeasible
is skipped and listed. Targets: ours <= every baseline in 100% of cases (a baseline that is
infeasible where ours fits counts as beaten; ours infeasible where a baseline fits is a
violation), and median lower bound / ours >= 0.90, where the lower bound is
``plan.predicted.lower_bound_ms`` of our plan.

Cases run one at a time in a process pool of one worker (the machine has 2 shared cores),
each with a timeout (``--timeout-s``); a case that times out is reported as such.

Run: ``python benchmarks/plan_quality.py [--quick] [--reference ../shared/reference/pipedream]
[--devices 4,8,16,32,64] [--profiles alexnet,zoo-gpt-cpu,...] [--timeout-s 240]``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from planner.solve import BASELINES  # noqa: E402

PIPEDREAM = ("alexnet", "vgg16", "squeezenet1_0", "resnet18", "resnet50", "gnmt", "gnmt_large")
SHIPPED = (
    "zoo-gpt-cpu", "zoo-gpt2-cpu", "zoo-bert-cpu", "zoo-vgg-cpu", "zoo-resnet-cpu",
    "gpt3-13b-a100", "gpt3-13b-h100", "gpt3-175b-a100", "gpt3-175b-h100",
)
QUICK_PROFILES = (
    "alexnet", "vgg16", "resnet18", "gnmt", "zoo-gpt-cpu", "zoo-bert-cpu", "zoo-vgg-cpu", "zoo-resnet-cpu",
    "gpt3-13b-a100", "gpt3-13b-h100",
)
QUICK_DEVICES = (4, 16, 64)
SOLVERS = BASELINES + ("dp",)
ZOO_BATCH_PER_DEVICE = 8
STRONG_DEVICES = 8  # strong scaling: the global batch of an 8-device server, whatever N
GPT3_GLOBAL_BATCH = 1536  # Brown et al. 2020, table 2.1
REL_TOL = 1e-9  # float noise allowed before "ours > baseline" counts as a violation
TARGET_BOUND_RATIO = 0.90


def setting(name: str, n: int, reference: Path, scaling: str = "strong"):
    """(profile, cluster, global batch) of one case."""
    import dataclasses

    from planner.artifacts.cluster import PRESETS
    from planner.artifacts.profile import load_profile

    per = n if scaling == "weak" else STRONG_DEVICES
    if name in PIPEDREAM:
        from planner.importers.pipedream import import_pipedream

        profile = import_pipedream(reference / name / "graph.txt")
        base, batch = PRESETS["v100-16gb-2x8"], profile.microbatch_sizes[0] * per
    else:
        profile = load_profile(REPO / "profiles" / f"{name}.json")
        if name.endswith("-cpu"):
            base, batch = PRESETS["local-cpu"], ZOO_BATCH_PER_DEVICE * per
        else:
            base, batch = PRESETS["a100-80gb-x8" if name.endswith("a100") else "h100-80gb-x8"], GPT3_GLOBAL_BATCH
    nodes = max(base.num_nodes, -(-n // base.devices_per_node))
    return profile, dataclasses.replace(base, num_nodes=nodes).with_devices(n), batch


def run_case(name: str, n: int, reference: str, scaling: str = "strong") -> dict:
    """Every solver on one case (runs in the pool's worker)."""
    from planner.artifacts.request import PlanRequest
    from planner.errors import PlannerError
    from planner.solve import plan

    profile, cluster, batch = setting(name, n, Path(reference), scaling)
    out: dict = {"global_batch": batch, "layers": profile.num_layers, "iteration_ms": {}, "seconds": {}}
    for solver in SOLVERS:
        t0 = time.perf_counter()
        try:
            p = plan(profile, cluster, PlanRequest(global_batch=batch, solver=solver))
            out["iteration_ms"][solver] = p.predicted.iteration_ms
            if solver == "dp":
                out["lower_bound_ms"] = p.predicted.lower_bound_ms
                out["num_stages"] = p.num_stages
                out["ours"] = (f"P{p.num_stages}xD{p.dp_degree} b{p.microbatch_size} M{p.num_microbatches} "
                               f"{p.schedule.value} rc{sum(len(s.recompute) for s in p.stages)}")
        except PlannerError as exc:
            out["iteration_ms"][solver] = None
            if solver == "dp":
                out["ours_error"] = str(exc).splitlines()[0]
        out["seconds"][solver] = time.perf_counter() - t0
    return out


def _cell(ms: float | None) -> str:
    if ms is None:
        return "infeas."
    return f"{ms:.5g}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"{len(QUICK_PROFILES)} profiles x N in {QUICK_DEVICES}")
    ap.add_argument("--reference", type=Path, default=REPO.parent / "shared" / "reference" / "pipedream")
    ap.add_argument("--devices", help="comma-separated device counts (default 4,8,16,32,64)")
    ap.add_argument("--profiles", help="comma-separated profile names (default: all)")
    ap.add_argument("--scaling", choices=["strong", "weak"], default="strong",
                    help="fixed global batch per profile (strong) or one growing with N (weak)")
    ap.add_argument("--timeout-s", type=float, default=240.0, help="per case (all six solvers)")
    args = ap.parse_args()
    profiles = (args.profiles.split(",") if args.profiles else list(QUICK_PROFILES if args.quick else PIPEDREAM + SHIPPED))
    devices = [int(d) for d in args.devices.split(",")] if args.devices else list(QUICK_DEVICES if args.quick else (4, 8, 16, 32, 64))

    print(f"plan_quality: {time.strftime('%Y-%m-%d %H:%M')}; {args.scaling} scaling; simulated iteration ms per solver; "
          f"LB/ours = lower bound / ours; timeout {args.timeout_s:.0f} s per case; load average {os.getloadavg()[0]:.1f}")
    cols = " ".join(f"{s[:13]:>13s}" for s in SOLVERS[:-1])
    print(f"{'profile':15s} {'N':>3s} {'G':>5s} {cols} {'ours (dp)':>13s} {'LB/ours':>7s} {'ok':>3s} {'dp s':>6s} {'all s':>6s}  our plan")
    ctx = mp.get_context("fork")
    pool = ctx.Pool(1)
    skipped, timeouts, violations, ratios, compared = [], [], [], [], 0
    piped: list[float] = []  # LB/ours over cases where our plan is a real pipeline (P > 1)
    t_start = time.perf_counter()
    for name in profiles:
        for n in devices:
            job = pool.apply_async(run_case, (name, n, str(args.reference), args.scaling))
            try:
                res = job.get(timeout=args.timeout_s)
            except mp.TimeoutError:
                pool.terminate()
                pool = ctx.Pool(1)
                timeouts.append(f"{name} N={n}")
                print(f"{name:15s} {n:3d} TIMEOUT > {args.timeout_s:.0f} s (all six solvers together)", flush=True)
                continue
            except Exception as exc:  # noqa: BLE001  (a crash in one case is reported, the rest still run)
                timeouts.append(f"{name} N={n} (crash: {type(exc).__name__}: {exc})")
                print(f"{name:15s} {n:3d} CRASH {type(exc).__name__}: {exc}", flush=True)
                continue
            ms = res["iteration_ms"]
            if all(v is None for v in ms.values()):
                skipped.append(f"{name} N={n}")
                continue
            ours = ms["dp"]
            bad = []
            for b in BASELINES:
                if ms[b] is None:
                    continue
                if ours is None:
                    bad.append((b, float("inf")))
                elif ours > ms[b] * (1 + REL_TOL):
                    bad.append((b, (ours - ms[b]) / ms[b]))
            compared += 1
            violations += [(name, n, b, margin, ours, ms[b]) for b, margin in bad]
            ratio = res["lower_bound_ms"] / ours if ours is not None else None
            if ratio is not None:
                ratios.append(ratio)
                if res["num_stages"] > 1:
                    piped.append(ratio)
            cells = " ".join(f"{_cell(ms[s]):>13s}" for s in BASELINES)
            print(f"{name:15s} {n:3d} {res['global_batch']:5d} {cells} {_cell(ours):>13s} "
                  f"{'' if ratio is None else f'{ratio:.3f}':>7s} {'no' if bad else 'yes':>3s} "
                  f"{res['seconds']['dp']:6.1f} {sum(res['seconds'].values()):6.1f}  {res.get('ours', res.get('ours_error', ''))}",
                  flush=True)
    pool.close()
    pool.join()

    print()
    if skipped:
        print(f"skipped (infeasible for every solver): {', '.join(skipped)}")
    if timeouts:
        print(f"timed out / crashed: {', '.join(timeouts)}")
    cases_ok = compared - len({(v[0], v[1]) for v in violations})
    print(f"ours <= every baseline: {cases_ok}/{compared} cases")
    for name, n, b, margin, ours, base in violations:
        if ours is None:
            print(f"  violation: {name} N={n}: ours infeasible, {b} finds {_cell(base)} ms")
        else:
            print(f"  violation: {name} N={n}: ours {_cell(ours)} ms > {b} {_cell(base)} ms (+{margin * 100:.4f}%)")
    med = statistics.median(ratios) if ratios else float("nan")
    print(f"summary: ours <= every baseline in {cases_ok}/{compared} cases "
          f"({100 * cases_ok / max(compared, 1):.0f}%, target 100%); median LB/ours {med:.3f} over {len(ratios)} cases "
          f"(min {min(ratios, default=float('nan')):.3f}; target >= {TARGET_BOUND_RATIO}); "
          f"{len(skipped)} skipped as infeasible, {len(timeouts)} timed out; total {time.perf_counter() - t_start:.0f} s")
    if piped:
        print(f"         where our plan pipelines (P > 1): median LB/ours {statistics.median(piped):.3f} over {len(piped)} cases "
              f"(min {min(piped):.3f}); where it is pure data parallel the bound is tight by construction")
    return 0


if __name__ == "__main__":
    sys.exit(main())
