"""The host's time to issue a layer's kernels: the floor of each pass of an analytic layer
(:attr:`~planner.artifacts.kinds.OverheadKind.HOST`, one of the overhead terms
:mod:`planner.cost.overheads` lists; issue 47).

The CPU issues every kernel (Python, the framework's dispatcher, the launch),
``Stack.host_us_per_kernel`` each; a layer's forward or backward pass cannot end before its kernels
are issued, so it takes ``max(GPU time, kernels x host time)`` (:func:`host_floor_ms`, read by the
cost model's per-layer times, :mod:`planner.cost.prefix`): small micro-batches and small layers
become host-bound.

Kernels per layer pass (:data:`KERNELS`) are counted from the code each analytic layer stands for
(one forward kernel per GEMM, norm, fused element-wise group and attention call; the backward
twice as many: each GEMM's input and weight gradients): a Megatron GPT block (fused bias-GeLU,
bias-dropout-add, fused softmax) 13 forward kernels with FlashAttention, a Llama block as
torchtitan runs it eagerly (two RMSNorms of six kernels each, three projections, rotary on Q and K,
SDPA, the output projection, SwiGLU's three GEMMs, SiLU, the product, two residual adds) 33.
A mixture-of-experts decoder layer as Megatron-Core runs it (``MoEDecoderLayer``; Transformer
Engine, ``--moe-router-fusion``, ``--moe-permute-fusion``, ``--moe-grouped-gemm``) issues, besides
the attention half (the fused norm + QKV GEMM, the query/key norms, rotary on Q and K, the
attention kernel, the output projection, the residual add and the sequence-parallel all-gather and
reduce-scatter: 11), the MoE half: its norm, the router GEMM, the fused top-k scoring, the fused
auxiliary loss and its three reductions, the tokens-per-expert histogram, the dispatcher's three
(DeepEP's layout, notify and dispatch; NCCL's two all-to-alls and the count exchange), the fused
permutation's two, the activation, the un-permutation, the combine and the residual add: 17, so 28
forward kernels; and per expert held on the device two GEMMs (Transformer Engine's
``GroupedLinear`` issues one GEMM per local expert on Hopper, ``general_grouped_gemm``), so
``28 + 2 E / ep`` forward and twice that backward (:func:`moe_kernels`): 60 forward kernels with
16 experts per device, 284 with all 128 on one. A dense ``DecoderLayer`` of an MoE profile
(DeepSeek-V3's first three) is the attention half and a fused SwiGLU MLP (norm, fc1, activation,
fc2, residual add, two collectives): 18.

Under an FP8 recipe (the profile's precision, :func:`planner.cost.precision.precision_of`) each FP8
GEMM module quantises its input in the forward and its output's gradient in the backward
(:func:`fp8_gemms`: four per dense block, two per MoE layer's attention half and two per routed
expert the device holds, since Transformer Engine's ``GroupedLinear`` quantises each local expert's
split on its own, ``tex.split_quantize``), :data:`QUANTISE_KERNELS` kernels each. Under current
scaling (:data:`PER_SPLIT_RECIPES`) an FP8 expert GEMM also costs the host
``MoeStack.fp8_host_us_per_expert_gemm`` beyond its kernels each way: ``split_quantize`` allocates
and quantises each split on its own there (block scaling and MXFP8 in bulk), on top of
``GroupedLinear``'s per-split Python (``torch.split``, the buffers' ``torch.empty`` per GEMM,
TransformerEngine#1499) and the FP8 module's own (an FP8 ``te.Linear`` takes the host "more than
2x" a bf16 one, TransformerEngine#761). It grows with the experts per device: 30B-A3B's
16 (Megatron-Bridge's FP8 row, on which it is fitted) against 235B-A22B's 4 at EP 32.

Where DeepEP's dispatch crosses nodes the host waits, once per MoE layer's forward, for its
internode notify to return the token counts (:data:`planner.cost.experts.DEEPEP_INTERNODE_NOTIFY_MS`;
the device view's ``moe_notify_ms``): it joins the forward's floor, as it joins the GPU's forward
where no 1F1B all-to-all overlap hides it there.

Only analytic profiles are priced so (a measured layer's time includes its host time).
"""

from __future__ import annotations

import numpy as np

from planner.artifacts.kinds import Precision
from planner.artifacts.moe import MoeStack
from planner.artifacts.profile import Layer, Profile
from planner.cost.precision import precision_of

__all__ = [
    "FP8_GEMMS_PER_ATTENTION",
    "FP8_GEMMS_PER_BLOCK",
    "GEMMS_PER_LOCAL_EXPERT",
    "KERNELS",
    "PER_SPLIT_RECIPES",
    "QUANTISE_KERNELS",
    "fp8_gemms",
    "host_floor_ms",
    "moe_kernels",
]


