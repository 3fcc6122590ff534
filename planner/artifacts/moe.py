"""Mixture-of-experts in the documents: what a profile says of an MoE layer (:class:`MoeLayer`,
``Layer.moe``) and what the training stack does with its tokens (:class:`MoeStack`,
``Stack.moe``). The layout of the experts (EP, ETP, EDP, "parallel folding") is the
:class:`~planner.artifacts.layout.Layout`'s; how all of it is priced, :mod:`planner.cost.experts`.

An MoE layer (Shazeer et al. 2017; Fedus et al. 2022; as Megatron-Core's ``MoELayer`` runs it)
is a transformer block whose MLP is replaced by a router (a ``h x E`` GEMM, softmax or sigmoid,
top-k), ``E`` routed experts of which each token visits ``k`` (grouped GEMMs over the tokens
each expert receives) and optionally shared experts every token visits (a dense MLP). The
profile's ``Layer`` keeps its whole cost; ``Layer.moe`` says which part of it is the routed
experts', because that part is laid out (and its tokens moved) apart from the rest:

- ``expert_fwd`` / ``expert_bwd``: the routed experts' share of ``Layer.fwd`` / ``Layer.bwd``
  (permutation of the tokens to their experts, the grouped GEMMs, the activation, the
  un-permutation and the weighting by the router's probabilities), on the profiled device with
  every expert local (ep = etp = 1) and the tokens spread evenly over the experts;
- ``expert_param_count``: the parameters of all ``E`` routed experts (part of
  ``Layer.param_count``), divided by ``ep x etp`` and synchronised over the expert data-parallel
  group; the rest of the layer's parameters are split as ``Layer.tp`` says (which describes the
  layer without its routed experts: its time fraction, parameters and saved bytes are of the
  rest);
- ``expert_saved_bytes_per_sample``: of ``Layer.saved_bytes_per_sample``, what the routed
  experts keep for backward (their permuted inputs, the first GEMM's outputs, the activation's
  output, the probabilities), held on whichever device runs the expert;
  ``act_saved_bytes_per_sample`` the part of it recomputing the experts' activation frees
  (Megatron-Core ``--recompute-modules moe_act``) and ``norm_saved_bytes_per_sample`` the part of
  the rest recomputing the layer's norms frees (``layernorm``), ``recompute_fwd`` their forward
  time (what that recomputation costs in every backward). An MoE layer's selective recompute
  level is this one (Megatron's ``moe_act`` + ``layernorm``), not its attention core (which under
  FlashAttention keeps only its log-sum-exp);
- ``hidden`` (a token's width, elements: what dispatch and combine move per token and expert),
  ``tokens_per_sample`` (the tokens of one sample: its sequence),
  ``expert_ffn_hidden`` (one expert's FFN width), ``top_k``, ``num_experts``,
  ``shared_experts``; ``max_nodes_per_token``: node-limited routing (DeepSeek-V3's at most 4
  nodes per token; 0: unlimited);
- ``alltoall_fwd`` / ``alltoall_bwd``: zero in a profile (every expert local); in the per-device
  view the cost model prices (:mod:`planner.cost.experts`), the dispatch and combine on the
  critical path, part of the layer's times (and ``expert_param_count`` there the device's).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from planner.artifacts.limits import MAX_BYTES, MAX_COUNT, check_count, check_ranges
from planner.artifacts.timefit import TimeFit

__all__ = ["MoeBalance", "MoeDispatcher", "MoeLayer", "MoeStack"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeLayer:
    """The routed experts of one profile layer (module docstring)."""

    num_experts: int = field(metadata={"doc": "routed experts E"})
    top_k: int = field(metadata={"doc": "routed experts each token visits k"})
    shared_experts: int = field(default=0, metadata={"doc": "experts every token visits (their cost is the layer's rest)"})
    hidden: int = field(metadata={"doc": "elements of one token's hidden state (what dispatch moves per token and expert)"})
    tokens_per_sample: int = field(metadata={"doc": "tokens one sample routes through the layer (its sequence length)"})
    expert_ffn_hidden: int = field(metadata={"doc": "FFN width of one routed expert"})
    expert_param_count: int = field(metadata={"doc": "parameters of all routed experts (part of the layer's param_count)"})
    expert_fwd: TimeFit = field(metadata={"doc": "the routed experts' part of the layer's forward, every expert local, tokens even"})
    expert_bwd: TimeFit = field(metadata={"doc": "the routed experts' part of the layer's backward, likewise"})
    expert_saved_bytes_per_sample: float = field(
        metadata={"doc": "of the layer's saved bytes, what the routed experts keep for backward per sample"})
    act_saved_bytes_per_sample: float = field(
        default=0.0, metadata={"doc": "of expert_saved_bytes_per_sample, what recomputing the experts' activation frees"})
    norm_saved_bytes_per_sample: float = field(
        default=0.0, metadata={"doc": "of the rest of the layer's saved bytes, what recomputing its norms frees"})
    recompute_fwd: TimeFit = field(
        default=TimeFit(intercept_ms=0.0, per_sample_ms=0.0),
        metadata={"doc": "forward time of the experts' activation and the norms (the selective level's cost)"})
    dispatch_bytes_per_element: int = field(
        default=2, metadata={"doc": "bytes of one element of a dispatched token (2: bf16)"})
    max_nodes_per_token: int = field(
        default=0, metadata={"doc": "node-limited routing: a token's experts on at most this many nodes (0: any)"})
    alltoall_fwd: TimeFit = field(
        default=TimeFit(intercept_ms=0.0, per_sample_ms=0.0),
        metadata={"doc": "of the layer's forward, the dispatch and combine on one device of an expert-parallel group "
                         "(a per-device view's; 0 in a profile: every expert local)", "omit_if_default": True})
    alltoall_bwd: TimeFit = field(
        default=TimeFit(intercept_ms=0.0, per_sample_ms=0.0),
        metadata={"doc": "of the layer's backward, likewise", "omit_if_default": True})

    def __post_init__(self) -> None:
        check_count("moe.num_experts", self.num_experts, 1, MAX_COUNT)
        check_count("moe.top_k", self.top_k, 1, self.num_experts)
        check_count("moe.shared_experts", self.shared_experts, 0, MAX_COUNT)
        check_count("moe.hidden", self.hidden, 1, MAX_COUNT)
        check_count("moe.tokens_per_sample", self.tokens_per_sample, 1, MAX_COUNT)
        check_count("moe.expert_ffn_hidden", self.expert_ffn_hidden, 1, MAX_COUNT)
        check_count("moe.expert_param_count", self.expert_param_count)
        check_count("moe.dispatch_bytes_per_element", self.dispatch_bytes_per_element, 1, 16)
        check_count("moe.max_nodes_per_token", self.max_nodes_per_token, 0, MAX_COUNT)
        check_ranges(0, MAX_BYTES, **{"moe.expert_saved_bytes_per_sample": self.expert_saved_bytes_per_sample,
                                      "moe.act_saved_bytes_per_sample": self.act_saved_bytes_per_sample,
                                      "moe.norm_saved_bytes_per_sample": self.norm_saved_bytes_per_sample})
        if self.act_saved_bytes_per_sample > self.expert_saved_bytes_per_sample * (1 + 1e-9) + 1e-9:
            raise ValueError("moe.act_saved_bytes_per_sample exceeds moe.expert_saved_bytes_per_sample")

    @property
    def token_bytes(self) -> int:
        """Bytes one token carries to one expert (dispatch) and back (combine)."""
        return self.hidden * self.dispatch_bytes_per_element


class MoeDispatcher(enum.Enum):
    """How the stack moves tokens to their experts and back (Megatron-Core
    ``--moe-token-dispatcher-type``): ``alltoall``, NCCL's all-to-all over the expert-parallel
    group (every token copy sent on its own); ``deepep``, DeepSeek's fused dispatch/combine
    kernels (DeepEP, ``--moe-enable-deepep``/``flex``: a token crosses the network once per
    destination node and is forwarded over NVLink inside it)."""

    ALLTOALL = "alltoall"
    DEEPEP = "deepep"


class MoeBalance(enum.Enum):
    """How the tokens fall on the experts: ``forced`` (spread evenly, Megatron-Core
    ``--moe-router-force-load-balancing``, as the published benchmarks run); ``dropless`` (every
    token kept, the busiest expert-parallel rank receiving ``1 + skew`` times the mean: the
    slowest rank sets the step); ``capacity`` (each expert takes at most ``capacity_factor`` times
    the mean, the rest dropped, its input padded to that capacity:
    ``--moe-expert-capacity-factor`` with ``--moe-pad-expert-input-to-capacity``)."""

    FORCED = "forced"
    DROPLESS = "dropless"
    CAPACITY = "capacity"


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeStack:
    """What the training stack does with an MoE layer's tokens (``Stack.moe``)."""

    dispatcher: MoeDispatcher = field(default=MoeDispatcher.ALLTOALL, metadata={"doc": "alltoall | deepep"})
    a2a_overlap: bool = field(
        default=False,
        metadata={"doc": "dispatch and combine run beside another micro-batch's compute (Megatron-Core's 1F1B "
                         "all-to-all overlap, --overlap-moe-expert-parallel-comm)"})
    balance: MoeBalance = field(default=MoeBalance.FORCED, metadata={"doc": "forced | dropless | capacity"})
    skew: float = field(default=0.0, metadata={"doc": "dropless: the busiest rank's tokens over the mean, less 1"})
    capacity_factor: float = field(default=1.0, metadata={"doc": "capacity: an expert's tokens at most this x the mean"})
    host_ms_per_layer: float = field(
        default=0.0,
        metadata={"doc": "host (CPU) ms of one MoE layer's forward + backward beyond issuing its kernels (an eager "
                         "framework's router, dispatcher and expert code; a third in the forward): with the layer's "
                         "kernels, the floor of its passes (planner.cost.overheads); 0 = none", "omit_if_default": True})
    alltoall_host_ms_per_local_expert: float = field(
        default=0.0,
        metadata={"doc": "with the alltoall dispatcher (NCCL's all-to-all), the ms one MoE layer's forward + "
                         "backward takes beyond host_ms_per_layer per routed expert the device holds, joining its "
                         "floor (what Megatron-Core's MoEAlltoAllTokenDispatcher costs beside DeepEP's dispatch; "
                         "fitted, cause not isolated); 0 = none", "omit_if_default": True})
    fp8_host_us_per_expert_gemm: float = field(
        default=0.0,
        metadata={"doc": "under FP8 current scaling, host us of each routed-expert GEMM call per local expert and "
                         "pass direction beyond its kernels (Transformer Engine's GroupedLinear allocates and "
                         "quantises each local expert's split on its own on the host), joining the floor; 0 = none",
                  "omit_if_default": True})

    def __post_init__(self) -> None:
        object.__setattr__(self, "dispatcher", MoeDispatcher(self.dispatcher))
        object.__setattr__(self, "balance", MoeBalance(self.balance))
        if not (math.isfinite(self.skew) and 0.0 <= self.skew <= 1e3):
            raise ValueError(f"moe skew must be in [0, 1000] (got {self.skew!r})")
        if not (math.isfinite(self.capacity_factor) and 0.0 < self.capacity_factor <= 1e3):
            raise ValueError(f"moe capacity_factor must be in (0, 1000] (got {self.capacity_factor!r})")
        if not (math.isfinite(self.host_ms_per_layer) and 0.0 <= self.host_ms_per_layer <= 1e4):
            raise ValueError(f"moe host_ms_per_layer must be in [0, 10000] ms (got {self.host_ms_per_layer!r})")
        for name in ("alltoall_host_ms_per_local_expert", "fp8_host_us_per_expert_gemm"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 <= value <= 1e4):
                raise ValueError(f"moe {name} must be in [0, 10000] (got {value!r})")

    def layer_host_ms(self, local_experts: int) -> float:
        """Host ms of one MoE layer's forward + backward beyond its kernels with this dispatcher and
        ``local_experts`` routed experts on the device (bf16: FP8 adds ``fp8_host_us_per_expert_gemm``
        per expert GEMM, :mod:`planner.cost.overheads`): ``host_ms_per_layer``, plus
        ``alltoall_host_ms_per_local_expert`` per local expert with NCCL's all-to-all."""
        return self.host_ms_per_layer + self.alltoall_ms_per_local_expert * max(1, local_experts)

    @property
    def alltoall_ms_per_local_expert(self) -> float:
        """``alltoall_host_ms_per_local_expert`` where the dispatcher is NCCL's all-to-all, else 0."""
        return self.alltoall_host_ms_per_local_expert if self.dispatcher is MoeDispatcher.ALLTOALL else 0.0

    @property
    def prices_host(self) -> bool:
        """Whether any of the MoE layers' host times is priced."""
        return bool(self.host_ms_per_layer or self.alltoall_ms_per_local_expert or self.fp8_host_us_per_expert_gemm)

    @property
    def load_factor(self) -> float:
        """The busiest expert-parallel rank's tokens over the mean: what its experts compute and
        what it receives (forced 1; dropless 1 + skew; capacity: the padded capacity)."""
        if self.balance is MoeBalance.DROPLESS:
            return 1.0 + self.skew
        if self.balance is MoeBalance.CAPACITY:
            return self.capacity_factor
        return 1.0

    def describe(self) -> str:
        """``deepep, all-to-all overlapped, dropless (skew 0.2)``."""
        balance = {MoeBalance.FORCED: "forced balance", MoeBalance.DROPLESS: f"dropless (skew {self.skew:g})",
                   MoeBalance.CAPACITY: f"capacity factor {self.capacity_factor:g}"}[self.balance]
        overlap = ", all-to-all overlapped with compute" if self.a2a_overlap else ""
        host = f", {self.host_ms_per_layer:g} ms of host time per MoE layer" if self.host_ms_per_layer else ""
        if self.alltoall_ms_per_local_expert:  # (an FP8 plan's expert GEMMs' host time: its overheads' HOST term)
            host += f" + {self.alltoall_ms_per_local_expert:g} ms per local expert"
        return f"MoE {self.dispatcher.value}{overlap}, {balance}{host}"
