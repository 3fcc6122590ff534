"""One rank's training loop for a plan replicated per stage (PipeDream's round-robin, flushed).

``torch.distributed.pipelining`` cannot run these plans: a ``PipelineStage`` talks to one
fixed peer per direction, while copy ``r`` of stage ``s`` exchanges micro-batch ``m`` with
copy ``m mod R_{s-1}`` of the stage before and copy ``m mod R_{s+1}`` of the stage after. So
this module executes the rank's action order itself, on plain point-to-point ops:

- the order is ``planner.schedule.build_replicated_schedule`` (the one the simulator
  replays): GPipe or 1F1B, flushed, over the copy's micro-batches ``r, r + R_s, ...``;
- before action ``i`` the rank posts the sends of action ``i - 1`` and the receives of
  action ``i`` as one ``batch_isend_irecv`` group and waits for the receives (sends are
  waited at the end of the schedule; a coalesced NCCL group is waited whole, a stream wait); ``planner.runtime.exchange`` lays the messages out
  and its dry run shows the orders neither hang nor mismatch, with NCCL's rendezvous sends;
  tags (2m for activations, 2m + 1 for gradients) match micro-batches on gloo;
- ``sF m``: the received tensors (floating ones as leaves needing grad; stage 0 slices
  samples [m b, (m + 1) b) of the global batch) run through the ``StageModule`` (the plan's
  recomputation); the last stage computes ``loss_fn(out, target) / M``, as the engine (a
  ``(sum, count)`` loss: its sum, the gradients scaled by 1 / the step's count after the
  copies' sum, ``planner.runtime.loss``);
- ``sB m``: backward of the loss or of the outputs against the received gradients, then
  the inputs' gradients (zeros where unused) go back; integer tensors carry no gradient;
- shapes and dtypes are static, from a no-grad forward of micro-batch 0 at start-up
  (``engine._boundary_examples``), so receive buffers are allocated without metadata;
- after the schedule, a stage's copies sum their gradients (each copy ran M / R_s
  micro-batches of loss / M, so the sum is one process's gradient) with the engine's bucketed
  async all-reduce (``DataParallelHooks`` over the copies' group, divisor 1), and a tied
  parameter split over stages sums over every rank of every stage holding it (``sync_tied``);
- ZeRO 1 / 2 (``plan.layout.zero``): a stage's copies shard its optimizer state (and with 2 its
  gradients) among themselves with the engine's ``planner.runtime.zero.ShardedState`` (divisor
  1), in place of the all-reduce; a tied parameter stays whole; a stage with one copy has
  nothing to shard.

Measurements, checkpoints, faults and emulation are the engine's, per rank (one stage each).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile
from planner.runtime import checkpoint as ckpt
from planner.runtime.emulate import finish_chunk, reset_chunk_timer, stage_chunk_ms
from planner.runtime.engine import (
    RankMeasure,
    StepMeasure,
    StepUnit,
    _as_args,
    _boundary_examples,
    _held_grad_bytes,
    _make_optimizer,
    run_steps,
)
from planner.runtime.exchange import Message, exchange_groups
from planner.runtime.grads import DataParallelHooks, sync_tied
from planner.runtime.loss import LossCounts, scale_grads
from planner.runtime.model import cast_batch
from planner.runtime.options import RuntimeOptions
from planner.runtime.stage import StageModule
from planner.runtime.zero import ShardedState
from planner.schedule.actions import ActionKind
from planner.schedule.build import build_replicated_schedule
from planner.models.workload import Workload

__all__ = ["ReplicatedRunner", "TensorSpec", "layout_of", "stage_copy_of"]


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Shape and dtype of one tensor crossing a stage boundary."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def floating(self) -> bool:
        return self.dtype.is_floating_point


def _specs(value: Any) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(tuple(t.shape), t.dtype) for t in _as_args(value))


def layout_of(plan: Plan) -> tuple[tuple[int, ...], ...]:
    """Per stage, its copies' ranks (copy r of stage s is ``plan.stages[s].ranks[r]``)."""
    return tuple(tuple(stage.ranks) for stage in plan.stages)


def stage_copy_of(plan: Plan, rank: int) -> tuple[int, int]:
    """(stage index, copy index) of ``rank``."""
    for stage in plan.stages:
        if rank in stage.ranks:
            return stage.stage_idx, stage.ranks.index(rank)
    raise ValueError(f"rank {rank} runs no stage of the plan ({plan.num_devices} devices)")


