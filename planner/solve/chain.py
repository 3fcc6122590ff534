"""One configuration's chain problem as every chain solver sees it: what its stages are priced
under (:class:`StageQuestion`), the objective's micro-batch count, and the answer
(:class:`ChainSolution`).

Three chain solvers answer it: the DP (:func:`planner.solve.chain_dp.solve_chain`), which reads
its stage prices from a :class:`~planner.solve.prices.StageTable` built for the question; and
the two oracles, the brute force (:mod:`planner.solve.bruteforce`) and the CP-SAT model
(:mod:`planner.solve.ilp`), which read only the question and price every stage from the cost
model's own per-stage methods, so that "DP = brute force = CP-SAT" checks the tables as well as
the recurrence. Each takes a :class:`PricedStages` (a table, or a bare question for the oracles).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from planner.artifacts.layout import Layout, Sharding
from planner.cost import CostModel
from planner.cost.sharding import is_fsdp

__all__ = ["ChainSolution", "PricedStages", "StageQuestion", "objective_microbatches"]


@dataclass(frozen=True, slots=True)
class ChainSolution:
    """One configuration's partition: stage starts, per stage its recomputed layers (fully and
    selectively) and time ``T_s`` (ms per micro-batch), and the objective ``J`` it reaches
    (:mod:`planner.solve.chain_dp`)."""

    objective_ms: float
    boundaries: tuple[int, ...]  # stage starts, first is 0
    recompute: tuple[tuple[int, ...], ...]  # per stage, the fully recomputed layers
    stage_times_ms: tuple[float, ...]
    exact: bool
    selective: tuple[tuple[int, ...], ...]  # per stage, the selectively recomputed layers


@dataclass(frozen=True, slots=True, kw_only=True)
class StageQuestion:
    """What every stage of one configuration is priced under, less the layout, micro-batch count
    and schedule a chain solver is given beside it (a record: the table built for it refuses a
    micro-batch of no samples, :class:`~planner.solve.prices.fits.StageFits`, as a request does)."""

    cost_model: CostModel
    microbatch_size: int
    cap_bytes: float  # per device (a stage's memory must be at most this)
    sharding: Sharding = Sharding()  # how a stage's model state is divided (every stage alike)
    fsdp_line: tuple[float, float] = (0.0, 0.0)  # under ZeRO 3, the per-layer collectives' line (ms/byte, ms)
    fixed_boundaries: tuple[int, ...] = ()  # layers where a stage must start (one at or past the last layer: none)
    allow_recompute: bool = True

    @property
    def question(self) -> StageQuestion:
        """Itself (a question is a :class:`PricedStages` with no prices)."""
        return self

    @property
    def fsdp(self) -> bool:
        """ZeRO 3 over more than one rank (:func:`planner.cost.sharding.is_fsdp`)."""
        return is_fsdp(self.sharding)

    def stage_valid(self, start: int, stop: int) -> bool:
        """The layers ``[start, stop)`` may form a stage: at least one, no fixed boundary inside."""
        return stop > start and not any(start < f < stop for f in self.fixed_boundaries)


class PricedStages(Protocol):
    """What a chain solver is handed: a :class:`~planner.solve.prices.StageTable` (its prices and
    its question) or, for the oracles, a bare :class:`StageQuestion`."""

    @property
    def question(self) -> StageQuestion: ...


def objective_microbatches(layout: Layout, num_microbatches: int) -> int:
    """The ``M`` of J: the micro-batches, or with ``v > 1`` chunks per rank ``v (M - P) + P``
    (:func:`planner.solve.chain_dp.solve_chain`)."""
    v, ranks = layout.virtual_stages_per_rank, layout.pipeline_size
    return num_microbatches if v == 1 else max(1, v * (num_microbatches - ranks) + ranks)
