"""``planner run``: execute a plan with the bundled runtime under torchrun.

Launches ``python -m torch.distributed.run --standalone --nproc-per-node N -m
planner.runtime ...`` as a subprocess (this module does not import torch) and returns its
exit code. N defaults to the plan's device count; for several nodes, call torchrun
yourself with ``-m planner.runtime`` and the same flags.

Before torchrun starts, ``planner.runtime.preflight`` resolves the dtype and optimizer against
the plan (refusing or warning on a mismatch) and checks the world size and the model against
the plan in this process (torch is imported then, to build the model).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from planner.artifacts.kinds import DType, OptimizerFamily, ZeroStage
from planner.artifacts.plan import load_plan
from planner.artifacts.report import RunReport, load_report, overrun_warning
from planner.commands._args import positive_int
from planner.report.table import format_table
from planner.runtime.preflight import (
    RUNTIME_DTYPES,
    RUNTIME_OPTIMIZERS,
    check_launch,
    run_settings,
)

EPILOG = """\
before torchrun starts, in this process (one line, exit 2 on a refusal):
  --dtype       a plan records its profile's dtype: the run takes it; another --dtype is refused
                (bytes and times would be off by 2x); a bfloat16 plan runs in float32 with a warning
  --optimizer   a plan records the optimizer it priced: the run takes its family (sgd | adamw);
                the other family runs with a warning (the report prices the runtime's optimizer)
  world size    --nproc must equal the plan's devices
  model         layer count, names and fingerprint (names + parameter shapes) must match the plan's;
                a factory that raises is refused; a --profile must have the model's layers
"""


def runtime_argv(args: argparse.Namespace) -> list[str]:
    """The flags passed through to ``python -m planner.runtime``."""
    argv = ["--plan", args.plan, "--model", args.model, "--steps", str(args.steps)]
    argv += ["--timeout-s", str(args.timeout_s), "--dtype", args.dtype, "--optimizer", args.optimizer, "--lr", str(args.lr)]
    argv += ["--seed", str(args.seed), "--warmup-steps", str(args.warmup_steps)]
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
    lay = report.layout
    if lay.replicated_per_stage:
        copies = "+".join(str(lay.replicas_of(s)) for s in range(lay.num_stages))
        layout = f"{lay.num_stages} stages replicated per stage ({copies} processes)"
    else:
        layout = f"{lay.num_stages} stages x {lay.dp_degree} replicas"
    if lay.tp_degree > 1:
        layout += f" x {lay.tp_degree} tensor-parallel{' (sequence parallel)' if lay.sequence_parallel else ''}"
    head = (
        f"ran {layout}, {report.schedule.value}, "
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
    zero = report.layout.zero
    sharding = {ZeroStage.NONE: "none", ZeroStage.OPTIMIZER: "optimizer state",
                ZeroStage.GRADIENTS: "optimizer state and gradients"}[zero]
    head = (
        f"model state per rank, ZeRO {int(zero)} (sharded: {sharding}); predicted = the plan's stage parameters "
        f"/ shards x {per_param} B/param, the runtime's {report.optimizer.value} {report.dtype.value} optimizer state "
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
    dtype = DType(args.dtype) if args.dtype is not None else None
    optimizer = OptimizerFamily(args.optimizer) if args.optimizer is not None else None
    settings = run_settings(plan, dtype, optimizer, source=args.plan)
    for line in settings.warnings:
        print(line, file=sys.stderr)
    args.dtype, args.optimizer = settings.dtype.value, settings.optimizer.value  # passed on to every rank
    check_launch(plan, args.model, nproc, seed=args.seed, dtype=settings.dtype, profile_path=args.profile, source=args.plan)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.report:
            args.report = str(Path(tmp) / "report.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
        cmd += ["-m", "planner.runtime", *runtime_argv(args)]
        code = subprocess.run(cmd, check=False).returncode
        if code == 0 and Path(args.report).exists():
            report = load_report(args.report)
            print(format_report(report))
            if overrun_warning(report):
                print(overrun_warning(report), file=sys.stderr)
    return code


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="execute a plan under torchrun",
        description="Train with a plan on this machine (gloo on CPU, NCCL on GPU) and write a RunReport.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("plan", help="plan JSON")
    p.add_argument("--model", required=True, help="zoo name or package.module:callable (required)")
    p.add_argument("--steps", type=positive_int, default=3, help="training steps (default: %(default)s)")
    p.add_argument("--nproc", type=positive_int, default=0, help="processes (default: the plan's devices)")
    p.add_argument("--report", default="", help="RunReport JSON to write (default: none, the table is printed)")
    p.add_argument("--emulate", action="store_true",
                   help="each stage chunk takes its profiled time (sleeps): schedule and cost-model validation (default: off)")
    p.add_argument("--profile", default="", help="profile JSON with per-layer times for --emulate (default: the plan's stage times)")
    p.add_argument("--timeout-s", type=float, default=60.0, help="process-group timeout (default: %(default)s)")
    p.add_argument("--checkpoint-dir", default="", help="write checkpoints here (default: none)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (default: 0, never)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir (default: off)")
    p.add_argument("--dtype", default=None, choices=[d.value for d in RUNTIME_DTYPES],
                   help="training dtype (default: the plan's, float32 when unknown; another is refused)")
    p.add_argument("--optimizer", default=None, choices=[o.value for o in RUNTIME_OPTIMIZERS],
                   help="runtime optimizer (default: the plan's family, sgd for sgd-fp32, adamw for adam-*; sgd when "
                        "unknown; the other warns)")
    p.add_argument("--lr", type=float, default=0.01, help="learning rate (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="weights: torch.manual_seed(seed) before the factory; batches: step k trains on "
                        "make_batch(global batch, seed + k) (default: %(default)s)")
    p.add_argument("--warmup-steps", type=int, default=1, help="first steps left out of the timing summary (default: %(default)s)")
    p.set_defaults(func=run)
