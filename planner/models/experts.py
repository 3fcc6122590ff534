"""Routed experts and their token dispatch: one process, or expert-parallel over ranks.

A mixture-of-experts layer (Shazeer et al. 2017; GShard, Lepikhin et al. 2021; Switch, Fedus
et al. 2022) sends each token to ``topk`` of ``E`` expert MLPs chosen by a router and sums
their outputs weighted by the router's gates. :class:`RoutedExperts` holds the E experts as
*grouped* weights, ``w1`` (E, hidden, ffn) and ``w2`` (E, ffn, hidden) -- the layout of
Megatron-Core's grouped GEMM (``TEGroupedMLP``) -- with a GELU between and no biases (as
Mixtral, Qwen3-MoE and DeepSeek-V3 experts).

The computation (:func:`run_experts`), as Megatron-Core's ``MoEAlltoAllTokenDispatcher``:

1. **permute**: the (token, choice) pairs sorted by expert (a stable sort: ties keep token
   order), so each expert's tokens are one contiguous block;
2. **dispatch** (expert parallelism over ``ep`` ranks, rank j holding experts
   [j E / ep, (j + 1) E / ep)): the per-expert counts exchanged, then the blocks sent to the
   rank holding their expert with one ``all_to_all_single`` over the ep group, and regrouped
   there by local expert;
3. with **expert tensor parallelism** over ``etp`` ranks (each holding 1/etp of every local
   expert's ffn columns: ``w1`` split on dim 2, ``w2`` on dim 1, Megatron's column / row split),
   the received tokens are all-gathered over the etp group, every rank computes its partial
   output for all of them, and the partial outputs are reduce-scattered back;
4. the experts' MLPs (one GEMM pair per local expert);
5. **combine**: the reverse all-to-all, the un-permutation, and the gate-weighted sum over
   each token's ``topk`` choices.

Collectives are autograd functions (:class:`_AllToAll`: its backward is the all-to-all with the
splits swapped), so the backward sends the gradients the same ways back. ``all_to_all_single``
with uneven splits runs on gloo (checked with torch 2.13, CPU, 2 processes, float64 and int64),
so the all-gather and reduce-scatter of uneven blocks over the etp group are all-to-alls too.

Where a rank's tokens are replicated over tensor-parallel ranks (tensor parallelism without
sequence parallelism: every tp rank holds the same hidden states), each of them routes its
contiguous share of the tokens (``ExpertShard.token_split``: :func:`split_tokens`, whose
backward all-gathers the gradient) and the combined outputs are all-gathered
(:func:`gather_tokens`, whose backward takes the rank's share of the replicated gradient), so
no token reaches an expert twice (Megatron-Core requires sequence parallelism instead).

A rank learns how it runs a layer's experts from the attribute :data:`EXPERT_ATTR` of the
:class:`RoutedExperts` module (an :class:`ExpertShard`, set by the runtime; None: one process
holds every expert), and holds the local slices of the grouped weights (the runtime makes them
DTensors over the (ep, etp) mesh; :func:`local_weight` reads the local tensor).
"""

from __future__ import annotations

import contextlib
import math
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.fx
import torch.nn.functional as F
from torch import nn

from planner.models.dropped import recomputed

__all__ = [
    "EXPERT_ATTR",
    "ExpertShard",
    "RoutedExperts",
    "expert_modules",
    "gather_tokens",
    "local_weight",
    "run_experts",
    "split_tokens",
    "token_sizes",
]

#: the attribute of a RoutedExperts module run expert-parallel (an ExpertShard)
EXPERT_ATTR = "planner_expert_shard"


@dataclass(frozen=True, slots=True, kw_only=True)
class Split:
    """A rank's place in a group of ``degree`` ranks (``index``), and the group (None: tests)."""

    degree: int = 1
    index: int = 0
    group: Any = None

    def __post_init__(self) -> None:
        if self.degree < 1 or not 0 <= self.index < self.degree:
            raise ValueError(f"index {self.index} is not one of {self.degree} ranks")


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertShard:
    """How one rank runs a layer's ``num_experts`` experts: its place in the expert-parallel
    group ``ep`` (it holds experts [index E / ep, (index + 1) E / ep)), in the expert
    tensor-parallel group ``etp`` (1/etp of each local expert's ffn columns), and, where its
    tokens are replicated over tensor-parallel ranks, its share of them (``token_split``);
    ``sequence_split``: the sequence-parallel slice its tokens are (for their positions)."""

    num_experts: int
    ep: Split = Split()
    etp: Split = Split()
    token_split: Split = Split()
    sequence_split: Split = Split()

    def __post_init__(self) -> None:
        if self.num_experts % self.ep.degree:
            raise ValueError(f"expert-parallel degree {self.ep.degree} does not divide the {self.num_experts} experts")

    @property
    def local_experts(self) -> int:
        """Experts this rank holds: E / ep."""
        return self.num_experts // self.ep.degree

    @property
    def first_expert(self) -> int:
        return self.ep.index * self.local_experts


