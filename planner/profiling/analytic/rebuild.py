"""An analytic profile built again from what it records, with other GEMM constants.

The analytic GPT and Llama profiles record their generator's inputs in their metadata (the
shape, the attention kind, the selective unit) and the device they were priced on; a
prediction's band (:mod:`planner.cost.band`) prices the same model under each
leave-one-source-out fit of the device's constants, which takes the profile rebuilt with them.
A measured or imported profile records no such inputs: :func:`rebuild_with` gives None.
"""

from __future__ import annotations

from collections.abc import Mapping

from planner.artifacts.kinds import SelectiveUnit
from planner.artifacts.profile import Profile
from planner.profiling.analytic.common import DEVICE_PRESETS
from planner.profiling.analytic.gemm import GemmModel
from planner.profiling.analytic.gpt import gpt_profile
from planner.profiling.analytic.llama import llama_profile

__all__ = ["device_preset_of", "rebuild_with"]


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
                             selective=unit)
    shape = _ints(meta, "layers", "hidden", "heads", "seq", "vocab")
    if shape is None or "attention" not in meta:
        return None
    return gpt_profile(**shape, device_preset=device, gemm=gemm, model=profile.model, attention=str(meta["attention"]))
