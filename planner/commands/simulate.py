"""``planner simulate PLAN.json``: replay a plan's schedule, print the summary, draw figures."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from planner.artifacts.plan import Plan, load_plan
from planner.commands._args import Subcommand, check_output, nonneg_float
from planner.report.table import sync_name

if TYPE_CHECKING:
    from planner.simulation import Timeline

MIB = 1024**2


def _parser() -> argparse.ArgumentParser:
    """``planner simulate``'s arguments (:data:`COMMAND`)."""
    p = argparse.ArgumentParser(
        add_help=False,
        description="Replay a plan's per-rank schedule with the event simulator and print the summary.",
    )
    p.add_argument("plan", help="plan JSON written by 'planner plan --out'")
    p.add_argument("--timeline", metavar="PNG", help="write the Gantt chart of the iteration")
    p.add_argument("--memory", metavar="PNG", help="write memory over time per stage")
    p.add_argument("--csv", metavar="CSV", help="write the compute-only schedule torch.distributed.pipelining loads")
    p.add_argument("--optimizer-ms", type=nonneg_float, default=0.0, help="optimizer step per rank (default 0)")
    return p


def run(args: argparse.Namespace) -> int:
    from planner.schedule import build_schedule, write_schedule_csv  # here, not at the top: see planner.commands.cli
    from planner.simulation import simulate

    for flag in ("timeline", "memory", "csv"):
        check_output(f"--{flag}", getattr(args, flag))
    plan = load_plan(args.plan)
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


def _ms(value: float, scale: float) -> str:
    """A time to 4 significant digits; rounding noise of the event arithmetic (|x| below 1e-9 of
    the iteration, e.g. 3.6e-12 ms of idle time) prints as 0."""
    if abs(value) <= 1e-9 * max(scale, 1e-9):
        return "0"
    return f"{value:.4g}"


def format_summary(plan: Plan, timeline: Timeline) -> str:
    """The iteration's numbers and one line per stage. The first line names the plan's whole
    layout (T, P, D, ZeRO: ``Layout.describe``) and the devices it occupies; the gradient
    synchronisation is named as the plan runs it (all-reduce, or ZeRO's reduce-scatter +
    all-gather)."""
    from planner.simulation.bounds import partition_bounds

    bounds = partition_bounds(plan)
    it = timeline.iteration_ms
    throughput = plan.global_batch / it * 1e3 if it > 0 else 0.0
    lay = plan.layout
    sync = sync_name(lay.zero)
    lines = [
        f"{plan.provenance.model}: {timeline.schedule.value}, {lay.describe(pipeline_ranks=True)}, on {plan.num_devices} "
        f"device{'s' if plan.num_devices != 1 else ''}; M = {plan.num_microbatches} micro-batches of {plan.microbatch_size}",
        f"iteration        {_ms(it, it)} ms ({throughput:.4g} samples/s)",
        f"partition bound  {_ms(bounds.lower_bound_ms, it)} ms (this plan's stages; work/device "
        f"{_ms(bounds.average_work_ms, it)}, critical path via stage {bounds.critical_stage_idx} "
        f"{_ms(bounds.critical_path_ms, it)})",
        *(
            [f"machine bound    {_ms(plan.predicted.machine_bound_ms, it)} ms (any plan on these devices; "
             f"limit/time {plan.predicted.machine_bound_ms / it:.3f})"]
            if plan.predicted.machine_bound_ms > 0 and it > 0 else []
        ),
        f"bubble           {max(0.0, timeline.bubble_fraction):.1%} of {timeline.num_ranks} pipeline rank"
        f"{'s' if timeline.num_ranks != 1 else ''} x {_ms(timeline.compute_end_ms, it)} ms",
        f"exposed {sync} {_ms(timeline.exposed_allreduce_ms, it)} ms",
        f"peak memory      {timeline.peak_memory_bytes / MIB:.1f} MiB per device",
    ]
    if plan.predicted.iteration_ms > 0:
        lines.append(f"plan predicted   {_ms(plan.predicted.iteration_ms, it)} ms")
    sync_head = "sync ms" if lay.zero else "AR ms"
    header = ("stage", "rank", "fwd ms", "bwd ms", "rc ms", "busy ms", "idle ms", "last B", sync_head, "sync end",
              "in-flight", "peak MiB")
    rows = [
        (
            str(st.stage_idx), str(st.rank), _ms(st.fwd_ms, it), _ms(st.bwd_ms, it), _ms(st.recompute_ms, it),
            _ms(st.busy_ms, it), _ms(st.idle_ms, it), _ms(st.last_backward_end_ms, it),
            _ms(st.allreduce_end_ms - st.allreduce_start_ms, it), _ms(st.allreduce_end_ms, it),
            str(st.peak_inflight_microbatches), f"{st.peak_memory_bytes / MIB:.1f}",
        )
        for st in timeline.stages
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines.append("")
    lines.append("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    lines.extend("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)
    return "\n".join(lines)


COMMAND = Subcommand(name="simulate", parser=_parser(), run=run,
                     help="replay a plan's schedule: times, bubble, memory; timeline and memory figures")
