"""The client handed to handlers: reads from the shared cache, writes to the apiserver.

Reads (``get``, ``list``) are plain methods in both flavours and make **no API call**: they are
served by the informers' stores and return deep copies, so mutating what you got never changes the
cache. A read of a resource nobody watches starts (and keeps) an informer for it; a sync handler
waits for its first list, an async handler gets a retried ``CacheNotSyncedError`` meanwhile.

Writes go to the apiserver. :class:`Client` (for plain ``def`` handlers, which run in worker
threads) blocks; :class:`AsyncClient` (for ``async def`` handlers) returns coroutines. Both send:

- ``create(obj)`` / ``create("configmaps", obj)``
- ``update(obj)`` — PUT with the object's resourceVersion: 409 if it changed meanwhile
- ``patch(resource, key, patch, type="merge"|"json"|"strategic"|"apply")``
- ``apply(obj, field_manager=…)`` — server-side apply
- ``patch_status(resource, key, patch)`` — through the status subresource; ``patch_status(request,
  status)`` with a pydantic model (the status model of a typed resource) sends only the fields that
  differ from the cached object's status, and sends nothing (returning the cached object) when
  nothing differs
- ``delete(resource, key, propagation=…, grace_period=…)`` — NotFound counts as done; a batch/v1
  Job deleted without ``propagation="Background"`` orphans its Pods (the apiserver's default for Jobs)
- ``event(obj, reason, message, type="Normal"|"Warning")`` — a Kubernetes Event; never fails

During a reconcile under a Lease (``--leader-elect``, ``--shards``) every write is checked
against that Lease just before it is sent and raises :class:`~declop.errors.Fenced`, unsent,
once it is not known valid (:mod:`declop.kube.fencing`; the transport does the check).

``client.get(request)`` — the object being reconciled — reads first the stores of the informers
whose events wake this controller (its ``labels=``/``fields=``-filtered primary informers), and
only when the object is not there the unfiltered cache the other reads use. Invariant: a handler
never reads its own object older than the event that woke it (why: docs/contract.md §5).

``client.live`` reads straight from the apiserver, deliberately (e.g. right after your own write,
or for the body of an object whose cache holds metadata only: ``metadata_only=True``).
A resource cached only as metadata (``PartialObjectMetadata``) is read as metadata from the
cache, unless another source caches it whole.
Keys may be a :class:`~declop.kube.keys.Request`, ``"ns/name"``, or ``name=``/``namespace=`` keywords; a
bare name on a namespaced resource means the namespace of the object being reconciled.

Typed everywhere: wherever an object is taken (``create``, ``update``, ``apply``, ``delete``,
``event``, a ``patch`` body) a typed model is taken too, as its JSON form
(:func:`declop.typed.dump.as_json`); a typed model class is a resource name, and ``get``,
``list`` and ``live`` reads through it give validated views (``client.get(Widget, key)``).
"""

from __future__ import annotations

# The two flavours' write methods sit side by side here: the sync Client spells out each
# AsyncClient signature again (so help() and editors show them; tests/unit/reconcile/test_client.py
# keeps them equal). What they share (the context, cache reads, key parsing) is in _reads.

import asyncio
import concurrent.futures
import logging
from typing import Any, Coroutine, Literal, Mapping, Sequence, TypeVar

from declop.cache.informer import all_synced
from declop.cache.store import Store
from declop.errors import ApiError, CacheNotSyncedError, Conflict, NotFound
from declop.kube.discovery import ResourceInfo
from declop.kube.keys import Request
from declop.kube.transport import PATCH_TYPES
from declop.reconcile._reads import ClientContext, KeyLike, Obj, Target, _Base, typed
from declop.typed.dump import as_json, is_model

__all__ = ["AsyncClient", "Client", "ClientContext"]

T = TypeVar("T")
#: ``DeleteOptions.propagationPolicy``: what happens to the objects the deleted one owns.
Propagation = Literal["Background", "Foreground", "Orphan"]
PROPAGATIONS: frozenset[str] = frozenset(("Background", "Foreground", "Orphan"))

log = logging.getLogger("declop.client")