def _micro(value: Any, mb_idx: int, size: int) -> Any:
    """Samples [mb_idx x size, (mb_idx + 1) x size) of a batch (tensor or tuple of tensors)."""
    if isinstance(value, tuple):
        return tuple(_micro(v, mb_idx, size) for v in value)
    return value[mb_idx * size : (mb_idx + 1) * size]


@dataclass(slots=True)
class _Saved:
    """What one in-flight micro-batch keeps for its backward."""

    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]  # the loss alone on the last stage


_Transfer = tuple[Message, tuple[torch.Tensor, ...]]  # a message and its tensors (sent or receive buffers)


def _new_group(ranks: tuple[int, ...], timeout_s: float) -> Any:
    return dist.new_group(list(ranks), timeout=timedelta(seconds=timeout_s))


class ReplicatedRunner:
    """One rank of a plan replicated per stage: its stage copy, action order, optimizer, groups."""

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
        self.rank = rank
        self.device = device
        self.stage_idx, self.copy_idx = stage_copy_of(plan, rank)
        self.stage_plan = stage = plan.stages[self.stage_idx]
        self.is_first = self.stage_idx == 0
        self.is_last = self.stage_idx == plan.layout.num_stages - 1
        layout = layout_of(plan)
        self.order = build_replicated_schedule(plan.schedule, plan.layout.stage_replicas, plan.num_microbatches)[rank]
        self.exchanges = exchange_groups(layout, self.order)
        recompute = [i in stage.recompute for i in range(stage.layer_start, stage.layer_stop)]
        self.module = StageModule(list(workload.layers[stage.layer_start : stage.layer_stop]), recompute).to(device)
        inputs, _ = self._batch(0)
        example_in, example_out = _boundary_examples(
            workload, stage.layer_start, stage.layer_stop, _micro(inputs, 0, plan.microbatch_size)
        )
        self.in_specs = _specs(example_in)
        self.out_grad_specs = tuple(s for s in _specs(example_out) if s.floating)
        self.emulated_ms = stage_chunk_ms(plan, self.stage_idx, profile) if options.emulate else None
        reset_chunk_timer(self)  # compute_s and the emulation overruns of the step
        self.loss_counts = LossCounts(plan.num_microbatches)
        self.grad_bytes: tuple[int, ...] = (0,)  # held after the sync, per stage (one here)
        self.copy_group, self.tied_params, self.tied_groups = self._build_groups(layout)
        self.dp_hooks: DataParallelHooks | None = None
        self.zero: ShardedState | None = None
        self.optimizer = self._build_sync()

    def _build_sync(self) -> torch.optim.Optimizer:
        """The gradient sync over the stage's copies (bucketed all-reduce, or ZeRO shards) and the
        optimizer; tied parameters are left to ``sync_tied`` and stepped whole."""
        tied_ids = {id(p) for p in self.tied_params if p is not None}
        params = list(self.module.parameters())
        synced = [p for p in params if id(p) not in tied_ids and p.requires_grad]
        if self.copy_group is None or not synced:
            return _make_optimizer(self.options, params)
        if self.plan.layout.zero:  # the copies' gradients summed (divisor 1), each copy steps its shard
            self.zero = ShardedState(synced, self.copy_group, zero=self.plan.layout.zero, grad_divisor=1)
            whole = [p for p in params if id(p) in tied_ids or not p.requires_grad]
            return _make_optimizer(self.options, [self.zero.master] + whole)
        self.dp_hooks = DataParallelHooks(synced, self.copy_group, 1)  # a sum: loss / M per micro-batch
        return _make_optimizer(self.options, params)

    def _build_groups(self, layout: tuple[tuple[int, ...], ...]) -> tuple[Any, list[Any], list[Any]]:
        """Every rank creates every group in the same order (``new_group`` is collective):
        one per stage with >= 2 copies, then one per tie split over >= 2 stages."""
        timeout = self.options.timeout_s
        copy_group = None
        for ranks in layout:
            if len(ranks) >= 2:
                group = _new_group(ranks, timeout)
                if self.rank in ranks:
                    copy_group = group
        stage = self.stage_plan
        params: list[Any] = []
        groups: list[Any] = []
        for tie in self.workload.tied:
            holders = [s for s in self.plan.stages if any(s.layer_start <= i < s.layer_stop for i, _ in tie)]
            mine = [(i, name) for i, name in tie if stage.layer_start <= i < stage.layer_stop]
            if len(holders) < 2:  # one stage: one tensor, synchronised with the stage's other parameters
                params.append(None)
                groups.append(None)
                continue
            ranks = tuple(r for s in holders for r in s.ranks)
            group = _new_group(ranks, timeout)
            params.append(self.workload.layers[mine[0][0]].get_parameter(mine[0][1]) if mine else None)
            groups.append(group if mine else None)
        return copy_group, params, groups

    def _batch(self, step_idx: int) -> tuple[Any, Any]:
        """The whole global batch of step ``step_idx`` (each micro-batch is sliced from it)."""
        inputs, targets = self.workload.make_batch(self.plan.global_batch, self.options.seed + step_idx)

        def to_device(value: Any) -> Any:
            return tuple(to_device(v) for v in value) if isinstance(value, tuple) else value.to(self.device)

        return cast_batch(to_device(inputs), self.options.dtype), to_device(targets)

    # ---------------------------------------------------------------- communication
    def _buffers(self, msg: Message) -> tuple[torch.Tensor, ...]:
        specs = self.in_specs if msg.kind is ActionKind.FORWARD else self.out_grad_specs
        return tuple(torch.empty(s.shape, dtype=s.dtype, device=self.device) for s in specs)

    def _post(self, outbox: list[_Transfer], inbox: list[_Transfer]) -> tuple[list[Any], list[Any]]:
        """Post one group: the previous action's sends, then this action's receives. Returns
        (works to wait for before computing, works to wait for by the end of the step): with one
        work per op (gloo) only the receives hold up the compute -- a send completes only once
        its peer reaches the matching receive, and waiting for that here would stall this rank
        behind its peer's schedule; a coalesced group (NCCL: one work, a stream wait) is waited
        whole."""
        sends = [dist.P2POp(dist.isend, t, msg.dst, tag=msg.tag) for msg, tensors in outbox for t in tensors]
        recvs = [dist.P2POp(dist.irecv, t, msg.src, tag=msg.tag) for msg, tensors in inbox for t in tensors]
        if not sends and not recvs:
            return [], []
        works = list(dist.batch_isend_irecv(sends + recvs))
        if len(works) == len(sends) + len(recvs):
            return works[len(sends):], works[: len(sends)]
        return (works, []) if recvs else ([], works)

    # ---------------------------------------------------------------- compute
    def _timed(self, which: int, start: float) -> None:
        finish_chunk(self, start, which)

    def _forward(
        self, mb_idx: int, received: tuple[torch.Tensor, ...], inputs: Any, targets: Any
    ) -> tuple[_Saved, tuple[torch.Tensor, ...]]:
        """Returns what backward needs (the loss on the last stage) and what to send (the detached outputs)."""
        b = self.plan.microbatch_size
        if self.is_first:
            args = _as_args(_micro(inputs, mb_idx, b))
        else:
            args = tuple(t.requires_grad_(t.is_floating_point()) for t in received)
        start = time.perf_counter()
        out = self.module(*args)
        if self.is_last:
            meter = self.module.meter.hooks() if self.module.metering else contextlib.nullcontext()
            with meter:  # the loss's saved tensors belong to the last stage, as in the profile
                loss = self.loss_counts.micro_loss(self.workload.loss_fn(out, _micro(targets, mb_idx, b)))
            self._timed(0, start)
            return _Saved(inputs=args, outputs=(loss,)), ()
        outs = _as_args(out)
        self._timed(0, start)
        return _Saved(inputs=args, outputs=outs), tuple(t.detach().contiguous() for t in outs)

    def _backward(self, saved: _Saved, received: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """Runs backward; returns the input gradients to send (none on stage 0)."""
        start = time.perf_counter()
        if self.is_last:
            saved.outputs[0].backward()
        else:
            floating = [t for t in saved.outputs if t.is_floating_point()]
            pairs = [(t, g) for t, g in zip(floating, received, strict=True) if t.requires_grad]
            if pairs:
                torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
        grads: tuple[torch.Tensor, ...] = ()
        if not self.is_first:
            grads = tuple(
                t.grad if t.grad is not None else torch.zeros_like(t) for t in saved.inputs if t.is_floating_point()
            )
        self._timed(1, start)
        return grads

    def _run_schedule(self, inputs: Any, targets: Any) -> float:
        """The rank's action order once; returns its summed micro-batch losses (0 off the last stage)."""
        in_flight: dict[int, _Saved] = {}
        losses: list[torch.Tensor] = []
        unwaited: list[Any] = []  # works of groups that only send, waited at the end
        sending: list[tuple[torch.Tensor, ...]] = []  # alive until every send has completed
        outbox: list[_Transfer] = []
        for idx, action in enumerate(self.order):
            inbox = [(msg, self._buffers(msg)) for msg in self.exchanges[idx] if msg.dst == self.rank]
            now, later = self._post(outbox, inbox)
            sending += [tensors for _, tensors in outbox]
            for work in now:
                work.wait()
            unwaited += later
            received = inbox[0][1] if inbox else ()
            if action.kind is ActionKind.FORWARD:
                saved, sent = self._forward(action.mb_idx, received, inputs, targets)
                in_flight[action.mb_idx] = saved
                if self.is_last:
                    losses.append(saved.outputs[0].detach())
            else:
                sent = self._backward(in_flight.pop(action.mb_idx), received)
            outbox = [(msg, sent) for msg in self.exchanges[idx + 1] if msg.src == self.rank and sent]
        unwaited += sum(self._post(outbox, []), [])
        for work in unwaited:
            work.wait()
        sending.clear()
        return float(sum(loss.double() for loss in losses)) if losses else 0.0

    # ---------------------------------------------------------------- the loop
    def train_step(self, step_idx: int) -> StepMeasure:
        self.module.zero_grad(set_to_none=True)
        inputs, targets = self._batch(step_idx)  # data loading is not part of the timed step
        dist.barrier()
        start = time.perf_counter()
        if self.dp_hooks is not None:
            self.dp_hooks.start_iteration(self.plan.num_microbatches // self.stage_plan.replicas)
        if self.zero is not None:
            self.zero.start_iteration()
        self.loss_counts.start_step()
        loss_sum = self._run_schedule(inputs, targets)
        count = self.loss_counts.total(self.device)  # (sum, count) losses: the step's count, else None
        if self.dp_hooks is not None:
            self.dp_hooks.finish_iteration()
        if self.zero is not None:
            self.zero.launch_sync()
        sync_tied(self.tied_params, self.tied_groups, 1)  # while the reduce-scatter runs
        if self.zero is not None:
            self.zero.wait_sync()
        self.grad_bytes = (_held_grad_bytes(self.optimizer),)
        if count is not None:  # the copies summed their summed losses' gradients: / count
            scale_grads([self.optimizer], 1.0 / count)
        self.optimizer.step()
        if self.zero is not None:
            self.zero.gather_params()
        wall_ms = (time.perf_counter() - start) * 1000.0
        stats = torch.tensor([loss_sum, wall_ms], dtype=torch.float64, device=self.device)  # NCCL needs device tensors
        loss_t, wall_t = stats[:1].clone(), stats[1:].clone()
        dist.all_reduce(loss_t, op=dist.ReduceOp.SUM)
        dist.all_reduce(wall_t, op=dist.ReduceOp.MAX)
        loss = float(loss_t) / count if count is not None else float(loss_t)
        return StepMeasure(step_idx=step_idx, loss=loss, wall_ms=float(wall_t))

    @property
    def optimizer_shards(self) -> int:
        """Ranks this rank's optimizer state is sharded over: R_s with ZeRO >= 1, else 1."""
        return self.stage_plan.replicas if self.zero is not None else 1

    def resume(self) -> int:
        done = ckpt.load_checkpoint(
            self.options.checkpoint_dir,
            self.stage_idx,
            self.module,
            self.optimizer,
            replica=self.copy_idx,
            optimizer_shards=self.optimizer_shards,
        )
        if self.zero is not None:
            self.zero.reload_master()
        return done

    @property
    def checkpoint_replica(self) -> int:
        """Which copy of its stage this rank is (copy 0 writes the model in checkpoints)."""
        return self.copy_idx

    def step_units(self) -> list[StepUnit]:
        return [StepUnit(stage_idx=self.stage_idx, module=self.module, optimizer=self.optimizer, timer=self)]

    def run(self) -> RankMeasure:
        return run_steps(self)
