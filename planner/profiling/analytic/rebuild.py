"""An analytic profile built again from what it records, with other GEMM constants.

The analytic GPT and Llama profiles record their generator's inputs in their metadata (the
shape, the attention kind, the selective unit) and the device they were priced on; a
prediction's band (:mod:`planner.cost.band`) prices the same model under each
leave-one-source-out fit of the device's constants, which takes the profile rebuilt with them.
A measured or imported profile records no such inputs: :func:`rebuild_with` gives None.

:func:`with_fp8_views` uses the same rebuild to give an analytic profile written before the FP8
view of its GEMMs existed (``Layer.fp8``, issue 49) that view at load time: built again with the
GEMM constants it records, and taken only where the rebuilt layers are the profile's own (names,
times, bytes, parameters): the file and its hash stay as they are.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from planner.artifacts.kinds import SelectiveUnit
from planner.artifacts.profile import Layer, Profile
from planner.profiling.analytic.common import DEVICE_PRESETS
from planner.profiling.analytic.gemm import GemmModel
from planner.profiling.analytic.gpt import gpt_profile
from planner.profiling.analytic.llama import llama_profile

__all__ = ["device_preset_of", "rebuild_with", "recorded_gemm", "with_fp8_views"]


def device_preset_of(profile: Profile) -> str:
    """The analytic device preset an analytic profile was priced on ("" if none)."""
    if profile.source != "analytic":
        return ""
    return next((key for key, preset in DEVICE_PRESETS.items() if preset.name == profile.device), "")


def _ints(meta: Mapping[str, object], *keys: str) -> dict[str, int] | None:
    out = {}
    for key in keys:
        value = meta.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return None
        out[key] = value
    return out


def rebuild_with(profile: Profile, gemm: GemmModel) -> Profile | None:
    """``profile`` built again by its generator with ``gemm`` (None when it is not an analytic GPT
    or Llama profile that records its inputs)."""
    device = device_preset_of(profile)
    meta = profile.metadata
    if not device:
        return None
    if meta.get("architecture") == "llama":
        shape = _ints(meta, "layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "seq")
        if shape is None:
            return None
        config = {"model_type": str(meta.get("model_type", "llama")), "num_hidden_layers": shape["layers"],
                  "hidden_size": shape["hidden"], "num_attention_heads": shape["heads"],
                  "num_key_value_heads": shape["kv_heads"], "head_dim": shape["head_dim"],
                  "intermediate_size": shape["intermediate"], "vocab_size": shape["vocab"],
                  "tie_word_embeddings": bool(meta.get("tie_word_embeddings", False))}
        unit = SelectiveUnit(str(meta.get("selective_unit", SelectiveUnit.ATTENTION_CORE.value)))
        return llama_profile(config, seq=shape["seq"], device_preset=device, gemm=gemm, model=profile.model,
                             selective=unit, fused_cross_entropy=meta.get("cross_entropy") == "te-fused")
    shape = _ints(meta, "layers", "hidden", "heads", "seq", "vocab")
    if shape is None or "attention" not in meta:
        return None
    return gpt_profile(**shape, device_preset=device, gemm=gemm, model=profile.model, attention=str(meta["attention"]))


def recorded_gemm(meta: Mapping[str, object]) -> GemmModel | None:
    """The GEMM constants an analytic profile records (None where it records none)."""
    values = [meta.get(k) for k in ("gemm_max_efficiency", "gemm_half_intensity_flop_per_byte", "memory_efficiency")]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return None
    try:
        return GemmModel(max_efficiency=float(values[0]), half_intensity=float(values[1]),  # type: ignore[arg-type]
                         memory_efficiency=float(values[2]))  # type: ignore[arg-type]
    except ValueError:
        return None


def _same_layer(a: Layer, b: Layer) -> bool:
    """Whether ``b`` (rebuilt) is ``a``: its name, times, saved bytes and parameters."""
    def close(x: float, y: float) -> bool:
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)

    return (a.name == b.name and a.param_count == b.param_count
            and all(close(x, y) for x, y in ((a.fwd.intercept_ms, b.fwd.intercept_ms), (a.fwd.per_sample_ms, b.fwd.per_sample_ms),
                                             (a.bwd.intercept_ms, b.bwd.intercept_ms), (a.bwd.per_sample_ms, b.bwd.per_sample_ms),
                                             (a.saved_bytes_per_sample, b.saved_bytes_per_sample))))


def with_fp8_views(profile: Profile) -> Profile:
    """``profile`` with the FP8 view of its GEMMs where it has none and is an analytic GPT or Llama
    profile that this version builds again, from what it records, to the same layers (module
    docstring); else ``profile`` itself (a measured profile's times are its own precision's)."""
    if any(layer.fp8 is not None for layer in profile.layers):
        return profile
    gemm = recorded_gemm(profile.metadata)
    rebuilt = rebuild_with(profile, gemm) if gemm is not None else None
    if (rebuilt is None or len(rebuilt.layers) != len(profile.layers) or all(b.fp8 is None for b in rebuilt.layers)
            or not all(_same_layer(a, b) for a, b in zip(profile.layers, rebuilt.layers))):
        return profile
    layers = tuple(dataclasses.replace(a, fp8=b.fp8) for a, b in zip(profile.layers, rebuilt.layers))
    return dataclasses.replace(profile, layers=layers)
