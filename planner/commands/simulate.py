"""``planner simulate PLAN.json``: replay a plan's schedule, print the summary, draw figures."""

from __future__ import annotations

import argparse
from pathlib import Path

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.plan import Plan, load_plan
from planner.commands._args import nonneg_float
from planner.schedule import build_schedule, write_schedule_csv
from planner.simulation import Timeline, simulate
from planner.simulation.bounds import partition_bounds

MIB = 1024**2


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay a plan's schedule: times, bubble, memory; timeline and memory figures",
        description="Replay a plan's per-rank schedule with the event simulator and print the summary.",
    )
    p.add_argument("plan", help="plan JSON written by 'planner plan --out'")
    p.add_argument("--timeline", metavar="PNG", help="write the Gantt chart of the iteration")
    p.add_argument("--memory", metavar="PNG", help="write memory over time per stage")
    p.add_argument("--csv", metavar="CSV", help="write the compute-only schedule torch.distributed.pipelining loads")
    p.add_argument("--optimizer-ms", type=nonneg_float, default=0.0, help="optimizer step per rank (default 0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    for flag in ("timeline", "memory", "csv"):
        out = getattr(args, flag)
        if out and not Path(out).resolve().parent.is_dir():
            raise PlannerInputError(f"--{flag} {out}: directory {Path(out).resolve().parent} does not exist")
    timeline = simulate(plan, optimizer_ms=args.optimizer_ms)
    print(format_summary(plan, timeline))
    if args.csv:
        lay = plan.layout  # torch's CSV: one stage per rank (chunks per rank when interleaved), copies not drawn
        write_schedule_csv(build_schedule(plan.schedule, lay.num_stages, plan.num_microbatches, lay.virtual_stages_per_rank),
                           args.csv)
        print(f"schedule CSV: {args.csv}")
    if args.timeline or args.memory:
        from planner.report.figures import plot_memory, plot_timeline

        if args.timeline:
            plot_timeline(timeline, args.timeline)
            print(f"timeline: {args.timeline}")
        if args.memory:
            cap = min((s.memory_cap_bytes for s in plan.stages), default=0)
            plot_memory(timeline, args.memory, cap_bytes=cap)
            print(f"memory: {args.memory}")
    return 0


def format_summary(plan: Plan, timeline: Timeline) -> str:
    """The iteration's numbers and one line per stage."""
    bounds = partition_bounds(plan)
    throughput = plan.global_batch / timeline.iteration_ms * 1e3 if timeline.iteration_ms > 0 else 0.0
    lines = [
        f"{plan.provenance.model}: {timeline.schedule.value}, {timeline.layout.num_stages} stages on {timeline.num_ranks} "
        f"pipeline ranks x {timeline.layout.dp_degree} replicas, M = {plan.num_microbatches} micro-batches of "
        f"{plan.microbatch_size}",
        f"iteration        {timeline.iteration_ms:.4g} ms ({throughput:.4g} samples/s)",
        f"partition bound  {bounds.lower_bound_ms:.4g} ms (this plan's stages; work/device {bounds.average_work_ms:.4g}, "
        f"critical path via stage {bounds.critical_stage_idx} {bounds.critical_path_ms:.4g})",
        *(
            [f"machine bound    {plan.predicted.machine_bound_ms:.4g} ms (any plan on these devices; "
             f"limit/time {plan.predicted.machine_bound_ms / timeline.iteration_ms:.3f})"]
            if plan.predicted.machine_bound_ms > 0 and timeline.iteration_ms > 0 else []
        ),
        f"bubble           {timeline.bubble_fraction:.1%} of {timeline.num_ranks} ranks x {timeline.compute_end_ms:.4g} ms",
        f"exposed allreduce {timeline.exposed_allreduce_ms:.4g} ms",
        f"peak memory      {timeline.peak_memory_bytes / MIB:.1f} MiB per device",
    ]
    if plan.predicted.iteration_ms > 0:
        lines.append(f"plan predicted   {plan.predicted.iteration_ms:.4g} ms")
    header = ("stage", "rank", "fwd ms", "bwd ms", "rc ms", "busy ms", "idle ms", "last B", "AR ms", "AR end", "in-flight", "peak MiB")
    rows = [
        (
            str(s.stage_idx), str(s.rank), f"{s.fwd_ms:.3g}", f"{s.bwd_ms:.3g}", f"{s.recompute_ms:.3g}",
            f"{s.busy_ms:.4g}", f"{s.idle_ms:.4g}", f"{s.last_backward_end_ms:.4g}",
            f"{s.allreduce_end_ms - s.allreduce_start_ms:.3g}", f"{s.allreduce_end_ms:.4g}",
            str(s.peak_inflight_microbatches), f"{s.peak_memory_bytes / MIB:.1f}",
        )
        for s in timeline.stages
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines.append("")
    lines.append("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    lines.extend("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)
    return "\n".join(lines)
