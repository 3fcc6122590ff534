"""``hf:CONFIG[:key=value,...]`` model specs parsed (no torch, no transformers): the config's
fields, the short option names, and the planner's own options (see :mod:`planner.models.hf`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.artifacts.errors import PlannerInputError

__all__ = ["ALIASES", "PLANNER_OPTIONS", "HFSpec", "load_config_dict", "parse_spec"]

#: the dtypes a model may be built in (planner.models.common.DTYPES, named here without torch)
DTYPES = ("bfloat16", "float32", "float64")

# short names accepted in specs -> transformers' standard config attribute names
ALIASES = {
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "intermediate": "intermediate_size",
    "vocab": "vocab_size",
}
PLANNER_OPTIONS = ("seq", "seed", "dtype", "padding")

@dataclass(frozen=True, slots=True, kw_only=True)
class HFSpec:
    """A parsed ``hf:`` spec: the config's fields and the planner's own options."""

    source: str
    config: dict[str, Any]
    seq: int | None = None
    seed: int = 0
    dtype: str = "float32"
    padding: bool = True


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for tp in (int, float):
        try:
            return tp(text)
        except ValueError:
            pass
    return text


def load_config_dict(source: str) -> dict[str, Any]:
    """The config fields of ``source``: a ``config.json``, a directory holding one, or a
    ``model_type`` (then just ``{"model_type": source}``)."""
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise PlannerInputError(f"hf:{source}: directory has no config.json")
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise PlannerInputError(f"hf:{source}: cannot read {path} as JSON ({' '.join(str(exc).split())})") from None
        if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
            raise PlannerInputError(f"hf:{source}: {path} has no \"model_type\" string")
        return data
    if "/" in source or source.endswith(".json"):
        raise PlannerInputError(f"hf:{source}: no such file or directory")
    return {"model_type": source}


def parse_spec(rest: str, spec: str, dtype: str | None = None) -> HFSpec:
    """``CONFIG[:key=value,...]`` (the part after ``hf:``) -> :class:`HFSpec`. Keys are config
    fields (or the short names in :data:`ALIASES`) and the planner options ``seq`` (tokens per
    sample), ``seed`` (weights), ``dtype``, ``padding`` (0 = every sample full length)."""
    source, _, opts = rest.rpartition(":") if ":" in rest and not Path(rest).exists() else (rest, "", "")
    if not source:
        raise PlannerInputError(f"model spec {spec!r}: give hf:CONFIG (a config.json, a directory, or a model_type)")
    config = load_config_dict(source)
    planner: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in opts.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise PlannerInputError(f"model spec {spec!r}: option {item!r} is not key=value")
        key = key.strip()
        if key in PLANNER_OPTIONS:
            planner[key] = _value(value.strip())
        else:
            config[ALIASES.get(key, key)] = _value(value.strip())
    if dtype is not None:
        planner["dtype"] = dtype
    for key in ("seq", "seed"):
        if key in planner and (not isinstance(planner[key], int) or planner[key] < (0 if key == "seed" else 1)):
            kind = "non-negative" if key == "seed" else "positive"
            raise PlannerInputError(f"model spec {spec!r}: option {key!r} must be a {kind} integer")
    if planner.get("padding", 1) not in (0, 1):  # True/False compare equal to 1/0
        raise PlannerInputError(f"model spec {spec!r}: option 'padding' must be 0 or 1 (got {planner['padding']!r})")
    if str(planner.get("dtype", "float32")) not in DTYPES:  # as planner.models.common.parse_dtype says it
        raise PlannerInputError(f"dtype must be one of {sorted(DTYPES)} (got {str(planner['dtype'])!r})")
    return HFSpec(source=source, config=config, seq=planner.get("seq"), seed=int(planner.get("seed", 0)),
                  dtype=str(planner.get("dtype", "float32")), padding=bool(planner.get("padding", 1)))
