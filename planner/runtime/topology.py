"""Rank placement and process groups.

Placement (the Plan's convention): rank = p x dp_degree + replica, where pipeline rank p of
P runs stages p, p + P, ..., p + (v - 1) P (``v = virtual_stages_per_rank``; v = 1 but for
interleaved 1F1B, so then p is the stage, as torch's looped placement). The pipeline of
replica r is ranks (r, D + r, 2D + r, ...); the data-parallel group of pipeline rank p is
ranks (pD, ..., pD + D - 1). A tied parameter group spans every rank of every pipeline rank
that holds one of its layers (all replicas), see ``planner.runtime.grads``.

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
    virtual_stages_per_rank: int = 1

    @property
    def pipeline_size(self) -> int:
        """P: pipeline ranks per replica."""
        return self.num_stages // self.virtual_stages_per_rank

    @property
    def world_size(self) -> int:
        return self.pipeline_size * self.dp_degree

    @property
    def pipeline_rank(self) -> int:
        return self.rank // self.dp_degree

    @property
    def stage_indices(self) -> tuple[int, ...]:
        """The stages this rank runs, in order: p, p + P, ..."""
        return tuple(range(self.pipeline_rank, self.num_stages, self.pipeline_size))

    @property
    def replica(self) -> int:
        return self.rank % self.dp_degree

    def pipeline_rank_of(self, stage_idx: int) -> int:
        return stage_idx % self.pipeline_size

    def pipeline_ranks(self, replica: int) -> tuple[int, ...]:
        return tuple(p * self.dp_degree + replica for p in range(self.pipeline_size))

    def stage_ranks(self, stage_idx: int) -> tuple[int, ...]:
        p = self.pipeline_rank_of(stage_idx)
        return tuple(p * self.dp_degree + r for r in range(self.dp_degree))


@dataclass(frozen=True, slots=True)
class Groups:
    pipeline: dist.ProcessGroup
    data_parallel: dist.ProcessGroup | None
    tied: tuple[dist.ProcessGroup | None, ...]


def _new_group(ranks: tuple[int, ...], timeout_s: float) -> dist.ProcessGroup | None:
    return dist.new_group(list(ranks), timeout=timedelta(seconds=timeout_s))


def build_groups(place: Placement, tied_rank_sets: tuple[tuple[int, ...], ...], timeout_s: float) -> Groups:
    """Create all groups (collectively) and return this rank's; ``tied_rank_sets`` lists,
    per tied parameter group, the pipeline ranks that hold it (only those with >= 2 need a group)."""
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
    tied: list[dist.ProcessGroup | None] = []
    for holders in tied_rank_sets:
        if len(holders) < 2:
            tied.append(None)
            continue
        ranks = tuple(r for p in holders for r in place.stage_ranks(p))
        group = _new_group(ranks, timeout_s)
        tied.append(group if place.rank in ranks else None)
    assert pipeline is not None
    return Groups(pipeline=pipeline, data_parallel=data_parallel, tied=tuple(tied))
