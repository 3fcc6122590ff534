"""What is known of a configuration before it is solved: its lower bounds on time (the average
work, the fill of its pipeline, the memory floor as time, its busiest rank's floor) and on memory
(its state's share, its stages' fewest bytes), its stage tables, and the ZeRO variants it is
solved at. The fill bounds and the busiest rank's floor of whole layers are each a bound over
every partition, recomputation and ZeRO variant of the configuration
(``tests/test_search_pruning.py`` checks each below every candidate's simulated time).
:class:`ConfigFacts` works them out for one cost model, request and cap, each once per
configuration (or per shape they depend on); the configuration search
(:mod:`planner.solve.config_search`) and its objective's policy (:mod:`planner.solve.objectives`)
ask it, and nothing else, about a configuration."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.artifacts.kinds import ScheduleKind, ZeroStage
from planner.artifacts.layout import Sharding
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.cost.sharding import is_fsdp
from planner.schedule import held_counts
from planner.solve.chain_dp import least_largest
from planner.solve.prices import RecentEntries, StageTable
from planner.solve.rank_memory import RankMemory
from planner.solve.space import Config, hsdp_shard_size

#: schedules whose iteration is at least a full micro-batch plus M - 1 of the busiest stage's
FILL_BOUND = (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B)


#: schedules :meth:`ConfigFacts.memory_floor_ms` bounds (their held micro-batches: rank_memory.held_whole)
MEMORY_FLOOR = FILL_BOUND + (ScheduleKind.INTERLEAVED_1F1B, ScheduleKind.ZB_H1, ScheduleKind.ZB_H2, ScheduleKind.ZBV,
                              ScheduleKind.DUALPIPE_V)


def config_lower_bound_ms(cm: CostModel, c: Config) -> float:
    """No plan of this configuration simulates faster: every replica does M micro-batches of
    at least the profile's forward + backward work, spread over P devices at best, and one
    micro-batch crosses all of it in sequence (planner.simulation.bounds' average-work bound).
    Where the schedule splits the backward (ZB-H1, ZB-H2, ZBV), a micro-batch's weight-gradient
    passes run beside the input-gradient passes of the stages before theirs, so what it crosses
    in sequence is its forwards and input-gradient passes only (its weight-gradient work is off
    that path: counting it overstated the bound, and the pruned search skipped a ZB-H1
    configuration that simulates 19% below it). Under ZeRO 3 a stage's micro-batch also waits
    for its collectives: :func:`fsdp_share_ms`."""
    at = cm.at_batch(c.microbatch_size)
    work = at.work_ms
    crossing = work - at.wgrad_ms if c.schedule.splits_backward else work
    if c.layout.zero is ZeroStage.PARAMETERS and is_fsdp(c.layout.sharding(0)):  # (its sharding made only where it can be)
        return max(fsdp_share_ms(cm, c), crossing)
    return max(c.num_microbatches * work / c.pipeline_size, crossing)


def fsdp_share_ms(cm: CostModel, c: Config) -> float:
    """The busiest rank of a ZeRO 3 configuration ``c`` runs M x at least its share of the
    pipeline's ``max(work, communication)`` per micro-batch with prefetching, their sum without
    (one stream; a whole-group ZeRO 3 configuration also stands for its HSDP variant,
    :attr:`ZeroVariants.hsdp <planner.solve.space.ZeroVariants.hsdp>`: the cheaper line)."""
    g = 0 if c.layout.shard_group_size else hsdp_shard_size(c.layout, cm.cluster.devices_per_node)
    work, comm = cm.at_batch(c.microbatch_size).work_ms, cm.least_fsdp_comm_ms(c.microbatch_size, c.layout, c.layout.sharding(0), g)
    return c.num_microbatches * (max(work, comm) if cm.stack.fsdp_prefetch else work + comm) / c.pipeline_size


def rank_fills_ms(cm: CostModel, c: Config) -> np.ndarray:
    """Per pipeline rank ``r``, ``a_r``: the first ``r`` layers' forward + backward, what rank
    ``r`` waits at least before its first operation and after its last (the chunks before its
    first hold a layer each)."""
    fp, bp = cm.at_batch(c.microbatch_size).prefix_ms
    P = min(c.layout.pipeline_size, len(fp))
    fills: np.ndarray = fp[:P] + bp[:P]
    return fills


def chunk_fill_bound_ms(cm: CostModel, c: Config) -> float:
    """No interleaved 1F1B plan of ``c`` simulates faster (whatever its partition). Pipeline rank
    ``r`` runs chunks ``r, r + P, ...``; its first operation is a forward, which waits for the
    forwards of chunks ``0 .. r - 1`` of that micro-batch, and after its last (a backward: every
    forward is followed by its backward on the same rank) the backwards of chunks ``r - 1 .. 0``
    of that micro-batch still run. Every chunk holds a layer, so those chunks hold at least the
    first ``r`` layers: ``T >= a_r + M W_r``, ``a_r`` the first ``r`` layers' forward + backward,
    ``W_r`` the rank's work per micro-batch. The ranks' works sum to at least the profile's
    ``W``, so the busiest of these bounds is at least the ``T`` at which ``sum_r max(0, T - a_r)
    = M W`` (recomputation, transfers and synchronisation only add). Against the average-work
    bound ``M W / P`` it adds about half the interleaved bubble when chunks are about a layer each
    (deep pipelines: e.g. +24% at P = 64, v = 2, M = 64)."""
    a = [float(x) for x in rank_fills_ms(cm, c)]  # ascending: layer work >= 0
    return shared_fill_ms(a, c.num_microbatches * cm.at_batch(c.microbatch_size).work_ms)


def split_fill_bound_ms(cm: CostModel, c: Config) -> float:
    """No zero-bubble plan of ``c`` simulates faster, whatever its partition. Rank ``r``'s first
    operation is a forward of its first chunk, chunk ``r``, behind the forwards of chunks
    ``0 .. r - 1`` of that micro-batch (after its last input-gradient pass a rank can still run
    weight-gradient passes, so nothing is owed at the end): ``T >= F_<r + M W_r``.

    One chunk per rank (ZB-H1, ZB-H2), ``F_<r`` is the forward of every layer before rank
    ``r``'s stage: with layers taken in fractions (a relaxation), given ``T`` each rank reaching
    furthest is best (its stop ``x + (T - F(x)) / M`` grows with its start ``x``, a forward being
    at most its layer's work), so ``T`` is bisected to the least at which ``P`` ranks cover the
    work. On ``P`` equal stages of forward share ``f`` this is about ``M W / P + f W / 2``: half
    of ZB-H1's fill on uniform stages, where 1F1B's bound counts a whole micro-batch (``W``).
    ZBV (two chunks per rank, the second in the model's second half): only the first ``r``
    layers' forward (a layer per chunk at least), :func:`shared_fill_ms`."""
    at = cm.at_batch(c.microbatch_size)
    fp, _ = at.prefix_ms
    M, P = c.num_microbatches, min(c.layout.pipeline_size, len(fp) - 1)
    need = M * at.work_ms
    if c.layout.virtual_stages_per_rank > 1:
        return shared_fill_ms([float(x) for x in fp[:P]], need)
    fwd, bwd = at.times_ms
    work = [0.0, *np.cumsum(fwd + bwd).tolist()]  # F(x): the forward done by work x, interpolated
    fwds = [float(x) for x in fp]
    total = work[-1]

    last, find = len(work) - 1, bisect.bisect_right

    def covered(t: float) -> bool:
        x = 0.0
        for _ in range(P):
            i = min(find(work, x), last)  # F(x), inline (the bisection's hot loop)
            span = work[i] - work[i - 1]
            f = fwds[i - 1] + (fwds[i] - fwds[i - 1]) * ((x - work[i - 1]) / span if span > 0 else 1.0)
            x += max(0.0, t - f) / M
            if x >= total:
                return True
        return False

    lo, hi = need / P, need / P + fwds[-1]  # F_<r <= the whole forward
    while hi - lo > 1e-6 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if covered(mid) else (mid, hi)
    return lo * (1 - 1e-9)


def shared_fill_ms(a: list[float], need: float) -> float:
    """The least ``T`` with ``T >= a_r + w_r`` on every rank for works ``w_r >= 0`` summing to
    ``need`` (``a`` ascending): the ``T`` at which ``sum_r max(0, T - a_r) = need``."""
    for k in range(len(a), 0, -1):  # the ranks whose a_r is below T share the work
        t = (need + sum(a[:k])) / k
        if t >= a[k - 1]:
            return t
    return need


def binds_nowhere(table: StageTable, inflight: int) -> bool:
    """Every stage of ``table`` fits ``inflight`` micro-batches without recomputation (read from its
    arrays): memory constrains no partition, so sharding more could not make one faster
    (:meth:`ConfigFacts.variants`, the replicated search's ZeRO stage alike)."""
    return bool(np.all(~table.valid | (table.static + inflight * table.act <= table.cap)))


def busiest_rank_floor_ms(work: np.ndarray, num_ranks: int) -> float:
    """No one of ``num_ranks`` ranks holding whole layers of ``work`` ms between them (in any
    chunks, contiguous or not) has less than this: among the ``k`` layers of most work some rank
    holds ``ceil(k / R)``, so at least the ``ceil(k / R)`` lightest of them (the classical bound
    of scheduling on identical machines, over every ``k``). With layers of about equal work it
    is ``ceil(L / R)`` layers where the average counts ``L / R``: 98 layers over 64 ranks, 2
    against 1.53."""
    desc = np.sort(np.asarray(work, dtype=float))[::-1]
    prefix = np.concatenate([[0.0], np.cumsum(desc)])
    k = np.arange(1, len(desc) + 1)
    q = -(-k // num_ranks)
    return float(np.max(prefix[k] - prefix[k - q], initial=0.0)) * (1 - 1e-9)


@dataclass(frozen=True, slots=True)
class Reached:
    """What the search learns of a configuration when its order reaches it
    (:meth:`ConfigFacts.reached`): its bound now (higher than the one it was reached at: it goes
    back in the order), where that did not rise its busiest rank's floor, and the variants to
    solve (none where it goes back, or where its bound or that floor exceeds what it must beat:
    it is skipped)."""

    bound_ms: float  # the bound it was reached at, or its memory bound / zero-bubble fill where higher
    busiest_ms: float  # ConfigFacts.busiest_rank_ms; -inf where not asked, or where the bound rose
    variants: tuple[Config, ...] = ()  # solved in this order (ConfigFacts.variants); () where not solved now


class ConfigFacts:
    """Everything the search asks about a configuration before and beside solving it, for one
    cost model ``cm`` (the searched one: over groups of layers on a long profile), ``request``
    and per-device ``cap_bytes``; ``fsdp``: the ZeRO 3 variants are solved too
    (:meth:`variants`). Each figure is worked out once (per configuration, or per shape it
    depends on); the stage tables are shared by every configuration with the same micro-batch
    size, chunks per rank and sharding.

    ``configs``: the configurations a search visits, whose first bounds are worked out with the
    facts (:attr:`first_ms`: :meth:`bound`, with ``fill``) and, with ``by_state``, the state's
    share of memory each is ordered by (:attr:`scales`: :meth:`state_floor_bytes`; 1.0 each
    without)."""

    def __init__(self, cm: CostModel, request: PlanRequest, cap_bytes: float, fsdp: bool = True,
                 configs: Sequence[Config] = (), fill: bool = False, by_state: bool = False) -> None:
        self.cm, self.request, self.cap_bytes, self.fsdp = cm, request, cap_bytes, fsdp
        self.floors: dict[Config, float] = {}  # per configuration, its memory floor (memory_floor_bytes)
        self.least: dict[tuple[int, int], np.ndarray | None] = {}  # StageTable.least_bytes per (table, count)
        self.unique_params = float(cm.state_tables(Sharding()).total_param_count)  # (every sharding's: ties once)
        self.ranks = RankMemory(cm, cap_bytes, self.unique_params)  # the memory floors as time
        self.chunk_fills: dict[tuple[int, int, int], float] = {}  # chunk_fill_bound_ms per (b, P, M)
        self.split_fills: dict[tuple[int, int, int, int], float] = {}  # split_fill_bound_ms per (b, P, M, v)
        self.rank_floors: dict[tuple[int, int], float] = {}  # busiest_rank_floor_ms per (micro-batch size, P)
        self.busiest_floors: dict[Config, float] = {}  # memory_floor_ms per configuration (before its slack)
        self.tables: dict[tuple[object, ...], StageTable] = {}
        self.nowhere: dict[tuple[int, int], bool] = {}  # binds_nowhere per (table, in-flight count)
        self.recent = RecentEntries()  # the tables' entries per in-flight count and cap, the recent ones kept
        self.first_ms = [self.bound(c, fill) for c in configs]  # per configuration of ``configs``
        self.scales = [self.state_floor_bytes(c) if by_state else 1.0 for c in configs]

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

    def reached_bound(self, c: Config, memory: bool, fill: bool) -> float:
        """What the search's order learns of ``c`` once it reaches it (0 for neither): with
        ``memory`` its memory bound (:meth:`memory_bound`), with ``fill`` a zero-bubble
        configuration's fill (:meth:`split_fill_ms`), the larger; each worked out only then."""
        mem = self.memory_bound(c) if memory else 0.0
        return max(mem, self.split_fill_ms(c) if fill else 0.0)

    def reached(self, c: Config, lb: float, limit: float, slack: float, *, prune: bool, memory: bool, fill: bool,
                floors: bool, fsdp_only: bool = False) -> Reached:
        """What the search learns of ``c``, reached at bound ``lb``, which must beat ``limit``. With
        ``prune``, where ``lb`` is within the limit: its :meth:`reached_bound` (``memory``,
        ``fill``) where higher than ``lb`` (it goes back in the order), else, with ``floors``, its
        busiest rank's floor against ``limit`` (:meth:`busiest_rank_ms`, with the check's
        ``slack``); then, unless ``prune`` skips it (``lb`` or that floor above the limit), its
        :meth:`variants` (``fsdp_only``: ZeRO 3's alone, :meth:`fsdp_variants`: it came back for
        them), worked out only then."""
        busiest = -math.inf
        if prune and lb <= limit:
            bound = self.reached_bound(c, memory, fill)
            if bound > lb:
                return Reached(bound, busiest)
            busiest = self.busiest_rank_ms(c, slack, limit) if floors else busiest
        if prune and (lb > limit or busiest > limit):
            return Reached(lb, busiest)
        return Reached(lb, busiest, tuple(self.fsdp_variants(c) if fsdp_only else self.variants(c)))

    def busiest_rank_ms(self, c: Config, slack: float, limit: float) -> float:
        """The busiest rank's floor of ``c`` as the search's skipping compares it with ``limit``: its
        whole layers' (:meth:`rank_floor_ms`), and where that does not exceed a finite ``limit`` the
        larger of it and its memory's (:meth:`memory_floor_ms`, worked out only then; inf where no
        variant fits at all). Both only skip, never reorder (their docstrings)."""
        floor = self.rank_floor_ms(c, slack)
        if floor > limit or limit == math.inf:
            return floor
        return max(floor, self.memory_floor_ms(c, slack))

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
        """The memory floor as time (:meth:`RankMemory.memory_bound_ms
        <planner.solve.rank_memory.RankMemory.memory_bound_ms>`, at the state of the leanest variant
        solved) of GPipe, 1F1B and interleaved 1F1B configurations; 0 for others, for copies per
        stage and for profiles with shared saved storages, not bounded there."""
        cm, lay = self.cm, c.layout
        if (cm.profile.shared_saved or lay.stage_replicas
                or c.schedule not in FILL_BOUND + (ScheduleKind.INTERLEAVED_1F1B,)):
            return 0.0
        # (experts' state may shard wider)
        kappa = cm.state_tables(self.leanest(c).layout.sharding(0)).least_state_bytes_per_param
        return self.ranks.memory_bound_ms(c, kappa, rank_fills_ms(cm, c))

    def memory_floor_ms(self, c: Config, slack: float) -> float:
        """No proposal of ``c`` (any variant, partition or recomputation) passes
        :meth:`ConfigSearch.keep <planner.solve.config_search.ConfigSearch.keep>`'s check when this
        exceeds what it must beat: the busiest rank runs M x its chunks' work and recomputation,
        at least the T at which the ranks' works reach the profile's with no waits
        (:meth:`RankMemory.floor_ms <planner.solve.rank_memory.RankMemory.floor_ms>`), each rank's
        chunks holding the micro-batches :func:`~planner.solve.rank_memory.held_whole` counts (the
        zero-bubble schedules' too; ZBV's two chunks each within half the cap, as their tables price
        them); over groups of layers divided by the check's
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
        """:meth:`memory_floor_ms` of ``c``'s variants sharded as ``sharded`` or less deeply
        (:meth:`RankMemory.floor_ms <planner.solve.rank_memory.RankMemory.floor_ms>`)."""
        return self.ranks.floor_ms(c, self.cm.state_tables(sharded.layout.sharding(0)).least_state_bytes_per_param)

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
        :attr:`ZeroVariants.hsdp <planner.solve.space.ZeroVariants.hsdp>`), then ZeRO 3 over the whole group (solved only where HSDP does
        not fit: :class:`planner.solve.config_search.ConfigSearch`)."""
        at = c.zero_variants(self.cm.cluster.devices_per_node)
        return ([at.hsdp] if at.hsdp is not None else []) + [at.by_stage[ZeroStage.PARAMETERS]]

    def leanest(self, c: Config) -> Config:
        """``c`` at the deepest sharding any of its variants is solved at (:meth:`variants`)."""
        if not (self.fsdp and c.fsdp_searched):
            return c
        return c.zero_variants(self.cm.cluster.devices_per_node).by_stage[ZeroStage.PARAMETERS]

    def state_floor_bytes(self, c: Config) -> float:
        """No plan of ``c`` (any variant, partition, recomputation or cap) peaks below this on its
        busiest device: the ranks hold the model state at least once between them, sharded as
        the leanest variant (0 for per-stage replication, not bounded here)."""
        lay = c.layout
        if lay.stage_replicas:
            return 0.0
        kappa = self.cm.state_tables(self.leanest(c).layout.sharding(0)).least_state_bytes_per_param
        return kappa * self.unique_params / lay.pipeline_size * (1 - 1e-9)

    def memory_floor_bytes(self, c: Config) -> float:
        """No plan of ``c`` peaks below this on its busiest device: the least over the partitions
        of the largest stage's fewest bytes with its in-flight count, at its leanest recomputation
        (:meth:`StageTable.least_bytes`; a rank's chunks hold at least their largest), the less of
        ``c``'s own sharding and its ZeRO 3 variant's where that is solved too (ZeRO 3 gathers each
        layer's weights whole: PipeDream's alexnet, its fully connected layers, peaks higher under
        it); 0 where those are not worked out."""
        lay, L = c.layout, self.cm.num_layers
        # a zero-bubble stage's micro-batches past I only add
        ks = tuple(h.whole for h in held_counts(c.schedule, c.layout, c.num_microbatches))
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
        line = cm.fsdp_line(c.layout) if is_fsdp(c.layout.sharding(0)) else (0.0, 0.0)
        key = (c.microbatch_size, v, c.layout.sharding(0), line)
        if key not in tables:
            # a rank holding v chunks gives each cap / v (the sum of their peaks fits)
            tables[key] = StageTable(
                cm, c.microbatch_size, self.cap_bytes / v, self.request.fixed_boundaries,
                allow_recompute=self.request.recompute, sharding=c.layout.sharding(0), fsdp_line=line, recent=self.recent,
            )
        return tables[key]

    def binds_nowhere(self, c: Config) -> bool:
        """:func:`binds_nowhere` of ``c``'s table at its most micro-batches in flight (kept per table and count)."""
        table = self.table_of(c)
        key = (id(table), max(h.inflight for h in held_counts(c.schedule, c.layout, c.num_microbatches)))
        found = self.nowhere.get(key)
        if found is None:
            found = self.nowhere[key] = binds_nowhere(table, key[1])
        return found

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
        if c.layout.zero is ZeroStage.PARAMETERS and not c.layout.shard_group_size and c.fsdp_searched:
            return self.fsdp_variants(c)  # ZeRO 3 asked alone: HSDP first, the whole group where it does not fit
        fsdp_too = self.fsdp and c.fsdp_searched and c.layout.zero is not ZeroStage.PARAMETERS
        if (c.layout.zero or fsdp_too) and ZeroStage.NONE in request.zero_stages:
            plain = c.zero_variants(cm.cluster.devices_per_node).by_stage[ZeroStage.NONE]
            if self.binds_nowhere(plain):
                # memory binds nowhere: sharding can only shorten the optimizer step (where priced)
                return [plain, c] if c.layout.zero and cm.cluster.memory_bandwidth_gb_per_s else [plain]
        if fsdp_too and not self.binds_nowhere(c):
            return [c, *self.fsdp_variants(c)]
        return [c]

