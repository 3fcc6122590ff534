"""Context parallelism inside a model: a layer's share of the sequence, and attention over the
keys and values of the whole sequence.

With context parallelism over ``cp`` ranks every token-wise computation (embeddings, norms,
MLPs, projections, the loss) runs on a rank's share of each sample's tokens unchanged; only
attention needs the other ranks' tokens. Following Llama 3 (Dubey et al. 2024, sec. 3.3.2)
and torchtitan:

- **load-balanced causal split**: the sequence of S tokens is cut into 2 cp chunks of
  S / (2 cp) tokens and rank i holds chunks i and 2 cp - 1 - i (:meth:`SequenceShard.local_slices`),
  so under a causal mask every rank attends to the same number of (query, key) pairs: an
  early chunk (few keys before it) is paired with a late one (many);
- **keys and values all-gathered** over the cp group in the forward
  (:meth:`SequenceShard.gather`, an autograd function: its backward reduce-scatters dK and
  dV, summing every rank's contribution to each key), then each rank attends its queries
  to every key of the sequence under a mask built from **global positions**
  (:meth:`SequenceShard.positions`, :meth:`SequenceShard.key_positions`): key j is visible to
  query i iff pos(j) <= pos(i). The gathered keys stay in rank order (the mask, not a
  reordering, puts them in place: softmax does not care about the keys' order), which
  saves a copy of K and V per layer. The gather is part of the attention core
  (:meth:`SequenceShard.gathered`): where the plan recomputes the core selectively, the
  gather re-runs with it in backward;
- **re-gathered in backward where the core is kept** (:meth:`SequenceShard.regathering`, the
  cost model's assumption, ``planner.cost.context``, and torch's experimental context
  parallelism's): what the attention kernel saves of the gathered K and V is packed as the
  rank's own shard (saved-tensor hooks; the kernel keeps everything else it saves: its
  output, log-sum-exp, the mask) and all-gathered again when the kernel's backward unpacks
  it, so a rank holds its own 1/cp of every layer's K and V between forward and backward and
  the whole sequence's K and V of one layer at a time (that layer's, during its backward).
  Decision: hooks, not a custom autograd function around the all-gather alone, because the
  kernel saves its inputs (the gathered tensors) itself, and a function around the whole
  core would have to re-run its forward in backward (that is selective recomputation)
  unless it called the kernels' private backward ops. The cost: one more all-gather of K
  and of V per layer in backward (priced by the cost model; on gloo measured in
  benchmarks/RESULTS.md). Only tensors sharing the gathered storage are re-gathered: a kernel
  that saved a *copy* would keep it (why the Hugging Face decoders' cp core runs grouped-query
  attention in the kernel rather than through transformers' ``repeat_kv`` copy,
  ``planner.models.hf``).

Why all-gather and not ring attention (Liu et al. 2023; torchtitan's default rotates K/V
blocks over the ring): Llama 3 chose the all-gather because it supports any mask (document
masks, sliding windows) with one ordinary attention call, and because K and V are small next
to Q under grouped-query attention (kv_heads < heads), so gathering them all costs little
memory; the all-gather's latency is exposed where a ring overlaps each block's transfer with
the previous block's compute. On gloo, where there is no overlap worth having and the
numerics must equal one process's, one attention call over the whole key set is also the
exact same softmax one process computes, up to summation order.

Rotary and learned position embeddings take :meth:`SequenceShard.positions` (the global
positions of the rank's tokens) in place of ``0 .. s - 1``. A layer learns its shard from the
attribute :data:`CONTEXT_ATTR`, which the runtime sets on every module of the layers it runs
(:func:`set_context`); a model reads it with :func:`context_of` (None: the whole sequence).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["CONTEXT_ATTR", "SequenceShard", "context_of", "observing_regathers", "set_context"]

#: the attribute of a module whose layer runs on a share of the sequence (a SequenceShard)
CONTEXT_ATTR = "planner_sequence_shard"


@dataclass(frozen=True, slots=True, kw_only=True)
class SequenceShard:
    """Rank ``index``'s share of each sample's sequence under context parallelism over
    ``degree`` ranks (the process ``group``; None only for tests of the split itself)."""

    degree: int
    index: int
    group: Any = None  # torch.distributed.ProcessGroup of the cp ranks, in cp index order
    #: False: a kept core keeps the gathered K/V of every layer until its backward (the runtime
    #: before the re-gather; not what the cost model prices: benchmarks/context_regather.py only)
    regather: bool = True

    def __post_init__(self) -> None:
        if self.degree < 1 or not 0 <= self.index < self.degree:
            raise ValueError(f"cp index {self.index} is not one of {self.degree} context-parallel ranks")

    @property
    def num_chunks(self) -> int:
        """Chunks each sequence is cut into: 2 cp."""
        return 2 * self.degree

    def chunks_of(self, cp_index: int) -> tuple[int, int]:
        """The two chunks rank ``cp_index`` holds: i and 2 cp - 1 - i (load-balanced causal split)."""
        return cp_index, self.num_chunks - 1 - cp_index

    def check_length(self, seq_len: int) -> int:
        """Tokens of one chunk of a ``seq_len``-token sequence (refused unless 2 cp divides it)."""
        if seq_len % self.num_chunks:
            raise ValueError(f"context parallelism over {self.degree} ranks cuts a sequence into {self.num_chunks} "
                             f"chunks: {seq_len} tokens per sample do not divide")
        return seq_len // self.num_chunks

    def local_slices(self, seq_len: int) -> tuple[slice, slice]:
        """The rank's two chunks of a ``seq_len``-token sequence, as slices of it."""
        c = self.check_length(seq_len)
        return tuple(slice(k * c, (k + 1) * c) for k in self.chunks_of(self.index))  # type: ignore[return-value]

    def split(self, tensor: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """The rank's share of ``tensor`` along ``dim`` (the sequence): its two chunks, in order."""
        first, second = self.local_slices(tensor.size(dim))
        return torch.cat([tensor[(slice(None),) * (dim % tensor.dim()) + (s,)] for s in (first, second)], dim=dim)

    def positions(self, local_len: int, device: torch.device | None = None) -> torch.Tensor:
        """Global positions (int64) of the rank's ``local_len`` tokens: its chunks' places in the
        whole sequence of ``degree x local_len`` tokens."""
        return self._positions_of(self.index, local_len * self.degree, device)

    def key_positions(self, local_len: int, device: torch.device | None = None) -> torch.Tensor:
        """Global positions of the keys :meth:`gather` returns (rank order, each rank's two chunks)."""
        seq_len = local_len * self.degree
        return torch.cat([self._positions_of(r, seq_len, device) for r in range(self.degree)])

    def _positions_of(self, cp_index: int, seq_len: int, device: torch.device | None) -> torch.Tensor:
        c = self.check_length(seq_len)
        return torch.cat([torch.arange(k * c, (k + 1) * c, device=device) for k in self.chunks_of(cp_index)])

    def gather(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """Every rank's ``tensor`` concatenated along ``dim`` in cp rank order (collective over
        the group, autograd: the backward reduce-scatters the gradient, summing each rank's
        contribution). The positions of the result are :meth:`key_positions`."""
        if self.degree == 1:
            return tensor
        out = _GatherDim0.apply(tensor.movedim(dim, 0), self.group, self.degree)
        if _SCOPES and torch.is_grad_enabled():  # a kept core: what its kernel saves of ``out`` is re-gathered
            _SCOPES[-1].gathered[_storage_key(out)] = (tensor, dim, self)
        return out.movedim(0, dim)

    @contextlib.contextmanager
    def regathering(self) -> Iterator[None]:
        """Within the block, tensors autograd saves that share the storage of a :meth:`gather`
        result are saved as the rank's own shard and all-gathered again when the backward
        unpacks them (the module docstring: a kept attention core). Everything else goes to
        the hooks around the block (the runtime's saved-bytes meter, a checkpoint's), as if
        this were not there; under non-reentrant checkpoint (a core recomputed selectively)
        the checkpoint's own hooks see the kernel's tensors and this scope only the core's
        inputs. A no-op for ``degree`` 1 (and without :attr:`regather`).

        Only the innermost pair of saved-tensor hooks applies (torch's documentation), so the
        outer pair is read with ``torch._C._autograd._top_saved_tensors_default_hooks`` (private;
        torch's own AOT autograd reads it the same way; typed in torch's stubs, checked with
        torch 2.13) and called for everything but the gathered tensors, and for the local
        shards that stand for them (so the meter counts a rank's own K and V)."""
        if self.degree == 1 or not self.regather:
            yield
            return
        scope = _Regathering(torch._C._autograd._top_saved_tensors_default_hooks(False))
        _SCOPES.append(scope)
        try:
            with torch.autograd.graph.saved_tensors_hooks(scope.pack, scope.unpack):
                yield
        finally:
            _SCOPES.pop()
            scope.gathered.clear()  # the scope's references to the local shards end with it

    def gathered(self, fn: Callable[..., Any], at: int = 0) -> Callable[..., Any]:
        """``fn`` (an attention core taking query, key, value as its positional arguments ``at``,
        ``at + 1``, ``at + 2``) called with the key and value of the whole sequence
        (:meth:`gather` along dim 2, the sequence of ``(b, heads, s, d)``). Run as the core
        (``planner.models.selective.run_core``), the gather is part of what selective
        recomputation re-runs in backward, so a recomputed core keeps only the rank's own K and V;
        a kept core run inside :meth:`regathering` keeps only them too (re-gathered in backward)."""

        def core(*args: Any, **kwargs: Any) -> Any:
            key, value = self.gather(args[at + 1], dim=2), self.gather(args[at + 2], dim=2)
            return fn(*args[: at + 1], key, value, *args[at + 3 :], **kwargs)

        return core

    def causal_mask(self, q_positions: torch.Tensor, k_positions: torch.Tensor, window: int | None = None) -> torch.Tensor:
        """Boolean (queries x keys) mask: key j visible to query i iff pos(j) <= pos(i) (and,
        with a sliding ``window``, pos(i) - pos(j) < window, as Mistral's)."""
        diff = q_positions[:, None] - k_positions[None, :]
        mask = diff >= 0
        return mask & (diff < window) if window is not None else mask


class _GatherDim0(torch.autograd.Function):
    """All-gather along dim 0 over a process group; backward: reduce-scatter (sum) of the gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any, degree: int) -> torch.Tensor:
        ctx.group, ctx.degree = group, degree
        tensor = tensor.contiguous()
        out = tensor.new_empty((degree * tensor.size(0), *tensor.shape[1:]))
        dist.all_gather_into_tensor(out, tensor, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad = grad.contiguous()
        out = grad.new_empty((grad.size(0) // ctx.degree, *grad.shape[1:]))
        dist.reduce_scatter_single(out, grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return out, None, None


def _storage_key(tensor: torch.Tensor) -> int:
    """The storage a plain tensor views (-1 for a tensor subclass without one of its own: never a gathered K/V)."""
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return -1


#: the :meth:`SequenceShard.regathering` scopes open now (innermost last)
_SCOPES: list[_Regathering] = []
#: called with every re-gathered tensor (the view the kernel's backward receives)
_OBSERVERS: list[Callable[[torch.Tensor], None]] = []


@dataclass(frozen=True, slots=True)
class _Saved:
    """A gathered K or V as autograd keeps it: the rank's own shard (packed by the outer hooks
    when there are any) and the place of the saved view in the gathered tensor."""

    packed: Any
    outer_unpack: Callable[[Any], torch.Tensor] | None
    shard: SequenceShard
    dim: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    def regather(self) -> torch.Tensor:
        local = self.packed if self.outer_unpack is None else self.outer_unpack(self.packed)
        moved = local.detach().movedim(self.dim, 0).contiguous()
        out = moved.new_empty((self.shard.degree * moved.size(0), *moved.shape[1:]))
        dist.all_gather_into_tensor(out, moved, group=self.shard.group)
        view = out.as_strided(self.size, self.stride, self.offset)
        for observe in list(_OBSERVERS):
            observe(view)
        return view


class _Regathering:
    """The saved-tensor hooks of one :meth:`SequenceShard.regathering` scope."""

    def __init__(self, outer: tuple[Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]] | None) -> None:
        self.outer = outer
        self.gathered: dict[int, tuple[torch.Tensor, int, SequenceShard]] = {}  # storage -> (local, dim, shard)

    def pack(self, tensor: torch.Tensor) -> Any:
        entry = self.gathered.get(_storage_key(tensor)) if self.gathered else None
        if entry is None:  # detached without outer hooks: a node's own output saved must not hold the node
            return tensor.detach() if self.outer is None else self.outer[0](tensor)
        local, dim, shard = entry
        packed = local.detach() if self.outer is None else self.outer[0](local)
        return _Saved(packed, None if self.outer is None else self.outer[1], shard, dim,
                      tuple(tensor.size()), tuple(tensor.stride()), tensor.storage_offset())

    def unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, _Saved):
            return packed.regather()
        return packed if self.outer is None else self.outer[1](packed)


@contextlib.contextmanager
def observing_regathers(callback: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """``callback`` sees every K or V re-gathered in backward inside the block (tests, benchmarks:
    how many are live at once)."""
    _OBSERVERS.append(callback)
    try:
        yield
    finally:
        _OBSERVERS.remove(callback)


def set_context(layer: nn.Module, shard: SequenceShard | None) -> None:
    """Run ``layer`` (every module in it) on ``shard`` of the sequence (None: the whole)."""
    for module in layer.modules():
        setattr(module, CONTEXT_ATTR, shard)


def context_of(module: nn.Module) -> SequenceShard | None:
    """The share of the sequence ``module`` runs on; None when it runs on the whole sequence."""
    shard = getattr(module, CONTEXT_ATTR, None)
    return shard if isinstance(shard, SequenceShard) and shard.degree > 1 else None
