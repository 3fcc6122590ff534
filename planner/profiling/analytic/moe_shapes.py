"""The shapes of mixture-of-experts decoders from their Hugging Face configs (no torch): Qwen3-MoE
(``qwen3_moe``), Mixtral (``mixtral``), GPT-OSS (``gpt_oss``) and DeepSeek-V3 (``deepseek_v3``),
the keys :class:`transformers.Qwen3MoeConfig`, ``MixtralConfig``, ``GptOssConfig`` and
``DeepseekV3Config`` read (their defaults where a key is absent, as those classes have them).
What each number means for FLOPs, bytes and time: :mod:`planner.profiling.analytic.moe`.

Per family:

- ``qwen3_moe`` (Qwen Team 2025, "Qwen3 Technical Report", sec. 2): grouped-query attention with
  RMSNorm on each head's queries and keys, every layer MoE unless listed in ``mlp_only_layers``
  or off the ``decoder_sparse_step``; ``num_experts`` (or ``num_local_experts``) experts of width
  ``moe_intermediate_size``, top-``num_experts_per_tok``, no shared expert;
- ``mixtral`` (Jiang et al. 2024, "Mixtral of Experts"): grouped-query attention, every layer 8
  experts of width ``intermediate_size``, top-2;
- ``gpt_oss`` (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card"): grouped-query attention
  with biases and per-head sinks, layers alternating a 128-token sliding window and full
  attention (``layer_types``), experts of width ``intermediate_size`` with biases, top-4, a
  router with a bias;
- ``deepseek_v3`` (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", sec. 2.1): multi-head latent
  attention (MLA: queries through a ``q_lora_rank`` bottleneck, keys and values from a
  ``kv_lora_rank`` latent, ``qk_nope_head_dim + qk_rope_head_dim`` wide query/key heads,
  ``v_head_dim`` wide values), the first ``first_k_dense_replace`` layers dense (width
  ``intermediate_size``), the rest ``n_routed_experts`` experts of width ``moe_intermediate_size``
  plus ``n_shared_experts`` shared ones, top-8 routed within ``topk_group`` of ``n_group`` node
  groups (node-limited routing: a token's experts on at most ``topk_group`` nodes, sec. 2.1.2),
  and ``num_nextn_predict_layers`` multi-token-prediction modules (sec. 2.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.artifacts.errors import PlannerInputError
from planner.models.hf_spec import SIZE_LIMITS

__all__ = ["MOE_TYPES", "AttentionShape", "MoeShape", "moe_shape"]

MOE_TYPES = ("qwen3_moe", "mixtral", "gpt_oss", "deepseek_v3")


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionShape:
    """One layer's attention: ``heads`` query heads of query/key width ``qk_dim`` and value width
    ``v_dim``, ``kv_heads`` key/value heads (grouped-query), or with ``kv_lora_rank`` > 0
    multi-head latent attention (``q_lora_rank`` the query bottleneck, 0: none;
    ``rope_dim`` the decoupled rotary part of ``qk_dim``); ``window`` tokens of a sliding
    window (0: full); ``qk_norm``: RMSNorm on each head's queries and keys (Qwen3)."""

    heads: int
    kv_heads: int
    qk_dim: int
    v_dim: int
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    rope_dim: int = 0
    window: int = 0
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    sinks: bool = False

    @property
    def latent(self) -> bool:
        return self.kv_lora_rank > 0


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeShape:
    """A mixture-of-experts decoder (module docstring): per layer its attention and whether its
    MLP is dense; the routed experts, shared experts and router of the MoE layers."""

    model_type: str
    layers: int
    hidden: int
    vocab: int
    seq: int
    tied: bool
    attention: tuple[AttentionShape, ...]  # per layer
    dense: tuple[bool, ...]  # per layer: a dense MLP (else MoE)
    dense_ffn: int  # width of a dense layer's MLP
    experts: int
    top_k: int
    expert_ffn: int
    shared_ffn: int  # total width of the shared experts (0: none)
    expert_bias: bool = False
    router_bias: bool = False
    max_nodes_per_token: int = 0
    mtp_layers: int = 0

    def __post_init__(self) -> None:
        if not self.layers == len(self.attention) == len(self.dense):
            raise PlannerInputError(f"{self.model_type} config: {self.layers} layers, {len(self.attention)} attention "
                                    f"shapes, {len(self.dense)} MLP kinds")
        if not 1 <= self.top_k <= self.experts:
            raise PlannerInputError(f"{self.model_type} config: num_experts_per_tok {self.top_k} must be in "
                                    f"[1, {self.experts}] (the routed experts)")
        if all(self.dense):
            raise PlannerInputError(f"{self.model_type} config: no layer has routed experts")


