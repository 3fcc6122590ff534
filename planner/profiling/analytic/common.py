"""What the analytic profiles share: device presets, one analytic layer (matmul time plus the
memory-bound work of its saved bytes), Megatron's tensor-parallel split, and the chain profile
they assemble (see :mod:`planner.profiling.analytic.gpt` for the formulas and their sources)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import DType
from planner.artifacts.profile import Edge, Layer, Profile, TensorSplit, TiedParams, TimeFit, profile_fingerprint


@dataclass(frozen=True, slots=True, kw_only=True)
class DevicePreset:
    name: str
    peak_bf16_tflops: float
    hbm_gb_per_s: float
    source: str


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
    ),
}

BYTES_PER_PARAM = 2  # bf16
BYTES_PER_ACT = 2  # bf16 activations



def analytic_layer(
    name: str, kind: str, fwd_flops: float, bwd_flops: float, flops_per_ms: float, tp: TensorSplit | None = None,
    bytes_per_ms: float = math.inf, **kw: float,
) -> Layer:
    """One analytic layer: matmul time ``flops / flops_per_ms`` plus memory-bound time, its saved
    bytes ``kw["saved"] / bytes_per_ms`` in forward and twice that in backward (see the module
    docstring); a ``tp`` split's time fraction is the share of both that divides by t."""
    saved = float(kw["saved"])
    mem_fwd = saved / bytes_per_ms
    fwd_ms = fwd_flops / flops_per_ms + mem_fwd
    if tp is not None and fwd_ms > 0:
        tp = replace(tp, split_time_fraction=(fwd_flops / flops_per_ms + tp.split_saved_bytes_per_sample / bytes_per_ms) / fwd_ms)
    return Layer(
        name=name,
        kind=kind,
        fwd=TimeFit(intercept_ms=0.0, per_sample_ms=fwd_ms),
        bwd=TimeFit(intercept_ms=0.0, per_sample_ms=bwd_flops / flops_per_ms + 2.0 * mem_fwd),
        param_count=int(kw["param_count"]),
        param_bytes=int(kw["param_count"]) * BYTES_PER_PARAM,
        saved_bytes_per_sample=float(kw["saved"]),
        input_bytes_per_sample=float(kw["inp"]),
        output_bytes_per_sample=float(kw["out"]),
        tp=tp,
    )


def device_rates(device_preset: str, efficiency: float) -> tuple[DevicePreset, float, float]:
    """The preset, its matmul FLOPs per ms at ``efficiency`` and its HBM bytes per ms."""
    if not 0 < efficiency <= 1:
        raise PlannerInputError(f"--efficiency must be in (0, 1] (got {efficiency})")
    if device_preset not in DEVICE_PRESETS:
        raise PlannerInputError(f"unknown --device-preset {device_preset!r} (known: {', '.join(DEVICE_PRESETS)})")
    device = DEVICE_PRESETS[device_preset]
    return device, device.peak_bf16_tflops * 1e12 * efficiency / 1e3, device.hbm_gb_per_s * 1e9 / 1e3


def megatron_split(
    act_bytes: float, params: int, saved: float, fwd: int, bwd: int, divide: tuple[int, ...] = ()
) -> TensorSplit:
    """Megatron's split of an analytic layer: every counted FLOP divides (the time fraction is
    refined by :func:`analytic_layer`), collectives of the ``act_bytes`` activation."""
    return TensorSplit(
        must_divide=divide, split_time_fraction=1.0, split_param_count=params, split_saved_bytes_per_sample=saved,
        collective_bytes_per_sample=act_bytes, collectives_fwd=fwd, collectives_bwd=bwd,
    )


def assemble(
    *, model: str, device: DevicePreset, layers: list[Layer], tied_params: int, metadata: dict[str, Any],
    model_flops_per_sample: float,
) -> Profile:
    """An analytic chain profile: consecutive layers joined by their outputs, the embedding
    and head tying ``tied_params`` parameters (0: untied)."""
    n = len(layers)
    return Profile(
        model=model,
        source="analytic",
        device=device.name,
        dtype=DType.BFLOAT16,
        microbatch_sizes=(1,),
        versions={},
        metadata=metadata,
        fingerprint_sha256=profile_fingerprint(tuple(layer.name for layer in layers), tuple(() for _ in layers)),
        model_flops_per_sample=model_flops_per_sample,
        layers=tuple(layers),
        edges=tuple(Edge(src=i, dst=i + 1, bytes_per_sample=layers[i].output_bytes_per_sample) for i in range(n - 1)),
        tied=(
            (TiedParams(name="embed.weight=head.weight", layers=(0, n - 1), param_count=tied_params,
                        param_bytes=tied_params * BYTES_PER_PARAM),)
            if tied_params else ()
        ),
    )
