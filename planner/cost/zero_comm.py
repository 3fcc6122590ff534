"""ZeRO's collectives in a stage's time (a base class of :class:`planner.cost.model.CostModel`, over
:class:`~planner.cost.sharding.ShardedState`'s model state): ZeRO 3's per-layer gathers and
reduce-scatters in the stage's forward and backward (:mod:`planner.cost.fsdp`'s terms, on the line of
:func:`fsdp_line`), ZeRO 2's reduce-scatter every micro-batch and HSDP's all-reduce across its shard
groups.

ZeRO 2 (DeepSpeed's ZeRO-2; FSDP with ``reshard_after_forward=False``): a rank holds ``1/n`` of the
gradients at the peak because every micro-batch's are reduce-scattered as its backward produces them.
That reduce-scatter, ``r`` ms per micro-batch (half the gradient group's all-reduce line on the
stage's gradient bytes, one latency per bucket of the stack), runs on the communication stream:
with the stack's ``zero_reduce_overlap`` beside the micro-batch's own computation, so that only
``max(0, r - F - B)`` lengthens its backward (the stream has to carry ``r`` per micro-batch while the
device computes ``F + B``); without it, all of ``r``.

Routed experts (:mod:`planner.cost.experts`): under ZeRO 3 each layer's experts are gathered and
reduce-scattered over the stage's expert data-parallel group (its ranks ``ep x etp`` apart from the
first of a pipeline rank's block, assumed to start a node)."""

from __future__ import annotations

import dataclasses

import numpy as np

from planner.artifacts.cluster import Cluster
from planner.artifacts.layout import Layout, Sharding
from planner.cost.collectives import allreduce_line, gather_line, stage_links
from planner.cost.fsdp import FsdpTerms, fsdp_terms, hsdp_groups
from planner.cost.sharding import ShardedState, is_fsdp

__all__ = ["ZeroComm", "fsdp_line"]


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
        lines = list(stage_links(cluster, layout).ring_lines)
    per_byte, fixed = max(lines)
    return 0.5 * per_byte, 0.5 * fixed


class ZeroComm(ShardedState):
    """ZeRO's collectives over the attributes a :class:`~planner.cost.model.CostModel` sets."""

    _fsdp: dict[tuple[int, float, float, int], FsdpTerms]
    _fsdp_lines: dict[Layout, tuple[float, float]]
    wgrad_fraction: np.ndarray

    def grad_line(self, layout: Layout, stage_idx: int) -> tuple[float, float]:
        raise NotImplementedError

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
