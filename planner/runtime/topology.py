"""Where a rank sits in the plan's Layout, and its process groups.

Every coordinate comes from ``plan.layout`` (:class:`planner.artifacts.layout.Layout`, the one
owner of the rank formula): :meth:`Layout.coordinates` gives a rank's (pipeline rank, replica,
cp index, tp index) -- (stage, copy, 0, 0) in a layout replicated per stage --,
:meth:`Layout.stage_indices` the stages (chunks) it runs, p, p + P, ... (interleaved 1F1B; one
otherwise), and :meth:`Layout.rank_of` / :meth:`Layout.grad_group` its peers. The groups are
lines of the ("pp", "dp", "cp", "tp") mesh of shape :attr:`Layout.mesh_shape` (:data:`MESH_DIMS`;
``planner.runtime.context`` runs c > 1):

- pipeline: one rank per pipeline rank, of one replica at one tp index (the ``PipelineStage``
  group). None when replicated per stage: that executor sends on the default group, each
  micro-batch to the copy that runs it (``planner.runtime.exchange``);
- data parallel: the ranks holding the same shard of a stage (:meth:`Layout.grad_group`: its D
  replicas x c cp ranks, or its copies when replicated per stage), when there are two or more;
- context (c > 1): the "cp" line of a rank, the ranks splitting its replica's sequences
  (:meth:`Layout.cp_group`; ``planner.runtime.context``);
- tied: per tied parameter group held by >= 2 pipeline ranks, the data-parallel groups of
  those pipeline ranks at this rank's tp index (tied parameters stay whole, identical over tp
  indices; see ``planner.runtime.grads``);
- tensor (t > 1): the ("pp", "dp", "cp", "tp") ``DeviceMesh`` (:func:`build_mesh`), whose "pp"
  group is the pipeline group above ("dp" the data-parallel one when c = 1, "cp" the context
  one) and whose "tp" dimension is the tensor-parallel group.

``torch.distributed.new_group`` is collective over the default group, so every rank creates
every group in the same order and keeps the ones it belongs to. The groups are made with the
run's timeout (``init_device_mesh`` would give them c10d's default of 30 minutes).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from planner.artifacts.layout import MESH_DIMS, Layout

__all__ = ["Groups", "RankPosition", "build_groups", "build_mesh", "mesh_ranks"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RankPosition:
    """One rank's coordinates in a layout (:meth:`Layout.coordinates`) and the stages it runs."""

    rank: int
    pipeline_rank: int = 0
    replica: int = 0  # the replicated pipeline, or the copy of its stage when replicated per stage
    cp_index: int = 0
    tp_index: int = 0
    stage_indices: tuple[int, ...] = ()
    data_replica: int = 0  # whose share of the global batch it trains on (0 when replicated per stage)

    @classmethod
    def of(cls, layout: Layout, rank: int) -> RankPosition:
        pipeline_rank, replica, cp_index, tp_index = layout.coordinates(rank)
        return cls(
            rank=rank,
            pipeline_rank=pipeline_rank,
            replica=replica,
            cp_index=cp_index,
            tp_index=tp_index,
            stage_indices=layout.stage_indices(pipeline_rank),
            # a stage's copies share one pipeline's batch, micro-batch by micro-batch
            data_replica=0 if layout.replicated_per_stage else replica,
        )


@dataclass(frozen=True, slots=True)
class Groups:
    pipeline: dist.ProcessGroup | None  # None when replicated per stage (point-to-point on the default group)
    data_parallel: dist.ProcessGroup | None
    tied: tuple[dist.ProcessGroup | None, ...]
    tensor: DeviceMesh | None = None  # the 1-D "tp" mesh when tp_degree > 1
    context: dist.ProcessGroup | None = None  # the "cp" group (keys and values gathered over it) when cp_degree > 1


def mesh_ranks(layout: Layout) -> torch.Tensor:
    """The ranks of a uniform layout as a tensor of shape ``layout.mesh_shape``: entry
    (p, r, c, k) is ``layout.rank_of`` of pipeline rank p (its first stage), replica r, cp index
    c, tp index k."""
    pipeline_size, dp_degree, cp_degree, tp_degree = layout.mesh_shape
    return torch.tensor(
        [
            [
                [
                    [layout.rank_of(stage_idx=layout.stage_indices(p)[0], replica=r, cp_index=c, tp_index=k)
                     for k in range(tp_degree)]
                    for c in range(cp_degree)
                ]
                for r in range(dp_degree)
            ]
            for p in range(pipeline_size)
        ],
        dtype=torch.int64,
    )


