"""``planner plan``: plan a profile for a cluster and print the plan table.

The solver, the report and the PipeDream importer are imported in :func:`run` and
:func:`plan_of_args`, when a plan is made (``planner --help`` builds this parser without them:
see ``planner.commands.cli``)."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys

from planner.artifacts.cluster import DEFAULT_CLUSTER, PRESETS, Cluster, load_cluster
from planner.artifacts.errors import InfeasibleError, PlannerInputError
from planner.artifacts.host import OffloadMode
from planner.artifacts.kinds import (
    REQUESTABLE_SOLVERS,
    Objective,
    OptimizerKind,
    Precision,
    RecomputeMode,
    ScheduleKind,
    SolverKind,
)
from planner.artifacts.moe import MoeBalance, MoeDispatcher
from planner.artifacts.plan import Plan, dumps_plan
from planner.artifacts.profile import Profile, load_profile
from planner.artifacts.progress import Progress
from planner.artifacts.request import PlanRequest
from planner.artifacts.stack import DEFAULT_STACK, STACK_ALIASES, STACKS, Stack, stack_named
from planner.commands._args import Subcommand, batch_size, check_output, device_count, duration_ms, fraction, int_list, memory_gib
from planner.profiling.defaults import DEFAULT_GLOBAL_BATCH, default_profile


def _parser() -> argparse.ArgumentParser:
    """``planner plan``'s arguments (:data:`COMMAND`)."""
    p = argparse.ArgumentParser(
        add_help=False,
        description="Find the fastest (or leanest) pipeline + data + tensor parallel plan (with ZeRO, per-stage "
        "replication and recomputation) for a profiled model on a cluster. "
        "With no arguments, plans the embedded default profile (GPT-3 13B, analytic, A100) on an 8x A100-80GB node.",
    )
    p.add_argument("--profile", help="profile JSON, or a PipeDream graph.txt (converted as import-pipedream does, "
                   "batch size inferred) (default: the embedded GPT-3 13B A100 profile)")
    p.add_argument("--cluster", default=DEFAULT_CLUSTER, help=f"preset ({', '.join(PRESETS)}) or cluster JSON (default: %(default)s)")
    p.add_argument("--devices", type=device_count, default=0,
                   help="devices available (default: all of the cluster; more than a preset has adds its nodes, "
                        "e.g. --devices 64 with h100-80gb-x8 plans on 8 nodes); the plan uses fewer only when that is "
                        "faster, and its table says so")
    p.add_argument("--global-batch", type=batch_size, default=DEFAULT_GLOBAL_BATCH,
                   help="samples per iteration (default: %(default)s)")
    p.add_argument("--solver", default=SolverKind.DP.value, choices=[k.value for k in REQUESTABLE_SOLVERS],
                   help="solver or baseline (default: %(default)s)")
    p.add_argument("--objective", default="time", choices=[o.value for o in Objective],
                   help="what to optimise: time; memory, the least peak memory within 10%% of the fastest plan (or "
                        "--time-budget-ms); me, the memory-efficiency index (default: %(default)s)")
    p.add_argument("--schedules", default=",".join(s.value for s in PlanRequest().schedules),
                   help="comma-separated schedules to consider (gpipe, 1f1b, interleaved-1f1b: the chunks per pipeline "
                        "rank searched; zb-h1, zb-h2, zbv: zero bubble, backward split into input and weight gradients; "
                        "zbv runs two chunks per rank in a V; dualpipe-v, DeepSeek's DualPipe in a V, pairs a forward "
                        "and a backward of other micro-batches) "
                        "(default: %(default)s)")
    p.add_argument("--microbatch-sizes", type=int_list, default=(), help="comma-separated micro-batch sizes (default: every divisor)")
    p.add_argument("--max-stages", type=device_count, default=0, help="at most this many pipeline stages")
    p.add_argument("--recompute", default=RecomputeMode.AUTO.value, choices=[m.value for m in RecomputeMode],
                   help="auto: the solver picks each layer's level (the least recompute time that fits); none; "
                        "selective: every transformer block's attention core; full: every transformer block "
                        "(default: %(default)s)")
    p.add_argument("--no-recompute", action="store_true", help="never recompute activations (= --recompute none)")
    p.add_argument("--memory-headroom", type=fraction, default=0.1, help="fraction of device memory kept free (default: %(default)s)")
    p.add_argument("--memory-cap-gib", type=memory_gib, default=0.0,
                   help="per-device memory cap in GiB (overrides headroom)")
    p.add_argument("--offload", default=OffloadMode.NONE.value, choices=[m.value for m in OffloadMode],
                   help="host memory: none; optimizer (state and master weights, the step on the host); activations "
                        "(saved per layer, per stage where the search chooses); both; auto: each searched "
                        "(default: %(default)s)")
    p.add_argument("--optimizer", default="adam-mixed", choices=[o.value for o in OptimizerKind],
                   help="optimizer and precision (default: %(default)s)")
    p.add_argument("--precision", default="bf16",
                   help="arithmetic of the transformer blocks' linear layers (planner.cost.precision): bf16; fp8-current "
                        "(per-tensor current scaling); fp8-block (1x128 / 128x128 blocks, DeepSeek-V3); mxfp8 (Blackwell "
                        "only); a comma-separated list, or any (every one the devices run), plans each and keeps the "
                        "best (default: %(default)s)")
    p.add_argument("--time-budget-ms", type=duration_ms, default=0.0,
                   help="for --objective memory: slowest acceptable iteration")
    p.add_argument("--fixed-boundaries", type=int_list, default=(),
                   help="comma-separated layer indices where a stage must start (stages may also start elsewhere; "
                        "with --stages one more than their count, only there); refused (exit 3) if no plan can")
    p.add_argument("--stages", type=device_count, default=0,
                   help="exactly this many pipeline stages (with an interleaved schedule: pipeline ranks) "
                        "(default: searched)")
    p.add_argument("--dp-degree", type=device_count, default=0,
                   help="exactly this many replicated pipelines (no per-stage replication) (default: searched)")
    p.add_argument("--zero", type=int_list, default=(0, 1, 3),
                   help="ZeRO stages to consider: 0 none, 1 optimizer state sharded over a stage's replicas, "
                        "2 also gradients (reduce-scattered every micro-batch: asked for only, the search's tables do "
                        "not price that), 3 also parameters (FSDP; searched where memory binds) (default: 0,1,3)")
    p.add_argument("--no-stage-replication", action="store_true",
                   help="only plans whose stages all have the same replica count (no PipeDream-style per-stage replication)")
    _add_parallelism_arguments(p)
    p.add_argument("--pareto", action="store_true", help="also print the Pareto front of iteration time vs peak memory")
    p.add_argument("--out", help="write the plan JSON here")
    p.add_argument("--json", action="store_true", help="print the plan JSON instead of the table")
    return p


