"""Precision as a plan choice (issue 49 item 1): a profile's layers re-priced under an FP8 recipe.

A layer with an :class:`~planner.artifacts.profile.Fp8Gemms` view (the analytic profiles give
one for each transformer block on a device with FP8 tensor cores) has its FP8-able GEMMs'
time replaced, and memory-bound quantisation passes added:

- GEMMs: their bf16 time x ``peak_bf16 / peak_fp8`` (the cluster's datasheet peaks) / the
  recipe's :data:`FP8_GEMM_EFFICIENCY`, the FP8 GEMMs' fraction of peak relative to the bf16
  GEMMs' at the same shape. The GEMM model's efficiency curve carries over unchanged: an FP8
  operand is half the bytes, so a product's intensity doubles in FLOP/byte exactly as the
  ridge point doubles with the peak (``planner.profiling.analytic.gemm``). The relative
  fraction is measured, not fitted: the maximum achievable matmul FLOPS of one H100 SXM in
  FP8 and in BF16 by the same finder and software (:data:`FP8_EFFICIENCY_SOURCE`: 1,402.6 of
  1,979 and 794.5 of 989 TFLOPS, 0.882); the recipes without a measurement of their own carry it.
- Quantisation: each distinct GEMM input is cast in the forward and each output gradient in
  the backward, memory-bound: bf16 bytes x the recipe's :data:`QUANTISE_BYTES` (bytes read and
  written per bf16 byte) / the cluster's HBM bandwidth x the profile's achieved HBM fraction.
  Transformer Engine's recipes (NVIDIA/TransformerEngine ``transformer_engine/common/recipe``):
  current scaling computes a tensor's amax in one pass, then casts it (TE's 'FP8 Current Scaling'
  guide: "the tensor needs to be read twice"; read 2 B, write 1 B
  row-wise + 1 B column-wise for Hopper's transposed operand): 3 x the bf16 bytes; block
  scaling (1 x 128 and 128 x 128) and MXFP8 (32-element blocks) find each block's scale
  inside the casting kernel: one read and the two FP8 copies plus the scales (4 B per 128, 1 B
  per 32 elements): 2.02 x. The weights' casts run once per iteration (TE caches them across
  micro-batches: ``is_first_microbatch``) and are not priced. Cross-check of the rate: TE's own
  timing of its cast-transpose on an H100 SXM (NVIDIA/TransformerEngine PR #101: 4096 x 4096
  16-bit to row- and column-wise FP8 in 51.5 us, 1.30 TB/s, 39% of the datasheet 3.35 TB/s;
  3072 x 3072, 46%) sits at the bf16 fit's achieved fraction (0.41).
- Memory: the GEMMs' inputs are saved for the weight gradient in FP8 (TE's ``Linear`` saves
  the quantised input): the layer's saved bytes lose half of the inputs' bf16 bytes. The FP8
  weights are the compute copy (Megatron-Bridge's FP8 recipes set ``fp8_param_gather``:
  ``megatron/bridge/training/mixed_precision.py``; torchao's ``enable_fsdp_float8_all_gather``
  alike): row-wise and column-wise FP8 (2 B per parameter, :data:`FP8_WEIGHT_BYTES`) in place
  of the 16-bit weights, so 16-bit kinds hold as many bytes as in bf16 and an fp32-weight kind
  (``adam-fp32``) holds the 2 B beside its fp32 weights
  (:attr:`planner.cost.model.CostModel.fp8_param_count`); parameters are gathered in FP8 under
  ZeRO 3 (1 B per FP8 parameter on the wire).
- Layers kept bf16: Megatron-Bridge's current-scaling recipe runs the first and the last
  transformer block in bf16 (``first_last_layers_bf16``, one at each end:
  :data:`BF16_EDGE_BLOCKS`); its block-scaling and MXFP8 recipes keep none. A caller that knows
  its run's setting passes it (``at_precision(..., bf16_edge_blocks=)``: Megatron-Bridge's
  performance scripts turn the bf16 blocks off, ``scripts/performance/utils/precision.py``).

Routed experts (``Layer.moe`` of an analytic MoE profile, its GEMMs not in ``Layer.fp8``): their
grouped GEMMs (``planner.profiling.analytic.grouped.expert_gemm_ms`` at the GEMM constants the
profile records) re-priced alike, Transformer Engine's FP8 ``GroupedLinear``: the dispatched tokens
and the down projection's input cast in the forward (``s k (h + F)`` bf16 elements), the two
outputs' gradients in the backward (``s k (2F + h)``), both inputs saved in FP8; the tokens are
dispatched in bf16.

The attention core, the router, the embedding and the head stay bf16 (Megatron-Core's
defaults; ``planner.profiling.analytic.common.BF16_GEMMS``). MXFP8 needs a device that scales
its blocks in hardware (``Cluster.mxfp8``); every FP8 recipe a device with an FP8 peak.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner.artifacts.cluster import Cluster
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import Precision
from planner.artifacts.moe import MoeLayer
from planner.artifacts.profile import Layer, Profile
from planner.artifacts.timefit import TimeFit

__all__ = ["BF16_EDGE_BLOCKS", "FP8_EFFICIENCY_SOURCE", "FP8_FIT_ROWS", "FP8_GEMM_EFFICIENCY", "FP8_WEIGHT_BYTES",
           "QUANTISE_BYTES", "Fp8Copies", "at_precision", "check_precision", "check_profile", "edge_blocks_of",
           "fp8_copies", "fp8_extra_weight_bytes", "like_precision", "precision_of", "with_fp8_view"]

#: bytes moved per bf16 byte quantised (module docstring)
QUANTISE_BYTES: dict[Precision, float] = {
    Precision.FP8_CURRENT: 3.0,
    Precision.FP8_BLOCK: 2.0 + 4.0 / 256,
    Precision.MXFP8: 2.0 + 1.0 / 64,
}
#: FP8 GEMMs' fraction of the FP8 peak relative to bf16 GEMMs' of the bf16 peak at the same shape, measured:
#: the H100 SXM's maximum achievable matmul FLOPS in FP8 (float8_e4m3fn) over its FP8 peak, divided by the same
#: in BF16 (FP8_EFFICIENCY_SOURCE); no FP8 row is fitted. The recipes without a measurement of their own carry it
_H100_FP8_RELATIVE = (1402.6 / 1979.0) / (794.5 / 989.0)
FP8_GEMM_EFFICIENCY: dict[Precision, float] = {
    Precision.FP8_CURRENT: _H100_FP8_RELATIVE,
    Precision.FP8_BLOCK: _H100_FP8_RELATIVE,
    Precision.MXFP8: _H100_FP8_RELATIVE,
}
FP8_EFFICIENCY_SOURCE = ("stas00/ml-engineering compute/accelerator/README.md, 'Maximum Achievable Matmul FLOPS "
                         "comparison table' (mamf-finder.py, torch 2.7.0+cu126 for both): NVIDIA H100 SXM BF16 794.5 of "
                         "989 TFLOPS (80.3%), FP8 1,402.6 of 1,979 (70.9%): 0.882 of the BF16 fraction")
#: the FP8 rows a constant is fitted on: none (the efficiency is measured; benchmarks/published_fp8.py --fit
#: prints what a fit would give, for comparison)
FP8_FIT_ROWS: tuple[str, ...] = ()
#: FP8 weight bytes per FP8 parameter (row-wise and column-wise copies)
FP8_WEIGHT_BYTES = 2
#: transformer blocks kept bf16 at each end of the model, per recipe (module docstring)
BF16_EDGE_BLOCKS: dict[Precision, int] = {Precision.FP8_CURRENT: 1, Precision.FP8_BLOCK: 0, Precision.MXFP8: 0}


def fp8_extra_weight_bytes(weight_bytes_per_param: int) -> int:
    """Bytes an FP8 parameter holds beyond its weights' own: none where the FP8 copies replace
    16-bit weights, :data:`FP8_WEIGHT_BYTES` beside fp32 weights (module docstring)."""
    return FP8_WEIGHT_BYTES if weight_bytes_per_param > 2 else 0
#: the achieved HBM fraction where a profile does not record one (the shipped H100 fit's)
DEFAULT_HBM_FRACTION = 0.4067


#: the profile metadata key naming the FP8 recipe its layers were priced at (absent: bf16, as profiled)
PRECISION_KEY = "precision"
#: the profile metadata key of the blocks kept bf16 at each end where a caller chose them (absent: the recipe's)
EDGE_KEY = "bf16_edge_blocks"


def edge_blocks_of(profile: Profile) -> int | None:
    """The bf16 edge blocks an FP8 profile was priced with where its caller chose them (None: the recipe's)."""
    value = profile.metadata.get(EDGE_KEY)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def precision_of(profile: Profile) -> Precision:
    """The precision ``profile``'s times and bytes are for (:func:`at_precision` records it)."""
    return Precision(str(profile.metadata.get(PRECISION_KEY, Precision.BF16.value)))


def check_precision(cluster: Cluster, precision: Precision) -> None:
    """Refuse a precision the cluster's devices cannot run, naming the value."""
    if precision.fp8 and not cluster.peak_fp8_tflops:
        raise PlannerInputError(f"--precision {precision.value}: {cluster.device_name} ({cluster.name}) has no FP8 "
                                "tensor cores (peak_fp8_tflops 0)")
    if precision is Precision.MXFP8 and not cluster.mxfp8:
        raise PlannerInputError(f"--precision mxfp8: {cluster.device_name} ({cluster.name}) does not scale FP8 blocks "
                                "in hardware (MXFP8 needs Blackwell: b200-x8, gb200-nvl72)")


def check_profile(profile: Profile, precision: Precision) -> None:
    """Refuse an FP8 precision for a profile that carries no FP8 view of its GEMMs (``Layer.fp8``:
    analytic profiles built by this version have one; a measured profile's times are its own
    precision's, and an analytic one built before FP8 was priced has none): priced anyway, the
    plan would be the bf16 one under an FP8 label."""
    if precision.fp8 and precision_of(profile) is Precision.BF16 and not any(layer.fp8 for layer in profile.layers):
        raise PlannerInputError(
            f"--precision {precision.value}: profile {profile.model!r} has no FP8 view of its GEMMs (Layer.fp8): "
            "build it again with planner profile --analytic (a measured profile is priced at the precision it ran)")


def with_fp8_view(profile: Profile) -> Profile:
    """``profile`` with the FP8 view of its GEMMs derived at load time where it is an analytic profile
    written before the view existed (``planner.profiling.analytic.rebuild.with_fp8_views``: built again
    from what it records, taken only where the rebuilt layers are its own); else ``profile`` itself."""
    if precision_of(profile) is not Precision.BF16 or any(layer.fp8 for layer in profile.layers):
        return profile
    from planner.profiling.analytic.rebuild import with_fp8_views  # the analytic generators, loaded for this only

    return with_fp8_views(profile)


def _scaled(fit: TimeFit, factor: float) -> TimeFit:
    return TimeFit(intercept_ms=fit.intercept_ms * factor, per_sample_ms=fit.per_sample_ms * factor)


def _fp8_layer(layer: Layer, speedup: float, ms_per_byte: float, bytes_factor: float) -> Layer:
    view = layer.fp8
    if view is None:
        return layer
    keep = 1.0 - 1.0 / speedup  # of the FP8-able GEMMs' bf16 time, what FP8 saves
    quant_fwd = view.input_bytes_per_sample * bytes_factor * ms_per_byte
    quant_bwd = view.grad_bytes_per_sample * bytes_factor * ms_per_byte
    fwd = TimeFit(intercept_ms=layer.fwd.intercept_ms - keep * view.fwd.intercept_ms,
                  per_sample_ms=max(0.0, layer.fwd.per_sample_ms - keep * view.fwd.per_sample_ms) + quant_fwd)
    bwd = TimeFit(intercept_ms=layer.bwd.intercept_ms - keep * view.bwd.intercept_ms,
                  per_sample_ms=max(0.0, layer.bwd.per_sample_ms - keep * view.bwd.per_sample_ms) + quant_bwd)
    saved = max(layer.input_bytes_per_sample, layer.saved_bytes_per_sample - view.input_bytes_per_sample / 2)
    tp = layer.tp
    if tp is not None and tp.degrees:
        # each tensor-parallel collective's window (the GEMMs beside it / the layer's split work) shrinks
        # with them: the weighted GEMMs beside it run 1 / speedup as long, the work around them as re-priced
        f, b = layer.fwd.at(1) / fwd.at(1) / speedup, layer.bwd.at(1) / bwd.at(1) / speedup
        tp = dataclasses.replace(tp, degrees=tuple(
            dataclasses.replace(d, fwd_overlap=tuple(min(1.0, w * f) for w in d.fwd_overlap),
                                bwd_overlap=tuple(min(1.0, w * b) for w in d.bwd_overlap)) for d in tp.degrees))
    return dataclasses.replace(layer, fwd=fwd, bwd=bwd, saved_bytes_per_sample=saved, tp=tp, measured=())


def _expert_lines(profile: Profile, moe: MoeLayer, peak_flops_per_ms: float) -> tuple[TimeFit, TimeFit] | None:
    """The routed experts' grouped GEMMs' bf16 (forward, backward) lines, at the GEMM constants the
    profile records (None where it records none: a measured profile's experts stay as measured)."""
    from planner.profiling.analytic.grouped import FIT_SIZES, expert_gemm_ms, line_through
    from planner.profiling.analytic.rebuild import recorded_gemm

    model = recorded_gemm(profile.metadata)
    if model is None or profile.source != "analytic" or peak_flops_per_ms <= 0:
        return None

    def at(b: int, backward: bool) -> float:
        return expert_gemm_ms(model, peak_flops_per_ms, tokens_per_expert=b * moe.tokens_per_sample * moe.top_k / moe.num_experts,
                              experts=moe.num_experts, hidden=moe.hidden, ffn=moe.expert_ffn_hidden, backward=backward)

    return line_through({b: at(b, False) for b in FIT_SIZES}), line_through({b: at(b, True) for b in FIT_SIZES})


def _fp8_experts(layer: Layer, lines: tuple[TimeFit, TimeFit], speedup: float, ms_per_byte: float,
                 bytes_factor: float) -> Layer:
    """``layer`` with its routed experts' GEMMs in FP8 (module docstring)."""
    moe = layer.moe
    assert moe is not None
    keep = 1.0 - 1.0 / speedup
    copies = float(moe.tokens_per_sample * moe.top_k)
    h, f = moe.hidden, moe.expert_ffn_hidden
    inputs = 2.0 * copies * (h + f)  # bf16 bytes of the two GEMM inputs

    def less(fit: TimeFit, gemm: TimeFit, quant_ms: float) -> TimeFit:
        return TimeFit(intercept_ms=fit.intercept_ms - keep * gemm.intercept_ms,
                       per_sample_ms=max(0.0, fit.per_sample_ms - keep * gemm.per_sample_ms) + quant_ms)

    qf, qb = inputs * bytes_factor * ms_per_byte, 2.0 * copies * (2 * f + h) * bytes_factor * ms_per_byte
    freed = min(inputs / 2, moe.expert_saved_bytes_per_sample - moe.act_saved_bytes_per_sample)
    experts = dataclasses.replace(moe, expert_fwd=less(moe.expert_fwd, lines[0], qf),
                                  expert_bwd=less(moe.expert_bwd, lines[1], qb),
                                  expert_saved_bytes_per_sample=moe.expert_saved_bytes_per_sample - freed)
    return dataclasses.replace(layer, fwd=less(layer.fwd, lines[0], qf), bwd=less(layer.bwd, lines[1], qb),
                               saved_bytes_per_sample=layer.saved_bytes_per_sample - freed, moe=experts)


def at_precision(profile: Profile, cluster: Cluster, precision: Precision, bf16_edge_blocks: int | None = None) -> Profile:
    """``profile`` with its layers priced under ``precision`` on ``cluster``'s devices (module
    docstring); bf16: the profile itself. Refused where the devices cannot run it.
    ``bf16_edge_blocks``: transformer blocks kept bf16 at each end (None: the recipe's,
    :data:`BF16_EDGE_BLOCKS`)."""
    current = precision_of(profile)
    if precision is current:
        return profile
    if current is not Precision.BF16:
        raise PlannerInputError(f"profile {profile.model!r} is already priced at {current.value}")
    check_precision(cluster, precision)
    speedup = cluster.peak_fp8_tflops / (cluster.peak_tflops or cluster.peak_fp8_tflops) * FP8_GEMM_EFFICIENCY[precision]
    hbm = float(profile.metadata.get("memory_efficiency", DEFAULT_HBM_FRACTION) or DEFAULT_HBM_FRACTION)
    bandwidth = cluster.memory_bandwidth_gb_per_s or 1000.0
    ms_per_byte = 1.0 / (bandwidth * 1e9 * hbm / 1e3)
    with_view = [i for i, layer in enumerate(profile.layers) if layer.fp8 is not None]
    edge = BF16_EDGE_BLOCKS[precision] if bf16_edge_blocks is None else bf16_edge_blocks
    kept = set(with_view[:edge] + with_view[len(with_view) - edge:]) if edge and len(with_view) > 2 * edge else set()
    layers = tuple(dataclasses.replace(layer, fp8=None) if i in kept
                   else _fp8_layer(layer, speedup, ms_per_byte, QUANTISE_BYTES[precision])
                   for i, layer in enumerate(profile.layers))
    # the routed experts, at the peak of the device their profile was priced on (FLOP per ms)
    peak = float(profile.metadata.get("peak_bf16_tflops", 0.0) or cluster.peak_tflops or 0.0) * 1e9
    layers = tuple(_fp8_experts(layer, lines, speedup, ms_per_byte, QUANTISE_BYTES[precision])
                   if layer.moe is not None and i not in kept and (lines := _expert_lines(profile, layer.moe, peak))
                   else layer for i, layer in enumerate(layers))
    chosen = {} if bf16_edge_blocks is None else {EDGE_KEY: bf16_edge_blocks}
    return dataclasses.replace(profile, layers=layers, metadata={**profile.metadata, PRECISION_KEY: precision.value, **chosen})


@dataclass(frozen=True, slots=True)
class Fp8Copies:
    """The FP8 weight copies one device holds (module docstring), what its cost model takes from
    the precision: per layer the parameters of its FP8 GEMMs that hold a copy (all 0 unless the
    profile is priced at an FP8 precision), and the bytes each copy holds beyond its parameter's
    weights (:func:`fp8_extra_weight_bytes`)."""

    param_count: tuple[int, ...]
    extra_bytes_per_param: int


def fp8_copies(profile: Profile, weight_bytes_per_param: int) -> Fp8Copies:
    """The :class:`Fp8Copies` of ``profile`` with ``weight_bytes_per_param`` bytes of weights per
    parameter, asked once where a device's cost model is built."""
    fp8 = precision_of(profile).fp8
    return Fp8Copies(param_count=tuple(layer.fp8.param_count if layer.fp8 is not None and fp8 else 0
                                       for layer in profile.layers),
                     extra_bytes_per_param=fp8_extra_weight_bytes(weight_bytes_per_param))


def like_precision(profile: Profile, cluster: Cluster, like: Profile) -> Profile:
    """``profile`` (bf16) priced at the precision ``like`` was priced at, with the bf16 edge blocks
    its caller chose (:func:`at_precision`)."""
    return at_precision(profile, cluster, precision_of(like), edge_blocks_of(like))
