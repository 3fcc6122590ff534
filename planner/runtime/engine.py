"""One rank's executor on ``torch.distributed.pipelining`` (the training step itself is
``planner.runtime.trainer.RankTrainer``'s; this module runs the schedule).

Checked with gloo on CPU, torch 2.13:

- ``PipelineStage`` in *static* mode: the stage's input and output examples are computed
  up front by a no-grad forward of the layers before and in the stage on one micro-batch
  (``planner.runtime.stage_helpers.boundary_examples``), so no metadata objects (pickles)
  cross ranks at run time.
- ``ScheduleGPipe``, ``Schedule1F1B`` and ``ScheduleInterleaved1F1B`` with
  ``scale_grads=False`` and a loss of ``loss_fn / M`` (the mean over micro-batches; a
  ``(sum, count)`` loss back-propagates its sum and the gradients are scaled by D / the step's
  count after the sync, ``planner.runtime.loss``),
  because the schedule's in-place gradient scaling would race with our async
  data-parallel all-reduces (``planner.runtime.grads``).
  In ``Schedule1F1B`` stage s runs min(P - s, M) warm-up forwards, so it holds at most
  min(P - s, M) micro-batches of activations, as the cost model assumes.
- Interleaved 1F1B: the rank builds one ``PipelineStage`` per stage it runs
  (``Layout.stage_indices``: stages p, p + P, ..., ``num_stages = P x v``, torch's looped
  placement) and hands them all to ``ScheduleInterleaved1F1B``. Each stage is a *chunk* with
  its own module, meter, timer and optimizer (the optimizers step the rank's unique parameters
  once each: a parameter two chunks share, a tie within the rank, belongs to the first chunk's
  optimizer), so checkpoints and measurements stay per stage. With v = 1 the rank has one chunk.
- A stage's outputs are freed once sent (Megatron-LM's ``deallocate_output_tensor``): the send
  takes a copy, held until torch's schedule waits for the send (1F1B and interleaved: before
  the next one; GPipe: after its last forward, so under GPipe the copies of its M forward
  sends are held through its forward phase, M - 1 outputs more than the cost model counts),
  and each output tensor keeps only its autograd node, its data a one-element stand-in of its
  shape (``torch.autograd.backward`` checks only the shape; the node holds what backward
  needs). Only an output nothing else holds is freed: not a view, not a stage input passed
  through (no autograd node of this stage), not a tensor a layer of the stage also took as its
  input (a skip handed on: a checkpointed layer keeps it to recompute), not a tensor an
  autograd node saved (as an input:
  the same tensor; as its own output: its storage) -- read off the reference counts of the
  tensor and its storage; the memory of a saved output stays with its node anyway.
- ZB-H1 (``zb-h1``, Qi et al. 2024): torch's ``ScheduleInterleavedZeroBubble`` over the rank's
  one stage (its "ZB1P"), the backward run as an input-gradient chunk (``I``: torch's
  ``stage_backward_input``, recomputation included) and a weight-gradient chunk (``W``:
  ``stage_backward_weight``); its order is checked against the plan's before the first step.
  torch keeps the I pass's graph (``retain_graph=True``) until W, so a micro-batch between its I
  and its W holds what autograd saved for the weight gradients, which the profile's
  ``weight_grad_saved_fraction`` prices.
- ZBV (``zbv``, Qi et al. 2024 sec. 6): torch's ``ScheduleZBVZeroBubble`` over the rank's two
  chunks, ``p`` and ``2P - 1 - p`` (``Layout.stage_indices`` under the V placement, torch's
  "v" style); rank 0 holds the first and the last chunk. Its order is checked against the
  plan's as for ZB-H1. ZB-H2 has no torch class: ``planner run`` refuses it
  (``planner.runtime.check``).
- ZeRO 1 and 2 (``plan.layout.zero``, with D > 1): each chunk's data-parallel parameters get a
  ``planner.runtime.zero.ShardedState`` and the chunk's optimizer steps its master shard
  (plus any parameter tied across pipeline ranks, unsharded) instead of the parameters; the
  gradients are reduce-scattered after the schedule and the weights all-gathered after the
  step, in place of the bucketed all-reduce. ZeRO 3: the same shard, the weights gathered
  around each micro-batch's forward and backward of the chunk and its gradients
  reduce-scattered after each backward (``planner.runtime.zero``, t = 1).
"""

from __future__ import annotations

import time
from typing import Any, cast

import torch
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ScheduleKind
from planner.runtime.emulate import ChunkTimer, finish_chunk
from planner.runtime.stage import StageModule
from planner.runtime.stage_helpers import as_args, grad_examples, micro_loss
from planner.runtime.trainer import RankTrainer
from planner.schedule import build_schedule

__all__ = ["ZERO_BUBBLE_CLASS", "RankRunner", "TimedStage"]

#: the torch.distributed.pipelining class that runs each zero-bubble schedule
ZERO_BUBBLE_CLASS = {ScheduleKind.ZB_H1: "ScheduleInterleavedZeroBubble", ScheduleKind.ZBV: "ScheduleZBVZeroBubble"}


