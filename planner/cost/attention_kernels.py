"""The fused attention kernel a stack runs, at its measured efficiency (issue 47: a stack names
its measured efficiencies).

An analytic FlashAttention profile prices its attention core with the GEMM model's efficiency for
the fused pair (:mod:`planner.profiling.analytic.gemm`, one curve for every GEMM). Attention
kernels are measured apart, and differ by kernel and device far more than GEMMs do: where the
stack names its kernel (``Stack.attention_kernel``), the core's forward runs at the kernel's
forward efficiency and its backward (2.5 x the forward's FLOPs: the scores recomputed) at that
times the kernel's backward / forward rate (:func:`attention_view`), in place of the model's:

- FlashAttention-2 on an A100: 50-73% of peak forward (Dao 2023, "FlashAttention-2: Faster
  Attention with Better Parallelism and Work Partitioning", abstract);
- FlashAttention-2 on an H100: 29-35% (Shah et al. 2024, "FlashAttention-3", abstract: "only
  35% utilization"; torch's SDPA flash backend measured at 287-304 TFLOP/s of 989 in
  pytorch/benchmark d5f0a12);
- Transformer Engine's choice: cuDNN's fused attention on an H100 (``get_attention_backend``:
  "Disabling FlashAttention to give FusedAttention preference on Hopper+"), 50-75%
  (FlashAttention-3 reaches 75%, and measures cuDNN close to itself); FlashAttention-2 on an A100;
- backward / forward rate: 0.66-0.86 (flash-attn, causal, head dim 128: 99 / 151 TFLOP/s on an
  RTX 4090, apache/tvm ``tl_doc/flash_perf.md``; Dao 2023: up to 63% backward against 73%
  forward).

Each nominal value is the geometric mean of its range; the band (:mod:`planner.cost.band`)
prices both ends (``Stack.attention_efficiency``). A kernel with no measurement for the device,
and every other profile, keep the model's pricing.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from planner.artifacts.kinds import AttentionKernel, AttentionKind
from planner.artifacts.profile import Profile, TimeFit
from planner.profiling.analytic.common import DEVICE_PRESETS
from planner.profiling.analytic.gemm import GemmModel

__all__ = ["BWD_RATE", "KERNELS", "KernelEfficiency", "attention_view", "device_of", "efficiency_of"]

#: the FLOPs of FlashAttention's backward over its forward (the scores recomputed; Dao 2023)
BWD_FLOPS = 2.5


@dataclass(frozen=True, slots=True)
class KernelEfficiency:
    """A kernel's forward fraction of peak on a device, its range's ends (low, high)."""

    forward: tuple[float, float]
    source: str


KERNELS: dict[tuple[AttentionKernel, str], KernelEfficiency] = {
    (AttentionKernel.FLASH_ATTN_2, "a100-80gb"): KernelEfficiency(
        (0.50, 0.73), "Dao 2023 (FlashAttention-2), abstract: 50-73% of the A100's peak"),
    (AttentionKernel.FLASH_ATTN_2, "h100-80gb"): KernelEfficiency(
        (0.29, 0.35), "Shah et al. 2024 (FlashAttention-3): FA2 'only 35% utilization' on H100; torch SDPA 287-304 "
                      "TFLOP/s (pytorch/benchmark d5f0a12)"),
    (AttentionKernel.TRANSFORMER_ENGINE, "h100-80gb"): KernelEfficiency(
        (0.50, 0.75), "cuDNN's fused attention (Transformer Engine's choice on Hopper): Shah et al. 2024 measure "
                      "FlashAttention-3 up to 75% on H100 and cuDNN close to it"),
}
KERNELS[(AttentionKernel.TRANSFORMER_ENGINE, "a100-80gb")] = KERNELS[(AttentionKernel.FLASH_ATTN_2, "a100-80gb")]
#: backward / forward rate of a fused attention kernel (module docstring)
BWD_RATE = (0.66, 0.86)


def _mid(lo: float, hi: float) -> float:
    return math.sqrt(lo * hi)


def efficiency_of(kernel: AttentionKernel, device: str, point: tuple[float, ...] = ()) -> tuple[float, float] | None:
    """(forward fraction of peak, backward / forward rate) of ``kernel`` on ``device``: ``point`` where
    given (a band's end), else the nominal; None where no measurement is known."""
    found = KERNELS.get((kernel, device))
    if found is None:
        return None
    if point:
        return point[0], point[1]
    return _mid(*found.forward), _mid(*BWD_RATE)


def device_of(profile: Profile) -> str:
    return next((key for key, preset in DEVICE_PRESETS.items() if preset.name == profile.device), "")


def _attention_shape(profile: Profile) -> tuple[float, float, float] | None:
    """(the attention's executed forward FLOPs per sample on one device, the device's peak FLOPs per
    ms, the GEMM model's efficiency for the fused pair) from an analytic profile's metadata (None:
    not recorded)."""
    meta = profile.metadata
    seq, heads, hidden, peak = meta.get("seq"), meta.get("heads"), meta.get("hidden"), meta.get("peak_bf16_tflops")
    if not (isinstance(seq, int) and isinstance(heads, int) and isinstance(hidden, int) and heads > 0):
        return None
    head_dim = meta.get("head_dim") or hidden // heads
    if not isinstance(peak, float) or not isinstance(head_dim, int):
        return None
    model = GemmModel.of_metadata(meta, memory_default=None)
    if model is None:
        return None
    t, cp = meta.get("tp_degree", 1), meta.get("cp_degree", 1)
    parts = max(1, t if isinstance(t, int) else 1) * max(1, cp if isinstance(cp, int) else 1)
    flops = 4.0 * seq * seq * heads * head_dim * 0.5 / parts  # a causal kernel runs half the square
    return flops, peak * 1e9, model.efficiency(float(seq), float(seq), float(head_dim), fused=True)


def _plus(fit: TimeFit, per_sample_ms: float) -> TimeFit:
    return TimeFit(intercept_ms=fit.intercept_ms, per_sample_ms=fit.per_sample_ms + per_sample_ms)


def attention_view(profile: Profile, kernel: AttentionKernel, point: tuple[float, ...] = ()) -> Profile:
    """A device's view (after tensor and context parallelism: its attention is ``1 / (t cp)`` of
    the whole) with every block's attention at ``kernel``'s efficiency in place of the GEMM model's
    (module docstring): its forward by ``F / peak x (1 / e_kernel - 1 / e_model)`` per sample, its
    backward by ``2.5 F / peak x (1 / (e_kernel r) - 1 / e_model)``, and the attention core the
    selective level re-runs with the forward. ``profile`` itself where the kernel is the model's,
    the profile is not an analytic FlashAttention one, or the kernel has no measurement."""
    if kernel is AttentionKernel.MODEL or profile.attention is not AttentionKind.FLASH or profile.source != "analytic":
        return profile
    found = efficiency_of(kernel, device_of(profile), point)
    shape = _attention_shape(profile)
    if found is None or shape is None:
        return profile
    (fwd_eff, rate), (flops, peak_per_ms, model) = found, shape
    d_fwd = flops / peak_per_ms * (1.0 / fwd_eff - 1.0 / model)
    d_bwd = BWD_FLOPS * flops / peak_per_ms * (1.0 / (fwd_eff * rate) - 1.0 / model)
    is_core = profile.metadata.get("selective_unit", "attention-core") == "attention-core"
    layers = []
    for layer in profile.layers:
        core = layer.attention_core
        if core is None:  # not a block: no attention
            layers.append(layer)
            continue
        if is_core and layer.moe is None:  # an MoE layer's selective level is its experts' (no attention in it)
            core = dataclasses.replace(core, fwd=_plus(core.fwd, d_fwd))
        layers.append(dataclasses.replace(layer, fwd=_plus(layer.fwd, d_fwd), bwd=_plus(layer.bwd, d_bwd),
                                          attention_core=core, measured=()))
    return dataclasses.replace(profile, layers=tuple(layers))