def _int(config: dict[str, Any], key: str, where: str, default: int | None = None, low: int = 1) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlannerInputError(f"{where}: {key!r} must be an integer (got {str(value)[:40]!r})")
    limit = SIZE_LIMITS.get(key, 2**24)
    if not low <= value <= limit:
        raise PlannerInputError(f"{where}: {key!r} must be in [{low}, {limit:,}] (got {value})")
    return value


def _first(config: dict[str, Any], keys: tuple[str, ...], where: str, default: int) -> int:
    """The first of ``keys`` the config has (transformers renamed some across versions)."""
    for key in keys:
        if config.get(key) is not None:
            return _int(config, key, where)
    return default


def _gqa(config: dict[str, Any], where: str, *, window: int = 0, bias: bool = False, o_bias: bool = False,
         qk_norm: bool = False, sinks: bool = False) -> AttentionShape:
    heads = _int(config, "num_attention_heads", where)
    kv = _int(config, "num_key_value_heads", where, heads)
    if heads % kv:
        raise PlannerInputError(f"{where}: num_key_value_heads {kv} must divide num_attention_heads {heads}")
    hidden = _int(config, "hidden_size", where)
    head_dim = _int(config, "head_dim", where) if config.get("head_dim") is not None else hidden // heads
    return AttentionShape(heads=heads, kv_heads=kv, qk_dim=head_dim, v_dim=head_dim, window=window, qkv_bias=bias,
                          o_bias=o_bias, qk_norm=qk_norm, sinks=sinks)


def _qwen3_moe(config: dict[str, Any], where: str) -> dict[str, Any]:
    layers = _int(config, "num_hidden_layers", where, 24)
    step = _int(config, "decoder_sparse_step", where, 1)
    only = config.get("mlp_only_layers") or []
    if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in only):
        raise PlannerInputError(f"{where}: 'mlp_only_layers' must be a list of layer indices")
    att = _gqa(config, where, bias=bool(config.get("attention_bias", False)), o_bias=bool(config.get("attention_bias", False)),
               qk_norm=True)
    return dict(layers=layers, attention=(att,) * layers,
                dense=tuple(i in only or (i + 1) % step != 0 for i in range(layers)),
                dense_ffn=_int(config, "intermediate_size", where, 6144),
                experts=_first(config, ("num_experts", "num_local_experts"), where, 128),
                top_k=_int(config, "num_experts_per_tok", where, 8),
                expert_ffn=_int(config, "moe_intermediate_size", where, 768), shared_ffn=0)


def _mixtral(config: dict[str, Any], where: str) -> dict[str, Any]:
    layers = _int(config, "num_hidden_layers", where, 32)
    window = config.get("sliding_window") or 0
    att = _gqa(config, where, window=_int({"sliding_window": window}, "sliding_window", where, low=0))
    ffn = _int(config, "intermediate_size", where, 14336)
    return dict(layers=layers, attention=(att,) * layers, dense=(False,) * layers, dense_ffn=ffn,
                experts=_int(config, "num_local_experts", where, 8), top_k=_int(config, "num_experts_per_tok", where, 2),
                expert_ffn=ffn, shared_ffn=0)