class TimedStage(PipelineStage):
    """A ``PipelineStage`` that adds up the seconds spent in its forward and backward chunks in
    ``timer``, and, when ``timer.emulated_ms`` is set, stretches each chunk to its profiled
    (fwd, bwd) time (see ``planner.runtime.emulate``)."""

    def __init__(self, *args: Any, timer: ChunkTimer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timer = timer

    def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = super().forward_one_chunk(*args, **kwargs)
        finish_chunk(self.timer, start, 0)
        return out

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        self.timer.bwd_start_s = start
        out = super().backward_one_chunk(*args, **kwargs)
        full = kwargs.get("full_backward", args[2] if len(args) > 2 else True)
        finish_chunk(self.timer, start, 1 if full else 2)
        return out

    def backward_weight_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        """A zero-bubble schedule's W pass (torch's ``BACKWARD_WEIGHT``)."""
        start = time.perf_counter()
        out = super().backward_weight_one_chunk(*args, **kwargs)
        finish_chunk(self.timer, start, 3)
        return out

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> Any:
        """The sends of a forward's outputs, each of a copy; the outputs freed (module docstring)."""
        ops = super().get_fwd_send_ops(fwd_chunk_id)
        if not ops:  # the last stage: its output goes to the loss
            return ops
        for op in ops:
            op.tensor = op.tensor.clone()
        outputs, _ = self.fwd_cache[fwd_chunk_id]
        module = self.submod
        for idx, out in enumerate(outputs):
            mine = not (isinstance(module, StageModule) and isinstance(out, torch.Tensor) and module.consumed(out))
            if mine and any(dst is not None for dst in self.act_send_info[idx]):
                deallocate_output(out)
        return ops


def deallocate_output(out: Any) -> bool:
    """Free a sent output's data, keeping its autograd node (Megatron-LM's
    ``deallocate_output_tensor``), when nothing else holds it (module docstring); True if freed."""
    if not isinstance(out, torch.Tensor) or type(out) is not torch.Tensor or out.grad_fn is None or out._base is not None:
        return False
    # one owner of the tensor (its Python object) and of its storage (the tensor; + 1 for the
    # storage object the query itself makes): no autograd node saved it, no view shares it
    if out._use_count() != 1 or torch._C._storage_Use_Count(out.untyped_storage()._cdata) > 2:
        return False
    out.data = torch.empty(1, dtype=out.dtype, device=out.device).expand(out.shape)
    return True


class RankRunner(RankTrainer):
    """One rank of a plan with one stage per pipeline rank or interleaved chunks: its
    ``PipelineStage`` s and torch's schedule over them."""

    def prepare_schedule(self, examples: list[tuple[Any, Any]]) -> None:
        self.pipe_stages = [
            TimedStage(
                c.module,
                c.stage_idx,
                self.plan.layout.num_stages,
                self.device,
                input_args=as_args(example_in) if c.stage_idx == 0 else grad_examples(example_in),
                output_args=grad_examples(example_out),
                group=self.groups.pipeline,
                timer=c.timer,
            )
            for c, (example_in, example_out) in zip(self.chunks, examples, strict=True)
        ]
        self.is_first = any(s.is_first for s in self.pipe_stages)
        self.is_last = any(s.is_last for s in self.pipe_stages)
        self.schedule = self._torch_schedule()

    def _torch_schedule(self) -> Any:
        """torch's schedule of the plan's kind over the rank's stages, the loss ``/ M`` (or the
        sum of a ``(sum, count)`` loss) metered with the last stage's saved tensors."""
        num_mb = self.plan.num_microbatches
        last = next((c.module for c, s in zip(self.chunks, self.pipe_stages) if s.is_last), self.chunks[-1].module)

        def loss_fn(out: Any, target: Any) -> torch.Tensor:
            return micro_loss(self.workload, self.loss_counts, last, out, target)

        if self.plan.schedule is ScheduleKind.INTERLEAVED_1F1B:
            stages = cast("list[Any]", self.pipe_stages)  # torch types it as its private stage base class
            return ScheduleInterleaved1F1B(stages, num_mb, loss_fn=loss_fn, scale_grads=False)
        if self.plan.schedule in ZERO_BUBBLE_CLASS:
            return self._zero_bubble(loss_fn)
        schedule_cls = ScheduleGPipe if self.plan.schedule is ScheduleKind.GPIPE else Schedule1F1B
        return schedule_cls(self.pipe_stages[0], num_mb, loss_fn=loss_fn, scale_grads=False)

    def _zero_bubble(self, loss_fn: Any) -> Any:
        """torch's zero-bubble schedule of the plan's kind over the rank's stages
        (:data:`ZERO_BUBBLE_CLASS`), its compute order checked against the plan's
        (``planner.schedule.build_schedule``): the simulator priced that order, so a torch that
        orders differently is refused."""
        from torch.distributed.pipelining import schedules

        kind, lay = self.plan.schedule, self.plan.layout
        name = ZERO_BUBBLE_CLASS[kind]
        stages = cast("list[Any]", self.pipe_stages)
        sched = getattr(schedules, name)(stages, self.plan.num_microbatches, loss_fn=loss_fn, scale_grads=False)
        ours = build_schedule(kind, lay.num_stages, self.plan.num_microbatches, lay.virtual_stages_per_rank)
        for rank, order in enumerate(ours):
            theirs = [str(a) for a in sched.pipeline_order[rank] if a is not None]
            if theirs != [str(a) for a in order]:
                raise PlannerInputError(
                    f"torch {torch.__version__}'s {name} orders rank {rank} as {' '.join(theirs)}, "
                    f"not as the plan's {kind.value} ({' '.join(map(str, order))}): refusing to run an order the plan "
                    "did not price"
                )
        return sched

    def run_schedule(self, inputs: Any, targets: Any) -> float:
        """One iteration of torch's schedule; returns this rank's summed micro-batch losses (0 off the last stage)."""
        losses: list[torch.Tensor] = []
        if self.is_first and self.is_last:
            self.schedule.step(*as_args(inputs), target=targets, losses=losses, return_outputs=False)
        elif self.is_first:
            self.schedule.step(*as_args(inputs), return_outputs=False)
        elif self.is_last:
            self.schedule.step(target=targets, losses=losses, return_outputs=False)
        else:
            self.schedule.step(return_outputs=False)
        return float(sum(loss.detach().double() for loss in losses)) if losses else 0.0