def local_weight(weight: torch.Tensor) -> torch.Tensor:
    """The rank's local tensor of a weight (a DTensor's ``to_local()``; a plain tensor as it is).
    ``torch.distributed.tensor`` is looked up, not imported: it takes seconds to import, and a
    weight can only be a DTensor once something imported it."""
    module = sys.modules.get("torch.distributed.tensor")
    if module is not None and isinstance(weight, module.DTensor):
        return weight.to_local()
    return weight


class RoutedExperts(nn.Module):
    """``num_experts`` expert MLPs (hidden -> ffn -> hidden, GELU, no bias) as grouped weights
    ``w1`` (E, hidden, ffn) and ``w2`` (E, ffn, hidden), each expert drawn as ``nn.Linear``'s
    default initialisation draws its weight (uniform, bound 1 / sqrt(fan_in))."""

    def __init__(self, hidden: int, ffn: int, num_experts: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.shared_experts = 0  # experts beside these that every token visits (set by the layer: profiles record it)
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden, ffn))
        self.w2 = nn.Parameter(torch.empty(num_experts, ffn, hidden))
        with torch.no_grad():
            self.w1.uniform_(-1.0 / math.sqrt(hidden), 1.0 / math.sqrt(hidden))
            self.w2.uniform_(-1.0 / math.sqrt(ffn), 1.0 / math.sqrt(ffn))
        setattr(self, EXPERT_ATTR, None)

    def forward(self, tokens: torch.Tensor, choices: torch.Tensor, gates: torch.Tensor, recompute_act: bool = False) -> torch.Tensor:
        """``tokens`` (N, hidden), ``choices`` (N, topk) expert indices, ``gates`` (N, topk) ->
        the gate-weighted sum of each token's experts' outputs (N, hidden); ``recompute_act``:
        the GELU's output recomputed in backward, not kept (Megatron's ``moe_act``)."""
        shard = getattr(self, EXPERT_ATTR, None)
        return run_experts(tokens, choices, gates, local_weight(self.w1), local_weight(self.w2), shard, recompute_act)


def expert_modules(layer: nn.Module) -> list[RoutedExperts]:
    """The :class:`RoutedExperts` modules inside ``layer`` (empty: a dense layer)."""
    return [m for m in layer.modules() if isinstance(m, RoutedExperts)]


# ---------------------------------------------------------------- the computation


def run_experts(
    tokens: torch.Tensor, choices: torch.Tensor, gates: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
    shard: ExpertShard | None, recompute_act: bool = False,
) -> torch.Tensor:
    """Permute, dispatch, compute, combine (module docstring); ``w1``/``w2`` the rank's local
    expert weights (all E of them without ``shard``); ``recompute_act``: see :class:`RoutedExperts`."""
    num_tokens, topk = choices.shape
    flat = choices.reshape(-1)
    order = torch.sort(flat, stable=True).indices  # (token, choice) pairs grouped by expert
    permuted = tokens.index_select(0, torch.div(order, topk, rounding_mode="floor"))
    num_experts = w1.size(0) if shard is None else shard.num_experts
    counts = torch.bincount(flat, minlength=num_experts)
    if shard is None or (shard.ep.degree == 1 and shard.etp.degree == 1):
        out = _grouped_mlp(permuted, counts.tolist(), w1, w2, recompute_act)
    else:
        out = _dispatched(permuted, counts, w1, w2, shard, recompute_act)
    unpermuted = out.index_select(0, _inverse(order))
    return (unpermuted.view(num_tokens, topk, -1) * gates.unsqueeze(-1)).sum(dim=1)


# one node of a torch.fx graph (its routing is data-dependent): the profiler's operator graphs trace around it
torch.fx.wrap("run_experts")


def _inverse(order: torch.Tensor) -> torch.Tensor:
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return inverse


def _grouped_mlp(x: torch.Tensor, counts: list[int], w1: torch.Tensor, w2: torch.Tensor, recompute_act: bool = False) -> torch.Tensor:
    """Rows of ``x`` in blocks of ``counts[e]`` through expert e's MLP (one GEMM pair each);
    ``recompute_act``: each GELU's output recomputed from its input (kept by the GELU) in
    backward instead of kept by the second GEMM (:func:`planner.models.dropped.recomputed`)."""
    outs = []
    # unbind, not w1[e]: indexing's backward would fill a zero tensor of all E experts per expert
    for block, up, down in zip(torch.split(x, counts), w1.unbind(0), w2.unbind(0)):
        hidden = block @ up
        act = F.gelu(hidden)
        with recomputed(act, lambda hidden=hidden: F.gelu(hidden)) if recompute_act else contextlib.nullcontext():
            outs.append(act @ down)
    return torch.cat(outs) if outs else x.new_zeros((0, w2.size(-1)))


def _regroup(rows_per_source: torch.Tensor) -> torch.Tensor:
    """Rows arriving source-major, expert-minor (``rows_per_source[j, e]`` of them from source j
    for local expert e) -> the stable order grouping them by expert."""
    num_sources, num_local = rows_per_source.shape
    experts = torch.arange(num_local, device=rows_per_source.device)
    expert_of_row = experts.repeat(num_sources).repeat_interleave(rows_per_source.reshape(-1))
    return torch.sort(expert_of_row, stable=True).indices


