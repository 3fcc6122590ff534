"""Rank placement and process groups.

Placement (the Plan's convention): rank = p x dp_degree + replica, where pipeline rank p of
P runs stages p, p + P, ..., p + (v - 1) P (``v = virtual_stages_per_rank``; v = 1 but for
interleaved 1F1B, so then p is the stage, as torch's looped placement). The pipeline of
replica r is ranks (r, D + r, 2D + r, ...); the data-parallel group of pipeline rank p is
ranks (pD, ..., pD + D - 1). A tied parameter group spans every rank of every pipeline rank
that holds one of its layers (all replicas), see ``planner.runtime.grads``.

With tensor parallelism (``tp_degree`` = t > 1) each of those positions is t consecutive
ranks: rank = (p x D + replica) x t + tp index. The pipeline, data-parallel and tied groups
above exist once per tp index, and the groups come from the ("pp", "dp", "tp") device mesh
(``planner.runtime.tensor.build_mesh``), whose "tp" dimension is the tensor-parallel group.

``torch.distributed.new_group`` is collective over the default group, so every rank creates
every group in the same order and keeps the ones it belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    num_stages: int
    dp_degree: int
    rank: int
    virtual_stages_per_rank: int = 1
    tp_degree: int = 1

    @property
    def pipeline_size(self) -> int:
        """P: pipeline ranks per replica."""
        return self.num_stages // self.virtual_stages_per_rank

    @property
    def world_size(self) -> int:
        return self.pipeline_size * self.dp_degree * self.tp_degree

    @property
    def pipeline_rank(self) -> int:
        return self.rank // (self.dp_degree * self.tp_degree)

    @property
    def stage_indices(self) -> tuple[int, ...]:
        """The stages this rank runs, in order: p, p + P, ..."""
        return tuple(range(self.pipeline_rank, self.num_stages, self.pipeline_size))

    @property
    def replica(self) -> int:
        return (self.rank // self.tp_degree) % self.dp_degree

    @property
    def tp_index(self) -> int:
        return self.rank % self.tp_degree

    def rank_of(self, pipeline_rank: int, replica: int, tp_index: int = 0) -> int:
        return (pipeline_rank * self.dp_degree + replica) * self.tp_degree + tp_index

    def pipeline_rank_of(self, stage_idx: int) -> int:
        return stage_idx % self.pipeline_size

    def pipeline_ranks(self, replica: int, tp_index: int = 0) -> tuple[int, ...]:
        return tuple(self.rank_of(p, replica, tp_index) for p in range(self.pipeline_size))

    def stage_ranks(self, stage_idx: int, tp_index: int = 0) -> tuple[int, ...]:
        p = self.pipeline_rank_of(stage_idx)
        return tuple(self.rank_of(p, r, tp_index) for r in range(self.dp_degree))


@dataclass(frozen=True, slots=True)
class Groups:
    pipeline: dist.ProcessGroup
    data_parallel: dist.ProcessGroup | None
    tied: tuple[dist.ProcessGroup | None, ...]
    tensor: Any = None  # the 1-D "tp" DeviceMesh when tp_degree > 1


def _new_group(ranks: tuple[int, ...], timeout_s: float) -> dist.ProcessGroup | None:
    return dist.new_group(list(ranks), timeout=timedelta(seconds=timeout_s))


def build_groups(
    place: Placement, tied_rank_sets: tuple[tuple[int, ...], ...], timeout_s: float, mesh: Any = None
) -> Groups:
    """Create all groups (collectively) and return this rank's; ``tied_rank_sets`` lists,
    per tied parameter group, the pipeline ranks that hold it (only those with >= 2 need a group).
    With tensor parallelism ``mesh`` is the ("pp", "dp", "tp") device mesh, whose groups are used."""
    if mesh is not None:
        return Groups(
            pipeline=mesh.get_group("pp"),
            data_parallel=mesh.get_group("dp") if place.dp_degree > 1 else None,
            tied=_tied_groups(place, tied_rank_sets, timeout_s),
            tensor=mesh["tp"],
        )
    pipeline = None
    for replica in range(place.dp_degree):
        ranks = place.pipeline_ranks(replica)
        group = _new_group(ranks, timeout_s)
        if place.rank in ranks:
            pipeline = group
    data_parallel = None
    if place.dp_degree > 1:
        for p in range(place.pipeline_size):
            ranks = place.stage_ranks(p)
            group = _new_group(ranks, timeout_s)
            if place.rank in ranks:
                data_parallel = group
    assert pipeline is not None
    return Groups(pipeline=pipeline, data_parallel=data_parallel, tied=_tied_groups(place, tied_rank_sets, timeout_s))


def _tied_groups(
    place: Placement, tied_rank_sets: tuple[tuple[int, ...], ...], timeout_s: float
) -> tuple[dist.ProcessGroup | None, ...]:
    """Per tied parameter group held by >= 2 pipeline ranks: every replica of those pipeline
    ranks at this rank's tp index (tied parameters stay whole, identical over tp indices)."""
    tied: list[dist.ProcessGroup | None] = []
    for holders in tied_rank_sets:
        if len(holders) < 2:
            tied.append(None)
            continue
        mine = None
        for k in range(place.tp_degree):
            ranks = tuple(r for p in holders for r in place.stage_ranks(p, k))
            group = _new_group(ranks, timeout_s)
            mine = group if place.rank in ranks else mine
        tied.append(mine)
    return tuple(tied)
