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

from functools import cached_property

import numpy as np

from planner.artifacts.cluster import Cluster
from planner.artifacts.profile import AttentionCore, Profile
from planner.artifacts.stack import Stack
from planner.cost.overheads import host_floor_ms


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
    _layer_times: dict[int, tuple[np.ndarray, np.ndarray]]
    _time_prefix: dict[int, tuple[np.ndarray, np.ndarray]]
    _work: dict[int, float]
    _core_times: dict[int, np.ndarray]
    _shared: dict[int, np.ndarray]
    #: tied tensors whose every layer is on one pipeline rank, in several of its chunks (a V's
    #: embedding and head on rank 0): one copy on that rank, held by the chunk of its first layer,
    #: and no exchange of its gradients (:func:`planner.cost.ties.on_ranks`)
    rank_local_ties: frozenset[str] = frozenset()

    def _cores(self) -> list[AttentionCore | None]:
        return [layer.attention_core for layer in self.profile.layers]

    # ---------------------------------------------------------------- prefix sums
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

    def time_prefix(self, microbatch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """(forward, backward) ms of layers ``0..l-1`` at ``[l]``, one micro-batch (cached)."""
        if microbatch_size not in self._time_prefix:
            fwd, bwd = self.layer_times(microbatch_size)
            self._time_prefix[microbatch_size] = (np.concatenate([[0.0], np.cumsum(fwd)]),
                                                  np.concatenate([[0.0], np.cumsum(bwd)]))
        return self._time_prefix[microbatch_size]

    # ---------------------------------------------------------------- per layer
    def layer_times(self, microbatch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Per-layer (forward ms, backward ms) at one micro-batch size on this cluster (cached
        on the instance, so a cost model and its arrays are freed together): the GPU's time, or
        the host's to issue the layer's kernels where longer
        (:func:`planner.cost.overheads.host_floor_ms`)."""
        if microbatch_size not in self._layer_times:
            # Layer.fwd_ms / bwd_ms (TimeFit.at: the line, never negative) over every layer at once
            (f_ic, f_ps), (b_ic, b_ps) = self._time_lines
            host_f, host_b = host_floor_ms(self.profile, self.stack.host_us_per_kernel, self.stack.moe.layer_host_ms)
            fwd = np.maximum(np.maximum(0.0, f_ic + f_ps * microbatch_size) / self._speed, host_f)
            bwd = np.maximum(np.maximum(0.0, b_ic + b_ps * microbatch_size) / self._speed, host_b)
            self._layer_times[microbatch_size] = (fwd, bwd)
        return self._layer_times[microbatch_size]

    @cached_property
    def _time_lines(self) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """(intercepts, ms per sample) of the layers' forward and backward lines."""
        layers = self.profile.layers
        return ((np.array([x.fwd.intercept_ms for x in layers]), np.array([x.fwd.per_sample_ms for x in layers])),
                (np.array([x.bwd.intercept_ms for x in layers]), np.array([x.bwd.per_sample_ms for x in layers])))

    def core_ms(self, microbatch_size: int) -> np.ndarray:
        """Per-layer forward ms of the attention core (0 where a layer has none): what the
        selective level re-runs in every backward."""
        if microbatch_size not in self._core_times:
            self._core_times[microbatch_size] = np.array(
                [c.fwd.at(microbatch_size) if c else 0.0 for c in self._cores()]
            ) / self._speed
        return self._core_times[microbatch_size]

    def saved_bytes(self, microbatch_size: int) -> np.ndarray:
        """Per-layer bytes saved for backward by one micro-batch (no recomputation)."""
        out: np.ndarray = self.saved_per_sample * microbatch_size + self.saved_fixed
        return out

    def core_bytes(self, microbatch_size: int) -> np.ndarray:
        """Per-layer bytes of the attention core for one micro-batch (what selective frees)."""
        out: np.ndarray = self.core_per_sample * microbatch_size + self.core_fixed
        return out

    # ---------------------------------------------------------------- one stage
    def work_ms(self, microbatch_size: int) -> float:
        """Every layer's forward + backward of one micro-batch (cached: the bounds read it per
        configuration)."""
        found = self._work.get(microbatch_size)
        if found is None:
            fp, bp = self.time_prefix(microbatch_size)
            found = self._work[microbatch_size] = float(fp[-1] + bp[-1])
        return found

    def stage_fwd_ms(self, start: int, stop: int, microbatch_size: int) -> float:
        """Forward ms of one micro-batch through the layers ``[start, stop)``."""
        fp, _ = self.time_prefix(microbatch_size)
        return float(fp[stop] - fp[start])

    def stage_bwd_ms(self, start: int, stop: int, microbatch_size: int) -> float:
        """Backward ms of one micro-batch through the layers ``[start, stop)``."""
        _, bp = self.time_prefix(microbatch_size)
        return float(bp[stop] - bp[start])

    def stage_wgrad_ms(self, start: int, stop: int, microbatch_size: int) -> float:
        """Of :meth:`stage_bwd_ms`, the weight-gradient pass W (:mod:`planner.cost.model`)."""
        _, bwd = self.layer_times(microbatch_size)
        return float(np.dot(bwd[start:stop], self.wgrad_fraction[start:stop]))

    def wgrad_bytes(self, start: int, stop: int, microbatch_size: int) -> float:
        """What one micro-batch keeps from the end of B until its W (:mod:`planner.cost.model`; a
        recomputed layer's B recomputes what its W needs)."""
        saved = self.saved_per_sample[start:stop] * microbatch_size + self.saved_fixed[start:stop]
        return float(np.dot(saved, self.wgrad_saved_fraction[start:stop]))

    def keep_matrix(self, microbatch_size: int) -> np.ndarray:
        """:meth:`~planner.cost.model.CostModel.keep_bytes` of every stage ``[i, j)`` at ``[i, j]`` (0 below the diagonal)."""
        saved = self.saved_per_sample * microbatch_size + self.saved_fixed
        prefix = np.concatenate([[0.0], np.cumsum(saved * self.wgrad_saved_fraction)])
        out: np.ndarray = np.maximum(prefix[None, :] - prefix[:, None], 0.0)
        return out

    def stage_bubble_fill_ms(self, start: int, stop: int, microbatch_size: int) -> float:
        """``Z_s = min(2 W_s, F_s + B_s)`` of the stage ``[start, stop)``: what ZB-H1 (Qi et al.,
        ICLR 2024, sec. 3.1) fills of the pipeline's fill and drain with the stage's W passes
        (its bubble is ``(P - 1)(T_F + T_B - T_W)`` where 1F1B's is ``(P - 1)(T_F + T_B + T_W)``)."""
        compute = self.stage_fwd_ms(start, stop, microbatch_size) + self.stage_bwd_ms(start, stop, microbatch_size)
        return min(2.0 * self.stage_wgrad_ms(start, stop, microbatch_size), compute)

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

    # ---------------------------------------------------------------- every stage
    def stage_expert_param_matrix(self) -> np.ndarray:
        """:meth:`stage_expert_param_count` of every stage ``[i, j)`` at ``[i, j]`` (floats; read-only,
        worked out once per cost model)."""
        return self._expert_matrix

    @cached_property
    def _expert_matrix(self) -> np.ndarray:
        ep = self.expert_prefix
        out: np.ndarray = (ep[None, :] - ep[:, None]).astype(float)
        out.flags.writeable = False
        return out

    def stage_param_matrix(self) -> np.ndarray:
        """:meth:`stage_param_count` of every stage ``[i, j)`` at ``[i, j]`` (floats; read-only,
        worked out once per cost model)."""
        return self._param_matrix

    @cached_property
    def _param_matrix(self) -> np.ndarray:
        L = self.num_layers
        idx = np.arange(L + 1)
        pp = self.param_prefix
        out: np.ndarray = (pp[None, :] - pp[:, None]).astype(float)
        for tie in self.profile.tied:
            inside = np.zeros((L + 1, L + 1))
            for layer in tie.layers:
                inside += (idx[:, None] <= layer) & (idx[None, :] > layer)
            out -= np.maximum(inside - 1, 0) * tie.param_count
            if tie.name in self.rank_local_ties:
                first = min(tie.layers)
                holds_first = (idx[:, None] <= first) & (idx[None, :] > first)
                out -= ((inside > 0) & ~holds_first) * tie.param_count
        out.flags.writeable = False
        return out

    def stage_compute_matrix(self, microbatch_size: int) -> np.ndarray:
        """:meth:`stage_fwd_ms` + :meth:`stage_bwd_ms` of every stage ``[i, j)`` at ``[i, j]``."""
        fp, bp = self.time_prefix(microbatch_size)
        out: np.ndarray = (fp[None, :] - fp[:, None]) + (bp[None, :] - bp[:, None])
        return out

    def stage_activation_matrix(self, microbatch_size: int) -> np.ndarray:
        """The bytes one in-flight micro-batch keeps on every stage ``[i, j)`` without
        recomputation (``activation_bytes(i, j, (), b)`` of the cost model) at ``[i, j]``."""
        sp, fxp = self.saved_prefix, self.saved_fixed_prefix
        out: np.ndarray = (sp[None, :] - sp[:, None]) * microbatch_size + (fxp[None, :] - fxp[:, None])
        if self.profile.shared_saved:  # storages two layers of a stage both save: once
            out = out - self.shared_matrix(microbatch_size)
        return out

    def stage_buffer_matrix(self, microbatch_size: int) -> np.ndarray:
        """``buffer_bytes(i, j, b)`` of the cost model (send and receive buffers, context
        parallelism's gathered keys and values) of every stage ``[i, j)`` at ``[i, j]``."""
        cut = self.cut_bytes_per_sample
        out: np.ndarray = (2.0 * (cut[:, None] + cut[None, :]) + self.gather_bytes_per_sample) * microbatch_size
        return out

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
