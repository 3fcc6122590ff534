"""Pieces shared by the zoo models: dtypes, seeded construction, a self-attention block.

Every zoo model is built under a forked, seeded RNG so weights depend only on the ``seed``
option, never on the global RNG state of the caller.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from planner.artifacts.errors import PlannerInputError
from planner.models.context import context_of
from planner.models.selective import RECOMPUTE_ATTR, run_core

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
    """Multi-head self-attention (Vaswani et al. 2017, sec. 3.2).

    The query, key and value projections are three ``Linear`` layers (``q``, ``k``, ``v``)
    whose weights are the three thirds of one fused ``Linear(hidden, 3 hidden)`` drawn at
    construction, so the function and the seeded weights are those of a fused QKV
    projection. Three layers, not one, because tensor parallelism (Megatron-LM's column
    split, ``ColwiseParallel``) shards a weight's output rows contiguously: a fused QKV
    weight would hand device 0 all the queries and half the keys. The forward infers the
    heads it holds from its query width, so the same module runs whole or sharded. Its
    attention core (``scaled_dot_product_attention``) is what selective recomputation re-runs
    (:mod:`planner.models.selective`). Under context parallelism (:mod:`planner.models.context`)
    it attends its share of the queries to the keys and values gathered from the whole sequence.
    """

    def __init__(self, hidden: int, heads: int, *, causal: bool) -> None:
        super().__init__()
        if hidden % heads:
            raise PlannerInputError(f"hidden ({hidden}) must be divisible by heads ({heads})")
        self.heads = heads
        self.head_dim = hidden // heads
        self.causal = causal
        fused = nn.Linear(hidden, 3 * hidden)
        with torch.random.fork_rng(devices=[]):  # the fused draw alone consumes the RNG, as before
            self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        with torch.no_grad():
            for i, part in enumerate((self.q, self.k, self.v)):
                part.weight.copy_(fused.weight[i * hidden : (i + 1) * hidden])
                part.bias.copy_(fused.bias[i * hidden : (i + 1) * hidden])
        self.proj = nn.Linear(hidden, hidden)
        setattr(self, RECOMPUTE_ATTR, False)

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        batch, seq, width = t.shape
        return t.reshape(batch, seq, width // self.head_dim, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(self.q(x)), self._heads(self.k(x)), self._heads(self.v(x))
        shard = context_of(self)
        if shard is None:
            y = run_core(self, F.scaled_dot_product_attention, q, k, v, is_causal=self.causal)
        else:  # context parallelism: this rank's queries over every key (planner.models.context)
            seq = x.size(1)
            mask = shard.causal_mask(shard.positions(seq, x.device), shard.key_positions(seq, x.device)) if self.causal else None
            with shard.regathering():  # a kept core: its saved K/V re-gathered in backward
                y = run_core(self, shard.gathered(F.scaled_dot_product_attention), q, k, v, attn_mask=mask)
        batch, local_heads, seq, head_dim = y.shape
        return self.proj(y.transpose(1, 2).reshape(batch, seq, local_heads * head_dim))


class MLP(nn.Module):
    """Position-wise feed-forward network with GELU, 4x expansion (GPT-2 / BERT)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.out = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(x)))


def megatron_styles(layer: nn.Module, sequence_parallel: bool) -> dict[str, Any] | None:
    """Megatron-LM's split (Shoeybi et al. 2019) of every :class:`SelfAttention` and
    :class:`MLP` inside ``layer``, as a ``parallelize_module`` plan; None when it holds none.

    Attention: ``q``, ``k``, ``v`` column-split (each device a contiguous block of heads),
    ``proj`` row-split; MLP: ``fc`` column-split, ``out`` row-split. The input of each is
    made one replicated DTensor first, so its three (or one) column-split layers share one
    all-reduce of the input gradient in backward (Megatron's ``f``); the row-split output is
    all-reduced in forward (``g``): two collectives each way per attention + MLP block.

    With ``sequence_parallel`` (Korthikanti et al. 2022) the residual stream is split along
    the sequence (dim 1): the layer takes and returns its device's slice, its layer norms run
    on the slice (``SequenceParallel``), and each attention / MLP all-gathers its input and
    reduce-scatters its output (the runtime slices the stream before a run of split layers
    and gathers it after, see ``planner.runtime.tensor``).
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    stream = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, Any] = {}
    for name, sub in layer.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(sub, SelfAttention):
            cols, row = ("q", "k", "v"), "proj"
        elif isinstance(sub, MLP):
            cols, row = ("fc",), "out"
        else:
            if sequence_parallel and isinstance(sub, nn.LayerNorm):
                plan[name] = SequenceParallel(use_local_output=True)
            continue
        plan[name] = PrepareModuleInput(input_layouts=(stream,), desired_input_layouts=(Replicate(),))
        for col in cols:
            plan[prefix + col] = ColwiseParallel()
        plan[prefix + row] = RowwiseParallel(output_layouts=stream)
    if not any(isinstance(style, RowwiseParallel) for style in plan.values()):
        return None
    return plan
