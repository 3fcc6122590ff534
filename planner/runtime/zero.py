"""ZeRO stages 1, 2 and 3 (Rajbhandari et al. 2020, "ZeRO: memory optimizations toward training
trillion parameter models", section 5.1 P_os, 5.2 P_g and 5.3 P_p) for one stage chunk of a rank.

Layout (``FlatLayout``): the chunk's data-parallel parameters, in order, are laid end to end
in one flat buffer padded with zeros to a multiple of n = the data-parallel group's size;
group rank i owns the contiguous elements [i S, (i + 1) S), S = ceil(total / n). The rank
keeps its shard of the weights as one master ``nn.Parameter`` of S elements (same dtype as
the weights) and hands only that to the ordinary torch optimizer (SGD or AdamW, as
``--optimizer`` says, ``foreach=False`` as the engine), so the optimizer state is 1/n of the
unsharded one. SGD and AdamW update every element on its own, so stepping the shard gives
the unsharded update bit for bit.

One iteration (``ShardedState``):

1. ``start_iteration``: every parameter's ``.grad`` becomes a zeroed view of one flat
   gradient buffer, so backward accumulates the M micro-batches in place (autograd adds
   into an existing ``.grad``; 0 + g = g exactly, so no value changes);
2. ``launch_sync`` (after the schedule, i.e. once the stage's last backward has ended, while
   other stages run their cooldown -- what the cost model assumes): the buffer is divided
   by D (the engine's convention: loss / M per micro-batch, gradients / D, summed) and
   reduce-scattered (``reduce_scatter_single``, async); ``wait_sync`` waits;
3. the optimizer steps the master shard; ``gather_params`` all-gathers the updated shards
   (``all_gather_single``) and copies them into the parameters.

So the wire carries a reduce-scatter of the gradients and an all-gather of the weights, the
traffic ``planner.cost`` prices for ZeRO 1 and 2 (``sync_bytes_per_param``) and the 2 x
parameters of plain data parallel's ring all-reduce (ZeRO paper, section 7.2.1).

ZeRO 1 vs 2: the full gradient buffer is needed while the schedule accumulates micro-batches
(reduce-scattering every micro-batch instead would cost M times the traffic, which the plan
does not price; DeepSpeed's pipeline engine refuses ZeRO 2 for this reason). ZeRO 1 keeps
the buffer for the next iteration (as DDP keeps its buckets) and its shard's reduced
gradient lives in it, so it holds the full gradients; ZeRO 2 frees the buffer after the
reduce-scatter and keeps only the shard's gradient (S elements) through the optimizer step.
Note the cost model prices ZeRO 2 as DeepSpeed runs it (every micro-batch's gradients
reduce-scattered, 1/n of them at the peak: :mod:`planner.cost.sharding`), which this runtime,
reduce-scattering once after the last micro-batch, reaches only after the sync: its ZeRO 2 peak
is ZeRO 1's. After the sync ``param.grad`` is ``None`` in both: the reduced gradient exists only
for the shard, as ``master.grad``.

Why this design: ``torch.distributed.optim.ZeroRedundancyOptimizer`` assigns whole
parameters to ranks (uneven shards: one large embedding can leave a rank with most of the
state), does only stage 1, and broadcasts each parameter from its owner; FSDP2
(``fully_shard``) shards each parameter on dim 0 as DTensors and also shards the weights
(ZeRO 3), which would put collectives inside the pipeline stage's forward and change how
``torch.distributed.pipelining`` sees the module. A flat buffer gives even shards (padding
< n elements), one collective each way per chunk, and leaves the parameters and module
untouched (the saved-bytes meter and checkpoints see ordinary tensors).

Collectives on gloo (CPU, torch 2.13, checked with 2 processes): ``reduce_scatter_single``
(``reduce_scatter_tensor``, deprecated in its favour), ``reduce_scatter`` (list form),
``all_gather_single`` (``all_gather_into_tensor``), ``all_gather`` all work, async too and on
sub-groups; so no all-reduce fallback is needed.

ZeRO 3 (``zero=3``, :meth:`ShardedState.attach` to the chunk's module): the same flat shard
and master, and during the schedule the parameters' storage is freed (``resize_(0)``, as FSDP
frees its unsharded parameters) except while the chunk computes: a forward pre-hook all-gathers
the weights into it, a forward hook frees it, a hook on the chunk's outputs (when the backward
reaches them) gathers it again and gives
the parameters a fresh flat gradient buffer, and once every sharded parameter's gradient has
been accumulated (post-accumulate-grad hooks) the buffer is reduce-scattered into the shard's
gradient sum and freed, with the weights -- every micro-batch, so gradients and weights are
whole only inside the chunk's own forward or backward. The weights are copied in at the
storage level, so the tensors autograd saved (the parameters, and views of them) see them
again without a version bump. After the optimizer step the weights are gathered whole as in
ZeRO 1/2 (checkpoints, tied exchanges and reports read ordinary tensors), and freed again when
the next schedule starts.

Under a split backward (ZB-H1, ZB-H2, ZBV, DualPipe-V) a micro-batch's ``I`` (no parameter
gradient) and ``W`` (all of them) run apart, other micro-batches' passes between them; hooks
alone cannot tell them apart (one ``W`` reduce-scattered another's gradients: issue zbzero3), so
the engine runs each inside :meth:`ShardedState.input_pass` (weights gathered, freed after, no
buffer) or :meth:`ShardedState.weight_pass` (weights gathered and a fresh buffer before it,
reduce-scattered and freed when it ends, the recomputed layers' ``W`` included): three gathers
per micro-batch (F, I, W; the first stage, which torch runs no I on, two unless it rebuilds
recomputed layers there), as :mod:`planner.cost.fsdp` prices them (why ``W`` needs the weights).
Why our flat shard rather than torch's ``fully_shard``: FSDP2 does run on gloo (torch 2.13, CPU:
checked with 2 processes, forward and backward of a ``fully_shard`` model), but it makes every parameter a DTensor and, under
``torch.distributed.pipelining``, defers the reduce-scatter to the last micro-batch (whole
gradients at the peak, the ZeRO 2 memory) -- this path keeps the runtime's parameters,
checkpoints, saved-bytes meter and numerics checks as they are and reduce-scatters every
micro-batch as the cost model prices ZeRO 3. Its unit is the whole stage chunk (one gather per
chunk, the cost model's is one layer: :mod:`planner.cost.fsdp`); tensor-parallel (DTensor)
parameters are not supported under ZeRO 3.

Scope: parameters tied across pipeline ranks (``planner.runtime.grads.sync_tied``) stay
unsharded: they are stepped whole, by the same optimizer, on every rank holding them.
Interleaved plans are supported: each stage chunk of a rank has its own ``ShardedState``
over the same data-parallel group (the group's ranks run the same chunks in the same order).
With tensor parallelism (t > 1) a split parameter is a DTensor: the flat buffer holds the
rank's local shards (its data-parallel peers hold the same shards), each ``.grad`` is a DTensor
of the parameter's placements over a view of the buffer, and the gathered weights are copied
into the local shards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from planner.artifacts.kinds import OptimizerFamily
from planner.runtime.tensor import local

__all__ = ["FlatLayout", "ShardedState", "flatten", "optimizer_state_bytes", "state_bytes_per_param", "unflatten_into"]


@dataclass(frozen=True, slots=True, kw_only=True)
class FlatLayout:
    """Parameters of ``numels`` elements laid end to end, padded to ``num_shards`` x
    ``shard_numel``; shard ``shard_idx`` is elements [shard_start, shard_stop)."""

    numels: tuple[int, ...]
    num_shards: int
    shard_idx: int

    def __post_init__(self) -> None:
        if self.num_shards < 1:
            raise ValueError(f"num_shards must be >= 1 (got {self.num_shards})")
        if not 0 <= self.shard_idx < self.num_shards:
            raise ValueError(f"shard_idx {self.shard_idx} is outside 0 .. {self.num_shards - 1}")
        if any(n < 0 for n in self.numels):
            raise ValueError(f"negative element count in {self.numels}")

    @property
    def total_numel(self) -> int:
        return sum(self.numels)

    @property
    def shard_numel(self) -> int:
        return -(-self.total_numel // self.num_shards)

    @property
    def padded_numel(self) -> int:
        return self.shard_numel * self.num_shards

    @property
    def shard_start(self) -> int:
        return self.shard_idx * self.shard_numel

    @property
    def shard_stop(self) -> int:
        return self.shard_start + self.shard_numel

    @property
    def offsets(self) -> tuple[int, ...]:
        """Start of each parameter in the flat buffer."""
        out, at = [], 0
        for n in self.numels:
            out.append(at)
            at += n
        return tuple(out)


def flatten(tensors: Sequence[torch.Tensor], layout: FlatLayout) -> torch.Tensor:
    """The tensors end to end, zero-padded to ``layout.padded_numel`` (a new tensor)."""
    if tuple(t.numel() for t in tensors) != layout.numels:
        raise ValueError(f"tensors of {[t.numel() for t in tensors]} elements do not match the layout {layout.numels}")
    first = tensors[0]
    pad = torch.zeros(layout.padded_numel - layout.total_numel, dtype=first.dtype, device=first.device)
    return torch.cat([t.detach().reshape(-1) for t in tensors] + [pad])


def unflatten_into(flat: torch.Tensor, params: Sequence[torch.Tensor], layout: FlatLayout) -> None:
    """Copy each parameter's elements of ``flat`` into it (in place, outside autograd; a
    tensor-parallel DTensor parameter: into its local shard)."""
    with torch.no_grad():
        for param, start, n in zip(params, layout.offsets, layout.numels):
            shard = local(param)
            shard.copy_(flat[start : start + n].view_as(shard))


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of a module's output (a tensor, or tuples / lists / dicts of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _grad_view(param: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """``view`` as ``param``'s gradient: a DTensor of the parameter's placements for a
    tensor-parallel parameter (``view`` its local shard), else ``view`` itself."""
    if isinstance(param, DTensor):
        return DTensor.from_local(
            view, param.device_mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride()
        )
    return view


def state_bytes_per_param(optimizer: OptimizerFamily, element_size: int) -> int:
    """Optimizer state per parameter element in the runtime: AdamW keeps exp_avg and
    exp_avg_sq (2 x the weights' element size, 2 x 2 bytes with bf16 moments; plus one scalar
    ``step`` per parameter tensor, not counted here); SGD as the engine builds it (momentum 0)
    keeps none."""
    return optimizer.moment_bytes(element_size)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes of the tensors in the optimizer's state (numel x element size each)."""
    if optimizer is None:
        return 0
    return sum(
        local(v).numel() * v.element_size()  # a DTensor's state: this rank's shard
        for state in optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )


