"""What the analytic profiles share: device presets and their rates (:class:`DeviceRates`: a
GEMM's time at the throughput its shape achieves, :mod:`planner.profiling.analytic.gemm`), one
analytic layer priced from what a model's formulas say of it (:class:`LayerSpec`: its GEMMs plus
the memory-bound work of the bytes it moves), Megatron's tensor-parallel split with the layer's
time on one device of each degree, and the chain profile of such layers
(:func:`analytic_profile`; see :mod:`planner.profiling.analytic.gpt` for the formulas and their
sources)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.fp8 import Fp8Gemms
from planner.artifacts.kinds import AttentionKind, DType
from planner.artifacts.profile import (
    AttentionCore,
    Edge,
    Layer,
    Profile,
    TiedParams,
    TimeFit,
    profile_fingerprint,
)
from planner.artifacts.tensor_split import SplitDegree, TensorSplit
from planner.profiling.analytic.gemm import (
    DEVICE_GEMM,
    DEVICE_GEMM_LOSO,
    Gemm,
    GemmModel,
    carried_from_h100,
    gemm_model_of,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class DevicePreset:
    name: str
    peak_bf16_tflops: float
    hbm_gb_per_s: float
    source: str
    peak_fp8_tflops: float = 0.0  # 0: no FP8 tensor cores
    mxfp8: bool = False  # FP8 blocks of 32 scaled in hardware (Blackwell)


DEVICE_PRESETS: dict[str, DevicePreset] = {
    "a100-80gb": DevicePreset(
        name="NVIDIA A100-SXM4-80GB",
        peak_bf16_tflops=312.0,
        hbm_gb_per_s=2039.0,
        source="NVIDIA A100 datasheet: 312 TFLOPS dense BF16 tensor core; 2,039 GB/s HBM2e (80GB SXM)",
    ),
    "h100-80gb": DevicePreset(
        name="NVIDIA H100-SXM5-80GB",
        peak_bf16_tflops=989.0,
        hbm_gb_per_s=3350.0,
        source="NVIDIA H100 datasheet: 989 TFLOPS dense BF16 tensor core, 3.35 TB/s HBM3 (SXM5)",
        peak_fp8_tflops=1979.0,
    ),
    # the newer devices: datasheet numbers as the cluster presets give them (planner.artifacts.devices), their
    # GEMM constants the H100's carried by gemm.carried_from_h100's rule
    "h200-141gb": DevicePreset(name="NVIDIA H200-SXM-141GB", peak_bf16_tflops=989.0, hbm_gb_per_s=4800.0,
                               peak_fp8_tflops=1979.0, source="NVIDIA H200 datasheet (SXM): 989 / 1,979 TFLOPS dense "
                               "BF16 / FP8, 4.8 TB/s HBM3e"),
    "b200": DevicePreset(name="NVIDIA B200", peak_bf16_tflops=2250.0, hbm_gb_per_s=8000.0, peak_fp8_tflops=4500.0,
                         mxfp8=True, source="NVIDIA HGX B200 datasheet (per GPU): 2,250 / 4,500 TFLOPS dense BF16 / "
                         "FP8, 8 TB/s HBM3e"),
    "gb200": DevicePreset(name="NVIDIA GB200 (NVL72)", peak_bf16_tflops=2500.0, hbm_gb_per_s=8000.0,
                          peak_fp8_tflops=5000.0, mxfp8=True, source="NVIDIA GB200 NVL72 datasheet (per GPU): 2,500 / "
                          "5,000 TFLOPS dense BF16 / FP8, 8 TB/s HBM3e"),
}


def ridge_point(preset: DevicePreset) -> float:
    """The roofline's ridge point: peak BF16 FLOP/s / HBM bytes/s (FLOP/byte)."""
    return preset.peak_bf16_tflops * 1e12 / (preset.hbm_gb_per_s * 1e9)


#: the devices whose GEMM constants are the H100's carried over (no published run on them is given)
CARRIED_FROM_H100 = ("h200-141gb", "b200", "gb200")
for _key in CARRIED_FROM_H100:
    _ratio = ridge_point(DEVICE_PRESETS[_key]) / ridge_point(DEVICE_PRESETS["h100-80gb"])
    DEVICE_GEMM[_key] = carried_from_h100(DEVICE_GEMM["h100-80gb"], _ratio)
    DEVICE_GEMM_LOSO[_key] = tuple(carried_from_h100(m, _ratio) for m in DEVICE_GEMM_LOSO["h100-80gb"])

BYTES_PER_PARAM = 2  # bf16
BYTES_PER_ACT = 2  # bf16 activations


