"""``planner run``: execute a plan with the bundled runtime under torchrun.

Launches ``python -m torch.distributed.run --standalone --nproc-per-node N -m
planner.runtime ...`` as a subprocess (this module does not import torch) and returns its
exit code. N defaults to the plan's device count; for several nodes, call torchrun
yourself with ``-m planner.runtime`` and the same flags.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from planner.artifacts.plan import load_plan
from planner.artifacts.report import RunReport, load_report
from planner.report.table import format_table
from planner.commands._args import positive_int


def runtime_argv(args: argparse.Namespace) -> list[str]:
    """The flags passed through to ``python -m planner.runtime``."""
    argv = ["--plan", args.plan, "--model", args.model, "--steps", str(args.steps)]
    argv += ["--timeout-s", str(args.timeout_s), "--dtype", args.dtype, "--optimizer", args.optimizer, "--lr", str(args.lr)]
    if args.report:
        argv += ["--report", args.report]
    if args.emulate:
        argv.append("--emulate")
    if args.profile:
        argv += ["--profile", args.profile]
    if args.checkpoint_dir:
        argv += ["--checkpoint-dir", args.checkpoint_dir, "--checkpoint-every", str(args.checkpoint_every)]
    if args.resume:
        argv.append("--resume")
    return argv


def format_report(report: RunReport) -> str:
    """Measured beside predicted, per step and per stage."""
    steps = ", ".join(f"{s.loss:.4f}" for s in report.steps)
    copies = [len(s.ranks) // max(report.dp_degree * report.tp_degree, 1) for s in report.stages]
    layout = (f"{report.num_stages} stages replicated per stage ({'+'.join(map(str, copies))} processes)"
              if any(c > 1 for c in copies) and report.dp_degree == 1
              else f"{report.num_stages} stages x {report.dp_degree} replicas")
    if report.tp_degree > 1:
        layout += f" x {report.tp_degree} tensor-parallel{' (sequence parallel)' if report.sequence_parallel else ''}"
    head = (
        f"ran {layout}, {report.schedule}, "
        f"M={report.num_microbatches} x {report.microbatch_size} on {report.world_size} {report.backend} processes"
        f"{' (emulated compute)' if report.emulate else ''}\n"
        f"losses per step: {steps}\n"
        f"iteration: measured {report.iteration_ms:.1f} ms (median after {report.warmup_steps} warm-up), "
        f"predicted {report.iteration_ms_predicted:.1f} ms, error {100 * report.iteration_rel_error:+.1f}%"
    )
    rows = [
        [
            str(s.stage_idx), f"{s.compute_ms:.1f}", f"{s.compute_ms_predicted:.1f}", f"{100 * s.compute_rel_error:+.1f}%",
            f"{s.idle_ms:.1f}", str(s.saved_bytes_peak), str(s.activation_bytes_predicted),
            f"{100 * s.activation_rel_error:+.2f}%",
        ]
        for s in report.stages
    ]
    headers = ["stage", "compute ms", "predicted", "err", "idle ms", "saved bytes", "predicted", "err"]
    return head + "\n\n" + format_table(headers, rows) + "\n\n" + format_model_state(report)


def _err(rel_error: float, predicted: int) -> str:
    return f"{100 * rel_error:+.1f}%" if predicted else "-"


def format_model_state(report: RunReport) -> str:
    """Optimizer state and gradient bytes per rank, measured beside predicted. The runtime
    runs fp SGD or AdamW, not the plan's optimizer kind, so the prediction takes the plan's
    parameter count with the runtime optimizer's bytes per parameter."""
    per_param = report.optimizer_state_bytes_per_param
    sharding = {0: "none", 1: "optimizer state", 2: "optimizer state and gradients"}[report.zero]
    head = (
        f"model state per rank, ZeRO {report.zero} (sharded: {sharding}); predicted = the plan's stage parameters "
        f"/ shards x {per_param} B/param, the runtime's {report.optimizer} {report.dtype} optimizer state "
        f"(not the plan's optimizer kind); gradients x element size, / shards with ZeRO 2"
    )
    rows = [
        [
            str(s.stage_idx), str(s.optimizer_shards), str(s.optimizer_state_bytes), str(s.optimizer_state_bytes_predicted),
            _err(s.optimizer_state_rel_error, s.optimizer_state_bytes_predicted), str(s.grad_bytes_after_sync),
            str(s.grad_bytes_predicted), _err(s.grad_rel_error, s.grad_bytes_predicted),
        ]
        for s in report.stages
    ]
    headers = ["stage", "shards", "optimizer bytes", "predicted", "err", "grad bytes after sync", "predicted", "err"]
    return head + "\n\n" + format_table(headers, rows)


def run(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)  # a bad plan file is refused here, before any process starts
    nproc = args.nproc or plan.num_devices
    with tempfile.TemporaryDirectory() as tmp:
        if not args.report:
            args.report = str(Path(tmp) / "report.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
        cmd += ["-m", "planner.runtime", *runtime_argv(args)]
        code = subprocess.run(cmd).returncode
        if code == 0 and Path(args.report).exists():
            print(format_report(load_report(args.report)))
    return code


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="execute a plan under torchrun",
        description="Train with a plan on this machine (gloo on CPU, NCCL on GPU) and write a RunReport.",
    )
    p.add_argument("plan", help="plan JSON")
    p.add_argument("--model", required=True, help="zoo name or package.module:callable")
    p.add_argument("--steps", type=positive_int, default=3, help="training steps (default: %(default)s)")
    p.add_argument("--nproc", type=positive_int, default=0, help="processes (default: the plan's devices)")
    p.add_argument("--report", default="", help="RunReport JSON to write")
    p.add_argument("--emulate", action="store_true", help="each stage chunk takes its profiled time (sleeps): schedule and cost-model validation")
    p.add_argument("--profile", default="", help="profile JSON with per-layer times for --emulate")
    p.add_argument("--timeout-s", type=float, default=60.0, help="process-group timeout (default: %(default)s)")
    p.add_argument("--checkpoint-dir", default="")
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw"])
    p.add_argument("--lr", type=float, default=0.01)
    p.set_defaults(func=run)
