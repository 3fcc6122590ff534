"""The attention of Hugging Face models as the planner runs it (used by :mod:`planner.models.hf`
and :mod:`planner.models.hf_gpt2`): transformers' own SDPA attention function and mask,
registered under the planner's name (:data:`ATTENTION`), which calls it through
:func:`planner.models.selective.run_core` so that every attention module owns an attention
core that selective recomputation can re-run in backward; under context parallelism the core
attends over every rank's keys and values (:mod:`planner.models.context`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from planner.models.context import context_of
from planner.models.selective import RECOMPUTE_ATTR, run_core

__all__ = ["ATTENTION", "mark_attention_cores", "register_attention"]

ATTENTION = "planner_sdpa"  # transformers' SDPA attention, its core run by planner.models.selective


def _planner_sdpa(module: nn.Module, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    shard = context_of(module)  # context parallelism: every rank's keys and values (the block built the mask)
    if shard is None:
        return run_core(module, sdpa_attention_forward, module, query, key, value, *args, **kwargs)
    with shard.regathering():  # a kept core: its saved K/V re-gathered in backward
        return run_core(module, shard.gathered(_context_sdpa, at=1), module, query, key, value, *args, **kwargs)


def _context_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                  **_: Any) -> tuple[torch.Tensor, None]:
    """The attention core under context parallelism: SDPA of the rank's queries over the gathered
    keys and values under the block's boolean mask (``_context_mask``), as transformers'
    ``sdpa_attention_forward`` computes it with a mask, but with grouped-query attention done by
    the kernel (``enable_gqa``) where transformers copies K and V ``heads`` wide first
    (``repeat_kv``, whenever a mask is given): the kernel then saves the gathered K and V
    themselves, which :meth:`SequenceShard.regathering` re-gathers in backward, not a copy it
    would keep (``planner.models.context``)."""
    groups = int(getattr(module, "num_key_value_groups", 1))
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
                                         enable_gqa=groups > 1)
    return out.transpose(1, 2).contiguous(), None


def register_attention() -> None:
    """``planner_sdpa`` in transformers' attention and mask registries (SDPA's own mask)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, _planner_sdpa)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def mark_attention_cores(model: nn.Module) -> None:
    """The attention modules (innermost ``*Attention`` modules) own an attention core."""
    for module in model.modules():
        inner = any(type(c).__name__.endswith("Attention") for c in module.modules() if c is not module)
        if type(module).__name__.endswith("Attention") and not inner:
            setattr(module, RECOMPUTE_ATTR, False)
