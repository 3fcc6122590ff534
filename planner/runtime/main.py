"""Entry point of one rank: ``torchrun --nproc-per-node N -m planner.runtime --plan P --model M``.

Order of work on every rank:

1. parse flags; load the plan, the model (seeded) and the optional profile; check the plan
   against the model and ``WORLD_SIZE`` -- all before any process group or compute, so a
   mismatch exits 2 with one line and no rank waits on another;
2. join the default group (gloo on CPU, NCCL on CUDA) with a finite timeout, then the
   pipeline / data-parallel / tied groups; build the stage; train; gather; rank 0 writes the
   RunReport;
3. ``dist.barrier()`` then ``destroy_process_group()`` (without the barrier, teardown
   aborted intermittently on this machine).

Faults: any exception prints ``planner.runtime: rank R failed at step K: ...`` on stderr
and the process leaves at once (``os._exit``) with 1 (2 for invalid input). The first rank
to fail records its line in the process group's store; a peer that then fails (broken
connection, timeout) prints ``planner.runtime: rank Q stopped: rank R failed at step K:
...``, naming the first. torchrun tears the remaining peers down; a rank that hangs instead
is ended by the process-group timeout (``--timeout-s``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from datetime import timedelta
from typing import TYPE_CHECKING

from planner.artifacts.errors import PlannerError, PlannerInputError
from planner.artifacts.kinds import RUNTIME_DTYPES, DType, OptimizerFamily
from planner.artifacts.plan import Plan, load_plan
from planner.artifacts.profile import Profile, load_profile
from planner.artifacts.report import save_report
from planner.runtime.options import FaultKind, RuntimeOptions

if TYPE_CHECKING:
    import torch

    from planner.models.workload import Workload
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
    p.add_argument("--resume", action="store_true")
    p.add_argument("--dtype", default=DType.FLOAT32.value, choices=[d.value for d in RUNTIME_DTYPES])
    p.add_argument("--optimizer", default=OptimizerFamily.SGD.value, choices=[o.value for o in OptimizerFamily])
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-steps", type=int, default=1)
    p.add_argument("--fault", default="none", choices=[f.value for f in FaultKind], help="testing: injected failure")
    p.add_argument("--fault-rank", type=int, default=0)
    p.add_argument("--fault-step", type=int, default=0)
    return p


def options_from_args(args: argparse.Namespace) -> RuntimeOptions:
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
            resume=args.resume,
            dtype=DType(args.dtype),
            optimizer=OptimizerFamily(args.optimizer),
            lr=args.lr,
            seed=args.seed,
            warmup_steps=args.warmup_steps,
            fault=FaultKind(args.fault),
            fault_rank=args.fault_rank,
            fault_step=args.fault_step,
        )
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


def _run(options: RuntimeOptions, rank: int, world_size: int) -> None:
    import torch
    import torch.distributed as dist

    from planner.runtime.check import check_plan
    from planner.runtime.collect import build_report, gather_measures
    from planner.runtime.model import cast_workload, load_workload, workload_fingerprint
    from planner.runtime.runner import run_steps

    plan = load_plan(options.plan_path)
    workload = load_workload(options.model_spec, options.seed, options.dtype)
    check_plan(plan, workload, world_size, source=options.plan_path)
    profile = load_profile(options.profile_path) if options.profile_path else None
    if profile is not None and profile.layer_names != workload.layer_names:
        raise PlannerInputError(f"{options.profile_path}: profile layers do not match model {workload.name!r}")
    cast_workload(workload, options.dtype)

    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if use_cuda else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=options.timeout_s))
    if use_cuda:
        for layer in workload.layers:
            layer.to(device)
    measure = run_steps(make_runner(plan, workload, options, rank, device, profile))
    rows = gather_measures(measure, world_size, device)
    if rank == 0 and options.report_path:
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
        save_report(report, options.report_path)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        options = options_from_args(build_parser().parse_args(argv))
        _run(options, rank, world_size)
    except PlannerError as exc:
        print(f"planner.runtime: rank {rank}: error: {exc}", file=sys.stderr, flush=True)
        os._exit(exc.exit_code)
    except Exception as exc:
        if os.environ.get("PLANNER_DEBUG"):
            traceback.print_exc()
        message = f"{exc}" if isinstance(exc, _step_failure()) else f"{type(exc).__name__}: {exc}"
        message = message if message.startswith("at step") else f"before training: {message}"
        first = _first_failure(rank, message)
        if first is None:
            print(f"planner.runtime: rank {rank} failed {message}", file=sys.stderr, flush=True)
        else:
            print(f"planner.runtime: rank {rank} stopped: rank {first}", file=sys.stderr, flush=True)
        os._exit(1)
    return 0


def _step_failure() -> type:
    from planner.runtime.runner import StepFailure

    return StepFailure


_FAILED_KEY = "planner/runtime/first_failure"


def _first_failure(rank: int, message: str) -> str | None:
    """Tell peers through the process group's store that this rank failed, unless another
    rank did first; then return that rank's line ("R failed at step K: ..."), else None.

    The store (torchrun's agent store) outlives the ranks, so a peer that then sees a
    broken connection or a timeout can name the rank that failed first. Best effort: with
    no store, or none reachable, each rank just reports its own failure.
    """
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        if not dist.is_initialized():
            return None
        store = distributed_c10d._get_default_store()
        line = f"{rank} failed {message}"
        if store.add(_FAILED_KEY + "/count", 1) == 1:
            store.set(_FAILED_KEY, line)
            return None
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            if store.check([_FAILED_KEY]):
                return store.get(_FAILED_KEY).decode()
            time.sleep(0.05)
    except Exception:
        return None
    return None
