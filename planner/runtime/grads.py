"""Gradient synchronisation: data-parallel all-reduce and tied-parameter sums.

Data parallel (DESIGN.md section 7; issue 6): gradients are all-reduced across the stage's
replicas per bucket (parameters in reverse order, at most the plan's stack's
``grad_bucket_bytes``, 25 MiB for the ``planner`` stack, as DDP buckets them), as soon as
every gradient of the bucket is final, that is when each one's post-accumulate-grad hook
has fired once per micro-batch of the iteration and per stage chunk of the rank using it (a
parameter shared by two chunks of an interleaved rank fires 2M times): during the last
backward, which the reduction overlaps (the stack's ``grad_reduce_overlap``, what the cost
model prices, ``planner.cost.overlap``). A plan priced for a stack that does not overlap it
(``none``) is run so: one all-reduce of every gradient after the schedule. The all-reduce is
asynchronous (it overlaps the rest of the pipeline, e.g. the cooldown of earlier stages) and
is waited for before the optimizer step. Gradients are divided by D first and summed (gloo
has no AVG). One all-reduce per parameter cost ~0.2 ms of gloo latency each here, tens of ms
per step. With emulated compute a bucket starts no earlier than its layer's profiled end in
the backward (``planner.runtime.emulate``).

Why not DDP around the stage: measured here, DDP around a pipeline stage fails with GPipe
unless ``find_unused_parameters=True``, and ``static_graph=True`` silently skips the sync.
Why loss / M rather than the schedule's ``scale_grads``: the schedule scales gradients in
place after the last backward, which races with all-reduces already in flight.

Tied parameters (``Workload.tied``) held by several pipeline ranks: each rank keeps its own
copy (one tensor, shared by its chunks when it runs several stages holding it); after the
schedule, the copies' gradients are summed over the pipeline ranks and averaged over the
replicas with one all-reduce over every rank holding a copy; these parameters are left out
of the data-parallel hooks. Identical gradients keep the copies identical under any
deterministic optimizer.

:class:`GradientSync` runs a rank's whole synchronisation after its schedule, in the order
both executors use: the buckets' all-reduces (or, with ZeRO 1 and 2, the reduce-scatters of
``planner.runtime.zero``), the tied sums while the reduce-scatters run, then the waits; after
the optimizer step, the ZeRO all-gathers of the weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist

from planner.runtime.emulate import sleep_until
from planner.runtime.tensor import local
from planner.runtime.zero import ShardedState

BUCKET_BYTES = 25 << 20  # PyTorch DDP's default bucket_cap_mb; a plan's stack sets its own (grad_bucket_bytes)


def _buckets(params: list[torch.nn.Parameter], cap_bytes: int) -> list[list[torch.nn.Parameter]]:
    """Parameters in reverse order (the order backward finishes them), cut into buckets of at
    most ``cap_bytes`` (a larger parameter gets a bucket of its own), as DDP does."""
    buckets: list[list[torch.nn.Parameter]] = []
    size = cap_bytes
    for param in reversed(params):
        nbytes = param.numel() * param.element_size()
        if size + nbytes > cap_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(param)
        size += nbytes
    return buckets


class DataParallelHooks:
    """Async all-reduce of each bucket of gradients once all its parameters have had their
    M-th accumulation; gradients are copied back after the wait."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        group: dist.ProcessGroup,
        dp_degree: int,
        bucket_bytes: int = BUCKET_BYTES,
        uses: dict[int, int] | None = None,
        *,
        overlap: bool = True,
        ready_at: Callable[[torch.Tensor], float] | None = None,
    ) -> None:
        """``uses``: per ``id(param)``, how many of the rank's stage chunks run it (default 1);
        each chunk's backward of a micro-batch accumulates into it once. ``overlap`` False:
        one bucket, reduced after the schedule. ``ready_at`` (emulated compute): the
        ``perf_counter`` time before which a bucket whose last gradient is this parameter's
        does not start."""
        self._group = group
        self._uses = {id(p): (uses or {}).get(id(p), 1) for p in params}
        self._dp_degree = dp_degree
        self._params = params
        self._overlap = overlap
        self._ready_at = ready_at
        self._buckets = _buckets(params, bucket_bytes if overlap else sum(p.numel() * p.element_size() for p in params))
        self._bucket_of = {id(p): i for i, bucket in enumerate(self._buckets) for p in bucket}
        self._num_microbatches = 1
        self._counts: dict[int, int] = {}
        self._pending: list[int] = []
        self._inflight: list[tuple[Any, torch.Tensor, int]] = []
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in params]

    def start_iteration(self, num_microbatches: int) -> None:
        self._num_microbatches = num_microbatches
        self._counts = {id(p): 0 for p in self._params}
        self._pending = [len(bucket) for bucket in self._buckets]
        self._inflight = []

    def _launch(self, bucket_idx: int) -> None:
        self._pending[bucket_idx] = -1  # launched
        grads = []
        for param in self._buckets[bucket_idx]:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            grads.append(local(param.grad).reshape(-1))  # a split parameter: this rank's shard
        flat = torch.cat(grads).div_(self._dp_degree)
        work = dist.all_reduce(flat, group=self._group, async_op=True)
        self._inflight.append((work, flat, bucket_idx))

    def _on_grad(self, param: torch.Tensor) -> None:
        key = id(param)
        self._counts[key] = self._counts.get(key, 0) + 1
        if self._overlap and self._counts[key] == self._num_microbatches * self._uses[key]:
            bucket_idx = self._bucket_of[key]
            self._pending[bucket_idx] -= 1
            if self._pending[bucket_idx] == 0:
                if self._ready_at is not None:
                    sleep_until(self._ready_at(param))
                self._launch(bucket_idx)

    def finish_iteration(self) -> None:
        """Launch any bucket not started (a parameter unused by some micro-batch), wait, copy back."""
        for bucket_idx, pending in enumerate(self._pending):
            if pending >= 0:
                self._launch(bucket_idx)
        for work, flat, bucket_idx in self._inflight:
            work.wait()
            offset = 0
            for param in self._buckets[bucket_idx]:
                assert param.grad is not None
                grad = local(param.grad)
                n = grad.numel()
                grad.copy_(flat[offset : offset + n].view_as(grad))
                offset += n
        self._inflight = []

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


