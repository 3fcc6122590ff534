"""Rank placement and process groups.

Placement (the Plan's convention): rank = stage_idx x dp_degree + replica. The pipeline of
replica r is ranks (r, D + r, 2D + r, ...); the data-parallel group of stage s is ranks
(sD, ..., sD + D - 1). A tied parameter group spans every rank of every stage that holds one
of its layers (all replicas), see ``planner.runtime.grads``.

``torch.distributed.new_group`` is collective over the default group, so every rank creates
every group in the same order and keeps the ones it belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    num_stages: int
    dp_degree: int
    rank: int

    @property
    def world_size(self) -> int:
        return self.num_stages * self.dp_degree

    @property
    def stage_idx(self) -> int:
        return self.rank // self.dp_degree

    @property
    def replica(self) -> int:
        return self.rank % self.dp_degree

    def pipeline_ranks(self, replica: int) -> tuple[int, ...]:
        return tuple(s * self.dp_degree + replica for s in range(self.num_stages))

    def stage_ranks(self, stage_idx: int) -> tuple[int, ...]:
        return tuple(stage_idx * self.dp_degree + r for r in range(self.dp_degree))


@dataclass(frozen=True, slots=True)
class Groups:
    pipeline: dist.ProcessGroup
    data_parallel: dist.ProcessGroup | None
    tied: tuple[dist.ProcessGroup | None, ...]


def _new_group(ranks: tuple[int, ...], timeout_s: float) -> dist.ProcessGroup | None:
    return dist.new_group(list(ranks), timeout=timedelta(seconds=timeout_s))


def build_groups(place: Placement, tied_stage_sets: tuple[tuple[int, ...], ...], timeout_s: float) -> Groups:
    """Create all groups (collectively) and return this rank's; ``tied_stage_sets`` lists,
    per tied parameter group, the stages that hold it (only those with >= 2 stages need a group)."""
    pipeline = None
    for replica in range(place.dp_degree):
        ranks = place.pipeline_ranks(replica)
        group = _new_group(ranks, timeout_s)
        if place.rank in ranks:
            pipeline = group
    data_parallel = None
    if place.dp_degree > 1:
        for stage_idx in range(place.num_stages):
            ranks = place.stage_ranks(stage_idx)
            group = _new_group(ranks, timeout_s)
            if place.rank in ranks:
                data_parallel = group
    tied: list[dist.ProcessGroup | None] = []
    for stages in tied_stage_sets:
        if len(stages) < 2:
            tied.append(None)
            continue
        ranks = tuple(r for s in stages for r in place.stage_ranks(s))
        group = _new_group(ranks, timeout_s)
        tied.append(group if place.rank in ranks else None)
    assert pipeline is not None
    return Groups(pipeline=pipeline, data_parallel=data_parallel, tied=tuple(tied))
