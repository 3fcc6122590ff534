"""One rank's training loop: build the rank's stage(s), run the plan's schedule, measure.

Built on ``torch.distributed.pipelining`` (checked with gloo on CPU, torch 2.13):

- ``PipelineStage`` in *static* mode: the stage's input and output examples are computed
  up front by a no-grad forward of the layers before and in the stage on one micro-batch,
  so no metadata objects (pickles) cross ranks at run time.
- ``ScheduleGPipe``, ``Schedule1F1B`` and ``ScheduleInterleaved1F1B`` with
  ``scale_grads=False`` and a loss of ``loss_fn / M`` (the mean over micro-batches; a
  ``(sum, count)`` loss back-propagates its sum and the gradients are scaled by D / the step's
  count after the sync, ``planner.runtime.loss``),
  because the schedule's in-place gradient scaling would race with our async
  data-parallel all-reduces (``planner.runtime.grads``).
  In ``Schedule1F1B`` stage s runs min(P - s, M) warm-up forwards, so it holds at most
  min(P - s, M) micro-batches of activations, as the cost model assumes.
- Interleaved 1F1B: the rank builds one ``PipelineStage`` per stage it runs (stages p,
  p + P, ..., ``num_stages = P x v``, torch's looped placement) and hands them all to
  ``ScheduleInterleaved1F1B``. Each stage is a *chunk* with its own module, meter, timer and
  optimizer (the optimizers step the rank's unique parameters once each: a parameter two
  chunks share, a tie within the rank, belongs to the first chunk's optimizer), so
  checkpoints and measurements stay per stage. With v = 1 the rank has one chunk.
- ZeRO 1 and 2 (``plan.layout.zero``, with D > 1): each chunk's data-parallel parameters get a
  ``planner.runtime.zero.ShardedState`` and the chunk's optimizer steps its master shard
  (plus any parameter tied across pipeline ranks, unsharded) instead of the parameters; the
  gradients are reduce-scattered after the schedule and the weights all-gathered after the
  step, in place of the bucketed all-reduce.

Data: step k uses ``make_batch(global_batch, seed + k)``; replica r takes samples
[r M b, (r + 1) M b), which the schedule splits into M micro-batches along dim 0. So the
run trains on exactly the batches one process would, in the same order.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from planner.artifacts.plan import Plan, PlanStage
from planner.artifacts.profile import Profile
from planner.artifacts.request import ScheduleKind
from planner.runtime import checkpoint as ckpt
from planner.runtime.emulate import finish_chunk, reset_chunk_timer, stage_chunk_ms
from planner.runtime.grads import DataParallelHooks, sync_tied
from planner.runtime.loss import LossCounts, scale_grads
from planner.runtime.model import cast_batch
from planner.runtime.options import FaultKind, RuntimeOptimizer, RuntimeOptions
from planner.runtime.stage import StageModule
from planner.runtime.tensor import build_mesh, local, parallelize_layers
from planner.runtime.topology import Groups, Placement, build_groups
from planner.runtime.zero import ShardedState, optimizer_state_bytes
from planner.models.workload import Workload


class StepFailure(RuntimeError):
    """An exception raised during a training step, tagged with the step index."""

    def __init__(self, step_idx: int, cause: BaseException) -> None:
        self.step_idx = step_idx
        super().__init__(f"at step {step_idx}: {type(cause).__name__}: {cause}")


class TimedStage(PipelineStage):
    """A ``PipelineStage`` that adds up the seconds spent in its forward and backward chunks,
    and, when ``emulated_ms`` is set, stretches each chunk to its profiled (fwd, bwd) time
    (see ``planner.runtime.emulate``)."""

    compute_s: float = 0.0
    emulated_ms: tuple[float, float] | None = None
    overrun_s: float = 0.0  # emulated chunks only: seconds past their profiled time (planner.runtime.emulate)
    overrun_max_s: float = 0.0
    emulated_s: float = 0.0

    def _finish(self, start: float, which: int) -> None:
        finish_chunk(self, start, which)

    def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = super().forward_one_chunk(*args, **kwargs)
        self._finish(start, 0)
        return out

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = super().backward_one_chunk(*args, **kwargs)
        self._finish(start, 1)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class StepMeasure:
    step_idx: int
    loss: float
    wall_ms: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RankMeasure:
    """What one rank measured; gathered to rank 0 for the RunReport."""

    steps: tuple[StepMeasure, ...]
    compute_ms: float  # all the rank's chunks together
    idle_ms: float
    saved_bytes_peak: int  # the largest over the rank's chunks
    cuda_peak_bytes: int
    stage_indices: tuple[int, ...] = ()
    stage_compute_ms: tuple[float, ...] = ()  # per chunk, in ``stage_indices`` order
    stage_saved_bytes_peak: tuple[int, ...] = ()
    stage_optimizer_state_bytes: tuple[int, ...] = ()  # per chunk, after the last step
    stage_grad_bytes: tuple[int, ...] = ()  # per chunk, held after the gradient sync of the last step
    stage_overrun_ms: tuple[float, ...] = ()  # per chunk, emulated: ms past the profiled times per timed step
    stage_overrun_max_ms: tuple[float, ...] = ()  # per chunk, emulated: the largest overrun of one action
    stage_emulated_ms: tuple[float, ...] = ()  # per chunk, emulated: the profiled ms of its actions per step


def _boundary_examples(workload: Workload, start: int, stop: int, mb_inputs: Any) -> tuple[Any, Any]:
    """Input of layer ``start`` and output of layer ``stop - 1`` for one micro-batch (no grad)."""
    x = mb_inputs
    stage_input = None
    with torch.no_grad():
        for idx in range(stop):
            if idx == start:
                stage_input = x
            x = workload.layers[idx](x)
    return stage_input, x


def _as_args(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, tuple) else (value,)


def _grad_examples(value: Any) -> tuple[Any, ...]:
    """Example tensors marked as needing grad where floating (activations, not token ids):
    static ``PipelineStage`` metadata decides from them which gradients cross stages. Contiguous,
    as the stage module's outputs are: receive buffers are allocated like them, and gloo sends
    and receives only contiguous tensors."""
    return tuple(t.detach().contiguous().requires_grad_(t.is_floating_point()) for t in _as_args(value))


def _make_optimizer(options: RuntimeOptions, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if options.optimizer is RuntimeOptimizer.ADAMW:
        return torch.optim.AdamW(params, lr=options.lr, foreach=False)
    return torch.optim.SGD(params, lr=options.lr, foreach=False)


def _tied_params(workload: Workload, plan: Plan, place: Placement) -> tuple[tuple[tuple[int, ...], ...], list[Any]]:
    """Per tied group: the pipeline ranks holding it, and this rank's copy when the group spans
    pipeline ranks (else None)."""
    mine_stages = [plan.stages[s] for s in place.stage_indices]
    rank_sets = []
    mine: list[Any] = []
    for group in workload.tied:
        holders = sorted(
            {place.pipeline_rank_of(s.stage_idx) for s in plan.stages for i, _ in group if s.layer_start <= i < s.layer_stop}
        )
        rank_sets.append(tuple(holders))
        local = [(i, name) for i, name in group for st in mine_stages if st.layer_start <= i < st.layer_stop]
        split = len(holders) >= 2  # a tie inside one rank is one tensor: plain data parallel
        mine.append(workload.layers[local[0][0]].get_parameter(local[0][1]) if local and split else None)
    return tuple(rank_sets), mine


def _held_grad_bytes(optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes of the storages holding the gradients of the optimizer's parameters (each
    storage once: with ZeRO 1 the shard's gradient is a view of the kept flat buffer)."""
    if optimizer is None:
        return 0
    storages = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None:
                storage = local(param.grad).untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _maybe_fault(options: RuntimeOptions, rank: int, step_idx: int) -> None:
    if options.fault is FaultKind.NONE or rank != options.fault_rank or step_idx != options.fault_step:
        return
    if options.fault is FaultKind.KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    if options.fault is FaultKind.HANG:
        while True:  # peers must give up after --timeout-s; torchrun then ends this process
            time.sleep(1.0)
    raise RuntimeError(f"injected fault (--fault raise) at step {step_idx}")


