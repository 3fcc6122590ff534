"""One rank's training step, written once for both executors.

:class:`RankTrainer` holds what a rank of any plan holds -- its place in the plan's Layout
(``planner.runtime.topology``), its process groups, its stage chunks with their optimizers and
gradient synchronisation (``planner.runtime.stage_helpers``), and the ``(sum, count)`` loss
bookkeeping (``planner.runtime.loss``) -- and runs a step:

1. zero the gradients; load step k's batch, ``make_batch(global_batch, seed + k)``: replicated
   pipeline r takes samples [r M b, (r + 1) M b) (the whole batch when replicated per stage,
   where each copy takes its own micro-batches from it), so the run trains on exactly the
   batches one process would, in the same order (loading is not timed); with context
   parallelism each cp rank keeps its two chunks of every sequence (``planner.runtime.context``);
2. barrier, then start the clock and the synchronisation (buckets count M micro-batches per
   chunk; M / R_s on a copy of a stage replicated per stage);
3. **execute the schedule**: the one part that differs, :meth:`RankTrainer.run_schedule`
   (``planner.runtime.engine.RankRunner``: the plan's action lists in torch's action-list runtime;
   ``planner.runtime.replicated.ReplicatedRunner``: its own executor of the round-robin
   order); each micro-batch's loss is divided by M (or, a ``(sum, count)`` loss, is its sum);
4. the step's count of a ``(sum, count)`` loss (one all-reduce), the gradient sync
   (``planner.runtime.grads.GradientSync``), the bytes of gradients held, the scale by
   D c / count of a ``(sum, count)`` loss (c: the cp degree, 1 without context parallelism), the optimizer steps, the ZeRO all-gathers;
5. the step's loss (summed over the last stage's ranks, / D replicas x c cp ranks (each the
   mean of an equal share of the tokens) x t tensor-parallel copies, each of which has it) and
   wall time (max over ranks).

The Layout makes the two executors one computation: replicated per stage, D = 1 and t = 1,
a stage's copies sum their gradients (divisor D = 1) where replicated pipelines average
theirs (divisor D), and the same formulas hold.
"""

from __future__ import annotations

import abc
import time
from typing import Any

import torch
import torch.distributed as dist

from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile
from planner.models.context import SequenceShard
from planner.models.workload import Workload
from planner.runtime.checkpoint import CheckpointSlot
from planner.runtime.context import grad_divisor, install, split_batch
from planner.runtime.emulate import ChunkTimer, layer_bwd_offsets_ms, stage_chunk_ms
from planner.runtime.experts import ExpertGroups, build_expert_groups, experts_folded, install_experts
from planner.runtime.loss import LossCounts, scale_grads
from planner.runtime.model import cast_batch
from planner.runtime.offload import offloaded
from planner.runtime.options import RuntimeOptions
from planner.runtime.runner import RankMeasure, StepMeasure, run_steps
from planner.runtime.stage_helpers import (
    Chunk,
    boundary_examples,
    build_sync,
    emulated_readiness,
    held_grad_bytes,
    microbatch,
    stage_module,
    tied_holders,
    tied_params,
)
from planner.runtime.tensor import parallelize_layers
from planner.runtime.topology import Groups, RankPosition, build_groups

__all__ = ["RankTrainer"]


