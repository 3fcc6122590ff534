"""A stage's time terms, and the record that carries them from the cost model to the simulator.

:class:`StageCosts` (a base class of :class:`planner.cost.model.CostModel`, over
:mod:`planner.cost.zero_comm`, :mod:`planner.cost.sharding` and :mod:`planner.cost.prefix`) prices what one stage of a layout
costs in time: its layers' forward, backward and weight-gradient passes per micro-batch (from
the prefix sums) and what ZB-H1 fills of the bubble with them, its transfers to the neighbouring
stages, its gradient synchronisation as the stack runs it (:class:`SyncCost`,
:mod:`planner.cost.overlap`), its recomputation (under ZeRO 3 less what hides beside the backward's collectives), its routed
experts' dispatch and combine, the part of its synchronisation the solver's objective counts as
exposed, and one device's optimizer step. :meth:`StageCosts.stage_terms` asks these together for
one stage into a :class:`StageTerms`; :func:`price_stage` caches it per cost model. The solver's
re-scoring replays a candidate's records in the simulator's fast entry
(:func:`planner.simulation.simulate_iteration_ms`), and a Plan's stages are built from the same
records (:func:`planner.solve.build.build_plan`), so a stage is priced by one function whichever
path it takes. What each term means is in :mod:`planner.cost.model` (the formulas) and
:mod:`planner.cost.overlap` (what the stack overlaps).

Optimizer step: once per iteration each device updates the parameters whose optimizer state it
holds (all of its stage's, or 1/n of them under ZeRO over n ranks), a memory-bound pass
streaming :attr:`~planner.artifacts.kinds.OptimizerKind.step_bytes_per_param` per parameter
(gradient read, state read and written, weights written) at the device's memory bandwidth
(``Cluster.memory_bandwidth_gb_per_s``, the datasheet figure: a lower bound on the step, no
fitted constant); ``params / n x bytes / bandwidth``. 0 where the cluster does not give its
bandwidth. The simulator runs it on each rank after the rank's compute and gradient
synchronisation (:mod:`planner.simulation.simulator`); over a device's shard under ZeRO 1-3
(:mod:`planner.cost.sharding`), on the host with the optimizer offloaded (:mod:`planner.cost.offload`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

import numpy as np

from planner.artifacts.caches import OwnedCache
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ZeroStage
from planner.artifacts.layout import Layout, Sharding
from planner.cost.collectives import allreduce_line, link_of, p2p_ms, stage_links
from planner.cost.fsdp import gathers_per_microbatch, weight_pass_gather_ms
from planner.cost.offload import offloaded_step_ms
from planner.cost.overlap import overlapped_gather, overlapped_reduce
from planner.cost.sharding import is_fsdp
from planner.cost.zero_comm import ZeroComm

__all__ = ["StageCosts", "StageTerms", "SyncCost", "price_stage", "price_stages"]


@dataclass(frozen=True, slots=True)
class SyncCost:
    """One stage's gradient synchronisation per iteration, as the stack runs it (ms): the whole
    of it (``total_ms``: reduction, ZeRO all-gather and the tied gradients' exchange); how long
    before the stage's last backward ends the reduction may start (``early_ms``, its buckets
    overlapping that backward); the part of ``total_ms`` that is the ZeRO all-gather run ahead
    of the next iteration's forward (``gather_ahead_ms``), and the earliest end of the stage's
    first forward after that gather starts (``gather_bound_ms``)."""

    total_ms: float
    early_ms: float = 0.0
    gather_ahead_ms: float = 0.0
    gather_bound_ms: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTerms:
    """What the simulator replays of one stage, in ms: per micro-batch its forward, its backward
    (``bwd_ms``: without recomputation; with a split backward, ``wgrad_ms`` of it is the
    weight-gradient pass W, else ``wgrad_ms`` is 0), the recomputation its backward re-runs
    first, and its transfers to the next stage (``send_fwd_ms``) and to the previous one
    (``send_bwd_ms``); per iteration its gradient synchronisation (``allreduce_ms``: reduction,
    ZeRO's all-gather and the tied exchange), how early that may start before its last backward
    ends (``sync_early_ms``), the part of it run ahead of the next forward (``gather_ahead_ms``)
    with the earliest end of the stage's first forward after that gather starts
    (``gather_bound_ms``), and one device's optimizer step (``optimizer_ms``). ``alltoall_ms``: of
    its forward and backward, the routed experts' dispatch and combine (in those times, not
    replayed apart; a plan's stage reports it)."""

    fwd_ms: float
    bwd_ms: float
    recompute_ms: float = 0.0
    wgrad_ms: float = 0.0
    send_fwd_ms: float = 0.0
    send_bwd_ms: float = 0.0
    allreduce_ms: float = 0.0
    sync_early_ms: float = 0.0
    gather_ahead_ms: float = 0.0
    gather_bound_ms: float = 0.0
    optimizer_ms: float = 0.0
    alltoall_ms: float = 0.0  # of fwd_ms + bwd_ms, the routed experts' dispatch and combine (a plan reports it)

    def __post_init__(self) -> None:
        for name in _NAMES:
            value = getattr(self, name)
            if not value >= 0.0:  # also rejects NaN
                raise PlannerInputError(f"stage terms: {name} must be >= 0 (got {value})")


_NAMES = tuple(f.name for f in fields(StageTerms))


class StageCosts(ZeroComm):
    """A stage's time terms (module docstring), over the attributes a
    :class:`~planner.cost.model.CostModel` sets."""

    _expert_lines: dict[tuple[Layout, int], tuple[float, float]]
    offload_optimizer: bool  # the optimizer steps on the host (planner.cost.offload)

    # ---------------------------------------------------------------- compute
    def stage_fwd_ms(self, start: int, stop: int, microbatch_size: int) -> float:
        """Forward ms of one micro-batch through the layers ``[start, stop)``."""
        fp, _ = self.at_batch(microbatch_size).prefix_ms
        return float(fp[stop] - fp[start])

    def stage_bwd_ms(self, start: int, stop: int, microbatch_size: int) -> float:
        """Backward ms of one micro-batch through the layers ``[start, stop)``."""
        _, bp = self.at_batch(microbatch_size).prefix_ms
        return float(bp[stop] - bp[start])

    def stage_wgrad_ms(self, start: int, stop: int, microbatch_size: int) -> float:
        """Of :meth:`stage_bwd_ms`, the weight-gradient pass W (:mod:`planner.cost.model`)."""
        _, bwd = self.at_batch(microbatch_size).times_ms
        return float(np.dot(bwd[start:stop], self.wgrad_fraction[start:stop]))

    def stage_bubble_fill_ms(self, start: int, stop: int, microbatch_size: int) -> float:
        """``Z_s = min(2 W_s, F_s + B_s)`` of the stage ``[start, stop)``: what ZB-H1 (Qi et al.,
        ICLR 2024, sec. 3.1) fills of the pipeline's fill and drain with the stage's W passes
        (its bubble is ``(P - 1)(T_F + T_B - T_W)`` where 1F1B's is ``(P - 1)(T_F + T_B + T_W)``)."""
        compute = self.stage_fwd_ms(start, stop, microbatch_size) + self.stage_bwd_ms(start, stop, microbatch_size)
        return min(2.0 * self.stage_wgrad_ms(start, stop, microbatch_size), compute)

    # ---------------------------------------------------------------- recomputation
    def recompute_ms(self, recompute: Iterable[int], microbatch_size: int, selective: Iterable[int] = (),
                     layout: Layout | None = None, stage_idx: int = 0) -> float:
        """Re-running the forward of the fully recomputed layers and the selective level of the
        selectively recomputed ones, per micro-batch, as stage ``stage_idx`` of ``layout`` prices
        it (under ZeRO 3 less what runs beside its collectives: :meth:`recompute_prices`)."""
        fwd, core = self.layout_recompute_prices(microbatch_size, layout, stage_idx)
        return float(sum(fwd[i] for i in recompute)) + float(sum(core[i] for i in selective))


    def recompute_prices(self, microbatch_size: int, sharding: Sharding = Sharding(),
                         line: tuple[float, float] = (0.0, 0.0)) -> tuple[np.ndarray, np.ndarray]:
        """Per layer what recomputing it adds to a micro-batch, fully (its forward) and
        selectively (its selective level's forward): those forwards, less under ZeRO 3 (``sharding``,
        its collectives on ``line``) the slack its backward leaves beside the gathers and
        reduce-scatters (:attr:`FsdpTerms.slack`, :mod:`planner.cost.fsdp`)."""
        at = self.at_batch(microbatch_size)
        fwd, core = at.times_ms[0], at.core_ms
        if not is_fsdp(sharding):
            return fwd, core
        slack = self.fsdp_terms(microbatch_size, line, sharding).slack
        if not slack.any():
            return fwd, core
        return np.maximum(0.0, fwd - slack), np.maximum(0.0, core - slack)

    def layout_recompute_prices(self, microbatch_size: int, layout: Layout | None = None,
                                stage_idx: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`recompute_prices` of stage ``stage_idx`` of ``layout`` (None: no sharding)."""
        if layout is None or not is_fsdp(layout.sharding(stage_idx)):
            return self.recompute_prices(microbatch_size)
        return self.recompute_prices(microbatch_size, layout.sharding(stage_idx), self.fsdp_line(layout))

    # ---------------------------------------------------------------- transfers and synchronisation
    def tied_allreduce_bytes(self, start: int, stop: int) -> float:
        """Gradient bytes of tied tensors this stage shares with another stage (summed across them)."""
        total = 0.0
        for tie in self.profile.tied:
            inside = sum(1 for i in tie.layers if start <= i < stop)
            if 0 < inside < len(tie.layers) and tie.name not in self.rank_local_ties:
                total += tie.param_count * self.grad_bytes_per_param
        return total


    def boundary_transfer_ms(self, boundary: int, microbatch_size: int, upstream_stage_idx: int, layout: Layout) -> float:
        """Transfer of the tensors crossing the cut before layer ``boundary`` between stage
        ``upstream_stage_idx`` and the next one (activations forward, their gradients backward:
        same bytes), on the link between the first devices of the two stages."""
        if boundary <= 0 or boundary >= self.num_layers:
            return 0.0
        nbytes = float(self.cut_bytes_per_sample[boundary]) * microbatch_size
        src = layout.rank_of(stage_idx=upstream_stage_idx)
        dst = layout.downstream_rank(upstream_stage_idx)
        if src == dst:
            return 0.0  # the two chunks share the rank (the turn of a V placement): no transfer
        bw, lat = link_of(self.cluster, src, dst)
        return p2p_ms(nbytes, bandwidth_gb_per_s=bw, latency_us=lat)

    def tied_exchange_ms(self, start: int, stop: int) -> float:
        """The exchange of tied gradients with the other stage holding the tied tensor (priced
        on the slowest link of the cluster, since the partner stage is not known here): a ring
        all-reduce over the two ranks (Patarasuk & Yuan 2009), ``2 (d-1)/d x bytes/beta + 2 (d-1)
        alpha`` at ``d = 2``: the bytes once over the link and two steps' latency, one transfer
        (:func:`~planner.cost.collectives.p2p_ms`) at twice the link's latency (the same figure
        bit for bit: tests/test_accuracy_mechanisms.py)."""
        tied = self.tied_allreduce_bytes(start, stop)
        if not tied:
            return 0.0
        if self.cluster.num_nodes > 1:
            bw, lat = self.cluster.inter_node_bandwidth_gb_per_s, self.cluster.inter_node_latency_us
        else:
            bw, lat = self.cluster.intra_node_bandwidth_gb_per_s, self.cluster.intra_node_latency_us
        return p2p_ms(tied, bandwidth_gb_per_s=bw, latency_us=2 * lat)

    def layer_param_counts(self, start: int, stop: int) -> list[float]:
        """Parameters per layer of a stage, a tied tensor whose layers share the stage counted
        once, on the first of them (whose backward finishes its gradient last)."""
        counts = [float(c) for c in self.param_count[start:stop]]
        for tie in self.profile.tied:
            inside = sorted(i for i in tie.layers if start <= i < stop)
            local = tie.name in self.rank_local_ties and inside and inside[0] != min(tie.layers)
            for i in inside if local else inside[1:]:  # a rank-local tie's copy: its first layer's chunk's
                counts[i - start] -= tie.param_count
        return counts

    def expert_grad_line(self, layout: Layout, stage_idx: int) -> tuple[float, float]:
        """The all-reduce line of stage ``stage_idx``'s routed experts' gradient group (its expert
        data-parallel ranks, :meth:`Layout.edp_group`); (0, 0) without experts or with one rank."""
        if not self.has_experts or layout.expert_grad_group_size(stage_idx) <= 1:
            return 0.0, 0.0
        key = (layout, stage_idx)
        if key not in self._expert_lines:
            self._expert_lines[key] = allreduce_line(self.cluster, layout.edp_group(stage_idx))
        return self._expert_lines[key]

    def stage_alltoall_ms(self, start: int, stop: int, microbatch_size: int) -> float:
        """Of the stage's forward + backward per micro-batch, the routed experts' dispatch and
        combine on the critical path (:mod:`planner.cost.experts`; 0 without experts)."""
        if not self.has_experts:
            return 0.0
        return sum((layer.moe.alltoall_fwd.at(microbatch_size) + layer.moe.alltoall_bwd.at(microbatch_size))
                   / self._speed for layer in self.profile.layers[start:stop] if layer.moe is not None)

    def grad_line(self, layout: Layout, stage_idx: int) -> tuple[float, float]:
        """The all-reduce line of stage ``stage_idx``'s gradient group (its data- x
        context-parallel ranks, :meth:`Layout.grad_group`; the layout's
        :class:`~planner.cost.collectives.StageLinks`): the one place the solver prices that group."""
        return stage_links(self.cluster, layout).grad_lines[stage_idx]

    def stage_sync(
        self, start: int, stop: int, stage_idx: int, layout: Layout, recompute: Sequence[int] = (),
        microbatch_size: int = 1, selective: Sequence[int] = (),
    ) -> SyncCost:
        """The stage's synchronisation as :attr:`stack` runs it (module docstrings of this
        module and :mod:`planner.cost.overlap`): the reduction (ring all-reduce of the gradients,
        or ZeRO's reduce-scatter, half of that line) and ZeRO's all-gather of the weights (the
        other half), each one collective, or in buckets overlapped with the last backward
        (reduction) and the next forward (gather); the tied exchange after them. ``recompute``,
        ``selective`` and ``microbatch_size`` give the last backward's per-layer times."""
        tied = self.tied_exchange_ms(start, stop)
        if layout.zero is ZeroStage.PARAMETERS:  # ZeRO 3's collectives are in the stage's forward and backward
            return SyncCost(tied + self.hsdp_allreduce_ms(start, stop, stage_idx, layout))
        counts = self.layer_param_counts(start, stop)
        if self.has_experts:
            return self._expert_sync(start, stop, stage_idx, layout, counts, tied, recompute, microbatch_size, selective)
        one = self._one_sync(start, stop, layout, counts, self.grad_line(layout, stage_idx), recompute, microbatch_size,
                             selective)
        return SyncCost(one.total_ms + tied, one.early_ms, one.gather_ahead_ms, one.gather_bound_ms)

    def _expert_sync(
        self, start: int, stop: int, stage_idx: int, layout: Layout, counts: list[float], tied_ms: float,
        recompute: Sequence[int], microbatch_size: int, selective: Sequence[int],
    ) -> SyncCost:
        """:meth:`stage_sync` of a stage with routed experts: the dense parameters' on their group,
        then the experts' on theirs (each as :meth:`_one_sync` prices one; the two reductions one
        after the other on one stream, each bucketed beside the last backward when the stack
        overlaps: ``early`` the larger of the two), the tied exchange after."""
        experts = [float(x) for x in self.expert_param_count[start:stop]]
        dense = [c - x for c, x in zip(counts, experts)]
        parts = [self._one_sync(start, stop, layout, dense, self.grad_line(layout, stage_idx), recompute,
                                microbatch_size, selective),
                 self._one_sync(start, stop, layout, experts, self.expert_grad_line(layout, stage_idx), recompute,
                                microbatch_size, selective)]
        total = sum(p.total_ms for p in parts) + tied_ms
        return SyncCost(total, max(p.early_ms for p in parts), sum(p.gather_ahead_ms for p in parts),
                        max(p.gather_bound_ms for p in parts))

    def _one_sync(
        self, start: int, stop: int, layout: Layout, counts: list[float], line: tuple[float, float],
        recompute: Sequence[int], microbatch_size: int, selective: Sequence[int],
    ) -> SyncCost:
        """One group's synchronisation of ``counts`` parameters per layer (the stage's, last first
        in the backward) on ``line``: the reduction, and under ZeRO 1-2 the all-gather of the
        updated weights, as :meth:`stage_sync` says; no tied exchange."""
        per_byte, fixed = line
        params = sum(counts)
        if (per_byte == 0.0 and fixed == 0.0) or params <= 0:
            return SyncCost(0.0)
        zero = layout.zero is not ZeroStage.NONE
        half = 0.5 if zero else 1.0
        early = 0.0
        if self.stack.reduce_overlap(zero):
            at = self.at_batch(microbatch_size)
            fwd, bwd = at.times_ms
            rc, sel = set(recompute), set(selective)
            core = at.core_ms if sel else None
            durations = [float(bwd[i]) + (float(fwd[i]) if i in rc else 0.0) + (float(core[i]) if core is not None and i in sel else 0.0)
                         for i in range(stop - 1, start - 1, -1)]
            grads = [c * self.grad_bytes_per_param for c in reversed(counts)]
            reduce_ms, early = overlapped_reduce(durations, grads, half * per_byte, half * fixed, self.stack.grad_bucket_bytes)
        else:
            reduce_ms = half * (per_byte * params * self.grad_bytes_per_param + fixed)
        if not zero:
            return SyncCost(reduce_ms, early)
        if self.stack.param_gather_overlap:
            fwd, _ = self.at_batch(microbatch_size).times_ms
            weights = [c * self.weight_bytes_per_param for c in counts]
            gather_ms, bound = overlapped_gather(
                [float(f) for f in fwd[start:stop]], weights, half * per_byte, half * fixed, self.stack.grad_bucket_bytes)
            return SyncCost(reduce_ms + gather_ms, early, gather_ms, bound)
        return SyncCost(reduce_ms + half * (per_byte * params * self.weight_bytes_per_param + fixed), early)

    def stage_exposed_sync_ms(self, start: int, stop: int, stage_idx: int, layout: Layout, microbatch_size: int) -> float:
        """``X_s`` of the solver's objective (:mod:`planner.solve.chain_dp`): the part of stage
        ``stage_idx``'s gradient synchronisation that runs after its last backward (all-reduce,
        or ZeRO's reduce-scatter + all-gather, or only the reduce-scatter when the stack gathers
        ahead of the forward: a line in its bytes) less the backward work it can overlap: the
        layers' before it, and when the stack overlaps the reduction also the stage's own (a
        proxy for what the pipeline cannot hide; the simulator prices the buckets). 0 under
        ZeRO 3, whose collectives are in the stage's times."""
        per_byte, fixed = self.grad_line(layout, stage_idx)
        if layout.zero is ZeroStage.PARAMETERS:
            return self.hsdp_allreduce_ms(start, stop, stage_idx, layout)
        if per_byte == 0.0 and fixed == 0.0:
            return 0.0
        _, bp = self.at_batch(microbatch_size).prefix_ms
        sync = self.stage_param_count(start, stop) * self.post_backward_sync_bytes_per_param(layout.zero)
        hidden = float(bp[stop] if self.stack.reduce_overlap(layout.zero is not ZeroStage.NONE) else bp[start])
        if self.has_experts:  # the experts' on their own group's line (the dense part's without them)
            experts = self.stage_expert_param_count(start, stop) * self.post_backward_sync_bytes_per_param(layout.zero)
            e_byte, e_fixed = self.expert_grad_line(layout, stage_idx)
            return max(0.0, per_byte * (sync - experts) + fixed + e_byte * experts + (e_fixed if experts else 0.0) - hidden)
        return max(0.0, per_byte * sync + fixed - hidden)

    # ---------------------------------------------------------------- optimizer step
    def optimizer_step_ms(self, start: int, stop: int, sharding: Sharding = Sharding(), hidden_ms: float = 0.0) -> float:
        """One device's optimizer step for the stage ``[start, stop)`` (module docstring): its
        parameters, divided by the ZeRO group when the optimizer state is sharded; with the
        optimizer offloaded, on the host (:func:`planner.cost.offload.offloaded_step_ms`, its
        gradients going down behind ``hidden_ms`` of the last backward)."""
        shard = sharding.ranks if sharding.zero >= ZeroStage.OPTIMIZER else 1
        params = self.stage_param_count(start, stop) / shard
        if self.has_experts:
            experts = self.stage_expert_param_count(start, stop)
            expert_shard = sharding.expert_shards if sharding.zero >= ZeroStage.OPTIMIZER else 1
            params = (self.stage_param_count(start, stop) - experts) / shard + experts / expert_shard
        if self.offload_optimizer:
            return offloaded_step_ms(params, self.weight_bytes_per_param, self.grad_bytes_per_param, self.cluster,
                                     hidden_ms)
        bandwidth = self.cluster.memory_bandwidth_gb_per_s
        if not bandwidth:
            return 0.0
        return params * self.step_bytes_per_param / (bandwidth * 1e6)

    # ---------------------------------------------------------------- assembled
    def stage_terms(
        self, start: int, stop: int, microbatch_size: int, stage_idx: int, layout: Layout,
        recompute: Sequence[int] = (), selective: Sequence[int] = (), split_backward: bool = False,
    ) -> StageTerms:
        """Stage ``stage_idx`` of ``layout``, layers ``[start, stop)``, at ``microbatch_size`` with
        ``recompute`` (fully) and ``selective`` (selectively recomputed layers) as the simulator
        replays it; ``split_backward``: the schedule runs W apart (its ``wgrad_ms``). Uncached:
        :func:`price_stage` caches it."""
        fwd, bwd = self.stage_times_ms(start, stop, microbatch_size, stage_idx, layout)
        bwd += self._zero2_exposed_ms(start, stop, stage_idx, layout, fwd, bwd)
        wgrad = 0.0
        if split_backward:  # W's own compute, and under ZeRO 3 its gathers again (planner.cost.fsdp)
            again = self._weight_pass_gather_ms(start, stop, microbatch_size, stage_idx, layout, bool(recompute))
            bwd, wgrad = bwd + again, self.stage_wgrad_ms(start, stop, microbatch_size) + again
        sync = self.stage_sync(start, stop, stage_idx, layout, recompute, microbatch_size, selective)
        return StageTerms(
            fwd_ms=fwd,
            bwd_ms=bwd,
            recompute_ms=self.recompute_ms(recompute, microbatch_size, selective, layout, stage_idx),
            wgrad_ms=wgrad,
            send_fwd_ms=self.boundary_transfer_ms(stop, microbatch_size, stage_idx, layout),
            send_bwd_ms=self.boundary_transfer_ms(start, microbatch_size, stage_idx - 1, layout),
            allreduce_ms=sync.total_ms,
            sync_early_ms=sync.early_ms,
            gather_ahead_ms=sync.gather_ahead_ms,
            gather_bound_ms=sync.gather_bound_ms,
            optimizer_ms=self.optimizer_step_ms(start, stop, layout.sharding(stage_idx), bwd),
            alltoall_ms=self.stage_alltoall_ms(start, stop, microbatch_size),
        )

    def _weight_pass_gather_ms(self, start: int, stop: int, microbatch_size: int, stage_idx: int, layout: Layout,
                               rebuilds: bool) -> float:
        """ZeRO 3 under a split backward: what gathering the weights for the stage's W pass adds to
        it, ms per micro-batch (:func:`planner.cost.fsdp.weight_pass_gather_ms`); 0 off ZeRO 3 and
        on the first stage unless it ``rebuilds`` recomputed layers at its I (torch runs no I there)."""
        sharding = layout.sharding(stage_idx)
        if not is_fsdp(sharding) or gathers_per_microbatch(True, stage_idx == 0, rebuilds) < 3:
            return 0.0
        terms = self.fsdp_terms(microbatch_size, self.fsdp_line(layout), sharding)
        _, bwd = self.at_batch(microbatch_size).times_ms
        return weight_pass_gather_ms(bwd * self.wgrad_fraction, terms.gather, self.stack.fsdp_prefetch, start, stop)

    def _zero2_exposed_ms(self, start: int, stop: int, stage_idx: int, layout: Layout, fwd_ms: float,
                          bwd_ms: float) -> float:
        """What ZeRO 2's reduce-scatter of one micro-batch's gradients adds to the stage's backward
        (:mod:`planner.cost.zero_comm`): all of it, or with the stack's overlap what the micro-batch's
        own ``fwd_ms + bwd_ms`` cannot hide; 0 off ZeRO 2."""
        sharding = layout.sharding(stage_idx)
        if sharding.zero is not ZeroStage.GRADIENTS or sharding.ranks <= 1:
            return 0.0
        r = self.microbatch_reduce_ms(start, stop, stage_idx, layout)
        return max(0.0, r - fwd_ms - bwd_ms) if self.stack.zero_reduce_overlap else r


#: per cost model, its priced stages by (layers, micro-batch size, stage, layout, recomputation,
#: split backward): a search re-scores partitions that share stages
_PRICED: OwnedCache[StageCosts, tuple[object, ...], StageTerms] = OwnedCache(
    "cost.stage.priced", key="cost model -> (start, stop, micro-batch size, stage, layout, recompute, selective, split)",
    bound=8192)


def price_stage(
    cm: StageCosts, start: int, stop: int, microbatch_size: int, stage_idx: int, layout: Layout, *,
    recompute: Sequence[int] = (), selective: Sequence[int] = (), split_backward: bool = False,
) -> StageTerms:
    """Stage ``stage_idx`` of ``layout``, layers ``[start, stop)``, priced by ``cm`` at
    ``microbatch_size`` with ``recompute`` (fully) and ``selective`` (selectively recomputed
    layers); ``split_backward``: the schedule runs W apart (its ``wgrad_ms``)."""
    key = (start, stop, microbatch_size, stage_idx, layout, tuple(recompute), tuple(selective), split_backward)
    found = _PRICED.get(cm, key)
    if found is None:
        found = _PRICED.put(cm, key, cm.stage_terms(start, stop, microbatch_size, stage_idx, layout, key[5], key[6],
                                                    split_backward))
    return found


def price_stages(
    cm: StageCosts, layout: Layout, microbatch_size: int, boundaries: Sequence[int],
    recompute: Sequence[Sequence[int]], selective: Sequence[Sequence[int]] = (), *, split_backward: bool = False,
) -> tuple[StageTerms, ...]:
    """Every stage of a partition (``boundaries``: the stage starts; ``recompute`` /
    ``selective``: each stage's layers, ``selective`` ``()`` where none anywhere) priced by
    :func:`price_stage`."""
    stops = list(boundaries[1:]) + [cm.num_layers]
    return tuple(
        price_stage(cm, start, stop, microbatch_size, s, layout, recompute=recompute[s],
                    selective=selective[s] if selective else (), split_backward=split_backward)
        for s, (start, stop) in enumerate(zip(boundaries, stops))
    )
