"""The shared in-memory cache: one :class:`Store` per informer, written only through its :class:`Writer`.

Owns objects (plain dicts decoded from the apiserver) keyed by :class:`~declop.keys.Request`, a
namespace index, user indexes, and the "has listed once" flag.

Invariants:
- One writer, many readers. Only the informer holds the ``Writer``; everything else sees the
  read-only ``Store`` face.
- Stored objects are never mutated in place: the writer replaces the whole dict. Readers on other
  threads therefore see either the old or the new object, never a half-written one.
- User code never holds a stored object itself. Handlers get copies (:func:`clone`, made by the
  client and the controller); predicates, map functions and index functions, which run on the
  loop for every event, get :func:`readonly` views, which cost per field read instead of per
  object and raise ``TypeError`` on any change. ``Store.get``/``Store.list`` return the shared
  objects themselves: framework-internal only.
- Index values are recomputed on every write of an object; deleting an object removes it from
  every index.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Iterator, Mapping, NoReturn, Sequence, overload

from .errors import CacheNotSyncedError
from .keys import Request, key_of
from .labels import Selector, parse_selector

__all__ = [
    "IndexFunc",
    "ReadOnlyDict",
    "ReadOnlyList",
    "Store",
    "Transform",
    "Writer",
    "clone",
    "readonly",
    "strip_managed_fields",
]

log = logging.getLogger("declop.cache")

Obj = dict[str, Any]
IndexFunc = Callable[[Mapping[str, Any]], Iterable[str | None]]
Transform = Callable[[Obj], Obj]


def clone(obj: Any) -> Any:
    """A deep copy of JSON-shaped data (dicts, lists, scalars), several times faster than deepcopy.

    A :func:`readonly` view is copied into plain, mutable dicts and lists."""
    t = type(obj)
    if t is dict:
        return {k: (clone(v) if type(v) in (dict, list) else v) for k, v in obj.items()}
    if t is list:
        return [(clone(v) if type(v) in (dict, list) else v) for v in obj]
    if t is ReadOnlyDict or t is ReadOnlyList:
        return clone(obj._data)
    return obj


def readonly(obj: Any) -> Any:
    """A read-only view of JSON-shaped data: dicts become :class:`ReadOnlyDict`, lists
    :class:`ReadOnlyList`, anything else is returned as is. Nothing is copied: nested values are
    wrapped when they are read, so the cost is per field read, not per object."""
    t = type(obj)
    if t is dict:
        return ReadOnlyDict(obj)
    if t is list:
        return ReadOnlyList(obj)
    return obj


_HINT = "cached objects are read-only here; declop.clone(obj) gives a mutable copy"


def _refuse(*_: Any, **__: Any) -> NoReturn:
    raise TypeError(_HINT)


class ReadOnlyDict(Mapping[str, Any]):
    """A read-only view of a cached dict (see :func:`readonly`). Reads work as on a dict; any
    change raises ``TypeError``. ``copy()``, ``copy.deepcopy`` and :func:`clone` give a mutable
    deep copy (a plain dict); ``json.dumps`` needs that copy."""

    __slots__ = ("_data",)

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        v = self._data[key]
        t = type(v)
        if t is dict:
            return ReadOnlyDict(v)
        if t is list:
            return ReadOnlyList(v)
        return v

    def get(self, key: str, default: Any = None) -> Any:
        v = self._data.get(key, default)
        t = type(v)
        if t is dict:
            return ReadOnlyDict(v)
        if t is list:
            return ReadOnlyList(v)
        return v

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __eq__(self, other: object) -> bool:
        if type(other) is ReadOnlyDict:
            return self._data == other._data
        if isinstance(other, dict):
            return self._data == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ReadOnlyDict({self._data!r})"

    def copy(self) -> dict[str, Any]:
        """A mutable deep copy."""
        return clone(self._data)  # type: ignore[no-any-return]

    def __copy__(self) -> ReadOnlyDict:
        return self

    def __deepcopy__(self, memo: Any) -> dict[str, Any]:
        return self.copy()

    __setitem__ = __delitem__ = setdefault = update = pop = popitem = clear = __ior__ = _refuse


class ReadOnlyList(Sequence[Any]):
    """A read-only view of a cached list (see :func:`readonly`); like :class:`ReadOnlyDict`."""

    __slots__ = ("_data",)

    def __init__(self, data: list[Any]) -> None:
        self._data = data

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> ReadOnlyList: ...

    def __getitem__(self, index: int | slice) -> Any:
        v: Any = self._data[index]
        t = type(v)
        if t is dict:
            return ReadOnlyDict(v)
        if t is list:
            return ReadOnlyList(v)
        return v

    def __iter__(self) -> Iterator[Any]:
        for v in self._data:
            t = type(v)
            if t is dict:
                yield ReadOnlyDict(v)
            elif t is list:
                yield ReadOnlyList(v)
            else:
                yield v

    def __contains__(self, value: object) -> bool:
        return value in self._data

    def __len__(self) -> int:
        return len(self._data)

    def __eq__(self, other: object) -> bool:
        if type(other) is ReadOnlyList:
            return self._data == other._data
        if isinstance(other, list):
            return self._data == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ReadOnlyList({self._data!r})"

    def copy(self) -> list[Any]:
        """A mutable deep copy."""
        return clone(self._data)  # type: ignore[no-any-return]

    def __copy__(self) -> ReadOnlyList:
        return self

    def __deepcopy__(self, memo: Any) -> list[Any]:
        return self.copy()

    __setitem__ = __delitem__ = append = extend = insert = remove = pop = sort = reverse = clear = __iadd__ = __imul__ = _refuse


def strip_managed_fields(obj: Obj) -> Obj:
    """The default transform: drop ``metadata.managedFields`` (about 40 % of a typical object)."""
    meta = obj.get("metadata")
    if meta is not None:
        meta.pop("managedFields", None)
    return obj


class Store:
    """The read face of one informer's cache. Safe to read from any thread."""

    def __init__(self, name: str = "", indexers: Mapping[str, IndexFunc] | None = None) -> None:
        self.name = name
        self._items: dict[Request, Obj] = {}
        self._by_namespace: dict[str, dict[Request, None]] = {}
        self._indexers: dict[str, IndexFunc] = dict(indexers or {})
        self._indexes: dict[str, dict[str, dict[Request, None]]] = {n: {} for n in self._indexers}
        self._index_values: dict[str, dict[Request, tuple[str, ...]]] = {n: {} for n in self._indexers}
        self.synced = False
        self.resource_version = ""

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def keys(self) -> list[Request]:
        return list(self._items)

    def get(self, key: Request) -> Obj | None:
        """The shared cached object, or None. Do not mutate it; :func:`clone` before handing it out."""
        return self._items.get(key)

    def require_synced(self) -> None:
        if not self.synced:
            raise CacheNotSyncedError(f"the cache for {self.name} has not finished its first list yet")

    def list(
        self,
        namespace: str | None = None,
        selector: str | Mapping[str, str] | Selector | None = None,
        index: tuple[str, str] | None = None,
    ) -> list[Obj]:
        """Shared objects filtered by namespace, label selector and/or ``(index_name, value)``."""
        if index is not None:
            name, value = index
            if name not in self._indexes:
                raise KeyError(f"no index {name!r} on {self.name}; known: {sorted(self._indexes)}")
            keys: Iterable[Request] = list(self._indexes[name].get(value, ()))
            if namespace:
                keys = [k for k in keys if k.namespace == namespace]
        elif namespace:
            keys = list(self._by_namespace.get(namespace, ()))
        else:
            keys = list(self._items)
        items = self._items
        objs = [items[k] for k in keys if k in items]
        if selector:
            match = parse_selector(selector)
            objs = [o for o in objs if match(o["metadata"].get("labels"))]
        return objs

    def __iter__(self) -> Iterator[Obj]:
        return iter(list(self._items.values()))

    def add_indexer(self, name: str, fn: IndexFunc) -> None:
        """Add an index; existing objects are indexed at once."""
        if name in self._indexers:
            if self._indexers[name] is fn:
                return
            raise ValueError(f"index {name!r} already exists on {self.name}")
        self._indexers[name] = fn
        self._indexes[name] = {}
        self._index_values[name] = {}
        for key, obj in self._items.items():
            self._index(name, key, obj)

    # -- writer-only internals ------------------------------------------------------------
    def _index(self, name: str, key: Request, obj: Obj) -> None:
        try:
            values = tuple(v for v in (self._indexers[name](readonly(obj)) or ()) if v is not None)
        except Exception:  # a user index function must never stop the cache
            log.exception("Index function failed; the object is left out of this index", extra={"kv": {"index": name, "key": str(key)}})
            values = ()
        self._index_values[name][key] = values
        index = self._indexes[name]
        for v in values:
            index.setdefault(v, {})[key] = None

    def _unindex(self, name: str, key: Request) -> None:
        index = self._indexes[name]
        for v in self._index_values[name].pop(key, ()):
            bucket = index.get(v)
            if bucket is not None:
                bucket.pop(key, None)
                if not bucket:
                    del index[v]


