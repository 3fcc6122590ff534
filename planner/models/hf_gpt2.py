"""GPT-2 from ``transformers.GPT2Config`` with random weights (optional: needs ``transformers``).

The model is built with ``GPT2LMHeadModel(config)`` (no download) and cut into layers over
its block list, since ``transformers.utils.fx`` is gone in transformers 5.x: ``embed``
(token + position embeddings), ``h0`` .. ``h{N-1}`` (the ``GPT2Block`` modules themselves,
called without a mask: the SDPA attention is then causal), ``head`` (``ln_f`` and the LM head,
whose weight is the token embedding's). Dropout is 0 so that runs are deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from planner.artifacts.errors import PlannerInputError
from planner.models.common import generator, mean_cross_entropy, parse_dtype, seeded
from planner.models.flops import gpt_model_flops_per_sample
from planner.models.hf_attention import ATTENTION, mark_attention_cores, register_attention
from planner.models.workload import Workload


@dataclass(frozen=True, slots=True, kw_only=True)
class GPT2Options:
    """Options of ``gpt2:...`` (mapped onto ``GPT2Config``)."""

    layers: int = 4
    """n_layer"""
    hidden: int = 128
    """n_embd"""
    heads: int = 4
    """n_head"""
    seq: int = 64
    """tokens per sample (n_positions)"""
    vocab: int = 512
    """vocab_size"""
    seed: int = 0
    """weight seed"""
    dtype: str = "float32"
    """parameter dtype: float32 | float64 | bfloat16"""


class Embed(nn.Module):
    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding) -> None:
        super().__init__()
        self.wte = wte
        self.wpe = wpe

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.size(1), device=tokens.device)
        return self.wte(tokens) + self.wpe(positions)


class Block(nn.Module):
    """One ``GPT2Block``; returns its hidden states (older versions return a tuple)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: Any = self.block(x)
        return out[0] if isinstance(out, tuple) else out


class Head(nn.Module):
    def __init__(self, ln_f: nn.LayerNorm, lm_head: nn.Linear) -> None:
        super().__init__()
        self.ln_f = ln_f
        self.lm_head = lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


def build_hf_model(opts: GPT2Options) -> nn.Module:
    """The ``GPT2LMHeadModel`` with random seeded weights, SDPA attention, no dropout."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        raise PlannerInputError("model 'gpt2' needs transformers (pip install 'planner[hf]')") from None
    config = GPT2Config(
        n_layer=opts.layers, n_embd=opts.hidden, n_head=opts.heads, n_positions=opts.seq, vocab_size=opts.vocab,
        embd_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
    )
    register_attention()  # transformers' SDPA through planner.models.selective (its attention cores)
    config._attn_implementation = ATTENTION
    with seeded(opts.seed):
        model = GPT2LMHeadModel(config)
    mark_attention_cores(model)
    return model.to(parse_dtype(opts.dtype))


def build(opts: GPT2Options) -> Workload:
    if opts.hidden % opts.heads:
        raise PlannerInputError(f"hidden ({opts.hidden}) must be divisible by heads ({opts.heads})")
    model = build_hf_model(opts)
    body = model.transformer
    if model.lm_head.weight is not body.wte.weight:
        raise PlannerInputError("transformers did not tie GPT-2's LM head to its token embedding")
    layers = (Embed(body.wte, body.wpe), *(Block(b) for b in body.h), Head(body.ln_f, model.lm_head))

    def make_batch(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(opts.vocab, (batch_size, opts.seq + 1), generator=generator(seed))
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    return Workload(
        name="gpt2",
        layers=layers,
        layer_names=("embed", *(f"h{i}" for i in range(opts.layers)), "head"),
        make_batch=make_batch,
        loss_fn=mean_cross_entropy,
        tied=(((0, "wte.weight"), (len(layers) - 1, "lm_head.weight")),),
        options={k: getattr(opts, k) for k in opts.__dataclass_fields__},
        model_flops_per_sample=gpt_model_flops_per_sample(layers=opts.layers, hidden=opts.hidden, seq=opts.seq,
                                                          vocab=opts.vocab),
    )
