"""What is known of a configuration before it is solved: its lower bounds on time (the average
work, the fill of its pipeline, the memory floor as time, its busiest rank's floor) and on memory
(its state's share, its stages' fewest bytes), its stage tables, and the ZeRO variants it is
solved at. :class:`ConfigFacts` works them out for one cost model, request and cap, each once
per configuration (or per shape they depend on); the configuration search
(:mod:`planner.solve.config_search`) and its objective's policy (:mod:`planner.solve.objectives`)
ask it, and nothing else, about a configuration."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np

from planner.artifacts.kinds import ScheduleKind, ZeroStage
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.cost.fsdp import is_fsdp
from planner.solve.chain_dp import least_largest
from planner.solve.fills import busiest_rank_floor_ms, chunk_fill_bound_ms, rank_fills_ms, split_fill_bound_ms
from planner.solve.prices import RecentEntries, StageTable
from planner.solve.rank_memory import (
    Curve,
    Inverse,
    held_whole,
    inverse_points,
    layer_params,
    lean_saved_rows,
    merged_inverse,
    rank_holds,
    stages_hold_work,
    works_reach_ms,
)
from planner.solve.space import Config, config_lower_bound_ms, fsdp_searched, hsdp_shard_size

#: schedules whose iteration is at least a full micro-batch plus M - 1 of the busiest stage's
FILL_BOUND = (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B)


#: schedules :meth:`ConfigFacts.memory_floor_ms` bounds (their held micro-batches: held_whole)
MEMORY_FLOOR = FILL_BOUND + (ScheduleKind.INTERLEAVED_1F1B, ScheduleKind.ZB_H1, ScheduleKind.ZB_H2, ScheduleKind.ZBV,
                              ScheduleKind.DUALPIPE_V)


def fsdp_share_ms(cm: CostModel, c: Config) -> float:
    """The busiest rank of a ZeRO 3 configuration ``c`` runs M x at least its share of the
    pipeline's ``max(work, communication)`` per micro-batch with prefetching, their sum without
    (:func:`config_lower_bound_ms`' argument; a whole-group ZeRO 3 configuration also stands for
    its HSDP variant: the cheaper line)."""
    g = 0 if c.layout.shard_group_size else hsdp_shard_size(c.layout, cm.cluster.devices_per_node)
    work, comm = cm.at_batch(c.microbatch_size).work_ms, cm.least_fsdp_comm_ms(c.microbatch_size, c.layout, c.sharding(), g)
    return c.num_microbatches * (max(work, comm) if cm.stack.fsdp_prefetch else work + comm) / c.pipeline_size


def recompute_curve(fwd: np.ndarray, gain: np.ndarray, core_ms: np.ndarray, core_bytes: np.ndarray) -> Curve:
    """Breakpoints ``(x, R(x))`` of the least ms per micro-batch in which recomputation frees
    ``x`` bytes per micro-batch, each layer at most once and in any fraction: a layer frees
    ``gain`` at its forward's ``fwd`` ms (full), or ``core_bytes`` at ``core_ms`` (selective),
    or nothing; its lower convex hull of those three points, every layer's segments taken
    cheapest first (a convex piecewise-linear ``R`` from ``(0, 0)``; past the last point, where
    nothing frees more, :func:`recompute_ms` goes on at the last slope)."""
    segments: list[tuple[float, float]] = []  # (ms per byte, bytes)
    layers = zip(fwd.tolist(), np.maximum(gain, 0.0).tolist(), core_ms.tolist(), core_bytes.tolist())
    for (f, g, t, c), count in Counter(layers).items():  # equal layers: one hull, its segments that many times
        hull = [(0.0, 0.0)]
        for x, y in sorted(p for p in ((c, t), (g, f)) if p[0] > 0):
            while len(hull) > 1 and _turn(hull[-2], hull[-1], (x, y)) <= 0:
                hull.pop()  # the point before lies on or above the chord: not on the lower hull
            if x > hull[-1][0]:
                hull.append((x, y))
            elif y < hull[-1][1]:
                hull[-1] = (x, y)
        segments += [((y1 - y0) / (x1 - x0), x1 - x0) for (x0, y0), (x1, y1) in itertools.pairwise(hull)] * count
    segments.sort()
    # segments of one slope as one (equal layers': collinear points dropped, the same function)
    merged = [(r, sum(n for _, n in group)) for r, group in itertools.groupby(segments, key=lambda seg: seg[0])]
    xs = np.concatenate([[0.0], np.cumsum([n for _, n in merged])])
    ys = np.concatenate([[0.0], np.cumsum([r * n for r, n in merged])])
    return xs, ys


def _turn(a: tuple[float, float], b: tuple[float, float], c: tuple[float, float]) -> float:
    """Positive when ``a -> b -> c`` turns left (``b`` below the chord ``a c``)."""
    return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])


def recompute_ms(curve: Curve, freed: np.ndarray | float) -> np.ndarray:
    """``R(freed)`` of :func:`recompute_curve`, past its last point at its last slope (a floor:
    nothing frees that much)."""
    xs, ys = curve
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
    x = np.asarray(freed, dtype=float)
    out: np.ndarray = np.where(x <= xs[-1], np.interp(x, xs, ys), ys[-1] + slope * (x - xs[-1]))
    return out


class ConfigFacts:
    """Everything the search asks about a configuration before and beside solving it, for one
    cost model ``cm`` (the searched one: over groups of layers on a long profile), ``request``
    and per-device ``cap_bytes``; ``fsdp``: the ZeRO 3 variants are solved too
    (:meth:`variants`). Each figure is worked out once (per configuration, or per shape it
    depends on); the stage tables are shared by every configuration with the same micro-batch
    size, chunks per rank and sharding."""

    def __init__(self, cm: CostModel, request: PlanRequest, cap_bytes: float, fsdp: bool = True) -> None:
        self.cm, self.request, self.cap_bytes, self.fsdp = cm, request, cap_bytes, fsdp
        self.floors: dict[Config, float] = {}  # per configuration, its memory floor (memory_floor_bytes)
        self.least: dict[tuple[int, int], np.ndarray | None] = {}  # StageTable.least_bytes per (table, count)
        self.per_size: dict[tuple[int, float], tuple[float, float, Curve, list[float], list[float], list[float]]] = {}
        # breakpoints (t, w) of a rank's g^-1 per (micro-batch size, state bytes per parameter, k_min)
        self.inverses: dict[tuple[object, ...], Inverse] = {}
        self.unique_params = float(cm.stage_param_count(0, cm.num_layers))
        self.chunk_fills: dict[tuple[int, int, int], float] = {}  # chunk_fill_bound_ms per (b, P, M)
        self.split_fills: dict[tuple[int, int, int, int], float] = {}  # split_fill_bound_ms per (b, P, M, v)
        self.rank_floors: dict[tuple[int, int], float] = {}  # busiest_rank_floor_ms per (micro-batch size, P)
        self.busiest_floors: dict[Config, float] = {}  # memory_floor_ms per configuration (before its slack)
        self.tables: dict[tuple[object, ...], StageTable] = {}
        self.most: dict[tuple[object, ...], tuple[float, int]] = {}  # stages_hold_work's per (key, counts, cap)
        self.leans: dict[int, tuple[list[float], list[float], np.ndarray, np.ndarray]] = {}  # lean_saved_rows per b
        self.states: dict[tuple[int, float], np.ndarray] = {}  # per layer its state bytes, per (b, kappa)
        self.recent = RecentEntries()  # the tables' entries per in-flight count and cap, the recent ones kept

    def bound(self, c: Config, fill: bool) -> float:
        """:func:`config_lower_bound_ms`; with ``fill`` also the fill of a one-chunk GPipe /
        1F1B pipeline: a micro-batch crosses every stage, the other M - 1 wait behind the
        busiest, ``work + (M - 1) work / P`` at best."""
        cm = self.cm
        lb = config_lower_bound_ms(cm, c)
        if fill and c.schedule in FILL_BOUND and c.layout.virtual_stages_per_rank == 1:
            work = cm.at_batch(c.microbatch_size).work_ms
            lb = max(lb, work + (c.num_microbatches - 1) * work / c.pipeline_size)
        elif fill and c.schedule is ScheduleKind.INTERLEAVED_1F1B and not c.layout.stage_replicas:
            # the same for every chunk count (and ZeRO stage): worked out once per (b, P, M)
            key = (c.microbatch_size, c.pipeline_size, c.num_microbatches)
            if key not in self.chunk_fills:
                self.chunk_fills[key] = chunk_fill_bound_ms(cm, c)
            lb = max(lb, self.chunk_fills[key])
        return lb

    def split_fill_ms(self, c: Config) -> float:
        """:func:`split_fill_bound_ms` of a zero-bubble configuration (0 for any other), worked out
        only for those the order reaches (as :meth:`memory_bound`), once per shape."""
        if not c.schedule.splits_backward or c.layout.stage_replicas:
            return 0.0
        key = (c.microbatch_size, c.pipeline_size, c.num_microbatches, c.layout.virtual_stages_per_rank)
        found = self.split_fills.get(key)
        if found is None:
            found = self.split_fills[key] = split_fill_bound_ms(self.cm, c)
        return found

    def rank_floor_ms(self, c: Config, slack: float) -> float:
        """No proposal of ``c`` passes :meth:`keep`'s check when this exceeds what it must beat:
        its busiest rank runs its layers M times, whichever whole layers it holds
        (:func:`busiest_rank_floor_ms`), over groups of layers divided by the check's ``slack``.
        0 for copies (the check counts one stage each; the caller asks only where the check
        counts a rank's chunks)."""
        if c.layout.stage_replicas:
            return 0.0
        key = (c.microbatch_size, c.pipeline_size)
        if key not in self.rank_floors:
            fwd, bwd = self.cm.at_batch(c.microbatch_size).times_ms
            self.rank_floors[key] = busiest_rank_floor_ms(fwd + bwd, c.pipeline_size)
        return c.num_microbatches * self.rank_floors[key] / slack


    def memory_bound(self, c: Config) -> float:
        """The memory floor as time (GPipe, 1F1B, interleaved 1F1B; 0 for profiles with shared
        saved storages, not bounded here). Devices short of memory recompute: a layer
        recomputed (a fraction ``z`` of it, fully or selectively) still holds ``a - z g >= 0``
        of its saved bytes ``a`` per micro-batch in flight (``g``: what that level frees), at
        ``z f`` ms per micro-batch. Counting every layer's held bytes for ``k_min`` micro-batches,
        no more than any stage of the devices holds, they still fit ``cap`` only if the
        recomputation frees at least ``(H - cap) / k_min`` bytes per micro-batch (``H``: their
        bytes counted so, without any), which takes at least ``R`` of it: the least time any
        layers' recomputation freeing that much per micro-batch takes (:func:`recompute_curve`,
        each layer once, fractions allowed; its first slope is the cheapest ms per byte of any
        layer, the one figure this took before: GPT-3's head frees bytes at 28 ms / GB, its blocks
        at 50, so past the head's 0.1 GB the old floor counted half). (Counted at ``k_min``, freeing is priced at
        ``k_min`` too: pricing it at the largest count, as before, divided this floor by up to
        ``k_max / k_min``, 16 on an interleaved rank.) Two relaxations, the larger counts:

        - summed over the ranks: every rank fits ``cap``, so all recomputation together frees
          at least what the stages would hold without any (the model state once, sharded as
          the leanest variant solved, plus every layer's saved bytes for the fewest
          micro-batches any stage holds) less ``P x cap``, over that fewest count; the busiest
          rank does at least 1 / P of the pipeline's ``M x (work + recomputation)``;
        - rank by rank: a rank given work ``w`` holding at least ``k_min`` micro-batches in every
          stage holds at least ``H(w)`` bytes, the least any share of the layers with that work
          holds (layer ``i``: ``kappa p_i + k_min a_i`` bytes for its work ``w_i``, state and
          saved activations; fractions of layers allowed, so the lightest bytes per ms are
          taken first: a convex piecewise-linear ``H``, :func:`~planner.solve.rank_memory.least_bytes`). It takes ``g_r(w) =
          w + R(max(0, H(w) - cap) / k_min)`` per micro-batch (convex, increasing), ``M g_r(w)`` between its first
          operation and its last, and waits ``a_r`` besides, the first ``r`` layers' forward and
          backward (:func:`chunk_fill_bound_ms`'s argument: the chunks before its first hold at
          least a layer each; one stage per rank alike), so ``T >= a_r + M g_r(w_r)``. The
          ranks' works sum to the profile's, so ``T`` is at least the ``T`` at which the works
          ``g_r^-1((T - a_r) / M)`` sum to it: both the fill and the memory floor of each rank
          count (the deep ranks, whose last chunks hold few micro-batches and so bound little
          memory, are the ones that wait). (Taking each layer's share at the least bytes per ms
          of any layer instead, one atypical layer, a GPT's embedding with its few saved bytes
          per ms, made the floor vanish.)"""
        cm, b, lay = self.cm, c.microbatch_size, c.layout
        if (cm.profile.shared_saved or lay.stage_replicas
                or c.schedule not in FILL_BOUND + (ScheduleKind.INTERLEAVED_1F1B,)):
            return 0.0
        kappa = cm.least_state_bytes_per_param(self.leanest(c).sharding())  # experts' state may shard wider
        key = (b, kappa)
        work, saved_total, curve, _, _, _ = self.layer_arrays(key)
        if curve[1][-1] <= 0:
            return 0.0  # recomputation frees nothing, or costs nothing: not bounded here
        ks = c.inflight()
        P, M, cap = lay.pipeline_size, c.num_microbatches, self.cap_bytes
        out = 0.0
        floor = kappa * self.unique_params + cm.gathered_bytes(b, lay.num_stages) + min(ks) * saved_total
        if floor > P * cap:
            out = M * (work + float(recompute_ms(curve, (floor - P * cap) / min(ks)))) / P
        return max(out, self.ranks_bound(c, key))

    def layer_arrays(self, key: tuple[int, float]) -> tuple[float, float, Curve, list[float], list[float], list[float]]:
        """Per (micro-batch size, state bytes per parameter): the profile's work and saved bytes,
        the recomputation curve, and the busy layers' work, state and saved bytes (equal layers
        summed in one row)."""
        found = self.per_size.get(key)
        if found is None:
            cm, (b, kappa) = self.cm, key
            fwd, bwd = cm.at_batch(b).times_ms
            saved = cm.at_batch(b).saved_bytes
            gain_full = saved - cm.input_per_sample * b
            cores = (cm.at_batch(b).core_ms, cm.at_batch(b).core_bytes) if cm.selective else (np.zeros_like(fwd), np.zeros_like(fwd))
            curve = recompute_curve(fwd, gain_full, *cores)
            layer_work = fwd + bwd
            busy = layer_work > 0
            params = cm.param_count.astype(float)
            for tie in cm.profile.tied:  # a stage holding several of a tie's layers counts it once
                params[list(tie.layers)] -= tie.param_count
            params = np.maximum(params, 0.0)
            # equal layers as one row of their summed work and bytes (taken in fractions, any share
            # of their work holds the same bytes): a GPT's 96 blocks, one row
            rows = Counter(zip(layer_work[busy].tolist(), params[busy].tolist(), saved[busy].tolist()))
            found = self.per_size[key] = (float(layer_work.sum()), float(saved.sum()), curve,
                                          [w * n for (w, _, _), n in rows.items()],
                                          [kappa * p * n for (_, p, _), n in rows.items()],
                                          [a * n for (_, _, a), n in rows.items()])
        return found

    def ranks_bound(self, c: Config, key: tuple[int, float], fills: np.ndarray | None = None) -> float:
        """:meth:`memory_bound`'s rank-by-rank relaxation: rank r waits a_r (``fills``; by default
        the first r layers' forward and backward, see :func:`chunk_fill_bound_ms`) besides
        M g_r(w_r); each distinct count's (:func:`rank_holds`) breakpoints (t, w) of its g^-1, a
        piecewise-linear increasing function (w <= the profile's work); the T at which the
        ranks' works reach the profile's (:func:`works_reach_ms`)."""
        work, _, _, _, _, _ = self.layer_arrays(key)
        fills = rank_fills_ms(self.cm, c) if fills is None else fills  # P of them: a stage holds a layer
        ranks: dict[tuple[int, ...], list[float]] = {}
        for r, holds in enumerate(rank_holds(c)):
            ranks.setdefault(holds, []).append(float(fills[r]))
        inverses = [(*self.rank_inverse(key, holds), np.array(waits)) for holds, waits in ranks.items()]
        return works_reach_ms(inverses, c.num_microbatches, work)

    def rank_inverse(self, key: tuple[int, float], holds: tuple[int, ...]) -> Inverse:
        """A rank's g^-1 (:func:`rank_holds`): one count, :meth:`inverse` within the cap; one per
        chunk, each chunk's within its share of the cap, merged (:func:`merged_inverse`)."""
        if len(holds) == 1:
            return self.inverse(key, holds[0])
        found = self.inverses.get((key, holds))
        if found is None:
            found = self.inverses[(key, holds)] = merged_inverse(
                [self.inverse(key, k, self.cap_bytes / len(holds)) for k in holds])
        return found

    def inverse(self, key: tuple[int, float], kmin: int, cap: float | None = None) -> Inverse:
        """Breakpoints (t, w) of a rank's g^-1 holding at least ``kmin`` micro-batches in every
        stage within ``cap`` (the device's by default) (:meth:`memory_bound`; per ``key``,
        ``kmin`` and ``cap``; :func:`inverse_points`)."""
        cap = self.cap_bytes if cap is None else cap
        found = self.inverses.get((key, kmin, cap))
        if found is None:
            _, _, curve, layer_work, state, saved = self.layer_arrays(key)
            found = self.inverses[(key, kmin, cap)] = inverse_points(layer_work, state, saved, kmin, cap, curve)
        return found

    def memory_floor_ms(self, c: Config, slack: float) -> float:
        """No proposal of ``c`` (any variant, partition or recomputation) passes
        :meth:`ConfigSearch.keep <planner.solve.config_search.ConfigSearch.keep>`'s check when this
        exceeds what it must beat: the busiest rank runs M x its chunks' work and recomputation,
        at least the T at which the ranks' works reach the profile's with no waits
        (:meth:`ranks_bound` with ``a_r = 0``), each rank's chunks holding the micro-batches
        :func:`held_whole` counts (the zero-bubble schedules' too; ZBV's two chunks each within
        half the cap, as their tables price them); over groups of layers divided by the check's
        ``slack``. Like :meth:`rank_floor_ms` it only skips, never reorders: a configuration it
        skips would have given no candidate, so the search's candidates, and the Pareto points
        solved from the best of them, are the same. Each variant at its own state: ``c``'s
        sharding (ZeRO 0 holds more), and where ZeRO 3 is solved too the less of that and
        ZeRO 3's, no lower than its collectives' share (:func:`fsdp_share_ms`). (At ZeRO 3's
        state alone, as :meth:`memory_bound` counts, GPT-3 175B's ZBV on 1,024 A100s counted a
        twentieth of the state its ZeRO 1 stages hold.) 0 where :meth:`memory_bound` does not
        bound (shared saved storages, per-stage copies) and for schedules not in
        :data:`MEMORY_FLOOR`."""
        found = self.busiest_floors.get(c)
        if found is None:
            found = 0.0
            if not (self.cm.profile.shared_saved or c.layout.stage_replicas or c.schedule not in MEMORY_FLOOR):
                found = self.busiest_floor_ms(c, c)
                lean = self.leanest(c)
                if lean != c:
                    fsdp = fsdp_share_ms(self.cm, lean)
                    found = found if found <= fsdp else min(found, max(fsdp, self.busiest_floor_ms(c, lean)))
            self.busiest_floors[c] = found
        return found / slack

    def busiest_floor_ms(self, c: Config, sharded: Config) -> float:
        """:meth:`memory_floor_ms` of ``c``'s variants sharded as ``sharded`` or less deeply."""
        key = (c.microbatch_size, self.cm.least_state_bytes_per_param(sharded.sharding()))
        _, _, curve, _, _, _ = self.layer_arrays(key)
        if curve[1][-1] <= 0 or min(held_whole(c)) < 1:
            return 0.0  # recomputation frees nothing, or costs nothing: not bounded here
        if not self.ranks_hold_the_work(c, key):
            return math.inf  # no partition fits, at any recomputation: no proposal at all
        return self.ranks_bound(c, key, np.zeros(c.layout.pipeline_size))

    def ranks_hold_the_work(self, c: Config, key: tuple[int, float]) -> bool:
        """:func:`~planner.solve.rank_memory.stages_hold_work` of ``c`` at ``key`` (each stage's most
        work and layers worked out once per count and cap)."""
        work, _, _, layer_work, state, _ = self.layer_arrays(key)
        if key[0] not in self.leans:
            self.leans[key[0]] = lean_saved_rows(self.cm, key[0])
        lean, keep, lean_l, keep_l = self.leans[key[0]]
        if key not in self.states:
            self.states[key] = key[1] * layer_params(self.cm)
        return stages_hold_work(c, (layer_work, state, lean, keep), (self.states[key], lean_l, keep_l), self.cap_bytes,
                                work, self.most)

    def memory_floor_once(self, c: Config) -> float:
        """:meth:`memory_floor_bytes` with the state's share (:meth:`state_floor_bytes`), kept
        per configuration once worked out (None before: see :meth:`known_floor_bytes`)."""
        floor = self.floors.get(c)
        if floor is None:
            floor = self.floors[c] = max(self.state_floor_bytes(c), self.memory_floor_bytes(c))
        return floor

    def known_floor_bytes(self, c: Config) -> float | None:
        """The memory floor of ``c`` if :meth:`memory_floor_once` has worked it out."""
        return self.floors.get(c)

    def fsdp_variants(self, c: Config) -> list[Config]:
        """ZeRO 3's variants of ``c``: HSDP inside a node (where it differs from plain ZeRO 3,
        :meth:`Config.with_hsdp`), then ZeRO 3 over the whole group (solved only where HSDP does
        not fit: :class:`planner.solve.config_search.ConfigSearch`)."""
        hsdp = c.with_hsdp(self.cm.cluster.devices_per_node)
        return ([hsdp] if hsdp is not None else []) + [c.with_zero(ZeroStage.PARAMETERS)]

    def leanest(self, c: Config) -> Config:
        """``c`` at the deepest sharding any of its variants is solved at (:meth:`variants`)."""
        return c.with_zero(ZeroStage.PARAMETERS) if (self.fsdp and fsdp_searched(self.request, c.layout)) else c

    def state_floor_bytes(self, c: Config) -> float:
        """No plan of ``c`` (any variant, partition, recomputation or cap) peaks below this on its
        busiest device: the ranks hold the model state at least once between them, sharded as
        the leanest variant (0 for per-stage replication, not bounded here)."""
        lay = c.layout
        if lay.stage_replicas:
            return 0.0
        kappa = self.cm.least_state_bytes_per_param(self.leanest(c).sharding())
        return kappa * self.unique_params / lay.pipeline_size * (1 - 1e-9)

    def memory_floor_bytes(self, c: Config) -> float:
        """No plan of ``c`` peaks below this on its busiest device: the least over the partitions
        of the largest stage's fewest bytes with its in-flight count, at its leanest recomputation
        (:meth:`StageTable.least_bytes`; a rank's chunks hold at least their largest), the less of
        ``c``'s own sharding and its ZeRO 3 variant's where that is solved too (ZeRO 3 gathers each
        layer's weights whole: PipeDream's alexnet, its fully connected layers, peaks higher under
        it); 0 where those are not worked out."""
        lay, L = c.layout, self.cm.num_layers
        ks = c.whole()  # a zero-bubble stage's micro-batches past I only add
        if lay.stage_replicas or len(ks) > L:
            return 0.0
        variants = dict.fromkeys([c, self.leanest(c)])
        out = math.inf
        for v in variants:
            table = self.table_of(v)
            needs = []
            for k in ks:
                key = (id(table), k)
                if key not in self.least:
                    self.least[key] = table.least_bytes(k)
                found = self.least[key]
                if found is None:
                    return 0.0
                needs.append(found)
            out = min(out, least_largest(needs, L))
        return max(out, 0.0) * (1 - 1e-9)

    def table_of(self, c: Config) -> StageTable:
        cm, tables = self.cm, self.tables
        v = c.layout.virtual_stages_per_rank
        line = cm.fsdp_line(c.layout) if is_fsdp(c.sharding()) else (0.0, 0.0)
        key = (c.microbatch_size, v, c.sharding(), line)
        if key not in tables:
            # a rank holding v chunks gives each cap / v (the sum of their peaks fits)
            tables[key] = StageTable(
                cm, c.microbatch_size, self.cap_bytes / v, self.request.fixed_boundaries,
                allow_recompute=self.request.recompute, sharding=c.sharding(), fsdp_line=line, recent=self.recent,
            )
        return tables[key]

    def variants(self, c: Config) -> list[Config]:
        """``c`` at its searched ZeRO stage (none where memory binds nowhere, or both where the cluster
        prices the optimizer step, which sharding shortens) and, where memory
        binds and the request allows it, at ZeRO 3 too (its collectives cost time: it is a
        configuration of its own, not a free deepening). The ZeRO 3 variant is solved only if
        ``c`` does not fit at its own stage: where ZeRO 1/2 fits (with recomputation), ZeRO 3 could
        only trade recomputation for gathers, and solving it there too took the solver 1.7 to 2.6x
        its time on GPT-3 175B over 1,024 GPUs, no plan changed (RESULTS 13); a request for
        ZeRO 3 alone (``--zero 3``) solves it everywhere."""
        request, cm = self.request, self.cm
        if c.layout.zero is ZeroStage.PARAMETERS and not c.layout.shard_group_size and fsdp_searched(request, c.layout):
            return self.fsdp_variants(c)  # ZeRO 3 asked alone: HSDP first, the whole group where it does not fit
        fsdp_too = self.fsdp and fsdp_searched(request, c.layout) and c.layout.zero is not ZeroStage.PARAMETERS
        if (c.layout.zero or fsdp_too) and ZeroStage.NONE in request.zero_stages:
            plain = c.with_zero(ZeroStage.NONE)
            if self.table_of(plain).fits_everywhere(max(c.inflight())):
                # memory binds nowhere: sharding can only shorten the optimizer step (where priced)
                return [plain, c] if c.layout.zero and cm.cluster.memory_bandwidth_gb_per_s else [plain]
        if fsdp_too and not self.table_of(c).fits_everywhere(max(c.inflight())):
            return [c, *self.fsdp_variants(c)]
        return [c]