#: the one-time hint about a batch/v1 Job deleted with the server's default propagation has been logged
_job_hint_logged = False
JOB_HINT = (
    "Deleted a Job without propagation=: for batch/v1 Jobs the apiserver's default is to orphan "
    "their Pods, which keep running; pass propagation=\"Background\" to delete them too, or "
    "propagation=\"Orphan\" to keep them on purpose (this hint is logged once)"
)


class AsyncClient(_Base):
    """The client of ``async def`` handlers: cache reads are immediate, writes are awaited."""

    def _ensure(self, resource: ResourceInfo) -> list[Any]:
        informers = self._ctx.informers.for_resource(resource)
        for i in informers:
            i.start()
        raise CacheNotSyncedError(
            f"started a cache for {resource.group_resource}; this reconcile is retried once it has synced"
        )

    async def create(self, target: Any, obj: Any = None) -> Obj:
        """Create ``obj`` (``create(obj)``, or ``create("configmaps", obj)``); 409 if it exists."""
        resource, body = self._write_target(target, obj)
        return await self._ctx.transport.request(  # type: ignore[no-any-return]
            "POST", self._obj_path(resource, body, False), body=self._with_kind(resource, body)
        )

    async def update(self, target: Any, obj: Any = None, *, subresource: str | None = None) -> Obj:
        """PUT ``obj`` with its resourceVersion: 409 Conflict if the object changed meanwhile."""
        resource, body = self._write_target(target, obj)
        return await self._ctx.transport.request(  # type: ignore[no-any-return]
            "PUT", self._obj_path(resource, body, True, subresource), body=self._with_kind(resource, body)
        )

    async def patch(
        self,
        target: Any,
        key: KeyLike = None,
        patch: Any = None,
        *,
        type: str = "merge",
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
        field_manager: str | None = None,
        force: bool | None = None,
    ) -> Obj:
        """Patch one object; ``type`` is merge (default), json, strategic or apply. A typed model
        as ``patch`` sends the fields set on it (:func:`declop.typed.dump.as_json`, ``"set"``)."""
        if isinstance(target, Request) or (patch is None and not isinstance(target, str)):
            target, key, patch = None, target, key
        if is_model(patch):
            patch = as_json(patch, "set")
        resource = self._resource(target)
        req = self._key(resource, key, namespace, name)
        if type not in PATCH_TYPES:
            raise ValueError(f"patch type must be one of {sorted(PATCH_TYPES)}, got {type!r}")
        params: dict[str, Any] = {}
        if type == "apply":
            params["fieldManager"] = field_manager or self._ctx.field_manager
            params["force"] = True if force is None else force
        elif field_manager:
            params["fieldManager"] = field_manager
        path = resource.path(namespace=req.namespace or None, name=req.name, subresource=subresource)
        return await self._ctx.transport.request(  # type: ignore[no-any-return]
            "PATCH", path, params=params, body=patch, content_type=PATCH_TYPES[type]
        )

    async def patch_status(self, target: Any, key: KeyLike = None, patch: Any = None, *, type: str = "merge") -> Obj:
        """Patch ``.status`` through the status subresource.

        ``patch`` may be a pydantic model — the status model of a typed resource, or the whole
        typed object: then the stored status is made to say what the model says
        (:mod:`declop.typed.status`, docs/typed.md): a JSON patch of only what differs from the
        status the handler read (the cached one for another object), each changed path guarded by
        a ``test`` of the value read there. A default the model never set and never changed is
        not sent; fields the model does not carry are left alone. When nothing differs no
        request is made and the object read (a copy) is returned. When another writer changed a
        path this write changes since the read, nothing is written and
        :class:`~declop.errors.Conflict` is raised: the reconcile is retried on fresh state."""
        target, key, patch, unchanged, typed = self._status_patch(target, key, patch, type)
        if unchanged is not None:
            return unchanged
        if not typed:
            return await self.patch(target, key, patch, type=type, subresource="status")
        written = await _typed_status(self.patch(target, key, _encoded(patch), type="json", subresource="status"))
        self._status_written(target, key, written)
        return written

    async def apply(
        self, obj: Mapping[str, Any] | Any, *, field_manager: str | None = None, force: bool = True, subresource: str | None = None
    ) -> Obj:
        """Server-side apply of ``obj`` (needs apiVersion, kind, metadata.name); a typed model
        applies the fields set on it — the fields this manager owns."""
        obj = as_json(obj, "set")
        resource = self._ctx.resolve_kind(obj)
        meta = obj.get("metadata") or {}
        return await self.patch(
            resource,
            Request(meta.get("namespace") or "", meta["name"]),
            dict(obj),
            type="apply",
            field_manager=field_manager,
            force=force,
            subresource=subresource,
        )

    async def delete(
        self,
        target: Any,
        key: KeyLike = None,
        *,
        namespace: str | None = None,
        name: str | None = None,
        propagation: Propagation | None = None,
        grace_period: int | None = None,
    ) -> None:
        """Delete one object; NotFound is success (the goal is reached).

        ``propagation`` is sent as ``DeleteOptions.propagationPolicy``: ``"Background"`` (the
        object goes now, the garbage collector deletes what it owns afterwards), ``"Foreground"``
        (the object stays, with a ``foregroundDeletion`` finalizer, until what it owns is gone) or
        ``"Orphan"`` (what it owns stays, its ownerReference removed). ``None`` leaves the choice
        to the apiserver, whose default is Background for almost every kind — but **Orphan for a
        batch/v1 Job** (kept for compatibility): a Job deleted without ``propagation=`` leaves
        its Pods running. The first such delete in a process logs a WARNING saying so.

        ``grace_period`` (seconds, ``DeleteOptions.gracePeriodSeconds``) overrides the object's
        own (a Pod's ``terminationGracePeriodSeconds``); ``0`` means at once.
        """
        if propagation is not None and propagation not in PROPAGATIONS:
            raise ValueError(f"propagation must be one of {sorted(PROPAGATIONS)}, got {propagation!r}")
        if grace_period is not None and (isinstance(grace_period, bool) or not isinstance(grace_period, int) or grace_period < 0):
            raise ValueError(f"grace_period is whole seconds, 0 or more; got {grace_period!r}")
        if isinstance(target, Mapping) or is_model(target):
            target = as_json(target, "identity")
            resource = self._ctx.resolve_kind(target)
            meta = target["metadata"]
            key = Request(meta.get("namespace") or "", meta["name"])
        else:
            resource = self._resource(None if isinstance(target, Request) else target)
            key = target if isinstance(target, Request) else key
        req = self._key(resource, key, namespace, name)
        body: dict[str, Any] = {}
        if propagation:
            body["propagationPolicy"] = propagation
        if grace_period is not None:
            body["gracePeriodSeconds"] = grace_period
        if propagation is None and resource.group_resource == "jobs.batch":
            _hint_job_orphans(req)
        try:
            await self._ctx.transport.request(
                "DELETE", resource.path(namespace=req.namespace or None, name=req.name), body=body or None
            )
        except NotFound:
            pass

    async def event(self, obj: Mapping[str, Any] | Any, reason: str, message: str, type: str = "Normal") -> None:
        """Record a Kubernetes Event about ``obj`` (a dict or a typed model), as ``kubectl describe`` shows them.

        ``reason`` is a short CamelCase word (``"ChildCreated"``), ``message`` a sentence for
        people, ``type`` is ``"Normal"`` (the default) or ``"Warning"`` — what ``kubectl get events
        --field-selector type=Warning`` selects. Repeats are folded into one Event with a count,
        bursts are rate-limited, and a failure to record is logged, never raised: an Event never
        fails the reconcile — except :class:`~declop.errors.Fenced`, which ends a call whose
        Lease is not known valid, as any of its writes does, and ``ValueError`` for a ``type``
        other than ``"Normal"`` or ``"Warning"`` (a mistake to fix, which the apiserver refuses).
        """
        if self._ctx.recorder is not None:
            await self._ctx.recorder.record(obj, reason, message, type, controller=self.controller)

    @property
    def live(self) -> AsyncLiveReader:
        """Uncached reads straight from the apiserver: ``live.get(...)``, ``live.list(...)``."""
        return AsyncLiveReader(self)


