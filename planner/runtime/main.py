"""Entry point of one rank: ``torchrun --nproc-per-node N -m planner.runtime --plan P --model M``.

Order of work on every rank:

1. take over the signals, set the parent-death signal (``planner.runtime.lifecycle``);
2. parse flags; load the plan, the model (seeded) and the optional profile; check the plan
   against the model (layers, fingerprint, boundary tensor sizes) and ``WORLD_SIZE``; on rank
   0, check the outputs (``planner.runtime.preflight.check_outputs``: the report path writable,
   the checkpoint directory writable with room for one checkpoint, and locked for this run)
   -- all before any process group or compute, so a mismatch exits 2 with one line;
3. start liveness (``planner.runtime.liveness``: heartbeats through torchrun's store, the rank
   at fault named), join the default group (gloo on CPU, NCCL on CUDA) with a finite
   timeout, then the pipeline / data-parallel / tied groups; build the stage; train (resuming
   first with ``--resume``); gather; rank 0 writes the RunReport atomically;
4. ``dist.barrier()`` then ``destroy_process_group()`` (without the barrier, teardown
   aborted intermittently on this machine).

Faults: every failure ends the rank through one line on stderr and ``os._exit``: 2 for invalid
input (``planner.runtime: rank R: error: ...``), 1 otherwise, 128 + N after a signal N. The
rank at fault is named once for the whole run (``planner.runtime.liveness``): ``rank R failed
at step K: ...`` by the rank whose own work failed, ``rank Q stopped: rank R died at step K
(...)`` by the others; a rank that stops answering is named and killed after ``--timeout-s``.
A failure's place is ``before training`` (only before the first step), ``at step K``,
``writing checkpoint step_K`` or ``after training``.

If the report cannot be written after training (a full disk, its directory gone), the results
are saved beside the checkpoints (``DIR/report-<time>.json``), else in the temporary
directory, and the line names where; as a last resort the JSON is printed on stdout.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from planner.artifacts.codec import dumps_canonical
from planner.artifacts.errors import PlannerError, PlannerInputError
from planner.artifacts.files import os_error_text
from planner.artifacts.kinds import RUNTIME_DTYPES, DType, OptimizerFamily
from planner.artifacts.plan import Plan, load_plan
from planner.artifacts.profile import Profile, load_profile
from planner.artifacts.progress import note
from planner.artifacts.report import RunReport, save_report
from planner.runtime import lifecycle
from planner.runtime.checkpoint_files import CHANGEABLE, DEFAULT_KEEP_LAST, remove_temporaries_of
from planner.runtime.options import FaultKind, RuntimeOptions

if TYPE_CHECKING:
    import torch

    from planner.models.workload import Workload
    from planner.runtime.liveness import Liveness
    from planner.runtime.runner import Runner


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m planner.runtime", description="Run a plan (one rank, under torchrun).")
    p.add_argument("--plan", required=True, help="plan JSON")
    p.add_argument("--model", required=True, help="zoo name or package.module:callable")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--report", default="", help="RunReport JSON to write (rank 0)")
    p.add_argument("--emulate", action="store_true",
                   help="each stage chunk takes its profiled time (sleeps); real tensors and communication")
    p.add_argument("--profile", default="", help="profile JSON with per-layer times for --emulate")
    p.add_argument("--timeout-s", type=float, default=60.0)
    p.add_argument("--checkpoint-dir", default="")
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--keep-last", type=int, default=DEFAULT_KEEP_LAST)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--allow-resume-change", action="append", default=[], choices=list(CHANGEABLE))
    p.add_argument("--dtype", default=None, choices=[d.value for d in RUNTIME_DTYPES],
                   help="training dtype (default: the plan's, as planner run takes it; another is refused)")
    p.add_argument("--optimizer", default=None, choices=[o.value for o in OptimizerFamily],
                   help="runtime optimizer (default: the plan's family, as planner run takes it: adamw for adam-*)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-steps", type=int, default=1)
    p.add_argument("--verbose", action="store_true",
                   help="keep torch's own lines (the profiler's USDT lines, FutureWarnings); default: silenced")
    p.add_argument("--no-summary", action="store_true",
                   help="rank 0 prints no summary at the end (planner run prints it itself)")
    p.add_argument("--no-progress", action="store_true", help="rank 0 prints no progress lines")
    p.add_argument("--fault", default="none", choices=[f.value for f in FaultKind], help="testing: injected failure")
    p.add_argument("--fault-rank", type=int, default=0)
    p.add_argument("--fault-step", type=int, default=0)
    return p


def options_from_args(args: argparse.Namespace, plan: Plan) -> tuple[RuntimeOptions, tuple[str, ...]]:
    """The rank's options, the dtype and optimizer resolved against the plan as ``planner run``
    resolves them (``planner.runtime.preflight.run_settings``), and the warnings to print."""
    from planner.runtime.preflight import run_settings

    settings = run_settings(plan, DType(args.dtype) if args.dtype else None,
                            OptimizerFamily(args.optimizer) if args.optimizer else None, source=args.plan)
    try:
        return RuntimeOptions(
            plan_path=args.plan,
            model_spec=args.model,
            num_steps=args.steps,
            report_path=args.report,
            emulate=args.emulate,
            profile_path=args.profile,
            timeout_s=args.timeout_s,
            checkpoint_dir=args.checkpoint_dir,
            checkpoint_every=args.checkpoint_every,
            keep_last=args.keep_last,
            resume=args.resume,
            allow_resume_change=tuple(args.allow_resume_change),
            dtype=settings.dtype,
            optimizer=settings.optimizer,
            lr=args.lr,
            seed=args.seed,
            warmup_steps=args.warmup_steps,
            fault=FaultKind(args.fault),
            fault_rank=args.fault_rank,
            fault_step=args.fault_step,
        ), settings.warnings
    except ValueError as exc:
        raise PlannerInputError(str(exc)) from None


def make_runner(
    plan: Plan, workload: Workload, options: RuntimeOptions, rank: int, device: torch.device,
    profile: Profile | None = None,
) -> Runner:
    """The rank's executor: ``torch.distributed.pipelining`` (``engine``), or our own for a plan
    replicated per stage (``replicated``: torch's stages cannot route micro-batches to copies)."""
    from planner.runtime.engine import RankRunner
    from planner.runtime.replicated import ReplicatedRunner

    if plan.layout.replicated_per_stage:
        return ReplicatedRunner(plan, workload, options, rank, device, profile)
    return RankRunner(plan, workload, options, rank, device, profile)


class _Context:
    """What the failure path needs of a rank's run: its liveness once started."""

    liveness: Liveness | None = None
    lock: object = None  # the checkpoint directory's lock, held for the process's life


def quiet_torch() -> None:
    """Silence torch's own lines a run does not need (``--verbose`` keeps them): libkineto's
    ``USDT: ... profiler_start/stop`` lines on stderr from every CPU profiling session (the
    allocator probe, ``planner.runtime.memory``; its log level above USDT's 5, read when the
    profiler first starts), and the FutureWarnings torch.distributed raises on the context- and
    tensor-parallel paths."""
    import warnings

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.")


def _run(args: argparse.Namespace, rank: int, world_size: int, ctx: _Context) -> None:
    from planner.artifacts.progress import Progress

    if not args.verbose:
        quiet_torch()
    with Progress(f"run {Path(args.plan).name}", enabled=rank == 0 and not args.no_progress) as progress:
        progress.detail = "loading the plan and the model"
        if rank == 0 and os.environ.get("PLANNER_RUN_STARTED"):  # planner run's launch progress stops here
            Path(os.environ["PLANNER_RUN_STARTED"]).touch()
        plan = load_plan(args.plan)
        options, warnings = options_from_args(args, plan)
        for line in warnings if rank == 0 else ():
            print(f"planner.runtime: {line}", file=sys.stderr, flush=True)
        report = _train(options, plan, rank, world_size, ctx)
    if report is not None and not args.no_summary:
        from planner.runtime.summary import format_report

        print(format_report(report), flush=True)


def _train(options: RuntimeOptions, plan: Plan, rank: int, world_size: int, ctx: _Context) -> RunReport | None:
    """Check, join, train, gather; rank 0 writes the report (when asked) and returns it."""
    import torch
    import torch.distributed as dist

    from planner.runtime.check import check_plan
    from planner.runtime.collect import build_report, gather_measures
    from planner.runtime.liveness import StepControl, open_liveness
    from planner.runtime.model import cast_workload, load_workload, workload_fingerprint
    from planner.runtime.preflight import check_outputs, checkpoint_bytes
    from planner.runtime.runner import run_steps

    workload = load_workload(options.model_spec, options.seed, options.dtype)
    check_plan(plan, workload, world_size, source=options.plan_path)
    profile = load_profile(options.profile_path) if options.profile_path else None
    if profile is not None and profile.layer_names != workload.layer_names:
        raise PlannerInputError(f"{options.profile_path}: profile layers do not match model {workload.name!r}")
    if rank == 0:
        need = checkpoint_bytes(workload, options.dtype, options.optimizer)
        ctx.lock = check_outputs(options.report_path, options.checkpoint_dir, need, hold_lock=True)
    cast_workload(workload, options.dtype)

    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    ctx.liveness = open_liveness(rank, world_size, options.timeout_s)
    ctx.liveness.on_peer_gone = lambda pid: _remove_temporaries_of(options, pid)
    ctx.liveness.start()
    backend = "nccl" if use_cuda else "gloo"
    note(f"joining {world_size} processes ({backend})")
    dist.init_process_group(backend, timeout=timedelta(seconds=options.timeout_s))
    if use_cuda:
        for layer in workload.layers:
            layer.to(device)
    note("building the stages")
    runner = make_runner(plan, workload, options, rank, device, profile)
    measure = run_steps(runner, StepControl(ctx.liveness, world_size, device))
    lifecycle.set_phase(lifecycle.Phase.AFTER)
    note("gathering the measurements")
    rows = gather_measures(measure, world_size, device)
    problem = ""
    report = None
    if rank == 0:
        report = build_report(
            plan,
            options,
            measure,
            rows,
            model=workload.name,
            fingerprint=workload_fingerprint(workload),
            backend=backend,
            device=str(device) if not use_cuda else torch.cuda.get_device_name(device),
        )
        problem = write_report(report, options) if options.report_path else ""
    dist.barrier()
    dist.destroy_process_group()
    ctx.liveness.finish()
    if problem:
        lifecycle.leave(1, f"planner.runtime: rank {rank} failed after training: {problem}")
    return report


def _remove_temporaries_of(options: RuntimeOptions, pid: int) -> None:
    """The temporary files a peer killed in a write left: its checkpoint files and rank 0's
    report (``planner.artifacts.files.temp_path``)."""
    if options.checkpoint_dir:
        remove_temporaries_of(Path(options.checkpoint_dir), pid)
    if options.report_path:
        report = Path(options.report_path)
        Path(report.parent, f".{report.name}.{pid}.tmp").unlink(missing_ok=True)


def write_report(report: RunReport, options: RuntimeOptions) -> str:
    """Write the report atomically; if that fails, save it beside the checkpoints (else in the
    temporary directory, else on stdout) and return the line saying so ("" when written)."""
    from planner.artifacts.report import report_to_json

    try:
        save_report(report, options.report_path)
        return ""
    except OSError as exc:
        cause = f"cannot write the report {options.report_path}: {os_error_text(exc)}"
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    places = [Path(options.checkpoint_dir)] if options.checkpoint_dir else []
    places.append(Path(tempfile.gettempdir()))
    for place in places:
        fallback = place / f"report-{stamp}.json" if place != places[-1] else place / f"planner-report-{stamp}.json"
        try:
            save_report(report, fallback)
            return f"{cause}; the results were saved to {fallback}"
        except OSError:
            continue
    print(dumps_canonical(report_to_json(report)), flush=True)
    return f"{cause}; no fallback could be written either: the results are the JSON printed on stdout"


def main(argv: list[str] | None = None) -> int:
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    lifecycle.install(rank)
    ctx = _Context()
    try:
        _run(build_parser().parse_args(argv), rank, world_size, ctx)
    except lifecycle.StopRun as stop:
        name = signal.Signals(stop.signum).name
        saved = f"; checkpoint {stop.checkpoint} (continue with --resume)" if stop.checkpoint else "; no --checkpoint-dir, nothing saved"
        line = f"planner.runtime: stopped by {name} after {stop.completed_steps} completed steps{saved}" if rank == 0 else ""
        lifecycle.leave(128 + stop.signum, line)
    except PlannerError as exc:
        line = f"rank {rank}: error: {exc}"
        if ctx.liveness is not None:
            ctx.liveness.announce(line)
        lifecycle.leave(exc.exit_code, f"planner.runtime: {line}")
    except Exception as exc:
        if os.environ.get("PLANNER_DEBUG"):
            traceback.print_exc()
        if isinstance(exc, _step_failures()):
            message = str(exc)
        else:
            message = f"{lifecycle.phase().value}: {type(exc).__name__}: {exc}"
        if ctx.liveness is not None:
            ctx.liveness.fail(message, exc)
        lifecycle.leave(1, f"planner.runtime: rank {rank} failed {message}")
    return 0


def _step_failures() -> tuple[type, ...]:
    from planner.runtime.runner import CheckpointFailure, StepFailure

    return StepFailure, CheckpointFailure
