"""A stage's memory at its peak under its schedule's held micro-batches
(:func:`planner.schedule.held_counts`): the larger of its :attr:`~planner.schedule.Held.states`
(a zero-bubble stage that recomputes can peak where more micro-batches are past their I, each
keeping W's inputs, than at the peak of the count; of those, the ones that can be the heaviest:
:func:`~planner.solve.prices.fits.peak_states`), and whether a chain solution's stages all
fit so (:func:`fits_every_state`, which :func:`planner.solve.optimum.solve_config` checks;
whether any partition might, checked before solving, is a question of the stage table:
:meth:`StageFits.could_fit_every_state <planner.solve.prices.fits.StageFits.could_fit_every_state>`,
over the same peak states)."""

from __future__ import annotations

from collections.abc import Sequence

from planner.artifacts.layout import Sharding
from planner.artifacts.plan import StageMemory
from planner.cost import CostModel
from planner.schedule import Held
from planner.solve.chain import ChainSolution
from planner.solve.prices.fits import peak_states


def held_memory(
    cm: CostModel, start: int, stop: int, recompute: Sequence[int], microbatch_size: int, held: Held,
    sharding: Sharding, selective: Sequence[int] = (),
) -> StageMemory:
    """:meth:`CostModel.stage_memory` of the stage at the heaviest of ``held``'s states (one of
    :func:`peak_states`)."""
    found = [cm.stage_memory(start, stop, recompute, microbatch_size, w, sharding, selective, p)
             for w, p in peak_states(held.states)]
    return max(found, key=lambda m: m.total_bytes)


def fits_every_state(
    cm: CostModel, held: Sequence[Held], solution: ChainSolution, microbatch_size: int,
    sharding_of: Sequence[Sharding], caps: Sequence[float],
) -> bool:
    """Every stage of ``solution`` fits its cap (``caps``: per stage) at every one of its held
    states; the chain solvers price the peak of the count only (exact but where a stage
    recomputes so much that W keeps more than it saved)."""
    stops = list(solution.boundaries[1:]) + [cm.num_layers]
    for s, (a, e) in enumerate(zip(solution.boundaries, stops)):
        if len(peak_states(held[s].states)) == 1 or not (solution.recompute[s] or solution.selective[s]):
            continue  # without recomputation W keeps at most what a micro-batch saved: the count's peak
        need = held_memory(cm, a, e, solution.recompute[s], microbatch_size, held[s], sharding_of[s],
                           solution.selective[s]).total_bytes
        if need > caps[s] * (1 + 1e-9):
            return False
    return True