#: tensor-parallel degrees whose per-device GEMM shapes an analytic split lists (the devices of
#: one node of every shipped preset; another degree follows the 1/t rule)
TP_DEGREES = (2, 4, 8)
#: micro-batch sizes through which an analytic layer's time is fitted as a line (GEMMs on more
#: tokens run at a higher efficiency, so the time is not exactly a line in the micro-batch)
FIT_SIZES = (1, 8)


@dataclass(frozen=True, slots=True)
class DeviceRates:
    """A device preset with its GEMM model: peak FLOPs and achieved HBM bytes per ms, and what an
    analytic profile's metadata records of both (the GEMM constants, the datasheet figures)."""

    device: DevicePreset
    gemm: GemmModel
    peak_flops_per_ms: float
    bytes_per_ms: float
    metadata: dict[str, str | float]

    def gemm_ms(self, g: Gemm, b: int, t: int = 1, backward: bool = False) -> float:
        """Forward (or backward) time of ``g`` at micro-batch ``b`` on one of ``t`` tensor-parallel
        devices: its FLOPs at the efficiency its per-device shape achieves (:class:`Gemm`)."""
        dims = {"m": float(g.m), "n": float(g.n), "k": float(g.k), "count": float(g.count)}
        if g.batch:
            dims[g.batch] *= b
        if g.split:
            dims[g.split] /= t
        m, n, k = dims["m"], dims["n"], dims["k"]
        fwd = 2.0 * m * n * k * dims["count"] * g.work_fraction / (self.peak_flops_per_ms
                                                                   * self.gemm.efficiency(m, n, k, g.fused))
        return fwd * g.bwd_factor if backward else fwd

    def gemms_ms(self, gemms: Sequence[Gemm], b: int, t: int = 1, split: bool | None = None, backward: bool = False,
                 weighted: bool = False) -> float:
        """Forward (or backward) time of ``gemms`` (only the split ones with ``split`` True, the
        others with False). ``weighted``: only the weighted GEMMs' forward products, which is the
        weight-gradient time W (one product of each weighted GEMM's forward shape, as long as its
        forward: Qi et al. 2024 sec. 2)."""
        return sum(self.gemm_ms(g, b, t, backward) for g in gemms
                   if (split is None or bool(g.split) == split) and (g.weighted or not weighted))


def _line(y: dict[int, float]) -> TimeFit:
    (b0, b1), (y0, y1) = FIT_SIZES, (y[FIT_SIZES[0]], y[FIT_SIZES[1]])
    slope = max(0.0, (y1 - y0) / (b1 - b0))
    return TimeFit(intercept_ms=max(y0 - slope * b0, -slope), per_sample_ms=slope)


@dataclass(frozen=True, slots=True, kw_only=True)
class MegatronSplit:
    """Megatron's tensor-parallel split of an analytic layer as its formulas give it: every
    counted FLOP divides; ``params`` parameters and ``saved_bytes_per_sample`` saved bytes split;
    ``collectives_fwd`` / ``collectives_bwd`` collectives of the ``act_bytes_per_sample``
    activation; the degrees must divide ``must_divide``. :func:`analytic_layer` prices it into the
    layer's :class:`TensorSplit` (its time fraction and per-degree entries)."""

    act_bytes_per_sample: float
    params: int
    saved_bytes_per_sample: float
    collectives_fwd: int
    collectives_bwd: int
    must_divide: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerSpec:
    """One analytic layer as a model's formulas describe it, before it is priced on a device
    (:func:`analytic_layer`): its forward GEMMs per sample, its tensor-parallel split, the bytes
    its element-wise kernels move (``moved`` = (all, the part tensor parallelism splits) per
    sample; None: its saved bytes and the split's saved bytes) and backward's multiple of them
    (``bwd_moved``), its attention core (``core``: the core's GEMMs and saved bytes per sample),
    parameters, saved / input / output bytes per sample, and ``wsaved_bytes_per_sample``: what
    the weight-gradient pass keeps alive after B (the inputs of the weight GEMMs)."""

    name: str
    kind: str
    gemms: tuple[Gemm, ...]
    split: MegatronSplit | None
    param_count: int
    saved_bytes_per_sample: float
    input_bytes_per_sample: float
    output_bytes_per_sample: float
    wsaved_bytes_per_sample: float = 0.0
    moved: tuple[float, float] | None = None
    bwd_moved: float = 2.0
    core: tuple[tuple[Gemm, ...], float] | None = None


