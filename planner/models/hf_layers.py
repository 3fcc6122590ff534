"""The planner's layers of a single-stack Hugging Face model (:mod:`planner.models.hf`): the
embedding, each block called as the model's own forward calls it (its mask and rotary
positions built inside it), the final norm and the head; the token loss and the seeded batches.

Inputs are ``(input_ids, attention_mask)`` (int64, ``b x s``; 1 = token, 0 = padding, right
padded); the padding mask travels with the hidden states through the blocks. Targets are token
labels with ``-100`` where no loss is taken (padding; for the masked LM every position but the
~15% masked ones, at least one a sample, whose input id becomes ``vocab - 1`` as ``[MASK]``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from planner.models.common import generator
from planner.models.context import SequenceShard, context_of

__all__ = ["IGNORE", "MASK_FRACTION", "Block", "Embed", "Head", "Norm", "batch_maker", "token_loss"]

MASK_FRACTION = 0.15  # masked-LM positions per sample (Devlin et al. 2019, section 3.1)
IGNORE = -100


def _hidden(out: Any) -> torch.Tensor:
    """The hidden states of a block's return value (a tensor, a tuple, or a ``ModelOutput``)."""
    if isinstance(out, torch.Tensor):
        return out
    return out[0]


class Embed(nn.Module):
    """``(input_ids, attention_mask)`` -> ``(hidden, attention_mask)``."""

    def __init__(self, model_type: str, embed: nn.Module, positions: nn.Module | None) -> None:
        super().__init__()
        self.model_type = model_type
        self.embed = embed
        self.positions = positions  # GPT-2's wpe

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = batch
        x = self.embed(ids)
        if self.positions is not None:
            x = x + self.positions(torch.arange(ids.size(1), device=ids.device))
        return _hidden(x), mask


class Block(nn.Module):
    """One transformer block of the model, called as the model's own forward calls it."""

    def __init__(self, model_type: str, block: nn.Module, layer_idx: int, config: Any, rotary: nn.Module | None) -> None:
        super().__init__()
        self.model_type = model_type
        self.block = block
        self.layer_idx = layer_idx
        self.rotary = rotary
        object.__setattr__(self, "_config", config)  # not a submodule

    def _mask(self, x: torch.Tensor, pad: torch.Tensor, positions: torch.Tensor) -> Any:
        from transformers import masking_utils as mu

        cfg: Any = self._config
        # the whole sequence's mask: with sequence parallelism x holds this device's slice of the
        # tokens (the attention all-gathers them), the padding mask all of them
        x = x[:, :1].expand(x.size(0), pad.size(1), x.size(2))
        if self.model_type == "bert":
            return mu.create_bidirectional_mask(config=cfg, inputs_embeds=x, attention_mask=pad)
        sliding = self.model_type == "mistral" and cfg.sliding_window is not None
        if self.model_type == "qwen2":
            sliding = cfg.layer_types[self.layer_idx] == "sliding_attention"
        make = mu.create_sliding_window_causal_mask if sliding else mu.create_causal_mask
        return make(config=cfg, inputs_embeds=x, attention_mask=pad, cache=None, position_ids=positions)

    def _context_mask(self, shard: SequenceShard, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """Context parallelism: the (b, 1, local queries, every key) boolean mask of this rank's
        tokens over the gathered keys (``SequenceShard.key_positions``), from global positions: causal,
        the sliding window where the model's layer has one, the keys' padding (``pad`` is whole)."""
        cfg: Any = self._config
        window = None
        if self.model_type == "mistral" or (self.model_type == "qwen2" and cfg.layer_types[self.layer_idx] == "sliding_attention"):
            window = cfg.sliding_window
        keys = shard.key_positions(x.size(1), x.device)
        visible = shard.causal_mask(shard.positions(x.size(1), x.device), keys, window)
        return visible[None, None] & pad[:, keys].bool()[:, None, None, :]

    def forward(self, hx: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        x, pad = hx
        shard = context_of(self)
        if shard is not None:  # x holds this rank's chunks of the tokens, pad the whole padding mask
            positions = shard.positions(x.size(1), x.device).unsqueeze(0)
            mask = self._context_mask(shard, x, pad)
        else:
            positions = torch.arange(pad.size(1), device=x.device).unsqueeze(0)  # every token's (see _mask)
            mask = self._mask(x, pad, positions)
        if self.model_type == "bert":
            out = self.block(x, mask)
        elif self.model_type == "gpt2":
            out = self.block(x, attention_mask=mask)
        else:
            assert self.rotary is not None
            out = self.block(x, attention_mask=mask, position_ids=positions, position_embeddings=self.rotary(x, positions))
        return _hidden(out), pad


class Norm(nn.Module):
    """The final norm; drops the padding mask (the head does not attend)."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, hx: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.norm(hx[0])


class Head(nn.Module):
    def __init__(self, head: nn.Module, takes_tuple: bool) -> None:
        super().__init__()
        self.head = head
        self.takes_tuple = takes_tuple  # no final norm before it: it receives (hidden, mask)

    def forward(self, x: Any) -> torch.Tensor:
        return _hidden(self.head(x[0] if self.takes_tuple else x))


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(summed cross entropy of the labelled tokens, their number)``: HF's token-mean loss
    in the Workload contract's ``(sum, count)`` form."""
    total = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=IGNORE, reduction="sum")
    return total, (labels != IGNORE).sum()


def batch_maker(task: str, vocab: int, seq: int, padding: bool, pad_id: int) -> Callable[[int, int], Any]:
    def make_batch(batch_size: int, seed: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        gen = generator(seed)
        tokens = torch.randint(vocab, (batch_size, seq + 1), generator=gen)
        lengths = torch.randint(seq // 2 + 1, seq + 1, (batch_size,), generator=gen) if padding else torch.full((batch_size,), seq)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        if task == "causal-lm":
            ids, labels = tokens[:, :-1].clone(), tokens[:, 1:].clone()
        else:
            ids = tokens[:, :-1].clone()
            chosen = (torch.rand(batch_size, seq, generator=gen) < MASK_FRACTION) & mask.bool()
            chosen[:, 0] |= ~chosen.any(dim=1)  # at least one masked token a sample
            labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE))
            ids = torch.where(chosen, torch.full_like(ids, vocab - 1), ids)
        ids = torch.where(mask.bool(), ids, torch.full_like(ids, pad_id))
        labels = torch.where(mask.bool(), labels, torch.full_like(labels, IGNORE))
        return (ids, mask), labels

    return make_batch
