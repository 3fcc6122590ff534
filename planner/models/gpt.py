"""GPT-style decoder: token + position embedding, N pre-LN blocks, final LN and a tied LM head.

After Radford et al. 2019 (GPT-2): pre-LayerNorm residual blocks, causal self-attention, a
4x GELU MLP, and an output projection that shares its weight with the token embedding
(Press & Wolf 2017). Layers: ``embed``, ``block0`` .. ``block{N-1}``, ``head``; with
``granularity=sublayer`` each block is two layers, ``block{i}.attn`` and ``block{i}.mlp``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from planner.artifacts.errors import PlannerInputError
from planner.models.common import MLP, SelfAttention, generator, mean_cross_entropy, megatron_styles, parse_dtype, seeded
from planner.models.context import context_of
from planner.models.flops import gpt_model_flops_per_sample
from planner.models.workload import ContextParallel, TensorParallel, Workload


@dataclass(frozen=True, slots=True, kw_only=True)
class GPTConfig:
    """Options of ``gpt:...``."""

    layers: int = 4
    """number of transformer blocks"""
    hidden: int = 128
    """model width"""
    heads: int = 4
    """attention heads (must divide hidden)"""
    seq: int = 64
    """tokens per sample"""
    vocab: int = 512
    """vocabulary size"""
    seed: int = 0
    """weight seed"""
    dtype: str = "float32"
    """parameter dtype: float32 | float64 | bfloat16"""
    granularity: str = "block"
    """layer unit: ``block`` (one layer per block) or ``sublayer`` (attention and MLP apart)"""


class Embedding(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq, cfg.hidden)
        # GPT-2's initialisation (std 0.02) keeps the tied head's initial logits small
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        shard = context_of(self)  # context parallelism: the global positions of this rank's tokens
        if shard is None:
            positions = torch.arange(tokens.size(1), device=tokens.device)
        else:
            positions = shard.positions(tokens.size(1), tokens.device)
        return self.tok(tokens) + self.pos(positions)


class Block(nn.Module):
    """Pre-LN decoder block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = SelfAttention(cfg.hidden, cfg.heads, causal=True)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = MLP(cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class PreLNResidual(nn.Module):
    """One half of a block as its own layer: ``x + fn(norm(x))`` (same modules, same weights)."""

    def __init__(self, norm: nn.LayerNorm, fn: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fn(self.norm(x))


def block_layers(blocks: list[Block], granularity: str) -> tuple[list[nn.Module], list[str]]:
    """The blocks as layers: whole, or split into their attention and MLP halves."""
    if granularity == "block":
        return list(blocks), [f"block{i}" for i in range(len(blocks))]
    if granularity == "sublayer":
        layers: list[nn.Module] = []
        names: list[str] = []
        for i, b in enumerate(blocks):
            layers += [PreLNResidual(b.ln1, b.attn), PreLNResidual(b.ln2, b.mlp)]
            names += [f"block{i}.attn", f"block{i}.mlp"]
        return layers, names
    raise PlannerInputError(f"granularity must be 'block' or 'sublayer' (got {granularity!r})")


class Head(nn.Module):
    """Final LayerNorm and the LM head; ``proj.weight`` is the token embedding's weight."""

    def __init__(self, cfg: GPTConfig, tied_weight: nn.Parameter) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.proj.weight = tied_weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.ln(x))


def build(cfg: GPTConfig) -> Workload:
    """The GPT workload: ``make_batch`` draws random tokens; targets are the next tokens."""
    with seeded(cfg.seed):
        embed = Embedding(cfg)
        blocks = [Block(cfg) for _ in range(cfg.layers)]
        head = Head(cfg, embed.tok.weight)
    dtype = parse_dtype(cfg.dtype)
    body, body_names = block_layers(blocks, cfg.granularity)
    layers = tuple(m.to(dtype) for m in (embed, *body, head))
    # .to() keeps Parameter identity, so the head still shares the embedding's weight
    assert head.proj.weight is embed.tok.weight

    def make_batch(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(cfg.vocab, (batch_size, cfg.seq + 1), generator=generator(seed))
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    names = ("embed", *body_names, "head")
    return Workload(
        name="gpt",
        layers=layers,
        layer_names=names,
        make_batch=make_batch,
        loss_fn=mean_cross_entropy,
        tied=(((0, "tok.weight"), (len(layers) - 1, "proj.weight")),),
        options={k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        tensor_parallel=TensorParallel(styles=megatron_styles, must_divide=(cfg.heads,), sequence_length=cfg.seq),
        context_parallel=ContextParallel(sequence_length=cfg.seq),
        model_flops_per_sample=gpt_model_flops_per_sample(layers=cfg.layers, hidden=cfg.hidden, seq=cfg.seq, vocab=cfg.vocab),
    )
