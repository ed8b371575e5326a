"""A unit-test kit: run a reconciler against an in-memory fake apiserver, with no cluster at all.

    from declop.testing.fakes.client import run_reconcile

    outcome = run_reconcile(widget, "default/hello", objects=[widget_obj])
    assert outcome.error is None
    assert [w.verb for w in outcome.writes] == ["create", "create", "patch_status"]
    assert run_reconcile(widget, "default/hello", client=outcome.client).writes == ()  # idempotent

:func:`run_reconcile` does what a controller worker does for one key — the same phase deduction
(:func:`declop.reconcile.result.phase_of`), the same finalizer protocol (:mod:`declop.reconcile.finalizers`, against
the fake), the same keyword injection (``Registration.wants``) and the same outcome table
(:func:`declop.reconcile._outcome.settle`) — and returns a :class:`ReconcileOutcome`: what the
handler returned or raised, what the queue would do, every write it sent, and its log lines.

:class:`FakeClient` (and :class:`FakeAsyncClient` for ``async def`` handlers) *are* declop's
``Client``/``AsyncClient`` — the same argument conventions, because they are the same code — over a
:class:`FakeApiServer` instead of an HTTP transport. Reads come from real :class:`~declop.cache.store.Store`
objects (so registry indexes work: ``client.list(..., index=(...))``); writes go through the fake
apiserver, which applies them (create, PUT with resourceVersion checks, merge/JSON patches, the
status subresource, deletion with finalizers) and records each one as a :class:`Write`.

Differences from a real cluster, on purpose or by simplicity:

* no cache lag: a read right after a write sees it (run the reconciler twice to check it is
  idempotent, rather than relying on that);
* no garbage collector, no admission, no defaulting, no schema validation; no other controllers
  (a Deployment never gets a status unless the test writes one);
* ``strategic`` patches and ``apply`` (server-side apply) are approximated by a merge that merges
  lists of objects by ``name`` (or ``type``, ``uid``, ``containerPort``, ``port``) and replaces
  other lists; SSA field ownership is not tracked;
* resources are known from a built-in table of the common Kubernetes resources, from CRD objects
  given in ``objects``/``resources``, and guessed from the apiVersion/kind of other objects (or a
  name like ``widgets.example.com``); pass ``resources=`` for exact names.

The fake apiserver itself is :mod:`declop.testing.fakes.apiserver`, the resources it knows
:mod:`declop.testing.fakes.resources`; this module holds the clients over it and :func:`run_reconcile`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import types
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine, Iterable, Mapping, TypeVar

from declop.cache.store import Store
from declop.reconcile.client import AsyncClient, Client, ClientContext
from declop.reconcile._keys import KeyNotes
from declop.reconcile._outcome import invalid_outcome, settle
from declop.kube.discovery import ResourceInfo
from declop.errors import InvalidObject, TerminalError
from declop.reconcile.finalizers import ensure_finalizer, release_finalizer
from declop.kube.keys import Request, key_of
from declop.logs import PlainFormatter, ReconcileLogger
from declop.reconcile.registration import INJECTABLE, Registration
from declop import registry as _registries
from declop.registry import Registry
from declop.registry.registry import same_definition
from declop.reconcile.result import Phase, Result, phase_of
from declop.testing.fakes.apiserver import FakeApiServer as FakeApiServer
from declop.testing.fakes.apiserver import Write as Write
from declop.testing.fakes.resources import resources_of_crd as resources_of_crd

__all__ = [
    "FakeApiServer",
    "FakeAsyncClient",
    "FakeClient",
    "ReconcileOutcome",
    "Write",
    "arun_reconcile",
    "run_reconcile",
]

T = TypeVar("T")
Obj = dict[str, Any]


# --------------------------------------------------------------------------- the fake clients


def _drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never waits (everything the fake does is immediate) to its end."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a fake client call waited for something; the fake apiserver never makes you wait")


def _setup(
    objects: Iterable[Mapping[str, Any]],
    resources: Iterable[ResourceInfo | Mapping[str, Any]],
    registry: Registry | None,
    server: FakeApiServer | None,
    primary: ResourceInfo | str | None,
    request: Request | str | None,
) -> tuple[FakeApiServer, ResourceInfo | None, Request | None]:
    if server is None:
        server = FakeApiServer(resources)
    else:
        for r in resources:
            server.discovery.add(r)
    if registry is not None:
        server.add_registry_indexes(registry)
    for obj in objects:
        server.seed(obj)
    info = server.discovery.resolve_cached(primary) if isinstance(primary, str) else primary
    req = Request.parse(request) if isinstance(request, str) else request
    return server, info, req


class _FakeStores:
    """Reads from the fake apiserver's stores: the same Store class the informers fill."""

    _ctx: ClientContext
    primary: ResourceInfo | None
    request: Request | None

    def _stores(self, resource: ResourceInfo, namespace: str) -> list[Store]:
        return [self.server.store(resource)]

    @property
    def server(self) -> FakeApiServer:
        """The fake apiserver behind this client (shared by every view of it)."""
        return self._ctx.transport  # type: ignore[return-value]

    @property
    def writes(self) -> list[Write]:
        """Every write sent so far, in order."""
        return self.server.writes

    @property
    def events(self) -> list[Write]:
        """Every ``client.event(...)`` so far."""
        return self.server.events

    def objects(self, resource: ResourceInfo | str | None = None) -> list[Obj]:
        """Copies of every stored object (of one resource, or all)."""
        return self.server.objects(resource)

    def index(self, resource: str, name: str, fn: Callable[[Mapping[str, Any]], Iterable[str | None]]) -> None:
        """Add a cache index, as ``declop.index`` does for a running operator."""
        self.server.add_index(resource, name, fn)


