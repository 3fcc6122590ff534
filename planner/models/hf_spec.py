"""``hf:CONFIG[:key=value,...]`` model specs parsed (no torch, no transformers): the config's
fields, the short option names, and the planner's own options (see :mod:`planner.models.hf`).

Everything that can be refused without building the model is refused here, before torch or
transformers is imported (which takes seconds): a config file that is not a regular UTF-8 JSON
file of bounded size (``planner.artifacts.reading.read_text``), a ``model_type`` the planner has
no adapter for (:data:`SUPPORTED`; encoder-decoders other than t5 say why), a size field
(layers, hidden, heads, vocabulary, positions, ...) that is not a positive integer within
:data:`SIZE_LIMITS`, and any other value out of its family's range
(``planner.models.hf_values``: probabilities, epsilons, activations, flags).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.artifacts.codec import parse_text
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.reading import read_text
from planner.models.hf_values import check_values

__all__ = ["ALIASES", "PLANNER_OPTIONS", "SIZE_LIMITS", "SUPPORTED", "HFSpec", "check_config", "load_config_dict", "parse_spec"]

#: the model types :mod:`planner.models.hf` builds (its ``FAMILIES``; a test holds them equal)
SUPPORTED = ("llama", "mistral", "qwen2", "gpt2", "bert", "t5")
#: encoder-decoders transformers knows, refused with the reason (only t5's is carried)
ENCODER_DECODERS = frozenset({"bart", "mbart", "marian", "pegasus", "pegasus_x", "blenderbot", "blenderbot-small", "led",
                              "mt5", "umt5", "longt5", "switch_transformers", "fsmt", "prophetnet", "m2m_100",
                              "nllb-moe", "plbart", "bigbird_pegasus", "seamless_m4t", "whisper", "speech_to_text"})
#: size fields of the supported configs (by any of their names) -> the largest value accepted;
#: anything larger is no model this machine builds (the analytic profile reads the same limits)
SIZE_LIMITS: dict[str, int] = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers"), 10_000),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "head_dim", "d_kv"), 2**20),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "num_key_value_heads"), 2**16),
    **dict.fromkeys(("intermediate_size", "n_inner", "d_ff"), 2**24),
    **dict.fromkeys(("vocab_size", "max_position_embeddings", "n_positions", "sliding_window"), 2**24),
}

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


def read_config_file(path: str | Path, where: str) -> dict[str, Any]:
    """A ``config.json`` (or a directory holding one) as a dict: a regular UTF-8 JSON file of
    bounded size holding an object (``planner.artifacts.codec``); ``where`` prefixes refusals."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
        if not p.exists():
            raise PlannerInputError(f"{where}: directory {path} has no config.json")
    try:
        data = parse_text(read_text(p, "config.json"), str(p))
    except PlannerInputError as exc:
        raise PlannerInputError(f"{where}: {exc}") from None
    if not isinstance(data, dict):
        raise PlannerInputError(f"{where}: {p}: not a JSON object")
    return data


def load_config_dict(source: str) -> dict[str, Any]:
    """The config fields of ``source``: a ``config.json``, a directory holding one, or a
    ``model_type`` (then just ``{"model_type": source}``)."""
    path = Path(source)
    if path.exists() or path.is_symlink():
        data = read_config_file(path, f"hf:{source}")
        if not isinstance(data.get("model_type"), str):
            raise PlannerInputError(f"hf:{source}: {path} has no \"model_type\" string")
        return data
    if "/" in source or source.endswith(".json"):
        raise PlannerInputError(f"hf:{source}: no such file or directory")
    return {"model_type": source}


def check_config(config: dict[str, Any], where: str) -> None:
    """Refuse, before transformers is imported, a ``model_type`` the planner cannot build and a
    size field that is not a positive integer within :data:`SIZE_LIMITS`."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED:
        why = (
            "it is an encoder-decoder other than t5: every decoder block's cross-attention needs the encoder's"
            " final output, which must travel with the activations through every decoder stage; planner carries it"
            " for t5 only (planner/models/hf_t5.py)"
            if model_type in ENCODER_DECODERS else "no adapter for this architecture"
        )
        raise PlannerInputError(f"{where}: model_type {model_type!r} is not supported: {why} (supported: {', '.join(SUPPORTED)})")
    for key, limit in SIZE_LIMITS.items():
        value = config.get(key)
        if value is None or (key == "sliding_window" and value is False):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise PlannerInputError(f"{where}: {key} must be an integer in [1, {limit:,}] (got {str(value)[:40]!r})")
    check_values(config, where)  # the other values: probabilities, epsilons, activations (planner.models.hf_values)


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
        if key in planner and (not isinstance(planner[key], int) or planner[key] < (0 if key == "seed" else 1)
                               or planner[key] >= 2**63):
            kind = "non-negative" if key == "seed" else "positive"
            raise PlannerInputError(f"model spec {spec!r}: option {key!r} must be a {kind} integer")
    if planner.get("padding", 1) not in (0, 1):  # True/False compare equal to 1/0
        raise PlannerInputError(f"model spec {spec!r}: option 'padding' must be 0 or 1 (got {planner['padding']!r})")
    if str(planner.get("dtype", "float32")) not in DTYPES:  # as planner.models.common.parse_dtype says it
        raise PlannerInputError(f"dtype must be one of {sorted(DTYPES)} (got {str(planner['dtype'])!r})")
    check_config(config, f"model spec {spec!r}")  # the options' values too
    if planner.get("seq", 1) > SIZE_LIMITS["max_position_embeddings"]:
        raise PlannerInputError(f"model spec {spec!r}: option 'seq' must be at most {SIZE_LIMITS['max_position_embeddings']:,}")
    return HFSpec(source=source, config=config, seq=planner.get("seq"), seed=int(planner.get("seed", 0)),
                  dtype=str(planner.get("dtype", "float32")), padding=bool(planner.get("padding", 1)))
