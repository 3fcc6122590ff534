"""The package's module-level caches in one registry: each says what it is keyed by and how many
entries it may hold, and :func:`reset` clears them all.

Every cache here memoises a pure function of its key (the same answer on a hit as on a miss),
so clearing one changes only how fast the next call is, never what it returns. A process that
plans many requests (a notebook, a benchmark) therefore grows no further than the bounds;
:func:`sizes` says where each cache stands, and tests call :func:`reset` to start cold.

Three kinds, each with an explicit bound:

- :class:`Cache`: at most ``bound`` entries; a store into a full cache clears it first (a
  count, not least-recently-used: a hit stays one dict lookup, and a search asks again what
  it asked recently, which a cleared cache works out once more);
- :class:`OwnedCache`: entries per owner object (a cost model), the owner held weakly, so its
  entries go with it, at most ``bound`` per owner (cleared as :class:`Cache` is);
- :func:`register_function`: a function wrapped in :func:`functools.lru_cache`, whose own
  ``maxsize`` is its bound (least recently used first out).

Caches are registered by name when their module is imported; registering a name again (a
module reloaded in a notebook) replaces the earlier one.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Cache", "CacheSize", "OwnedCache", "register_function", "reset", "sizes"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
O = TypeVar("O")


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheSize:
    """Where one registered cache stands: its entries (over every live owner for an owned
    cache), the most entries it may hold (per owner for an owned cache), and the most any one
    owner holds now (``entries`` for a cache without owners)."""

    name: str
    key: str
    entries: int
    bound: int
    most_per_owner: int

    @property
    def within_bound(self) -> bool:
        return self.most_per_owner <= self.bound


class _Registered(Protocol):
    name: str

    def clear(self) -> None: ...

    def size(self) -> CacheSize: ...


_REGISTRY: dict[str, _Registered] = {}


def _register(cache: _Registered) -> None:
    if not cache.name:
        raise ValueError("a registered cache needs a name")
    _REGISTRY[cache.name] = cache


def _check_bound(name: str, bound: int) -> None:
    if bound < 1:
        raise ValueError(f"cache {name!r}: bound must be at least 1 entry (got {bound})")


class Cache(Generic[K, V]):
    """A module-level memo of at most ``bound`` entries keyed as ``key`` says (module docstring)."""

    __slots__ = ("_data", "bound", "key", "name")

    def __init__(self, name: str, *, key: str, bound: int) -> None:
        _check_bound(name, bound)
        self.name, self.key, self.bound = name, key, bound
        self._data: dict[K, V] = {}
        _register(self)

    def get(self, key: K) -> V | None:
        return self._data.get(key)

    def put(self, key: K, value: V) -> V:
        """Store ``value`` at ``key`` (the cache cleared first when full); ``value`` back."""
        if len(self._data) >= self.bound and key not in self._data:
            self._data.clear()
        self._data[key] = value
        return value

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        self._data.clear()

    def size(self) -> CacheSize:
        n = len(self._data)
        return CacheSize(name=self.name, key=self.key, entries=n, bound=self.bound, most_per_owner=n)


class OwnedCache(Generic[O, K, V]):
    """Entries per owner (held weakly: they are freed with it), at most ``bound`` per owner."""

    __slots__ = ("_owners", "bound", "key", "name")

    def __init__(self, name: str, *, key: str, bound: int) -> None:
        _check_bound(name, bound)
        self.name, self.key, self.bound = name, key, bound
        self._owners: weakref.WeakKeyDictionary[O, dict[K, V]] = weakref.WeakKeyDictionary()
        _register(self)

    def get(self, owner: O, key: K) -> V | None:
        found = self._owners.get(owner)
        return None if found is None else found.get(key)

    def put(self, owner: O, key: K, value: V) -> V:
        """Store ``value`` at ``key`` of ``owner`` (its entries cleared first when full)."""
        data = self._owners.setdefault(owner, {})
        if len(data) >= self.bound and key not in data:
            data.clear()
        data[key] = value
        return value

    def __len__(self) -> int:
        return sum(len(data) for data in list(self._owners.values()))

    def clear(self) -> None:
        self._owners.clear()

    def size(self) -> CacheSize:
        counts = [len(data) for data in list(self._owners.values())]
        return CacheSize(name=self.name, key=self.key, entries=sum(counts), bound=self.bound,
                         most_per_owner=max(counts, default=0))


class _FunctionCache:
    """A registered :func:`functools.lru_cache` function."""

    __slots__ = ("function", "key", "name")

    def __init__(self, name: str, function: Any, key: str) -> None:
        info = function.cache_info()
        if info.maxsize is None:
            raise ValueError(f"cache {name!r}: an lru_cache needs a maxsize to be registered")
        self.name, self.key, self.function = name, key, function

    def clear(self) -> None:
        self.function.cache_clear()

    def size(self) -> CacheSize:
        info = self.function.cache_info()
        return CacheSize(name=self.name, key=self.key, entries=info.currsize, bound=info.maxsize,
                         most_per_owner=info.currsize)


F = TypeVar("F", bound=Callable[..., Any])


def register_function(name: str, function: F, *, key: str) -> F:
    """Register ``function`` (wrapped in :func:`functools.lru_cache` with a ``maxsize``) under
    ``name``; ``function`` back."""
    _register(_FunctionCache(name, function, key))
    return function


def reset() -> None:
    """Clear every registered cache (what follows runs cold, with the same results)."""
    for cache in _REGISTRY.values():
        cache.clear()


def sizes() -> tuple[CacheSize, ...]:
    """Every registered cache's :class:`CacheSize`, by name."""
    return tuple(_REGISTRY[name].size() for name in sorted(_REGISTRY))
