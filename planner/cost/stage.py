"""A stage's priced terms: one record from the cost model to the simulator.

:func:`price_stage` prices stage ``stage_idx`` of a layout (its layers, micro-batch size and
recomputation) into a :class:`StageTerms`; the solver's re-scoring replays a candidate's records
in the simulator's fast entry (:func:`planner.simulation.simulate_iteration_ms`), and a Plan's
stages are built from the same records (:func:`planner.solve.build.build_plan`), so a stage is
priced by one function whichever path it takes. What each term means is in
:mod:`planner.cost.model` (times) and :mod:`planner.cost.overlap` (what the stack overlaps).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from planner.artifacts.caches import OwnedCache
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ZeroStage
from planner.artifacts.layout import Layout
from planner.cost.model import CostModel

__all__ = ["StageTerms", "price_stage", "price_stages"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTerms:
    """What the simulator replays of one stage, in ms: per micro-batch its forward, its backward
    (``bwd_ms``: without recomputation; with a split backward, ``wgrad_ms`` of it is the
    weight-gradient pass W, else ``wgrad_ms`` is 0), the recomputation its backward re-runs
    first, and its transfers to the next stage (``send_fwd_ms``) and to the previous one
    (``send_bwd_ms``); per iteration its gradient synchronisation (``allreduce_ms``: reduction,
    ZeRO's all-gather and the tied exchange), how early that may start before its last backward
    ends (``sync_early_ms``), the part of it run ahead of the next forward (``gather_ahead_ms``)
    with the earliest end of the stage's first forward after that gather starts
    (``gather_bound_ms``), and one device's optimizer step (``optimizer_ms``)."""

    fwd_ms: float
    bwd_ms: float
    recompute_ms: float = 0.0
    wgrad_ms: float = 0.0
    send_fwd_ms: float = 0.0
    send_bwd_ms: float = 0.0
    allreduce_ms: float = 0.0
    sync_early_ms: float = 0.0
    gather_ahead_ms: float = 0.0
    gather_bound_ms: float = 0.0
    optimizer_ms: float = 0.0

    def __post_init__(self) -> None:
        for name in _NAMES:
            value = getattr(self, name)
            if not value >= 0.0:  # also rejects NaN
                raise PlannerInputError(f"stage terms: {name} must be >= 0 (got {value})")


_NAMES = tuple(f.name for f in fields(StageTerms))


#: per cost model, its priced stages by (layers, micro-batch size, stage, layout, recomputation,
#: split backward): a search re-scores partitions that share stages
_PRICED: OwnedCache[CostModel, tuple[object, ...], StageTerms] = OwnedCache(
    "cost.stage.priced", key="cost model -> (start, stop, micro-batch size, stage, layout, recompute, selective, split)",
    bound=8192)


def price_stage(
    cm: CostModel, start: int, stop: int, microbatch_size: int, stage_idx: int, layout: Layout, *,
    recompute: Sequence[int] = (), selective: Sequence[int] = (), split_backward: bool = False,
) -> StageTerms:
    """Stage ``stage_idx`` of ``layout``, layers ``[start, stop)``, priced by ``cm`` at
    ``microbatch_size`` with ``recompute`` (fully) and ``selective`` (selectively recomputed
    layers); ``split_backward``: the schedule runs W apart (its ``wgrad_ms``)."""
    key = (start, stop, microbatch_size, stage_idx, layout, tuple(recompute), tuple(selective), split_backward)
    found = _PRICED.get(cm, key)
    if found is None:
        found = _PRICED.put(cm, key, _price_stage(cm, start, stop, microbatch_size, stage_idx, layout,
                                                  key[5], key[6], split_backward))
    return found


def _price_stage(
    cm: CostModel, start: int, stop: int, microbatch_size: int, stage_idx: int, layout: Layout,
    recompute: Sequence[int], selective: Sequence[int], split_backward: bool,
) -> StageTerms:
    """:func:`price_stage`, uncached."""
    fwd, bwd = cm.stage_times_ms(start, stop, microbatch_size, stage_idx, layout)
    bwd += _zero2_exposed_ms(cm, start, stop, stage_idx, layout, fwd, bwd)
    sync = cm.stage_sync(start, stop, stage_idx, layout, recompute, microbatch_size, selective)
    return StageTerms(
        fwd_ms=fwd,
        bwd_ms=bwd,
        recompute_ms=cm.recompute_ms(recompute, microbatch_size, selective, layout, stage_idx),
        wgrad_ms=cm.stage_wgrad_ms(start, stop, microbatch_size) if split_backward else 0.0,
        send_fwd_ms=cm.boundary_transfer_ms(stop, microbatch_size, stage_idx, layout),
        send_bwd_ms=cm.boundary_transfer_ms(start, microbatch_size, stage_idx - 1, layout),
        allreduce_ms=sync.total_ms,
        sync_early_ms=sync.early_ms,
        gather_ahead_ms=sync.gather_ahead_ms,
        gather_bound_ms=sync.gather_bound_ms,
        optimizer_ms=cm.optimizer_step_ms(start, stop, layout.sharding(stage_idx), bwd),
    )


def _zero2_exposed_ms(cm: CostModel, start: int, stop: int, stage_idx: int, layout: Layout, fwd_ms: float,
                      bwd_ms: float) -> float:
    """What ZeRO 2's reduce-scatter of one micro-batch's gradients adds to the stage's backward
    (:mod:`planner.cost.sharding`): all of it, or with the stack's overlap what the micro-batch's
    own ``fwd_ms + bwd_ms`` cannot hide; 0 off ZeRO 2."""
    sharding = layout.sharding(stage_idx)
    if sharding.zero is not ZeroStage.GRADIENTS or sharding.ranks <= 1:
        return 0.0
    r = cm.microbatch_reduce_ms(start, stop, stage_idx, layout)
    return max(0.0, r - fwd_ms - bwd_ms) if cm.stack.zero_reduce_overlap else r


def price_stages(
    cm: CostModel, layout: Layout, microbatch_size: int, boundaries: Sequence[int],
    recompute: Sequence[Sequence[int]], selective: Sequence[Sequence[int]] = (), *, split_backward: bool = False,
) -> tuple[StageTerms, ...]:
    """Every stage of a partition (``boundaries``: the stage starts; ``recompute`` /
    ``selective``: each stage's layers, ``selective`` ``()`` where none anywhere) priced by
    :func:`price_stage`."""
    stops = list(boundaries[1:]) + [cm.num_layers]
    return tuple(
        price_stage(cm, start, stop, microbatch_size, s, layout, recompute=recompute[s],
                    selective=selective[s] if selective else (), split_backward=split_backward)
        for s, (start, stop) in enumerate(zip(boundaries, stops))
    )
