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
from planner.solve.arrays import distinct
from planner.solve.chain_dp import least_largest
from planner.solve.fills import busiest_rank_floor_ms, chunk_fill_bound_ms, rank_fills_ms, split_fill_bound_ms
from planner.solve.prices import RecentEntries, StageTable
from planner.solve.space import Config, config_lower_bound_ms, fsdp_searched

#: schedules whose iteration is at least a full micro-batch plus M - 1 of the busiest stage's
FILL_BOUND = (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B)


#: breakpoints (bytes freed per micro-batch, ms) of recompute_curve
Curve = tuple[np.ndarray, np.ndarray]


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
    xs = np.concatenate([[0.0], np.cumsum([n for _, n in segments])])
    ys = np.concatenate([[0.0], np.cumsum([r * n for r, n in segments])])
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


def least_bytes(work: np.ndarray, nbytes: np.ndarray, cap: float) -> tuple[np.ndarray, np.ndarray]:
    """The least bytes any share of the layers with total work ``w`` holds, ``H(w)``, layer
    ``i`` holding ``nbytes[i]`` for its ``work[i] > 0`` and taken in any fraction (so the fewest
    bytes per ms first): breakpoints ``(w, H(w))`` of a convex piecewise-linear function from
    ``(0, 0)`` to the whole profile, with the point where ``H`` reaches ``cap`` among them."""
    order = np.argsort(nbytes / work, kind="stable")
    w = np.concatenate([[0.0], np.cumsum(work[order])])
    h = np.concatenate([[0.0], np.cumsum(nbytes[order])])
    k = int(np.searchsorted(h, cap))
    if 0 < k < len(h) and h[k] > cap > h[k - 1]:
        at = w[k - 1] + (w[k] - w[k - 1]) * (cap - h[k - 1]) / (h[k] - h[k - 1])
        w, h = np.insert(w, k, at), np.insert(h, k, cap)
    return w, h


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
        self.per_size: dict[tuple[int, float], tuple[float, float, Curve, np.ndarray, np.ndarray, np.ndarray]] = {}
        # breakpoints (t, w) of a rank's g^-1 per (micro-batch size, state bytes per parameter, k_min)
        self.inverses: dict[tuple[tuple[int, float], int], tuple[np.ndarray, np.ndarray]] = {}
        self.unique_params = float(cm.stage_param_count(0, cm.num_layers))
        self.chunk_fills: dict[tuple[int, int, int], float] = {}  # chunk_fill_bound_ms per (b, P, M)
        self.split_fills: dict[tuple[int, int, int, int], float] = {}  # split_fill_bound_ms per (b, P, M, v)
        self.rank_floors: dict[tuple[int, int], float] = {}  # busiest_rank_floor_ms per (micro-batch size, P)
        self.tables: dict[tuple[object, ...], StageTable] = {}
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
          taken first: a convex piecewise-linear ``H``, :func:`least_bytes`). It takes ``g_r(w) =
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

    def layer_arrays(self, key: tuple[int, float]) -> tuple[float, float, Curve, np.ndarray, np.ndarray, np.ndarray]:
        """Per (micro-batch size, state bytes per parameter): the profile's work and saved bytes,
        the recomputation curve, and the busy layers' work, state and saved bytes."""
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
            found = self.per_size[key] = (float(layer_work.sum()), float(saved.sum()), curve,
                                          layer_work[busy], kappa * params[busy], saved[busy])
        return found

    def ranks_bound(self, c: Config, key: tuple[int, float]) -> float:
        """:meth:`memory_bound`'s rank-by-rank relaxation: rank r waits a_r (the first r layers'
        forward and backward, see :func:`chunk_fill_bound_ms`) besides M g_r(w_r); each distinct
        k_min's breakpoints (t, w) of its g^-1, a piecewise-linear increasing function (w <= the
        profile's work); the T at which the ranks' works reach the profile's."""
        work, _, _, _, _, _ = self.layer_arrays(key)
        P, M = c.layout.pipeline_size, c.num_microbatches
        fills = rank_fills_ms(self.cm, c)  # P of them: a stage holds a layer
        ranks: dict[int, list[float]] = {}
        # rank r holds chunks r, r + P, ... (GPipe, 1F1B, interleaved: the loop placement)
        for r, kmin in enumerate(np.asarray(c.inflight()).reshape(-1, P).min(axis=0).tolist()):
            ranks.setdefault(kmin, []).append(float(fills[r]))
        inverses = [(*self.inverse(key, kmin), np.array(waits)) for kmin, waits in ranks.items()]
        # works(T) = sum over ranks of g_r^-1((T - a_r) / M): piecewise linear between the ranks'
        # breakpoints a_r + M t
        Ts = distinct(np.concatenate([(a[:, None] + M * g[None, :]).ravel() for g, _, a in inverses]))

        def works(at: np.ndarray) -> np.ndarray:  # works(T) at breakpoints Ts[at]
            T = Ts[at]
            total: np.ndarray = sum(np.interp((T[None, :] - a[:, None]) / M, g, w).sum(axis=0) for g, w, a in inverses)
            return total

        # the first breakpoint where the works reach the profile's: works(T) is increasing, so a
        # search over at most 32 probes a round (a call per group of ranks a round, not per probe)
        target, lo, hi = work * (1 - 1e-12), 0, len(Ts)
        while lo < hi:
            probes = distinct(np.linspace(lo, hi - 1, num=min(32, hi - lo)).astype(np.int64))
            reached = np.flatnonzero(works(probes) >= target)
            if not len(reached):
                lo = int(probes[-1]) + 1
            else:
                j = int(reached[0])
                lo, hi = (int(probes[j - 1]) + 1 if j else lo), int(probes[j])
        k = lo
        if k == 0:
            return float(Ts[0])
        if k >= len(Ts):  # unreachable: at the largest breakpoint some rank takes all the work
            return 0.0
        (w0, w1), T0, T1 = works(np.array([k - 1, k])), float(Ts[k - 1]), float(Ts[k])
        return T0 + (T1 - T0) * (float(work) - float(w0)) / (float(w1) - float(w0))

    def inverse(self, key: tuple[int, float], kmin: int) -> tuple[np.ndarray, np.ndarray]:
        """Breakpoints (t, w) of a rank's g^-1 holding at least ``kmin`` micro-batches in every
        stage (:meth:`memory_bound`; per ``key`` and ``kmin``)."""
        found = self.inverses.get((key, kmin))
        if found is None:
            _, _, curve, layer_work, state, saved = self.layer_arrays(key)
            cap = self.cap_bytes
            at_w, at_h = least_bytes(layer_work, state + kmin * saved, cap)
            # g at H's breakpoints and where (H - cap) / k_min reaches the curve's: linear between
            xs = cap + kmin * curve[0][1:]
            w = distinct(np.concatenate([at_w, np.interp(xs[(xs > cap) & (xs < at_h[-1])], at_h, at_w)]))
            h = np.interp(w, at_w, at_h)
            found = self.inverses[(key, kmin)] = (w + recompute_ms(curve, np.maximum(0.0, h - cap) / kmin), w)
        return found

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

