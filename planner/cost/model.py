"""Cost model: compute, communication and memory of a pipeline stage under a Layout (no torch).

Notation (DESIGN.md section 5): a stage holds layers ``[start, stop)``, runs micro-batches of
``b`` samples and recomputes the layer set ``R``; where its devices sit (which links its
transfers cross, the ranks its gradients are synchronised over, how its state is sharded)
comes from the plan's :class:`~planner.artifacts.layout.Layout`. The profile a CostModel prices
is per device: with tensor parallelism, the per-device view of
:mod:`planner.cost.tensor_parallel`.

- forward ``F = sum_l f_l(b)``; backward ``B = sum_l b_l(b)``; recompute ``RC = sum_{l in R} f_l(b)``
  (the backward of a recomputed layer re-runs its forward first). Profile times are for the
  profiled device and are divided by ``Cluster.relative_speed``.
- point-to-point: ``alpha + bytes / beta`` on the link the two ranks share (intra- or inter-node).
- all-reduce of the stage's gradients (ring, Patarasuk & Yuan 2009):
  ``2 (d-1)/d x bytes/beta + 2 (d-1) alpha``; when the replicas span ``n`` nodes with ``k`` per
  node, hierarchical (reduce-scatter in the node, ring across nodes on 1/k of the data,
  all-gather in the node; as NCCL's tree/2D algorithms, Jia et al. 2018 "Highly Scalable Deep
  Learning Training System with Mixed-Precision").
- ZeRO (Rajbhandari et al. 2020) over a stage's ``n`` ranks: stage 1 keeps 1/n of the optimizer
  state per rank, stage 2 also 1/n of the gradients *between iterations*. At the peak it does
  not: a pipeline accumulates its M micro-batches' gradients into the stage's whole gradient
  buffer, and the one reduce-scatter per iteration priced below only shrinks it to 1/n after
  the last backward (sharding it at the peak would take a reduce-scatter per micro-batch, M
  times the traffic; DeepSpeed's pipeline engine refuses ZeRO 2 for this reason). So stage 2
  is priced with full gradients at the peak, the same memory as stage 1. The gradient all-reduce becomes a
  reduce-scatter of the gradients and, after each rank steps its shard, an all-gather of the
  weights. A ring all-reduce *is* a reduce-scatter then an all-gather of the same bytes
  (Patarasuk & Yuan 2009), so the pair costs the all-reduce line at the mean of the two byte
  counts: ``(grad bytes + weight bytes) / 2`` per parameter (the same time for ``adam-mixed``).
  It is accounted like the all-reduce: it starts when the stage's last backward ends and
  overlaps the other stages' cooldown (the weights' all-gather waits for the shard's step,
  which the simulator, like the all-reduce path, does not price: ``optimizer_ms`` = 0).
- memory per device: kappa x params (weights, gradients, optimizer state by
  :data:`STATE_BYTES_PER_PARAM`, sharded as above) + k x activations per micro-batch (k in-flight micro-batches;
  a recomputed layer keeps only its input) + the largest recompute working set (the saved
  tensors of one recomputed layer, live during its backward) + send/receive buffers (the
  boundary activations in and out, and their gradients, one micro-batch each).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from planner.artifacts.cluster import Cluster
from planner.artifacts.kinds import OptimizerKind, ZeroStage
from planner.artifacts.layout import Layout, Sharding
from planner.artifacts.plan import StageMemory
from planner.artifacts.profile import Profile
from planner.cost.collectives import allreduce_ms, link_of, p2p_ms, ring_allreduce_ms
from planner.graph import cut_bytes_per_sample


@dataclass(frozen=True, slots=True)
class StageCost:
    """Per-micro-batch times (ms) and per-device memory of one stage."""

    fwd_ms: float
    bwd_ms: float
    recompute_ms: float
    send_fwd_ms: float
    send_bwd_ms: float
    allreduce_ms: float
    activation_bytes_per_microbatch: int
    memory: StageMemory


class CostModel:
    """Prefix sums over a profile, so that any stage's cost is O(1) (plus its recompute set).

    One instance per (per-device profile, cluster, optimizer); per micro-batch size arrays are
    cached.
    """

    def __init__(
        self, profile: Profile, cluster: Cluster, optimizer: OptimizerKind = OptimizerKind.ADAM_MIXED, *,
        tp_degree: int = 1, sequence_parallel: bool = False,
    ):
        """``profile`` is what one device runs: the model itself, or with ``tp_degree`` > 1 its
        per-device view (:func:`planner.cost.tensor_parallel.tensor_parallel_view`), which the
        layouts this model prices then have as their tensor-parallel degree."""
        self.profile = profile
        self.cluster = cluster
        self.optimizer = optimizer
        self.tp_degree = tp_degree
        self.sequence_parallel = sequence_parallel
        self.weight_bytes_per_param, self.grad_bytes_per_param, self.optim_bytes_per_param = optimizer.state_bytes_per_param
        layers = profile.layers
        self.num_layers = len(layers)
        self.cut_bytes_per_sample = cut_bytes_per_sample(profile)
        self.param_count = np.array([layer.param_count for layer in layers], dtype=np.int64)
        self.saved_per_sample = np.array([layer.saved_bytes_per_sample for layer in layers])
        self.input_per_sample = np.array([layer.input_bytes_per_sample for layer in layers])
        self._param_prefix = np.concatenate([[0], np.cumsum(self.param_count)])
        self._saved_prefix = np.concatenate([[0.0], np.cumsum(self.saved_per_sample)])
        self._speed = cluster.relative_speed
        self._layer_times: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._time_prefix: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    # ---------------------------------------------------------------- ZeRO
    def state_bytes_per_param(self, sharding: Sharding = Sharding()) -> tuple[float, float, float]:
        """(weights, gradients, optimizer state) bytes per parameter at the peak on one device
        of a stage whose state is divided as ``sharding`` says."""
        w, g, o = self.weight_bytes_per_param, self.grad_bytes_per_param, self.optim_bytes_per_param
        # gradients: whole at the peak under every stage (see the module docstring on ZeRO 2)
        return float(w), float(g), o / sharding.ranks if sharding.zero >= ZeroStage.OPTIMIZER else float(o)

    def sync_bytes_per_param(self, zero: ZeroStage = ZeroStage.NONE) -> float:
        """Bytes per parameter the gradient synchronisation moves, priced on the all-reduce line:
        the gradients (all-reduce), or the mean of gradients and weights (reduce-scatter +
        all-gather, ZeRO 1 and 2)."""
        if zero is ZeroStage.NONE:
            return float(self.grad_bytes_per_param)
        return (self.grad_bytes_per_param + self.weight_bytes_per_param) / 2.0

    # ---------------------------------------------------------------- compute
    def layer_times(self, microbatch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Per-layer (forward ms, backward ms) at one micro-batch size on this cluster (cached
        on the instance, so a cost model and its arrays are freed together)."""
        if microbatch_size not in self._layer_times:
            fwd = np.array([layer.fwd_ms(microbatch_size) for layer in self.profile.layers]) / self._speed
            bwd = np.array([layer.bwd_ms(microbatch_size) for layer in self.profile.layers]) / self._speed
            self._layer_times[microbatch_size] = (fwd, bwd)
        return self._layer_times[microbatch_size]

    def time_prefix(self, microbatch_size: int) -> tuple[np.ndarray, np.ndarray]:
        if microbatch_size not in self._time_prefix:
            fwd, bwd = self.layer_times(microbatch_size)
            self._time_prefix[microbatch_size] = (np.concatenate([[0.0], np.cumsum(fwd)]),
                                                  np.concatenate([[0.0], np.cumsum(bwd)]))
        return self._time_prefix[microbatch_size]

    def stage_fwd_ms(self, start: int, stop: int, microbatch_size: int) -> float:
        fp, _ = self.time_prefix(microbatch_size)
        return float(fp[stop] - fp[start])

    def stage_bwd_ms(self, start: int, stop: int, microbatch_size: int) -> float:
        _, bp = self.time_prefix(microbatch_size)
        return float(bp[stop] - bp[start])

    def recompute_ms(self, recompute: Iterable[int], microbatch_size: int) -> float:
        fwd, _ = self.layer_times(microbatch_size)
        return float(sum(fwd[i] for i in recompute))

    # ---------------------------------------------------------------- parameters
    def stage_param_count(self, start: int, stop: int) -> int:
        """Parameters held by a stage; a tied tensor whose layers share the stage counts once."""
        count = int(self._param_prefix[stop] - self._param_prefix[start])
        for tie in self.profile.tied:
            inside = sum(1 for i in tie.layers if start <= i < stop)
            if inside >= 2:
                count -= (inside - 1) * tie.param_count
        return count

    def tied_allreduce_bytes(self, start: int, stop: int) -> float:
        """Gradient bytes of tied tensors this stage shares with another stage (summed across them)."""
        total = 0.0
        for tie in self.profile.tied:
            inside = sum(1 for i in tie.layers if start <= i < stop)
            if 0 < inside < len(tie.layers):
                total += tie.param_count * self.grad_bytes_per_param
        return total

    # ---------------------------------------------------------------- activations
    def activation_bytes(self, start: int, stop: int, recompute: Iterable[int], microbatch_size: int) -> float:
        """Bytes one in-flight micro-batch keeps on a stage: saved tensors, or inputs if recomputed."""
        total = float(self._saved_prefix[stop] - self._saved_prefix[start])
        for i in recompute:
            total += self.input_per_sample[i] - self.saved_per_sample[i]
        return total * microbatch_size

    def recompute_workspace_bytes(self, recompute: Iterable[int], microbatch_size: int) -> float:
        """The largest recomputed layer's saved tensors, live while its backward runs."""
        return max((float(self.saved_per_sample[i]) for i in recompute), default=0.0) * microbatch_size

    def buffer_bytes(self, start: int, stop: int, microbatch_size: int) -> float:
        """Receive and send buffers: boundary activations in/out and their gradients, one micro-batch."""
        cut = self.cut_bytes_per_sample
        return 2.0 * float(cut[start] + cut[stop]) * microbatch_size

    # ---------------------------------------------------------------- assembled
    def stage_memory(
        self, start: int, stop: int, recompute: Sequence[int], microbatch_size: int, inflight: int,
        sharding: Sharding = Sharding(),
    ) -> StageMemory:
        """Memory of one device of the stage at its peak, its model state divided as ``sharding``
        says (gradients stay whole at the peak, see the module docstring)."""
        params = self.stage_param_count(start, stop)
        w, g, o = self.state_bytes_per_param(sharding)
        return StageMemory(
            param_bytes=int(params * w),
            grad_bytes=int(params * g),
            optimizer_bytes=int(params * o),
            activation_bytes=int(round(inflight * self.activation_bytes(start, stop, recompute, microbatch_size))),
            recompute_workspace_bytes=int(round(self.recompute_workspace_bytes(recompute, microbatch_size))),
            buffer_bytes=int(round(self.buffer_bytes(start, stop, microbatch_size))),
        )

    def boundary_transfer_ms(self, boundary: int, microbatch_size: int, upstream_stage_idx: int, layout: Layout) -> float:
        """Transfer of the tensors crossing the cut before layer ``boundary`` between stage
        ``upstream_stage_idx`` and the next one (activations forward, their gradients backward:
        same bytes), on the link between the first devices of the two stages."""
        if boundary <= 0 or boundary >= self.num_layers:
            return 0.0
        nbytes = float(self.cut_bytes_per_sample[boundary]) * microbatch_size
        src = layout.rank_of(stage_idx=upstream_stage_idx)
        dst = layout.rank_of(stage_idx=upstream_stage_idx + 1)
        bw, lat = link_of(self.cluster, src, dst)
        return p2p_ms(nbytes, bandwidth_gb_per_s=bw, latency_us=lat)

    def stage_allreduce_ms(self, start: int, stop: int, stage_idx: int, layout: Layout) -> float:
        """Gradient synchronisation across the stage's data-parallel group (all-reduce, or with
        ZeRO reduce-scatter + all-gather), plus the exchange of tied gradients with the other
        stage holding the tied tensor (priced on the slowest link of the cluster, since the
        partner stage is not known here)."""
        sync_bytes = self.stage_param_count(start, stop) * self.sync_bytes_per_param(layout.zero)
        total = allreduce_ms(self.cluster, sync_bytes, layout.dp_group(stage_idx))
        tied = self.tied_allreduce_bytes(start, stop)
        if tied:
            if self.cluster.num_nodes > 1:
                bw, lat = self.cluster.inter_node_bandwidth_gb_per_s, self.cluster.inter_node_latency_us
            else:
                bw, lat = self.cluster.intra_node_bandwidth_gb_per_s, self.cluster.intra_node_latency_us
            total += ring_allreduce_ms(tied, 2, bandwidth_gb_per_s=bw, latency_us=lat)
        return total

    def stage_cost(
        self, start: int, stop: int, recompute: Sequence[int], microbatch_size: int, inflight: int, stage_idx: int,
        layout: Layout,
    ) -> StageCost:
        """Stage ``stage_idx`` of ``layout`` priced."""
        return StageCost(
            fwd_ms=self.stage_fwd_ms(start, stop, microbatch_size),
            bwd_ms=self.stage_bwd_ms(start, stop, microbatch_size),
            recompute_ms=self.recompute_ms(recompute, microbatch_size),
            send_fwd_ms=self.boundary_transfer_ms(stop, microbatch_size, stage_idx, layout),
            send_bwd_ms=self.boundary_transfer_ms(start, microbatch_size, stage_idx - 1, layout),
            allreduce_ms=self.stage_allreduce_ms(start, stop, stage_idx, layout),
            activation_bytes_per_microbatch=int(round(self.activation_bytes(start, stop, recompute, microbatch_size))),
            memory=self.stage_memory(start, stop, recompute, microbatch_size, inflight, layout.sharding(stage_idx)),
        )

    @cached_property
    def total_params(self) -> int:
        return self.stage_param_count(0, self.num_layers)
