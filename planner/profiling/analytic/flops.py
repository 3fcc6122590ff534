"""Model FLOPs per training sample of an analytic or zoo transformer profile (0 when unknown)."""

from __future__ import annotations

from planner.artifacts.profile import Profile
from planner.profiling.analytic.gpt import block_fwd_flops, head_fwd_flops, transformer_config
from planner.profiling.analytic.llama import model_flops_per_sample as llama_flops


def model_flops_per_sample(profile: Profile) -> float:
    """Model FLOPs of one training sample (forward + backward, no recomputation) of a GPT-style
    decoder, 0 when the profile is not one: ``3 x (l (24 s h^2 + 4 s^2 h) + 2 s h V)`` =
    ``72 s l h^2 (1 + s / 6h + V / 12 l h)`` -- Narayanan et al. 2021 eq. 3 without its
    recomputation forward (their 96 becomes 72), which is the "model FLOPs" of MFU
    (Chowdhery et al. 2022, PaLM, appendix B: recomputation is not counted). Analytic Llama
    profiles (``metadata["architecture"] == "llama"``) count with :mod:`planner.profiling.analytic.llama`."""
    if profile.metadata.get("architecture") == "llama":
        return llama_flops(profile.metadata)
    cfg = transformer_config(profile)
    if cfg is None:
        return 0.0
    s, h = cfg["seq"], cfg["hidden"]
    return 3.0 * (cfg["layers"] * block_fwd_flops(s, h) + head_fwd_flops(s, h, cfg["vocab"]))