def _add_parallelism_arguments(p: argparse.ArgumentParser) -> None:
    """The degrees searched (tensor, context, expert), the MoE options, sequence parallelism and the stack."""
    p.add_argument("--tp", type=int_list, default=(),
                   help="tensor-parallel degrees to consider (default: every divisor of the devices per node that the "
                        "profile's layers allow; 1 = no tensor parallelism)")
    p.add_argument("--cp", type=int_list, default=(),
                   help="context-parallel degrees to consider (default: 1 and every degree that cuts the sequence into "
                        "2 cp whole chunks and divides the devices, for profiles that declare what scales with the "
                        "sequence: analytic GPT and Llama; 1 = no context parallelism)")
    p.add_argument("--ep", type=int_list, default=(),
                   help="expert-parallel degrees to consider for a profile with routed experts (default: every power of "
                        "two that divides the experts and the devices)")
    p.add_argument("--etp", type=int_list, default=(),
                   help="expert tensor-parallel degrees to consider (default: every power of two up to a node that "
                        "divides the experts' FFN width)")
    p.add_argument("--moe-dispatcher", choices=[d.value for d in MoeDispatcher], default=None,
                   help="how tokens reach their experts: alltoall (NCCL all-to-all) or deepep (fused kernels; a token "
                        "crosses the network once per node) (default: the stack's, alltoall)")
    p.add_argument("--moe-overlap", action="store_true",
                   help="dispatch and combine overlap another micro-batch's compute (Megatron-Core's 1F1B all-to-all "
                        "overlap)")
    p.add_argument("--moe-balance", default=None, metavar="forced|dropless:SKEW|capacity:FACTOR",
                   help="how tokens fall on the experts: forced (even, as benchmarks run), dropless with the busiest "
                        "rank at 1 + SKEW of the mean, or a capacity factor with drops (default: forced)")
    p.add_argument("--sequence-parallel", default="auto", choices=["auto", "on", "off"],
                   help="with tensor parallelism: search both (auto), or force sequence parallelism on/off (default: %(default)s)")
    p.add_argument("--stack", default=DEFAULT_STACK.name, choices=[*STACKS, *STACK_ALIASES],
                   help="the training stack planned for: what it overlaps with computation and its host time per "
                        "kernel (planner.artifacts.stack): none; planner (this package's runtime: the gradient "
                        "all-reduce in 25 MiB buckets during the last backward); megatron-lm-2021 (no overlap); "
                        "megatron-lm-2022 (backward tensor-parallel all-reduces with GEMMs); megatron-deepspeed-2021; "
                        "megatron-core-0.8 (also ZeRO's all-gather with the next forward, tensor- and "
                        "context-parallel collectives with compute, FSDP gathers one layer ahead); torchtitan-2024 "
                        "(FSDP2 prefetching, gradient reduction during backward, ZeRO gathers ahead of the forward); "
                        "megatron-core and torchtitan: the 0.8 and 2024 presets (default: %(default)s)")


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
            recompute=not args.no_recompute and args.recompute != RecomputeMode.NONE.value,
            recompute_mode=RecomputeMode.NONE if args.no_recompute else RecomputeMode(args.recompute),
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
            cp_degrees=args.cp,
            ep_degrees=args.ep,
            etp_degrees=args.etp,
            sequence_parallel={"auto": (False, True), "on": (True,), "off": (False,)}[args.sequence_parallel],
            stack=moe_stack(stack_named(args.stack), args),
            precisions=precisions_of(args.precision, load_cluster_quiet(args.cluster)),
            offload=OffloadMode(args.offload),
        )
    except ValueError as exc:
        raise PlannerInputError(flag_names(str(exc))) from None