class FakeClient(_FakeStores, Client):
    """A :class:`declop.Client` over an in-memory apiserver, seeded with ``objects``.

    ``FakeClient([configmap, widget])`` — every method of the real client works (``get``, ``list``
    with labels and indexes, ``create``, ``update``, ``patch``, ``apply``, ``patch_status``,
    ``delete``, ``event``, ``live``); writes change the fake's objects and are recorded in
    :attr:`writes`. ``registry=`` adds that registry's ``declop.index`` declarations.
    """

    def __init__(
        self,
        objects: Iterable[Mapping[str, Any]] = (),
        *,
        resources: Iterable[ResourceInfo | Mapping[str, Any]] = (),
        registry: Registry | None = None,
        server: FakeApiServer | None = None,
        primary: ResourceInfo | str | None = None,
        request: Request | str | None = None,
        read: Obj | None = None,
    ) -> None:
        server, info, req = _setup(objects, resources, registry, server, primary, request)
        Client.__init__(self, server.context, info, req, read=read)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return _drive(coro)

    def bind(self, primary: ResourceInfo | str | None, request: Request | str | None) -> FakeClient:
        """A view of the same fake as a handler of ``primary`` reconciling ``request`` sees it."""
        return FakeClient(server=self.server, primary=primary, request=request)

    @property
    def aio(self) -> FakeAsyncClient:
        """The same fake as an ``async def`` handler sees it (awaitable writes)."""
        return FakeAsyncClient(server=self.server, primary=self.primary, request=self.request)


class FakeAsyncClient(_FakeStores, AsyncClient):
    """A :class:`declop.AsyncClient` over the fake apiserver: cache reads are plain, writes awaited."""

    def __init__(
        self,
        objects: Iterable[Mapping[str, Any]] = (),
        *,
        resources: Iterable[ResourceInfo | Mapping[str, Any]] = (),
        registry: Registry | None = None,
        server: FakeApiServer | None = None,
        primary: ResourceInfo | str | None = None,
        request: Request | str | None = None,
        read: Obj | None = None,
    ) -> None:
        server, info, req = _setup(objects, resources, registry, server, primary, request)
        AsyncClient.__init__(self, server.context, info, req, read=read)

    @property
    def sync(self) -> FakeClient:
        """The same fake with blocking methods, for assertions."""
        return FakeClient(server=self.server, primary=self.primary, request=self.request)


