"""BERT-style encoder: token + position embedding with LayerNorm, N post-LN encoder blocks,
and a mean-pooled classifier head.

After Devlin et al. 2019 (post-LayerNorm residual blocks, bidirectional self-attention,
4x GELU MLP). Layers: ``embed``, ``block0`` .. ``block{N-1}``, ``head``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from planner.models.common import MLP, SelfAttention, generator, mean_cross_entropy, megatron_styles, parse_dtype, seeded
from planner.models.workload import TensorParallel, Workload


@dataclass(frozen=True, slots=True, kw_only=True)
class BERTConfig:
    """Options of ``bert:...``."""

    layers: int = 4
    """number of encoder blocks"""
    hidden: int = 128
    """model width"""
    heads: int = 4
    """attention heads (must divide hidden)"""
    seq: int = 64
    """tokens per sample"""
    vocab: int = 512
    """vocabulary size"""
    classes: int = 4
    """output classes of the pooled classifier"""
    seed: int = 0
    """weight seed"""
    dtype: str = "float32"
    """parameter dtype: float32 | float64 | bfloat16"""


class Embedding(nn.Module):
    def __init__(self, cfg: BERTConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq, cfg.hidden)
        self.ln = nn.LayerNorm(cfg.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.size(1), device=tokens.device)
        return self.ln(self.tok(tokens) + self.pos(positions))


class Block(nn.Module):
    """Post-LN encoder block: ln1(x + attn(x)), then ln2(x + mlp(x))."""

    def __init__(self, cfg: BERTConfig) -> None:
        super().__init__()
        self.attn = SelfAttention(cfg.hidden, cfg.heads, causal=False)
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.mlp = MLP(cfg.hidden)
        self.ln2 = nn.LayerNorm(cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class Head(nn.Module):
    def __init__(self, cfg: BERTConfig) -> None:
        super().__init__()
        self.pool = nn.Linear(cfg.hidden, cfg.hidden)
        self.fc = nn.Linear(cfg.hidden, cfg.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.pool(x.mean(dim=1))))


def build(cfg: BERTConfig) -> Workload:
    """The BERT workload: random tokens in, random class labels as targets."""
    with seeded(cfg.seed):
        layers = (Embedding(cfg), *(Block(cfg) for _ in range(cfg.layers)), Head(cfg))
    dtype = parse_dtype(cfg.dtype)

    def make_batch(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = generator(seed)
        tokens = torch.randint(cfg.vocab, (batch_size, cfg.seq), generator=gen)
        return tokens, torch.randint(cfg.classes, (batch_size,), generator=gen)

    return Workload(
        name="bert",
        layers=tuple(m.to(dtype) for m in layers),
        layer_names=("embed", *(f"block{i}" for i in range(cfg.layers)), "head"),
        make_batch=make_batch,
        loss_fn=mean_cross_entropy,
        options={k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        tensor_parallel=TensorParallel(styles=megatron_styles, must_divide=(cfg.heads,), sequence_length=cfg.seq),
    )
