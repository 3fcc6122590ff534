"""One rank's executor for a plan replicated per stage (PipeDream's round-robin, flushed); the
training step itself is ``planner.runtime.trainer.RankTrainer``'s.

``torch.distributed.pipelining`` cannot run these plans: a ``PipelineStage`` talks to one
fixed peer per direction, while copy ``r`` of stage ``s`` exchanges micro-batch ``m`` with
copy ``m mod R_{s-1}`` of the stage before and copy ``m mod R_{s+1}`` of the stage after. So
this module executes the rank's action order itself, on plain point-to-point ops:

- the order is ``planner.schedule.layout_schedule`` of the plan's Layout (the one the
  simulator replays): GPipe or 1F1B, flushed, over the copy's micro-batches ``r, r + R_s, ...``;
- before action ``i`` the rank posts the sends of action ``i - 1`` and the receives of
  action ``i`` as one ``batch_isend_irecv`` group and waits for the receives (sends are
  waited at the end of the schedule; a coalesced NCCL group is waited whole, a stream wait);
  ``planner.runtime.exchange`` lays the messages out (between ``Layout.all_stage_ranks``) and
  its dry run shows the orders neither hang nor mismatch, with NCCL's rendezvous sends;
  tags (2m for activations, 2m + 1 for gradients) match micro-batches on gloo;
- ``sF m``: the received tensors (floating ones as leaves needing grad; stage 0 slices
  samples [m b, (m + 1) b) of the global batch) run through the ``StageModule`` (the plan's
  recomputation); the last stage computes ``loss_fn(out, target) / M``, as the engine (a
  ``(sum, count)`` loss: its sum, the gradients scaled by 1 / the step's count after the
  copies' sum, ``planner.runtime.loss``);
- ``sB m``: backward of the loss or of the outputs against the received gradients, then
  the inputs' gradients (zeros where unused) go back; integer tensors carry no gradient;
- shapes and dtypes are static, from a no-grad forward of micro-batch 0 at start-up
  (``planner.runtime.stage_helpers.boundary_examples``), so receive buffers are allocated
  without metadata;
- after the schedule, a stage's copies sum their gradients (each copy ran M / R_s
  micro-batches of loss / M, so the sum is one process's gradient) with the engine's bucketed
  async all-reduce (``DataParallelHooks`` over the copies' group, ``Layout.dp_group``; divisor
  D = 1), and a tied parameter split over stages sums over every rank of every stage holding
  it (``sync_tied``);
- ZeRO 1 / 2 (``plan.layout.zero``): a stage's copies shard its optimizer state (and with 2 its
  gradients) among themselves with the engine's ``planner.runtime.zero.ShardedState`` (divisor
  1), in place of the all-reduce; a tied parameter stays whole; a stage with one copy has
  nothing to shard.

Measurements, checkpoints, faults and emulation are the engine's (``planner.runtime.runner``),
per rank (one stage each).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from planner.runtime.emulate import finish_chunk
from planner.runtime.exchange import Message, exchange_groups
from planner.runtime.stage_helpers import as_args, micro_loss, microbatch
from planner.runtime.trainer import RankTrainer
from planner.schedule.actions import ActionKind
from planner.schedule.inflight import layout_schedule

__all__ = ["ReplicatedRunner", "TensorSpec"]


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Shape and dtype of one tensor crossing a stage boundary."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def floating(self) -> bool:
        return self.dtype.is_floating_point


def _specs(value: Any) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(tuple(t.shape), t.dtype) for t in as_args(value))


@dataclass(slots=True)
class _Saved:
    """What one in-flight micro-batch keeps for its backward."""

    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]  # the loss alone on the last stage


_Transfer = tuple[Message, tuple[torch.Tensor, ...]]  # a message and its tensors (sent or receive buffers)


class ReplicatedRunner(RankTrainer):
    """One rank of a plan replicated per stage: its stage copy's action order and messages."""

    def prepare_schedule(self, examples: list[tuple[Any, Any]]) -> None:
        plan = self.plan
        (self.chunk,) = self.chunks  # one stage per rank
        self.stage_idx = self.chunk.stage_idx
        self.is_first = self.stage_idx == 0
        self.is_last = self.stage_idx == plan.layout.num_stages - 1
        self.order = layout_schedule(plan.schedule, plan.layout, plan.num_microbatches)[self.rank]
        self.exchanges = exchange_groups(plan.layout.all_stage_ranks(), self.order)
        ((example_in, example_out),) = examples
        self.in_specs = _specs(example_in)
        self.out_grad_specs = tuple(s for s in _specs(example_out) if s.floating)

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
        finish_chunk(self.chunk.timer, start, which)

    def _forward(
        self, mb_idx: int, received: tuple[torch.Tensor, ...], inputs: Any, targets: Any
    ) -> tuple[_Saved, tuple[torch.Tensor, ...]]:
        """Returns what backward needs (the loss on the last stage) and what to send (the detached outputs)."""
        b = self.plan.microbatch_size
        if self.is_first:
            args = as_args(microbatch(inputs, mb_idx, b))
        else:
            args = tuple(t.requires_grad_(t.is_floating_point()) for t in received)
        start = time.perf_counter()
        module = self.chunk.module
        out = module(*args)
        if self.is_last:
            loss = micro_loss(self.workload, self.loss_counts, module, out, microbatch(targets, mb_idx, b))
            self._timed(0, start)
            return _Saved(inputs=args, outputs=(loss,)), ()
        outs = as_args(out)
        self._timed(0, start)
        return _Saved(inputs=args, outputs=outs), tuple(t.detach().contiguous() for t in outs)

    def _backward(self, saved: _Saved, received: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """Runs backward; returns the input gradients to send (none on stage 0)."""
        start = time.perf_counter()
        self.chunk.timer.bwd_start_s = start
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

    def run_schedule(self, inputs: Any, targets: Any) -> float:
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
        now, later = self._post(outbox, [])  # the last sends
        unwaited += now + later
        for work in unwaited:
            work.wait()
        sending.clear()
        return float(sum(loss.double() for loss in losses)) if losses else 0.0
