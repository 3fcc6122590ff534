"""JSON Schema (draft 2020-12) of the planner's documents, generated from the same dataclass
type hints the codec (:mod:`planner.artifacts.codec`) decodes with, so the files shipped in
``planner/schemas/`` cannot drift from what a reader accepts (``python -m planner.schemas``
rewrites them; a test checks they are current)."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any, Union

__all__ = ["document_schema", "json_schema"]


def _dataclass_schema(tp: type, defs: dict[str, Any]) -> None:
    """Register ``tp`` (a dataclass) under ``defs``: its init fields, required unless defaulted."""
    name = tp.__name__
    defs[name] = {}  # placeholder against recursion
    hints = typing.get_type_hints(tp)
    props: dict[str, Any] = {}
    required = []
    for f in dataclasses.fields(tp):
        if not f.init:
            continue
        sub = json_schema(hints[f.name], defs)
        doc = f.metadata.get("doc") if f.metadata else None
        if doc:
            sub = {**sub, "description": doc}
        if f.metadata and "max_items" in f.metadata:
            sub = {**sub, "maxItems": f.metadata["max_items"]}
        props[f.name] = sub
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
    defs[name] = {
        "type": "object",
        "description": (tp.__doc__ or "").strip().split("\n")[0],
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


def json_schema(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema (draft 2020-12) for a type, registering dataclasses under ``$defs``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return {}
    if origin in (Union, types.UnionType):
        return {"anyOf": [json_schema(a, defs) for a in args]}
    if tp is type(None):
        return {"type": "null"}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if tp.__name__ not in defs:
            _dataclass_schema(tp, defs)
        return {"$ref": f"#/$defs/{tp.__name__}"}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    scalar = {bool: "boolean", int: "integer", float: "number", str: "string"}.get(tp)
    if scalar is not None:
        return {"type": scalar}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": json_schema(args[0], defs)}
        return {
            "type": "array",
            "prefixItems": [json_schema(a, defs) for a in args],
            "minItems": len(args),
            "maxItems": len(args),
        }
    if origin is dict:
        return {"type": "object", "additionalProperties": json_schema(args[1], defs)}
    raise TypeError(f"no JSON Schema for {tp!r}")


def document_schema(cls: type, schema: str, version: int) -> dict[str, Any]:
    """The schema of a whole document of ``cls``: its ``schema`` and ``version`` header first."""
    defs: dict[str, Any] = {}
    json_schema(cls, defs)
    body = defs[cls.__name__]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"{schema}.v{version}.json",
        "title": schema,
        "type": "object",
        "properties": {
            "schema": {"const": schema},
            "version": {"const": version},
            **body["properties"],
        },
        "required": ["schema", "version", *body["required"]],
        "additionalProperties": False,
        "$defs": {k: v for k, v in defs.items() if k != cls.__name__},
    }
