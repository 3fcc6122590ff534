"""Model specs: ``NAME[:key=value,...]`` for the zoo, ``package.module:callable[:key=value,...]``
for a user factory. Every bad spec raises :class:`PlannerInputError` with a one-line message.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

from planner.artifacts.errors import PlannerInputError
from planner.models.workload import Workload


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def split_options(text: str, spec: str) -> dict[str, str]:
    """``"a=1,b=x"`` -> ``{"a": "1", "b": "x"}`` (empty text -> no options)."""
    options: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise PlannerInputError(f"model spec {spec!r}: option {item!r} is not key=value")
        options[key.strip()] = value.strip()
    return options


def _convert(value: str, tp: Any, where: str) -> Any:
    if tp in (int, "int"):
        try:
            return int(value)
        except ValueError:
            raise PlannerInputError(f"{where} must be an integer (got {value!r})") from None
    if tp in (float, "float"):
        try:
            return float(value)
        except ValueError:
            raise PlannerInputError(f"{where} must be a number (got {value!r})") from None
    return value


def build_config(cls: type, options: dict[str, str], spec: str) -> Any:
    """Instantiate the zoo config dataclass ``cls`` from string options, typed by its fields."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise PlannerInputError(
            f"model spec {spec!r}: unknown option {unknown[0]!r} (allowed: {', '.join(fields)})"
        )
    values = {k: _convert(v, fields[k].type, f"model spec {spec!r}: option {k!r}") for k, v in options.items()}
    for key, value in values.items():
        if isinstance(value, int) and value < 1 and key != "seed":
            raise PlannerInputError(f"model spec {spec!r}: option {key!r} must be >= 1 (got {value})")
    return cls(**values)


def _auto(value: str) -> Any:
    for tp in (int, float):
        try:
            return tp(value)
        except ValueError:
            pass
    return value


def load_factory(target: str, options: dict[str, str], spec: str) -> Workload:
    """Import ``package.module:callable``, call it with the options as keyword arguments.

    Option values are passed as ``int`` when they parse as one, else ``float``, else ``str``.
    """
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise PlannerInputError(
            f"model spec {spec!r}: cannot import {module_name!r} ({type(exc).__name__}: {_one_line(str(exc))})"
        ) from None
    factory: Callable[..., Any] | None = getattr(module, attr, None)
    if not callable(factory):
        raise PlannerInputError(f"model spec {spec!r}: {module_name!r} has no callable {attr!r}")
    try:
        workload = factory(**{k: _auto(v) for k, v in options.items()})
    except Exception as exc:
        raise PlannerInputError(
            f"model spec {spec!r}: factory raised {type(exc).__name__}: {_one_line(str(exc))}"
        ) from None
    if not isinstance(workload, Workload):
        raise PlannerInputError(
            f"model spec {spec!r}: factory returned {type(workload).__name__}, expected planner.Workload"
        )
    return workload
