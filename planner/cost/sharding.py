"""The ZeRO part of the cost model: a stage's parameters (ties once, the same prefix sums as
:mod:`planner.cost.prefix`'s), model-state bytes per parameter under each sharding stage,
the bytes the gradient synchronisation moves, ZeRO 2's reduce-scatter every micro-batch, ZeRO
3's per-layer collectives and working set (a base class of :class:`planner.cost.model.CostModel`;
formulas in that module's and :mod:`planner.cost.fsdp`'s docstrings).

ZeRO 2 (DeepSpeed's ZeRO-2; FSDP with ``reshard_after_forward=False``): every micro-batch's
gradients are reduce-scattered as its backward produces them, so a rank holds ``1/n`` of them at
the peak. That reduce-scatter, ``r`` ms per micro-batch (half the gradient group's all-reduce
line on the stage's gradient bytes, one latency per bucket of the stack), runs on the
communication stream: with the stack's ``zero_reduce_overlap`` beside the micro-batch's own
computation, so that only ``max(0, r - F - B)`` lengthens its backward (the stream has to carry
``r`` per micro-batch while the device computes ``F + B``); without it, all of ``r``.

Routed experts (:mod:`planner.cost.experts`): their state is sharded over the stage's expert
data-parallel group (``Sharding.expert_shards``), not its data-parallel one, so a stage's model
state is ``kappa x dense + kappa_e x experts`` (:meth:`ShardedState.stage_state_bytes`), and
under ZeRO 3 each layer's experts are gathered and reduce-scattered over that group (its ranks
``ep x etp`` apart from the first of a pipeline rank's block, assumed to start a node)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from planner.artifacts.cluster import Cluster
from planner.artifacts.kinds import ZeroStage
from planner.artifacts.layout import DeviceGroup, Layout, Sharding
from planner.artifacts.stack import Stack
from planner.cost.collectives import allreduce_line, gather_line, grad_group_line
from planner.cost.fsdp import FsdpTerms, fsdp_terms, hsdp_groups
from planner.cost.prefix import PrefixSums


def is_fsdp(sharding: Sharding) -> bool:
    """ZeRO 3 over more than one rank (one rank shards nothing): the sharding whose weights are
    gathered layer by layer (:mod:`planner.cost.fsdp` prices that communication)."""
    return sharding.zero is ZeroStage.PARAMETERS and sharding.ranks > 1


def fsdp_line(cluster: Cluster, layout: Layout) -> tuple[float, float]:
    """(ms per byte, fixed ms) of one all-gather or reduce-scatter over a stage's gradient
    group (its data-parallel x context-parallel ranks, :meth:`Layout.grad_group`): half the
    ring all-reduce's line (NCCL has no tree all-gather or reduce-scatter:
    :func:`planner.cost.collectives.gather_line`), of the layout's slowest group (one line for the
    whole layout, so that every stage of a configuration is priced alike: :mod:`planner.cost.fsdp`). HSDP
    (``Layout.shard_group_size``): over its shard group, the consecutive ranks the state is
    sharded over (a node, by default)."""
    if layout.shard_group_size:
        lines = [allreduce_line(cluster, hsdp_groups(layout, s)[0], ring_only=True) for s in range(layout.num_stages)]
    else:
        lines = [grad_group_line(cluster, layout, s, ring_only=True) for s in range(layout.num_stages)]
    per_byte, fixed = max(lines)
    return 0.5 * per_byte, 0.5 * fixed


@dataclass(frozen=True, slots=True, kw_only=True)
class StateTables:
    """What one sharding makes of every stage ``[i, j)``'s model state, at ``[i, j]`` (arrays
    read-only where the cost model caches them; :meth:`ShardedState.state_tables`)."""

    param_count: np.ndarray  # the stage's parameters, ties once (ShardedState.stage_param_matrix)
    state_bytes: np.ndarray  # its model state on one device at the peak (ShardedState.stage_state_matrix)
    state_bytes_per_param: float  # kappa: at the peak, weights + gradients + optimizer state
    sync_bytes_per_param: float  # synchronised after the last backward (post_backward_sync_bytes_per_param)


class ShardedState(PrefixSums):
    """ZeRO pricing over the attributes a :class:`~planner.cost.model.CostModel` sets."""

    cluster: Cluster
    stack: Stack
    group: DeviceGroup
    has_experts: bool
    weight_bytes_per_param: int
    fp8_param_count: np.ndarray
    fp8_extra_bytes_per_param: int  # an FP8 parameter's copies beyond its weights (planner.cost.precision)
    grad_bytes_per_param: int
    optim_bytes_per_param: int
    step_bytes_per_param: int
    _fsdp: dict[tuple[int, float, float, int], FsdpTerms]
    _fsdp_lines: dict[Layout, tuple[float, float]]

    def grad_line(self, layout: Layout, stage_idx: int) -> tuple[float, float]:
        raise NotImplementedError

    # ---------------------------------------------------------------- parameters (ties once)
    @cached_property
    def param_prefix(self) -> np.ndarray:
        """Parameters of layers ``0..l-1`` at ``[l]`` (integers; ties counted per layer)."""
        out: np.ndarray = np.concatenate([[0], np.cumsum(self.param_count)])
        return out

    @cached_property
    def expert_prefix(self) -> np.ndarray:
        """Routed experts' parameters of layers ``0..l-1`` at ``[l]`` (never tied)."""
        out: np.ndarray = np.concatenate([[0], np.cumsum(self.expert_param_count)])
        return out

    def stage_param_count(self, start: int, stop: int) -> int:
        """Parameters held by a stage; a tied tensor whose layers share the stage counts once."""
        count = int(self.param_prefix[stop] - self.param_prefix[start])
        for tie in self.profile.tied:
            inside = sum(1 for i in tie.layers if start <= i < stop)
            if inside >= 2:
                count -= (inside - 1) * tie.param_count
            if inside and tie.name in self.rank_local_ties and not start <= min(tie.layers) < stop:
                count -= tie.param_count  # the rank's copy is its first layer's chunk's
        return count

    def stage_expert_param_count(self, start: int, stop: int) -> int:
        """Of :meth:`stage_param_count`, the routed experts' (held on this device)."""
        return int(self.expert_prefix[stop] - self.expert_prefix[start])

    def stage_expert_param_matrix(self) -> np.ndarray:
        """:meth:`stage_expert_param_count` of every stage ``[i, j)`` at ``[i, j]`` (floats; read-only,
        worked out once per cost model)."""
        return self._expert_matrix

    @cached_property
    def _expert_matrix(self) -> np.ndarray:
        return _read_only(_stage_sums(self.expert_prefix))

    def stage_param_matrix(self) -> np.ndarray:
        """:meth:`stage_param_count` of every stage ``[i, j)`` at ``[i, j]`` (floats; read-only,
        worked out once per cost model)."""
        return self._param_matrix

    @cached_property
    def _param_matrix(self) -> np.ndarray:
        L = self.num_layers
        idx = np.arange(L + 1)
        out = _stage_sums(self.param_prefix)
        for tie in self.profile.tied:
            inside = np.zeros((L + 1, L + 1))
            for layer in tie.layers:
                inside += (idx[:, None] <= layer) & (idx[None, :] > layer)
            out -= np.maximum(inside - 1, 0) * tie.param_count
            if tie.name in self.rank_local_ties:
                first = min(tie.layers)
                holds_first = (idx[:, None] <= first) & (idx[None, :] > first)
                out -= ((inside > 0) & ~holds_first) * tie.param_count
        return _read_only(out)

    # ---------------------------------------------------------------- model state
    def state_bytes_per_param(self, sharding: Sharding = Sharding()) -> tuple[float, float, float]:
        """(weights, gradients, optimizer state) bytes per parameter at the peak on one device
        of a stage whose state is divided as ``sharding`` says."""
        w, g, o = self.weight_bytes_per_param, self.grad_bytes_per_param, self.optim_bytes_per_param
        n = sharding.ranks
        if is_fsdp(sharding):  # ZeRO 3: all of it (its gathered working set: CostModel.stage_memory's)
            return w / n, g / n, o / n
        # gradients: 1/n under ZeRO 2, reduce-scattered every micro-batch (module docstring)
        return float(w), g / n if sharding.zero is ZeroStage.GRADIENTS else float(g), \
            o / n if sharding.zero >= ZeroStage.OPTIMIZER else float(o)

    def expert_state_bytes_per_param(self, sharding: Sharding = Sharding()) -> tuple[float, float, float]:
        """:meth:`state_bytes_per_param` of the routed experts' parameters (sharded over the
        expert data-parallel group)."""
        return self.state_bytes_per_param(Sharding(sharding.zero, sharding.expert_shards))

    def state_bytes(self, sharding: Sharding = Sharding()) -> tuple[float, float]:
        """(dense, expert) model-state bytes per parameter at the peak under ``sharding``."""
        return sum(self.state_bytes_per_param(sharding)), sum(self.expert_state_bytes_per_param(sharding))

    def stage_state_bytes(self, start: int, stop: int, sharding: Sharding = Sharding()) -> float:
        """Model-state bytes (weights, gradients, optimizer state) of the stage's parameters on one
        device at the peak: ``kappa`` per dense and ``kappa_e`` per expert parameter (module
        docstring; ZeRO 3's gathered working set apart)."""
        kappa, kappa_e = self.state_bytes(sharding)
        state = self.stage_param_count(start, stop) * kappa
        if self.has_experts:
            state += self.stage_expert_param_count(start, stop) * (kappa_e - kappa)
        extra = self.fp8_extra_bytes_per_param
        if extra and self.fp8_param_count.any() and not is_fsdp(sharding):  # FP8 copies (planner.cost.precision)
            state += extra * float(self.fp8_param_count[start:stop].sum())
        return state

    def stage_state_matrix(self, sharding: Sharding = Sharding()) -> np.ndarray:
        """:meth:`stage_state_bytes` of every stage ``[i, j)`` at ``[i, j]``."""
        kappa, kappa_e = self.state_bytes(sharding)
        out: np.ndarray = self.stage_param_matrix() * kappa
        if self.has_experts:
            out = out + self.stage_expert_param_matrix() * (kappa_e - kappa)
        extra = self.fp8_extra_bytes_per_param
        if extra and self.fp8_param_count.any() and not is_fsdp(sharding):  # FP8 copies (planner.cost.precision)
            pp = np.concatenate([[0], np.cumsum(self.fp8_param_count)]).astype(float)
            out = out + extra * np.maximum(pp[None, :] - pp[:, None], 0.0)
        return out

    def least_state_bytes_per_param(self, sharding: Sharding = Sharding()) -> float:
        """The fewest model-state bytes any parameter takes under ``sharding`` (a floor's)."""
        kappa, kappa_e = self.state_bytes(sharding)
        return min(kappa, kappa_e) if self.has_experts else kappa

    def state_tables(self, sharding: Sharding) -> StateTables:
        """The :class:`StateTables` of ``sharding``: the questions a stage table asks of it, in one
        call (HSDP's all-reduce of the gradient shards where the sharding has replicas)."""
        return StateTables(param_count=self.stage_param_matrix(), state_bytes=self.stage_state_matrix(sharding),
                           state_bytes_per_param=sum(self.state_bytes_per_param(sharding)),
                           sync_bytes_per_param=self.post_backward_sync_bytes_per_param(
                               sharding.zero, sharding.ranks if sharding.replicas > 1 else 0))

    def sync_bytes_per_param(self, zero: ZeroStage = ZeroStage.NONE) -> float:
        """Bytes per parameter the gradient synchronisation moves, priced on the all-reduce line:
        the gradients (all-reduce), or the mean of gradients and weights (reduce-scatter +
        all-gather, ZeRO 1 and 2)."""
        if zero is ZeroStage.NONE:
            return float(self.grad_bytes_per_param)
        return (self.grad_bytes_per_param + self.weight_bytes_per_param) / 2.0

    def post_backward_sync_bytes_per_param(self, zero: ZeroStage = ZeroStage.NONE, hsdp_shards: int = 0) -> float:
        """Of :meth:`sync_bytes_per_param`, what runs after the stage's last backward: all of
        it, unless the stack gathers ZeRO's weights ahead of the next forward (then the
        reduce-scatter's half); none under ZeRO 3 (its collectives run per layer and micro-batch),
        but HSDP's all-reduce of each shard's gradients across the groups (``hsdp_shards`` ranks
        per shard group: 1/that of the gradients), priced on the stage's gradient-group line (its
        inter-node part is the groups' own: one rank per node carries 1/k of the bytes)."""
        if zero is ZeroStage.PARAMETERS:
            return self.grad_bytes_per_param / hsdp_shards if hsdp_shards else 0.0
        if zero is not ZeroStage.NONE and self.stack.param_gather_overlap:
            return self.grad_bytes_per_param / 2.0
        return self.sync_bytes_per_param(zero)

    def stage_times_ms(self, start: int, stop: int, microbatch_size: int, stage_idx: int, layout: Layout) -> tuple[float, float]:
        """(forward, backward) ms of one micro-batch on stage ``stage_idx`` of ``layout``: under
        ZeRO 3 with what its per-layer gathers and reduce-scatters add (:mod:`planner.cost.fsdp`).
        (ZeRO 2's reduce-scatter every micro-batch is added to a plan's stage by
        :func:`planner.cost.stage.price_stage`, not here: the chain solvers' tables price a stage as its layers.)"""
        if is_fsdp(layout.sharding(stage_idx)):
            return self.fsdp_terms(microbatch_size, self.fsdp_line(layout), layout.sharding(stage_idx)).stage(start, stop)
        fp, bp = self.at_batch(microbatch_size).prefix_ms
        return float(fp[stop] - fp[start]), float(bp[stop] - bp[start])

    def microbatch_reduce_ms(self, start: int, stop: int, stage_idx: int, layout: Layout) -> float:
        """ZeRO 2's reduce-scatter of one micro-batch's gradients of the stage (module docstring)."""
        nbytes = self.stage_param_count(start, stop) * self.grad_bytes_per_param
        if nbytes <= 0:
            return 0.0
        per_byte, fixed = self.grad_line(layout, stage_idx)
        buckets = max(1, -(-int(nbytes) // self.stack.grad_bucket_bytes))
        return 0.5 * (per_byte * nbytes + fixed * buckets)

    def hsdp_allreduce_ms(self, start: int, stop: int, stage_idx: int, layout: Layout) -> float:
        """HSDP's all-reduce across the shard groups after the last backward: each rank's
        gradient shard (1/``shard_group_size`` of the stage's gradients), among the ranks holding
        the same shard, one per group (:func:`planner.cost.fsdp.hsdp_groups`); 0 without HSDP."""
        if not layout.shard_group_size:
            return 0.0
        per_byte, fixed = allreduce_line(self.cluster, hsdp_groups(layout, stage_idx)[1])
        nbytes = self.stage_param_count(start, stop) * self.grad_bytes_per_param / layout.shard_group_size
        return per_byte * nbytes + fixed

    def fsdp_line(self, layout: Layout) -> tuple[float, float]:
        """ZeRO 3's all-gather / reduce-scatter line for ``layout`` (:func:`fsdp_line`, cached)."""
        if layout not in self._fsdp_lines:
            self._fsdp_lines[layout] = fsdp_line(self.cluster, layout)
        return self._fsdp_lines[layout]

    def fsdp_terms(self, microbatch_size: int, line: tuple[float, float], sharding: Sharding = Sharding()) -> FsdpTerms:
        """ZeRO 3's per-layer time terms at one micro-batch size and collective line (cached);
        the routed experts' on their expert data-parallel group's line (``sharding``'s)."""
        key = (microbatch_size, *line, sharding.expert_shards if self.has_experts else 0)
        if key not in self._fsdp:
            fwd, bwd = self.at_batch(microbatch_size).times_ms
            if not self.has_experts:
                moved = self.param_count > 0
                # FP8 parameters are gathered in FP8 (1 byte each: planner.cost.precision)
                gathered = self.param_count * self.weight_bytes_per_param - self.fp8_param_count * (self.weight_bytes_per_param - 1)
                gather = np.where(moved, line[0] * gathered + line[1], 0.0)
                scatter = np.where(moved, line[0] * self.param_count * self.grad_bytes_per_param + line[1], 0.0)
            else:
                gather, scatter = self._expert_fsdp(line, self.expert_fsdp_line(sharding))
            self._fsdp[key] = fsdp_terms(fwd, bwd, gather, scatter, self.stack.fsdp_prefetch)
        return self._fsdp[key]

    def _expert_fsdp(self, line: tuple[float, float], expert: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
        """Per layer the gather and reduce-scatter of its dense parameters on ``line`` and of its
        experts' on ``expert`` (one stream: their sum)."""
        dense = self.param_count - self.expert_param_count
        out = []
        for per_param in (self.weight_bytes_per_param, self.grad_bytes_per_param):
            d = np.where(dense > 0, line[0] * dense * per_param + line[1], 0.0)
            e = np.where(self.expert_param_count > 0, expert[0] * self.expert_param_count * per_param + expert[1], 0.0)
            out.append(d + e)
        return out[0], out[1]

    def expert_fsdp_line(self, sharding: Sharding) -> tuple[float, float]:
        """One all-gather or reduce-scatter over the expert data-parallel group ``sharding`` names
        (``expert_shards`` ranks ``ep x etp`` apart: module docstring): half the ring all-reduce's line."""
        stride = self.group.ep_degree * self.group.etp_degree
        return gather_line(self.cluster, range(0, sharding.expert_shards * stride, stride))

    def least_fsdp_comm_ms(self, microbatch_size: int, layout: Layout, sharding: Sharding, hsdp_shards: int = 0) -> float:
        """:meth:`fsdp_comm_ms` on the cheaper of ``layout``'s ZeRO 3 line and, where
        ``hsdp_shards`` > 0, its HSDP variant's (shard groups of that many ranks): a bound's, a
        whole-group ZeRO 3 configuration standing for that variant too."""
        line = self.fsdp_line(layout)
        if hsdp_shards:
            other = self.fsdp_line(dataclasses.replace(layout, shard_group_size=hsdp_shards))
            line = (min(line[0], other[0]), min(line[1], other[1]))
        return self.fsdp_comm_ms(microbatch_size, line, sharding)

    def fsdp_comm_ms(self, microbatch_size: int, line: tuple[float, float], sharding: Sharding = Sharding()) -> float:
        """ZeRO 3's communication per micro-batch over the whole model: two gathers and one
        reduce-scatter per layer (``sum_k 2 a_k + r_k``)."""
        terms = self.fsdp_terms(microbatch_size, line, sharding)
        return float(2.0 * terms.gather.sum() + terms.scatter.sum())


def _stage_sums(prefix: np.ndarray) -> np.ndarray:
    """Every stage ``[i, j)``'s sum at ``[i, j]`` from prefix sums (floats; a new array)."""
    out: np.ndarray = (prefix[None, :] - prefix[:, None]).astype(float)
    return out


def _read_only(out: np.ndarray) -> np.ndarray:
    out.flags.writeable = False
    return out
