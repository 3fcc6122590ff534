"""Prefix sums over a profile's layers, and the per-stage sums they give for one stage or for
every stage at once (a base class of :class:`planner.cost.model.CostModel`).

A stage is the layers ``[i, j)``; with ``X[l]`` the sum of a per-layer quantity over layers
``0..l-1`` (``X[0] = 0``), the stage's sum is ``X[j] - X[i]``: one subtraction per stage, or one
array operation for the ``(L + 1) x (L + 1)`` matrix of every stage (entries with ``j > i``
meaningful). The matrices are what the solver's stage tables are built from
(:mod:`planner.solve.prices`); each is written with the same float operations as the scalar
method it vectorises, so an entry ``[i, j]`` equals that method's answer for the stage ``[i, j)``
bit for bit (tests/test_stage_prices.py holds this).

Formulas (units in the names): :mod:`planner.cost.model`'s docstring. Times are the profile's
divided by ``Cluster.relative_speed``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from planner.artifacts.cluster import Cluster
from planner.artifacts.profile import AttentionCore, Profile
from planner.artifacts.stack import Stack
from planner.cost.host import host_floor_ms

__all__ = ["BatchSums", "PrefixSums", "StageSums"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StageSums:
    """Every stage ``[i, j)``'s sums at ``[i, j]``, one micro-batch (:attr:`BatchSums.stages`)."""

    compute_ms: np.ndarray  # forward + backward
    activation_bytes: np.ndarray  # what an in-flight micro-batch keeps without recomputation
    buffer_bytes: np.ndarray  # send and receive buffers, gathered keys and values
    wgrad_bytes: np.ndarray  # what a micro-batch keeps from its B until its W


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchSums:
    """A cost model's per-layer arrays at one micro-batch size and their sums, one micro-batch
    (arrays read-only; :meth:`PrefixSums.at_batch`); ``stages``: every stage's sums, where the
    caller asked for them (the stage tables)."""

    microbatch_size: int
    times_ms: tuple[np.ndarray, np.ndarray]  # per layer (forward, backward) ms
    prefix_ms: tuple[np.ndarray, np.ndarray]  # (forward, backward) ms of layers 0..l-1 at [l]
    work_ms: float  # every layer's forward + backward
    wgrad_ms: float  # of work_ms, every layer's weight-gradient pass W (planner.cost.model)
    saved_bytes: np.ndarray  # per layer, saved for backward without recomputation
    core_bytes: np.ndarray  # per layer, its attention core's (what the selective level frees; 0: none)
    core_ms: np.ndarray  # per layer, its attention core's forward (what the selective level re-runs)
    stages: StageSums | None = None  # every stage's sums (PrefixSums.at_batch with stages=True), else None


