"""A GPT-style decoder whose MLPs are mixtures of experts (``moe:...`` in the zoo).

Layers: ``embed``, ``block0`` .. ``block{N-1}``, ``head`` (the zoo GPT's embedding and tied
head, :mod:`planner.models.gpt`). Blocks ``0 .. dense - 1`` are the GPT's dense blocks (the
first k layers dense, as DeepSeek-V3's first 3); the others are pre-LN blocks whose MLP is a
:class:`MoEFeedForward`: a router (top-k of E experts), the routed experts
(:class:`planner.models.experts.RoutedExperts`, grouped weights, dispatched by all-to-all when
run expert-parallel), and, with ``shared`` = 1, a shared expert every token passes through
(DeepSeekMoE, Dai et al. 2024; Qwen-MoE).

The router is deterministic, so a run split over ranks routes every token as one process does:

- ``router=topk`` (default): softmax of the router's logits, the ``topk`` largest chosen by a
  *stable* sort (equal probabilities: the lower expert index first), their probabilities
  renormalised to sum to 1 (Mixtral; Qwen3-MoE's ``norm_topk_prob``) as the gates;
- ``router=balanced``: forced balance, as Megatron-Core's ``--moe-router-force-load-balancing``
  benchmarks run: the token at sequence position p takes experts (p topk + j) mod E,
  j < topk (every expert receives s topk / E tokens of each sample when E divides s topk),
  gated by the router's renormalised probabilities of those experts, so the router still
  trains. Positions are global under context and sequence parallelism (:func:`positions`).

No auxiliary load-balancing loss and no capacity limit (dropless, Megatron-Core's default
``--moe-token-dispatcher-type alltoall`` without ``--moe-expert-capacity-factor``): the loss is
the language model's alone.

Tokens are flattened batch-major, (b, s) -> b s rows, a view of the norm's output (so that the
norm's recomputation frees what the router saves). Under sequence parallelism a rank's rows are
its slice of every sample: the router's ``SequenceParallel`` style (:func:`moe_styles`) treats
them as a shard of dim 0, which only sums the gate's gradient over the ranks (the rows' order
within the whole does not enter).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from planner.models.common import SelfAttention, generator, mean_cross_entropy, megatron_styles, parse_dtype, seeded
from planner.models.context import context_of
from planner.models.dropped import recomputed
from planner.models.experts import EXPERT_ATTR, ExpertShard, RoutedExperts, gather_tokens, split_tokens
from planner.models.gpt import Block, Embedding, GPTConfig, Head
from planner.models.selective import RECOMPUTE_ATTR
from planner.models.workload import ContextParallel, TensorParallel, Workload

__all__ = ["MoEConfig", "MoEFeedForward", "Router", "build", "moe_model_flops_per_sample", "moe_styles"]

ROUTERS = ("topk", "balanced")


@dataclass(frozen=True, slots=True, kw_only=True)
class MoEConfig:
    """Options of ``moe:...``."""

    ZERO_ALLOWED: ClassVar[tuple[str, ...]] = ("shared", "dense")  # counts that may be 0 (planner.models.spec)

    layers: int = 4
    """transformer blocks (dense and MoE)"""
    hidden: int = 128
    """model width"""
    heads: int = 4
    """attention heads (must divide hidden)"""
    seq: int = 64
    """tokens per sample"""
    vocab: int = 512
    """vocabulary size"""
    experts: int = 8
    """routed experts E per MoE block"""
    topk: int = 2
    """experts each token is routed to"""
    ffn: int = 256
    """hidden width of each expert (and of the shared expert)"""
    shared: int = 0
    """shared experts (0 or 1): an MLP of width ffn every token passes through"""
    dense: int = 1
    """the first blocks that are dense (the GPT's 4x MLP)"""
    router: str = "topk"
    """``topk`` (learned top-k) or ``balanced`` (forced balance by position)"""
    seed: int = 0
    """weight seed"""
    dtype: str = "float32"
    """parameter dtype: float32 | float64 | bfloat16"""

    def check(self) -> None:
        """Refuse options that do not combine (a ValueError naming them; the zoo prefixes the spec)."""
        if self.topk > self.experts:
            raise ValueError(f"topk ({self.topk}) must be at most experts ({self.experts})")
        if self.shared not in (0, 1):
            raise ValueError(f"shared must be 0 or 1 (got {self.shared})")
        if self.dense > self.layers:
            raise ValueError(f"dense ({self.dense}) must be at most layers ({self.layers})")
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)} (got {self.router!r})")

    def gpt(self) -> GPTConfig:
        """The GPT options of the embedding, the dense blocks and the head."""
        return GPTConfig(layers=self.layers, hidden=self.hidden, heads=self.heads, seq=self.seq, vocab=self.vocab,
                         seed=self.seed, dtype=self.dtype)


