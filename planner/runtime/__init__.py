"""The runtime: execute a Plan under torchrun with torch.distributed (gloo on CPU, NCCL on GPU).

    torchrun --nproc-per-node N -m planner.runtime --plan PLAN.json --model SPEC [--steps N]
        [--report OUT.json] [--emulate [--profile PROFILE.json]] [--timeout-s S]
        [--checkpoint-dir D --checkpoint-every K] [--resume] [--dtype float32|float64]
        [--optimizer sgd|adamw] [--lr LR]

or ``planner run PLAN.json --model SPEC ...``, which launches torchrun for you.

Decisions, checked with torch 2.13 and gloo on CPU:

- ``torch.distributed.pipelining`` runs the schedules: ``PipelineStage`` in static mode (shapes
  from a no-grad forward at start-up; no pickled metadata crosses ranks), ``ScheduleGPipe``
  and ``Schedule1F1B``. Interleaved 1F1B is refused by the plan check for now.
- Mean loss: each micro-batch's loss is divided by M inside the loss function and the
  schedule's ``scale_grads`` is off (its in-place scaling races with async all-reduces).
- Data parallel: our own bucketed async all-reduce on post-accumulate-grad hooks
  (``grads``), not DDP (DDP around a pipeline stage needs ``find_unused_parameters=True``
  with GPipe, and ``static_graph=True`` silently skipped the sync here).
- Tied parameters split over stages: one copy per stage, gradients summed over stages and
  averaged over replicas by one all-reduce after the schedule.
- Emulation stretches each stage chunk to its profiled time (``emulate``).

Modules, one job each: ``options`` (flags), ``model`` (load, cast, fingerprint a workload),
``check`` (plan vs model and world, before compute), ``topology`` (placement and groups),
``stage`` (layer range and recompute), ``memory`` (bytes saved for backward), ``emulate``,
``grads`` (data-parallel and tied gradients), ``engine`` (one rank's training loop),
``checkpoint``, ``collect`` (RunReport), ``main`` (process lifecycle). Only this package,
``planner.models`` and ``planner.profiling`` import torch.
"""