@dataclass(slots=True, kw_only=True)
class Chunk:
    """One stage run by this rank: its plan entry, module, pipelining stage and optimizer."""

    stage_plan: PlanStage
    module: StageModule
    pipe_stage: TimedStage
    optimizer: torch.optim.Optimizer | None  # None when another chunk of the rank owns all its parameters
    zero: ShardedState | None = None  # ZeRO >= 1: the optimizer steps this shard (and the tied parameters)

    @property
    def stage_idx(self) -> int:
        return self.stage_plan.stage_idx


class RankRunner:
    """Everything one rank holds for a run: its stage chunk(s), schedule, optimizers and groups."""

    def __init__(
        self,
        plan: Plan,
        workload: Workload,
        options: RuntimeOptions,
        rank: int,
        device: torch.device,
        profile: Profile | None = None,
    ) -> None:
        self.plan = plan
        self.workload = workload
        self.options = options
        self.device = device
        self.place = Placement(
            num_stages=plan.layout.num_stages,
            dp_degree=plan.layout.dp_degree,
            rank=rank,
            virtual_stages_per_rank=plan.layout.virtual_stages_per_rank,
            tp_degree=plan.layout.tp_degree,
        )
        tied_sets, self.tied_params = _tied_params(workload, plan, self.place)
        mesh = build_mesh(plan, device, options.timeout_s) if plan.layout.tp_degree > 1 else None
        self.groups: Groups = build_groups(self.place, tied_sets, options.timeout_s, mesh)
        tied_ids = {id(p) for p in self.tied_params if p is not None}
        shard_group = self.groups.data_parallel if plan.layout.zero > 0 else None
        mb_inputs, _ = self._replica_batch(0)
        first_mb = self._first_microbatch(mb_inputs)
        self.chunks: list[Chunk] = []
        seen: set[int] = set()
        uses: dict[int, int] = {}
        for stage_idx in self.place.stage_indices:
            stage = plan.stages[stage_idx]
            layers = list(workload.layers[stage.layer_start : stage.layer_stop])
            recompute = [i in stage.recompute for i in range(stage.layer_start, stage.layer_stop)]
            example_in, example_out = _boundary_examples(workload, stage.layer_start, stage.layer_stop, first_mb)
            if self.groups.tensor is not None:  # split after the examples: they come from whole layers
                parallelize_layers(workload, range(stage.layer_start, stage.layer_stop), self.groups.tensor, plan.layout.sequence_parallel)
            module = StageModule(layers, recompute).to(device)
            pipe_stage = TimedStage(
                module,
                stage_idx,
                plan.layout.num_stages,
                device,
                input_args=_as_args(example_in) if stage_idx == 0 else _grad_examples(example_in),
                output_args=_grad_examples(example_out),
                group=self.groups.pipeline,
            )
            if options.emulate:
                pipe_stage.emulated_ms = stage_chunk_ms(plan, stage_idx, profile)
            own = []
            for param in module.parameters():
                uses[id(param)] = uses.get(id(param), 0) + 1
                if id(param) not in seen:  # a parameter two chunks share is stepped once
                    seen.add(id(param))
                    own.append(param)
            sharded = [p for p in own if id(p) not in tied_ids and p.requires_grad] if shard_group is not None else []
            zero = ShardedState(sharded, shard_group, zero=plan.layout.zero, grad_divisor=plan.layout.dp_degree) if sharded else None
            if zero is not None:
                own = [zero.master] + [p for p in own if id(p) in tied_ids or not p.requires_grad]
            optimizer = _make_optimizer(options, own) if own else None
            self.chunks.append(Chunk(stage_plan=stage, module=module, pipe_stage=pipe_stage, optimizer=optimizer, zero=zero))
        num_mb = plan.num_microbatches
        counts = self.loss_counts = LossCounts(num_mb, plan.layout.tp_degree)
        last = next((c.module for c in self.chunks if c.pipe_stage.is_last), self.chunks[-1].module)

        def loss_fn(out: Any, target: Any) -> Any:
            if not last.metering:
                return counts.micro_loss(workload.loss_fn(out, target))
            with last.meter.hooks():  # the loss's saved tensors belong to the last stage, as in the profile
                return counts.micro_loss(workload.loss_fn(out, target))

        if plan.schedule is ScheduleKind.INTERLEAVED_1F1B:
            stages = [c.pipe_stage for c in self.chunks]
            self.schedule: Any = ScheduleInterleaved1F1B(stages, num_mb, loss_fn=loss_fn, scale_grads=False)
        else:
            schedule_cls = ScheduleGPipe if plan.schedule is ScheduleKind.GPIPE else Schedule1F1B
            self.schedule = schedule_cls(self.chunks[0].pipe_stage, num_mb, loss_fn=loss_fn, scale_grads=False)
        self.is_first = any(c.pipe_stage.is_first for c in self.chunks)
        self.is_last = any(c.pipe_stage.is_last for c in self.chunks)
        params = [p for c in self.chunks if c.optimizer is not None for p in c.optimizer.param_groups[0]["params"]]
        self.dp_hooks = None
        self.grad_bytes: tuple[int, ...] = (0,) * len(self.chunks)
        if self.groups.data_parallel is not None and shard_group is None:
            dp_params = [p for p in params if id(p) not in tied_ids]
            self.dp_hooks = DataParallelHooks(dp_params, self.groups.data_parallel, plan.layout.dp_degree, uses=uses)

    @property
    def stage_plan(self) -> PlanStage:
        """The first stage this rank runs (its only one unless the schedule is interleaved)."""
        return self.chunks[0].stage_plan

    @property
    def module(self) -> StageModule:
        return self.chunks[0].module

    def _first_microbatch(self, inputs: Any) -> Any:
        b = self.plan.microbatch_size
        if isinstance(inputs, tuple):
            return tuple(t[:b] for t in inputs)
        return inputs[:b]

    def _replica_batch(self, step_idx: int) -> tuple[Any, Any]:
        plan = self.plan
        inputs, targets = self.workload.make_batch(plan.global_batch, self.options.seed + step_idx)
        per_replica = plan.num_microbatches * plan.microbatch_size
        lo, hi = self.place.replica * per_replica, (self.place.replica + 1) * per_replica

        def take(value: Any) -> Any:
            if isinstance(value, tuple):
                return tuple(take(v) for v in value)
            return value[lo:hi].to(self.device)

        return cast_batch(take(inputs), self.options.dtype), take(targets)

    def resume(self) -> int:
        done = set()
        for c in self.chunks:
            done.add(
                ckpt.load_checkpoint(
                    self.options.checkpoint_dir,
                    c.stage_idx,
                    c.module,
                    c.optimizer,
                    replica=self.place.replica,
                    optimizer_shards=self.optimizer_shards,
                    tp=self.checkpoint_tp,
                )
            )
            if c.zero is not None:
                c.zero.reload_master()
        return done.pop()  # one latest.json: the same step for every chunk

    @property
    def optimizer_shards(self) -> int:
        """Ranks each of this rank's optimizers is sharded over: D with ZeRO >= 1, else 1."""
        return self.plan.layout.dp_degree if any(c.zero is not None for c in self.chunks) else 1

    def _run_schedule(self, inputs: Any, targets: Any) -> float:
        """One iteration of the schedule; returns this rank's summed micro-batch losses (0 off the last stage)."""
        losses: list[torch.Tensor] = []
        if self.is_first and self.is_last:
            self.schedule.step(*_as_args(inputs), target=targets, losses=losses, return_outputs=False)
        elif self.is_first:
            self.schedule.step(*_as_args(inputs), return_outputs=False)
        elif self.is_last:
            self.schedule.step(target=targets, losses=losses, return_outputs=False)
        else:
            self.schedule.step(return_outputs=False)
        return float(sum(loss.detach().double() for loss in losses)) if losses else 0.0

    def train_step(self, step_idx: int) -> StepMeasure:
        for c in self.chunks:
            c.module.zero_grad(set_to_none=True)
        inputs, targets = self._replica_batch(step_idx)  # data loading is not part of the timed step
        dist.barrier()
        start = time.perf_counter()
        if self.dp_hooks is not None:
            self.dp_hooks.start_iteration(self.plan.num_microbatches)
        zero = [c.zero for c in self.chunks if c.zero is not None]
        for z in zero:
            z.start_iteration()
        self.loss_counts.start_step()
        loss_sum = self._run_schedule(inputs, targets)
        count = self.loss_counts.total(self.device)  # (sum, count) losses: the step's count, else None
        if self.dp_hooks is not None:
            self.dp_hooks.finish_iteration()
        for z in zero:  # reduce-scatter every chunk's gradients, then wait
            z.launch_sync()
        for z in zero:
            z.wait_sync()
        sync_tied(self.tied_params, list(self.groups.tied), self.plan.layout.dp_degree)
        self.grad_bytes = tuple(_held_grad_bytes(c.optimizer) for c in self.chunks)
        if count is not None:  # the gradients are the average over D of summed losses: x D / count
            scale_grads([c.optimizer for c in self.chunks], self.plan.layout.dp_degree / count)
        for c in self.chunks:
            if c.optimizer is not None:
                c.optimizer.step()
        for z in zero:
            z.gather_params()
        wall_ms = (time.perf_counter() - start) * 1000.0
        stats = torch.tensor([loss_sum, wall_ms], dtype=torch.float64, device=self.device)  # NCCL needs device tensors
        loss_t, wall_t = stats[:1].clone(), stats[1:].clone()
        dist.all_reduce(loss_t, op=dist.ReduceOp.SUM)
        dist.all_reduce(wall_t, op=dist.ReduceOp.MAX)
        if count is not None:  # summed losses over D replicas: the step's loss is their sum / count
            loss_t *= self.plan.layout.dp_degree / count
        copies = self.plan.layout.dp_degree * self.plan.layout.tp_degree  # every tp rank of a last stage has the loss
        return StepMeasure(step_idx=step_idx, loss=float(loss_t) / copies, wall_ms=float(wall_t))

    @property
    def rank(self) -> int:
        return self.place.rank

    @property
    def checkpoint_replica(self) -> int:
        """Which replica this rank is (replica 0 writes the model in checkpoints)."""
        return self.place.replica

    @property
    def checkpoint_tp(self) -> tuple[int, int]:
        """(tp index, tp degree): each tp index checkpoints its own shards."""
        return self.place.tp_index, self.plan.layout.tp_degree

    def step_units(self) -> list["StepUnit"]:
        return [StepUnit(stage_idx=c.stage_idx, module=c.module, optimizer=c.optimizer, timer=c.pipe_stage)
                for c in self.chunks]

    def run(self) -> RankMeasure:
        return run_steps(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepUnit:
    """What the step loop needs of one stage a rank runs: its module (meter), optimizer and the
    object whose ``compute_s`` adds up the stage's compute seconds."""

    stage_idx: int
    module: StageModule
    optimizer: torch.optim.Optimizer | None
    timer: Any


def run_steps(runner: Any) -> RankMeasure:
    """The training loop of any runner (``RankRunner``, ``planner.runtime.replicated``'s):
    faults, saved-bytes metering on the first step, timing after the warm-up, checkpoints, and
    the rank's measures. ``runner`` has ``options``, ``device``, ``rank``,
    ``checkpoint_replica``, ``optimizer_shards``, ``grad_bytes`` (per unit), ``resume()``,
    ``train_step(step_idx)`` and ``step_units()``."""
    options = runner.options
    units: list[StepUnit] = runner.step_units()
    start_step = runner.resume() if options.resume else 0
    steps: list[StepMeasure] = []
    compute_ms: list[list[float]] = []  # per timed step, per unit
    wall_ms: list[float] = []
    peaks = [0] * len(units)
    overruns: list[list[tuple[float, float, float]]] = []  # per timed step, per unit: (total, max, emulated) ms
    for step_idx in range(start_step, options.num_steps):
        try:
            _maybe_fault(options, runner.rank, step_idx)
            for u in units:
                reset_chunk_timer(u.timer)
                u.module.metering = step_idx == start_step  # peak saved bytes: first step only
                u.module.meter.reset_peak()
            measure = runner.train_step(step_idx)
        except Exception as exc:
            raise StepFailure(step_idx, exc) from exc
        steps.append(measure)
        if len(steps) > options.warmup_steps or len(steps) == options.num_steps - start_step:
            compute_ms.append([u.timer.compute_s * 1000.0 for u in units])
            overruns.append([(u.timer.overrun_s * 1e3, u.timer.overrun_max_s * 1e3, u.timer.emulated_s * 1e3) for u in units])
            wall_ms.append(measure.wall_ms)
        peaks = [max(peak, u.module.meter.peak_bytes) for peak, u in zip(peaks, units)]
        done = step_idx + 1
        if options.checkpoint_every and done % options.checkpoint_every == 0:
            ckpt.save_checkpoint(
                options.checkpoint_dir,
                done,
                [(u.stage_idx, u.module, u.optimizer) for u in units],
                runner.checkpoint_replica,
                optimizer_shards=runner.optimizer_shards,
                tp=getattr(runner, "checkpoint_tp", (0, 1)),  # the replicated executor has no tensor parallelism
            )
    per_stage = tuple(statistics.fmean(col) for col in zip(*compute_ms)) if compute_ms else (0.0,) * len(units)
    per_unit = list(zip(*overruns)) if overruns else [((0.0, 0.0, 0.0),)] * len(units)
    compute = sum(per_stage)
    wall = statistics.fmean(wall_ms) if wall_ms else 0.0
    device = runner.device
    cuda_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return RankMeasure(
        steps=tuple(steps),
        compute_ms=compute,
        idle_ms=max(0.0, wall - compute),
        saved_bytes_peak=max(peaks),
        cuda_peak_bytes=int(cuda_peak),
        stage_indices=tuple(u.stage_idx for u in units),
        stage_compute_ms=per_stage,
        stage_saved_bytes_peak=tuple(peaks),
        stage_optimizer_state_bytes=tuple(optimizer_state_bytes(u.optimizer) for u in units),
        stage_grad_bytes=tuple(runner.grad_bytes),
        stage_overrun_ms=tuple(statistics.fmean(o[0] for o in col) for col in per_unit),
        stage_overrun_max_ms=tuple(max(o[1] for o in col) for col in per_unit),
        stage_emulated_ms=tuple(statistics.fmean(o[2] for o in col) for col in per_unit),
    )
