"""A stage's memory at its peak under its schedule's held micro-batches
(:func:`planner.schedule.held_counts`): the larger of its :attr:`~planner.schedule.Held.states`
(a zero-bubble stage that recomputes can peak where more micro-batches are past their I, each
keeping W's inputs, than at the peak of the count), and whether a chain solution's stages all
fit so (:func:`fits_every_state`, which :func:`planner.solve.optimum.solve_config` checks;
whether any partition might, checked before solving, is a question of the stage table:
:meth:`StageFits.could_fit_every_state <planner.solve.prices.fits.StageFits.could_fit_every_state>`)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from planner.artifacts.caches import register_function
from planner.artifacts.layout import Sharding
from planner.artifacts.plan import StageMemory
from planner.cost import CostModel
from planner.schedule import Held
from planner.solve.chain import ChainSolution


@lru_cache(maxsize=4096)
def peak_states(states: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """Of a stage's :attr:`Held.states <planner.schedule.Held.states>` (the walk's points no other
    exceeds in both counts: ``whole`` descending, ``pending`` ascending), those on or above the
    chord of their neighbours (the frontier's upper concave chain, its two ends always among
    them): a stage's bytes at ``(whole, pending)`` are ``whole x a + pending x k`` plus what does
    not depend on them, with ``k >= 0`` (what a micro-batch past I keeps), so at every sizes the
    heaviest state is one of these, and a point below a chord is strictly lighter than one of
    its ends. A ZBV chunk's seven states (27, 0), (26, 1), (14, 2) ... (10, 6) leave three."""
    chain: list[tuple[int, int]] = []
    for c in states:
        # (b - a) x (c - a) < 0: b strictly below the chord a c (integers: exact)
        while len(chain) >= 2 and ((chain[-1][0] - chain[-2][0]) * (c[1] - chain[-2][1])
                                   - (chain[-1][1] - chain[-2][1]) * (c[0] - chain[-2][0])) < 0:
            chain.pop()
        chain.append(c)
    return tuple(chain)


register_function("solve.held.peak_states", peak_states, key="a stage's held states")


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
        if len(peak_states(held[s].states)) == 1 or not (solution.recompute[s] or solution.selective_of(s)):
            continue  # without recomputation W keeps at most what a micro-batch saved: the count's peak
        need = held_memory(cm, a, e, solution.recompute[s], microbatch_size, held[s], sharding_of[s],
                           solution.selective_of(s)).total_bytes
        if need > caps[s] * (1 + 1e-9):
            return False
    return True
