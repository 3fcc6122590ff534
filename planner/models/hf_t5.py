"""T5 (encoder-decoder) as a chain of planner layers, the encoder output carried to every
decoder stage (used by :mod:`planner.models.hf`).

Layers: ``embed`` (encoder token embedding), ``enc_block_0 ..``, ``enc_norm`` (the encoder's
final layer norm), ``dec_embed`` (decoder token embedding), ``dec_block_0 ..``, ``dec_norm``,
``head`` (LM head; with tied embeddings the decoder output is scaled by ``d_model^-0.5`` first,
as ``T5ForConditionalGeneration`` does).

What crosses each boundary (a flat tuple, :mod:`planner.models.workload`):

- in the encoder: ``(hidden, enc_mask, dec_ids, dec_mask)``: the decoder's inputs ride along
  (int64, no gradient) until ``dec_embed`` needs them;
- in the decoder: ``(hidden, dec_mask, enc_out, enc_mask)``: every decoder block's
  cross-attention reads the encoder's final output ``enc_out``, so it travels with the
  activations through every decoder stage and its gradient comes back the same way, summed
  over the blocks that read it (a block returns it unchanged; autograd accumulates).

T5's relative position bias is computed by the first block of each stack (its
``relative_attention_bias`` embedding) and reused by the later blocks. Rather than carry the
``heads x s x s`` bias across boundaries, every block computes it from that embedding
(the same computation as ``T5Attention.compute_bias``): the embedding is one parameter shared
by every block of its stack, so the planner ties it (``Workload.tied``) and the runtime sums
its gradients over the stages that hold a copy. The cross-attention has no relative bias
(zeros, as in the model). Masks are transformers' own (bidirectional for the encoder and the
cross-attention, causal for the decoder), built in each block from the carried padding masks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

IGNORE = -100


def _bias(embedding: nn.Embedding, attn: Any, length: int, device: torch.device) -> torch.Tensor:
    """``T5Attention.compute_bias(length, length)`` with ``attn``'s bucket settings and this embedding."""
    context = torch.arange(length, dtype=torch.long, device=device)[:, None]
    memory = torch.arange(length, dtype=torch.long, device=device)[None, :]
    buckets = attn._relative_position_bucket(
        memory - context,
        bidirectional=not attn.is_decoder,
        num_buckets=attn.relative_attention_num_buckets,
        max_distance=attn.relative_attention_max_distance,
    )
    return embedding(buckets).permute([2, 0, 1]).unsqueeze(0)


class EncEmbed(nn.Module):
    def __init__(self, embed: nn.Module) -> None:
        super().__init__()
        self.embed = embed

    def forward(self, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        ids, enc_mask, dec_ids, dec_mask = batch
        return self.embed(ids), enc_mask, dec_ids, dec_mask


class T5Block(nn.Module):
    """One encoder or decoder ``T5Block``, with its stack's relative-bias embedding."""

    def __init__(self, block: nn.Module, bias: nn.Embedding, first_attn: Any, config: Any) -> None:
        super().__init__()
        self.block = block
        self.relative_attention_bias = bias  # the stack's first block's: tied across the stack
        object.__setattr__(self, "_first_attn", first_attn)  # bucket settings only, not a submodule
        object.__setattr__(self, "_config", config)
        self.is_decoder = bool(block.is_decoder)

    def forward(self, hx: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        from transformers import masking_utils as mu

        x = hx[0]
        bias = _bias(self.relative_attention_bias, self._first_attn, x.size(1), x.device)
        if not self.is_decoder:
            _, enc_mask, dec_ids, dec_mask = hx
            mask = mu.create_bidirectional_mask(config=self._config, inputs_embeds=x, attention_mask=enc_mask)
            return self.block(x, attention_mask=mask, position_bias=bias)[0], enc_mask, dec_ids, dec_mask
        _, dec_mask, enc_out, enc_mask = hx
        positions = torch.arange(x.size(1), device=x.device).unsqueeze(0)
        mask = mu.create_causal_mask(config=self._config, inputs_embeds=x, attention_mask=dec_mask, cache=None,
                                     position_ids=positions)
        cross = mu.create_bidirectional_mask(config=self._config, inputs_embeds=x, attention_mask=enc_mask,
                                             encoder_hidden_states=enc_out)
        out = self.block(x, attention_mask=mask, position_bias=bias, encoder_hidden_states=enc_out,
                         encoder_attention_mask=cross)
        return out[0], dec_mask, enc_out, enc_mask


class EncNorm(nn.Module):
    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, hx: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        x, enc_mask, dec_ids, dec_mask = hx
        return self.norm(x), enc_mask, dec_ids, dec_mask


class DecEmbed(nn.Module):
    def __init__(self, embed: nn.Module) -> None:
        super().__init__()
        self.embed = embed

    def forward(self, hx: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        enc_out, enc_mask, dec_ids, dec_mask = hx
        return self.embed(dec_ids), dec_mask, enc_out, enc_mask


class DecNorm(nn.Module):
    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, hx: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return self.norm(hx[0])


class Head(nn.Module):
    def __init__(self, lm_head: nn.Module, scale: float) -> None:
        super().__init__()
        self.lm_head = lm_head
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(x * self.scale if self.scale != 1.0 else x)


def t5_layers(model: nn.Module, config: Any) -> tuple[list[nn.Module], list[str]]:
    """The planner layers of a ``T5ForConditionalGeneration`` and their names."""
    layers: list[nn.Module] = [EncEmbed(model.encoder.embed_tokens)]
    names = ["embed"]
    for stack, prefix in ((model.encoder, "enc"), (model.decoder, "dec")):
        if prefix == "dec":
            layers.append(DecEmbed(model.decoder.embed_tokens))
            names.append("dec_embed")
        first = stack.block[0].layer[0].SelfAttention
        for i, block in enumerate(stack.block):
            layers.append(T5Block(block, first.relative_attention_bias, first, config))
            names.append(f"{prefix}_block_{i}")
        layers.append(EncNorm(stack.final_layer_norm) if prefix == "enc" else DecNorm(stack.final_layer_norm))
        names.append(f"{prefix}_norm")
    scale = config.d_model ** -0.5 if getattr(config, "scale_decoder_outputs", config.tie_word_embeddings) else 1.0
    layers.append(Head(model.lm_head, scale))
    names.append("head")
    return layers, names


def t5_batch_maker(vocab: int, seq: int, padding: bool, pad_id: int, start_id: int) -> Callable[[int, int], Any]:
    """Random source and target token sequences of ``seq`` tokens, right padded; the decoder
    input is the target shifted right behind the start token (``T5ForConditionalGeneration._shift_right``)."""

    def make_batch(batch_size: int, seed: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        src = torch.randint(vocab, (batch_size, seq), generator=gen)
        tgt = torch.randint(vocab, (batch_size, seq), generator=gen)
        masks = []
        for _ in range(2):
            lengths = torch.randint(seq // 2 + 1, seq + 1, (batch_size,), generator=gen) if padding else torch.full((batch_size,), seq)
            masks.append((torch.arange(seq)[None, :] < lengths[:, None]).long())
        enc_mask, dec_mask = masks
        src = torch.where(enc_mask.bool(), src, torch.full_like(src, pad_id))
        labels = torch.where(dec_mask.bool(), tgt, torch.full_like(tgt, IGNORE))
        dec_ids = torch.cat([torch.full_like(tgt[:, :1], start_id), tgt[:, :-1]], dim=1)
        dec_ids = torch.where(dec_mask.bool(), dec_ids, torch.full_like(dec_ids, pad_id))
        return (src, enc_mask, dec_ids, dec_mask), labels

    return make_batch
