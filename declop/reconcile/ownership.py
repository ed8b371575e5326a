"""Ownership and write helpers: controller references, create-or-update, retry on conflict.

One concept — writing children safely from a reconciler — in the shape controller-runtime's
``controllerutil`` gives it:

- :func:`set_controller_reference` puts a ``controller: true`` ownerReference on a child (in
  memory). With ``owns=["deployments.apps"]`` an event on the child then wakes the owner's
  reconciler, and the garbage collector deletes the child with its owner.
- :func:`create_or_update` (:func:`acreate_or_update` for ``AsyncClient``) reads the object from
  the cache, applies your ``mutate`` function to a copy, and writes **only if something changed**:
  ``"created"``, ``"updated"`` or ``"unchanged"`` (no request sent — so no self-triggered loop).
- :func:`retry_on_conflict` (:func:`aretry_on_conflict`) re-runs a read-modify-write function
  when the apiserver answers 409 — client-go's ``retry.RetryOnConflict`` defaults: 5 tries,
  10 ms apart, 10 % jitter.

Invariants:
- the in-memory helpers change only the object given and return whether they changed it;
- ``create_or_update`` reads the cache (never the API) and sends at most one write, with the
  cached ``resourceVersion`` (a stale cache gives a 409, never a lost update);
- ``mutate`` must not change the name or namespace, and should set only the fields you own:
  fields the apiserver defaults (``protocol: TCP`` in ports, ``imagePullPolicy``…) that you
  overwrite with a shape lacking them differ on every call and cause an update every time.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from typing import Any, Awaitable, Callable, Literal, Mapping, MutableMapping, TypeVar

from declop.cache.store import clone
from declop.errors import Conflict, DeclopError, NotFound
from declop.reconcile.result import describe
from declop.typed.dump import as_json, is_model

__all__ = [
    "AlreadyOwnedError",
    "Operation",
    "acreate_or_update",
    "aretry_on_conflict",
    "controller_of",
    "create_or_update",
    "owner_reference",
    "retry_on_conflict",
    "set_controller_reference",
]

T = TypeVar("T")
Obj = dict[str, Any]
#: what :func:`create_or_update` did
Operation = Literal["created", "updated", "unchanged"]
Mutate = Callable[[Obj], Any]


class AlreadyOwnedError(DeclopError, ValueError):
    """The child already has a *different* controller; an object has at most one.

    ``owner`` is the existing controller reference.
    """

    def __init__(self, message: str, owner: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.owner = dict(owner)


# --------------------------------------------------------------------------- owner references


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def _describe(obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj.get('kind') or 'object'} {where}{meta.get('name') or meta.get('generateName') or '?'}"


def _same_object(ref: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """As controller-runtime: same API group, kind and name (the version and uid may differ)."""
    return (
        _group(str(ref.get("apiVersion", ""))) == _group(str(other.get("apiVersion", "")))
        and ref.get("kind") == other.get("kind")
        and ref.get("name") == other.get("name")
    )


def _identity(owner: Any) -> Mapping[str, Any]:
    """``owner`` as a mapping: a dict stays itself; a typed object (``obj: Widget``) gives its
    JSON identity — apiVersion, kind, metadata (:func:`declop.typed.dump.as_json`)."""
    if not isinstance(owner, Mapping) and getattr(owner, "metadata", None) is None:
        raise TypeError(f"an owner is the object as read (a dict or a typed view), got {type(owner).__name__}")
    return as_json(owner, "identity")  # type: ignore[no-any-return]


def owner_reference(
    owner: Mapping[str, Any] | Any, *, controller: bool = True, block_owner_deletion: bool = True
) -> Obj:
    """The ownerReference entry that points at ``owner`` (which needs apiVersion, kind, name, uid;
    a dict as read from the cache, or a typed view such as ``obj: Widget``)."""
    owner = _identity(owner)
    meta = _meta(owner)
    missing = [f for f, v in (("apiVersion", owner.get("apiVersion")), ("kind", owner.get("kind")),
                              ("metadata.name", meta.get("name")), ("metadata.uid", meta.get("uid"))) if not v]
    if missing:
        raise ValueError(
            f"the owner has no {', '.join(missing)}; pass the owner as read from the cache "
            "(the reconciled obj), not a skeleton"
        )
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": controller,
        "blockOwnerDeletion": block_owner_deletion,
    }


def controller_of(obj: Mapping[str, Any] | Any) -> Obj | None:
    """The ownerReference with ``controller: true`` (of a dict or a typed model), or None."""
    for ref in _meta(as_json(obj, "identity")).get("ownerReferences") or ():
        if ref.get("controller"):
            return dict(ref)
    return None


def set_controller_reference(child: MutableMapping[str, Any] | Any, owner: Mapping[str, Any] | Any) -> bool:
    """Make ``owner`` the controller of ``child`` (in memory); True if ``child`` changed.

    ``owner`` is the object as the handler got it: the dict, or a typed view (``obj: Widget``).
    ``child`` is a dict, changed in place, or a typed model, whose
    ``metadata.ownerReferences`` is assigned the new list.

    Sets ``controller: true`` and ``blockOwnerDeletion: true``; an existing reference to the same
    owner (group, kind, name) is replaced in place, others are kept.

    Raises:
        AlreadyOwnedError: another object is already the child's controller.
        ValueError: the owner is in another namespace than the child, or the owner is namespaced
            and the child has no namespace (a cluster-scoped child cannot have a namespaced
            owner — set the child's ``metadata.namespace`` first if it is namespaced).
    """
    if is_model(child):
        typed, child = child, clone(as_json(child, "identity"))
        changed = set_controller_reference(child, owner)
        if changed:
            typed.metadata.ownerReferences = child["metadata"]["ownerReferences"]
        return changed
    owner = _identity(owner)
    ref = owner_reference(owner)
    owner_ns = _meta(owner).get("namespace") or ""
    if owner_ns:
        child_ns = _meta(child).get("namespace") or ""
        if not child_ns:
            raise ValueError(
                f"{_describe(child)} has no namespace but its owner {_describe(owner)} is namespaced: "
                "a cluster-scoped object cannot have a namespaced owner (set metadata.namespace on a "
                "namespaced child before setting its owner)"
            )
        if child_ns != owner_ns:
            raise ValueError(
                f"cross-namespace owner references are not allowed: {_describe(child)} cannot be owned "
                f"by {_describe(owner)}"
            )
    existing = controller_of(child)
    if existing is not None and not _same_object(existing, ref):
        raise AlreadyOwnedError(
            f"{_describe(child)} is already controlled by {existing.get('kind')} {existing.get('name')}; "
            f"it cannot also be controlled by {_describe(owner)}",
            existing,
        )
    meta = child.get("metadata")
    if meta is None:
        meta = child["metadata"] = {}
    refs = list(meta.get("ownerReferences") or ())
    before = [dict(r) for r in refs]
    for i, r in enumerate(refs):
        if _same_object(r, ref):
            refs[i] = ref
            break
    else:
        refs.append(ref)
    if refs == before:
        return False
    meta["ownerReferences"] = refs
    return True


# --------------------------------------------------------------------------- create or update


def _target(obj: Mapping[str, Any], resource: Any) -> tuple[Any, str]:
    """(the resource name to give the client, the object's key)."""
    meta = _meta(obj)
    name = meta.get("name")
    if not name:
        raise ValueError("create_or_update needs metadata.name (generateName cannot be looked up)")
    key = f"{meta['namespace']}/{name}" if meta.get("namespace") else str(name)
    if resource is not None:
        return resource, key
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not api_version or not kind:
        raise ValueError("give the object apiVersion and kind, or pass resource='deployments.apps'")
    group, _, version = str(api_version).rpartition("/")
    # "deployment.v1.apps" / "configmap.v1": kind, version and group, as kubectl reads them
    return f"{str(kind).lower()}.{version}" + (f".{group}" if group else ""), key


def _plan(obj: Mapping[str, Any], existing: Obj | None, mutate: Mutate | None) -> tuple[Operation, Obj]:
    """Apply ``mutate`` to a copy of the existing object (or of ``obj`` when there is none)."""
    base = clone(dict(obj)) if existing is None else clone(existing)
    desired = base
    if mutate is not None:
        returned = mutate(base)
        if inspect.isawaitable(returned):
            raise TypeError("mutate returned an awaitable; mutate functions are plain functions")
        if returned is not None:
            desired = clone(as_json(returned, "whole")) if is_model(returned) else returned
    if not isinstance(desired, dict):
        raise TypeError(f"mutate must change the object in place (or return a dict or a model), got {describe(desired)}")
    before, after = _meta(obj if existing is None else existing), _meta(desired)
    for field in ("name", "namespace"):
        if (before.get(field) or "") != (after.get(field) or "") and (existing is not None or before.get(field)):
            raise ValueError(
                f"mutate changed metadata.{field} from {before.get(field)!r} to {after.get(field)!r}; "
                "it must not change which object it is"
            )
    if existing is None:
        return "created", desired
    if desired == existing:
        return "unchanged", desired
    return "updated", desired


def create_or_update(client: Any, obj: Mapping[str, Any] | Any, mutate: Mutate | None = None, *, resource: Any = None) -> Operation:
    """Create ``obj`` or bring the existing one in line; write only when something changed.

    ``obj`` names the object (apiVersion, kind, metadata.name and namespace) and is the starting
    point of a create: a dict, or a typed model (its JSON form: every value but a ``None`` never
    set, :func:`declop.typed.dump.as_json`). ``mutate(o)`` sets the fields you own on ``o`` — the
    existing object when there is one (a copy from the cache), else a copy of ``obj``, as a dict
    — in place (or returns a new dict, or a model whose JSON form is the whole object). Returns ``"created"``, ``"updated"`` (a PUT with the cached resourceVersion: 409 if the
    cache was stale, retried like any conflict) or ``"unchanged"`` (nothing is sent).

    ``client`` is the handler's :class:`~declop.reconcile.client.Client` (or a ``FakeClient``); for an
    ``AsyncClient`` use ``await acreate_or_update(...)``. ``mutate`` must not touch ``status``
    (an update ignores it: use ``client.patch_status``).
    """
    if inspect.iscoroutinefunction(getattr(client, "create", None)):
        raise TypeError("this is an AsyncClient: use `await declop.acreate_or_update(client, obj, mutate)`")
    obj = as_json(obj, "whole")
    target, key = _target(obj, resource)
    try:
        existing = client.get(target, key)
    except NotFound:
        existing = None
    op, desired = _plan(obj, existing, mutate)
    if op == "created":
        client.create(target, desired)
    elif op == "updated":
        client.update(target, desired)
    return op


async def acreate_or_update(
    client: Any, obj: Mapping[str, Any] | Any, mutate: Mutate | None = None, *, resource: Any = None
) -> Operation:
    """:func:`create_or_update` for ``async def`` handlers (their :class:`~declop.reconcile.client.AsyncClient`)."""
    obj = as_json(obj, "whole")
    target, key = _target(obj, resource)
    try:
        existing = client.get(target, key)  # cache reads are plain calls in both flavours
    except NotFound:
        existing = None
    op, desired = _plan(obj, existing, mutate)
    if op == "created":
        await client.create(target, desired)
    elif op == "updated":
        await client.update(target, desired)
    return op


# --------------------------------------------------------------------------- retry on conflict


def _delays(attempts: int, base: float, factor: float, jitter: float) -> list[float]:
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    return [base * factor**i * (1 + jitter * random.random()) for i in range(attempts - 1)]


def retry_on_conflict(
    fn: Callable[[], T],
    *,
    attempts: int = 5,
    base: float = 0.01,
    factor: float = 1.0,
    jitter: float = 0.1,
    sleep: Callable[[float], Any] = time.sleep,
) -> T:
    """Call ``fn()`` until it does not raise :class:`~declop.errors.Conflict`, ``attempts`` times at most.

    ``fn`` must **re-read** what it modifies on every call (``client.live.get(...)`` for the
    freshest copy; the cache may still hold the stale one), then write with that
    resourceVersion. Between tries it waits ``base * factor**i`` seconds plus up to ``jitter``
    of that (client-go's ``retry.DefaultRetry``: 5 tries, 10 ms, 10 %). The last Conflict is
    raised if every try conflicts; any other exception is raised at once.
    """
    delays = _delays(attempts, base, factor, jitter)
    for delay in delays:
        try:
            return fn()
        except Conflict:
            sleep(delay)
    return fn()


async def aretry_on_conflict(
    fn: Callable[[], Awaitable[T]],
    *,
    attempts: int = 5,
    base: float = 0.01,
    factor: float = 1.0,
    jitter: float = 0.1,
) -> T:
    """:func:`retry_on_conflict` for coroutines: ``await aretry_on_conflict(lambda: change(client))``."""
    delays = _delays(attempts, base, factor, jitter)
    for delay in delays:
        try:
            return await fn()
        except Conflict:
            await asyncio.sleep(delay)
    return await fn()