# --------------------------------------------------------------------------- run_reconcile


@dataclass(frozen=True)
class ReconcileOutcome:
    """What one reconcile did, as :func:`run_reconcile` observed it.

    ``action`` is what the controller's queue would do: ``"done"`` (forget the key),
    ``"requeue_after"`` (also a :class:`~declop.errors.TemporaryError`'s delay), ``"retry"`` (an exception: rate-limited retry, quietly for a Conflict) or
    ``"terminal"`` (a :class:`~declop.errors.TerminalError`: not retried) or ``"invalid"`` (the
    handler declared a typed ``obj: Widget`` and the object fails it: the handler was not called,
    ``error`` is the :class:`~declop.errors.InvalidObject` naming the fields, and the key is not
    retried).
    """

    phase: Phase
    result: Any
    error: BaseException | None
    requeue_after: float | None
    action: str
    writes: tuple[Write, ...]
    events: tuple[Write, ...]
    logs: tuple[str, ...] = field(repr=False)
    messages: tuple[str, ...]
    reconcile_id: str = field(repr=False)
    client: FakeClient = field(repr=False)

    @property
    def ok(self) -> bool:
        """True when the handler neither raised nor returned something invalid."""
        return self.error is None

    def raise_error(self) -> ReconcileOutcome:
        """Re-raise the handler's exception, if any (for a full traceback in a failing test)."""
        if self.error is not None:
            raise self.error
        return self

    def writes_of(self, verb: str | None = None, resource: str | None = None) -> list[Write]:
        """The writes with this verb and/or resource (``"deployments.apps"``)."""
        return [w for w in self.writes if (verb is None or w.verb == verb) and (resource is None or w.resource == resource)]


class _Capture(logging.Handler):
    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.setFormatter(PlainFormatter())
        self.lines: list[str] = []
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))
        self.messages.append(record.getMessage())


