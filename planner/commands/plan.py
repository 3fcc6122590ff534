"""``planner plan``: plan a profile for a cluster and print the plan table."""

from __future__ import annotations

import argparse
import os
import sys

from planner.artifacts.cluster import DEFAULT_CLUSTER, PRESETS, load_cluster
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import Objective, OptimizerKind, ScheduleKind, SolverKind
from planner.artifacts.plan import dumps_plan
from planner.artifacts.profile import load_profile
from planner.artifacts.request import PlanRequest
from planner.commands._args import fraction, int_list, nonneg_float, positive_int
from planner.profiling.defaults import DEFAULT_GLOBAL_BATCH, default_profile
from planner.report.table import format_pareto, format_plan
from planner.solve import SOLVERS, plan


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="plan a profile for a cluster",
        description="Find the fastest (or leanest) pipeline + data parallel plan for a profiled model on a cluster. "
        "With no arguments, plans the embedded default profile (GPT-3 13B, analytic, A100) on an 8x A100-80GB node.",
    )
    p.add_argument("--profile", help="profile JSON (default: the embedded GPT-3 13B A100 profile)")
    p.add_argument("--cluster", default=DEFAULT_CLUSTER, help=f"preset ({', '.join(PRESETS)}) or cluster JSON (default: %(default)s)")
    p.add_argument("--devices", type=positive_int, default=0,
                   help="devices available (default: all of the cluster); the plan uses fewer only when that is "
                        "faster, and its table says so")
    p.add_argument("--global-batch", type=positive_int, default=DEFAULT_GLOBAL_BATCH, help="samples per iteration (default: %(default)s)")
    p.add_argument("--solver", default=SolverKind.DP.value, choices=SOLVERS, help="solver or baseline (default: %(default)s)")
    p.add_argument("--objective", default="time", choices=[o.value for o in Objective], help="what to optimise (default: %(default)s)")
    p.add_argument("--schedules", default="gpipe,1f1b", help="comma-separated schedules to consider (gpipe, 1f1b) (default: %(default)s)")
    p.add_argument("--microbatch-sizes", type=int_list, default=(), help="comma-separated micro-batch sizes (default: every divisor)")
    p.add_argument("--max-stages", type=positive_int, default=0, help="at most this many pipeline stages")
    p.add_argument("--no-recompute", action="store_true", help="never recompute activations")
    p.add_argument("--memory-headroom", type=fraction, default=0.1, help="fraction of device memory kept free (default: %(default)s)")
    p.add_argument("--memory-cap-gib", type=nonneg_float, default=0.0, help="per-device memory cap in GiB (overrides headroom)")
    p.add_argument("--optimizer", default="adam-mixed", choices=[o.value for o in OptimizerKind],
                   help="optimizer and precision (default: %(default)s)")
    p.add_argument("--time-budget-ms", type=nonneg_float, default=0.0, help="for --objective memory: slowest acceptable iteration")
    p.add_argument("--fixed-boundaries", type=int_list, default=(),
                   help="comma-separated layer indices where a stage must start (stages may also start elsewhere; "
                        "with --stages one more than their count, only there); refused (exit 3) if no plan can")
    p.add_argument("--stages", type=positive_int, default=0,
                   help="exactly this many pipeline stages (with an interleaved schedule: pipeline ranks) "
                        "(default: searched)")
    p.add_argument("--dp-degree", type=positive_int, default=0,
                   help="exactly this many replicated pipelines (no per-stage replication) (default: searched)")
    p.add_argument("--zero", type=int_list, default=(0, 1, 2),
                   help="ZeRO stages to consider: 0 none, 1 optimizer state sharded over a stage's replicas, "
                        "2 also gradients (default: 0,1,2)")
    p.add_argument("--no-stage-replication", action="store_true",
                   help="only plans whose stages all have the same replica count (no PipeDream-style per-stage replication)")
    p.add_argument("--tp", type=int_list, default=(),
                   help="tensor-parallel degrees to consider (default: every divisor of the devices per node that the "
                        "profile's layers allow; 1 = no tensor parallelism)")
    p.add_argument("--sequence-parallel", default="auto", choices=["auto", "on", "off"],
                   help="with tensor parallelism: search both (auto), or force sequence parallelism on/off (default: %(default)s)")
    p.add_argument("--pareto", action="store_true", help="also print the Pareto front of iteration time vs peak memory")
    p.add_argument("--out", help="write the plan JSON here")
    p.add_argument("--json", action="store_true", help="print the plan JSON instead of the table")
    p.set_defaults(func=run)


def request_from_args(args: argparse.Namespace) -> PlanRequest:
    try:
        schedules = tuple(ScheduleKind(s.strip()) for s in args.schedules.split(",") if s.strip())
    except ValueError:
        raise PlannerInputError(
            f"--schedules {args.schedules!r}: known schedules are {', '.join(s.value for s in ScheduleKind)}"
        ) from None
    try:
        return PlanRequest(
            global_batch=args.global_batch,
            num_devices=args.devices,
            objective=Objective(args.objective),
            schedules=schedules,
            microbatch_sizes=args.microbatch_sizes,
            max_stages=args.max_stages,
            recompute=not args.no_recompute,
            memory_headroom_fraction=args.memory_headroom,
            memory_cap_bytes=int(args.memory_cap_gib * 1024**3),
            optimizer=OptimizerKind(args.optimizer),
            time_budget_ms=args.time_budget_ms,
            fixed_boundaries=args.fixed_boundaries,
            num_stages=args.stages,
            dp_degree=args.dp_degree,
            solver=SolverKind(args.solver),
            zero_stages=args.zero,  # ints: the request makes them ZeroStages, or refuses naming the known ones
            per_stage_replication=not args.no_stage_replication,
            tp_degrees=args.tp,
            sequence_parallel={"auto": (False, True), "on": (True,), "off": (False,)}[args.sequence_parallel],
        )
    except ValueError as exc:
        raise PlannerInputError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        # checked before planning, so that no work is lost to a typo in the path
        raise PlannerInputError(f"--out {args.out}: the folder does not exist")
    profile = load_profile(args.profile) if args.profile else default_profile()
    cluster = load_cluster(args.cluster)
    request = request_from_args(args)
    for b in request.fixed_boundaries:
        if b >= profile.num_layers:
            raise PlannerInputError(f"--fixed-boundaries: layer {b} does not exist ({profile.num_layers} layers)")
    result = plan(profile, cluster, request)
    text = dumps_plan(result)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    if args.json:
        sys.stdout.write(text)
    else:
        print(format_plan(result))
        if args.pareto:
            print()
            print(format_pareto(result.pareto))
        if args.out:
            print(f"\nplan written to {args.out}")
    return 0