def precisions_of(text: str, cluster: Cluster | None) -> tuple[Precision, ...]:
    """``--precision``: names, or ``any`` (every precision ``cluster``'s devices run)."""
    if text.strip() == "any":
        if cluster is None:
            return tuple(Precision)
        return tuple(p for p in Precision if not (p.fp8 and not cluster.peak_fp8_tflops)
                     and not (p is Precision.MXFP8 and not cluster.mxfp8))
    try:
        return tuple(Precision(p.strip()) for p in text.split(",") if p.strip())
    except ValueError:
        raise PlannerInputError(f"--precision {text!r}: known precisions are {', '.join(p.value for p in Precision)}, "
                                "or any") from None


def load_cluster_quiet(name: str) -> Cluster | None:
    """The cluster ``--cluster`` names (None if it does not load: ``plan_of_args`` reports that)."""
    try:
        return load_cluster(name)
    except PlannerInputError:
        return None


#: PlanRequest's fields by the flags that set them: a refusal names what the user typed
REQUEST_FLAGS = {
    "global_batch": "--global-batch", "num_devices": "--devices", "objective": "--objective", "schedules": "--schedules",
    "microbatch_sizes": "--microbatch-sizes", "max_stages": "--max-stages", "memory_headroom_fraction": "--memory-headroom",
    "memory_cap_bytes": "--memory-cap-gib (in bytes)", "optimizer": "--optimizer", "time_budget_ms": "--time-budget-ms",
    "fixed_boundaries": "--fixed-boundaries", "num_stages": "--stages", "dp_degree": "--dp-degree", "solver": "--solver",
    "zero_stages": "--zero", "tp_degrees": "--tp", "cp_degrees": "--cp", "sequence_parallel": "--sequence-parallel",
    "ep_degrees": "--ep", "etp_degrees": "--etp", "precisions": "--precision",
}
_FIELD = re.compile(r"\b(" + "|".join(REQUEST_FLAGS) + r")\b")


