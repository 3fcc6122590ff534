"""``planner run``: execute a plan with the bundled runtime under torchrun.

Launches ``python -m planner.runtime.launch --standalone --nproc-per-node N -m
planner.runtime ...`` (torchrun, leaving through ``os._exit``: ``planner.runtime.launch``) as a
subprocess (this module does not import torch) and returns its exit code. N defaults to the
plan's device count; for several nodes, call torchrun yourself with ``-m planner.runtime`` and
the same flags.

Before torchrun starts, every flag is read as the ranks will read it (:func:`check_flags`: their
own parser and ``RuntimeOptions`` over the argv torchrun would pass them), and
``planner.runtime.preflight`` resolves the dtype and optimizer against the plan (refusing or
warning on a mismatch), checks a ``--resume`` against the checkpoint's recorded settings, the
world size and the model against the plan (torch is imported then, to build the model), and the
outputs (report path, checkpoint directory: writable, room, lock).

Signals: torchrun runs in its own session, with ``PR_SET_PDEATHSIG`` = SIGTERM on Linux (if
this process dies, even by SIGKILL, torchrun is asked to stop its workers cleanly). SIGTERM,
SIGINT or SIGHUP to this process is passed to torchrun once, which passes it to every worker:
they stop at the next step boundary, write a final checkpoint when ``--checkpoint-dir`` is set
and leave (``planner.runtime.lifecycle``); this process then exits with 128 + the signal. A
second signal, or torchrun still running :data:`STOP_WAIT_S` seconds after the first, ends
torchrun with SIGKILL, and its workers die with it (their own parent-death signal). A torchrun
killed by a signal is said in one line.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import DType, OptimizerFamily
from planner.artifacts.plan import Plan, load_plan
from planner.artifacts.progress import Progress
from planner.commands._args import Subcommand, bounded_float, bounded_int, device_count
from planner.runtime.checkpoint_files import DEFAULT_KEEP_LAST
from planner.runtime.checkpoint_settings import CHANGEABLE
from planner.runtime.lifecycle import STOP_GRACE_S
from planner.runtime.options import RANGES
from planner.runtime.preflight import (
    RUNTIME_DTYPES,
    RUNTIME_OPTIMIZERS,
    check_launch,
    check_outputs,
    check_resume,
    run_settings,
    settings_of,
)
from planner.runtime.summary import format_report

#: seconds torchrun may take to stop its workers after a forwarded signal (the workers' own
#: grace to reach a step boundary, then torchrun's 30 s before SIGKILL is not waited for)
STOP_WAIT_S = STOP_GRACE_S + 10.0

EPILOG = """\
before torchrun starts, in this process (one line, exit 2 on a refusal):
  --dtype       a plan records its profile's dtype: the run takes it; another --dtype is refused
                (bytes and times would be off by 2x); a bfloat16 plan runs in float32 with a warning
  --optimizer   a plan records the optimizer it priced: the run takes its family (sgd | adamw);
                the other family runs with a warning (the report prices the runtime's optimizer)
  world size    --nproc must equal the plan's devices
  model         layer count, names and fingerprint (names + parameter shapes + a Hugging Face
                config's fields) must match the plan's, the difference named by parameter or
                config field when the plan's profile is found; make_batch(global batch, 0) must
                return that many samples (swapped arguments are named); the tensors crossing
                each stage boundary the plan's bytes per sample (a plan profiled at another
                sequence length is refused); a factory that raises is refused; a --profile
                must have the model's layers
  outputs       --report writable (not a directory or device, its directory takes files), the
                --checkpoint-dir writable, not used by another run (a lock), room for one checkpoint
  --resume      a checkpoint exists; its recorded lr, dtype, optimizer, seed and plan match this
                run's (lr may change with --allow-resume-change lr); --steps above the steps done;
                a directory without manifests only with --trust-unverified-checkpoint
  every flag    as the ranks will read it: numbers written as numbers (no nan, inf, 1_000; an
                integer as digits) in range (--timeout-s 1 to 604800, --lr 1e-12 to 10, counts up
                to 2^31 - 1), and their combinations (--checkpoint-every needs --checkpoint-dir)

signals: SIGTERM / SIGINT stop the workers at the next step boundary, after a final checkpoint
when --checkpoint-dir is set (exit 128 + signal); a second signal kills them at once (a repeat
within 1 s is the same request); killing planner run stops them the same way

failures: one line per rank with the root cause and the model's line of code it came from;
PLANNER_DEBUG=1 also prints each rank's traceback

the same run without this launcher (rank 0 prints the same progress and summary; the dtype and
optimizer are the plan's): torchrun --nproc-per-node N -m planner.runtime --plan PLAN --model M
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
        argv += ["--checkpoint-dir", args.checkpoint_dir]
    argv += ["--checkpoint-every", str(args.checkpoint_every), "--keep-last", str(args.keep_last)]
    if args.resume:
        argv.append("--resume")
    if args.trust_unverified_checkpoint:
        argv.append("--trust-unverified-checkpoint")
    for name in args.allow_resume_change:
        argv += ["--allow-resume-change", name]
    if args.verbose:
        argv.append("--verbose")
    return [*argv, "--no-summary"]  # this process prints the summary, from the report


def _flag(name: str) -> Callable[[str], Any]:
    """The argparse type of a run flag: its range is the rank's own (``RuntimeOptions.RANGES``)."""
    _, lo, hi = RANGES[name]
    return bounded_int(int(lo), int(hi)) if isinstance(lo, int) else bounded_float(lo, hi)


def check_flags(args: argparse.Namespace) -> None:
    """Every flag as a rank will read it: the ranks' own parser and ``RuntimeOptions`` over the
    argv torchrun would pass them, here, before anything starts (one line, exit 2)."""
    from planner.runtime.main import build_parser, runtime_options

    resolved = argparse.Namespace(**vars(args))  # the dtype and optimizer are resolved against the plan later
    resolved.dtype = args.dtype or DType.FLOAT32.value
    resolved.optimizer = args.optimizer or OptimizerFamily.SGD.value
    runtime_options(build_parser().parse_args(runtime_argv(resolved)), DType(resolved.dtype),
                    OptimizerFamily(resolved.optimizer))


def _plan_profile(plan: Plan, given: str, plan_path: str) -> str:
    """The profile the model is checked against: ``--profile``, else the plan's own profile when
    it lies beside the plan or in profiles/ (found by sha256; only to name a layer whose shapes
    differ, not used for --emulate), else none."""
    if given:
        return given
    from planner.report.resolve import find_profile_path

    return find_profile_path(plan, Path(plan_path))


def run(args: argparse.Namespace) -> int:
    from planner.artifacts.report import load_report, overrun_warning  # here, not at the top: see planner.commands.cli
    from planner.models.spec import check_spec

    check_flags(args)
    check_spec(args.model)  # an hf: spec is refused before torch and transformers are imported
    plan = load_plan(args.plan)  # a bad plan file is refused here, before any process starts
    nproc = args.nproc or plan.num_devices
    dtype = DType(args.dtype) if args.dtype is not None else None
    optimizer = OptimizerFamily(args.optimizer) if args.optimizer is not None else None
    settings = run_settings(plan, dtype, optimizer, source=args.plan)
    for line in settings.warnings:
        print(line, file=sys.stderr)
    args.dtype, args.optimizer = settings.dtype.value, settings.optimizer.value  # passed on to every rank
    if args.resume:
        if not args.checkpoint_dir:
            raise PlannerInputError("--resume needs --checkpoint-dir")
        record = settings_of(plan, lr=args.lr, dtype=settings.dtype, optimizer=settings.optimizer, seed=args.seed)
        check_resume(plan, args.checkpoint_dir, settings=record, num_steps=args.steps, allowed=tuple(args.allow_resume_change),
                     trust_unverified=args.trust_unverified_checkpoint)
    check_outputs(args.report, args.checkpoint_dir, 0)  # before torch is imported: a refusal comes at once
    with Progress(f"run {Path(args.plan).name} (before torchrun)") as progress:  # torch and the model: seconds
        progress.detail = "checking the model against the plan"
        check_launch(
            plan, args.model, nproc, seed=args.seed, dtype=settings.dtype,
            profile_path=_plan_profile(plan, args.profile, args.plan), source=args.plan,
            optimizer=settings.optimizer, report_path=args.report, checkpoint_dir=args.checkpoint_dir,
        )
    with tempfile.TemporaryDirectory() as tmp:
        if not args.report:
            args.report = str(Path(tmp) / "report.json")
        cmd = [sys.executable, "-m", "planner.runtime.launch", "--standalone", "--nproc-per-node", str(nproc)]
        cmd += ["-m", "planner.runtime", *runtime_argv(args)]
        with Progress(f"run {Path(args.plan).name}") as launch:  # until rank 0 of the workers speaks for the run
            launch.detail = f"starting {nproc} processes (torchrun)"
            code = supervise(cmd, quiet=not args.verbose, started=(Path(tmp) / "started", launch.hand_over))
        if code == 0 and Path(args.report).exists():
            report = load_report(args.report)
            print(format_report(report))
            if overrun_warning(report):
                print(overrun_warning(report), file=sys.stderr)
    return code


def _torchrun_dies_with_us() -> None:
    """In the child, before exec: SIGTERM when this process dies (Linux; see the module docstring)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0, 0, 0)


def supervise(cmd: list[str], quiet: bool = False, started: tuple[Path, Callable[[], None]] | None = None) -> int:
    """Run torchrun and pass it the first stop signal (see the module docstring); its exit
    code, or 128 + the signal that stopped the run. ``quiet``: ``OMP_NUM_THREADS=1`` unless set,
    which torchrun would set itself for several processes, printing four lines of warning.
    ``started``: (a path rank 0 creates once its own progress runs, ``PLANNER_RUN_STARTED``;
    what to call then)."""
    env = dict(os.environ)
    if quiet:  # torchrun's own warnings: the OMP banner, "Sending process ... closing signal", "failed (exitcode: 1)"
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("LOGLEVEL", "CRITICAL")  # torch.distributed.elastic's get_logger level
        env["PLANNER_QUIET_TORCHRUN"] = "1"  # planner.runtime.launch: the rest of torchrun's log
    if started is not None:
        env["PLANNER_RUN_STARTED"] = str(started[0])
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {s: signal.signal(s, on_signal) for s in handled}
    try:
        proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=_torchrun_dies_with_us, env=env)
        forwarded, deadline = 0, 0.0
        while proc.poll() is None:
            if started is not None and started[0].exists():
                started[1]()
                started = None
            if received and not forwarded:
                forwarded, deadline = received[0], time.monotonic() + STOP_WAIT_S
                name = signal.Signals(forwarded).name
                print(f"planner run: {name}: stopping the workers at the next step boundary", file=sys.stderr, flush=True)
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(forwarded)
            elif forwarded and (len(received) > 1 or time.monotonic() > deadline):
                why = "a second signal" if len(received) > 1 else f"still running {STOP_WAIT_S:g} s after {signal.Signals(forwarded).name}"
                print(f"planner run: {why}: killing torchrun and its workers", file=sys.stderr, flush=True)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.1)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received:
        name = signal.Signals(received[0]).name
        print(f"planner run: stopped by {name} (torchrun exit {proc.returncode})", file=sys.stderr, flush=True)
        return 128 + received[0]
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        print(f"planner run: torchrun was killed by {name}; its workers ended with it", file=sys.stderr, flush=True)
        return 128 - proc.returncode
    return proc.returncode


def _parser() -> argparse.ArgumentParser:
    """``planner run``'s arguments (:data:`COMMAND`)."""
    p = argparse.ArgumentParser(
        add_help=False,
        description="Train with a plan on this machine (gloo on CPU, NCCL on GPU) and write a RunReport.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("plan", help="plan JSON")
    p.add_argument("--model", required=True,
                   help="the plan's model: a zoo name (gpt, bert, vgg, resnet, gpt2), hf:CONFIG[:key=value,...] "
                        "(a Hugging Face config, see planner profile --help), or package.module:callable (required)")
    p.add_argument("--steps", type=_flag("num_steps"), default=3, help="training steps (default: %(default)s)")
    p.add_argument("--nproc", type=device_count, default=0, help="processes (default: the plan's devices)")
    p.add_argument("--report", default="", help="RunReport JSON to write (default: none, the table is printed)")
    p.add_argument("--emulate", action="store_true",
                   help="each stage chunk takes its profiled time (sleeps): schedule and cost-model validation (default: off)")
    p.add_argument("--profile", default="", help="profile JSON with per-layer times for --emulate (default: the plan's stage times)")
    p.add_argument("--timeout-s", type=_flag("timeout_s"), default=60.0,
                   help="seconds a collective may wait, and a rank may go without a heartbeat before it is named and "
                        "killed; the run ends within this + 5 s of a rank stopping; 1 to 604800 (default: %(default)s)")
    p.add_argument("--checkpoint-dir", default="", help="write checkpoints here (default: none)")
    p.add_argument("--checkpoint-every", type=_flag("checkpoint_every"), default=0,
                   help="steps between checkpoints (default: 0, never)")
    p.add_argument("--keep-last", type=_flag("keep_last"), default=DEFAULT_KEEP_LAST,
                   help="complete checkpoints kept in --checkpoint-dir, older ones removed; 0 keeps all (default: %(default)s)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest intact checkpoint in --checkpoint-dir (default: off)")
    p.add_argument("--trust-unverified-checkpoint", action="store_true",
                   help="with --resume: load a checkpoint directory that has no manifest (written before manifests, "
                        "or with them removed) without verifying its files; refused otherwise (default: off)")
    p.add_argument("--allow-resume-change", action="append", default=[], choices=list(CHANGEABLE),
                   help="a setting that may differ from the checkpoint's on --resume, applied explicitly (default: none)")
    p.add_argument("--dtype", default=None, choices=[d.value for d in RUNTIME_DTYPES],
                   help="training dtype (default: the plan's, float32 when unknown; another is refused)")
    p.add_argument("--optimizer", default=None, choices=[o.value for o in RUNTIME_OPTIMIZERS],
                   help="runtime optimizer (default: the plan's family, sgd for sgd-fp32, adamw for adam-*; sgd when "
                        "unknown; the other warns)")
    p.add_argument("--lr", type=_flag("lr"), default=0.01, help="learning rate, 1e-12 to 10 (default: %(default)s)")
    p.add_argument("--seed", type=_flag("seed"), default=0,
                   help="weights: torch.manual_seed(seed) before the factory; batches: step k trains on "
                        "make_batch(global batch, seed + k) (default: %(default)s)")
    p.add_argument("--warmup-steps", type=_flag("warmup_steps"), default=1,
                   help="first steps left out of the timing summary (default: %(default)s)")
    p.add_argument("--verbose", action="store_true",
                   help="keep torch's own lines (torchrun's OMP_NUM_THREADS warning, the profiler's USDT lines, "
                        "FutureWarnings); default: silenced")
    return p


COMMAND = Subcommand(name="run", help="execute a plan under torchrun", parser=_parser(), run=run)
