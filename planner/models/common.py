"""Pieces shared by the zoo models: dtypes, seeded construction, a self-attention block.

Every zoo model is built under a forked, seeded RNG so weights depend only on the ``seed``
option, never on the global RNG state of the caller.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from planner.errors import PlannerInputError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
}


def parse_dtype(name: str) -> torch.dtype:
    """The torch dtype for ``name`` (one of :data:`DTYPES`)."""
    try:
        return DTYPES[name]
    except KeyError:
        raise PlannerInputError(f"dtype must be one of {sorted(DTYPES)} (got {name!r})") from None


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run a block with the CPU RNG seeded to ``seed``, restoring the caller's RNG after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (batches are drawn on CPU, moved by the caller)."""
    return torch.Generator().manual_seed(seed)


def mean_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy over every target position (token or sample)."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


class SelfAttention(nn.Module):
    """Multi-head self-attention, fused QKV projection (Vaswani et al. 2017, sec. 3.2)."""

    def __init__(self, hidden: int, heads: int, *, causal: bool) -> None:
        super().__init__()
        if hidden % heads:
            raise PlannerInputError(f"hidden ({hidden}) must be divisible by heads ({heads})")
        self.heads = heads
        self.causal = causal
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.size(0), x.size(1), x.size(2)
        head_dim = hidden // self.heads
        q, k, v = self.qkv(x).chunk(3, dim=2)
        q = q.reshape(batch, seq, self.heads, head_dim).transpose(1, 2)
        k = k.reshape(batch, seq, self.heads, head_dim).transpose(1, 2)
        v = v.reshape(batch, seq, self.heads, head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, hidden))


class MLP(nn.Module):
    """Position-wise feed-forward network with GELU, 4x expansion (GPT-2 / BERT)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.out = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(x)))