#: (forward, backward) kernels of one pass of an analytic layer, by its kind (module docstring)
KERNELS: dict[str, tuple[int, int]] = {
    "Embedding": (1, 2),
    "TransformerBlock": (13, 26),
    "LayerNorm+Linear": (5, 10),
    "LlamaDecoderLayer": (33, 66),
    "RMSNorm+Linear": (10, 20),
    "DecoderLayer": (18, 36),
    "MoEDecoderLayer": (28, 56),  # without its routed experts' GEMMs (moe_kernels)
}
#: (forward, backward) GEMM kernels per routed expert held on the device (fc1, fc2; backward each
#: one's input and weight gradients): Transformer Engine's GroupedLinear, one GEMM per local expert
GEMMS_PER_LOCAL_EXPERT = (2, 4)
#: kernels one FP8 quantisation of a tensor issues, by recipe: Transformer Engine's current scaling
#: computes the amax, the scale from it and the cast in three launches
#: (``Float8CurrentScalingQuantizer::quantize_impl``: ``nvte_compute_amax``,
#: ``nvte_compute_scale_from_amax``, ``nvte_quantize_v2``); block scaling and MXFP8 find each block's
#: scale inside the casting kernel: one
QUANTISE_KERNELS: dict[Precision, int] = {Precision.FP8_CURRENT: 3, Precision.FP8_BLOCK: 1, Precision.MXFP8: 1}
#: FP8 GEMM modules of a dense block (Megatron-Core's Transformer Engine layers: the fused QKV and
#: norm, the output projection, the fused gate/up fc1 and norm, fc2), and of an MoE layer's attention half
FP8_GEMMS_PER_BLOCK = 4
FP8_GEMMS_PER_ATTENTION = 2
#: the recipes whose grouped GEMMs quantise each local expert's split on the host one at a time:
#: Transformer Engine's ``split_quantize`` allocates block-scaling and MXFP8 splits in bulk
#: (``BULK_FP8_BLOCKWISE``, ``BULK_MXFP8``) but current-scaling ones one by one, and quantises them
#: one by one ("only have fused kernel for FP8 delayed scaling", ``multi_tensor_quantize_impl``);
#: its grouped current-scaling quantisation came in 2026-06 (TransformerEngine#3114), after the
#: runs the constant is fitted on
PER_SPLIT_RECIPES = frozenset({Precision.FP8_CURRENT})


def host_floor_ms(profile: Profile, host_us_per_kernel: float, moe: MoeStack | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per layer, the (forward, backward) host time of one pass, ms (module docstring): its
    kernels x the host time per kernel (0 for a layer of a measured profile or a kind not in
    :data:`KERNELS`), an FP8 layer's quantisation kernels among them (:func:`fp8_gemms`); an MoE
    layer's plus ``moe``'s host times (:meth:`~planner.artifacts.moe.MoeStack.layer_host_ms`: a third
    forward, two thirds backward) and, under a recipe of :data:`PER_SPLIT_RECIPES`,
    ``moe.fp8_host_us_per_expert_gemm`` per expert GEMM each way; an MoE layer's forward plus the
    profile's ``moe_notify_ms`` (the host waits for DeepEP's internode notify: module docstring)."""
    n = len(profile.layers)
    moe = moe or MoeStack()
    if not (host_us_per_kernel or moe.prices_host) or profile.source != "analytic":
        return np.zeros(n), np.zeros(n)
    ep = profile.metadata.get("ep_degree", 1)
    ep = ep if isinstance(ep, int) and ep >= 1 else 1
    recipe = precision_of(profile)
    counts = np.array([moe_kernels(layer.kind, layer.moe.num_experts, ep) if layer.moe is not None
                       else KERNELS.get(layer.kind, (0, 0)) for layer in profile.layers], dtype=float).reshape(n, 2)
    gemms = np.array([fp8_gemms(layer, ep) if recipe.fp8 else (0, 0) for layer in profile.layers], dtype=float)
    counts += gemms[:, :1] * QUANTISE_KERNELS.get(recipe, 0)  # one quantisation per FP8 GEMM each way
    floor = counts * host_us_per_kernel / 1e3
    if recipe in PER_SPLIT_RECIPES:
        floor += gemms[:, 1:] * moe.fp8_host_us_per_expert_gemm / 1e3
    layer_ms = np.array([moe.layer_host_ms(_local(layer.moe.num_experts, ep)) if layer.moe is not None else 0.0
                         for layer in profile.layers])
    floor[:, 0] += layer_ms / 3.0
    floor[:, 1] += layer_ms * 2.0 / 3.0
    notify = profile.metadata.get("moe_notify_ms", 0.0)  # the host waits for DeepEP's internode notify (cost.experts)
    if isinstance(notify, float) and notify > 0:
        floor[:, 0] += notify * np.array([layer.moe is not None for layer in profile.layers])
    return floor[:, 0], floor[:, 1]


def fp8_gemms(layer: Layer, ep: int) -> tuple[int, int]:
    """(FP8 GEMM modules, of them routed-expert GEMMs) one pass of ``layer`` runs in each direction
    under an FP8 recipe, each quantising its input in the forward and its output's gradient in the
    backward (module docstring): a block with an FP8 view (``Layer.fp8``) :data:`FP8_GEMMS_PER_BLOCK`,
    an MoE layer's attention half :data:`FP8_GEMMS_PER_ATTENTION` and two per routed expert the device
    holds (``ep`` the expert-parallel degree); a layer kept bf16 none."""
    if layer.fp8 is None:
        return (0, 0)
    if layer.moe is None:
        return (FP8_GEMMS_PER_BLOCK, 0)
    experts = GEMMS_PER_LOCAL_EXPERT[0] * _local(layer.moe.num_experts, ep)
    return (FP8_GEMMS_PER_ATTENTION + experts, experts)


def moe_kernels(kind: str, num_experts: int, ep: int) -> tuple[int, int]:
    """(forward, backward) kernels of one pass of an MoE layer of ``kind`` whose ``num_experts``
    routed experts are spread over ``ep`` devices (module docstring): the layer's own count plus
    :data:`GEMMS_PER_LOCAL_EXPERT` per expert the device holds; (0, 0) for a kind not counted."""
    if kind not in KERNELS:
        return (0, 0)
    local = _local(num_experts, ep)
    f, b = KERNELS[kind]
    return f + GEMMS_PER_LOCAL_EXPERT[0] * local, b + GEMMS_PER_LOCAL_EXPERT[1] * local


def _local(num_experts: int, ep: int) -> int:
    """Routed experts one device holds with ``num_experts`` over ``ep`` devices (at least one)."""
    return max(1, num_experts // max(1, ep))