def _new_group(ranks: tuple[int, ...], timeout_s: float) -> dist.ProcessGroup | None:
    return dist.new_group(list(ranks), timeout=timedelta(seconds=timeout_s))


def _own_group(rank_sets: list[tuple[int, ...]], rank: int, timeout_s: float) -> dist.ProcessGroup | None:
    """Create a group for every rank set (collectively, in order); return the one holding ``rank``."""
    mine = None
    for ranks in rank_sets:
        group = _new_group(ranks, timeout_s)
        mine = group if rank in ranks else mine
    return mine


def _lines(mesh: torch.Tensor, dim: int) -> list[tuple[int, ...]]:
    """Every line of ``mesh`` along dimension ``dim`` (the groups of that mesh dimension)."""
    return [tuple(line) for line in mesh.movedim(dim, -1).reshape(-1, mesh.size(dim)).tolist()]


def build_mesh(layout: Layout, rank: int, device: torch.device, timeout_s: float) -> DeviceMesh:
    """The ("pp", "dp", "cp", "tp") device mesh of a uniform layout (collective): the groups along
    each dimension, then ``DeviceMesh.from_group`` over :func:`mesh_ranks`."""
    mesh = mesh_ranks(layout)
    mine = []
    for dim, name in enumerate(MESH_DIMS):
        group = _own_group(_lines(mesh, dim), rank, timeout_s)
        if group is None:
            raise ValueError(f"rank {rank} is on no {name!r} line of the mesh {mesh.tolist()}")
        mine.append(group)
    return DeviceMesh.from_group(mine, device.type, mesh=mesh, mesh_dim_names=MESH_DIMS)


def build_groups(
    layout: Layout,
    rank: int,
    tied_holders: tuple[tuple[int, ...], ...],
    timeout_s: float,
    device: torch.device,
) -> Groups:
    """Create all groups (collectively) and return this rank's; ``tied_holders`` lists, per
    tied parameter group, the pipeline ranks that hold it (only those with >= 2 need a group)."""
    if layout.replicated_per_stage:
        copies = [layout.grad_group(s) for s in range(layout.num_stages)]
        data_parallel = _own_group([c for c in copies if len(c) >= 2], rank, timeout_s)
        return Groups(pipeline=None, data_parallel=data_parallel, tied=_tied_groups(layout, rank, tied_holders, timeout_s))
    mesh = mesh_ranks(layout)
    device_mesh = build_mesh(layout, rank, device, timeout_s) if layout.tp_degree > 1 else None
    if device_mesh is not None:
        pipeline = device_mesh.get_group("pp")
    else:
        pipeline = _own_group(_lines(mesh, 0), rank, timeout_s)
    data_parallel = None
    if layout.cp_degree > 1:  # a stage's gradients are synchronised over its dp x cp ranks
        data_parallel = _own_group(_grad_lines(mesh), rank, timeout_s)
    elif layout.dp_degree > 1:
        data_parallel = device_mesh.get_group("dp") if device_mesh is not None else _own_group(_lines(mesh, 1), rank, timeout_s)
    context = None
    if layout.cp_degree > 1:
        context = device_mesh.get_group("cp") if device_mesh is not None else _own_group(_lines(mesh, 2), rank, timeout_s)
    return Groups(
        pipeline=pipeline,
        data_parallel=data_parallel,
        tied=_tied_groups(layout, rank, tied_holders, timeout_s),
        tensor=device_mesh["tp"] if device_mesh is not None else None,
        context=context,
    )


def _grad_lines(mesh: torch.Tensor) -> list[tuple[int, ...]]:
    """The gradient groups of a (P, D, c, t) mesh: per pipeline rank and tp index, its D x c
    ranks in rank order (:meth:`Layout.grad_group`)."""
    pipeline_size, dp_degree, cp_degree, tp_degree = mesh.shape
    return _lines(mesh.reshape(pipeline_size, dp_degree * cp_degree, tp_degree), 1)


def _tied_groups(
    layout: Layout, rank: int, tied_holders: tuple[tuple[int, ...], ...], timeout_s: float
) -> tuple[dist.ProcessGroup | None, ...]:
    """Per tied parameter group held by >= 2 pipeline ranks: the data-parallel groups of those
    pipeline ranks (of the first stage each runs) at each tp index; this rank's or None."""
    tied: list[dist.ProcessGroup | None] = []
    for holders in tied_holders:
        if len(holders) < 2:
            tied.append(None)
            continue
        firsts = [layout.stage_indices(p)[0] for p in holders]
        rank_sets = [tuple(r for s in firsts for r in layout.grad_group(s, tp_index=k)) for k in range(layout.tp_degree)]
        tied.append(_own_group(rank_sets, rank, timeout_s))
    return tuple(tied)
