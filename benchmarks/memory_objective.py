"""The memory (or ME) objective pruned beside its search without pruning, side by side in one
run, process CPU seconds (``time.process_time``, user + sys of this process).

``--objective memory`` chooses the least peak memory among plans within 10% of the fastest (or
within ``--time-budget-ms``). Two searches of the same request:

- ``pruned``: the default: each degree's configurations, and its tighter-cap passes, pruned by
  the time objective's bounds against 1.1 x the fastest time found (or the budget), plans built
  only for candidates within that (:class:`planner.solve.objectives.Budget`);
- ``unpruned``: ``SearchSettings(prune_degrees=False, prune_configs=False)``: every
  configuration solved, every candidate built (the search before; the tests compare with it).

Cases:

- ``default``: ``planner plan --objective memory`` (GPT-3 13B analytic on one 8x A100-80GB
  node, global batch 512);
- ``default-budget``: the same with ``--time-budget-ms 70000``;
- ``gpt3-13b-64``: the shipped ``profiles/gpt3-13b-a100.json`` on 64 A100s (``a100-80gb-x8``
  grown to 8 nodes), global batch 512;
- ``gpt3-175b-64`` (only when named in ``--cases``): the shipped ``profiles/gpt3-175b-a100.json``
  (98 layers: searched over groups, then refined; pruned against the budget widened by
  ``budget_refine_slack``, a heuristic) on 64 A100s, global batch 1536;
- ``resnet-8``: the ResNet-18-shaped graph fixture ``tests/data/graphs/resnet/graph.txt`` (71
  layers: searched over groups, then refined) on 8 V100s, 2 GiB per device, mixed-precision Adam,
  a stage starting at layer 70, GPipe, 1F1B and interleaved 1F1B (``tests/test_objectives.py``'s
  draw 17: the ME objective's builds over groups, :mod:`planner.solve.grouped_builds`);
- ``alexnet-8``: PipeDream's alexnet profile (read from ``../shared/reference/pipedream``) on 8 V100s, 8 GiB
  per device, Adam with fp32 gradients, stages starting at layers 9 and 21 (the case
  ``tests/test_objectives.py`` draws).

``--objective me``: the same cases under the ME objective (the least iteration time x peak memory;
``pruned`` prunes every configuration whose time bound x memory floor exceeds the least product
found, unless it could be the fastest where the index has no reference plan,
:class:`planner.solve.objectives.MeIncumbent`; both find the reference by their own GPipe-only time
search first, :func:`planner.solve.search.me_reference`); the ME index is printed too.

Each search runs ``--repeats`` times per case (rotating: pruned, unpruned, pruned, ...); the
median CPU is printed with the plan's predicted time and peak memory, whether both searches
chose the same plan, and the Pareto front's length of each (the pruned front holds the points
within the budget only).

Run: ``python benchmarks/memory_objective.py [--cases default,...] [--repeats 3] [--objective me]``
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = ("default", "default-budget", "gpt3-13b-64", "resnet-8", "alexnet-8")
MORE = ("gpt3-175b-64",)  # run when named: its search without pruning takes minutes


def _case(name: str, objective: Any) -> tuple[Any, Any, Any] | str:
    """(profile, cluster, request), or why the case cannot run here."""
    from planner.artifacts.cluster import PRESETS
    from planner.artifacts.kinds import Objective, OptimizerKind
    from planner.artifacts.profile import load_profile
    from planner.artifacts.request import PlanRequest
    from planner.profiling.defaults import default_profile_path

    memory = PlanRequest(global_batch=512, objective=objective)
    if objective is not Objective.MEMORY and name == "default-budget":
        return "a time budget is the memory objective's"
    if name == "default":
        return load_profile(default_profile_path()), PRESETS["a100-80gb-x8"], memory
    if name == "default-budget":
        return load_profile(default_profile_path()), PRESETS["a100-80gb-x8"], dataclasses.replace(memory, time_budget_ms=70000.0)
    if name == "gpt3-13b-64":
        return load_profile(ROOT / "profiles" / "gpt3-13b-a100.json"), PRESETS["a100-80gb-x8"].grown_to(64), memory
    if name == "gpt3-175b-64":
        return load_profile(ROOT / "profiles" / "gpt3-175b-a100.json"), PRESETS["a100-80gb-x8"].grown_to(64), \
            dataclasses.replace(memory, global_batch=1536)
    if name == "resnet-8":
        from planner.artifacts.kinds import ScheduleKind
        from planner.profiling.imported.pipedream import import_pipedream

        request = PlanRequest(global_batch=256, memory_cap_bytes=2 * 2**30, fixed_boundaries=(70,),
                              optimizer=OptimizerKind.ADAM_MIXED, objective=objective,
                              schedules=(ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED_1F1B))
        graph = ROOT / "tests" / "data" / "graphs" / "resnet" / "graph.txt"
        return import_pipedream(graph), PRESETS["v100-16gb-2x8"].with_devices(8), request
    if name == "alexnet-8":
        from benchmarks.pipedream_reference import require_profiles

        graph = require_profiles() / "alexnet" / "graph.txt"
        from planner.profiling.imported.pipedream import import_pipedream

        request = PlanRequest(global_batch=4096, memory_cap_bytes=8 * 2**30, fixed_boundaries=(9, 21),
                              optimizer=OptimizerKind.ADAM_MIXED_FP32_GRAD, objective=objective)
        return import_pipedream(graph), PRESETS["v100-16gb-2x8"].with_devices(8), request
    raise SystemExit(f"memory_objective.py: --cases: unknown case {name!r} (known: {', '.join(CASES + MORE)})")


def main(argv: list[str] | None = None) -> int:
    from planner.artifacts.kinds import Objective, SolverKind
    from planner.solve.chain_dp import solve_chain
    from planner.solve.search import search_plan
    from planner.solve.settings import SETTINGS, SearchSettings

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--objective", choices=("memory", "me"), default="memory")
    args = ap.parse_args(argv)
    objective = Objective(args.objective)
    searches = {"pruned": SETTINGS, "unpruned": SearchSettings(prune_degrees=False, prune_configs=False)}
    print(f"objective {objective.value}")
    print("case            search     CPU s (median)  iteration ms  peak GiB  front  same plan  ME index")
    for name in args.cases.split(","):
        case = _case(name, objective)
        if isinstance(case, str):
            print(f"{name:<15} skipped: {case}")
            continue
        profile, cluster, request = case
        cpu: dict[str, list[float]] = {s: [] for s in searches}
        plans: dict[str, Any] = {}
        for _ in range(args.repeats):
            for label, settings in searches.items():
                t0 = time.process_time()
                plans[label] = search_plan(profile, cluster, request, solver=SolverKind.DP, chain_solver=solve_chain,
                                           settings=settings)
                cpu[label].append(time.process_time() - t0)
        a, b = plans["pruned"], plans["unpruned"]
        same = (a.layout, a.schedule, a.microbatch_size, a.stages, a.predicted) == (
            b.layout, b.schedule, b.microbatch_size, b.stages, b.predicted)
        for label, p in plans.items():
            print(f"{name:<15} {label:<10} {statistics.median(cpu[label]):14.2f}  {p.predicted.iteration_ms:12.1f}  "
                  f"{p.predicted.peak_memory_bytes / 2**30:8.2f}  {len(p.pareto):5d}  {'yes' if same else 'NO':<9}  "
                  f"{p.predicted.me_index:.4f}")
        ratio = statistics.median(cpu["unpruned"]) / statistics.median(cpu["pruned"])
        print(f"{name:<15} unpruned / pruned CPU: {ratio:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
