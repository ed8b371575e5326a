"""The shared in-memory cache: one :class:`Store` per informer, written only through its :class:`Writer`.

Owns objects (plain dicts decoded from the apiserver) keyed by :class:`~declop.kube.keys.Request`, a
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
- A relist is computed beside the store and swapped in at once (:meth:`Writer.begin_replace`):
  readers, on any thread, see the old content or the new one, never a mix.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, NoReturn, Sequence, overload

from declop.errors import CacheNotSyncedError
from declop.logs import redact
from declop.kube.keys import Request, key_of
from declop.kube.labels import Selector, parse_selector

__all__ = [
    "IndexFunc",
    "ReadOnlyDict",
    "ReadOnlyList",
    "Store",
    "Transform",
    "Writer",
    "clone",
    "guarded",
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

    # The wrapping of :func:`readonly` is written out in each read method of both view classes
    # on purpose: user predicates and map functions read fields on every event, and a call per
    # field read was measurable there (bench/readonly_cost.py).

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
        return f"ReadOnlyDict({redact(self._data)!r})"  # a Secret's values never in a repr

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
        return f"ReadOnlyList({redact(self._data)!r})"

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


class _BadTransform(Exception):
    """A transform returned something the store cannot key."""


def guarded(fn: Transform, resource: str) -> Transform:
    """A user's transform for ``resource``, made safe for the cache.

    The transform gets each object as decoded from the apiserver (a fresh dict nobody else holds:
    changing it in place is fine) before it enters the store, on the event loop, for every event
    and every listed object: it must be pure and fast. It replaces the default
    (:func:`strip_managed_fields`), so call that too to keep dropping managedFields. It must return
    a dict whose ``metadata`` keeps ``name``, ``namespace`` and ``resourceVersion`` (the store keys
    on them and a relist compares resourceVersions).

    A transform that raises, or returns something else, is logged (the exception's type and the
    object's key, never its contents) and the object is cached as the default transform leaves
    it, with those three fields put back: the cache stays complete."""

    def transform(obj: Obj) -> Obj:
        meta = obj.get("metadata") or {}
        ident = (meta.get("name"), meta.get("namespace"), meta.get("resourceVersion"))
        try:
            out = fn(obj)
            m = out.get("metadata") if type(out) is dict else None
            if type(m) is not dict or (m.get("name"), m.get("namespace"), m.get("resourceVersion")) != ident:
                raise _BadTransform("it must return the object with metadata name, namespace and resourceVersion unchanged")
            return out
        except Exception as exc:  # a user transform must never stop the informer
            where = f"{ident[1]}/{ident[0]}" if ident[1] else str(ident[0])
            why = str(exc) if isinstance(exc, _BadTransform) else f"raised {type(exc).__name__}"
            log.error(
                f"The transform of {resource} failed on {where} ({why}); "
                "cached with the default transform (managedFields dropped)",
                extra={"kv": {"resource": resource, "key": where}},
            )
            meta = obj.get("metadata")
            if type(meta) is not dict:
                meta = obj["metadata"] = {}
            for field_name, value in zip(("name", "namespace", "resourceVersion"), ident):
                if value is not None:
                    meta[field_name] = value
            return strip_managed_fields(obj)

    transform.__name__ = getattr(fn, "__name__", "transform")
    return transform


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
        self._swaps = 0  # odd while Writer swaps a relist in (the seqlock that Store.list reads)

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
        while True:  # a seqlock against a relist swapped in meanwhile (Writer.begin_replace)
            swaps = self._swaps
            if swaps & 1:
                time.sleep(0)  # a swap is a few attribute stores on the loop's thread: let it finish
                continue
            items = self._items
            if index is not None:
                name, value = index
                indexes = self._indexes
                if name not in indexes:
                    raise KeyError(f"no index {name!r} on {self.name}; known: {sorted(indexes)}")
                keys: Iterable[Request] = list(indexes[name].get(value, ()))
                if namespace:
                    keys = [k for k in keys if k.namespace == namespace]
            elif namespace:
                keys = list(self._by_namespace.get(namespace, ()))
            else:
                keys = list(items)
            objs = [items[k] for k in keys if k in items]
            if self._swaps == swaps:
                break
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
        """Make the store hold exactly ``objs`` (a relist), in one go: :meth:`begin_replace` run to
        the end. Returns the changes as :meth:`Replacement.commit` does."""
        job = self.begin_replace(objs, resource_version)
        while not job.step(1 << 62):
            pass
        return job.commit()

    def begin_replace(self, objs: Iterable[Obj], resource_version: str) -> Replacement:
        """A relist computed aside in steps (:meth:`Replacement.step`), so that the caller can
        yield between them, then swapped into the store at once (:meth:`Replacement.commit`).
        Until the commit the store is unchanged; the writer must not change it meanwhile."""
        return Replacement(self, objs, resource_version)


class Replacement:
    """One relist being computed beside the store (see :meth:`Writer.begin_replace`).

    Invariants:
    - the new content (objects, namespace index, user indexes) is built in a separate
      :class:`Store`; readers keep seeing the old content, whole, until :meth:`commit`;
    - :meth:`commit` swaps the references in one step under the store's seqlock, so that a reader
      on another thread sees the old content or the new one, never a mix of both;
    - unchanged objects (same resourceVersion) keep their old dict and produce no change; the
      changes come in the order of ``objs``, then the synthesised deletions of vanished keys.
    """

    def __init__(self, writer: Writer, objs: Iterable[Obj], resource_version: str) -> None:
        self._writer = writer
        self._store = writer.store
        self._objs = iter(objs)
        self._old = writer.store._items
        self._aside = Store(writer.store.name, writer.store._indexers)
        self._aside_writer = Writer(self._aside, transform=None)
        self._vanished: Iterator[Request] | None = None
        self.resource_version = resource_version
        self.changes: list[tuple[Obj | None, Obj | None]] = []

    def step(self, budget: int) -> bool:
        """Process up to ``budget`` objects (listed, then old keys checked for deletion); True
        once everything is computed and :meth:`commit` may be called."""
        new = self._aside._items
        changes = self.changes
        if self._vanished is None:
            old, upsert, transform = self._old, self._aside_writer.upsert, self._writer.transform
            for obj in self._objs:
                key = key_of(obj)
                prev = new.get(key)
                if prev is None:
                    prev = old.get(key)
                if prev is not None and prev["metadata"].get("resourceVersion") == obj["metadata"].get(
                    "resourceVersion"
                ):
                    if new.get(key) is not prev:
                        upsert(prev)  # unchanged: the old dict stays, nothing to emit
                else:
                    if transform is not None:
                        obj = transform(obj)
                    upsert(obj)
                    changes.append((prev, obj))
                budget -= 1
                if budget <= 0:
                    return False
            self._vanished = iter(list(self._old))
        old = self._old
        for key in self._vanished:
            if key not in new:
                changes.append((old[key], None))
            budget -= 1
            if budget <= 0:
                return False
        return True

    def commit(self) -> list[tuple[Obj | None, Obj | None]]:
        """Swap the new content in (atomically, as seen by readers); returns the changes as
        ``(old, new)`` pairs: additions ``(None, new)``, changed objects ``(old, new)``, and —
        synthesised for keys that vanished during a gap — deletions ``(old, None)``."""
        s, aside = self._store, self._aside
        for name, fn in s._indexers.items():  # an index added while the relist was computed
            if name not in aside._indexes:
                aside.add_indexer(name, fn)
        s._swaps += 1
        try:
            s._items, s._by_namespace = aside._items, aside._by_namespace
            s._indexes, s._index_values = aside._indexes, aside._index_values
        finally:
            s._swaps += 1
        s.resource_version = self.resource_version
        s.synced = True
        return self.changes