def _dispatched(
    x: torch.Tensor, counts: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, shard: ExpertShard, recompute_act: bool,
) -> torch.Tensor:
    """Steps 2 to 5 of the module docstring for rows ``x`` sorted by expert (``counts`` each)."""
    ep = shard.ep
    send = counts.view(ep.degree, shard.local_experts)  # rows for each destination's local experts
    recv = torch.empty_like(send)
    if ep.degree > 1:
        dist.all_to_all_single(recv, send.contiguous(), group=ep.group)
    else:
        recv.copy_(send)
    send_rows, recv_rows = send.sum(dim=1).tolist(), recv.sum(dim=1).tolist()
    received = _AllToAll.apply(x, recv_rows, send_rows, ep.group) if ep.degree > 1 else x
    order = _regroup(recv)
    grouped = received.index_select(0, order)
    per_expert = recv.sum(dim=0)
    if shard.etp.degree > 1:
        out = _tensor_parallel_mlp(grouped, per_expert, w1, w2, shard.etp, recompute_act)
    else:
        out = _grouped_mlp(grouped, per_expert.tolist(), w1, w2, recompute_act)
    back = out.index_select(0, _inverse(order))
    return _AllToAll.apply(back, send_rows, recv_rows, ep.group) if ep.degree > 1 else back


def _tensor_parallel_mlp(
    x: torch.Tensor, per_expert: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, etp: Split, recompute_act: bool,
) -> torch.Tensor:
    """Rows ``x`` (grouped by local expert, ``per_expert`` each) through the experts split over the
    etp group: all-gather every rank's rows, compute this rank's partial outputs (its ffn
    columns), reduce-scatter them back (each rank the sum for its own rows)."""
    everyone = torch.empty(etp.degree * per_expert.numel(), dtype=per_expert.dtype, device=per_expert.device)
    dist.all_gather_into_tensor(everyone, per_expert.contiguous(), group=etp.group)
    everyone = everyone.view(etp.degree, per_expert.numel())  # rows per (etp rank, local expert)
    rows = everyone.sum(dim=1).tolist()
    mine = x.size(0)
    gathered = _AllToAll.apply(torch.cat([x] * etp.degree), rows, [mine] * etp.degree, etp.group)
    order = _regroup(everyone)
    partial = _grouped_mlp(gathered.index_select(0, order), everyone.sum(dim=0).tolist(), w1, w2, recompute_act)
    partial = partial.index_select(0, _inverse(order))
    pieces = _AllToAll.apply(partial, [mine] * etp.degree, rows, etp.group)
    return pieces.view(etp.degree, mine, -1).sum(dim=0)


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of rows: ``in_rows[j]`` rows to rank j, ``out_rows[j]`` from it;
    backward: the same with the splits swapped."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_rows: list[int], in_rows: list[int], group: Any) -> torch.Tensor:
        ctx.rows, ctx.group = (out_rows, in_rows), group
        out = x.new_empty((sum(out_rows), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_rows, in_rows, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        out_rows, in_rows = ctx.rows
        back = grad.new_empty((sum(in_rows), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_rows, out_rows, group=ctx.group)
        return back, None, None, None


# ---------------------------------------------------------------- tokens replicated over tp ranks


def token_sizes(num_tokens: int, degree: int) -> list[int]:
    """Contiguous shares of ``num_tokens`` over ``degree`` ranks (the first ones one larger)."""
    base, extra = divmod(num_tokens, degree)
    return [base + (i < extra) for i in range(degree)]


def split_tokens(x: torch.Tensor, split: Split) -> torch.Tensor:
    """This rank's contiguous share of replicated rows (backward: the shares' gradients
    all-gathered, so the replicated input's gradient is whole on every rank)."""
    if split.degree == 1:
        return x
    return _SplitRows.apply(x, split)


def gather_tokens(x: torch.Tensor, split: Split, num_tokens: int) -> torch.Tensor:
    """Every rank's share of the rows, whole (backward: this rank's share of the replicated gradient)."""
    if split.degree == 1:
        return x
    return _GatherRows.apply(x, split, num_tokens)


def _all_gather_rows(x: torch.Tensor, split: Split, num_tokens: int) -> torch.Tensor:
    sizes = token_sizes(num_tokens, split.degree)
    out = x.new_empty((num_tokens, *x.shape[1:]))
    dist.all_to_all_single(out, torch.cat([x.contiguous()] * split.degree), sizes, [x.size(0)] * split.degree,
                           group=split.group)
    return out


def _share(x: torch.Tensor, split: Split) -> torch.Tensor:
    sizes = token_sizes(x.size(0), split.degree)
    start = sum(sizes[: split.index])
    return x[start : start + sizes[split.index]]


class _SplitRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, split: Split) -> torch.Tensor:
        ctx.split, ctx.num_tokens = split, x.size(0)
        return _share(x, split).clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_gather_rows(grad, ctx.split, ctx.num_tokens), None


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, split: Split, num_tokens: int) -> torch.Tensor:
        ctx.split = split
        return _all_gather_rows(x, split, num_tokens)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _share(grad, ctx.split).contiguous(), None, None
