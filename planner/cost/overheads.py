"""Overheads a training run pays besides its kernels and its modelled communication, each priced
from a cited measurement, never a fitted factor (issue 47). Four named terms; a plan's
:attr:`~planner.artifacts.plan_summary.Prediction.overheads` says how much each adds to its
iteration (:func:`planner.solve.account.with_accounts` prices the plan with each one off):

- :attr:`OverheadKind.NCCL_COLLECTIVES`: collectives priced by NCCL's own tuning model where the
  cluster says its collectives are NCCL's (``Cluster.collective_model``): data-parallel ones across
  nodes pay its per-step network latency of rings, or the tree it switches to past a few dozen
  nodes at 92% or less of the bandwidth; inside a node its NVLink step latency, below the
  alpha-beta ring's per-step small-message latency (:mod:`planner.cost.collectives`). The term is
  the iteration with NCCL's model less with alpha-beta rings: it can be negative where the plan's
  collectives are mostly inside nodes, and large on a tensor-parallel plan. There the alpha-beta
  ring is the model that is off for NCCL, not NCCL's: it charges the link's small-message latency
  (10 us on the A100 presets, nccl-tests' time of a whole small all-reduce on NVLink) at every one
  of its ``2 (t - 1)`` steps, 140 us per all-reduce over 8 GPUs, as a ring of separate messages
  (gloo's) pays it; NCCL runs the ring's steps in one kernel, pipelined, and its tuning model prices
  them 8.4 us + 14 x 3.4 us = 56 us at the Simple protocol it uses for messages of megabytes (its
  LL protocol, for small ones, 6.6 + 14 x 0.6 = 15 us: the nccl-tests figure). Llama-3 70B at T = 8
  on 16 A100s (seq 8192, 128 MiB per collective, M = 512): ~119,000 tensor-parallel collectives on
  the busiest rank x 84 us = -10.0 s, 1.2% of the iteration; the printed line names the cause;
- :attr:`OverheadKind.P2P_LATENCY`: a pipeline send or receive between nodes takes NCCL's measured
  send/recv time for a small message (``Cluster.inter_node_p2p_latency_us``, 31 us on InfiniBand
  where the link's own latency is 5 us), every micro-batch and chunk boundary;
- :attr:`OverheadKind.HOST`: the CPU issues every kernel (Python, the framework's dispatcher, the
  launch), ``Stack.host_us_per_kernel`` each; a layer's forward or backward pass cannot end before
  its kernels are issued, so it takes ``max(GPU time, kernels x host time)``
  (:func:`host_floor_ms`): small micro-batches and small layers become host-bound;
- :attr:`OverheadKind.STRAGGLER`: a synchronous job runs at the pace of its slowest GPU. GPUs of one
  model differ in speed (Sinha et al. SC'22: 8% average spread between a cluster's slowest and
  fastest GPU, ``Cluster.gpu_speed_variation``); taken as normally distributed, the spread over
  the ``K`` GPUs a study measured is about ``2 sigma z(K)`` and the slowest of a job's ``N`` GPUs is
  ``sigma z(N)`` behind the median, ``z(N)`` the expected largest of ``N`` standard normal draws
  (Blom's approximation, ``Phi^-1((N - 0.375) / (N + 0.25))``). So the iteration grows by the share
  ``variation / 2 x z(N) / z(K)`` (:func:`straggler_fraction`): 1.4% on 8 GPUs, 2.4% on 64, 3.8%
  on 16,384 (K = 27,648, Summit's GPUs, the largest cluster Sinha et al. measured).

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

from statistics import NormalDist

import numpy as np

from planner.artifacts.cluster import Cluster
from planner.artifacts.kinds import OverheadKind, Precision
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
    "OverheadKind",
    "fp8_gemms",
    "host_floor_ms",
    "moe_kernels",
    "straggler_fraction",
    "z_max",
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
#: the GPUs of the cluster Sinha et al. 2022 measured the 8% spread over (Summit: 4,608 nodes x 6 V100s)
SINHA_CLUSTER_GPUS = 27_648


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


def z_max(n: int) -> float:
    """The expected largest of ``n`` standard normal draws (Blom's approximation; 0 for one)."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def straggler_fraction(cluster: Cluster, num_devices: int, variation: float | None = None) -> float:
    """The share by which a synchronous job on ``num_devices`` GPUs of ``cluster`` runs slower than
    its median GPU would (module docstring); ``variation``: the spread to use instead of the
    cluster's."""
    spread = cluster.gpu_speed_variation if variation is None else variation
    if not spread or num_devices <= 1:
        return 0.0
    return spread / 2.0 * z_max(num_devices) / z_max(SINHA_CLUSTER_GPUS)
