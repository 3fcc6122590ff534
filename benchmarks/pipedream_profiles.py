"""What needs PipeDream's own profiles: the checks that were tests while the profiles were copied
into the repository, run here on the 14 ``graph.txt`` files read from ``../shared/reference/
pipedream`` (PipeDream's README there: data only, read at run time, never copied). The suite checks
the same code on graphs the project writes (``tests/graph_fixtures.py``).

Printed checks, each ``ok`` or ``FAIL``, and the exit status 1 on any failure:

1. ``import``: each profile's node and edge counts and batch size are those of the reference
   README's table; the import is deterministic (canonical JSON twice the same); layer 0 is the
   merged, zero-cost inputs; every node's times and sizes come across divided by the batch.
2. ``recorded``: PipeDream's optimizer's recorded choices
   (``benchmarks/pipedream_optimizer_choices.json``, written by ``benchmarks/pipedream_replication.py
   --reproduce --record``) against our reimplementation on the same profile: the same stages and
   copies, or a tie (``benchmarks/pipedream_reference.py``: equal objectives within 1e-9).
3. ``drawn``: cases drawn on alexnet and resnet18 where the planner once went wrong: our plan at
   least as fast as PipeDream's replicated split priced by our simulator (8 V100s); the
   ``pipedream`` baseline planning the optimizer's stages and copies (8 V100s); the memory
   objective's 10% counted from the replicated fastest plan (8 V100s, stages at 9 and 21);
   the pruned memory search keeping what refinement brings within its budget on resnet18 (71
   layers, grouped); the pruned ME search choosing the unpruned plan (alexnet on 4 V100s, 1 GiB).

Run: ``python benchmarks/pipedream_profiles.py [--reference ../shared/reference/pipedream] [--quick]``
(``--quick``: the import and recorded checks only). Without the reference folder it exits with one
line saying where it looked.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.pipedream_reference import REFERENCE, judge, ours_of, read_recorded, require_profiles
from planner.artifacts.cluster import PRESETS
from planner.artifacts.codec import dumps_canonical
from planner.artifacts.kinds import Objective, OptimizerKind, ScheduleKind, SolverKind
from planner.artifacts.layout import Layout
from planner.artifacts.profile import profile_to_json
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.profiling.imported.pipedream import import_pipedream, infer_batch_size, parse_graph
from planner.solve import plan

# batch sizes stated in the reference README (nasnetalarge's is not; gnmt's is its LSTM's h_n over 1024 x 4 bytes)
README_BATCH = {
    "alexnet": 256, "resnet18": 256, "squeezenet1_0": 256,
    "vgg16": 128, "resnet50": 128, "resnext50": 128, "inception_v3": 128, "nasnetamobile": 128,
    "densenet121": 64, "resnet101": 64, "resnext101": 64, "gnmt": 32,
}
V100 = PRESETS["v100-16gb-2x8"]


def readme_table(reference: Path) -> dict[str, tuple[int, int]]:
    rows = re.findall(r"^\| (\w+) \| (\d+) \| (\d+) \|$", (reference / "README.md").read_text(), re.M)
    return {name: (int(n), int(e)) for name, n, e in rows}


def check_import(model: str, reference: Path, counts: tuple[int, int]) -> str | None:
    """None when the import is right, else what is wrong."""
    path = reference / model / "graph.txt"
    graph = parse_graph(path)
    profile = import_pipedream(path)
    batch = profile.microbatch_sizes[0]
    if graph.counts() != counts or (profile.metadata["raw_nodes"], profile.metadata["raw_edges"]) != counts:
        return f"counts {graph.counts()} against the README's {counts}"
    if model in README_BATCH and infer_batch_size(graph) != README_BATCH[model]:
        return f"batch {infer_batch_size(graph)} against the README's {README_BATCH[model]}"
    if profile.layers[0].name != "input" or profile.layers[0].fwd_ms(batch) or profile.layers[0].bwd_ms(batch):
        return "layer 0 is not the zero-cost inputs"
    by_id = {n.node_id: n for n in graph.nodes}
    for layer in profile.layers[1:]:
        node = by_id[layer.name]
        if not (math.isclose(layer.fwd_ms(batch), node.fwd_ms, rel_tol=1e-6, abs_tol=1e-9)
                and math.isclose(layer.output_bytes_per_sample * batch, node.activation_bytes, rel_tol=1e-9)
                and layer.param_bytes == round(node.param_bytes)):
            return f"layer {layer.name} differs from its node"
    if dumps_canonical(profile_to_json(profile)) != dumps_canonical(profile_to_json(import_pipedream(path))):
        return "two imports differ"
    return None


def drawn_checks(reference: Path) -> dict[str, Callable[[], bool]]:
    """The drawn cases (module docstring), each a check returning whether it holds."""
    from planner.schedule import held_counts
    from planner.solve.build import rebuild_plan
    from planner.solve.chain_dp import solve_chain
    from planner.solve.pipedream_baseline import choose
    from planner.solve.proposals import stage_recompute
    from planner.solve.replicated_search import pipedream_split
    from planner.solve.search import search_plan
    from planner.solve.space import Config
    from tests.test_search_pruning import EXHAUSTIVE, PRUNED, _chosen, plan_or_refusal

    alexnet = import_pipedream(reference / "alexnet" / "graph.txt")
    b0 = alexnet.microbatch_sizes[0]

    def replicated_split() -> bool:
        cluster = V100.with_devices(8)
        req = PlanRequest(global_batch=b0 * 24, microbatch_sizes=(b0,))
        cm = CostModel(alexnet, cluster, req.optimizer)
        bounds, reps = pipedream_split(cm, b0, 8)
        layout = Layout(num_stages=len(reps), stage_replicas=reps)
        config = Config(layout, b0, 24, ScheduleKind.ONE_F_ONE_B)
        stops = list(bounds[1:]) + [cm.num_layers]
        held = held_counts(config.schedule, config.layout, config.num_microbatches)
        rc = [stage_recompute(cm, a, z, b0, k, 0.9 * cluster.device_memory_bytes, config, s)[0]
              for s, (a, z, k) in enumerate(zip(bounds, stops, tuple(h.inflight for h in held)))]
        theirs = rebuild_plan(alexnet, cluster, req, layout=layout, boundaries=bounds, recompute=rc, microbatch_size=b0,
                              schedule=ScheduleKind.ONE_F_ONE_B, solver=SolverKind.GIVEN)
        return len(set(reps)) > 1 and plan(alexnet, cluster, req).predicted.iteration_ms <= \
            theirs.predicted.iteration_ms * (1 + 1e-9)

    def baseline() -> bool:
        cluster = V100.with_devices(8)
        split = choose(alexnet, cluster, PlanRequest(), CostModel(alexnet, cluster), 8)
        if split is None or len(split.replicas) < 2:
            return False
        got = plan(alexnet, cluster, PlanRequest(global_batch=b0 * math.lcm(*split.replicas), solver=SolverKind.PIPEDREAM))
        return tuple(s.layer_start for s in got.stages) == split.starts and got.layout.stage_replicas == split.replicas

    def memory_objective() -> bool:
        request = PlanRequest(global_batch=4096, memory_cap_bytes=8 * 2**30, fixed_boundaries=(9, 21),
                              optimizer=OptimizerKind.ADAM_MIXED_FP32_GRAD)
        fastest = plan(alexnet, V100.with_devices(8), request)
        lean = plan(alexnet, V100.with_devices(8), dataclasses.replace(request, objective=Objective.MEMORY))
        return bool(fastest.layout.stage_replicas) and lean.predicted.iteration_ms <= fastest.predicted.iteration_ms * 1.10 \
            and lean.predicted.peak_memory_bytes < fastest.predicted.peak_memory_bytes

    def grouped_refinement() -> bool:
        profile = import_pipedream(reference / "resnet18" / "graph.txt")
        request = PlanRequest(global_batch=2048, objective=Objective.MEMORY, memory_cap_bytes=2 * 2**30,
                              optimizer=OptimizerKind.ADAM_MIXED,
                              schedules=(ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED_1F1B))
        unpruned, pruned, narrow = (
            search_plan(profile, V100.with_devices(8), request, solver=SolverKind.DP, chain_solver=solve_chain, settings=s)
            for s in (EXHAUSTIVE, PRUNED, dataclasses.replace(PRUNED, budget_refine_slack=0.05)))
        return _chosen(pruned) == _chosen(unpruned) and pruned.predicted == unpruned.predicted \
            and unpruned.layout.virtual_stages_per_rank == 2 \
            and narrow.predicted.peak_memory_bytes > 1.05 * unpruned.predicted.peak_memory_bytes

    def me_pruning() -> bool:
        request = PlanRequest(global_batch=256, memory_cap_bytes=2**30, fixed_boundaries=(4,), objective=Objective.ME,
                              optimizer=OptimizerKind.ADAM_MIXED_FP32_GRAD)
        got = [plan_or_refusal(alexnet, V100.with_devices(4), request, s) for s in (EXHAUSTIVE, PRUNED)]
        return all(not isinstance(g, tuple) for g in got) and got[0].predicted == got[1].predicted  # type: ignore[union-attr]

    return {"ours >= PipeDream's replicated split (alexnet, 8)": replicated_split,
            "pipedream baseline plans the optimizer's choice (alexnet, 8)": baseline,
            "memory objective counts replication (alexnet, 8)": memory_objective,
            "pruned memory search keeps the refined plan (resnet18, 8)": grouped_refinement,
            "pruned ME search = unpruned (alexnet, 4)": me_pruning}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--reference", type=Path, default=REFERENCE, help="PipeDream's profiles (and its optimizer's source)")
    ap.add_argument("--quick", action="store_true", help="the import and recorded checks only")
    args = ap.parse_args()
    reference = require_profiles(args.reference)
    failed = 0
    table = readme_table(reference)
    bad = {m: why for m, counts in sorted(table.items()) if (why := check_import(m, reference, counts))}
    for model, why in bad.items():
        print(f"  FAIL import {model}: {why}")
    print(f"import: {len(table) - len(bad)}/{len(table)} profiles as the README states them")
    failed += len(bad) + (len(table) != 14)
    recorded = read_recorded()
    verdicts = {}
    for (model, n), real in sorted(recorded.items()):
        graph, opt_args, states, ours = ours_of(model, n, reference)
        verdicts[(model, n)] = judge(graph, opt_args, states, ours, real).verdict
        print(f"  {model:>9} N={n:<2} {verdicts[(model, n)]}")
    same = sum(v in ("agree", "tie") for v in verdicts.values())
    print(f"recorded: matches PipeDream's optimizer on {same}/{len(verdicts)} "
          f"({sum(v == 'agree' for v in verdicts.values())} agree, {sum(v == 'tie' for v in verdicts.values())} tie)")
    failed += len(verdicts) - same
    if not args.quick:
        for name, check in drawn_checks(reference).items():
            start = time.process_time()
            ok = check()
            failed += not ok
            print(f"drawn: {'ok  ' if ok else 'FAIL'} {name} ({time.process_time() - start:.1f} s CPU)")
    print("all checks hold" if not failed else f"{failed} check(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