class _RecordingQueue:
    """Stands in for the workqueue while :func:`~declop.reconcile._outcome.settle` settles one outcome."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def forget(self, key: Request) -> None:
        self.calls.append(("forget", None))

    def add_after(self, key: Request, seconds: float) -> None:
        self.calls.append(("add_after", seconds))

    def add_rate_limited(self, key: Request) -> None:
        self.calls.append(("add_rate_limited", None))

    def add(self, key: Request) -> None:
        self.calls.append(("add", None))


class _NoMetrics:
    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *a, **k: None


def _registration(
    handler: Callable[..., Any] | Registration,
    resource: str | None,
    finalizer: str | None,
    registry: Registry | None,
) -> tuple[Registration, Registry]:
    if isinstance(handler, Registration):
        reg, source = handler, registry if registry is not None else _registries.default_registry
    elif resource is not None:
        throwaway = Registry()
        throwaway.reconciler(resource, name=getattr(handler, "__name__", None) or "handler", finalizer=finalizer)(handler)
        reg, source = throwaway.registrations[0], registry if registry is not None else _registries.default_registry
    else:
        source = registry if registry is not None else _registries.default_registry
        found = [r for r in source.registrations if inspect.unwrap(r.fn) is handler]  # runners wrap it
        if not found:  # its file loaded afresh since: the same def, registered anew
            found = [r for r in source.registrations if same_definition(inspect.unwrap(r.fn), handler)]
        if not found:
            raise TypeError(
                f"{getattr(handler, '__name__', handler)!r} is not registered in "
                f"{'the given registry' if registry is not None else 'the default registry'}; pass resource= "
                "(its resource, e.g. resource='widgets.example.com'; and finalizer=...), registry=, or the Registration"
            )
        if len(found) > 1:
            raise TypeError(f"{handler.__name__!r} is registered {len(found)} times; pass the Registration you mean")
        reg = found[0]
    if finalizer is not None and reg.finalizer != finalizer:
        reg = dataclasses.replace(reg, finalizer=finalizer)
    return reg, source


def _own_arguments(reg: Registration, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check ``kwargs=``: only the handler's own parameters with a default (the test seam of
    docs/contract.md §2) may be given; declop's arguments come from the reconcile itself."""
    if not given:
        return {}
    params = inspect.signature(reg.fn).parameters
    own = {n for n, p in params.items() if p.default is not p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    own -= INJECTABLE
    for name in given:
        if name in INJECTABLE:
            raise TypeError(f"kwargs={{{name!r}: …}}: declop passes {name!r} itself; arrange it through objects= or the request")
        if name not in own:
            raise TypeError(
                f"kwargs={{{name!r}: …}}: {getattr(reg.fn, '__name__', 'the handler')} has no parameter {name!r} with a "
                f"default (its own: {', '.join(sorted(own)) or 'none'})"
            )
    return dict(given)


def _key(request: Request | str | Mapping[str, Any], info: ResourceInfo) -> Request:
    if isinstance(request, Request):
        key = request
    elif isinstance(request, str):
        key = Request.parse(request)
    else:
        key = key_of(request)
    if info.namespaced and not key.namespace:
        raise ValueError(f"{info.group_resource} is namespaced: pass the request as 'namespace/name'")
    return key if info.namespaced else Request("", key.name)


async def _reconcile(
    handler: Callable[..., Any] | Registration,
    request: Request | str | Mapping[str, Any],
    objects: Iterable[Mapping[str, Any]],
    resource: str | None,
    finalizer: str | None,
    client: FakeClient | FakeAsyncClient | None,
    resources: Iterable[ResourceInfo | Mapping[str, Any]],
    registry: Registry | None,
    reconcile_id: str | None,
    log_level: int,
    own: Mapping[str, Any] | None = None,
) -> ReconcileOutcome:
    reg, source = _registration(handler, resource, finalizer, registry)
    extra = _own_arguments(reg, own)
    server, _, _ = _setup(objects, resources, source, client.server if client is not None else None, None, None)
    info = server.discovery.resolve_cached(reg.resource)
    key = _key(request, info)
    rid = reconcile_id or str(uuid.uuid4())

    name = f"declop.controller.{reg.name}"
    capture = _Capture(log_level)
    lg = logging.Logger(name, log_level)  # noqa: LOG001 - private: no global logging state changes
    lg.parent = logging.getLogger(name)  # …but lines still reach pytest's log capture
    lg.addHandler(capture)
    logger = ReconcileLogger(lg, {"controller": reg.name, "namespace": key.namespace, "name": key.name, "reconcileID": rid})

    first_write = len(server.writes)
    first_event = len(server.events)
    obj = server.store(info).get(key)
    phase = phase_of(obj, reg.finalizer)  # the controller's phase table
    outcome: Any = None
    error: BaseException | None = None
    try:
        if phase is Phase.CREATED and reg.finalizer is not None:
            if reg.model is not None:
                reg.view(obj)  # as the controller: an invalid object never gets our finalizer
            obj = await ensure_finalizer(server, info, obj, reg.finalizer)
        view: Client | AsyncClient = (  # knows obj as what the handler read, as the controller's client does
            FakeAsyncClient(server=server, primary=info, request=key, read=obj)
            if reg.is_async
            else FakeClient(server=server, primary=info, request=key, read=obj)
        )
        given = obj
        if reg.metadata_only and obj is not None:  # what a metadata-only cache holds
            meta = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
            given = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta}
        kwargs = {**reg.arguments(key, given, phase, view, logger, rid), **extra}
        outcome = (await reg.fn(**kwargs)) if reg.is_async else reg.fn(**kwargs)
        if phase is Phase.DELETING and reg.finalizer is not None and (outcome is None or isinstance(outcome, Result)):
            await release_finalizer(server, info, obj, reg.finalizer)
    except Exception as exc:  # noqa: BLE001 - the outcome table handles every exception
        error = exc
    if error is None:
        error = invalid_outcome(reg.name, key, outcome)

    # the controller's own outcome table settles it, against a queue that only records
    queue = _RecordingQueue()
    stub = types.SimpleNamespace(queue=queue, metrics=_NoMetrics(), name=reg.name, log=lg, keys=KeyNotes())
    settle(stub, key, outcome, error, logger, 0.0)
    verbs = [c[0] for c in queue.calls]
    if "add_rate_limited" in verbs:
        action = "retry"
    elif "add_after" in verbs:
        action = "requeue_after"
    elif isinstance(error, TerminalError):
        action = "terminal"
    elif isinstance(error, InvalidObject):
        action = "invalid"
    else:
        action = "done"
    requeue = next((c[1] for c in queue.calls if c[0] == "add_after"), None)
    return ReconcileOutcome(
        phase=phase,
        result=outcome,
        error=error,
        requeue_after=requeue,
        action=action,
        writes=tuple(server.writes[first_write:]),
        events=tuple(server.events[first_event:]),
        logs=tuple(capture.lines),
        messages=tuple(capture.messages),
        reconcile_id=rid,
        client=FakeClient(server=server, primary=info, request=key),
    )


