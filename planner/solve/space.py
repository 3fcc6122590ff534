"""The space of configurations the search visits (the requests it refuses before searching:
:func:`planner.solve.layout_search.refuse_unmeetable`).

A configuration is a :class:`~planner.artifacts.layout.Layout` (pipeline ranks P and chunks per
rank v, replicated pipelines D or per-stage copies, the tensor-parallel degree of the cost model
searching it, ZeRO) with a micro-batch size b (hence M = G / (D b) micro-batches) and a schedule.
Counts here are of *tensor-parallel groups* (devices / t): the cost model a search runs with
prices one device of a group (:mod:`planner.cost.tensor_parallel`), and a layout of P x D
groups occupies P x D x t devices.

- P x D = n for every divisor n of the N groups available (P <= layers): a layout on fewer
  groups wins only by simulated time (see :mod:`planner.solve.search`). Divisors, not every
  n <= N: every count took 3x the solver time on GPT-3 175B over 1,024 devices, divisors about
  the same as N alone;
- b divides the per-replica batch;
- the schedules the chain DP prices (GPipe, 1F1B; ZB-H1 and ZB-H2 when the request names them), and interleaved 1F1B (in the default
  request) with each of the :attr:`SearchSettings.interleave_factors` chunks per rank: the
  number of chunks is one more dimension of the search, chosen by simulated time; ZBV (when
  named) with its two chunks per rank in a V, priced like interleaving (the DP over the ``2P``
  chunks with their counted in-flight micro-batches and ZB-H1's bubble fill, then simulated);
  DualPipe-V (``M >= 2P``) on the same V layout, the same way; DualPipe (when named, ``D`` even:
  its two copies) on the V with the copies as a data-parallel pair (``ChunkPlacement.MIRROR``);
- ZeRO: with D > 1 the deepest of stages 0-2 the request allows (:func:`searched_zero`) and,
  where memory binds, ZeRO 3 as a configuration of its own (:func:`fsdp_searched`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ChunkPlacement, ScheduleKind, ZeroStage
from planner.artifacts.layout import Layout
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.schedule import check_schedule_rules
from planner.solve.settings import SETTINGS, SearchSettings

#: schedules the chain DP prices (interleaving changes the in-flight pattern: priced by counting)
DP_SCHEDULES = (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B)
#: schedules the chain DP and the brute force also price with their own objective (one stage
#: per rank, backward split: ZB-H1, planner.solve.chain_dp); not in the default request (see
#: planner.artifacts.request)
SPLIT_SCHEDULES = (ScheduleKind.ZB_H1, ScheduleKind.ZB_H2)
#: schedules of two chunks per rank in a V (ZBV; DualPipe-V, planner.schedule.dualpipe), priced like interleaving
V_SCHEDULES = (ScheduleKind.ZBV, ScheduleKind.DUALPIPE_V)


@dataclass(frozen=True, slots=True)
class Config:
    """One point of the space: a layout, a micro-batch size and count, a schedule; with what the
    search reads of it worked out once where it is built (:meth:`__post_init__`), as fields. The
    micro-batches its stages hold are the schedule's (:func:`planner.schedule.held_counts` of its
    schedule, layout and count, one cached call per shape): not a field, walking an interleaved
    schedule's order costs and most configurations are pruned before anything asks (worked out
    for all 37,846 of GPT-3 175B on 1,024 A100s, the search took 2.6x its CPU)."""

    layout: Layout
    microbatch_size: int
    num_microbatches: int
    schedule: ScheduleKind
    #: the search solves ZeRO 3 beside the configuration's own stage (:func:`fsdp_searched`: set where
    #: the space is listed, :func:`all_configs`; its ZeRO variants keep it)
    fsdp_searched: bool = field(default=False, compare=False)
    #: pipeline ranks P (the layout's)
    pipeline_size: int = field(init=False, compare=False, repr=False)
    #: tensor- (x context-) parallel groups the layout occupies: P x D, or the sum of the stages' copies
    num_groups: int = field(init=False, compare=False, repr=False)
    #: ties broken towards fewer pipeline ranks, larger micro-batches, then by name
    sort_key: tuple[int, int, str, int, int, tuple[int, ...]] = field(init=False, compare=False, repr=False)
    #: its ZeRO variants once asked (:meth:`zero_variants`; None before)
    variants: ZeroVariants | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        lay, put = self.layout, object.__setattr__
        P = lay.pipeline_size
        put(self, "pipeline_size", P)
        put(self, "num_groups", lay.num_groups)
        put(self, "sort_key", (P, -self.microbatch_size, self.schedule.value, lay.virtual_stages_per_rank, int(lay.zero),
                               lay.stage_replicas))

    def zero_variants(self, devices_per_node: int) -> ZeroVariants:
        """This configuration at each ZeRO stage and under HSDP on nodes of ``devices_per_node``
        devices (:class:`ZeroVariants`), worked out once (the search asks again for each of its
        bounds and variants) and kept on the configuration."""
        found = self.variants
        if found is None or found.devices_per_node != devices_per_node:
            found = ZeroVariants.of(self, devices_per_node)
            object.__setattr__(self, "variants", found)
        return found


@dataclass(frozen=True, slots=True)
class ZeroVariants:
    """A configuration's ZeRO variants: at each stage (:attr:`by_stage`, indexed by the stage;
    below ZeRO 3 an HSDP layout's shard groups go: ZeRO 1 or 2 shard over the whole gradient
    group, no layout holds them within a node; ZeRO 3 keeps the layout's own shard group), and
    under HSDP (:attr:`hsdp`: ZeRO 3 sharded within a node's share of each gradient group,
    replicated across nodes, :func:`hsdp_shard_size`; None where that is plain ZeRO 3, the
    group fitting in a node, or does not divide the group)."""

    devices_per_node: int
    by_stage: tuple[Config, ...]
    hsdp: Config | None

    @classmethod
    def of(cls, c: Config, devices_per_node: int) -> ZeroVariants:
        lay = c.layout

        def at(zero: ZeroStage, group: int) -> Config:
            if (zero, group) == (lay.zero, lay.shard_group_size):
                return c
            return dataclasses.replace(c, layout=dataclasses.replace(lay, zero=zero, shard_group_size=group))

        g = hsdp_shard_size(lay, devices_per_node)
        return cls(devices_per_node, tuple(at(z, lay.shard_group_size if z is ZeroStage.PARAMETERS else 0) for z in ZeroStage),
                   at(ZeroStage.PARAMETERS, g) if g else None)


def layout_of(
    cm: CostModel, pipeline_size: int, dp_degree: int = 1, virtual_stages: int = 1, zero: ZeroStage = ZeroStage.NONE,
    replicas: tuple[int, ...] = (), placement: ChunkPlacement = ChunkPlacement.LOOP,
) -> Layout:
    """The layout of ``pipeline_size`` x ``dp_degree`` groups (or ``replicas`` copies per stage),
    each stage replica spanning ``cm``'s group."""
    return cm.group.layout(num_stages=len(replicas) if replicas else pipeline_size * virtual_stages,
                           virtual_stages_per_rank=virtual_stages, dp_degree=dp_degree, stage_replicas=tuple(replicas),
                           zero=zero, placement=placement)


