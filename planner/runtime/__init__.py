"""The runtime: execute a Plan under torchrun with torch.distributed (gloo on CPU, NCCL on GPU).

    torchrun --nproc-per-node N -m planner.runtime --plan PLAN.json --model SPEC [--steps N]
        [--report OUT.json] [--emulate [--profile PROFILE.json]] [--timeout-s S]
        [--checkpoint-dir D --checkpoint-every K [--keep-last N]] [--resume
        [--allow-resume-change lr]] [--dtype float32|float64] [--optimizer sgd|adamw] [--lr LR]

or ``planner run PLAN.json --model SPEC ...``, which launches torchrun for you.

Decisions, checked with torch 2.13 and gloo on CPU:

- ``torch.distributed.pipelining`` runs the schedules as data: ``PipelineStage`` in static mode
  (shapes from a no-grad forward at start-up; no pickled metadata crosses ranks) under torch's
  action-list runtime ``_PipelineScheduleRuntime``, fed the plan's per-rank action lists
  (``planner.schedule.layout_schedule``, the simulator's) for every schedule: GPipe, 1F1B,
  interleaved 1F1B, ZB-H1, ZB-H2, ZBV (``actions``). Several stages per rank (interleaved:
  ``num_stages = P x v``, stage s on pipeline rank s mod P; ZBV's V): each rank builds one
  ``PipelineStage`` chunk per stage (own module, optimizer, timer, meter and checkpoint file
  each); the plan check refuses, with one line, a shape the orders are not built for
  (``planner.schedule.rules.check_schedule_rules``, e.g. M not a multiple of max(1, M // P))
  and dry-runs the orders (``planner.schedule.validate_schedule``).
- Mean loss: each micro-batch's loss is divided by M inside the loss function and the
  schedule's ``scale_grads`` is off (its in-place scaling races with async all-reduces).
- Data parallel: our own bucketed async all-reduce on post-accumulate-grad hooks over all of
  the rank's chunks' parameters (``grads``), not DDP (DDP around a pipeline stage needs ``find_unused_parameters=True``
  with GPipe, and ``static_graph=True`` silently skipped the sync here).
- Tied parameters split over pipeline ranks: one copy per rank, gradients summed over those
  ranks and averaged over replicas by one all-reduce after the schedule.
- ZeRO 1 / 2 (``plan.layout.zero``, D > 1): each stage's data-parallel parameters are flattened and
  each rank's optimizer steps only its contiguous 1/D shard; gradients are reduce-scattered
  after the schedule and the weights all-gathered after the step (``zero``; tied parameters
  split over pipeline ranks stay whole). Checkpoints keep one optimizer file per shard.
- Placement: every rank's coordinates, groups and device mesh come from the plan's
  ``Layout`` (``planner.artifacts.layout``: ``coordinates``, ``stage_indices``, ``rank_of``,
  ``grad_group``, ``mesh_shape``, ``MESH_DIMS``); nothing here computes a rank from the degrees.
- Tensor parallelism (``plan.layout.tp_degree`` = t > 1, ``tensor``): the layout's ("pp", "dp",
  "cp", "tp") device mesh of shape (P, D, 1, t) (``topology.build_mesh``); each stage's layers are
  split with ``parallelize_module`` and the styles the workload declares
  (``Workload.tensor_parallel``; the zoo GPT and BERT: Megatron's column / row split,
  ``SequenceParallel`` norms with sequence parallelism); pipeline messages over "pp", the
  gradient all-reduce over "dp" on local shards; split layers take and return whole tensors.
  ZeRO shards the local shards; checkpoints are per tp index. Refused before compute: t not
  dividing the heads (or, with sequence parallelism, the tokens); per-stage replication with
  t > 1 is not a Layout at all.
- Context parallelism (``plan.layout.cp_degree`` = c > 1, ``context``): each stage replica's
  sequences split over the mesh's "cp" line, rank i holding chunks i and 2c - 1 - i of 2c;
  keys and values all-gathered in attention (autograd; backward reduce-scatters; a kept
  core saves only the rank's own and re-gathers them in backward), masks and positions
  global (``planner.models.context``); gradients averaged over a stage's D x c ranks, ZeRO
  sharded over them. Refused before compute: a model that declares no split
  (``Workload.context_parallel``: the zoo GPT, the Hugging Face llama family), 2c not
  dividing the tokens, c with sequence parallelism.
- Emulation stretches each stage chunk to its profiled time (``emulate``).
- Plans replicated per stage (``plan.layout.replicated_per_stage``, PipeDream's round-robin) run on our
  own executor (``replicated``): a ``PipelineStage`` has one fixed peer per direction, while
  micro-batch m goes to copy m mod R_s of each stage; ``exchange`` lays out the
  point-to-point messages and dry-runs them.

Modules, one job each: ``options`` (flags), ``model`` (load, cast, fingerprint a workload),
``check`` (plan vs model and world, before compute), ``topology`` (a rank's place in the
Layout, its groups and device mesh), ``stage`` (one stage's layer range and recompute),
``memory`` (bytes saved for backward), ``emulate``, ``grads`` (data-parallel and tied
gradients, the rank's whole sync), ``zero`` (sharded optimizer state and gradients), ``tensor``
(tensor parallelism: split layers), ``context`` (context parallelism: split sequences),
``stage_helpers`` (what both executors do to a stage:
boundary examples, chunks, optimizers, tied parameters, the loss), ``runner`` (the ``Runner``
protocol and the step loop), ``trainer`` (the training step, once), ``engine`` (the executor
on ``torch.distributed.pipelining``), ``actions`` (the plan's action lists in torch's
action-list runtime, checked against the plan; sends waited one at a time), ``replicated`` (our executor for plans replicated per
stage), ``exchange`` (its messages and their dry run), ``checkpoint`` (what a rank saves and
resumes), ``checkpoint_files`` (hashed atomic writes, manifests, verification, pruning, the
directory lock, the settings a resume must match), ``collect`` (RunReport), ``main`` (a rank's
order of work), ``lifecycle`` (phases, signals, launcher death, the one way out),
``liveness`` (heartbeats through torchrun's store, the rank at fault named), ``loss`` (``(sum, count)`` losses: the step's count
and the gradient scale), ``preflight`` (what ``planner run`` checks in the launcher before
torchrun: dtype, optimizer, world size, model). Only this package, ``planner.models`` and
``planner.profiling.measured`` import torch.
"""