class Writer:
    """The only way to change a :class:`Store`. Owned by exactly one informer."""

    def __init__(self, store: Store, transform: Transform | None = strip_managed_fields) -> None:
        self.store = store
        self.transform = transform

    def upsert(self, obj: Obj) -> tuple[Obj | None, Obj]:
        """Insert or replace ``obj`` (after the transform); returns ``(old, new)``."""
        if self.transform is not None:
            obj = self.transform(obj)
        s = self.store
        key = key_of(obj)
        old = s._items.get(key)
        s._items[key] = obj
        if old is None:
            s._by_namespace.setdefault(key.namespace, {})[key] = None
        for name in s._indexers:
            if old is not None:
                s._unindex(name, key)
            s._index(name, key, obj)
        return old, obj

    def delete(self, key: Request) -> Obj | None:
        """Remove ``key``; returns the last known object, or None if it was not cached."""
        s = self.store
        old = s._items.pop(key, None)
        if old is None:
            return None
        bucket = s._by_namespace.get(key.namespace)
        if bucket is not None:
            bucket.pop(key, None)
            if not bucket:
                del s._by_namespace[key.namespace]
        for name in s._indexers:
            s._unindex(name, key)
        return old

    def replace(self, objs: Iterable[Obj], resource_version: str) -> list[tuple[Obj | None, Obj | None]]:
        """Make the store hold exactly ``objs`` (a relist). Returns the changes as ``(old, new)``
        pairs: additions ``(None, new)``, changed objects ``(old, new)``, and — synthesised for keys
        that vanished during a gap — deletions ``(old, None)``. Unchanged objects produce nothing."""
        changes: list[tuple[Obj | None, Obj | None]] = []
        seen: set[Request] = set()
        items = self.store._items
        for obj in objs:
            key = key_of(obj)
            seen.add(key)
            prev = items.get(key)
            if prev is not None and prev["metadata"].get("resourceVersion") == obj["metadata"].get(
                "resourceVersion"
            ):
                continue
            changes.append(self.upsert(obj))
        for key in [k for k in items if k not in seen]:
            changes.append((self.delete(key), None))
        self.store.resource_version = resource_version
        self.store.synced = True
        return changes