class ShardedState:
    """This rank's shard of a chunk's data-parallel parameters over ``group`` (ZeRO ``zero``
    in {1, 2}): the master shard, the flat gradient buffer and the two collectives."""

    def __init__(self, params: list[torch.nn.Parameter], group: dist.ProcessGroup, *, zero: int, grad_divisor: int) -> None:
        """``grad_divisor``: what each rank's gradient is divided by before the sum (D for
        replicated pipelines, so the sum is the mean over replicas)."""
        if zero not in (1, 2, 3):
            raise ValueError(f"ShardedState needs zero 1, 2 or 3 (got {zero})")
        if zero == 3 and any(isinstance(p, DTensor) for p in params):
            raise ValueError("ZeRO 3 in the runtime does not support tensor-parallel (DTensor) parameters")
        if not params:
            raise ValueError("ShardedState needs at least one parameter")
        kinds = {(p.dtype, p.device) for p in params}
        if len(kinds) != 1:
            raise ValueError(f"ZeRO needs one dtype and device for a stage's parameters (got {sorted(map(str, kinds))})")
        self.params = list(params)
        self.zero = zero
        self._group = group
        self._divisor = grad_divisor
        self.layout = FlatLayout(
            numels=tuple(local(p).numel() for p in params), num_shards=dist.get_world_size(group), shard_idx=dist.get_rank(group)
        )
        flat = flatten([local(p) for p in self.params], self.layout)
        self.master = torch.nn.Parameter(flat[self.layout.shard_start : self.layout.shard_stop].clone())
        self._flat_grad: torch.Tensor | None = None
        self._pending: tuple[Any, torch.Tensor] | None = None
        self._sum: torch.Tensor | None = None  # ZeRO 3: the shard's reduced gradients, summed over micro-batches
        self._whole = True  # ZeRO 3: the parameters hold their weights
        self._ready = 0  # ZeRO 3: gradients accumulated in this backward
        self._pass: str | None = None  # ZeRO 3 under a split backward: "input" or "weight" while one runs
        self._moved: Callable[[], None] | None = None  # ZeRO 3: told when the weights were gathered anew
        self.gathers = 0  # ZeRO 3: the weights' all-gathers inside the schedules (the tests count them)
        #: ZeRO 3: the most bytes the parameters and master shard held when a forward of the
        #: chunk started inside the schedule (what the rank keeps between its uses of them)
        self.between_bytes_peak = 0

    # ------------------------------------------------------------ ZeRO 3
    def attach(self, module: torch.nn.Module) -> None:
        """ZeRO 3: gather the weights around the chunk's forward and backward (module docstring)."""
        if self.zero != 3:
            return
        self._moved = getattr(module, "weights_moved", None)  # a StageModule's meter re-reads the new storage
        module.register_forward_pre_hook(lambda _m, _a: self._materialise())
        module.register_forward_hook(lambda _m, _a, out: self._after_forward(out) if torch.is_grad_enabled() else None)
        for param in self.params:
            param.register_post_accumulate_grad_hook(lambda _p: self._accumulated())

    def _after_forward(self, output: Any) -> None:
        """Free the weights; gather them again when the backward reaches the chunk's outputs: a
        hook on each output tensor (its node's pre-hook, the first to fire once per backward).
        Not ``register_full_backward_pre_hook``: that hands on its outputs as views of its own
        node's, which torch's split backward cannot detach in place (``stage_backward_input``:
        "Can't detach views in-place", a middle stage under ZBV or ZB-H1 at P > 2) and the engine
        cannot free once sent (``planner.runtime.engine.deallocate_output``)."""
        self._free_weights()
        tensors = [t for t in _tensors(output) if t.requires_grad]
        fired = [False]

        def before(_grad: torch.Tensor) -> None:
            if not fired[0]:
                fired[0] = True
                self._before_backward()

        for t in tensors:
            t.register_hook(before)

    @contextlib.contextmanager
    def input_pass(self, gather: bool = True) -> Iterator[None]:
        """ZeRO 3 under a split backward: a micro-batch's input-gradient pass ``I`` (the engine's).
        The weights are gathered for it (``gather``: the pass computes; the first stage's runs
        nothing unless it rebuilds recomputed layers) and freed after it; no gradient buffer is
        made (``I`` accumulates no parameter gradient: they come in the micro-batch's ``W``,
        after other micro-batches' passes)."""
        if self.zero != 3:
            yield
            return
        if gather:
            self._gather()
        self._pass = "input"
        try:
            yield
        finally:
            self._pass = None
            self._free_weights()

    @contextlib.contextmanager
    def weight_pass(self) -> Iterator[None]:
        """ZeRO 3 under a split backward: a micro-batch's weight-gradient pass ``W`` (the
        engine's; the stage's own W and its recomputed layers'). The weights are gathered and a
        fresh flat gradient buffer given to the parameters before it; after it the buffer is
        reduce-scattered into the shard's sum and freed, with the weights, as after a whole
        backward."""
        if self.zero != 3:
            yield
            return
        self._pass = None
        self._before_backward()
        self._pass = "weight"
        try:
            yield
        finally:
            self._pass = None
            self._scatter()

    def _materialise(self) -> None:
        if self._sum is not None and torch.is_grad_enabled():
            held = self.whole_param_bytes() + self.master.untyped_storage().nbytes()
            self.between_bytes_peak = max(self.between_bytes_peak, held)
        self._gather()

    def _gather(self) -> None:
        if self._whole:
            return
        flat = self._empty(self.layout.padded_numel)
        dist.all_gather_single(flat, self.master.detach(), group=self._group)
        self.gathers += self._sum is not None
        for param, start, n in zip(self.params, self.layout.offsets, self.layout.numels):
            storage = param.untyped_storage()
            storage.resize_(n * param.element_size())
            storage.copy_(flat[start : start + n].clone().untyped_storage())  # no version bump
        self._whole = True
        if self._moved is not None:
            self._moved()

    def _free_weights(self) -> None:
        if self.zero != 3 or self._sum is None:  # outside the schedule the weights stay whole
            return
        for param in self.params:
            param.untyped_storage().resize_(0)
        self._whole = False

    def _before_backward(self) -> None:
        if self._pass is not None:  # a split backward's pass: the engine gathered for it (and made W's buffer)
            return
        self._materialise()
        self._flat_grad = torch.zeros(self.layout.padded_numel, dtype=self.master.dtype, device=self.master.device)
        for param, start, n in zip(self.params, self.layout.offsets, self.layout.numels):
            param.grad = self._flat_grad[start : start + n].view_as(param)
        self._ready = 0

    def _accumulated(self) -> None:
        self._ready += 1
        if self._ready == len(self.params) and self._pass is None:  # a W pass is scattered when it ends
            self._scatter()

    def _scatter(self) -> None:
        """ZeRO 3: reduce-scatter this micro-batch's gradients into the shard's sum; free the
        whole gradients and weights."""
        if self._flat_grad is None or self._sum is None:
            return
        out = self._empty(self.layout.shard_numel)
        dist.reduce_scatter_single(out, self._flat_grad, group=self._group)
        self._sum.add_(out)
        self._flat_grad = None
        for param in self.params:
            param.grad = None
        self._free_weights()

    def whole_param_bytes(self) -> int:
        """Bytes the parameters' own storage holds now (0 while ZeRO 3 has freed them)."""
        return sum(p.untyped_storage().nbytes() for p in self.params)

    def _empty(self, numel: int) -> torch.Tensor:
        return torch.empty(numel, dtype=self.master.dtype, device=self.master.device)

    def start_iteration(self) -> None:
        """Point every parameter's ``.grad`` at a zeroed slice of the flat gradient buffer
        (ZeRO 3: zero the shard's gradient sum and free the weights until the first forward)."""
        if self.zero == 3:
            self._sum = torch.zeros(self.layout.shard_numel, dtype=self.master.dtype, device=self.master.device)
            self._free_weights()
            return
        if self._flat_grad is None:
            self._flat_grad = torch.zeros(self.layout.padded_numel, dtype=self.master.dtype, device=self.master.device)
        else:
            self._flat_grad.zero_()
        for param, start, n in zip(self.params, self.layout.offsets, self.layout.numels):
            param.grad = _grad_view(param, self._flat_grad[start : start + n].view_as(local(param)))

    def launch_sync(self) -> None:
        """Divide the accumulated gradients by ``grad_divisor`` and start the reduce-scatter."""
        if self.zero == 3:  # reduced every micro-batch: only the divisor is left
            if self._sum is None:
                raise RuntimeError("launch_sync before start_iteration")
            self._scatter()  # a backward whose gradients did not all arrive (unused parameters)
            self._pending = (None, self._sum.div_(self._divisor))
            self._sum = None
            return
        if self._flat_grad is None:
            raise RuntimeError("launch_sync before start_iteration")
        flat = self._flat_grad.div_(self._divisor)
        out = self._empty(self.layout.shard_numel)
        work = dist.reduce_scatter_single(out, flat, group=self._group, async_op=True)
        self._pending = (work, out)

    def wait_sync(self) -> None:
        """Wait for the reduce-scatter; the shard's reduced gradient becomes ``master.grad``
        (inside the kept buffer for ZeRO 1; the buffer is freed for ZeRO 2)."""
        if self._pending is None:
            raise RuntimeError("wait_sync without launch_sync")
        work, out = self._pending
        self._pending = None
        if work is not None:
            work.wait()
        for param in self.params:
            param.grad = None
        if self.zero >= 2:
            self._flat_grad = None
            self.master.grad = out
        else:
            assert self._flat_grad is not None
            shard = self._flat_grad[self.layout.shard_start : self.layout.shard_stop]
            shard.copy_(out)
            self.master.grad = shard

    def gather_params(self) -> None:
        """All-gather the updated shards and copy them into the parameters."""
        if self.zero == 3:
            self._whole = False
            self._materialise()
            return
        flat = self._empty(self.layout.padded_numel)
        dist.all_gather_single(flat, self.master.detach(), group=self._group)
        unflatten_into(flat, self.params, self.layout)

    def reload_master(self) -> None:
        """Take the master shard from the parameters again (after loading a checkpoint)."""
        with torch.no_grad():
            self.master.copy_(flatten([local(p) for p in self.params], self.layout)[self.layout.shard_start : self.layout.shard_stop])
