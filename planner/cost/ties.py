"""Tied tensors inside one pipeline rank: a plan whose layout puts every layer of a tie on one
rank, in several of its chunks (ZBV's V puts the first and the last chunk on rank 0, so a tied
embedding and head), holds one copy there and sums its gradient in place."""

from __future__ import annotations

from collections.abc import Sequence

from planner.artifacts.layout import Layout
from planner.cost.model import CostModel

__all__ = ["on_ranks"]


def on_ranks(cm: CostModel, layout: Layout, boundaries: Sequence[int]) -> CostModel:
    """``cm`` for the partition ``boundaries`` (stage starts) of ``layout``: the tied tensors
    whose layers all sit on one pipeline rank, in several of its chunks, marked
    :attr:`~planner.cost.prefix.PrefixSums.rank_local_ties` (one copy, held by the chunk of the
    tie's first layer, and no exchange of its gradients); ``cm`` itself when there are none. The
    stage tables price each chunk alone (such a tie as two copies and an exchange: an
    over-estimate); a plan's stages are priced by this (:func:`planner.solve.build.build_plan`)."""
    if not cm.profile.tied or layout.stage_replicas or layout.virtual_stages_per_rank == 1:
        return cm
    stops = list(boundaries[1:]) + [cm.num_layers]
    stage_of = [s for s, (a, z) in enumerate(zip(boundaries, stops)) for _ in range(a, z)]
    local = frozenset(tie.name for tie in cm.profile.tied
                      if len({layout.pipeline_rank(stage_of[i]) for i in tie.layers}) == 1
                      and len({stage_of[i] for i in tie.layers}) > 1)
    if not local:
        return cm
    out = CostModel(cm.profile, cm.cluster, cm.optimizer, group=cm.group, stack=cm.stack,
                    gather_bytes_per_sample=cm.gather_bytes_per_sample, offload_optimizer=cm.offload_optimizer)
    out.rank_local_ties = local
    return out
