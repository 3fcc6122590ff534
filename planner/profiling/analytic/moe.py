"""Analytic profiles of mixture-of-experts decoders from Hugging Face configs (no torch): the
Qwen3-MoE, Mixtral, GPT-OSS and DeepSeek-V3 shapes of :mod:`planner.profiling.analytic.moe_shapes`.

Layers: ``embed``, ``block_0 .. block_{L-1}`` (attention, then a dense MLP or an MoE layer),
``mtp_0 ..`` (DeepSeek-V3's multi-token-prediction modules: its two RMSNorms, the ``2h x h``
projection and one MoE block, sharing the embedding table and the head with the main model,
DeepSeek-AI 2024 sec. 2.2) and ``head`` (final RMSNorm + LM head; with MTP modules it computes
their logits too). Times are priced on a device preset as for Llama
(:mod:`planner.profiling.analytic.llama`): each GEMM at the throughput its shape achieves
(:mod:`planner.profiling.analytic.gemm`) plus the memory-bound time of the bytes saved for
backward. Per sample of ``s`` tokens, hidden ``h``, ``E`` routed experts of width ``F``, top-``k``,
shared experts of total width ``F_s``, bf16:

- FLOPs, 2 per multiply-add, matmuls only (Narayanan et al. 2021 eq. 3's counting; the attention
  core the whole ``s x s`` square, ``s x w`` under a sliding window of ``w``): the attention
  projections (GQA ``4 s h a d + 4 s h g d``; MLA its down- and up-projections), the core
  ``4 s^2 a d`` (MLA: ``2 s^2 a (d_nope + d_rope) + 2 s^2 a d_v``), the router ``2 s h E``, the
  shared experts ``6 s h F_s`` and **each routed expert a token visits** ``6 h F`` per token
  (gate, up and down products: Megatron-LM's ``num_floating_point_operations``, which counts
  ``moe_router_topk`` experts of ``moe_ffn_hidden_size`` with the SwiGLU factor 3/2 on two
  GEMMs), so ``6 s k h F`` per MoE layer; a dense layer's MLP ``6 s h I``; the head ``2 s h V``
  (per MTP module once more). The routed experts are grouped GEMMs: ``E`` products of
  ``m x h . h x 2F`` and ``m x F . F x h`` over the ``m = b s k / E`` tokens each expert receives
  at micro-batch ``b`` (tokens spread evenly), each at the GEMM model's efficiency for that
  shape (on a device of an expert-parallel group: the per-device shape,
  :mod:`planner.cost.experts`).
- saved for backward (Korthikanti et al. 2022 sec. 4.1 counting, fused kernels): the two
  RMSNorms' inputs and outputs ``8 s h``; attention: GQA ``Q, K, V, O`` and the fp32
  log-sum-exp (``2 s (2 a d + 2 g d) + 4 a s``; Qwen3's per-head query/key norms also keep their
  inputs, ``2 s (a + g) d``), MLA also its latents (``4 s (r_q + r_kv) + 2 s d_rope``); the router's
  fp32 scores ``4 s E``; a fused SwiGLU MLP (dense or shared) its gate/up output and the down
  projection's input, ``6 s I``; the routed experts per token copy its permuted input ``2 h``,
  the gate/up output ``4 F``, the activation's output ``2 F`` and the fp32 probability ``4``:
  ``s k (2 h + 6 F + 4)``. Recomputing the experts' activation (``moe_act``) frees ``2 F`` per copy,
  recomputing the norms (``layernorm``) their outputs ``4 s h``: the MoE layer's selective level
  (:mod:`planner.artifacts.moe`), at the memory-bound time of reading the gate/up output and the
  norms' inputs and writing what they free.
- parameters: the attention's projections (and biases), two RMSNorms ``2 h`` (Qwen3's query/key
  norms ``2 d``), the router ``h E`` (GPT-OSS: + ``E`` bias), ``E`` routed experts ``3 h F`` each
  (GPT-OSS: + ``2F + h`` biases), the shared experts ``3 h F_s``, a dense MLP ``3 h I``; embedding
  and head ``V h`` each (untied in all four families), the final norm ``h``.

Tensor parallelism (``Layer.tp``, of each layer without its routed experts): Megatron's split of
the attention (heads; MLA's down-projections stay whole), the shared experts and a dense MLP;
the router stays whole (with sequence parallelism it runs on ``s / t`` tokens); one collective
per attention and per tensor-parallel MLP in each direction. The routed experts follow the
expert layout (EP x ETP), not ``t``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from planner.artifacts.kinds import AttentionKind, DType
from planner.artifacts.moe import MoeLayer
from planner.artifacts.profile import Edge, Layer, Profile, TiedParams, TimeFit, profile_fingerprint
from planner.profiling.analytic.attention import attention_core_cost
from planner.profiling.analytic.common import (
    BYTES_PER_ACT,
    BYTES_PER_PARAM,
    DeviceRates,
    LayerSpec,
    MegatronSplit,
    analytic_layer,
    device_rates,
)
from planner.profiling.analytic.gemm import Gemm, GemmModel
from planner.profiling.analytic.gpt import attention_gemms
from planner.profiling.analytic.grouped import FIT_SIZES, expert_gemm_ms, line_through
from planner.profiling.analytic.moe_shapes import AttentionShape, MoeShape, moe_shape

__all__ = ["moe_model_flops_per_sample", "moe_profile"]

@dataclass(frozen=True, slots=True)
class Part:
    """A piece of a block: its GEMMs, parameters (all, tensor-split), saved bytes per sample (all,
    tensor-split) and the inputs of its weight GEMMs (what W keeps)."""

    gemms: tuple[Gemm, ...]
    params: int
    split_params: int
    saved: float
    split_saved: float
    wsaved: float


def _attention(att: AttentionShape, s: int, h: int) -> tuple[Part, tuple[Gemm, ...], float]:
    """The attention's part, its core's GEMMs and the core's saved bytes (module docstring)."""
    a, g, d, dv = att.heads, att.kv_heads, att.qk_dim, att.v_dim
    core: tuple[Gemm, ...]
    if att.window and att.window < s:  # each query against w keys: no causal half to skip
        core = (Gemm(name="flash_window", m=s, n=att.window, k=(d + dv) // 2, count=2 * a, batch="count", split="count",
                     fused=True, bwd_factor=2.5, weighted=False),)
    else:
        core = attention_gemms(s, a, (d + dv) // 2, flash=True)
    core_saved = attention_core_cost(AttentionKind.FLASH, seq=s, heads=a, head_dim=d).saved_bytes
    out = Gemm(name="o", m=s, n=h, k=a * dv, split="k", window=0)
    if att.latent:
        r_q, r_kv, rope = att.q_lora_rank, att.kv_lora_rank, att.rope_dim
        q = ((Gemm(name="q_down", m=s, n=r_q, k=h), Gemm(name="q_up", m=s, n=a * d, k=r_q, split="n", window=0,
                                                         bwd_window=0)) if r_q else
             (Gemm(name="q", m=s, n=a * d, k=h, split="n", window=0, bwd_window=0),))
        gemms = (*q, Gemm(name="kv_down", m=s, n=r_kv + rope, k=h),
                 Gemm(name="kv_up", m=s, n=a * (d - rope + dv), k=r_kv, split="n", window=0, bwd_window=0), *core, out)
        split = (a * d * (r_q or h)) + r_kv * a * (d - rope + dv) + a * dv * h
        whole = (h * r_q + r_q if r_q else 0) + h * (r_kv + rope) + r_kv
        saved_whole = 2.0 * s * (2 * r_q + 2 * r_kv + rope)
        wsaved = 2.0 * s * (r_q + r_kv + a * dv)
    else:
        gemms = (Gemm(name="q", m=s, n=a * d, k=h, split="n", window=0, bwd_window=0),
                 Gemm(name="kv", m=s, n=g * d, k=h, count=2, split="n", window=0, bwd_window=0), *core, out)
        bias = (a * d + 2 * g * d if att.qkv_bias else 0) + (h if att.o_bias else 0) + (a if att.sinks else 0)
        split, whole = h * a * d + 2 * h * g * d + a * dv * h + bias, 2 * d if att.qk_norm else 0
        saved_whole = 0.0
        wsaved = 2.0 * s * a * dv
    kv = a if att.latent else g  # MLA: every head has its own key and value
    qk = 2.0 * s * (a + g) * d if att.qk_norm else 0.0  # the per-head norms' inputs
    split_saved = 2.0 * s * (a * d + kv * d + kv * dv + a * dv) + qk + 4.0 * a * s
    return Part(gemms, split + whole, split, saved_whole + split_saved, split_saved, wsaved), core, core_saved


def _mlp(name: str, s: int, h: int, width: int, window: int) -> Part:
    """A tensor-parallel SwiGLU MLP of ``width`` (a dense layer's, or the shared experts')."""
    gemms = (Gemm(name=f"{name}_gate_up", m=s, n=width, k=h, count=2, split="n", window=window, bwd_window=window),
             Gemm(name=f"{name}_down", m=s, n=h, k=width, split="k", window=window))
    return Part(gemms, 3 * h * width, 3 * h * width, 6.0 * s * width, 6.0 * s * width, 2.0 * s * (h + width))


@dataclass(frozen=True, slots=True)
class Experts:
    """The routed experts of one MoE layer per sample: their saved bytes, the part the activation's
    recomputation frees, the inputs of their weight GEMMs, parameters."""

    saved: float
    act: float
    wsaved: float
    params: int


def _experts(shape: MoeShape) -> Experts:
    s, h, k, f, e = shape.seq, shape.hidden, shape.top_k, shape.expert_ffn, shape.experts
    copies = float(s * k)
    bias = e * (2 * f + h) if shape.expert_bias else 0
    return Experts(saved=copies * (2 * h + 6 * f + 4), act=copies * 2 * f, wsaved=copies * 2 * (h + f),
                   params=e * 3 * h * f + bias)


def _block(shape: MoeShape, i: int, rates: DeviceRates, name: str, extra: Part | None = None) -> Layer:
    """Block ``i`` (attention, then a dense MLP or an MoE layer), or an MTP module (``extra``: its
    projection and norms) around the MoE block."""
    s, h = shape.seq, shape.hidden
    att, core_gemms, core_saved = _attention(shape.attention[i], s, h)
    dense = shape.dense[i] and extra is None
    parts: list[Part] = [att] + ([extra] if extra is not None else [])
    if dense:
        parts.append(_mlp("mlp", s, h, shape.dense_ffn, 1))
    else:
        e = shape.experts
        parts.append(Part((Gemm(name="router", m=s, n=e, k=h),), h * e + (e if shape.router_bias else 0), 0,
                          4.0 * s * e, 0.0, 2.0 * s * h))
        if shape.shared_ffn:
            parts.append(_mlp("shared", s, h, shape.shared_ffn, 1))
    norms = 8.0 * s * h
    gemms = tuple(g for p in parts for g in p.gemms)
    params = sum(p.params for p in parts) + 2 * h
    saved = norms + sum(p.saved for p in parts)
    split_saved = sum(p.split_saved for p in parts)
    collectives = 1 + (1 if dense or shape.shared_ffn else 0)
    att_shape = shape.attention[i]
    divide = (att_shape.heads,) if att_shape.latent else (att_shape.heads, att_shape.kv_heads)
    act = BYTES_PER_ACT * s * h
    split = MegatronSplit(act_bytes_per_sample=act, params=sum(p.split_params for p in parts),
                          saved_bytes_per_sample=split_saved, collectives_fwd=collectives, collectives_bwd=collectives,
                          must_divide=divide)
    layer = analytic_layer(LayerSpec(
        name=name, kind="MoEDecoderLayer" if not dense else "DecoderLayer", gemms=gemms, split=split,
        core=(core_gemms, core_saved), param_count=params, saved_bytes_per_sample=saved,
        input_bytes_per_sample=act, output_bytes_per_sample=act,
        wsaved_bytes_per_sample=2.0 * s * h * 2 + sum(p.wsaved for p in parts)), rates)
    return layer if dense else _with_experts(layer, shape, rates)


def _with_experts(layer: Layer, shape: MoeShape, rates: DeviceRates) -> Layer:
    """``layer`` (the block without its routed experts) with them: their times, parameters and
    saved bytes added, and ``Layer.moe`` saying which part is theirs."""
    ex = _experts(shape)
    s, h, k, e, f = shape.seq, shape.hidden, shape.top_k, shape.experts, shape.expert_ffn
    per_byte = 1.0 / rates.bytes_per_ms

    def gemm(b: int, backward: bool = False) -> float:
        return expert_gemm_ms(rates.gemm, rates.peak_flops_per_ms, tokens_per_expert=b * s * k / e, experts=e,
                              hidden=h, ffn=f, backward=backward)

    fwd = line_through({b: gemm(b) + ex.saved * b * per_byte for b in FIT_SIZES})
    bwd = line_through({b: gemm(b, True) + 2.0 * ex.saved * b * per_byte for b in FIT_SIZES})
    norms = 4.0 * s * h
    recompute = line_through({b: (s * k * 6.0 * f + 2.0 * norms) * b * per_byte for b in FIT_SIZES})
    big = FIT_SIZES[-1]
    bwd_total = layer.bwd.at(big) + bwd.at(big)
    w_share = (layer.wgrad_fraction * layer.bwd.at(big) + gemm(big)) / bwd_total if bwd_total > 0 else 0.0
    saved = layer.saved_bytes_per_sample + ex.saved
    w_saved = (layer.wgrad_saved_fraction * layer.saved_bytes_per_sample + ex.wsaved) / saved
    moe = MoeLayer(num_experts=e, top_k=k, shared_experts=1 if shape.shared_ffn else 0, hidden=h, tokens_per_sample=s,
                   expert_ffn_hidden=f,
                   expert_param_count=ex.params, expert_fwd=fwd, expert_bwd=bwd, expert_saved_bytes_per_sample=ex.saved,
                   act_saved_bytes_per_sample=ex.act, norm_saved_bytes_per_sample=norms, recompute_fwd=recompute,
                   max_nodes_per_token=shape.max_nodes_per_token)
    return replace(
        layer, fwd=_add(layer.fwd, fwd), bwd=_add(layer.bwd, bwd), param_count=layer.param_count + ex.params,
        param_bytes=(layer.param_count + ex.params) * BYTES_PER_PARAM, saved_bytes_per_sample=saved,
        weight_grad_fraction=min(1.0, w_share), weight_grad_saved_fraction=min(1.0, w_saved), moe=moe)


def _add(a: TimeFit, b: TimeFit) -> TimeFit:
    return TimeFit(intercept_ms=a.intercept_ms + b.intercept_ms, per_sample_ms=a.per_sample_ms + b.per_sample_ms)


def _layer_fwd_flops(shape: MoeShape, i: int) -> float:
    """Forward FLOPs of block ``i`` per sample (module docstring)."""
    s, h = shape.seq, shape.hidden
    att = shape.attention[i]
    part, core, _ = _attention(att, s, h)
    flops = sum(g.flops for g in part.gemms if g not in core)
    keys = min(att.window, s) if att.window else s
    flops += 2.0 * s * keys * att.heads * (att.qk_dim + att.v_dim)
    if shape.dense[i]:
        return flops + 6.0 * s * h * shape.dense_ffn
    return flops + 2.0 * s * h * shape.experts + 6.0 * s * h * shape.shared_ffn + 6.0 * s * shape.top_k * h * shape.expert_ffn


def moe_model_flops_per_sample(shape: MoeShape) -> float:
    """Forward + backward FLOPs of one sample, no recomputation (3 x forward; MFU's model FLOPs)."""
    s, h = shape.seq, shape.hidden
    blocks = sum(_layer_fwd_flops(shape, i) for i in range(shape.layers))
    last = shape.layers - 1
    mtp = shape.mtp_layers * (_moe_fwd(shape, last) + 2.0 * s * 2 * h * h)
    head = (1 + shape.mtp_layers) * 2.0 * s * h * shape.vocab
    return 3.0 * (blocks + mtp + head)


def _moe_fwd(shape: MoeShape, i: int) -> float:
    return _layer_fwd_flops(replace(shape, dense=tuple(False for _ in shape.dense)), i)


def _mtp(shape: MoeShape, j: int, rates: DeviceRates) -> Layer:
    """DeepSeek-V3's MTP module ``j`` (module docstring): its projection of the two normed hidden
    states and one MoE block (the last layer's attention shape)."""
    s, h = shape.seq, shape.hidden
    proj = Part((Gemm(name="eh_proj", m=s, n=h, k=2 * h, split="n", window=0, bwd_window=0),), 2 * h * h + 2 * h,
                2 * h * h, 2.0 * s * h * 3, 0.0, 4.0 * s * h)
    layer = _block(shape, shape.layers - 1, rates, f"mtp_{j}", extra=proj)
    v_h = shape.vocab * h  # the shared embedding table, tied with the main model's
    return replace(layer, param_count=layer.param_count + v_h, param_bytes=(layer.param_count + v_h) * BYTES_PER_PARAM,
                   output_bytes_per_sample=2.0 * BYTES_PER_ACT * s * h)


def moe_profile(config: dict[str, Any], *, seq: int | None = None, device_preset: str = "h100-80gb",
                gemm: GemmModel | None = None, model: str = "", source: str = "") -> Profile:
    """An analytic Profile of a mixture-of-experts config on a device preset (module docstring)."""
    where = f"--config {source}" if source else "moe config"
    shape = moe_shape(config, seq, where)
    rates = device_rates(device_preset, gemm)
    s, h, V, heads = shape.seq, shape.hidden, shape.vocab, shape.attention[0].heads
    act = BYTES_PER_ACT * s * h
    vocab_split = MegatronSplit(act_bytes_per_sample=act, params=V * h, saved_bytes_per_sample=0.0, collectives_fwd=1,
                                collectives_bwd=0)
    layers = [analytic_layer(LayerSpec(name="embed", kind="Embedding", gemms=(), split=vocab_split, param_count=V * h,
                                       saved_bytes_per_sample=8.0 * s, input_bytes_per_sample=8.0 * s,
                                       output_bytes_per_sample=act), rates)]
    layers += [_block(shape, i, rates, f"block_{i}") for i in range(shape.layers)]
    layers += [_mtp(shape, j, rates) for j in range(shape.mtp_layers)]
    heads_out = 1 + shape.mtp_layers
    head_gemms = (Gemm(name="logits", m=s, n=V, k=h, count=heads_out, split="n", bwd_window=0),)
    head_split = MegatronSplit(act_bytes_per_sample=act, params=V * h, saved_bytes_per_sample=4.0 * s * V * heads_out,
                               collectives_fwd=0, collectives_bwd=1)
    layers.append(analytic_layer(LayerSpec(
        name="head", kind="RMSNorm+Linear", gemms=head_gemms, split=head_split, param_count=V * h + h,
        saved_bytes_per_sample=heads_out * (2.0 * act + 4.0 * s * V), input_bytes_per_sample=act * heads_out,
        output_bytes_per_sample=4.0, wsaved_bytes_per_sample=act * heads_out), rates))
    ties = [TiedParams(name=f"embed.weight=mtp_{j}.embed", layers=(0, 1 + shape.layers + j), param_count=V * h,
                       param_bytes=V * h * BYTES_PER_PARAM) for j in range(shape.mtp_layers)]
    if shape.tied:
        ties.append(TiedParams(name="embed.weight=head.weight", layers=(0, len(layers) - 1), param_count=V * h,
                               param_bytes=V * h * BYTES_PER_PARAM))
    return _assemble(shape, layers, ties, rates, config, model, source, heads)


def _assemble(shape: MoeShape, layers: Sequence[Layer], ties: list[TiedParams], rates: DeviceRates,
              config: dict[str, Any], model: str, source: str, heads: int) -> Profile:
    s, h = shape.seq, shape.hidden
    att = shape.attention[0]
    params = sum(layer.param_count for layer in layers) - sum(t.param_count for t in ties)
    active = params - sum(layer.moe.expert_param_count * (1 - shape.top_k / shape.experts)
                          for layer in layers if layer.moe is not None)
    device = rates.device
    name = model or f"{shape.model_type}-l{shape.layers}-h{h}-e{shape.experts}-k{shape.top_k}-s{s}"
    return Profile(
        model=name, source="analytic", device=device.name, dtype=DType.BFLOAT16, microbatch_sizes=(1,), versions={},
        metadata={
            "architecture": "moe", "model_type": shape.model_type, "config_source": source, **rates.metadata,
            "flops_source": "Narayanan et al. 2021 eq. 3 counting; routed experts per active expert (top-k x 6 h F per "
                            "token, Megatron-LM num_floating_point_operations' convention)",
            "activation_source": "Korthikanti et al. 2022 sec. 4.1 counting with FlashAttention and fused RMSNorm/SwiGLU",
            "layers": shape.layers, "hidden": h, "heads": heads, "kv_heads": att.kv_heads, "head_dim": att.qk_dim,
            "vocab": shape.vocab, "seq": s, "num_experts": shape.experts, "top_k": shape.top_k,
            "expert_ffn": shape.expert_ffn, "shared_ffn": shape.shared_ffn, "dense_layers": sum(shape.dense),
            "mtp_layers": shape.mtp_layers, "param_count": params, "active_param_count": int(round(active)),
            "tie_word_embeddings": shape.tied, "hf_config_keys": len(config),
        },
        fingerprint_sha256=profile_fingerprint(tuple(x.name for x in layers), tuple(() for _ in layers)),
        model_flops_per_sample=moe_model_flops_per_sample(shape), attention=AttentionKind.FLASH, layers=tuple(layers),
        edges=tuple(Edge(src=i, dst=i + 1, bytes_per_sample=layers[i].output_bytes_per_sample)
                    for i in range(len(layers) - 1)),
        tied=tuple(ties),
    )
