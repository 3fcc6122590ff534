"""A stage's memory on one device at its peak (a base class of :class:`planner.cost.model.CostModel`;
formulas in that module's docstring): its model state under a sharding (:mod:`planner.cost.sharding`'s
bytes per parameter, ZeRO 3's gathered working set, the FP8 weight copies), the activations its
in-flight micro-batches keep (each recompute level's, a storage two layers save counted once), what a
micro-batch keeps from its B until its W, the largest recompute working set and the send and receive
buffers, assembled into one :class:`~planner.artifacts.plan.StageMemory` by
:meth:`MemoryCosts.stage_memory`, the one question the solver's memory checks ask."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from planner.artifacts.layout import Sharding
from planner.artifacts.plan import StageMemory
from planner.cost.fsdp import units_in_flight
from planner.cost.sharding import ShardedState, is_fsdp

__all__ = ["MemoryCosts"]


class MemoryCosts(ShardedState):
    """A stage's memory (module docstring), over the attributes a :class:`~planner.cost.model.CostModel` sets."""

    input_per_sample: np.ndarray  # per layer, its input's bytes per sample (what a fully recomputed layer keeps)

    # ---------------------------------------------------------------- zero bubble: what a micro-batch keeps until its W
    def keep_bytes(self, start: int, stop: int, microbatch_size: int) -> float:
        """What one micro-batch past its input-gradient pass keeps until its W: W's inputs
        (``wgrad_bytes``), recomputed or not, at most what it saved without recomputation."""
        return min(self.wgrad_bytes(start, stop, microbatch_size), self.activation_bytes(start, stop, (), microbatch_size))

    def wgrad_bytes(self, start: int, stop: int, microbatch_size: int) -> float:
        """What one micro-batch keeps from the end of B until its W (:mod:`planner.cost.model`; a
        recomputed layer's B recomputes what its W needs)."""
        saved = self.saved_per_sample[start:stop] * microbatch_size + self.saved_fixed[start:stop]
        return float(np.dot(saved, self.wgrad_saved_fraction[start:stop]))

    # ---------------------------------------------------------------- activations
    def shared_out(self, start: int, stop: int, microbatch_size: int) -> np.ndarray:
        """Per layer ``p`` of the stage ``[start, stop)``: bytes of its saves that a later layer
        of the stage also saves (what recomputing ``p`` fully does not free), one micro-batch."""
        out = np.zeros(stop - start)
        for pair in self.profile.shared_saved:
            if start <= pair.first and pair.second < stop:
                out[pair.first - start] += pair.at(microbatch_size)
        return out

    def activation_bytes(
        self, start: int, stop: int, recompute: Iterable[int], microbatch_size: int, selective: Iterable[int] = ()
    ) -> float:
        """Bytes one in-flight micro-batch keeps on a stage: saved tensors (each shared storage
        once, see the module docstring), inputs of the fully recomputed layers, saved less the
        attention core of the selectively recomputed ones (a core's tensors are its own: none of
        them is a storage another layer shares)."""
        full = tuple(recompute)
        per_sample = float(self.saved_prefix[stop] - self.saved_prefix[start])
        fixed = float(self.saved_fixed_prefix[stop] - self.saved_fixed_prefix[start])
        for i in full:
            per_sample += self.input_per_sample[i] - self.saved_per_sample[i]
            fixed -= self.saved_fixed[i]
        for i in selective:
            per_sample -= self.core_per_sample[i]
            fixed -= self.core_fixed[i]
        total = per_sample * microbatch_size + fixed
        if self.profile.shared_saved:
            total -= float(self.shared_matrix(microbatch_size)[start, stop])
            kept = self.shared_out(start, stop, microbatch_size)
            total += float(sum(kept[i - start] for i in full))  # a fully recomputed layer no longer shares
        return total

    def recompute_workspace_bytes(
        self, recompute: Iterable[int], microbatch_size: int, selective: Iterable[int] = ()
    ) -> float:
        """The largest working set of one recomputed layer, live while its backward runs: a
        fully recomputed layer's saved tensors, a selectively recomputed one's attention core."""
        full = max((float(self.saved_per_sample[i] * microbatch_size + self.saved_fixed[i]) for i in recompute), default=0.0)
        core = max((float(self.core_per_sample[i] * microbatch_size + self.core_fixed[i]) for i in selective), default=0.0)
        return max(full, core)

    def buffer_bytes(self, start: int, stop: int, microbatch_size: int) -> float:
        """Receive and send buffers: boundary activations in/out and their gradients, one
        micro-batch; with context parallelism also one layer's gathered keys and values."""
        cut = self.cut_bytes_per_sample
        return (2.0 * float(cut[start] + cut[stop]) + self.gather_bytes_per_sample) * microbatch_size

    # ---------------------------------------------------------------- assembled
    def stage_memory(
        self, start: int, stop: int, recompute: Sequence[int], microbatch_size: int, inflight: int,
        sharding: Sharding = Sharding(), selective: Sequence[int] = (), pending: int = 0,
    ) -> StageMemory:
        """Memory of one device of the stage at its peak, its model state divided as ``sharding``
        says (see the module docstring); ``recompute`` the fully and ``selective`` the selectively
        recomputed layers; ``inflight`` micro-batches whole and ``pending`` past their
        input-gradient pass holding :meth:`keep_bytes` (:func:`planner.schedule.held_counts`)."""
        params = self.stage_param_count(start, stop)
        w, g, o = self.state_bytes_per_param(sharding)
        # ZeRO 3's gathered working set: the units in flight x the stage's largest layer
        gathered = units_in_flight(self.stack.fsdp_prefetch) * int(self.param_count[start:stop].max()) if is_fsdp(sharding) else 0
        if self.has_experts:  # the routed experts' state over their own group
            experts = self.stage_expert_param_count(start, stop)
            we, ge, oe = self.expert_state_bytes_per_param(sharding)
            params -= experts
            w, g, o = (w * params + we * experts, g * params + ge * experts, o * params + oe * experts)
            params = 1
        # FP8 weight copies beyond the weights' own bytes (planner.cost.precision); under ZeRO 3 gathered in FP8
        fp8_copies = 0 if is_fsdp(sharding) else self.fp8_extra_bytes_per_param * int(self.fp8_param_count[start:stop].sum())
        return StageMemory(
            param_bytes=int(params * w) + gathered * self.weight_bytes_per_param + fp8_copies,
            grad_bytes=int(params * g) + gathered * self.grad_bytes_per_param,
            optimizer_bytes=int(params * o),
            activation_bytes=int(round(inflight * self.activation_bytes(start, stop, recompute, microbatch_size, selective)
                                       + (pending * self.keep_bytes(start, stop, microbatch_size) if pending else 0.0))),
            recompute_workspace_bytes=int(round(self.recompute_workspace_bytes(recompute, microbatch_size, selective))),
            buffer_bytes=int(round(self.buffer_bytes(start, stop, microbatch_size))),
        )
