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
- zero bubble (Qi et al. 2024) splits the backward into B and W: ``W = sum_l w_l b_l(b)``, and
  a micro-batch keeps ``sum_l s_l A_l(b)`` from B to W (``w_l, s_l``: ``Layer.wgrad_*``).
- point-to-point: ``alpha + bytes / beta`` on the link the two ranks share (intra- or inter-node).
- all-reduce of the stage's gradients (ring, Patarasuk & Yuan 2009):
  ``2 (d-1)/d x bytes/beta + 2 (d-1) alpha``; when the replicas span ``n`` nodes with ``k`` per
  node, hierarchical (reduce-scatter in the node, ring across nodes on 1/k of the data,
  all-gather in the node; as NCCL's tree/2D algorithms, Jia et al. 2018 "Highly Scalable Deep
  Learning Training System with Mixed-Precision").
- ZeRO (Rajbhandari et al. 2020) over a stage's ``n`` ranks: stage 1 keeps 1/n of the optimizer
  state per rank; stage 2 also 1/n of the gradients, at the peak too: each micro-batch's
  gradients are reduce-scattered as its backward produces them and each rank accumulates only
  its shard (DeepSpeed's ZeRO-2, FSDP's ``reshard_after_forward=False``), at the price of a
  reduce-scatter every micro-batch -- M times ZeRO 1's traffic (what of it the micro-batch's own
  forward and backward cannot hide lengthens its backward in the plan, :func:`planner.cost.stage.price_stage`; the
  last micro-batch's is the synchronisation below; buckets in flight not counted, as under ZeRO 1).
  The gradient all-reduce becomes a reduce-scatter of the gradients and, after each rank steps its
  shard, an all-gather of the weights. A ring all-reduce *is* a reduce-scatter then an all-gather of the same bytes
  (Patarasuk & Yuan 2009), so the pair costs the all-reduce line at the mean of the two byte
  counts: ``(grad bytes + weight bytes) / 2`` per parameter (the same time for ``adam-mixed``).
  It is accounted like the all-reduce: it starts when the stage's last backward ends and
  overlaps the other stages' cooldown (the weights' all-gather waits for the shard's step,
  which the simulator runs after the sync: ``optimizer_ms``, :mod:`planner.cost.sharding`).
- memory per device: kappa x params (weights, gradients, optimizer state by
  :data:`STATE_BYTES_PER_PARAM`, sharded as above) + k x activations per micro-batch (k in-flight micro-batches;
  a recomputed layer keeps only its input) + the largest recompute working set (the saved
  tensors of one recomputed layer, live during its backward) + send/receive buffers (the
  boundary activations in and out, and their gradients, one micro-batch each).
