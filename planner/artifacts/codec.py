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
import os
import re
import stat
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, Union

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.limits import MAX_INPUT_BYTES

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
    if isinstance(value, (list, dict)) and len(value) > 8:  # a summary, not megabytes dumped to cut
        return f"{'a list' if isinstance(value, list) else 'an object'} of {len(value):,} items"
    if isinstance(value, str) and len(value) > 80:
        value = value[:80]
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
        if not any(type(value) is type(a) and value == a for a in allowed):  # JSON's true is not the stage 1
            _fail(path, f"must be one of {allowed}", value)
        return tp(value)
    if tp is bool:
        if not isinstance(value, bool):
            _fail(path, "must be a boolean", value)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(path, "must be an integer", value)
        if not -(2**63) <= value < 2**63:
            _fail(path, "must fit in 64 bits", value)
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
        _check_text(value, "", path)
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
        for k in value:
            _check_text(str(k), "", f"{path}.{_key(k)}")
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


#: per type, its dataclass fields as :func:`encode` writes them: (name, omitted while default?,
#: default), init fields in order; None for a type that is not a dataclass
_ENCODED_FIELDS: dict[type, tuple[tuple[str, bool, Any], ...] | None] = {}


def _encoded_fields(cls: type) -> tuple[tuple[str, bool, Any], ...] | None:
    if cls not in _ENCODED_FIELDS:
        _ENCODED_FIELDS[cls] = tuple(
            (f.name, bool(f.metadata.get("omit_if_default")), _default_of(f)) for f in dataclasses.fields(cls) if f.init
        ) if dataclasses.is_dataclass(cls) else None
    return _ENCODED_FIELDS[cls]


def _default_of(f: dataclasses.Field[Any]) -> Any:
    """A field's default value (made by its ``default_factory`` when it has one)."""
    has_factory = f.default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING
    return f.default_factory() if has_factory else f.default  # type: ignore[operator]


def encode(obj: Any) -> Any:
    """Convert a dataclass tree to plain JSON data (field order kept, tuples as lists). A field
    whose metadata says ``omit_if_default`` is left out while it holds its default (a field
    added to a document without a new version: files without it read the same)."""
    spec = _encoded_fields(type(obj))
    if spec is not None:
        out = {}
        for name, omit, default in spec:
            value = getattr(obj, name)
            if not (omit and value == default):
                out[name] = encode(value)
        return out
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


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses as inf
        raise ValueError(f"number {text[:40]} is out of range (a finite float is at most ~1.8e308)")
    return value


class _Object(dict):  # type: ignore[type-arg]
    """A JSON object as parsed on the slow path, remembering a key it repeats."""

    duplicate: str | None = None


def _pairs(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object()
    for key, value in pairs:
        if key in obj and obj.duplicate is None:
            obj.duplicate = key
        obj[key] = value
    return obj


#: a JSON escape of a UTF-16 surrogate (a pair is two of them, a lone one is refused)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})|"
                               r"(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def _find_refused(value: Any, source: str) -> None:
    """The slow path, run only when the text may hold a duplicate key or a lone surrogate:
    walk the document (parsed with :class:`_Object`) depth first, with a frame per level, and
    refuse the first such key or string naming its path."""
    frames: list[tuple[Any, Any, str]] = [(iter([(None, value)]), None, "")]
    while frames:
        items, _, path = frames[-1]
        step = next(items, None)
        if step is None:
            frames.pop()
            continue
        key, item = step
        here = path if key is None else (f"{path}[{key}]" if isinstance(key, int) else _join(path, key))
        if isinstance(key, str):
            _check_text(key, source, here)
        if isinstance(item, str):
            _check_text(item, source, here)
        elif isinstance(item, dict):
            if isinstance(item, _Object) and item.duplicate is not None:
                dup = item.duplicate
                raise PlannerInputError(f"{source}: {_join(here, dup)}: key {_short(dup)} appears twice in one object")
            frames.append((iter(item.items()), None, here))
        elif isinstance(item, list):
            frames.append((iter(enumerate(item)), None, here))


def _join(path: str, key: str) -> str:
    return f"{path}.{_key(key)}" if path else _key(key)


def _check_text(text: str, source: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        raise PlannerInputError(
            f"{source + ': ' if source else ''}{path or '<document>'}: a lone UTF-16 surrogate \\u{code:04x} is not a character "
            f"(at character {exc.start} of {_short(text.encode('utf-8', 'backslashreplace').decode())})"
        ) from None


def parse_text(text: str, source: str) -> Any:
    """JSON text -> plain data, refusing NaN/Infinity, numbers that overflow a float,
    duplicate keys and lone surrogates (one line naming ``source``, the path and the value)."""
    duplicates: list[int] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) != len(items):
            duplicates.append(1)
        return obj

    try:
        data = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float, object_pairs_hook=pairs)
    except RecursionError:
        raise PlannerInputError(f"{source}: not valid JSON: nested too deeply") from None
    except ValueError as exc:
        raise PlannerInputError(f"{source}: not valid JSON: {_one_line(str(exc))}") from None
    # fast path: a duplicate was seen while parsing, or the text escapes a surrogate alone (a
    # lone surrogate can enter only as an escape: raw ones are not UTF-8); only then is the
    # document walked, to name the path
    if duplicates or _SURROGATE_ESCAPE.search(text):
        _find_refused(json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float, object_pairs_hook=_pairs),
                      source)
    return data


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 200 else text[:197] + "..."


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_input(path: str | Path, what: str = "file", limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of an input file: a regular file of at most ``limit`` bytes, else one line
    (a FIFO, ``/dev/zero``, a directory or a socket is refused before anything is read, so
    nothing blocks or fills memory). ``what`` names the file's role in messages."""
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        raise PlannerInputError(f"{p}: no such file") from None
    except OSError as exc:
        raise PlannerInputError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise PlannerInputError(f"{p}: is {_kind(mode)}, expected a {what}")
    try:  # O_NONBLOCK: a FIFO swapped in after the check still cannot block the open
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise PlannerInputError(f"{p}: cannot read: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise PlannerInputError(f"{p}: is {_kind(st.st_mode)}, expected a {what}")
        if st.st_size > limit:
            raise PlannerInputError(f"{p}: {st.st_size:,} bytes is larger than the {limit:,} bytes a {what} may have")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise PlannerInputError(f"{p}: larger than the {limit:,} bytes a {what} may have")
    return data


def read_text(path: str | Path, what: str = "file", limit: int = MAX_INPUT_BYTES) -> str:
    """:func:`read_input` decoded as UTF-8 (a leading byte-order mark is dropped: RFC 8259
    lets a parser ignore it); invalid bytes are refused naming their offset."""
    raw = read_input(path, what, limit)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PlannerInputError(
            f"{path}: not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 4]!r}); save it as UTF-8"
        ) from None


def read_json(path: str | Path) -> Any:
    """A JSON document from a file (:func:`read_text`, :func:`parse_text`)."""
    return parse_text(read_text(path, "JSON file"), str(path))


def is_version(data: Any, schema: str, version: int) -> bool:
    """``data`` is a document of ``schema`` at ``version`` (an integer: JSON's ``true`` is not 1)."""
    if not isinstance(data, dict) or data.get("schema") != schema:
        return False
    got = data.get("version")
    return type(got) is int and got == version


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
    if type(got_version) is not int or got_version != version:
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
