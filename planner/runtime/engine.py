"""One rank's executor on ``torch.distributed.pipelining`` (the training step itself is
``planner.runtime.trainer.RankTrainer``'s; this module runs the schedule).

Checked with gloo on CPU, torch 2.13:

- ``PipelineStage`` in *static* mode: the stage's input and output examples are computed
  up front by a no-grad forward of the layers before and in the stage on one micro-batch
  (``planner.runtime.stage_helpers.boundary_examples``), so no metadata objects (pickles)
  cross ranks at run time.
- The schedule is data: every schedule the runtime runs (GPipe, 1F1B, interleaved 1F1B,
  ZB-H1, ZB-H2, ZBV, DualPipe-V: its overlapped pairs handed as their two actions in turn, as
  torch runs an ``OVERLAP_F_B``'s) is the plan's per-rank action lists (``planner.schedule.layout_schedule``,
  the order the simulator replays), run by torch's action-list runtime
  ``_PipelineScheduleRuntime``, lowered and checked against the plan before the first step
  (``planner.runtime.actions``). No schedule class is picked by name, and none is kept: the
  action runtime runs every order the planner builds for a uniform layout (plans replicated
  per stage run on ``planner.runtime.replicated``, because a ``PipelineStage`` has one fixed
  peer per direction). With ``scale_grads=False`` and a loss of ``loss_fn / M`` (the mean over
  micro-batches; a ``(sum, count)`` loss back-propagates its sum and the gradients are scaled by
  D / the step's count after the sync, ``planner.runtime.loss``), because the schedule's
  in-place gradient scaling would race with our async data-parallel all-reduces
  (``planner.runtime.grads``). Under 1F1B stage s runs min(P - s, M) warm-up forwards, so it
  holds at most min(P - s, M) micro-batches of activations, as the cost model assumes.
- Several chunks per rank (interleaved 1F1B, ZBV): the rank builds one ``PipelineStage`` per
  stage it runs (``Layout.stage_indices``: p, p + P, ... looped; p and 2P - 1 - p in a V). Each
  stage is a *chunk* with its own module, meter, timer and optimizer (the optimizers step the
  rank's unique parameters once each: a parameter two chunks share, a tie within the rank,
  belongs to the first chunk's optimizer), so checkpoints and measurements stay per stage.
- Where the waits are: a chunk's receive is posted where torch's lowering places it and waited
  for just before the compute that needs it; a send first waits for the stage's previous send
  in the same direction (``planner.runtime.actions.SendQueue``). Only the compute inside
  :class:`TimedStage`'s chunk methods is timed, so a stage's compute ms are its F, B, I and W
  passes and its idle ms the rest of the step, wherever the runtime waits.
- A stage's outputs are freed once sent (Megatron-LM's ``deallocate_output_tensor``): the send
  takes a copy, held until the stage's next forward send (``SendQueue``; torch's runtime alone
  would hold every copy to the end of the step), and each output tensor keeps only its autograd
  node, its data a one-element stand-in of its shape (``torch.autograd.backward`` checks only
  the shape; the node holds what backward needs). Only an output nothing else holds is freed:
  not a view, not a stage input passed through (no autograd node of this stage), not a tensor
  a layer of the stage also took as its input (a skip handed on: a checkpointed layer keeps it
  to recompute), not a tensor an autograd node saved (as an input: the same tensor; as its own
  output: its storage) -- read off the reference counts of the tensor and its storage; the
  memory of a saved output stays with its node anyway. The turn of ZBV's V hands its output to
  the rank's next chunk without a send, so it is not freed.
- Zero bubble (Qi et al. 2024: ZB-H1 with one stage per rank; ZB-H2, its longer warm-up; ZBV,
  two chunks per rank in a V, rank 0 holding the first and the last chunk): the backward runs
  as an input-gradient chunk (``I``: torch's ``stage_backward_input``) and a weight-gradient
  chunk (``W``: ``stage_backward_weight``). A recomputed layer is recomputed by the stage once in
  ``I`` and kept to ``W`` (``planner.runtime.recompute``: not torch's checkpoint, which re-ran it
  once per parameter group in ``W``), the stage's ``I`` cut after its last recomputed layer. torch keeps the I pass's graph
  (``retain_graph=True``) until W, so a micro-batch between its I and its W holds what autograd
  saved for the weight gradients, which the profile's ``weight_grad_saved_fraction`` prices.
  ZB-H2 has no torch class; its order runs like the others. The planner prices it with a
  synchronous optimizer step (``planner.schedule.zero_bubble``), and the runtime steps
  synchronously too, so a run measures the schedule the plan priced, not the paper's
  post-update validation.
- ZeRO 1 and 2 (``plan.layout.zero``, with D > 1): each chunk's data-parallel parameters get a
  ``planner.runtime.zero.ShardedState`` and the chunk's optimizer steps its master shard
  (plus any parameter tied across pipeline ranks, unsharded) instead of the parameters; the
  gradients are reduce-scattered after the schedule and the weights all-gathered after the
  step, in place of the bucketed all-reduce. ZeRO 3: the same shard, the weights gathered
  around each micro-batch's forward and backward of the chunk and its gradients
  reduce-scattered after each backward (``planner.runtime.zero``, t = 1); under a split backward
  the chunk gathers them for each I and W and reduce-scatters each W's gradients when it ends. torch's own
  ``UNSHARD``/``RESHARD``/``REDUCE_GRAD`` actions are no-ops here: they act on FSDP modules only.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch
from torch.distributed.pipelining import PipelineStage

from planner.runtime.actions import SendQueue, action_schedule
from planner.runtime.emulate import ChunkTimer, finish_chunk
from planner.runtime.recompute import RecomputeLedger, input_pass_in_two
from planner.runtime.stage import StageModule
from planner.runtime.stage_helpers import as_args, grad_examples, micro_loss
from planner.runtime.trainer import RankTrainer
from planner.runtime.zero import ShardedState

__all__ = ["RankRunner", "TimedStage"]


class TimedStage(PipelineStage):
    """A ``PipelineStage`` that adds up the seconds spent in its forward and backward chunks in
    ``timer``, and, when ``timer.emulated_ms`` is set, stretches each chunk to its profiled
    (fwd, bwd) time (see ``planner.runtime.emulate``)."""

    def __init__(self, *args: Any, timer: ChunkTimer, zero: ShardedState | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timer = timer
        self.zero = zero  # the chunk's ZeRO shard: ZeRO 3 gathers and scatters around each I and W
        self.fwd_sends = SendQueue()  # the copies of its outputs in flight
        self.bwd_sends = SendQueue()  # its input gradients in flight
        self._cut: Any = None  # the running input-gradient pass's cut (planner.runtime.recompute)
        ledger = self._ledger()
        if ledger is not None:
            ledger.loss_follows = self.is_last

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        ledger = self._ledger()
        with ledger.forward_of(fwd_chunk_id) if ledger is not None else contextlib.nullcontext():
            out = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
        finish_chunk(self.timer, start, 0)
        return out

    def backward_one_chunk(self, bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        self.timer.bwd_start_s = start
        full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
        ledger = self._ledger()
        # ZeRO 3, an I pass: the weights whole for it (the first stage's computes only to rebuild)
        zero = None if full else self.zero
        with zero.input_pass(not self.is_first or ledger is not None) if zero is not None else contextlib.nullcontext():
            out = self._backward(bwd_chunk_id, full, ledger, *args, **kwargs)
        finish_chunk(self.timer, start, 1 if full else 2)
        return out

    def _backward(self, bwd_chunk_id: int, full: bool, ledger: RecomputeLedger | None, *args: Any, **kwargs: Any) -> Any:
        if ledger is None:
            out = super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)
        else:  # the stage's recomputed layers: once here, kept to W (planner.runtime.recompute)
            self._cut = None if full else ledger.cuts.pop(bwd_chunk_id, None)
            with ledger.backward_of(splitting=not full):
                out = super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)
            self._cut = None
            if full:
                ledger.release(bwd_chunk_id)
            elif self.is_first:  # torch runs no I on the first stage: its recomputation runs here
                ledger.rebuild(bwd_chunk_id)
        return out

    def backward_weight_one_chunk(self, bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        """A zero-bubble schedule's W pass (torch's ``BACKWARD_WEIGHT``; on the first stage one
        whole backward, on the graphs its I rebuilt)."""
        start = time.perf_counter()
        ledger = self._ledger()
        with self.zero.weight_pass() if self.zero is not None else contextlib.nullcontext():  # ZeRO 3: gathered, scattered
            out = super().backward_weight_one_chunk(bwd_chunk_id, *args, **kwargs)
            if ledger is not None:
                ledger.weight(bwd_chunk_id)
        finish_chunk(self.timer, start, 3)
        return out

    def backward_maybe_with_nosync(self, backward_type: str, bwd_kwargs: dict[str, Any], last_backward: bool = False) -> Any:
        """torch's input-gradient pass, cut after the last recomputed layer where one follows
        (``planner.runtime.recompute.input_pass_in_two``); every other pass torch's own."""
        cut = self._cut
        if backward_type != "input" or cut is None:
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward=last_backward)
        return input_pass_in_two(cut, bwd_kwargs["stage_output"], bwd_kwargs["output_grads"],
                                 bwd_kwargs["input_values"], list(self.submod.parameters()))

    def _ledger(self) -> RecomputeLedger | None:
        module = self.submod
        return module.ledger if isinstance(module, StageModule) else None

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> Any:
        """Post the sends of a forward's outputs, each of a copy, through :attr:`fwd_sends`; the
        outputs freed (module docstring). Returns no ops: the runtime has nothing left to post."""
        ops = super().get_fwd_send_ops(fwd_chunk_id)
        if not ops:  # the last stage: its output goes to the loss
            return ops
        for op in ops:
            op.tensor = op.tensor.detach().clone()  # the copy sends data: no graph (it would hold the forward's to the next send)
        outputs, _ = self.fwd_cache[fwd_chunk_id]
        module = self.submod
        for idx, out in enumerate(outputs):
            mine = not (isinstance(module, StageModule) and isinstance(out, torch.Tensor) and module.consumed(out))
            if mine and any(dst is not None for dst in self.act_send_info[idx]):
                deallocate_output(out)
        self.fwd_sends.post(ops)
        return []

    def get_bwd_send_ops(self, bwd_chunk_id: int) -> Any:
        """Post the sends of a backward's input gradients through :attr:`bwd_sends`; returns no ops."""
        self.bwd_sends.post(super().get_bwd_send_ops(bwd_chunk_id))
        return []


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
    """One rank of a plan with one stage per pipeline rank or several chunks: its
    ``PipelineStage`` s and torch's action runtime over them, running the plan's action lists."""

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
                zero=c.zero,
            )
            for c, (example_in, example_out) in zip(self.chunks, examples, strict=True)
        ]
        self.is_first = any(s.is_first for s in self.pipe_stages)
        self.is_last = any(s.is_last for s in self.pipe_stages)
        last = next((c.module for c, s in zip(self.chunks, self.pipe_stages) if s.is_last), self.chunks[-1].module)

        def loss_fn(out: Any, target: Any) -> torch.Tensor:
            """The loss ``/ M`` (or the sum of a ``(sum, count)`` loss), metered with the last stage's saved tensors."""
            return micro_loss(self.workload, self.loss_counts, last, out, target)

        self.schedule = action_schedule(self.pipe_stages, self.plan, loss_fn)

    def run_schedule(self, inputs: Any, targets: Any) -> float:
        """One iteration of the plan's actions; returns this rank's summed micro-batch losses (0 off the last stage)."""
        losses: list[torch.Tensor] = []
        if self.is_first and self.is_last:
            self.schedule.step(*as_args(inputs), target=targets, losses=losses, return_outputs=False)
        elif self.is_first:
            self.schedule.step(*as_args(inputs), return_outputs=False)
        elif self.is_last:
            self.schedule.step(target=targets, losses=losses, return_outputs=False)
        else:
            self.schedule.step(return_outputs=False)
        for stage in self.pipe_stages:
            stage.fwd_sends.drain()
            stage.bwd_sends.drain()
        return float(sum(loss.detach().double() for loss in losses)) if losses else 0.0
