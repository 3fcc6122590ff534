"""Expert parallelism in the runtime: the routed experts of each MoE layer laid out over a
pipeline rank's ranks apart from attention ("parallel folding", Liu et al. 2025; Megatron-Core's
``--expert-model-parallel-size`` / ``--expert-tensor-parallel-size``).

A pipeline rank's n = D x c x t ranks run attention as the plan's ("pp", "dp", "cp", "tp") mesh
says, and the experts as its ("pp", "edp", "ep", "etp") mesh says (``Layout.expert_coordinates``,
``ep_group``, ``etp_group``, ``edp_group``: the same ranks numbered rank = p n + (edp ep +
ep_index) etp + etp_index). The runtime

- builds the expert groups (:func:`build_expert_groups`): per pipeline rank, the ep lines (tokens
  are dispatched and combined over them), the etp lines (an expert's weights split over them),
  the edp lines (an expert shard's gradients summed over them), and the ("ep", "etp")
  ``DeviceMesh`` whose DTensors the expert weights become;
- shards every ``RoutedExperts`` of the rank's stages (:func:`install_experts`): its grouped
  weights become DTensors of the rank's experts ``Shard(0)`` on "ep" and of its ffn columns on
  "etp" (``w1`` dim 2, ``w2`` dim 1), and the module learns its
  :class:`~planner.models.experts.ExpertShard` (dispatch over "ep", ffn split over "etp"; the
  all-to-all path of ``planner.models.experts``). Where a rank's tokens are replicated over its
  tp ranks (t > 1 without sequence parallelism) each tp rank routes 1/t of them
  (``ExpertShard.token_split``), so every token of the pipeline rank reaches its experts once;
  with sequence parallelism the tokens are already the tp ranks' own slices;
- synchronises the experts' gradients over the edp group, not attention's dp x cp group
  (:class:`ExpertSync`): an expert shard's gradient on one rank holds the contributions of the
  tokens dispatched to it, the edp ranks together all the pipeline rank's tokens, so the sum
  over edp divided by D c (the mean over replicated pipelines and cp shares, as every other
  gradient) is one process's gradient. ZeRO 1 and 2 shard the experts' optimizer state over
  the edp group (a ``planner.runtime.zero.ShardedState`` of their own per stage chunk); with
  edp = 1 nothing is reduced, the gradients are only divided.

The machinery runs when the plan folds experts (ep x etp > 1) or splits tensors (t > 1: the
edp group then spans tp ranks, each of which computed the experts for its share of the tokens);
otherwise the experts are parameters like any other, synchronised over the dp x cp group
(the same ranks then). Refused before any compute (:func:`expert_parallel_refusal`): experts
folded on a model without ``RoutedExperts``; ep not dividing E; etp not dividing the ffn
width; ZeRO 3 with it (its per-chunk gather is one flat shard over the dp x cp group).
Checkpoints: a rank's expert shards and their optimizer state are its own, so with the experts
folded every rank writes and reads its own file per stage (``planner.runtime.checkpoint``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from planner.artifacts.kinds import ZeroStage
from planner.artifacts.layout import Layout
from planner.models.experts import EXPERT_ATTR, ExpertShard, RoutedExperts, Split, expert_modules
from planner.runtime.expert_check import expert_parallel_refusal, experts_folded
from planner.runtime.grads import DataParallelHooks
from planner.runtime.tensor import local
from planner.runtime.zero import ShardedState

__all__ = [
    "ExpertGroups",
    "ExpertSync",
    "build_expert_groups",
    "expert_lines",
    "expert_parallel_refusal",
    "experts_folded",
    "install_experts",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertGroups:
    """One rank's expert groups: its place in the expert mesh and the groups along it."""

    ep: Split
    etp: Split
    edp: dist.ProcessGroup | None  # None when edp = 1
    mesh: object | None  # the ("ep", "etp") DeviceMesh when ep x etp > 1
    token_split: Split  # its share of tokens replicated over tp ranks (t > 1 without sequence parallelism)
    sequence_split: Split  # the sequence-parallel slice its tokens are


def _own_group(rank_sets: list[tuple[int, ...]], rank: int, timeout_s: float) -> dist.ProcessGroup | None:
    """Create a group for every rank set (collectively, in order); return the one holding ``rank``."""
    mine = None
    for ranks in rank_sets:
        group = dist.new_group(list(ranks), timeout=timedelta(seconds=timeout_s))
        mine = group if rank in ranks else mine
    return mine


