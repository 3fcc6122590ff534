"""FLOPs of the transformer blocks the zoo builds and the analytic profiles price (no torch).

Counts per sample of ``s`` tokens, hidden size ``h``, vocabulary ``V`` (Narayanan et al. 2021,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", eq. 3;
matmuls at 2 FLOPs per multiply-add).
"""

from __future__ import annotations


def block_fwd_flops(seq: int, hidden: int) -> float:
    """Forward FLOPs of one transformer block per sample: ``24 s h^2 + 4 s^2 h`` (the QKV,
    projection and MLP matmuls, and the attention scores and values)."""
    return 24.0 * seq * hidden * hidden + 4.0 * seq * seq * hidden


def head_fwd_flops(seq: int, hidden: int, vocab: int) -> float:
    """Forward FLOPs of the LM head per sample: ``2 s h V``; the embedding is a lookup (0)."""
    return 2.0 * seq * hidden * vocab


def gpt_model_flops_per_sample(*, layers: int, hidden: int, seq: int, vocab: int) -> float:
    """Model FLOPs of one training sample (forward + backward, no recomputation) of a GPT-style
    decoder: ``3 x (l (24 s h^2 + 4 s^2 h) + 2 s h V)`` = ``72 s l h^2 (1 + s / 6h + V / 12 l h)``
    -- eq. 3 without its recomputation forward (their 96 becomes 72), which is the "model
    FLOPs" of MFU (Chowdhery et al. 2022, PaLM, appendix B: recomputation is not counted)."""
    return 3.0 * (layers * block_fwd_flops(seq, hidden) + head_fwd_flops(seq, hidden, vocab))
