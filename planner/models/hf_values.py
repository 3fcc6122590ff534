"""The values of an ``hf:`` config that are not sizes: refused in one line naming the config,
the field and the value, before torch or transformers is imported (sizes are
``planner.models.hf_spec.SIZE_LIMITS``).

transformers builds a model from almost any value and fails later, or never: ``"rms_norm_eps":
null`` and ``"hidden_act": true`` traced back from inside torch, ``"attention_dropout": 1e308``
was accepted (the planner sets dropout to 0, so it trained as if it were 0), ``"rms_norm_eps":
-1e35`` was refused with a tensor-parallel message. Fields are checked by family, whatever
model type names them:

- probabilities (a name holding ``dropout`` or ``pdrop``): a number in [0, 1], or null where a
  config leaves it unset (BERT's ``classifier_dropout``);
- epsilons (a name ending in ``eps`` or ``epsilon``: ``rms_norm_eps``, ``layer_norm_eps``,
  ``layer_norm_epsilon``): a number in (0, 1] (it is added to a variance: 0 or less divides by
  zero or takes the root of a negative);
- activations (:data:`ACTIVATIONS`): a name, a string; whether transformers knows it is
  :func:`check_activation_names`, once transformers is imported;
- :data:`POSITIVE` (``rope_theta``, initialiser scales): a number > 0 (at most :data:`MAX_VALUE`);
- :data:`FLAGS` (``tie_word_embeddings``, ``attention_bias``, ...): a boolean.
"""

from __future__ import annotations

import json
import math
from collections.abc import Container
from typing import Any

from planner.artifacts.errors import PlannerInputError

__all__ = ["ACTIVATIONS", "FLAGS", "POSITIVE", "check_activation_names", "check_values"]

#: fields naming an activation function (t5's ``feed_forward_proj`` is ``[gated-]NAME``)
ACTIVATIONS = ("hidden_act", "activation_function", "hidden_activation", "feed_forward_proj")
#: fields that must be a positive number
POSITIVE = ("rope_theta", "initializer_range", "initializer_factor")
#: fields that must be a boolean
FLAGS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "scale_attn_weights", "add_cross_attention")
#: the largest positive value accepted (a rope base of 1e12 is far beyond any published model's)
MAX_VALUE = 1e12


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _why(key: str, value: Any) -> str:
    """Why ``value`` is not one of field ``key``'s family ("" when it is, or the field has none)."""
    name = key.lower()
    if "dropout" in name or "pdrop" in name:
        return "" if value is None or (_number(value) and 0 <= value <= 1) else "a probability: a number in [0, 1]"
    if name.endswith(("eps", "epsilon")):
        return "" if _number(value) and 0 < value <= 1 else "an epsilon: a number in (0, 1]"
    if key in ACTIVATIONS:
        ok = isinstance(value, str) and 0 < len(value) <= 64 and value.isprintable()
        return "" if ok else "an activation function's name (a string such as \"silu\")"
    if key in POSITIVE:
        return "" if _number(value) and 0 < value <= MAX_VALUE else f"a number in (0, {MAX_VALUE:g}]"
    if key in FLAGS:
        return "" if isinstance(value, bool) else "true or false"
    return ""


def check_values(config: dict[str, Any], where: str) -> None:
    """Refuse the first field of ``config`` whose value is not of its family (module docstring)."""
    for key, value in config.items():
        why = _why(str(key), value)
        if why:
            shown = json.dumps(value, default=str)
            raise PlannerInputError(f"{where}: {key} must be {why} (got {shown[:40]})")


def check_activation_names(config: dict[str, Any], where: str, known: Container[str]) -> None:
    """Refuse an activation transformers does not know (``known``: its ``ACT2FN``), before
    the model is built (a ``KeyError`` from inside transformers otherwise)."""
    for key in ACTIVATIONS:
        value = config.get(key)
        if not isinstance(value, str):
            continue
        name = value.split("-")[-1] if key == "feed_forward_proj" else value
        if name not in known:
            raise PlannerInputError(f"{where}: {key} {value!r} is not an activation transformers knows")