def expert_lines(layout: Layout) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Every pipeline rank's ep, etp and edp groups (``Layout.ep_group``, ``etp_group``,
    ``edp_group`` of its first stage), in the order every rank creates them."""
    firsts = [layout.stage_indices(p)[0] for p in range(layout.pipeline_size)]
    edp, ep, etp = layout.edp_degree, layout.ep_degree, layout.etp_degree
    return (
        [layout.ep_group(s, d, k) for s in firsts for d in range(edp) for k in range(etp)],
        [layout.etp_group(s, d, e) for s in firsts for d in range(edp) for e in range(ep)],
        [layout.edp_group(s, e, k) for s in firsts for e in range(ep) for k in range(etp)],
    )


def build_expert_groups(
    layout: Layout, rank: int, timeout_s: float, device: torch.device, tensor_group: dist.ProcessGroup | None,
) -> ExpertGroups:
    """Create the expert groups of every pipeline rank (collective over the default group: every
    rank creates them all in the same order) and return this rank's; ``tensor_group``: its tp
    group (t > 1), over which replicated tokens are shared out."""
    _, edp_idx, ep_idx, etp_idx = layout.expert_coordinates(rank)
    edp, ep, etp = layout.edp_degree, layout.ep_degree, layout.etp_degree
    ep_lines, etp_lines, edp_lines = expert_lines(layout)
    ep_group = _own_group(ep_lines, rank, timeout_s) if ep > 1 else None
    etp_group = _own_group(etp_lines, rank, timeout_s) if etp > 1 else None
    edp_group = _own_group(edp_lines, rank, timeout_s) if edp > 1 else None
    mesh = None
    if ep * etp > 1:
        from torch.distributed.device_mesh import DeviceMesh

        singles = _own_group([(r,) for r in range(layout.world_size)], rank, timeout_s) if min(ep, etp) == 1 else None
        first = layout.stage_indices(layout.expert_coordinates(rank)[0])[0]
        ranks = torch.tensor([[layout.expert_rank_of(stage_idx=first, edp_index=edp_idx, ep_index=e, etp_index=k)
                               for k in range(etp)] for e in range(ep)], dtype=torch.int64)
        mesh = DeviceMesh.from_group([ep_group or singles, etp_group or singles], device.type, mesh=ranks,
                                     mesh_dim_names=("ep", "etp"))
    t = layout.tp_degree
    tp_index = layout.coordinates(rank)[3]
    replicated = t > 1 and not layout.sequence_parallel
    return ExpertGroups(
        ep=Split(degree=ep, index=ep_idx, group=ep_group),
        etp=Split(degree=etp, index=etp_idx, group=etp_group),
        edp=edp_group,
        mesh=mesh,
        token_split=Split(degree=t, index=tp_index, group=tensor_group) if replicated else Split(),
        sequence_split=Split(degree=t, index=tp_index) if layout.sequence_parallel else Split(),
    )


def install_experts(layers: Iterable[nn.Module], groups: ExpertGroups) -> None:
    """Shard the routed experts of ``layers`` to this rank and tell them how they run (module docstring)."""
    for layer in layers:
        for module in expert_modules(layer):
            if getattr(module, EXPERT_ATTR, None) is not None:
                continue  # a layer two chunks of the rank share is installed once
            setattr(module, EXPERT_ATTR, ExpertShard(
                num_experts=module.num_experts, ep=groups.ep, etp=groups.etp,
                token_split=groups.token_split, sequence_split=groups.sequence_split,
            ))
            if groups.mesh is not None:
                _shard_weights(module, groups)


def _shard_weights(module: RoutedExperts, groups: ExpertGroups) -> None:
    """``w1`` (E, h, f) and ``w2`` (E, f, h) as DTensors over the ("ep", "etp") mesh: the rank's
    E / ep experts, of each its f / etp ffn columns (every rank holds the same seeded weights, so
    each takes its part locally)."""
    from torch.distributed.tensor import DTensor, Shard

    ep, etp = groups.ep, groups.etp
    for name, ffn_dim in (("w1", 2), ("w2", 1)):
        whole = getattr(module, name)
        part = whole.detach().chunk(ep.degree, dim=0)[ep.index].chunk(etp.degree, dim=ffn_dim)[etp.index]
        dt = DTensor.from_local(part.contiguous(), groups.mesh, (Shard(0), Shard(ffn_dim)), run_check=False,
                                shape=whole.shape, stride=whole.stride())
        setattr(module, name, nn.Parameter(dt, requires_grad=whole.requires_grad))


def expert_parameters(modules: Sequence[nn.Module]) -> list[nn.Parameter]:
    """The routed experts' parameters of the rank's stage modules, each once, in order."""
    seen: dict[int, nn.Parameter] = {}
    for module in modules:
        for experts in expert_modules(module):
            for param in experts.parameters():
                seen.setdefault(id(param), param)
    return list(seen.values())


class ExpertSync:
    """The experts' gradient synchronisation over their edp group (module docstring): bucketed
    all-reduce hooks for the parameters left whole (divided by ``divisor`` = D c first), the
    gradients only divided when edp = 1; the ZeRO shards are ``ShardedState`` s the rank's
    ``GradientSync`` runs with the others (:meth:`shard`)."""

    def __init__(self, params: list[nn.Parameter], group: dist.ProcessGroup | None, divisor: int, *,
                 bucket_bytes: int, overlap: bool) -> None:
        self.params = params
        self.divisor = divisor
        self.hooks = DataParallelHooks(params, group, divisor, bucket_bytes, overlap=overlap) if group and params else None

    @staticmethod
    def shard(params: list[nn.Parameter], group: dist.ProcessGroup | None, zero: ZeroStage, divisor: int) -> ShardedState | None:
        """The experts' ZeRO 1/2 shard over the edp ``group`` (None: nothing to shard over)."""
        if zero is ZeroStage.NONE or group is None or not params or dist.get_world_size(group) < 2:
            return None
        return ShardedState(params, group, zero=int(zero), grad_divisor=divisor)

    def start_iteration(self, num_microbatches: int) -> None:
        if self.hooks is not None:
            self.hooks.start_iteration(num_microbatches)

    def finish_iteration(self) -> None:
        """After the schedule: the all-reduces finished, or (edp = 1) the gradients divided."""
        if self.hooks is not None:
            self.hooks.finish_iteration()
            return
        for param in self.params:
            if param.grad is not None:
                local(param.grad).div_(self.divisor)
