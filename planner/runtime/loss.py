"""The loss of a step when ``loss_fn`` returns ``(sum, count)`` (``planner.models.workload``).

A mean loss is divided by M per micro-batch and the data-parallel sync averages over the D
replicas (every micro-batch weighs 1 / (M D)). A ``(sum, count)`` loss is weighted by its units
instead (e.g. real tokens), so the step's loss is ``sum over all micro-batches / count over
all of them``; that count is known only once every micro-batch's forward has run. So:

1. each micro-batch back-propagates its *sum* (not divided by anything) and the last stage
   adds up the counts it saw;
2. after the schedule, one all-reduce over the world adds up the counts (ranks off the last
   stage add 0; the tensor-parallel ranks of a last stage each saw the same counts);
3. once the gradients are synchronised (the engine's average over D, or the sum over a
   stage's copies in the per-stage-replicated executor), every gradient the optimizers step is
   multiplied by ``divisor / count`` (``divisor`` = D for an average, 1 for a sum): exactly the
   gradient of ``sum / count`` of one process, up to rounding.

Which kind of loss a workload has is found on the first step: its all-reduce carries a flag
(1 from a last-stage rank that got a pair); with a mean loss no later step all-reduces
anything.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from planner.models.workload import split_loss


class LossCounts:
    """One rank's view of the step's ``(sum, count)`` losses (see the module docstring)."""

    def __init__(self, num_microbatches: int, copies_per_count: int = 1) -> None:
        self.num_microbatches = num_microbatches
        self.copies_per_count = copies_per_count  # ranks that saw each count (tensor-parallel copies)
        self.paired: bool | None = None  # unknown until the first step's all-reduce
        self.seen_pair = False
        self.count = 0.0

    def micro_loss(self, value: Any) -> torch.Tensor:
        """What a micro-batch back-propagates: the mean / M, or the sum (its count recorded)."""
        total, count = split_loss(value)
        if count is None:
            return total / self.num_microbatches
        self.seen_pair = True
        self.count += float(count)
        return total

    def start_step(self) -> None:
        self.count = 0.0

    def total(self, device: torch.device) -> float | None:
        """After the schedule, collectively: the step's count over the world (None for a mean loss)."""
        if self.paired is False:
            return None
        flag_count = torch.tensor([1.0 if self.seen_pair else 0.0, self.count], dtype=torch.float64, device=device)
        dist.all_reduce(flag_count, op=dist.ReduceOp.SUM)
        self.paired = bool(flag_count[0] > 0)
        if not self.paired:
            return None
        count = float(flag_count[1]) / self.copies_per_count
        if count <= 0:
            raise ValueError("loss_fn returned (sum, count) with a total count of 0 over the step")
        return count


def scale_grads(optimizers: list[Any], factor: float) -> None:
    """Multiply the gradient of every parameter the optimizers step by ``factor`` (each once)."""
    seen: set[int] = set()
    for optimizer in optimizers:
        if optimizer is None:
            continue
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None and id(param) not in seen:
                    seen.add(id(param))
                    param.grad.mul_(factor)