def schedule_valid(schedule: ScheduleKind, num_stages: int, num_microbatches: int) -> bool:
    """The schedule's own rules (as torch.distributed.pipelining enforces them)."""
    if schedule is ScheduleKind.ONE_F_ONE_B:
        return num_microbatches >= num_stages
    if schedule is ScheduleKind.ZB_H1:
        return num_microbatches % max(1, num_microbatches // num_stages) == 0
    if schedule in (ScheduleKind.DUALPIPE_V, ScheduleKind.DUALPIPE):  # num_stages: its 2P chunks (torch's ScheduleDualPipeV)
        return num_microbatches >= num_stages
    return True


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def microbatch_sizes(request: PlanRequest, per_replica_batch: int) -> list[int]:
    sizes = request.microbatch_sizes or tuple(divisors(per_replica_batch))
    return sorted(b for b in set(sizes) if per_replica_batch % b == 0)


def device_counts(num_groups: int) -> list[int]:
    """The group counts a uniform layout may occupy, most first: the divisors of ``num_groups``."""
    return divisors(num_groups)[::-1]


def configurations(num_layers: int, num_groups: int, request: PlanRequest) -> Iterator[tuple[int, int]]:
    """(P, D) pairs with P x D <= N (every pair once), honouring the request's stage count,
    data-parallel degree and stage limit, in search order (all N groups first)."""
    for n in device_counts(num_groups):
        for P in divisors(n):
            D = n // P
            if P > num_layers or (request.max_stages and P > request.max_stages):
                continue
            if (request.num_stages and P != request.num_stages) or (request.dp_degree and D != request.dp_degree):
                continue
            if request.global_batch % D:
                continue
            yield P, D


def searched_zero(request: PlanRequest, dp_degree: int) -> ZeroStage:
    """The ZeRO stage a configuration is solved at: the deepest of 0, 1 and 2 the request allows
    when there are replicas to shard over. Those only free memory and move no more bytes (see
    planner.cost), so their optimum is never slower; :func:`planner.solve.build.least_zero`
    then keeps the least sharding under which the chosen plan still fits. ZeRO 3 moves more (its
    gathers every micro-batch), so it is a configuration of its own (:func:`fsdp_searched`), and
    this stage only when the request allows nothing else. With one rank per stage sharding
    changes nothing; the plan records the least stage asked for."""
    if dp_degree <= 1:
        return min(request.zero_stages)
    return max((z for z in request.zero_stages if z is not ZeroStage.PARAMETERS), default=ZeroStage.PARAMETERS)


def table_keys(num_layers: int, num_groups: tuple[int, ...], request: PlanRequest, settings: SearchSettings) -> int:
    """The stage tables the configurations of ``num_groups`` (per tensor- x context-parallel
    degree, the groups it has) on ``num_layers`` layers can ask for: per degree, the distinct
    (micro-batch size, chunks per rank, ZeRO stage, data-parallel degree where ZeRO 3 gathers
    over it) of its configurations (:func:`configurations`), each with the stages its ZeRO
    variants are solved at (none, its own, ZeRO 3 where the request allows it). What the
    working-set ceiling counts (:mod:`planner.solve.ceiling`), from the space alone."""
    interleaved = any(s in request.schedules for s in (ScheduleKind.INTERLEAVED_1F1B, ScheduleKind.ZBV,
                                                       ScheduleKind.DUALPIPE_V, ScheduleKind.DUALPIPE))
    total = 0
    per_degree: dict[int, int] = {}  # degrees with as many groups have as many keys
    for n in num_groups:
        if n not in per_degree:
            keys: set[tuple[int, int, ZeroStage, int]] = set()
            for P, D in configurations(num_layers, n, request):
                chunks = [1] + [v for v in settings.interleave_factors if interleaved and P > 1 and P * v <= num_layers]
                stages = {searched_zero(request, D), ZeroStage.NONE}
                if D > 1 and ZeroStage.PARAMETERS in request.zero_stages:
                    stages.add(ZeroStage.PARAMETERS)
                for b in microbatch_sizes(request, request.global_batch // D):
                    keys.update((b, v, z, D if z is ZeroStage.PARAMETERS else 0) for v in chunks for z in stages)
            per_degree[n] = len(keys)
        total += per_degree[n]
    return total


def hsdp_shard_size(layout: Layout, devices_per_node: int) -> int:
    """HSDP's shard group on ``layout``: the members of a stage's gradient group (``D x cp`` ranks,
    ``t`` apart) inside one node; 0 where that is the whole group, one rank, or does not divide it."""
    whole = layout.dp_degree * layout.cp_degree
    g = min(whole, max(1, devices_per_node // layout.tp_degree))
    return g if 1 < g < whole and whole % g == 0 and not layout.stage_replicas else 0


def fsdp_searched(request: PlanRequest, layout: Layout) -> bool:
    """ZeRO 3 is searched beside the configuration's own stage (:func:`searched_zero`): the
    request allows it, there are replicas to shard over, and it is a uniform layout (per-stage
    replication is not priced under ZeRO 3). The search solves it where memory binds under the
    other stage (where it binds nowhere, ZeRO 3 could only add communication)."""
    return ZeroStage.PARAMETERS in request.zero_stages and layout.dp_degree > 1 and not layout.stage_replicas


def all_configs(
    cm: CostModel, request: PlanRequest, num_groups: int, interleaved: bool = True, settings: SearchSettings = SETTINGS,
    split: bool = True,
) -> list[Config]:
    """Every configuration of the space for ``cm`` (see the module docstring); ``split``: also
    the schedules that split the backward (:data:`SPLIT_SCHEDULES`)."""
    schedules = [s for s in request.schedules if s in DP_SCHEDULES or (split and s in SPLIT_SCHEDULES)]
    # one stage has no bubble to fill: ZB-H1 / ZB-H2 there run 1F1B's order with each backward split
    # in two, the same work, more held (its W's inputs); not solved beside a schedule without the split
    one_stage_plain = any(s in DP_SCHEDULES for s in schedules)
    out: list[Config] = []
    for P, D in configurations(cm.num_layers, num_groups, request):
        if not cm.group.admits(D):
            continue  # the experts' layout does not fold over these ranks
        z = searched_zero(request, D)
        # one layout per chunk count, shared by every micro-batch size (each with D copies, no per-stage ones)
        plain = layout_of(cm, P, D, 1, z)
        fsdp = fsdp_searched(request, plain)
        chunked = {v: layout_of(cm, P, D, v, z) for v in settings.interleave_factors if P * v <= cm.num_layers}
        zbv = layout_of(cm, P, D, 2, z, placement=ChunkPlacement.V) if 2 * P <= cm.num_layers else None
        # DualPipe: the V's chunks, its two copies a data-parallel pair (ChunkPlacement.MIRROR)
        dual = (layout_of(cm, P, D, 2, z, placement=ChunkPlacement.MIRROR)
                if ScheduleKind.DUALPIPE in request.schedules and zbv is not None and D % 2 == 0 else None)
        for b in microbatch_sizes(request, request.global_batch // D):
            M = request.global_batch // (D * b)
            out.extend(Config(plain, b, M, sch, fsdp) for sch in schedules
                       if schedule_valid(sch, P, M) and not (P == 1 and sch.splits_backward and one_stage_plain))
            if interleaved and ScheduleKind.INTERLEAVED_1F1B in request.schedules and P > 1:
                out.extend(
                    Config(lay, b, M, ScheduleKind.INTERLEAVED_1F1B, fsdp)
                    for v, lay in chunked.items() if interleaving_valid(P, M, v)
                )
            if interleaved and P > 1 and zbv is not None:
                out.extend(Config(zbv, b, M, sch, fsdp) for sch in V_SCHEDULES
                           if sch in request.schedules and schedule_valid(sch, 2 * P, M))
            if interleaved and P > 1 and dual is not None and schedule_valid(ScheduleKind.DUALPIPE, 2 * P, M):
                out.append(Config(dual, b, M, ScheduleKind.DUALPIPE, fsdp))
    return out


def interleaving_valid(num_ranks: int, num_microbatches: int, v: int) -> bool:
    try:
        check_schedule_rules(ScheduleKind.INTERLEAVED_1F1B, num_ranks * v, num_microbatches, v)
    except PlannerInputError:
        return False
    return num_microbatches >= num_ranks
