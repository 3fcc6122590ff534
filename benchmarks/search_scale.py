"""Search at scale (issue 24): the pruned outer search beside the searches it replaces, side by
side in one run, process CPU seconds (``time.process_time``, user + sys of this process).

Three searches of the same request:

- ``pruned``: the default (:func:`planner.solve.search.pruned_degrees`): every tensor- x
  context-parallel degree's configurations visited in one order by lower bound, against one
  incumbent;
- ``per-degree``: ``SearchSettings(prune_degrees=False)``, the search before issue 24: each
  degree on its own (every cp = 1 degree in full, pruning only against its own best), cp > 1
  against the best cp = 1 plan;
- ``exhaustive``: ``SearchSettings(prune_degrees=False, prune_configs=False)``: every
  configuration of every degree solved (the reference the tests compare with; on the large
  cases tens of thousands of configurations over ~40 degrees, not run here, so only where
  ``--exhaustive`` names the case).

Cases, every axis searched (tensor t, context cp, pipeline P, data D, ZeRO 0-3, micro-batch,
GPipe / 1F1B / interleaved 1F1B with 2-4 chunks per rank, the default request's schedules):

- ``default``: ``planner plan`` with no arguments (GPT-3 13B analytic on one 8x A100-80GB
  node, global batch 512);
- ``gpt3-175b``: ``gpt3_profile("gpt3-175b", "a100-80gb")`` on ``a100-80gb-x8`` grown to
  128 nodes (1,024 GPUs), global batch 1536 (as ``benchmarks/solver_speed.py``);
- ``llama-405b``: a Llama-3.1-405B-shaped config (126 layers, hidden 16384, 128 heads, 8
  key/value heads, intermediate 53248, vocabulary 128256, sequence 8192) through
  :func:`planner.profiling.analytic.llama.llama_profile` on ``h100-80gb-x8`` grown to 2,048
  nodes (16,384 GPUs), global batch 2048 sequences.

Each search runs ``--repeats`` times per case (rotating the searches: pruned, per-degree,
[exhaustive], pruned, ...), and the median CPU is printed with the plan each finds (t x cp x P
x D, chunks per rank v, micro-batch b, schedule, ZeRO stage, predicted iteration ms) and
whether it is the pruned search's plan. A search over ``--timeout-s`` of CPU is reported as
such (it runs in a child process, killed at the limit).

Run: ``python benchmarks/search_scale.py [--cases default,gpt3-175b,llama-405b] [--repeats 1]
[--no-per-degree CASE,...] [--exhaustive CASE,...] [--timeout-s 600]``
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

CASES = ("default", "gpt3-175b", "llama-405b")
SEARCHES = ("pruned", "per-degree", "exhaustive")
LLAMA_405B = {
    "model_type": "llama", "num_hidden_layers": 126, "hidden_size": 16384, "num_attention_heads": 128,
    "num_key_value_heads": 8, "intermediate_size": 53248, "vocab_size": 128256, "max_position_embeddings": 8192,
}


def _case(name: str) -> tuple[Any, Any, Any]:
    import dataclasses

    from planner.artifacts.cluster import PRESETS
    from planner.artifacts.request import PlanRequest

    if name == "default":
        from planner.profiling.defaults import DEFAULT_GLOBAL_BATCH, default_profile

        return default_profile(), PRESETS["a100-80gb-x8"], PlanRequest(global_batch=DEFAULT_GLOBAL_BATCH)
    if name == "gpt3-175b":
        from planner.profiling.analytic.gpt import gpt3_profile

        base = PRESETS["a100-80gb-x8"]
        return (gpt3_profile("gpt3-175b", "a100-80gb"), dataclasses.replace(base, num_nodes=128),
                PlanRequest(global_batch=1536))
    from planner.profiling.analytic.llama import llama_profile

    base = PRESETS["h100-80gb-x8"]
    return (llama_profile(LLAMA_405B, seq=8192, device_preset="h100-80gb", model="llama-3.1-405b-shape"),
            dataclasses.replace(base, num_nodes=2048), PlanRequest(global_batch=2048))


def _settings(search: str) -> Any:
    from planner.solve.settings import SearchSettings

    return {
        "pruned": SearchSettings(),
        "per-degree": SearchSettings(prune_degrees=False),
        "exhaustive": SearchSettings(prune_degrees=False, prune_configs=False),
    }[search]


def _run(case: str, search: str, out: Any) -> None:
    """In a child: build the case (not timed), search it, send back CPU seconds and the plan."""
    from planner.artifacts.kinds import SolverKind
    from planner.solve.chain_dp import solve_chain
    from planner.solve.search import search_plan

    profile, cluster, request = _case(case)
    c0 = time.process_time()
    p = search_plan(profile, cluster, request, solver=SolverKind.DP, chain_solver=solve_chain,
                    settings=_settings(search))
    cpu = time.process_time() - c0
    lay = p.layout
    out.send({
        "cpu_s": cpu,
        "plan": f"{lay.tp_degree}x{lay.cp_degree}x{lay.pipeline_size}x{lay.dp_degree} v{lay.virtual_stages_per_rank} "
                f"b{p.microbatch_size} {p.schedule.value} ZeRO {int(lay.zero)}",
        "ms": p.predicted.iteration_ms,
        "key": [lay.tp_degree, lay.cp_degree, lay.pipeline_size, lay.dp_degree, lay.virtual_stages_per_rank,
                p.microbatch_size, p.schedule.value, int(lay.zero), [s.layer_start for s in p.stages],
                [list(s.recompute) for s in p.stages], p.predicted.iteration_ms],
        "pareto": len(p.pareto),
    })


def run_one(case: str, search: str, timeout_s: float) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_run, args=(case, search, send))
    proc.start()
    if recv.poll(timeout_s):
        result: dict[str, Any] = recv.recv()
        proc.join()
        return result
    proc.kill()
    proc.join()
    return {"cpu_s": float("inf"), "plan": f"(over {timeout_s:.0f} s, stopped)", "ms": float("nan"), "key": None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--no-per-degree", default="", help="cases whose per-degree search is not run")
    ap.add_argument("--exhaustive", default="", help="cases whose exhaustive search is run too")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="wall limit of one search (a child process)")
    ap.add_argument("--json", default="", help="also write the results here")
    args = ap.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        print(f"search_scale: unknown case(s) {unknown}; known: {', '.join(CASES)}", file=sys.stderr)
        return 2
    skip = set(filter(None, args.no_per_degree.split(",")))
    exhaustive = set(filter(None, args.exhaustive.split(",")))
    print(f"search_scale: {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} CPUs, load "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; process CPU s of the search alone (median of "
          f"{args.repeats}); plan = t x cp x P x D, chunks per rank v, micro-batch b, schedule, ZeRO")
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for case in cases:
        searches = [s for s in SEARCHES if (s != "per-degree" or case not in skip)
                    and (s != "exhaustive" or case in exhaustive)]
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in searches}
        for _ in range(args.repeats):
            for s in searches:
                runs[s].append(run_one(case, s, args.timeout_s))
        results[case] = runs
        print(f"\n{case}")
        print(f"  {'search':<11} {'CPU s':>8} {'vs pruned':>9}  {'plan':<44} {'iteration ms':>13}  same plan")
        pruned_cpu = statistics.median(r["cpu_s"] for r in runs["pruned"])
        pruned_key = runs["pruned"][0]["key"]
        for s in searches:
            cpu = statistics.median(r["cpu_s"] for r in runs[s])
            r0 = runs[s][0]
            same = "-" if s == "pruned" else ("yes" if r0["key"] == pruned_key else ("n/a" if r0["key"] is None else "NO"))
            ratio = f"{cpu / pruned_cpu:8.1f}x" if cpu < float("inf") else "        -"
            print(f"  {s:<11} {cpu:8.2f} {ratio}  {r0['plan']:<44} {r0['ms']:13.2f}  {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
