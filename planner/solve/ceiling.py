"""The search's working set, bounded before it is allocated (issue 52 item 5).

What grows: the DP's stage tables are ``(G + 1) x (G + 1)`` float64 matrices over the stages
``[i, j)`` of a chain of ``G`` cut points (:mod:`planner.solve.prices`): a table's fixed part
(compute, static and synchronised bytes), its micro-batch size's part (validity, activation
bytes, recompute gains), its entries per in-flight count and cap (bases, tables, fit masks, cap
views). How many such matrices the search holds at its peak grows with the devices: every
(micro-batch size, chunks per rank, ZeRO stage, data-parallel degree under ZeRO 3) of every
tensor- x context-parallel degree may ask for a table of its own.

The estimate, before any table is built (:func:`working_set_bytes`)::

    bytes(G) = 8 (G + 1)^2 x (MATRICES_PER_KEY x K + MATRICES_FIXED)

with ``K`` the table keys the request's configurations can ask for, counted from the
configuration list alone (:func:`planner.solve.space.table_keys`: no cost model, no matrix). ``MATRICES_PER_KEY`` is
a fit, not a derivation: pruning solves only some configurations, so the matrices held are a
fraction of the keys. Fit on two runs (a 2,000-block Llama-3-8B shape, the search phase's resident
peak sampled from ``/proc/self/statm`` over groups of about 4 layers, before this module): 64
H100s, 2.2 GB above the process's start over 513^2-entry matrices, ~1,050 matrices for 2,512
keys (0.42 a key); 1,024 H100s, ~2,370 for 6,192 (0.38); rounded up to 0.5. Out of sample (the
10,000-block profiles, and every run's peak against its estimate): ``benchmarks/deep_profiles.py``,
``benchmarks/RESULTS.md`` "Deep profiles".

Decision: the ceiling is :attr:`SearchSettings.working_set_bytes`. The chain the search would
use (every layer, or :mod:`planner.solve.coarsen`'s groups, as many as twice the deepest
pipeline) is kept when its estimate fits. Beyond it the chain is coarsened to the longest that
fits (:func:`bound_chain`): layers are merged into blocks (cut where the fewest bytes cross,
:func:`planner.graph.coarse_starts`), stages start only at block starts, pipelines deeper than
the blocks are not searched, and the refinement around the chosen boundaries runs only where
its finer chain fits the same bound. The plan says so in its provenance (``search_notes``) and
``planner plan`` on stderr, in one line. Where even the least chain the request needs (two
blocks, or ``--stages``, or its fixed boundaries) does not fit, the request is refused (exit 3)
in one line saying what to coarsen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.artifacts.errors import InfeasibleError
from planner.artifacts.request import PlanRequest
from planner.solve.settings import SearchSettings
from planner.solve.space import table_keys

__all__ = ["MATRICES_FIXED", "MATRICES_PER_KEY", "ChainBound", "block_starts", "bound_chain", "table_keys",
           "working_set_bytes"]

#: bytes of one entry of a stage matrix (float64)
ENTRY_BYTES = 8
#: matrices held per table key the configurations can ask for (a fit: module docstring)
MATRICES_PER_KEY = 0.5
#: matrices held whatever the configurations: the cost models' prefix matrices, the cap views and
#: entries the search keeps (:class:`planner.solve.prices.RecentEntries`, 32), the refinement's table
MATRICES_FIXED = 64


def block_starts(num_layers: int, max_chain: int, forced: tuple[int, ...] = ()) -> list[int]:
    """At most ``max_chain`` group starts, cuts only every ``k`` layers: the first layer alone
    (an embedding, in a transformer profile), then blocks of ``k`` consecutive layers, the
    smallest ``k`` for which the groups (and the ``forced`` starts, a request's fixed boundaries)
    number at most ``max_chain``. Blocks of equally many layers of one kind are one kind of
    group: their stages share their recompute prices (:class:`planner.solve.prices.layers.LayerKinds`),
    where cuts placed by work and bytes (:func:`planner.graph.coarse_starts`) make groups of
    unequal lengths, each a problem of its own (2,000 Llama blocks as 449 such groups: 5.7 GB
    to explain a refusal; as blocks of 5, module docstring's benchmark)."""
    fixed = sorted(set(forced) - {0, 1})
    if num_layers <= max_chain:
        return list(range(num_layers))
    if max_chain < 2 + len(fixed):
        raise ValueError(f"max_chain {max_chain}: at least 2 groups and one per fixed boundary ({len(fixed)})")
    k = 1
    while True:
        starts = sorted({0, *range(1, num_layers, k), *fixed})
        if len(starts) <= max_chain:
            return starts
        k = max(k + 1, -(-(num_layers - 1) // max(1, max_chain - 1 - len(fixed))))


def working_set_bytes(chain_length: int, keys: int) -> float:
    """The estimated peak bytes of the stage tables of a search over ``chain_length`` cut points
    whose configurations can ask for ``keys`` tables (module docstring)."""
    side = chain_length + 1
    return float(ENTRY_BYTES * side * side * (MATRICES_PER_KEY * keys + MATRICES_FIXED))


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainBound:
    """The longest chain the search may use under the ceiling, for every degree of one request."""

    num_layers: int  # the profile's
    keys: int  # table keys counted (table_keys)
    ceiling_bytes: float  # SearchSettings.working_set_bytes
    max_chain: int  # the longest chain whose estimate fits (num_layers when every layer fits): a longer one is coarsened

    def __post_init__(self) -> None:
        if not 1 <= self.max_chain <= self.num_layers:
            raise ValueError(f"max_chain {self.max_chain}: expected 1..{self.num_layers}")

    def note(self, wanted: int) -> str:
        """The one line a coarsened search says (stderr, the plan's provenance)."""
        starts = block_starts(self.num_layers, self.max_chain)
        k = starts[2] - starts[1] if len(starts) > 2 else self.num_layers - 1
        return (f"working-set ceiling: searched {self.num_layers:,} layers as {len(starts):,} blocks (the first "
                f"layer, then every {k}; stages start at block starts, pipelines of at most {len(starts):,} "
                f"stages): a chain of {wanted:,} would need about "
                f"{_size(working_set_bytes(wanted, self.keys))} of stage tables "
                f"({self.keys:,} table keys), over the {_size(self.ceiling_bytes)} ceiling")


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**28 else f"{nbytes / 2**20:.2f} MiB"


def bound_chain(num_layers: int, num_groups: tuple[int, ...], request: PlanRequest,
                settings: SearchSettings) -> ChainBound:
    """The :class:`ChainBound` of a request over ``num_layers`` layers and degrees of
    ``num_groups`` groups each; refused (:class:`InfeasibleError`, exit 3, one line naming what
    to coarsen) where even the least chain the request needs does not fit the ceiling."""
    keys = table_keys(num_layers, num_groups, request, settings)
    ceiling = float(settings.working_set_bytes)
    per_side = ENTRY_BYTES * (MATRICES_PER_KEY * keys + MATRICES_FIXED)
    longest = max(0, math.isqrt(int(ceiling // per_side)) - 1)
    while longest > 0 and working_set_bytes(longest, keys) > ceiling:  # isqrt's rounding
        longest -= 1
    least = max(2, request.num_stages, len(set(request.fixed_boundaries) - {0, 1}) + 2)
    if longest < min(least, num_layers):
        raise InfeasibleError(
            f"the search's stage tables exceed the working-set ceiling: even {least} blocks of the {num_layers:,} "
            f"layers need about {_size(working_set_bytes(least, keys))} ({keys:,} table keys) over "
            f"{_size(ceiling)}; coarsen the request: fewer --microbatch-sizes, --tp/--cp/--zero "
            f"degrees or --devices, or a profile of fewer, larger layers")
    return ChainBound(num_layers=num_layers, keys=keys, ceiling_bytes=ceiling, max_chain=min(num_layers, longest))
