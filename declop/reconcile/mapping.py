"""Mapping: turn an event ``(old, new)`` on some resource into the keys a controller must reconcile.

Three mappers, each a callable ``(old, new) -> set[Request]``:

- :func:`enqueue_self` — the object's own key (the controller's primary resource);
- :func:`enqueue_owner` — the key of the *controlling* owner (``ownerReferences`` entry with
  ``controller: true``) matched on API group and kind, from both the old and the new object, so a
  child that changes owner wakes both;
- :func:`enqueue_mapped` — whatever a user function returns for the old and the new object.

Invariants:
- mappers never read the API. They look at the objects they are given; only a user map function
  that declares a ``client`` parameter reads the cache through it (e.g. an index lookup: "which
  Widgets name this Secret?"), and a cache that has not synced yet maps to no keys (the primary's
  own initial list enqueues every object anyway);
- a user map function gets read-only views of the cache's objects
  (:func:`~declop.cache.store.readonly`): it cannot change the cache.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, Mapping

from declop.cache.store import readonly
from declop.errors import CacheNotSyncedError
from declop.kube.keys import Request, key_of
from declop.reconcile.result import describe

__all__ = ["KeyMapper", "enqueue_mapped", "enqueue_owner", "enqueue_self", "to_request"]

KeyMapper = Callable[[Any, Any], set[Request]]


def enqueue_self(old: Any, new: Any) -> set[Request]:
    """The key of the object itself."""
    return {key_of(new if new is not None else old)}


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def enqueue_owner(group: str, kind: str, *, namespaced: bool = True, controller_only: bool = True) -> KeyMapper:
    """Map a child to its controlling owner of ``group``/``kind``."""

    def owners(obj: Any) -> Iterable[Request]:
        meta = obj.get("metadata") or {}
        ns = (meta.get("namespace") or "") if namespaced else ""
        for ref in meta.get("ownerReferences") or ():
            if controller_only and not ref.get("controller"):
                continue
            if ref.get("kind") == kind and _group(ref.get("apiVersion", "")) == group:
                yield Request(ns, ref["name"])

    def mapper(old: Any, new: Any) -> set[Request]:
        keys: set[Request] = set()
        for obj in (old, new):
            if obj is not None:
                keys.update(owners(obj))
        return keys

    mapper.__qualname__ = f"enqueue_owner({group or 'core'}/{kind})"
    return mapper


def to_request(value: Any) -> Request:
    """Accept a Request, ``"ns/name"``, ``(ns, name)`` or an object dict."""
    if isinstance(value, Request):
        return value
    if isinstance(value, str):
        return Request.parse(value)
    if isinstance(value, Mapping):
        return key_of(value)
    if isinstance(value, tuple) and len(value) == 2:
        return Request(value[0] or "", value[1])
    raise TypeError(f"a map function returned {describe(value)}; return Requests, 'ns/name' strings or objects")


def _takes_client(fn: Callable[..., Any]) -> bool:
    try:
        return "client" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False


def enqueue_mapped(fn: Callable[..., Iterable[Any] | None], client: Any = None) -> KeyMapper:
    """Map with a user function ``fn(obj) -> iterable of keys``, run on old and new objects.

    When ``fn`` declares a ``client`` parameter it is called as ``fn(obj, client=client)``: a
    cache reader (``client.get``/``client.list``, with indexes) to look up the objects that refer
    to ``obj``. It runs on the event loop: read only, never write. ``obj`` is a read-only view.
    """
    if _takes_client(fn):
        reader = client

        def call(obj: Any) -> Iterable[Any] | None:
            try:
                return fn(obj, client=reader)
            except CacheNotSyncedError:
                return ()

    else:
        call = fn

    def mapper(old: Any, new: Any) -> set[Request]:
        keys: set[Request] = set()
        for obj in (old, new):
            if obj is not None:
                keys.update(to_request(v) for v in (call(readonly(obj)) or ()))
        return keys

    mapper.__qualname__ = f"enqueue_mapped({getattr(fn, '__name__', fn)})"
    return mapper
