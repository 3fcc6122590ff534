"""One chain DP per shape the DP can tell apart, for the schedules that share a layout.

ZBV and DualPipe-V (:mod:`planner.schedule.dualpipe`) are searched on the same V layout, micro-batch
size and count. What :func:`planner.solve.chain_dp.solve_chain` reads of the schedule is whether
it splits the backward (its bubble fill, its ``M - 1`` bound) and each stage's held counts
(``whole``, ``pending``): equal for the two (chunk ``s`` holds ``2P - s`` whole, none past I), so
their optimum is one. :func:`shared_chain` remembers the optimum per (stage table, layout, ``M``,
split, counts) for one search, so the second schedule's configuration reuses the first's instead of
solving the same DP again; each schedule's own states are still checked against it
(:func:`planner.solve.candidates.solve_config`) and its order still simulated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.layout import Layout
from planner.schedule import Held, held_counts

__all__ = ["shared_chain"]


def shared_chain(chain_solver: Callable[..., Any]) -> Callable[..., Any]:
    """``chain_solver`` (the chain DP's signature) remembering its results by what it reads
    (module docstring); each table is kept with its results, so a key's table is the one asked."""
    solved: dict[tuple[object, ...], tuple[object, Any]] = {}

    def solve(table: Any, *, layout: Layout, num_microbatches: int, schedule: ScheduleKind,
              held: Sequence[Held] = ()) -> Any:
        counts = tuple((h.whole, h.pending) for h in (held or held_counts(schedule, layout, num_microbatches)))
        key = (id(table), layout, num_microbatches, schedule.splits_backward, counts)
        found = solved.get(key)
        if found is None or found[0] is not table:
            found = solved[key] = (table, chain_solver(table, layout=layout, num_microbatches=num_microbatches,
                                                       schedule=schedule, held=held))
        return found[1]

    return solve