def flag_names(message: str) -> str:
    """``message`` (a PlanRequest refusal) with each field name replaced by its flag."""
    return _FIELD.sub(lambda m: REQUEST_FLAGS[m.group(1)], message)


def moe_stack(stack: Stack, args: argparse.Namespace) -> Stack:
    """``stack`` with the mixture-of-experts flags' choices (``--moe-*``)."""
    moe = stack.moe
    if args.moe_dispatcher:
        moe = dataclasses.replace(moe, dispatcher=MoeDispatcher(args.moe_dispatcher))
    if args.moe_overlap:
        moe = dataclasses.replace(moe, a2a_overlap=True)
    if args.moe_balance:
        kind, _, value = args.moe_balance.partition(":")
        try:
            balance = MoeBalance(kind)
            number = float(value) if value else None
            if (balance is MoeBalance.FORCED) != (number is None):
                raise ValueError
            moe = dataclasses.replace(moe, balance=balance, **(
                {"skew": number} if balance is MoeBalance.DROPLESS else
                {"capacity_factor": number} if balance is MoeBalance.CAPACITY else {}))
        except ValueError as exc:
            detail = f": {exc}" if str(exc) else ""
            raise PlannerInputError(f"--moe-balance {args.moe_balance!r}: expected forced, dropless:SKEW or "
                                    f"capacity:FACTOR{detail}") from None
    return dataclasses.replace(stack, moe=moe) if moe != stack.moe else stack


def cluster_for(name: str, devices: int) -> Cluster:
    """The cluster ``--cluster`` names, grown to ``--devices`` when that is more than it has and
    it is a preset (a preset is a kind of node: more devices are more such nodes, see
    :meth:`Cluster.grown_to`); a cluster file describes a machine as it is, so asking it for more
    devices than it has stays an error."""
    cluster = load_cluster(name)
    if devices > cluster.num_devices and name in PRESETS:
        return cluster.grown_to(devices)
    return cluster


def profile_from_arg(path: str | None) -> Profile:
    """The embedded default, a profile JSON, or a PipeDream ``graph.txt`` (by its ``.txt`` suffix)."""
    if not path:
        return default_profile()
    if path.endswith(".txt"):
        from planner.profiling.imported.pipedream import import_pipedream

        return import_pipedream(path)
    return load_profile(path)


def plan_of_args(args: argparse.Namespace) -> Plan:
    """The plan ``planner plan`` makes of its parsed arguments (nothing printed or written)."""
    from planner.solve import plan

    request = request_from_args(args)
    profile = profile_from_arg(args.profile)
    cluster = cluster_for(args.cluster, args.devices)
    for b in request.fixed_boundaries:
        if b >= profile.num_layers:
            raise PlannerInputError(f"--fixed-boundaries: layer {b} does not exist ({profile.num_layers} layers)")
    with Progress(f"plan {profile.model} on {cluster.name}"):  # a line every few seconds of a long search
        try:
            return plan(profile, cluster, request)
        except MemoryError:  # the working-set ceiling's estimate fell short (planner.solve.ceiling): one line
            raise InfeasibleError(
                f"the search ran out of memory on {profile.num_layers:,} layers over {cluster.num_devices:,} devices; "
                f"coarsen the request: fewer --microbatch-sizes, --tp/--cp/--zero degrees or --devices, or a "
                f"profile of fewer, larger layers") from None


def run(args: argparse.Namespace) -> int:
    from planner.report.table import format_pareto, format_plan

    check_output("--out", args.out)  # before planning, so that no work is lost to a typo in the path
    result = plan_of_args(args)
    for line in result.provenance.search_notes:  # e.g. a search coarsened under the working-set ceiling
        print(f"planner plan: note: {line}", file=sys.stderr)
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


COMMAND = Subcommand(name="plan", help="plan a profile for a cluster", parser=_parser(), run=run)