async def _typed_status(write: Coroutine[Any, Any, Obj]) -> Obj:
    """A typed status write, its refused ``test`` (another writer changed a path it changes
    since the handler read it) raised as :class:`~declop.errors.Conflict`, which is retried."""
    from declop.typed.status import refused

    try:
        return await write
    except ApiError as exc:
        if refused(exc):
            raise Conflict(
                "the status changed since the handler read it, at a field this write changes; "
                "nothing was written (the reconcile is retried on the new status)", exc.body
            ) from None
        raise


def _encoded(ops: Any) -> bytes:
    """The ops as Go writes JSON: the apiserver's ``test`` compares a value by its bytes."""
    from declop.typed.status import encode

    return encode(ops)


def _hint_job_orphans(job: Request) -> None:
    """Log :data:`JOB_HINT` once per process (with the first such Job's key)."""
    global _job_hint_logged
    if not _job_hint_logged:
        _job_hint_logged = True
        log.warning(JOB_HINT, extra={"kv": {"namespace": job.namespace, "name": job.name}})


class AsyncLiveReader:
    """Uncached reads, straight from the apiserver. Use deliberately: every call is a request."""

    def __init__(self, client: _Base) -> None:
        self._c = client

    async def get(self, target: Any = None, key: KeyLike = None, *, namespace: str | None = None, name: str | None = None) -> Obj:
        """GET one object from the apiserver (a request every call; NotFound if absent); the
        validated view for a typed model class as the target."""
        target, key = self._c._split(target, key)
        resource = self._c._resource(target)
        req = self._c._key(resource, key, namespace, name)
        path = resource.path(namespace=req.namespace or None, name=req.name)
        return typed(target, await self._c._ctx.transport.request("GET", path))  # type: ignore[no-any-return]

    async def list(self, target: Target = None, *, namespace: str | None = None, labels: str | None = None) -> list[Obj]:
        """LIST from the apiserver, every page (a request per page of 500)."""
        resource = self._c._resource(target)
        params: dict[str, Any] = {"limit": 500}
        if labels:
            params["labelSelector"] = str(labels)
        items: list[Obj] = []
        while True:
            page = await self._c._ctx.transport.request("GET", resource.path(namespace=namespace), params=params)
            items.extend(typed(target, o) for o in page.get("items") or ())
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            params["continue"] = token


