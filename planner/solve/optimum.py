"""One configuration's optimum by its chain solver (:func:`solve_config`): a zero-bubble
configuration solved again at its conservative held counts where the first optimum does not fit
at every state it passes through, and one search's optima remembered by what the chain DP reads
(:func:`remembered`: ZBV and DualPipe-V share one). What is worked out of a solution once solved
(its simulated time, its memory, whether it fits) is :mod:`planner.solve.candidates`'."""

from __future__ import annotations

from collections.abc import Callable

from planner.schedule import Held, held_counts
from planner.solve.chain import ChainSolution
from planner.solve.held import fits_every_state
from planner.solve.prices import StageTable
from planner.solve.space import Config

#: a chain solver: (stage table, layout, micro-batches, schedule) -> the optimum of J, or None
ChainSolver = Callable[..., "ChainSolution | None"]
#: one search's optima of the chain DP by what it reads (:func:`remembered`), each with its table
Solved = dict[tuple[object, ...], tuple[StageTable, "ChainSolution | None"]]


def solve_config(chain_solver: ChainSolver, table: StageTable, c: Config,
                 solved: Solved | None = None) -> ChainSolution | None:
    """The chain solver's optimum of ``c`` (remembered in ``solved`` where given:
    :func:`remembered`). A zero-bubble stage is priced at the peak of its count of held
    micro-batches; where the optimum does not fit at another of its states
    (:func:`planner.solve.held.fits_every_state`: a stage recomputing so much that W keeps more
    than it saved), solved again with every stage's most micro-batches past I
    (:attr:`Held.conservative <planner.schedule.Held.conservative>`, above every state): where
    the first fits it is the optimum, else the second is a plan that fits. Where no partition
    might fit every state (:meth:`StageTable.could_fit_every_state
    <planner.solve.prices.fits.StageFits.could_fit_every_state>`), neither does, and
    neither is solved."""
    held = held_counts(c.schedule, c.layout, c.num_microbatches) if c.schedule.splits_backward else ()
    if any(len(h.states) > 1 for h in held) and not table.could_fit_every_state(held):
        return None
    sol = remembered(chain_solver, table, c, (), solved)
    if sol is None or not c.schedule.splits_backward:
        return sol
    caps = [table.cap_of(s) for s in range(len(held))]
    shardings = [c.layout.sharding(s) for s in range(len(held))]
    if fits_every_state(table.cm, held, sol, c.microbatch_size, shardings, caps):
        return sol
    return remembered(chain_solver, table, c, tuple(h.conservative for h in held), solved)


def remembered(chain_solver: ChainSolver, table: StageTable, c: Config, held: tuple[Held, ...],
               solved: Solved | None) -> ChainSolution | None:
    """``chain_solver``'s optimum of ``c`` (``held``: the counts priced, () for the schedule's
    own), remembered in ``solved`` (one search's; None: solved as asked) by what the chain DP
    (:func:`planner.solve.chain_dp.solve_chain`) reads of the schedule: whether it splits the
    backward (its bubble fill, its ``M - 1`` bound) and each stage's held counts. ZBV and
    DualPipe-V (:mod:`planner.schedule.dualpipe`) are searched on the same V layout, micro-batch
    size and count, and those are equal for the two (chunk ``s`` holds ``2P - s`` whole, none past
    I), so the second schedule's configuration reuses the first's optimum instead of solving the
    same DP again; each schedule's own states are still checked against it (:func:`solve_config`)
    and its order still simulated. Each table is kept with its optima, so a key's table is the
    one asked."""
    if solved is None:
        if held:
            return chain_solver(table, layout=c.layout, num_microbatches=c.num_microbatches, schedule=c.schedule,
                                held=held)
        return chain_solver(table, layout=c.layout, num_microbatches=c.num_microbatches, schedule=c.schedule)
    counts = tuple((h.whole, h.pending) for h in (held or held_counts(c.schedule, c.layout, c.num_microbatches)))
    key = (id(table), c.layout, c.num_microbatches, c.schedule.splits_backward, counts)
    found = solved.get(key)
    if found is None or found[0] is not table:
        found = solved[key] = (table, chain_solver(table, layout=c.layout, num_microbatches=c.num_microbatches,
                                                   schedule=c.schedule, held=held))
    return found[1]