def analytic_layer(spec: LayerSpec, rates: DeviceRates) -> Layer:
    """One analytic layer: its forward GEMMs at the throughput of their shapes plus the
    memory-bound time of the bytes its element-wise kernels move (:attr:`LayerSpec.moved`) at
    the achieved HBM rate (see the module docstring of :mod:`planner.profiling.analytic.gpt`);
    backward: each GEMM's backward (twice its forward, :class:`Gemm`) and ``bwd_moved`` times the
    bytes (gradients as large). The time is the line through :data:`FIT_SIZES`. A split gets its
    time fraction (the split GEMMs and bytes, at micro-batch 1) and a :class:`SplitDegree` per
    degree of :data:`TP_DEGREES` that divides its ``must_divide`` sizes. The attention core's
    forward is priced the same way: the selective recompute level
    (:mod:`planner.profiling.analytic.attention`).

    Backward split (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, sec. 2): W is one
    product per weighted GEMM, as long as its forward (``gemms_ms(weighted=True)``); everything else (the
    input-gradient products, attention's products, the element-wise bytes) is B. Its share of
    the backward is taken at the larger fit size."""
    gemms, saved, core, bwd_moved = spec.gemms, float(spec.saved_bytes_per_sample), spec.core, spec.bwd_moved
    sp = spec.split
    tp = None if sp is None else TensorSplit(
        must_divide=sp.must_divide, split_time_fraction=1.0, split_param_count=sp.params,
        split_saved_bytes_per_sample=sp.saved_bytes_per_sample, collective_bytes_per_sample=sp.act_bytes_per_sample,
        collectives_fwd=sp.collectives_fwd, collectives_bwd=sp.collectives_bwd,
    )
    mem, split_mem = spec.moved if spec.moved is not None else (saved, tp.split_saved_bytes_per_sample if tp else 0.0)

    def at(b: int, backward: bool) -> float:
        return rates.gemms_ms(gemms, b, backward=backward) + (bwd_moved if backward else 1.0) * mem * b / rates.bytes_per_ms

    fwd = {b: at(b, False) for b in FIT_SIZES}
    big = FIT_SIZES[-1]
    bwd_big = at(big, True)
    w_share = min(1.0, rates.gemms_ms(gemms, big, weighted=True) / bwd_big) if bwd_big > 0 else 0.0
    w_saved = min(1.0, float(spec.wsaved_bytes_per_sample) / saved) if saved > 0 else 0.0
    if tp is not None and fwd[1] > 0:
        tp = _split_degrees(tp, gemms, rates, fwd[1], split_mem, bwd_moved)
    return Layer(
        fp8=fp8_gemms(gemms, rates),
        name=spec.name,
        kind=spec.kind,
        fwd=_line(fwd),
        bwd=_line({b: at(b, True) for b in FIT_SIZES}),
        param_count=int(spec.param_count),
        param_bytes=int(spec.param_count) * BYTES_PER_PARAM,
        saved_bytes_per_sample=saved,
        input_bytes_per_sample=float(spec.input_bytes_per_sample),
        output_bytes_per_sample=float(spec.output_bytes_per_sample),
        tp=tp,
        weight_grad_fraction=w_share,
        weight_grad_saved_fraction=w_saved,
        attention_core=None if core is None else AttentionCore(
            saved_bytes_per_sample=core[1],
            fwd=_line({b: rates.gemms_ms(core[0], b) + core[1] * b / rates.bytes_per_ms for b in FIT_SIZES}),
        ),
    )


#: GEMMs that stay bf16 under every FP8 recipe (Megatron-Core / Transformer Engine defaults): the LM head
#: (``logits``) and the MoE router; the attention core's products are not weighted (activations by
#: activations) and never FP8 here; the embedding is a lookup
BF16_GEMMS = frozenset({"logits", "router"})


def fp8_gemms(gemms: Sequence[Gemm], rates: DeviceRates) -> Fp8Gemms | None:
    """The layer's GEMMs an FP8 recipe runs in FP8 (:class:`Fp8Gemms`): the weighted products
    but the head's and the router's. Distinct inputs: GEMMs reading one tensor (q, k, v of one
    normalised input; gate and up) share their ``(k, split, window)``; each counted once. None
    on a device without FP8 (its profiles stay as they were)."""
    fp8 = [g for g in gemms if g.weighted and not g.fused and g.name not in BF16_GEMMS]
    if not fp8 or not rates.device.peak_fp8_tflops:  # a device without FP8 tensor cores: no view
        return None
    inputs = {(g.k, g.split, g.window): float(g.m * g.k) for g in fp8}
    return Fp8Gemms(
        fwd=_line({b: rates.gemms_ms(fp8, b) for b in FIT_SIZES}),
        bwd=_line({b: rates.gemms_ms(fp8, b, backward=True) for b in FIT_SIZES}),
        input_bytes_per_sample=BYTES_PER_ACT * sum(inputs.values()),
        grad_bytes_per_sample=BYTES_PER_ACT * sum(float(g.m * g.n * g.count) for g in fp8),
        param_count=sum(g.k * g.n * g.count for g in fp8),
    )