def run_reconcile(
    handler: Callable[..., Any] | Registration,
    request: Request | str | Mapping[str, Any],
    objects: Iterable[Mapping[str, Any]] = (),
    *,
    resource: str | None = None,
    finalizer: str | None = None,
    client: FakeClient | FakeAsyncClient | None = None,
    resources: Iterable[ResourceInfo | Mapping[str, Any]] = (),
    registry: Registry | None = None,
    reconcile_id: str | None = None,
    log_level: int = logging.INFO,
    kwargs: Mapping[str, Any] | None = None,
) -> ReconcileOutcome:
    """Reconcile ``request`` once with ``handler``, against a fake apiserver holding ``objects``.

    ``handler`` is a function decorated with ``@declop.reconciler`` (found in ``registry``, by
    default the default registry), any function plus ``resource=`` (and ``finalizer=``), or a
    :class:`~declop.registry.Registration`. ``request`` is ``"namespace/name"``, a
    :class:`~declop.Request` or the object itself. Pass ``client=outcome.client`` to continue from a
    previous reconcile's state (its writes are not repeated in the new outcome). The registry's
    ``declop.index`` declarations are added to the fake's stores.

    ``kwargs={"now": fixed}`` passes values to the handler's **own** parameters — those with a
    default, which declop never fills (a clock, a client of another service: the test seam of
    docs/contract.md §2). A name declop passes itself, or one the handler does not declare with a
    default, is a ``TypeError`` before anything runs.

    ``async def`` handlers run in ``asyncio.run``; inside a running event loop use
    ``await arun_reconcile(...)``.
    """
    reg, _ = _registration(handler, resource, finalizer, registry)
    _own_arguments(reg, kwargs)  # refuse a wrong name before any coroutine exists
    coro = _reconcile(reg, request, objects, None, None, client, resources, registry, reconcile_id, log_level, kwargs)
    if not reg.is_async:
        return _drive(coro)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise RuntimeError("run_reconcile was called inside a running event loop: use `await arun_reconcile(...)`")


async def arun_reconcile(
    handler: Callable[..., Any] | Registration,
    request: Request | str | Mapping[str, Any],
    objects: Iterable[Mapping[str, Any]] = (),
    *,
    resource: str | None = None,
    finalizer: str | None = None,
    client: FakeClient | FakeAsyncClient | None = None,
    resources: Iterable[ResourceInfo | Mapping[str, Any]] = (),
    registry: Registry | None = None,
    reconcile_id: str | None = None,
    log_level: int = logging.INFO,
    kwargs: Mapping[str, Any] | None = None,
) -> ReconcileOutcome:
    """:func:`run_reconcile` for async tests (runs on the current event loop)."""
    return await _reconcile(handler, request, objects, resource, finalizer, client, resources, registry, reconcile_id, log_level, kwargs)