class PrefixSums:
    """Per-layer arrays at a micro-batch size, their prefix sums, and the per-stage sums (module
    docstring), over the attributes a :class:`~planner.cost.model.CostModel` sets."""

    profile: Profile
    cluster: Cluster
    stack: Stack
    num_layers: int
    param_count: np.ndarray
    expert_param_count: np.ndarray  # of param_count, the routed experts' (planner.cost.experts)
    saved_per_sample: np.ndarray
    saved_fixed: np.ndarray
    core_per_sample: np.ndarray
    core_fixed: np.ndarray
    wgrad_fraction: np.ndarray
    wgrad_saved_fraction: np.ndarray
    cut_bytes_per_sample: np.ndarray
    gather_bytes_per_sample: float
    _speed: float
    attention_cores: tuple[AttentionCore | None, ...]  # per layer
    _batches: dict[int, BatchSums]
    _shared: dict[int, np.ndarray]
    #: tied tensors whose every layer is on one pipeline rank, in several of its chunks (a V's
    #: embedding and head on rank 0): one copy on that rank, held by the chunk of its first layer,
    #: and no exchange of its gradients (:func:`planner.cost.ties.on_ranks`)
    rank_local_ties: frozenset[str] = frozenset()

    # ---------------------------------------------------------------- prefix sums
    @cached_property
    def saved_prefix(self) -> np.ndarray:
        """Bytes per sample saved for backward by layers ``0..l-1`` at ``[l]``."""
        out: np.ndarray = np.concatenate([[0.0], np.cumsum(self.saved_per_sample)])
        return out

    @cached_property
    def saved_fixed_prefix(self) -> np.ndarray:
        """Bytes saved for backward whatever the micro-batch size by layers ``0..l-1`` at ``[l]``."""
        out: np.ndarray = np.concatenate([[0.0], np.cumsum(self.saved_fixed)])
        return out

    def at_batch(self, microbatch_size: int, stages: bool = False) -> BatchSums:
        """The per-layer arrays and sums at one micro-batch size (:class:`BatchSums`; cached on
        the instance, so a cost model and its arrays are freed together): the one call the
        solver's bounds and stage tables make for them. With ``stages`` also every stage's sums
        (:attr:`BatchSums.stages`, :meth:`_stage_sums`): worked out on each such call and not kept
        (the stage tables keep theirs; GPT-3 175B on 1,024 A100s asks them at 34 of the 793
        micro-batch sizes its cost models are asked at)."""
        found = self._batches.get(microbatch_size)
        if found is None:
            found = self._batches[microbatch_size] = self._batch_sums(microbatch_size)
        if stages:
            return dataclasses.replace(found, stages=self._stage_sums(found))
        return found

    def _batch_sums(self, microbatch_size: int) -> BatchSums:
        """:meth:`at_batch` worked out: a layer's time is the GPU's, or the host's to issue its
        kernels where longer (:func:`planner.cost.host.host_floor_ms`); the Layer.fwd_ms /
        bwd_ms lines (TimeFit.at: never negative) over every layer at once."""
        (f_ic, f_ps), (b_ic, b_ps) = self._time_lines
        host_f, host_b = self._host_floor
        fwd = np.maximum(np.maximum(0.0, f_ic + f_ps * microbatch_size) / self._speed, host_f)
        bwd = np.maximum(np.maximum(0.0, b_ic + b_ps * microbatch_size) / self._speed, host_b)
        fp, bp = np.concatenate([[0.0], np.cumsum(fwd)]), np.concatenate([[0.0], np.cumsum(bwd)])
        c_ic, c_ps = self._core_lines  # AttentionCore.fwd.at (never negative) over every layer; 0 without a core
        core_ms = np.maximum(0.0, c_ic + c_ps * microbatch_size) / self._speed
        saved = self.saved_per_sample * microbatch_size + self.saved_fixed
        core = self.core_per_sample * microbatch_size + self.core_fixed
        for array in (fwd, bwd, fp, bp, core_ms, saved, core):
            array.flags.writeable = False
        return BatchSums(microbatch_size=microbatch_size, times_ms=(fwd, bwd), prefix_ms=(fp, bp),
                         work_ms=float(fp[-1] + bp[-1]), wgrad_ms=float(np.dot(bwd, self.wgrad_fraction)),
                         saved_bytes=saved, core_bytes=core, core_ms=core_ms)

    @cached_property
    def _core_lines(self) -> tuple[np.ndarray, np.ndarray]:
        """(intercepts, ms per sample) of the layers' attention cores' forward lines (0 without one)."""
        cores = self.attention_cores
        return (np.array([c.fwd.intercept_ms if c else 0.0 for c in cores]),
                np.array([c.fwd.per_sample_ms if c else 0.0 for c in cores]))

    @cached_property
    def _host_floor(self) -> tuple[np.ndarray, np.ndarray]:
        """Per layer, the (forward, backward) host time of one pass (:func:`host_floor_ms`): the same
        at every micro-batch size."""
        return host_floor_ms(self.profile, self.stack.host_us_per_kernel, self.stack.moe)

    @cached_property
    def _time_lines(self) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """(intercepts, ms per sample) of the layers' forward and backward lines."""
        layers = self.profile.layers
        return ((np.array([x.fwd.intercept_ms for x in layers]), np.array([x.fwd.per_sample_ms for x in layers])),
                (np.array([x.bwd.intercept_ms for x in layers]), np.array([x.bwd.per_sample_ms for x in layers])))

    def _stage_sums(self, at: BatchSums) -> StageSums:
        """Every stage's sums at ``at``'s micro-batch size (:class:`StageSums`). Each entry ``[i, j]``
        is, bit for bit, the scalar method's answer for the stage ``[i, j)``: ``stage_fwd_ms +
        stage_bwd_ms``; ``activation_bytes(i, j, (), b)`` (one in-flight micro-batch, no
        recomputation); ``buffer_bytes(i, j, b)`` (send and receive buffers, context parallelism's
        gathered keys and values); ``keep_bytes``' W inputs (``wgrad_bytes``, 0 below the diagonal)."""
        b = at.microbatch_size
        fp, bp = at.prefix_ms
        sp, fxp = self.saved_prefix, self.saved_fixed_prefix
        act: np.ndarray = (sp[None, :] - sp[:, None]) * b + (fxp[None, :] - fxp[:, None])
        if self.profile.shared_saved:  # storages two layers of a stage both save: once
            act = act - self.shared_matrix(b)
        cut = self.cut_bytes_per_sample
        wgrad = np.concatenate([[0.0], np.cumsum(at.saved_bytes * self.wgrad_saved_fraction)])
        return StageSums(compute_ms=(fp[None, :] - fp[:, None]) + (bp[None, :] - bp[:, None]), activation_bytes=act,
                         buffer_bytes=(2.0 * (cut[:, None] + cut[None, :]) + self.gather_bytes_per_sample) * b,
                         wgrad_bytes=np.maximum(wgrad[None, :] - wgrad[:, None], 0.0))

    def shared_matrix(self, microbatch_size: int) -> np.ndarray:
        """``S[i, j]``: bytes of storages two layers of the stage ``[i, j)`` both save, one
        micro-batch (counted once there, see :mod:`planner.cost.model`)."""
        if microbatch_size not in self._shared:
            n = self.num_layers
            out = np.zeros((n + 1, n + 1))
            for pair in self.profile.shared_saved:
                out[: pair.first + 1, pair.second + 1 :] += pair.at(microbatch_size)
            self._shared[microbatch_size] = out
        return self._shared[microbatch_size]