- recompute levels per layer (Korthikanti et al. 2022 sec. 4): a layer in ``R`` (full) keeps
  its input ``in_l`` instead of its saved bytes ``A_l`` and re-runs its forward ``f_l``; a layer
  in ``S`` (selective, one with a ``Layer.attention_core``) keeps ``A_l - C_l`` (its saved bytes
  less its attention core's ``C_l``) and re-runs the core's forward ``c_l``; its working set is
  ``C_l``. Per micro-batch of ``b`` samples, a stage's activations are

      sum_l A_l(b) - sum_{pairs (p, q) in the stage, p not in R} shared(b) + sum_{l in R} (in_l(b) - A_l(b))
      - sum_{l in S} C_l(b),

  with ``A_l(b) = fixed_l + per_sample_l x b`` (bytes that do not grow with the micro-batch
  fitted as such) and a storage two of the stage's layers ``p < q`` both save
  (``Profile.shared_saved``) counted once -- unless ``p`` is fully recomputed: it then keeps its
  input instead, and ``q`` alone holds the storage (``q``'s own level does not matter: fully
  recomputed it keeps its input, which holds the storage too). So recomputing ``p`` fully frees
  ``A_p - in_p`` less what later layers of the stage share with it: still one number per layer
  and stage, so the knapsack stays a knapsack (:meth:`CostModel.shared_out`). The stage's output is freed once sent (the
  runtime keeps only what autograd saved, as Megatron-LM's ``deallocate_output_tensor``): it
  is the send buffer, one micro-batch, not ``k``.
- ZeRO 3 (FSDP, :mod:`planner.cost.fsdp`): weights, gradients and optimizer state / n, plus
  the gathered working set of the layers in flight; each layer's weights all-gathered before
  its forward and its backward and its gradients reduce-scattered, every micro-batch, in the
  stage's forward and backward times (:meth:`CostModel.stage_times_ms`), nothing after the last
  backward but the tied exchange.
- what the training stack overlaps (:class:`~planner.artifacts.stack.Stack`, recorded in the
  request and the plan): the synchronisation is split into its reduction (all-reduce, or
  ZeRO's reduce-scatter: half the all-reduce's line) and ZeRO's all-gather (the other half),
  and :meth:`CostModel.stage_sync` prices when each may run (:mod:`planner.cost.overlap`).
- routed experts (:mod:`planner.cost.experts`; the profile's per-device view holds each MoE
  layer's experts' parameters on this device in ``Layer.moe``): their model state is sharded,
  and their gradients synchronised, over the stage's expert data-parallel group
  (:meth:`Layout.edp_group`) instead of its data-parallel one: :mod:`planner.cost.sharding`'s
  ``kappa_e`` and, in :meth:`CostModel.stage_sync`, a second synchronisation on that group's
  line after the first (the same bucketed overlap with the last backward).
"""

from __future__ import annotations

import numpy as np

from planner.artifacts.cluster import Cluster
from planner.artifacts.kinds import OptimizerKind
from planner.artifacts.layout import ONE_DEVICE, DeviceGroup, Layout, Sharding
from planner.artifacts.profile import Profile
from planner.artifacts.stack import DEFAULT_STACK, Stack
from planner.cost.fsdp import FsdpTerms
from planner.cost.memory import MemoryCosts
from planner.cost.precision import fp8_copies
from planner.cost.prefix import BatchSums
from planner.cost.sharding import StateTables
from planner.cost.stage import StageCosts
from planner.graph import cut_bytes_per_sample


class CostModel(StageCosts, MemoryCosts):
    """Prefix sums over a profile, so that any stage's cost is O(1) (plus its recompute set).

    One instance per (per-device profile, cluster, optimizer); per micro-batch size arrays are
    cached. Built here from its base classes, one room each: the per-layer arrays and their sums
    (:mod:`planner.cost.prefix`), the model state under ZeRO (:mod:`planner.cost.sharding`),
    ZeRO's collectives (:mod:`planner.cost.zero_comm`), a stage's time terms
    (:mod:`planner.cost.stage`) and its memory (:mod:`planner.cost.memory`).
    """

    def __init__(
        self, profile: Profile, cluster: Cluster, optimizer: OptimizerKind = OptimizerKind.ADAM_MIXED, *,
        group: DeviceGroup = ONE_DEVICE, stack: Stack = DEFAULT_STACK, gather_bytes_per_sample: float = 0.0,
        offload_optimizer: bool = False,
    ):
        """``profile`` is what one device of ``group`` runs (the devices a stage replica spans,
        :attr:`Layout.group <planner.artifacts.layout.Layout.group>` of every layout this model
        prices): the model itself, or with tensor parallelism its per-device view
        (:func:`planner.cost.tensor_parallel.tensor_parallel_view`), with context parallelism
        also its context-parallel view (:mod:`planner.cost.context`), whose
        ``gather_bytes_per_sample`` is one layer's gathered keys and values (in the buffers).
        ``stack``: what the training stack overlaps (its tensor-parallel overlap is in the view's
        times). ``offload_optimizer``: the optimizer state and master weights on the host (the
        device's offload view, :func:`planner.cost.offload.offload_view`, as its folded layers)."""
        self.profile = profile
        self.cluster = cluster
        self.optimizer = optimizer
        self.stack = stack
        self.group = group
        self.gather_bytes_per_sample = gather_bytes_per_sample
        self.weight_bytes_per_param, self.grad_bytes_per_param, self.optim_bytes_per_param = optimizer.state_bytes_per_param
        self.step_bytes_per_param = optimizer.step_bytes_per_param
        #: optimizer state and master weights on the host (planner.cost.offload): none on the device
        self.offload_optimizer = offload_optimizer
        if self.offload_optimizer:
            self.optim_bytes_per_param = 0
        layers = profile.layers
        self.num_layers = len(layers)
        cores = self.attention_cores = tuple(layer.attention_core for layer in layers)
        self.cut_bytes_per_sample = cut_bytes_per_sample(profile)
        self.param_count = np.array([layer.param_count for layer in layers], dtype=np.int64)
        self.expert_param_count = np.array([layer.moe.expert_param_count if layer.moe else 0 for layer in layers],
                                           dtype=np.int64)
        self.has_experts = bool(self.expert_param_count.any())
        #: per layer its FP8 GEMMs' parameters when the profile is priced at an FP8 precision, and the
        #: bytes each one's copy adds (planner.cost.precision)
        copies = fp8_copies(profile, self.weight_bytes_per_param)
        self.fp8_param_count = np.array(copies.param_count, dtype=np.int64)
        self.fp8_extra_bytes_per_param = copies.extra_bytes_per_param
        self._expert_lines: dict[tuple[Layout, int], tuple[float, float]] = {}
        self.saved_per_sample = np.array([layer.saved_bytes_per_sample for layer in layers])
        self.saved_fixed = np.array([layer.saved_bytes_fixed for layer in layers])
        self.input_per_sample = np.array([layer.input_bytes_per_sample for layer in layers])
        self.core_per_sample = np.array([c.saved_bytes_per_sample if c else 0.0 for c in cores])
        self.wgrad_fraction = np.array([layer.wgrad_fraction for layer in layers])
        self.wgrad_saved_fraction = np.array([layer.wgrad_saved_fraction for layer in layers])
        self.core_fixed = np.array([c.saved_bytes_fixed if c else 0.0 for c in cores])
        #: layers with a selective recompute level (an attention core)
        self.has_core = np.array([c is not None for c in cores], dtype=bool)
        self.selective = bool(self.has_core.any())  # some layer has a selective recompute level
        self._speed = cluster.relative_speed
        self._batches: dict[int, BatchSums] = {}
        self._shared: dict[int, np.ndarray] = {}
        self._fsdp: dict[tuple[int, float, float, int], FsdpTerms] = {}
        self._fsdp_lines: dict[Layout, tuple[float, float]] = {}
        self._state_tables: dict[Sharding, StateTables] = {}