class IterationSync(Protocol):
    """Gradients synchronised once per iteration: started before the schedule, finished after it
    (:class:`DataParallelHooks`; the routed experts' over their own group, ``planner.runtime.experts``)."""

    def start_iteration(self, num_microbatches: int) -> None: ...

    def finish_iteration(self) -> None: ...


class GradientSync:
    """One rank's gradient synchronisation: bucketed all-reduce hooks (or ZeRO shards, one per
    stage chunk that has parameters to shard), and the tied parameters' sums. ``divisor``
    divides the tied gradients (D: the mean over replicated pipelines; 1 over a stage's copies,
    whose micro-batch losses add up to one process's). ``experts``: the routed experts'
    gradients, synchronised over their own group (``planner.runtime.experts``; their ZeRO shards
    are among ``shards``)."""

    def __init__(
        self,
        *,
        hooks: DataParallelHooks | None,
        shards: list[ShardedState],
        tied_params: list[torch.nn.Parameter | None],
        tied_groups: list[dist.ProcessGroup | None],
        divisor: int,
        experts: IterationSync | None = None,
    ) -> None:
        self.hooks = hooks
        self.shards = shards
        self._tied_params = tied_params
        self._tied_groups = tied_groups
        self._divisor = divisor
        self.experts = experts

    def start_iteration(self, num_microbatches: int) -> None:
        """Before the schedule: each chunk of the rank runs ``num_microbatches`` micro-batches."""
        for hooks in (self.hooks, self.experts):
            if hooks is not None:
                hooks.start_iteration(num_microbatches)
        for shard in self.shards:
            shard.start_iteration()

    def synchronise(self) -> None:
        """After the schedule: finish the all-reduces, reduce-scatter every chunk's gradients and
        sum the tied ones meanwhile, then wait."""
        for hooks in (self.hooks, self.experts):
            if hooks is not None:
                hooks.finish_iteration()
        for shard in self.shards:
            shard.launch_sync()
        sync_tied(self._tied_params, self._tied_groups, self._divisor)
        for shard in self.shards:
            shard.wait_sync()

    def gather_params(self) -> None:
        """After the optimizer step: the ZeRO shards' updated weights, all-gathered."""
        for shard in self.shards:
            shard.gather_params()
