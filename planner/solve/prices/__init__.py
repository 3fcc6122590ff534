"""Stage prices: what every stage ``[i, j)`` of a chain costs and whether it fits, as the tables
the chain DP (:mod:`planner.solve.chain_dp`) and the replicated DP (:mod:`planner.solve.replicated`)
read, apart from the recurrences that read them (Alpa's ``get_compute_cost`` beside its
``stage_construction`` DP; Mist's ``intra_tuning`` beside ``inter_tuning``).

One typed value is read: :class:`~planner.solve.prices.table.StageTable`, built for a
:class:`~planner.solve.chain.StageQuestion` (cost model, micro-batch size, memory cap,
sharding, fixed boundaries, recomputation allowed). Its modules, in import order:

- :mod:`.fixed`: what the cap does not change (every stage's compute, static and activation
  bytes, the layers' kinds), built from the cost model's vectorised per-stage sums and shared
  between tables;
- :mod:`.layers`: the chain's layers by kind, keying stages with the same recompute covers, and those
  covers' recompute prices for many stages at once (one call, :func:`~planner.solve.prices.layers.level_costs`);
- :mod:`.capview`: per cap, how many micro-batches each stage holds;
- :mod:`.fits`: which stages fit (:class:`~planner.solve.prices.fits.StageFits`), its entries per in-flight
  count and cap, and the bound on those a search keeps (:class:`~planner.solve.prices.fits.RecentEntries`);
- :mod:`.table`: stage times with the least recomputation, and the layers behind them;
- :mod:`.extras`: the objective's transfer, exposed-synchronisation and bubble-fill terms.

Its module-level caches are registered in :mod:`planner.artifacts.caches` (bounded; cleared by
:func:`planner.artifacts.caches.reset`). The oracles (brute force, CP-SAT) import nothing from
here: they price stages from the cost model directly, so that they check these tables.
"""

from planner.solve.prices.extras import exposure, stage_extras
from planner.solve.prices.fits import RecentEntries
from planner.solve.prices.table import StageTable

__all__ = ["RecentEntries", "StageTable", "exposure", "stage_extras"]
