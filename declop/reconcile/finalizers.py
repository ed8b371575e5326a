"""Finalizers: add and remove *our* finalizer without clobbering anyone else's.

Expected flow (the controller drives it; see docs/contract.md):

1. Object seen without our finalizer and not being deleted → :func:`ensure_finalizer` adds it with
   a JSON patch guarded by a ``test`` of ``metadata.resourceVersion``; the handler then runs with
   ``Phase.CREATED`` on the patched object.
2. Object being deleted (``deletionTimestamp`` set) → the handler runs with ``Phase.DELETING``;
   after it returns successfully :func:`release_finalizer` removes our entries only (every copy),
   each guarded by a ``test`` that the entry at that index is ours, plus a ``test`` of the uid —
   never of the resourceVersion (why: docs/contract.md §4).
3. The apiserver deletes the object once no finalizer is left; the next reconcile sees
   ``Phase.DELETED``.

Guarantees: if the handler ever saw ``CREATED``, the object cannot disappear before a ``DELETING``
call succeeded — even if the operator was down when ``kubectl delete`` ran. Other controllers'
finalizers are never touched (a merge patch would replace the whole list). A finalizer is never added
to an object being deleted (the apiserver would refuse with 422 anyway).

Errors: a stale base (409, or 422 from a failed ``test``) raises :class:`~declop.errors.Conflict`;
the controller retries with a fresh read. NotFound while removing means the object is already
gone: success.

The pure helpers :func:`contains_finalizer`, :func:`add_finalizer`, :func:`remove_finalizer` work on
an object in memory and return whether they changed it.
"""

from __future__ import annotations

from typing import Any, MutableMapping, Protocol

from declop.kube.discovery import ResourceInfo
from declop.errors import ApiError, Conflict, NotFound

__all__ = [
    "add_finalizer",
    "contains_finalizer",
    "ensure_finalizer",
    "release_finalizer",
    "remove_finalizer",
]

JSON_PATCH = "application/json-patch+json"


class _Requester(Protocol):
    async def request(self, method: str, path: str, *, body: Any = ..., content_type: str | None = ...) -> Any: ...


def contains_finalizer(obj: Any, name: str) -> bool:
    """Whether ``name`` is in ``obj.metadata.finalizers``."""
    return name in ((obj.get("metadata") or {}).get("finalizers") or ())


def add_finalizer(obj: MutableMapping[str, Any], name: str) -> bool:
    """Append ``name`` in memory if missing; True if the object changed."""
    meta = obj.get("metadata") or {}
    obj["metadata"] = meta
    finalizers = meta.get("finalizers") or []
    if name in finalizers:
        return False
    meta["finalizers"] = [*finalizers, name]
    return True


def remove_finalizer(obj: MutableMapping[str, Any], name: str) -> bool:
    """Remove every ``name`` entry in memory; True if the object changed."""
    meta = obj.get("metadata") or {}
    finalizers = meta.get("finalizers") or []
    if name not in finalizers:
        return False
    meta["finalizers"] = [f for f in finalizers if f != name]
    return True


async def _patch(transport: _Requester, resource: ResourceInfo, obj: Any, ops: list[dict[str, Any]]) -> Any:
    meta = obj["metadata"]
    path = resource.path(namespace=meta.get("namespace"), name=meta["name"])
    try:
        return await transport.request("PATCH", path, body=ops, content_type=JSON_PATCH)
    except ApiError as exc:
        # a failed `test` op is a bare 422 ("the server rejected our request…") without the
        # field causes that a validation error always lists
        causes = ((exc.body or {}).get("details") or {}).get("causes") if isinstance(exc.body, dict) else None
        if exc.status == 422 and not causes:
            raise Conflict(f"{resource.group_resource} {meta['name']} changed meanwhile: {exc}") from exc
        raise


async def ensure_finalizer(transport: _Requester, resource: ResourceInfo, obj: Any, name: str) -> Any:
    """Persist ``name`` on ``obj`` unless present; returns the object as the apiserver now has it.

    Refuses (returns ``obj`` unchanged) when the object is being deleted.
    """
    meta = obj["metadata"]
    if contains_finalizer(obj, name) or meta.get("deletionTimestamp"):
        return obj
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]}]
    if meta.get("finalizers"):
        ops.append({"op": "add", "path": "/metadata/finalizers/-", "value": name})
    else:
        ops.append({"op": "add", "path": "/metadata/finalizers", "value": [name]})
    return await _patch(transport, resource, obj, ops)


async def release_finalizer(transport: _Requester, resource: ResourceInfo, obj: Any, name: str) -> Any | None:
    """Remove every ``name`` entry from the persisted object; returns the new object, or None if
    it is gone.

    The patch is guarded by a ``test`` of each entry it removes (the entry at that index is ours)
    and of ``metadata.uid`` (the object is the one the handler cleaned up, not a namesake created
    since) — never by the resourceVersion: the handler may well have written its own object
    (a status condition) after ``obj`` was read, and that must not block the release. Entries are
    removed from the highest index down, so earlier removals do not shift later indices.
    """
    meta = obj["metadata"]
    at = [i for i, f in enumerate(meta.get("finalizers") or ()) if f == name]
    if not at:
        return obj
    ops: list[dict[str, Any]] = []
    if meta.get("uid"):
        ops.append({"op": "test", "path": "/metadata/uid", "value": meta["uid"]})
    for i in reversed(at):
        ops.append({"op": "test", "path": f"/metadata/finalizers/{i}", "value": name})
        ops.append({"op": "remove", "path": f"/metadata/finalizers/{i}"})
    try:
        return await _patch(transport, resource, obj, ops)
    except NotFound:
        return None
