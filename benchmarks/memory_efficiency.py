"""Memory efficiency: the ME index of our plans against GPipe without recomputation, on cases
where GPipe without recomputation does not fit in device memory.

ME index (the seed, TPDS 35(4) 2024; ``planner.simulation.predict.me_index``):
``(throughput / reference throughput) / (peak memory / reference peak memory)``; with the same
global batch, throughput ratio = reference iteration time / our iteration time. The seed reports
4.18x (+80% throughput at -57% memory).

Per case (profile, cluster, global batch, all devices of the cluster):

1. premise: the fastest GPipe plan without recomputation under the real cap (device memory
   less 10% headroom; ``PlanRequest(schedules=(GPIPE,), recompute=False)``) -- must be
   infeasible, else the case is flagged "not memory-capped";
2. reference R_fast: the fastest GPipe plan without recomputation once the memory cap is lifted
   (``memory_cap_bytes=2**60``: as if each device had as much memory as GPipe needs), over the
   same search space (every P x D = N, micro-batch size, stage split); its peak memory is
   above the real cap. This is "the fastest GPipe plan that fits, given more memory";
3. reference R_mem: the GPipe plan without recomputation with the least peak memory, cap
   lifted (objective ``memory``, no time budget): the most memory-frugal GPipe could be,
   whatever the time -- a stricter reference for us on the memory axis;
4. ours, under the real cap, with the default request (GPipe and 1F1B, recomputation allowed),
   objective ``time`` and objective ``me``; ME of each against R_fast and R_mem.

All times and memories are the planner's predictions (event simulator, memory model), not
measurements. Note: PipeDream's and the analytic profiles have time linear in the micro-batch
size with no per-micro-batch overhead, so small micro-batches cost no compute efficiency here.

Run: ``python benchmarks/memory_efficiency.py [--reference ../shared/reference/pipedream]``
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from planner.artifacts.cluster import PRESETS, Cluster
from planner.artifacts.errors import InfeasibleError
from planner.artifacts.kinds import Objective, ScheduleKind
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile
from planner.artifacts.request import PlanRequest
from planner.simulation.predict import me_index
from planner.solve import plan

SEED_ME = 4.18
UNCAPPED = 2**60
GIB = 1024**3


@dataclass(frozen=True)
class Case:
    name: str
    profile: Callable[[Path], Profile]
    cluster: Cluster
    global_batch: int
    why: str


def _pipedream(model: str) -> Callable[[Path], Profile]:
    def load(reference: Path) -> Profile:
        from benchmarks.pipedream_reference import require_profiles
        from planner.profiling.imported.pipedream import import_pipedream

        return import_pipedream(require_profiles(reference) / model / "graph.txt")

    return load


def _gpt3(size: str) -> Callable[[Path], Profile]:
    def load(reference: Path) -> Profile:
        from planner.profiling.analytic.gpt import gpt3_profile

        return gpt3_profile(size, "a100-80gb")

    return load


CASES = (
    Case("vgg16 8xV100-16GB G=1024", _pipedream("vgg16"), PRESETS["v100-16gb-2x8"].with_devices(8), 1024,
         "PipeDream's setting: profile minibatch 128 x 8 workers"),
    Case("resnet50 8xV100-16GB G=1024", _pipedream("resnet50"), PRESETS["v100-16gb-2x8"].with_devices(8), 1024,
         "PipeDream's setting: profile minibatch 128 x 8 workers"),
    Case("gpt3-1.3b 8xA100-80GB G=64", _gpt3("gpt3-1.3b"), PRESETS["a100-80gb-x8"], 64,
         "64 sequences of 2048 tokens: GPipe needs ~1.4x the device"),
    Case("gpt3-1.3b 8xA100-80GB G=128", _gpt3("gpt3-1.3b"), PRESETS["a100-80gb-x8"], 128,
         "128 sequences of 2048 tokens: GPipe needs ~2.5x the device"),
    Case("gpt3-13b 16xA100-80GB G=32", _gpt3("gpt3-13b"), PRESETS["a100-80gb-2x8"], 32,
         "under the cap, model state (13B x 16 B) rules out P = 1 for ours; the lifted-cap references may use it"),
    Case("gpt3-13b 16xA100-80GB G=64", _gpt3("gpt3-13b"), PRESETS["a100-80gb-2x8"], 64,
         "under the cap, model state (13B x 16 B) rules out P = 1 for ours; the lifted-cap references may use it"),
)

GPIPE = dict(schedules=(ScheduleKind.GPIPE,), recompute=False)


def describe(p: Plan) -> str:
    rc = sum(len(s.recompute) for s in p.stages)
    return (f"P{p.layout.num_stages}xD{p.layout.dp_degree} b{p.microbatch_size} M{p.num_microbatches} {p.schedule.value} rc{rc}: "
            f"{p.predicted.iteration_ms:.1f} ms, peak {p.predicted.peak_memory_bytes / GIB:.2f} GiB")


def run(case: Case, reference: Path) -> dict[str, float]:
    profile = case.profile(reference)
    G = case.global_batch
    cap_gib = case.cluster.device_memory_bytes * 0.9 / GIB
    print(f"\n{case.name} ({profile.num_layers} layers; {case.why}); cap {cap_gib:.2f} GiB per device")
    t0 = time.perf_counter()
    try:
        fits = plan(profile, case.cluster, PlanRequest(global_batch=G, **GPIPE))
        print(f"  premise FAILS, GPipe w/o recompute fits under the cap: {describe(fits)}  (not memory-capped)")
    except InfeasibleError:
        print("  premise: GPipe without recomputation does not fit under the cap (infeasible)")
    r_fast = plan(profile, case.cluster, PlanRequest(global_batch=G, memory_cap_bytes=UNCAPPED, **GPIPE))
    r_mem = plan(profile, case.cluster, PlanRequest(
        global_batch=G, memory_cap_bytes=UNCAPPED, objective=Objective.MEMORY, time_budget_ms=1e300, **GPIPE))
    print(f"  {'R_fast  GPipe no-rc, cap lifted, fastest':44s} {describe(r_fast)}")
    print(f"  {'R_mem   GPipe no-rc, cap lifted, least mem':44s} {describe(r_mem)}")
    out = {}
    for objective in (Objective.TIME, Objective.ME):
        ours = plan(profile, case.cluster, PlanRequest(global_batch=G, objective=objective))
        a, b = me_index(ours, r_fast), me_index(ours, r_mem)
        out[objective.value] = a
        thr = r_fast.predicted.iteration_ms / ours.predicted.iteration_ms
        mem = ours.predicted.peak_memory_bytes / r_fast.predicted.peak_memory_bytes
        print(f"  {'ours    objective ' + objective.value + ', under the cap':44s} {describe(ours)}")
        print(f"  {'':44s} vs R_fast: throughput x{thr:.3f}, memory x{mem:.3f} -> ME {a:.2f}; vs R_mem: ME {b:.2f}")
    print(f"  ({time.perf_counter() - t0:.1f} s)")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", type=Path, default=REPO.parent / "shared" / "reference" / "pipedream", help="PipeDream's profiles")
    ap.add_argument("--cases", help="comma-separated case indices (default: all)")
    args = ap.parse_args()
    cases = [CASES[int(i)] for i in args.cases.split(",")] if args.cases else list(CASES)
    print(f"memory_efficiency: {time.strftime('%Y-%m-%d %H:%M')}; ME = (throughput / ref) / (peak memory / ref); "
          f"seed reports {SEED_ME}x")
    results = {c.name: run(c, args.reference) for c in cases}
    print()
    for name, me in results.items():
        print(f"summary: {name}: ME vs fastest GPipe w/o recompute (cap lifted) = {me['time']:.2f} (objective time), "
              f"{me['me']:.2f} (objective me); seed {SEED_ME}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