def _gpt_oss(config: dict[str, Any], where: str) -> dict[str, Any]:
    layers = _int(config, "num_hidden_layers", where, 36)
    kinds = config.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    if not isinstance(kinds, list) or len(kinds) != layers or any(k not in ("sliding_attention", "full_attention")
                                                                   for k in kinds):
        raise PlannerInputError(f"{where}: 'layer_types' must list sliding_attention / full_attention per layer")
    window = _int(config, "sliding_window", where, 128)
    bias = bool(config.get("attention_bias", True))
    atts = tuple(_gqa(config, where, window=window if k == "sliding_attention" else 0, bias=bias, o_bias=bias, sinks=True)
                 for k in kinds)
    ffn = _int(config, "intermediate_size", where, 2880)
    return dict(layers=layers, attention=atts, dense=(False,) * layers, dense_ffn=ffn,
                experts=_int(config, "num_local_experts", where, 128), top_k=_int(config, "num_experts_per_tok", where, 4),
                expert_ffn=ffn, shared_ffn=0, expert_bias=True, router_bias=True)


def _deepseek_v3(config: dict[str, Any], where: str) -> dict[str, Any]:
    layers = _int(config, "num_hidden_layers", where, 61)
    heads = _int(config, "num_attention_heads", where, 128)
    nope, rope = _int(config, "qk_nope_head_dim", where, 128), _int(config, "qk_rope_head_dim", where, 64)
    q_rank = config.get("q_lora_rank", 1536)  # null: queries projected directly (DeepSeek-V2-Lite)
    att = AttentionShape(heads=heads, kv_heads=heads, qk_dim=nope + rope, v_dim=_int(config, "v_head_dim", where, 128),
                         q_lora_rank=0 if q_rank is None else _int({"q_lora_rank": q_rank}, "q_lora_rank", where),
                         kv_lora_rank=_int(config, "kv_lora_rank", where, 512), rope_dim=rope,
                         qkv_bias=bool(config.get("attention_bias", False)))
    first = _int(config, "first_k_dense_replace", where, 3, low=0)
    freq = _int(config, "moe_layer_freq", where, 1)
    routed = _int(config, "n_routed_experts", where, 256)
    shared = _int(config, "n_shared_experts", where, 1, low=0)
    ffn = _int(config, "moe_intermediate_size", where, 2048)
    groups, topk_group = _int(config, "n_group", where, 8), _int(config, "topk_group", where, 4)
    return dict(layers=layers, attention=(att,) * layers, dense=tuple(i < first or i % freq != 0 for i in range(layers)),
                dense_ffn=_int(config, "intermediate_size", where, 18432), experts=routed,
                top_k=_int(config, "num_experts_per_tok", where, 8), expert_ffn=ffn, shared_ffn=shared * ffn,
                max_nodes_per_token=topk_group if topk_group < groups else 0,
                mtp_layers=_int(config, "num_nextn_predict_layers", where, 1, low=0))


_FAMILIES = {"qwen3_moe": _qwen3_moe, "mixtral": _mixtral, "gpt_oss": _gpt_oss, "deepseek_v3": _deepseek_v3}


def moe_shape(config: dict[str, Any], seq: int | None = None, where: str = "moe config") -> MoeShape:
    """The shape of a mixture-of-experts config dict of one of :data:`MOE_TYPES`; ``seq``
    defaults to ``max_position_embeddings``."""
    model_type = config.get("model_type")
    if model_type not in _FAMILIES:
        raise PlannerInputError(f"{where}: model_type {model_type!r} is not a mixture-of-experts family with an analytic "
                                f"profile ({', '.join(MOE_TYPES)})")
    family = _FAMILIES[str(model_type)](config, where)
    tokens = seq if seq is not None else _int(config, "max_position_embeddings", where, 4096)
    return MoeShape(model_type=str(model_type), hidden=_int(config, "hidden_size", where),
                    vocab=_int(config, "vocab_size", where), seq=tokens,
                    tied=bool(config.get("tie_word_embeddings", False)), **family)
