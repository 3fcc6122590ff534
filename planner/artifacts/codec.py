"""Typed JSON codec for the planner's frozen dataclasses.

One source of truth: the dataclass type hints drive decoding (with validation that names
the field path and the offending value), encoding, and the JSON Schema files shipped in
``planner/schemas/`` (:mod:`planner.artifacts.json_schema`). Files are read through
:mod:`planner.artifacts.reading` (regular files of bounded size only). A field's metadata may
bound a list (``max_items``: e.g. a request's schedules, each at most once): a longer list is
refused before any item is decoded, so the refusal costs nothing however long the list.
Documents are versioned: every top-level document carries ``"schema"`` and ``"version"`` and
a reader refuses versions it does not know.

No pickle anywhere; floats are written with ``repr`` precision (``json`` default), so a
round trip is exact and the same object always serialises to the same bytes.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, Union

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.reading import read_text

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


#: per dataclass: its init fields as (name, type hint, required?, max_items), in order
_DECODE_FIELDS: dict[type, tuple[tuple[str, Any, bool, int | None], ...]] = {}
#: per dataclass: the names of its init fields
_FIELD_NAMES: dict[type, frozenset[str]] = {}
#: per dataclass: its optional fields (null decodes to None) and its tuple[X, ...] fields ([] is ())
_SHORTCUTS: dict[type, tuple[frozenset[str], frozenset[str]]] = {}
#: per enum: its values -> members (a value matches only a value of the same JSON type)
_ENUM_VALUES: dict[type, dict[Any, enum.Enum]] = {}


def _decode_fields(cls: type) -> tuple[tuple[str, Any, bool, int | None], ...]:
    """The fields :func:`decode` reads, computed once per class (``typing.get_type_hints`` was
    70% of decoding a large document when called per object)."""
    spec = _DECODE_FIELDS.get(cls)
    if spec is None:
        hints = typing.get_type_hints(cls)
        spec = tuple(
            (f.name, hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
             f.metadata.get("max_items"))
            for f in dataclasses.fields(cls) if f.init
        )
        _DECODE_FIELDS[cls] = spec
        _FIELD_NAMES[cls] = frozenset(name for name, *_ in spec)
        _SHORTCUTS[cls] = (
            frozenset(name for name, hint, *_ in spec if type(None) in typing.get_args(hint)),
            frozenset(name for name, hint, *_ in spec
                      if typing.get_origin(hint) is tuple and typing.get_args(hint)[1:] == (Ellipsis,)),
        )
    return spec


def _decode_enum(tp: type[enum.Enum], value: Any, path: str) -> Any:
    table = _ENUM_VALUES.get(tp)
    if table is None:
        table = _ENUM_VALUES[tp] = {m.value: m for m in tp}
    member = table.get(value) if isinstance(value, (str, int, float)) else None  # lists and objects are no value
    if member is None or type(member.value) is not type(value):  # JSON's true is not the stage 1
        _fail(path, f"must be one of {list(table)}", value)
    return member


def decode(tp: Any, value: Any, path: str = "") -> Any:
    """Convert plain JSON data ``value`` into type ``tp``, validating on the way."""
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _fail(path, "must be a number", value)
        if not math.isfinite(value):
            _fail(path, "must be a finite number", value)
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(path, "must be an integer", value)
        if not -(2**63) <= value < 2**63:
            _fail(path, "must fit in 64 bits", value)
        return value
    if tp is str:
        if not isinstance(value, str):
            _fail(path, "must be a string", value)
        _check_text(value, "", path)
        return value
    if tp is bool:
        if not isinstance(value, bool):
            _fail(path, "must be a boolean", value)
        return value
    if tp is Any:
        return value
    if isinstance(tp, type):
        if tp in _DECODE_FIELDS or dataclasses.is_dataclass(tp):
            return _decode_dataclass(tp, value, path)
        if issubclass(tp, enum.Enum):
            return _decode_enum(tp, value, path)
    return _decode_generic(tp, value, path)


#: per generic type hint: (origin, args), computed once
_GENERIC: dict[Any, tuple[Any, tuple[Any, ...]]] = {}


def _decode_generic(tp: Any, value: Any, path: str) -> Any:
    """Unions, tuples and dicts."""
    shape = _GENERIC.get(tp)
    if shape is None:
        shape = _GENERIC[tp] = (typing.get_origin(tp), typing.get_args(tp))
    origin, args = shape
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
    if origin is tuple:
        if not isinstance(value, list):
            _fail(path, "must be a list", value)
        if len(args) == 2 and args[1] is Ellipsis:
            item = args[0]
            return tuple(decode(item, v, f"{path}[{i}]") for i, v in enumerate(value))
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
    spec = _decode_fields(cls)
    names = _FIELD_NAMES[cls]
    nullable, var_tuples = _SHORTCUTS[cls]
    unknown = [k for k in value if k not in names]
    if unknown:
        first = min(unknown)
        _fail(f"{path}.{_key(first)}" if path else _key(first), f"unknown field in {cls.__name__}")
    kwargs = {}
    for name, hint, required, max_items in spec:
        if name not in value:
            if required:
                _fail(f"{path}.{name}" if path else name, "missing required field")
            continue
        item = value[name]
        kind = type(item)
        # the common cases inline (what decode() would return for them): a finite float, a
        # 64-bit int, an ASCII string (no surrogate can hide in one); the rest through decode()
        if (hint is float and kind is float and item - item == 0.0) or (
                hint is int and kind is int and -(2**63) <= item < 2**63) or (
                hint is str and kind is str and item.isascii()):
            kwargs[name] = item
            continue
        if (item is None and name in nullable) or (kind is list and not item and name in var_tuples):
            kwargs[name] = None if item is None else ()  # null of an optional field, [] of a tuple[X, ...]
            continue
        sub = f"{path}.{name}" if path else name
        if max_items is not None and isinstance(item, list) and len(item) > max_items:
            _fail(sub, f"lists {len(item):,} items, more than the {max_items} distinct values it may hold")
        kwargs[name] = decode(hint, item, sub)
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
    if duplicates or (("\\ud" in text or "\\uD" in text) and _SURROGATE_ESCAPE.search(text)):
        _find_refused(json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float, object_pairs_hook=_pairs),
                      source)
    return data


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 200 else text[:197] + "..."


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
