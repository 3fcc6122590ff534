"""FLOPs of the transformer blocks the zoo builds and the analytic profiles price (no torch).

Counts per sample of ``s`` tokens, hidden size ``h``, vocabulary ``V`` (Narayanan et al. 2021,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", eq. 3;
matmuls at 2 FLOPs per multiply-add).

Attention's convention is a stated choice (:class:`AttentionFlops`): its scores and values
products are ``4 s^2 h`` FLOPs per sample over the whole ``s x s`` square (``full``: Narayanan et
al. 2021 eq. 3, Megatron-LM's ``num_floating_point_operations`` to 2024, PaLM's appendix B and
torchtitan's ``6 N + 12 L H Q T``), or half of that, the causal mask's lower triangle only
(``causal``: what a causal kernel executes, and what sources counting it report). The two differ
by ``s / (6 h + s)`` of a block's FLOPs: 4% of a Llama-3-405B iteration at 8k tokens, 29% at
131k. The planner's own model FLOPs and MFU count ``full`` (:data:`MODEL_FLOPS_CONVENTION`); a
published MFU or TFLOP/s figure is compared in its source's convention
(``benchmarks/published_rows.py``: each row says which).
"""

from __future__ import annotations

import enum


class AttentionFlops(enum.Enum):
    """How attention's ``s x s`` products are counted (module docstring)."""

    FULL = "full"
    CAUSAL = "causal"

    @property
    def share(self) -> float:
        """The share of the ``s x s`` square counted."""
        return 1.0 if self is AttentionFlops.FULL else 0.5


#: the planner's convention for model FLOPs and MFU
MODEL_FLOPS_CONVENTION = AttentionFlops.FULL


def block_fwd_flops(seq: int, hidden: int, convention: AttentionFlops = MODEL_FLOPS_CONVENTION) -> float:
    """Forward FLOPs of one transformer block per sample: ``24 s h^2 + 4 s^2 h`` (the QKV,
    projection and MLP matmuls, and the attention scores and values; the latter halved under
    the causal convention)."""
    return 24.0 * seq * hidden * hidden + attention_fwd_flops(seq, hidden, convention)


def attention_fwd_flops(seq: int, width: int, convention: AttentionFlops = MODEL_FLOPS_CONVENTION) -> float:
    """Forward FLOPs of attention's scores and values products per sample: ``4 s^2 w`` (``w`` the
    query heads x head width), times the convention's share of the square."""
    return 4.0 * seq * seq * width * convention.share


def head_fwd_flops(seq: int, hidden: int, vocab: int) -> float:
    """Forward FLOPs of the LM head per sample: ``2 s h V``; the embedding is a lookup (0)."""
    return 2.0 * seq * hidden * vocab


def gpt_model_flops_per_sample(*, layers: int, hidden: int, seq: int, vocab: int,
                               convention: AttentionFlops = MODEL_FLOPS_CONVENTION) -> float:
    """Model FLOPs of one training sample (forward + backward, no recomputation) of a GPT-style
    decoder: ``3 x (l (24 s h^2 + 4 s^2 h) + 2 s h V)`` = ``72 s l h^2 (1 + s / 6h + V / 12 l h)``
    -- eq. 3 without its recomputation forward (their 96 becomes 72), which is the "model
    FLOPs" of MFU (Chowdhery et al. 2022, PaLM, appendix B: recomputation is not counted)."""
    return 3.0 * (layers * block_fwd_flops(seq, hidden, convention) + head_fwd_flops(seq, hidden, vocab))


def palm_flops_per_token(*, params: int, layers: int, heads: int, head_dim: int, seq: int,
                         convention: AttentionFlops = AttentionFlops.FULL) -> float:
    """Training FLOPs per token by PaLM's count (Chowdhery et al. 2022 appendix B), which torchtitan's
    MFU uses: ``6 N + 12 L H Q T`` (``N`` every parameter, embeddings included; ``12 L H Q T`` the
    attention's ``s x s`` products, halved under the causal convention)."""
    return 6.0 * params + 12.0 * layers * heads * head_dim * seq * convention.share
