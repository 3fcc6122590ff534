"""Gradient synchronisation: data-parallel all-reduce and tied-parameter sums.

Data parallel (DESIGN.md section 7; issue 6): each parameter's gradient is all-reduced
across the stage's replicas as soon as it is final, that is when its post-accumulate-grad
hook has fired once per micro-batch of the iteration. The all-reduce is asynchronous (it
overlaps the rest of the pipeline, e.g. the cooldown of earlier stages) and is waited for
before the optimizer step. The gradient is divided by D first and summed (gloo has no AVG).

Why not DDP around the stage: measured here, DDP around a pipeline stage fails with GPipe
unless ``find_unused_parameters=True``, and ``static_graph=True`` silently skips the sync.
Why loss / M rather than the schedule's ``scale_grads``: the schedule scales gradients in
place after the last backward, which races with all-reduces already in flight.

Tied parameters (``Workload.tied``) held by several stages: each stage keeps its own copy;
after the schedule, the copies' gradients are summed over the stages and averaged over the
replicas with one all-reduce over every rank holding a copy; these parameters are left out
of the data-parallel hooks. Identical gradients keep the copies identical under any
deterministic optimizer.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class DataParallelHooks:
    """Async all-reduce of each parameter's gradient once its M-th accumulation is done."""

    def __init__(self, params: list[torch.nn.Parameter], group: dist.ProcessGroup, dp_degree: int) -> None:
        self._group = group
        self._dp_degree = dp_degree
        self._params = params
        self._num_microbatches = 1
        self._counts: dict[int, int] = {}
        self._works: list[Any] = []
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in params]

    def start_iteration(self, num_microbatches: int) -> None:
        self._num_microbatches = num_microbatches
        self._counts = {id(p): 0 for p in self._params}
        self._works = []

    def _launch(self, param: torch.Tensor) -> None:
        assert param.grad is not None
        param.grad.div_(self._dp_degree)
        self._works.append(dist.all_reduce(param.grad, group=self._group, async_op=True))

    def _on_grad(self, param: torch.Tensor) -> None:
        key = id(param)
        self._counts[key] += 1
        if self._counts[key] == self._num_microbatches:
            self._launch(param)

    def finish_iteration(self) -> None:
        """Launch any all-reduce not started yet (a parameter unused by some micro-batch), wait all."""
        for param in self._params:
            if self._counts[id(param)] != self._num_microbatches:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                self._launch(param)
        for work in self._works:
            work.wait()
        self._works = []

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def sync_tied(params: list[torch.nn.Parameter | None], groups: list[dist.ProcessGroup | None], dp_degree: int) -> None:
    """Sum tied copies' gradients over stages, averaged over replicas (one all-reduce each)."""
    for param, group in zip(params, groups):
        if param is None or group is None:
            continue
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        param.grad.div_(dp_degree)
        dist.all_reduce(param.grad, group=group)
