"""PipeDream's replicated split against ours, both priced by our cost model and simulator.

PipeDream's optimizer (Narayanan et al., SOSP'19, sec. 3.1) gives each stage its own number
of copies (micro-batches go round-robin over a stage's copies) and minimises the slowest
stage. ``planner.solve.replicated_search.pipedream_split`` reimplements it on our cost model's
chain. This benchmark takes its split on PipeDream's own vgg16 and alexnet profiles (read from
``--reference``, never copied into the repository) at 8 and 16 V100-16GB (the
``v100-16gb-2x8`` preset grown to N, 8 per server), with free copy counts, and:

1. chooses the global batch ``G = b0 x M``: ``b0`` is the profile's minibatch (PipeDream's
   per-worker setting) and ``M`` the smallest multiple of the lcm of PipeDream's copy counts
   that is >= N, so every stage's copies take the same number of micro-batches;
2. prices PipeDream's split as a plan: micro-batch ``b0``, M micro-batches, 1F1B (PipeDream's
   own schedule), on each stage the least recomputation that fits under the memory cap
   (``planner.solve.proposals.fixed_split`` at each stage's in-flight count), simulated by
   ``planner.solve.build.build_plan``; where no recomputation makes a stage fit (PipeDream's
   own memory check ignores weights and optimizer state and is off by default), it and ours
   are priced with the memory cap lifted as well (like for like), and labelled so;
3. runs our planner (solver ``dp``, default request otherwise: ZeRO and per-stage replication
   searched) on the same ``G``: once with every micro-batch size free, once restricted to
   ``b0``.

It prints both splits (stage layer ranges and copies), both predicted iteration times and
the ratio. Target (the issue): where PipeDream replicates unequally, ours is at least as
fast under our simulator.

Run: ``python benchmarks/pipedream_replication.py [--reference ../shared/reference/pipedream]
[--models vgg16,alexnet] [--devices 8,16]``

``--reproduce`` (issue 24): instead, PipeDream's optimizer itself (a subprocess, unmodified, the
side-by-side flags: one level, 10 GB/s, 16 GB, ``--activation_compression_ratio 1
--use_memory_constraint``) against our reimplementation
(:mod:`planner.solve.pipedream_optimizer`) on the same graph.txt, for every profile
(``--models``, default all 14) at ``--devices`` (default 4,8,16,32): each side's copies per stage,
nodes per stage and objective, and ``agree`` (same stages, copies and objective), ``tie``
(different split, equal objectives within 1e-9 relative, the real split scoring the same under
ours) or ``no``. Ours stops past ``--max-states`` antichain states and the real one is given
``--timeout-s`` (``--hopeless-timeout-s`` where ours stopped: PipeDream's README says its optimizer
does not work on Inception or NASNets). ``--record`` writes the real optimizer's choices to
``benchmarks/pipedream_optimizer_choices.json``, which ``benchmarks/pipedream_profiles.py`` checks our
reimplementation against (without running the optimizer); written by
``--reproduce --models alexnet,vgg16,resnet50 --devices 4,8 --record``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.pipedream_reference import RECORDED, RealChoice, judge, ours_of, run_real, write_recorded
from planner.artifacts.cluster import PRESETS, Cluster
from planner.artifacts.errors import PlannerError
from planner.artifacts.kinds import ScheduleKind, SolverKind
from planner.artifacts.layout import Layout
from planner.artifacts.plan import Plan
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.profiling.imported.pipedream import import_pipedream
from planner.solve import plan
from planner.solve.build import build_plan
from planner.solve.pipedream_baseline import MAX_STATES
from planner.solve.pipedream_optimizer import TooManyStates
from planner.solve.problem import Problem, memory_cap_bytes
from planner.solve.proposals import fixed_split
from planner.solve.replicated_search import pipedream_split
from planner.solve.space import Config

MODELS = ("vgg16", "alexnet")
DEVICES = (8, 16)
REL_TOL = 1e-9


def grown(n: int) -> Cluster:
    """``v100-16gb-2x8`` grown (or cut) to ``n`` devices, 8 per server."""
    base = PRESETS["v100-16gb-2x8"]
    return dataclasses.replace(base, num_nodes=max(base.num_nodes, -(-n // base.devices_per_node))).with_devices(n)


def rounds_for(copies: tuple[int, ...], n: int) -> int:
    """The smallest multiple of lcm(copies) that is >= n."""
    step = math.lcm(*copies)
    return step * -(-n // step)


def price_split(cm: CostModel, request: PlanRequest, starts: tuple[int, ...], copies: tuple[int, ...], b: int) -> Plan | str:
    """PipeDream's split as a plan (micro-batch ``b``, 1F1B, least recompute that fits: the
    planner's own ``fixed_split``), or why not."""
    layout = Layout(num_stages=len(starts), stage_replicas=copies)  # all copies 1: a plain pipeline
    config = Config(layout, b, request.global_batch // b, ScheduleKind.ONE_F_ONE_B)
    cap = memory_cap_bytes(cm.cluster, request)
    cand = fixed_split(cm, config, starts, cap, request.recompute)
    if cand is None:
        return f"a stage does not fit in {cap / 2**30:.2f} GiB per device, even recomputing"
    problem = Problem.of(cm.profile, cm.cluster, request, SolverKind.GIVEN, 0)
    return build_plan(problem, cm, layout=layout, boundaries=starts, recompute=cand.solution.recompute,
                      microbatch_size=b, schedule=ScheduleKind.ONE_F_ONE_B)


def split_text(p: Plan) -> str:
    """Each stage's layers ``[start, stop)`` and its copies (a P x D plan: D copies of every stage)."""
    lay = p.layout
    per = (lay.data_parallel_size(s) for s in range(lay.num_stages))
    rc = sum(len(s.recompute) for s in p.stages)
    stages = " ".join(f"[{s.layer_start},{s.layer_stop})x{r}" for s, r in zip(p.stages, per))
    layout = "replicated per stage" if lay.replicated_per_stage else f"P{lay.num_stages}xD{lay.dp_degree}"
    return (f"{stages}  ({layout}, b{p.microbatch_size} M{p.num_microbatches} {p.schedule.value} "
            f"z{int(lay.zero)} rc{rc})")


LIFTED_CAP_BYTES = 2**60  # "as if each device had the memory the plan needs"
VARIANTS = (("free", "ours, free micro-batch size"), ("b0", "ours, micro-batch b0 only"))


def run(model: str, n: int, reference: Path) -> dict:
    """One model on ``n`` devices: PipeDream's split and ours, priced alike. When PipeDream's
    split fits under no recomputation, both it and ours are also priced with the cap lifted."""
    profile = import_pipedream(reference / model / "graph.txt")
    cluster = grown(n)
    b0 = profile.microbatch_sizes[0]
    base = PlanRequest()
    cm = CostModel(profile, cluster, base.optimizer)
    t0 = time.perf_counter()
    found = pipedream_split(cm, b0, n)
    split_s = time.perf_counter() - t0
    if found is None:
        return {"model": model, "n": n, "error": "PipeDream's optimizer finds no split on exactly N devices"}
    starts, copies = found
    m = rounds_for(copies, n)
    request = dataclasses.replace(base, global_batch=b0 * m)
    out: dict = {"model": model, "n": n, "b0": b0, "m": m, "g": b0 * m, "starts": starts, "copies": copies,
                 "split_s": split_s, "layers": profile.num_layers, "caps": {}}
    caps = [("under the cap", request)]
    theirs = price_split(cm, request, starts, copies, b0)
    if isinstance(theirs, str):
        out["does_not_fit"] = theirs
        caps = [("cap lifted", dataclasses.replace(request, memory_cap_bytes=LIFTED_CAP_BYTES))] + caps
    for cap_name, req in caps:
        entry: dict = {"theirs": price_split(cm, req, starts, copies, b0)}
        for key, _ in VARIANTS:
            variant = req if key == "free" else dataclasses.replace(req, microbatch_sizes=(b0,))
            t0 = time.perf_counter()
            try:
                entry[key] = plan(profile, cluster, variant)
            except PlannerError as exc:
                entry[key] = str(exc).splitlines()[0]
            entry[key + "_s"] = time.perf_counter() - t0
        out["caps"][cap_name] = entry
    return out


def _priced(p: Plan) -> str:
    t = p.predicted.iteration_ms
    return (f"{t:.2f} ms, peak {p.predicted.peak_memory_bytes / 2**30:.2f} GiB, "
            f"machine bound / time {p.predicted.machine_bound_ms / t:.3f}")


def report(res: dict) -> list[str]:
    """The lines printed for one case."""
    head = f"{res['model']} on {res['n']} V100-16GB"
    if "error" in res:
        return [f"{head}: {res['error']}"]
    stops = list(res["starts"][1:]) + [res["layers"]]
    split = " ".join(f"[{a},{z})x{r}" for a, z, r in zip(res["starts"], stops, res["copies"]))
    lines = [f"{head}: b0 {res['b0']}, PipeDream's copies {'+'.join(map(str, res['copies']))} "
             f"(lcm {math.lcm(*res['copies'])}) -> M = {res['m']}, G = {res['g']}  "
             f"(PipeDream's optimizer on our chain: {res['split_s']:.3f} s)",
             f"  PipeDream's split: {split}"]
    for cap_name, entry in res["caps"].items():
        theirs = entry["theirs"]
        if isinstance(theirs, str):
            t_ms = None
            lines.append(f"  {cap_name}: PipeDream's split does not fit: {theirs}")
        else:
            t_ms = theirs.predicted.iteration_ms
            lines.append(f"  {cap_name}: PipeDream's split (b{res['b0']} M{res['m']} 1f1b, "
                         f"rc{sum(len(s.recompute) for s in theirs.stages)}): {_priced(theirs)}")
        for key, what in VARIANTS:
            ours = entry[key]
            what = what.replace("b0", str(res["b0"]))
            if isinstance(ours, str):
                lines.append(f"    {what}: {ours}  ({entry[key + '_s']:.1f} s)")
                continue
            lines.append(f"    {what}: {split_text(ours)}")
            ratio = f", PipeDream / ours = {t_ms / ours.predicted.iteration_ms:.3f}" if t_ms is not None else ""
            lines.append(f"      {_priced(ours)}{ratio}  "
                         f"(planned in {entry[key + '_s']:.1f} s)")
    return lines


def verdict(res: dict) -> tuple[bool, bool | None]:
    """(PipeDream replicates unequally and its split fits under the cap, ours at least as fast
    under both requests, each against PipeDream's split priced under the same cap)."""
    if "error" in res:
        return False, None
    ok = True
    for entry in res["caps"].values():
        if isinstance(entry["theirs"], str):
            continue
        t_ms = entry["theirs"].predicted.iteration_ms
        ok &= all(not isinstance(entry[k], str) and entry[k].predicted.iteration_ms <= t_ms * (1 + REL_TOL)
                  for k, _ in VARIANTS)
    return len(set(res["copies"])) > 1 and "does_not_fit" not in res, ok


ALL_MODELS = ("alexnet", "vgg16", "squeezenet1_0", "resnet18", "resnet50", "resnet101", "resnext50", "resnext101",
              "densenet121", "inception_v3", "nasnetamobile", "nasnetalarge", "gnmt", "gnmt_large")


def _stages(copies: tuple[int, ...], nodes: tuple[frozenset[str], ...]) -> str:
    return " ".join(f"{len(n)}x{r}" for n, r in zip(nodes, copies))


def reproduce_case(model: str, n: int, args: argparse.Namespace) -> tuple[str, RealChoice | None]:
    """One line: the real optimizer's choice, ours, the verdict (see ``--reproduce``); and the
    real choice (None where it did not finish)."""
    t0 = time.perf_counter()
    try:
        graph, opt_args, states, ours = ours_of(model, n, args.reference, args.max_states)
        ours_s, hopeless = time.perf_counter() - t0, False
    except TooManyStates:
        ours, ours_s, hopeless = None, time.perf_counter() - t0, True
    t0 = time.perf_counter()
    try:
        real = run_real(model, n, timeout_s=args.hopeless_timeout_s if hopeless else args.timeout_s,
                        reference=args.reference)
    except subprocess.TimeoutExpired as exc:
        real = None
        real_text = f"did not finish in {exc.timeout:.0f} s"
    real_s = time.perf_counter() - t0
    head = f"{model:13s} {n:3d}"
    if hopeless:
        return (f"{head}  real: {real_text if real is None else _stages(real.replicas, real.stage_nodes)}"
                f"  | ours: > {args.max_states} antichain states ({ours_s:.1f} s)  -> not run"), real
    if real is None:
        return f"{head}  real: {real_text}  | ours: {ours.replicas if ours else None}  -> not run", real
    got = judge(graph, opt_args, states, ours, real)
    return (f"{head}  real: {_stages(real.replicas, real.stage_nodes):28s} {real.objective_s:.12g} s ({real_s:5.1f} s)"
            f"  | ours: {_stages(got.ours_replicas, got.ours_nodes):28s} {got.ours_objective_s:.12g} s ({ours_s:5.2f} s)"
            f"  -> {got.verdict}"), real


def reproduce(args: argparse.Namespace) -> int:
    models = args.models.split(",") if args.models != ",".join(MODELS) else list(ALL_MODELS)
    devices = [int(d) for d in args.devices.split(",")] if args.devices != ",".join(map(str, DEVICES)) else [4, 8, 16, 32]
    print(f"pipedream_replication --reproduce: {time.strftime('%Y-%m-%d %H:%M')}; PipeDream's optimizer (subprocess) vs "
          f"planner.solve.pipedream_optimizer; stages as nodes x copies; objective = slowest stage, s per minibatch; "
          f"load average {os.getloadavg()[0]:.1f}")
    counts: dict[str, int] = {}
    recorded: dict[tuple[str, int], RealChoice] = {}
    for model in models:
        for n in devices:
            line, real = reproduce_case(model, n, args)
            print(line, flush=True)
            verdict_ = line.rsplit("-> ", 1)[1]
            counts[verdict_] = counts.get(verdict_, 0) + 1
            if real is not None:
                recorded[(model, n)] = real
    total = sum(counts.values())
    print(f"summary over {total} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if args.record is not None:
        write_recorded(recorded, args.record)
        print(f"recorded the real optimizer's {len(recorded)} choices in {args.record}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", type=Path, default=REPO.parent / "shared" / "reference" / "pipedream")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--devices", default=",".join(map(str, DEVICES)))
    ap.add_argument("--reproduce", action="store_true", help="PipeDream's optimizer itself vs our reimplementation")
    ap.add_argument("--max-states", type=int, default=MAX_STATES)
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--hopeless-timeout-s", type=float, default=30.0)
    ap.add_argument("--record", type=Path, nargs="?", const=RECORDED, default=None,
                    help=f"with --reproduce: write the real optimizer's choices (default {RECORDED.relative_to(REPO)}, "
                         f"what tests/test_pipedream_optimizer.py checks ours against)")
    args = ap.parse_args()
    if args.reproduce:
        return reproduce(args)
    print(f"pipedream_replication: {time.strftime('%Y-%m-%d %H:%M')}; v100-16gb-2x8 grown to N; PipeDream's split "
          f"priced by our simulator (b0, 1F1B, least recompute that fits) vs our planner on the same G; "
          f"load average {os.getloadavg()[0]:.1f}")
    unequal, met, missed = 0, 0, []
    for model in args.models.split(","):
        for n in (int(d) for d in args.devices.split(",")):
            res = run(model, n, args.reference)
            print("\n".join(report(res)), flush=True)
            is_unequal, ok = verdict(res)
            if ok is False:
                missed.append(f"{model} N={n}")
            if is_unequal:
                unequal += 1
                met += bool(ok)
    print(f"summary: PipeDream replicates unequally with a split that fits in {unequal} case(s); ours at least as fast "
          f"(both requests) in "
          f"{met}/{unequal} of them; ours slower than PipeDream's split under the same cap anywhere: "
          f"{', '.join(missed) if missed else 'nowhere'}")
    print(f"(load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
