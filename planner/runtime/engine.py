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
- ZeRO 1 and 2 (``plan.layout.zero``, with D > 1): each chunk's data-parallel parameters get a
  ``planner.runtime.zero.ShardedState`` and the chunk's optimizer steps its master shard
  (plus any parameter tied across pipeline ranks, unsharded) instead of the parameters; the
  gradients are reduce-scattered after the schedule and the weights all-gathered after the
  step, in place of the bucketed all-reduce.
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

from planner.artifacts.kinds import ScheduleKind
from planner.runtime.emulate import ChunkTimer, finish_chunk
from planner.runtime.stage_helpers import as_args, grad_examples, micro_loss
from planner.runtime.trainer import RankTrainer

__all__ = ["RankRunner", "TimedStage"]


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
        out = super().backward_one_chunk(*args, **kwargs)
        finish_chunk(self.timer, start, 1)
        return out


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
        schedule_cls = ScheduleGPipe if self.plan.schedule is ScheduleKind.GPIPE else Schedule1F1B
        return schedule_cls(self.pipe_stages[0], num_mb, loss_fn=loss_fn, scale_grads=False)

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