def positions(module: nn.Module, seq_len: int, device: torch.device) -> torch.Tensor:
    """Global sequence positions of the ``seq_len`` tokens of each sample ``module`` sees: its
    context-parallel share (:func:`planner.models.context.context_of`), and of that its
    sequence-parallel slice (the ``ExpertShard.sequence_split`` of the layer's experts)."""
    experts = next((m for m in module.modules() if isinstance(m, RoutedExperts)), None)
    shard: ExpertShard | None = getattr(experts, EXPERT_ATTR, None)
    sp = shard.sequence_split if shard is not None else None
    whole = seq_len * (sp.degree if sp is not None else 1)
    cp = context_of(module)
    base = cp.positions(whole, device) if cp is not None else torch.arange(whole, device=device)
    if sp is None or sp.degree == 1:
        return base
    return base[sp.index * seq_len : (sp.index + 1) * seq_len]


class Router(nn.Module):
    """Top-k gating (module docstring): ``gate`` (hidden -> E logits, no bias)."""

    def __init__(self, hidden: int, experts: int, topk: int, mode: str) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.experts, self.topk, self.mode = experts, topk, mode

    def forward(self, tokens: torch.Tensor, token_positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``tokens`` (N, hidden), their positions (N,) -> (choices (N, topk) int64, gates (N, topk))."""
        probs = self.gate(tokens).softmax(dim=-1)
        if self.mode == "balanced":
            offsets = torch.arange(self.topk, device=tokens.device)
            choices = (token_positions[:, None] * self.topk + offsets) % self.experts
        else:
            choices = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, : self.topk]
        gates = probs.gather(-1, choices)
        return choices, gates / gates.sum(dim=-1, keepdim=True)


class SharedExpert(nn.Module):
    """The shared expert: hidden -> ffn -> hidden, GELU, no bias (split by tensor parallelism as
    Megatron's MLP: ``fc`` by columns, ``out`` by rows)."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden, ffn, bias=False)
        self.out = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.nn.functional.gelu(self.fc(x)))


class MoEFeedForward(nn.Module):
    """Router, routed experts and the optional shared expert, on (batch, seq, hidden) tensors."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.router = Router(cfg.hidden, cfg.experts, cfg.topk, cfg.router)
        self.experts = RoutedExperts(cfg.hidden, cfg.ffn, cfg.experts)
        self.experts.shared_experts = cfg.shared
        self.shared = SharedExpert(cfg.hidden, cfg.ffn) if cfg.shared else None

    def forward(self, x: torch.Tensor, recompute_act: bool = False) -> torch.Tensor:
        """``recompute_act``: the experts' GELU outputs recomputed in backward (Megatron's ``moe_act``)."""
        batch, seq, hidden = x.size(0), x.size(1), x.size(2)  # not unpacked: torch.fx traces this
        tokens = x.reshape(batch * seq, hidden)  # a view: rows batch-major (module docstring)
        token_positions = positions(self, seq, x.device).repeat(batch)
        choices, gates = self.router(tokens, token_positions)
        shard: ExpertShard | None = getattr(self.experts, EXPERT_ATTR, None)
        if shard is None or shard.token_split.degree == 1:
            routed = self.experts(tokens, choices, gates, recompute_act)
        else:  # tokens replicated over tp ranks: each routes its share (planner.models.experts)
            split = shard.token_split
            mine = self.experts(split_tokens(tokens, split), split_tokens(choices, split), split_tokens(gates, split),
                                recompute_act)
            routed = gather_tokens(mine, split, tokens.size(0))
        out = routed.view(batch, seq, hidden)
        return out + self.shared(x) if self.shared is not None else out


class MoEBlock(nn.Module):
    """Pre-LN decoder block with a mixture of experts: x + attn(ln1(x)), then x + moe(ln2(x)).

    Its selective recompute level is Megatron-Core's ``--recompute-modules moe_act layernorm``
    (what the plan's ``recompute_selective`` means for a layer with routed experts,
    ``planner.artifacts.moe``): the block, not its attention, owns the switch
    (:data:`planner.models.selective.RECOMPUTE_ATTR`, set by ``set_selective``); when on, the
    outputs of both norms and of the experts' GELUs are recomputed in backward instead of kept
    (:func:`planner.models.dropped.recomputed`), and the attention core is kept."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = SelfAttention(cfg.hidden, cfg.heads, causal=True)
        delattr(self.attn, RECOMPUTE_ATTR)  # not an attention core selective recomputation re-runs here
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.moe = MoEFeedForward(cfg)
        setattr(self, RECOMPUTE_ATTR, False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        on = bool(getattr(self, RECOMPUTE_ATTR, False)) and torch.is_grad_enabled()
        y = self.ln1(x)
        with recomputed(y, lambda x=x: self.ln1(x)) if on else contextlib.nullcontext():
            x = x + self.attn(y)
        y = self.ln2(x)
        with recomputed(y, lambda x=x: self.ln2(x)) if on else contextlib.nullcontext():
            return x + self.moe(y, recompute_act=on)


def moe_styles(layer: nn.Module, sequence_parallel: bool) -> dict[str, Any] | None:
    """Megatron-LM's tensor-parallel split of a layer (:func:`planner.models.common.megatron_styles`:
    attention, the dense MLP, the norms with sequence parallelism), plus the shared expert split
    as an MLP (``fc`` by columns, ``out`` by rows) and, with sequence parallelism, the router's
    gate replicated over the tp ranks with its input their slices (``SequenceParallel`` on the
    rows, dim 0: its gradient summed over them). The routed experts are not split by tensor
    parallelism: expert parallelism and expert tensor parallelism place them
    (``planner.runtime.experts``)."""
    plan = megatron_styles(layer, sequence_parallel)
    if plan is None:
        return None
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    stream = Shard(1) if sequence_parallel else Replicate()
    for name, sub in layer.named_modules():
        if isinstance(sub, SharedExpert):
            plan[name] = PrepareModuleInput(input_layouts=(stream,), desired_input_layouts=(Replicate(),))
            plan[f"{name}.fc"] = ColwiseParallel()
            plan[f"{name}.out"] = RowwiseParallel(output_layouts=stream)
        elif isinstance(sub, Router) and sequence_parallel:
            plan[f"{name}.gate"] = SequenceParallel(sequence_dim=0, use_local_output=True)
    return plan


def moe_model_flops_per_sample(cfg: MoEConfig) -> float:
    """Model FLOPs of one training sample (forward + backward = 3 x forward, no recomputation),
    counting the experts a token is routed to, not all E ("active" FLOPs: Fedus et al. 2022,
    Switch Transformer sec. 2; DeepSeek-V3's 6 N_active per token): per block the attention's
    8 s h^2 + 4 s^2 h (Narayanan et al. 2021, eq. 3), per dense MLP 16 s h^2, per MoE MLP the
    router 2 s h E plus (topk + shared) x 4 s h ffn; the head 2 s h V."""
    s, h = cfg.seq, cfg.hidden
    attention = 8.0 * s * h * h + 4.0 * s * s * h
    dense_mlp = 16.0 * s * h * h
    moe_mlp = 2.0 * s * h * cfg.experts + (cfg.topk + cfg.shared) * 4.0 * s * h * cfg.ffn
    blocks = cfg.layers * attention + cfg.dense * dense_mlp + (cfg.layers - cfg.dense) * moe_mlp
    return 3.0 * (blocks + 2.0 * s * h * cfg.vocab)


def build(cfg: MoEConfig) -> Workload:
    """The MoE workload: ``make_batch`` draws random tokens; targets are the next tokens."""
    cfg.check()
    gpt_cfg = cfg.gpt()
    with seeded(cfg.seed):
        embed = Embedding(gpt_cfg)
        blocks: list[nn.Module] = [Block(gpt_cfg) if i < cfg.dense else MoEBlock(cfg) for i in range(cfg.layers)]
        head = Head(gpt_cfg, embed.tok.weight)
    dtype = parse_dtype(cfg.dtype)
    layers = tuple(m.to(dtype) for m in (embed, *blocks, head))
    assert head.proj.weight is embed.tok.weight  # .to() keeps the tie

    def make_batch(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(cfg.vocab, (batch_size, cfg.seq + 1), generator=generator(seed))
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    return Workload(
        name="moe",
        layers=layers,
        layer_names=("embed", *(f"block{i}" for i in range(cfg.layers)), "head"),
        make_batch=make_batch,
        loss_fn=mean_cross_entropy,
        tied=(((0, "tok.weight"), (len(layers) - 1, "proj.weight")),),
        options={k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        tensor_parallel=TensorParallel(styles=moe_styles, must_divide=(cfg.heads,), sequence_length=cfg.seq),
        context_parallel=ContextParallel(sequence_length=cfg.seq),
        model_flops_per_sample=moe_model_flops_per_sample(cfg),
    )