class RankTrainer(abc.ABC):
    """Everything one rank holds for a run, and its training step (see the module docstring);
    subclasses prepare and execute the schedule. Satisfies :class:`planner.runtime.runner.Runner`."""

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
        layout = plan.layout
        self.position = RankPosition.of(layout, rank)
        holders = tied_holders(plan, workload)
        self.groups: Groups = build_groups(layout, rank, holders, options.timeout_s, device)
        self.shard: SequenceShard | None = None  # context parallelism: this rank's share of each sequence
        if layout.cp_degree > 1:  # before the examples: their forward runs on the rank's tokens
            self.shard = SequenceShard(degree=layout.cp_degree, index=self.position.cp_index, group=self.groups.context)
            install(workload.layers, self.shard)
        self.experts: ExpertGroups | None = None  # experts folded apart from attention (planner.runtime.experts)
        if experts_folded(layout, workload):
            tensor_group = self.groups.tensor.get_group() if self.groups.tensor is not None else None
            self.experts = build_expert_groups(layout, rank, options.timeout_s, device, tensor_group)
        first_mb = microbatch(self.batch(0)[0], 0, plan.microbatch_size)
        modules = []
        examples: list[tuple[Any, Any]] = []  # per chunk: its input and output for one micro-batch
        for stage_idx in self.position.stage_indices:
            stage = plan.stages[stage_idx]
            examples.append(boundary_examples(workload, stage.layer_start, stage.layer_stop, first_mb))
            if self.groups.tensor is not None:  # split after the examples: they come from whole layers
                layers = range(stage.layer_start, stage.layer_stop)
                parallelize_layers(workload, layers, self.groups.tensor, layout.sequence_parallel)
            if self.experts is not None:  # likewise: the experts sharded, dispatched over their groups
                install_experts(workload.layers[stage.layer_start : stage.layer_stop], self.experts)
            modules.append(stage_module(workload, stage, device, plan.schedule.splits_backward))
        tied = tied_params(plan, workload, self.position.stage_indices, holders)
        stages = self.position.stage_indices
        timers = [ChunkTimer(emulated_ms=stage_chunk_ms(plan, s, profile) if options.emulate else None) for s in stages]
        ready_at = None
        if options.emulate and profile is not None:  # gradients final at their layers' profiled ends
            ready_at = emulated_readiness(modules, [layer_bwd_offsets_ms(plan, s, profile) for s in stages], timers)
        self.sync, states = build_sync(modules, options=options, layout=layout, groups=self.groups, tied=tied,
                                       stack=plan.stack, ready_at=ready_at, experts=self.experts)
        states = [(offloaded(opt, plan.offload.optimizer), z, e) for opt, z, e in states]  # ZeRO-Offload
        self.chunks: list[Chunk] = [
            Chunk(stage_plan=plan.stages[stage_idx], module=module, timer=timer, optimizer=optimizer, zero=zero,
                  expert_zero=expert_zero)
            for stage_idx, module, timer, (optimizer, zero, expert_zero) in zip(stages, modules, timers, states)
        ]
        self.loss_counts = LossCounts(plan.num_microbatches, layout.tp_degree)
        self.grad_bytes: tuple[int, ...] = (0,) * len(self.chunks)  # held after the sync, per chunk
        self.prepare_schedule(examples)

    # ---------------------------------------------------------------- the one part that differs
    @abc.abstractmethod
    def prepare_schedule(self, examples: list[tuple[Any, Any]]) -> None:
        """Build what executing the schedule needs from the chunks and, per chunk, its input and
        output for one micro-batch (static shapes and dtypes). Called once, last in ``__init__``."""

    @abc.abstractmethod
    def run_schedule(self, inputs: Any, targets: Any) -> float:
        """One iteration of the rank's schedule over its share of the batch; returns this rank's
        summed micro-batch losses (0 off the last stage)."""

    # ---------------------------------------------------------------- the step
    def batch(self, step_idx: int) -> tuple[Any, Any]:
        """This rank's pipeline's samples of step ``step_idx``'s global batch, on the device."""
        plan = self.plan
        inputs, targets = self.workload.make_batch(plan.global_batch, self.options.seed + step_idx)
        per_replica = plan.num_microbatches * plan.microbatch_size
        lo = self.position.data_replica * per_replica

        def take(value: Any) -> Any:
            if isinstance(value, tuple):
                return tuple(take(v) for v in value)
            return value[lo : lo + per_replica].to(self.device)

        inputs, targets = take(inputs), take(targets)
        if self.shard is not None:  # context parallelism: the rank's chunks of every sequence
            inputs, targets = split_batch(inputs, targets, self.workload, self.shard)
        return cast_batch(inputs, self.options.dtype), targets

    @property
    def microbatches_per_chunk(self) -> int:
        """Micro-batches each chunk of this rank runs per step: M (M / R_s on a stage's copy)."""
        return self.plan.num_microbatches // self.plan.layout.replicas_of(self.position.stage_indices[0])

    def train_step(self, step_idx: int) -> StepMeasure:
        for c in self.chunks:
            c.module.zero_grad(set_to_none=True)
        inputs, targets = self.batch(step_idx)  # data loading is not part of the timed step
        dist.barrier()
        start = time.perf_counter()
        self.sync.start_iteration(self.microbatches_per_chunk)
        self.loss_counts.start_step()
        loss_sum = self.run_schedule(inputs, targets)
        count = self.loss_counts.total(self.device)  # (sum, count) losses: the step's count, else None
        self.sync.synchronise()
        self.grad_bytes = tuple(held_grad_bytes(c.optimizer) for c in self.chunks)
        divisor = grad_divisor(self.plan.layout)  # D x c: each of a stage's dp x cp ranks saw an equal share
        if count is not None:  # the gradients are the average over D c of summed losses: x D c / count
            scale_grads([c.optimizer for c in self.chunks], divisor / count)
        for c in self.chunks:
            if c.optimizer is not None:
                c.optimizer.step()
        self.sync.gather_params()
        wall_ms = (time.perf_counter() - start) * 1000.0
        stats = torch.tensor([loss_sum, wall_ms], dtype=torch.float64, device=self.device)  # NCCL needs device tensors
        loss_t, wall_t = stats[:1].clone(), stats[1:].clone()
        dist.all_reduce(loss_t, op=dist.ReduceOp.SUM)
        dist.all_reduce(wall_t, op=dist.ReduceOp.MAX)
        if count is not None:  # summed losses over D c ranks: the step's loss is their sum / count
            loss_t *= divisor / count
        copies = divisor * self.plan.layout.tp_degree  # every tp rank of a last stage has the loss
        return StepMeasure(step_idx=step_idx, loss=float(loss_t) / copies, wall_ms=float(wall_t))

    # ---------------------------------------------------------------- the Runner protocol
    @property
    def rank(self) -> int:
        return self.position.rank

    @property
    def optimizer_shards(self) -> int:
        """Ranks each of this rank's optimizers is sharded over: the stage's gradient group
        (D, or its copies; x cp) with ZeRO >= 1, else 1."""
        if not any(c.zero is not None for c in self.chunks):
            return 1
        return self.plan.layout.grad_group_size(self.position.stage_indices[0])

    @property
    def checkpoint_slot(self) -> CheckpointSlot:
        """Replica (or copy) 0 writes the model; each tp index checkpoints its own shards; with the
        experts folded every rank its own file (its experts and their optimizer state are its own)."""
        layout = self.plan.layout
        return CheckpointSlot(
            replica=self.position.replica * layout.cp_degree + self.position.cp_index,  # in the gradient group
            optimizer_shards=self.optimizer_shards,
            tp_index=self.position.tp_index,
            tp_degree=layout.tp_degree,
            own_file=self.position.rank if self.experts is not None else -1,
            experts=(layout.ep_degree, layout.etp_degree),
        )

    def run(self) -> RankMeasure:
        return run_steps(self)
