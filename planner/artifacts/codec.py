"""Typed JSON codec for the planner's frozen dataclasses.

One source of truth: the dataclass type hints drive decoding (with validation that names
the field path and the offending value), encoding, and the JSON Schema files shipped in
``planner/schemas/``. Documents are versioned: every top-level document carries
``"schema"`` and ``"version"`` and a reader refuses versions it does not know.

No pickle anywhere; floats are written with ``repr`` precision (``json`` default), so a
round trip is exact and the same object always serialises to the same bytes.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, Union

from planner.artifacts.errors import PlannerInputError

T = TypeVar("T")

JSONScalar = str | int | float | bool


def _fail(path: str, message: str, value: Any = dataclasses.MISSING) -> typing.NoReturn:
    shown = "" if value is dataclasses.MISSING else f" (got {_short(value)})"
    raise PlannerInputError(f"{path or '<document>'}: {message}{shown}")


def _key(key: object) -> str:
    """A field or key as it appears in an error path: as is if plain, else quoted (one line)."""
    text = str(key)
    return text if text.isprintable() and text and "." not in text else repr(text)


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def decode(tp: Any, value: Any, path: str = "") -> Any:
    """Convert plain JSON data ``value`` into type ``tp``, validating on the way."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return decode(arg, value, path)
            except PlannerInputError:
                continue
        _fail(path, "does not match any allowed type", value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _decode_dataclass(tp, value, path)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        allowed = [m.value for m in tp]
        if value not in allowed:
            _fail(path, f"must be one of {allowed}", value)
        return tp(value)
    if tp is bool:
        if not isinstance(value, bool):
            _fail(path, "must be a boolean", value)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(path, "must be an integer", value)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _fail(path, "must be a number", value)
        if not math.isfinite(value):
            _fail(path, "must be a finite number", value)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            _fail(path, "must be a string", value)
        return value
    if origin is tuple:
        if not isinstance(value, list):
            _fail(path, "must be a list", value)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            _fail(path, f"must be a list of {len(args)} items", value)
        return tuple(decode(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin is dict:
        if not isinstance(value, dict):
            _fail(path, "must be an object", value)
        _, val_tp = args
        return {str(k): decode(val_tp, v, f"{path}.{_key(k)}") for k, v in value.items()}
    raise TypeError(f"codec cannot decode type {tp!r}")  # programming error, not input


def _decode_dataclass(cls: type[T], value: Any, path: str) -> T:
    if not isinstance(value, dict):
        _fail(path, f"must be an object ({cls.__name__})", value)
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(value) - set(fields))
    if unknown:
        _fail(f"{path}.{_key(unknown[0])}" if path else _key(unknown[0]), f"unknown field in {cls.__name__}")
    kwargs = {}
    for name, field in fields.items():
        sub = f"{path}.{name}" if path else name
        if name not in value:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                _fail(sub, "missing required field")
            continue
        kwargs[name] = decode(hints[name], value[name], sub)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        _fail(path, str(exc))


def encode(obj: Any) -> Any:
    """Convert a dataclass tree to plain JSON data (field order kept, tuples as lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise ValueError(f"refusing to write non-finite float {obj!r}")
        return obj
    return obj


def dumps_canonical(data: Any) -> str:
    """The canonical text of a document: stable key order, 2-space indent, newline at end."""
    return json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def sha256_of(data: Any) -> str:
    return hashlib.sha256(dumps_canonical(data).encode()).hexdigest()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_text(text: str, source: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise PlannerInputError(f"{source}: not valid JSON: {exc}") from None


def read_json(path: str | Path) -> Any:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise PlannerInputError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise PlannerInputError(f"{p}: is a directory, expected a JSON file") from None
    except OSError as exc:
        raise PlannerInputError(f"{p}: cannot read: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PlannerInputError(f"{p}: not valid JSON: not UTF-8 text") from None
    return parse_text(text, str(p))


def decode_document(cls: type[T], data: Any, schema: str, version: int, source: str) -> T:
    """Check the ``schema``/``version`` header, then decode the body into ``cls``."""
    if not isinstance(data, dict):
        raise PlannerInputError(f"{source}: <document>: must be a JSON object (got {_short(data)})")
    got_schema = data.get("schema")
    if got_schema != schema:
        raise PlannerInputError(
            f"{source}: schema: expected {schema!r} (got {_short(got_schema) if 'schema' in data else 'nothing'})"
        )
    got_version = data.get("version")
    if got_version != version:
        raise PlannerInputError(
            f"{source}: version: unsupported {schema} version {_short(got_version)}; "
            f"this planner reads version {version}"
        )
    body = {k: v for k, v in data.items() if k not in ("schema", "version")}
    try:
        return _decode_dataclass(cls, body, "")
    except PlannerInputError as exc:
        raise PlannerInputError(f"{source}: {exc}") from None
    except RecursionError:
        raise PlannerInputError(f"{source}: document nested too deeply") from None


def encode_document(obj: Any, schema: str, version: int) -> dict[str, Any]:
    return {"schema": schema, "version": version, **encode(obj)}


# ---------------------------------------------------------------- JSON Schema generation


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
        name = tp.__name__
        if name not in defs:
            defs[name] = {}  # placeholder against recursion
            hints = _hints(tp)
            props: dict[str, Any] = {}
            required = []
            for f in dataclasses.fields(tp):
                if not f.init:
                    continue
                sub = json_schema(hints[f.name], defs)
                doc = f.metadata.get("doc") if f.metadata else None
                if doc:
                    sub = {**sub, "description": doc}
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
        return {"$ref": f"#/$defs/{name}"}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
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