def _split_degrees(tp: TensorSplit, gemms: Sequence[Gemm], rates: DeviceRates, fwd_1: float, split_mem: float,
                   bwd_moved: float = 2.0) -> TensorSplit:
    """``tp`` with its time fraction and its per-degree entries (see :func:`analytic_layer`):
    ``time_scale`` = the split work's time on one of ``t`` devices x t / its time on one, and
    each collective's window = the GEMMs beside it / the split work's time (backward: their
    weight gradients, each as long as its forward, / the split work's backward), means over
    :data:`FIT_SIZES`."""

    def split_ms(b: int, t: int, backward: bool = False) -> float:
        return (rates.gemms_ms(gemms, b, t, split=True, backward=backward)
                + (bwd_moved if backward else 1.0) * split_mem * b / rates.bytes_per_ms / t)

    degrees = []
    for t in TP_DEGREES:
        if any(size % t for size in tp.must_divide):
            continue
        scale = sum(split_ms(b, t) * t / split_ms(b, 1) for b in FIT_SIZES) / len(FIT_SIZES) if split_ms(1, 1) else 1.0

        def window(i: int, backward: bool, t: int = t) -> float:
            fracs = []
            for b in FIT_SIZES:  # backward: the weight gradient, one GEMM as long as the forward
                beside = sum(rates.gemm_ms(g, b, t) for g in gemms
                             if (g.bwd_window if backward else g.window) == i)
                whole = split_ms(b, t, backward)
                fracs.append(beside / whole if whole else 0.0)
            return min(1.0, sum(fracs) / len(fracs))

        degrees.append(SplitDegree(
            degree=t, time_scale=scale,
            fwd_overlap=tuple(window(i, False) for i in range(tp.collectives_fwd)),
            bwd_overlap=tuple(window(i, True) for i in range(tp.collectives_bwd)),
        ))
    fraction = min(1.0, split_ms(1, 1) / fwd_1)
    return replace(tp, split_time_fraction=fraction, degrees=tuple(degrees))


def device_rates(device_preset: str, gemm: GemmModel | None = None) -> DeviceRates:
    """The preset with its GEMM model (``gemm``, or the preset's fitted constants)."""
    if device_preset not in DEVICE_PRESETS:
        raise PlannerInputError(f"unknown --device-preset {device_preset!r} (known: {', '.join(DEVICE_PRESETS)})")
    device = DEVICE_PRESETS[device_preset]
    model = gemm if gemm is not None else gemm_model_of(device_preset)
    return DeviceRates(
        device=device, gemm=model, peak_flops_per_ms=device.peak_bf16_tflops * 1e12 / 1e3,
        bytes_per_ms=device.hbm_gb_per_s * 1e9 / 1e3 * model.memory_efficiency,
        metadata={**model.metadata, "peak_bf16_tflops": device.peak_bf16_tflops, "hbm_gb_per_s": device.hbm_gb_per_s,
                  "peak_source": device.source},
    )


def analytic_profile(
    *, model: str, device_preset: str, gemm: GemmModel | None, layers: Sequence[LayerSpec], tied_params: int,
    about: Mapping[str, Any], formulas: Mapping[str, Any], model_flops_per_sample: float,
    attention: AttentionKind = AttentionKind.UNKNOWN,
) -> Profile:
    """An analytic chain profile of ``layers`` priced on a device preset (:func:`device_rates`,
    :func:`analytic_layer`): consecutive layers joined by their outputs, the embedding and head
    tying ``tied_params`` parameters (0: untied). Its metadata: ``about`` (what the model is),
    the device's (:attr:`DeviceRates.metadata`), then ``formulas`` (their sources and the shape)."""
    rates = device_rates(device_preset, gemm)
    priced = [analytic_layer(spec, rates) for spec in layers]
    n = len(priced)
    return Profile(
        model=model,
        source="analytic",
        device=rates.device.name,
        dtype=DType.BFLOAT16,
        microbatch_sizes=(1,),
        versions={},
        metadata={**about, **rates.metadata, **formulas},
        fingerprint_sha256=profile_fingerprint(tuple(layer.name for layer in priced), tuple(() for _ in priced)),
        model_flops_per_sample=model_flops_per_sample,
        attention=attention,
        layers=tuple(priced),
        edges=tuple(Edge(src=i, dst=i + 1, bytes_per_sample=priced[i].output_bytes_per_sample) for i in range(n - 1)),
        tied=(
            (TiedParams(name="embed.weight=head.weight", layers=(0, n - 1), param_count=tied_params,
                        param_bytes=tied_params * BYTES_PER_PARAM),)
            if tied_params else ()
        ),
    )
