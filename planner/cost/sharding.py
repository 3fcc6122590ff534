"""The ZeRO part of the cost model's memory: a stage's parameters (ties once, the same prefix sums as
:mod:`planner.cost.prefix`'s), model-state bytes per parameter under each sharding stage, and the
bytes the gradient synchronisation moves (a base class of :class:`planner.cost.model.CostModel`;
formulas in that module's docstring). What ZeRO's collectives add to a stage's time (ZeRO 2's
reduce-scatter every micro-batch, ZeRO 3's per-layer gathers, HSDP's all-reduce) is
:mod:`planner.cost.zero_comm`'s.

ZeRO 2 (DeepSpeed's ZeRO-2; FSDP with ``reshard_after_forward=False``): every micro-batch's
gradients are reduce-scattered as its backward produces them, so a rank holds ``1/n`` of them at
the peak.

Routed experts (:mod:`planner.cost.experts`): their state is sharded over the stage's expert
data-parallel group (``Sharding.expert_shards``), not its data-parallel one, so a stage's model
state is ``kappa x dense + kappa_e x experts`` (:meth:`ShardedState.stage_state_bytes`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from planner.artifacts.cluster import Cluster
from planner.artifacts.kinds import ZeroStage
from planner.artifacts.layout import DeviceGroup, Sharding
from planner.artifacts.stack import Stack
from planner.cost.prefix import PrefixSums


def is_fsdp(sharding: Sharding) -> bool:
    """ZeRO 3 over more than one rank (one rank shards nothing): the sharding whose weights are
    gathered layer by layer (:mod:`planner.cost.fsdp` prices that communication)."""
    return sharding.zero is ZeroStage.PARAMETERS and sharding.ranks > 1


@dataclass(frozen=True, slots=True, kw_only=True)
class StateTables:
    """What one sharding makes of every stage ``[i, j)``'s model state, at ``[i, j]`` (arrays
    read-only where the cost model caches them; :meth:`ShardedState.state_tables`)."""

    param_count: np.ndarray  # the stage's parameters, ties once (ShardedState.stage_param_matrix)
    total_param_count: int  # the whole model's, ties once (ShardedState.total_params)
    state_bytes: np.ndarray  # its model state on one device at the peak (ShardedState.stage_state_matrix)
    state_bytes_per_param: float  # kappa: at the peak, weights + gradients + optimizer state
    least_state_bytes_per_param: float  # the fewest any parameter takes (kappa, or the routed experts' if fewer)
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
    _state_tables: dict[Sharding, StateTables]

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

    @cached_property
    def total_params(self) -> int:
        """The whole model's parameters (:meth:`stage_param_count` of every layer)."""
        return self.stage_param_count(0, self.num_layers)

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

    def state_tables(self, sharding: Sharding) -> StateTables:
        """The :class:`StateTables` of ``sharding``: the questions the stage tables and the memory
        floors ask of it, in one call (HSDP's all-reduce of the gradient shards where the sharding
        has replicas); worked out once per sharding."""
        found = self._state_tables.get(sharding)
        if found is None:
            kappa, kappa_e = self.state_bytes(sharding)
            found = self._state_tables[sharding] = StateTables(
                param_count=self.stage_param_matrix(), total_param_count=self.total_params,
                state_bytes=_read_only(self.stage_state_matrix(sharding)), state_bytes_per_param=kappa,
                least_state_bytes_per_param=min(kappa, kappa_e) if self.has_experts else kappa,
                sync_bytes_per_param=self.post_backward_sync_bytes_per_param(
                    sharding.zero, sharding.ranks if sharding.replicas > 1 else 0))
        return found

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

def _stage_sums(prefix: np.ndarray) -> np.ndarray:
    """Every stage ``[i, j)``'s sum at ``[i, j]`` from prefix sums (floats; a new array)."""
    out: np.ndarray = (prefix[None, :] - prefix[:, None]).astype(float)
    return out


def _read_only(out: np.ndarray) -> np.ndarray:
    out.flags.writeable = False
    return out