class Client(_Base):
    """The client of plain ``def`` handlers (run in worker threads): every call blocks."""

    def __init__(
        self,
        ctx: ClientContext,
        primary: ResourceInfo | None = None,
        request: Request | None = None,
        controller: str = "",
        own: Sequence[Store] = (),
        read: Obj | None = None,
    ) -> None:
        super().__init__(ctx, primary, request, controller, own, read)
        self._async = AsyncClient(ctx, primary, request, controller, own)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._ctx.loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            if self._ctx.inline is not None:
                return self._ctx.inline(coro)  # type: ignore[no-any-return]
            coro.close()
            raise RuntimeError("declop.Client blocks; in async def handlers use the AsyncClient you are given")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def _ensure(self, resource: ResourceInfo) -> list[Any]:
        async def start_and_wait() -> list[Any]:
            informers = self._ctx.informers.for_resource(resource)
            for i in informers:
                i.start()
            await all_synced((i.synced for i in informers), self._ctx.sync_timeout)
            return informers

        try:
            return self._run(start_and_wait())
        except (asyncio.TimeoutError, concurrent.futures.TimeoutError) as exc:
            raise CacheNotSyncedError(f"the cache for {resource.group_resource} did not sync in time") from exc

    # The writes: AsyncClient's, run to completion on the manager's loop. Spelled out (not
    # generated) so that help() and editors show the real parameters; a unit test compares each
    # signature with AsyncClient's so the two cannot drift.

    def create(self, target: Any, obj: Any = None) -> Obj:
        """Create ``obj`` (``create(obj)``, or ``create("configmaps", obj)``); 409 if it exists."""
        return self._run(self._async.create(target, obj))

    def update(self, target: Any, obj: Any = None, *, subresource: str | None = None) -> Obj:
        """PUT ``obj`` with its resourceVersion: 409 Conflict if the object changed meanwhile."""
        return self._run(self._async.update(target, obj, subresource=subresource))

    def patch(
        self,
        target: Any,
        key: KeyLike = None,
        patch: Any = None,
        *,
        type: str = "merge",
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
        field_manager: str | None = None,
        force: bool | None = None,
    ) -> Obj:
        """Patch one object; ``type`` is merge (default), json, strategic or apply. A typed model
        as ``patch`` sends the fields set on it (:func:`declop.typed.dump.as_json`, ``"set"``)."""
        return self._run(
            self._async.patch(
                target, key, patch, type=type, namespace=namespace, name=name,
                subresource=subresource, field_manager=field_manager, force=force,
            )
        )  # fmt: skip

    def patch_status(self, target: Any, key: KeyLike = None, patch: Any = None, *, type: str = "merge") -> Obj:
        target, key, patch, unchanged, typed = self._status_patch(target, key, patch, type)  # reads this client's cache
        if unchanged is not None:
            return unchanged
        if not typed:
            return self._run(self._async.patch(target, key, patch, type=type, subresource="status"))
        written = self._run(_typed_status(self._async.patch(target, key, _encoded(patch), type="json", subresource="status")))
        self._status_written(target, key, written)
        return written

    patch_status.__doc__ = AsyncClient.patch_status.__doc__

    def apply(
        self, obj: Mapping[str, Any] | Any, *, field_manager: str | None = None, force: bool = True, subresource: str | None = None
    ) -> Obj:
        """Server-side apply of ``obj`` (needs apiVersion, kind, metadata.name); a typed model
        applies the fields set on it — the fields this manager owns."""
        return self._run(self._async.apply(obj, field_manager=field_manager, force=force, subresource=subresource))

    def delete(
        self,
        target: Any,
        key: KeyLike = None,
        *,
        namespace: str | None = None,
        name: str | None = None,
        propagation: Propagation | None = None,
        grace_period: int | None = None,
    ) -> None:
        """Delete one object; NotFound is success (the goal is reached).

        ``propagation`` is sent as ``DeleteOptions.propagationPolicy``: ``"Background"`` (the
        object goes now, the garbage collector deletes what it owns afterwards), ``"Foreground"``
        (the object stays, with a ``foregroundDeletion`` finalizer, until what it owns is gone) or
        ``"Orphan"`` (what it owns stays, its ownerReference removed). ``None`` leaves the choice
        to the apiserver, whose default is Background for almost every kind — but **Orphan for a
        batch/v1 Job** (kept for compatibility): a Job deleted without ``propagation=`` leaves
        its Pods running. The first such delete in a process logs a WARNING saying so.

        ``grace_period`` (seconds, ``DeleteOptions.gracePeriodSeconds``) overrides the object's
        own (a Pod's ``terminationGracePeriodSeconds``); ``0`` means at once.
        """
        self._run(
            self._async.delete(target, key, namespace=namespace, name=name, propagation=propagation, grace_period=grace_period)
        )

    def event(self, obj: Mapping[str, Any] | Any, reason: str, message: str, type: str = "Normal") -> None:
        """Record a Kubernetes Event about ``obj`` (a dict or a typed model), as ``kubectl describe`` shows them.

        ``reason`` is a short CamelCase word (``"ChildCreated"``), ``message`` a sentence for
        people, ``type`` is ``"Normal"`` (the default) or ``"Warning"`` — what ``kubectl get events
        --field-selector type=Warning`` selects. Repeats are folded into one Event with a count,
        bursts are rate-limited, and a failure to record is logged, never raised: an Event never
        fails the reconcile — except :class:`~declop.errors.Fenced`, which ends a call whose
        Lease is not known valid, as any of its writes does, and ``ValueError`` for a ``type``
        other than ``"Normal"`` or ``"Warning"`` (a mistake to fix, which the apiserver refuses).
        """
        self._run(self._async.event(obj, reason, message, type))

    @property
    def live(self) -> LiveReader:
        """Uncached reads straight from the apiserver: ``live.get(...)``, ``live.list(...)``."""
        return LiveReader(self)


class LiveReader:
    """Blocking uncached reads for sync handlers."""

    def __init__(self, client: Client) -> None:
        self._c = client
        self._a = AsyncLiveReader(client)

    def get(self, target: Any = None, key: KeyLike = None, *, namespace: str | None = None, name: str | None = None) -> Obj:
        """GET one object from the apiserver (a request every call; NotFound if absent); the
        validated view for a typed model class as the target."""
        return self._c._run(self._a.get(target, key, namespace=namespace, name=name))

    def list(self, target: Target = None, *, namespace: str | None = None, labels: str | None = None) -> list[Obj]:
        """LIST from the apiserver, every page (a request per page of 500)."""
        return self._c._run(self._a.list(target, namespace=namespace, labels=labels))
