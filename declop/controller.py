"""Controller: one per registration — sources → predicates → workqueue → workers → outcome table.

A controller never tells its handler *what happened*. Sources (the primary resource's informers,
owned resources, watched resources) turn events into keys; predicates drop events first; keys go
on a deduplicating, rate-limited :class:`~declop.workqueue.WorkQueue`; ``max_concurrent`` workers
take keys, read the object from the cache, deduce the :class:`~declop.result.Phase` from its state,
drive the finalizer protocol, call the handler and settle the outcome.

Invariants:
- workers start only after every informer of every source has listed once (the sync gate);
- a key is never reconciled by two workers at once (the queue guarantees it);
- :meth:`Controller._settle` is the only place where outcomes become queue operations;
- no exception from a handler ever escapes a worker; a framework bug is logged and the key retried;
- a reconcile reads only the cache: it makes no GET or LIST against the apiserver;
- with a ``fence`` (leader election), no reconcile starts — neither its finalizer write nor its
  handler call, checked just before each one, also inside a batch — unless ``fence()`` is True
  at that moment. A closed fence is final (it closes only when leadership is over): the
  controller halts, and the keys it held are dropped — the next leader lists every object;
- the echo filter drops an event only when its resourceVersion is one our own finalizer patch
  produced *and* it differs from the previous state by our finalizer alone (an event that arrives
  while the patch is in flight is held until the answer tells whose it was);
- the finalizer protocol does not depend on predicates: our finalizer taken off a live object
  (it is added back before a delete can skip the cleanup) and the start of the deletion of an
  object that carries it always enqueue the key;
- after our finalizer was released from an object being deleted, a cached copy of that object
  (same uid) still showing it is stale — the apiserver never lets a finalizer be added to an
  object being deleted — so the handler is not called again for it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable

from .client import AsyncClient, Client, ClientContext
from .discovery import ResourceInfo
from .errors import Conflict, TerminalError
from .finalizers import ensure_finalizer, release_finalizer
from .informer import Informer
from .keys import Request
from .logs import ReconcileLogger
from .mapping import KeyMapper
from .predicates import Predicate
from .ratelimit import RateLimiter, default_controller_rate_limiter
from .registry import Registration
from .result import Phase, Result, phase_of
from .workqueue import QueueEmpty, QueueMetrics, QueueShutDown, WorkQueue

__all__ = ["Controller", "ControllerMetrics", "Source"]

log = logging.getLogger("declop.controller")


@dataclass(frozen=True, slots=True)
class Source:
    """Where keys come from: the informers of one resource, a key mapper and predicates."""

    informers: tuple[Informer, ...]
    mapper: KeyMapper
    predicates: tuple[Predicate, ...] = ()
    primary: bool = False


class ControllerMetrics:
    """Hooks for reconcile metrics; the base class records nothing (probes.py has the real one)."""

    def queue(self, controller: str) -> QueueMetrics | None:
        return None

    def reconciled(self, controller: str, result: str, seconds: float) -> None:
        pass

    def active(self, controller: str, delta: int) -> None:
        pass

    def started(self, controller: str, max_concurrent: int) -> None:
        pass


class Controller:
    """Runs one registration. Created and driven by the manager on its event loop."""

    def __init__(
        self,
        registration: Registration,
        resource: ResourceInfo,
        sources: Iterable[Source],
        ctx: ClientContext,
        *,
        executor: concurrent.futures.Executor | None = None,
        rate_limiter: RateLimiter | None = None,
        metrics: ControllerMetrics | None = None,
        fence: Callable[[], bool] | None = None,
    ) -> None:
        self.registration = registration
        self.name = registration.name
        self.resource = resource
        self.sources = tuple(sources)
        self.ctx = ctx
        self.executor = executor
        self.metrics = metrics or ControllerMetrics()
        self.queue: WorkQueue[Request] = WorkQueue(
            name=self.name,
            rate_limiter=rate_limiter or default_controller_rate_limiter(),
            metrics=self.metrics.queue(self.name),
        )
        self._primary = [i for s in self.sources if s.primary for i in s.informers]
        self._log = logging.getLogger(f"declop.controller.{self.name}")
        self._workers: list[asyncio.Task[None]] = []
        self._inflight = 0
        self._stopping = False
        self.synced = asyncio.Event()
        self.reconciles = 0  # total handler calls, for tests and statistics
        #: may a reconcile start now? (the manager's Lease fence; None: always)
        self.fence = fence
        self.fenced = 0  # keys the fence stopped before their reconcile started
        # (namespace, name) -> resourceVersion our last finalizer patch of that object produced
        self._own_writes: dict[tuple[str | None, str], str] = {}
        # (namespace, name) -> resourceVersions of finalizer-only events seen while our finalizer
        # patch of that object was in flight (ours or not is known once it answers)
        self._writing: dict[tuple[str | None, str], list[str]] = {}
        # (namespace, name) -> uid of the object being deleted whose finalizer we released
        self._released: dict[tuple[str | None, str], str] = {}

    # -- wiring ------------------------------------------------------------------------------
    def _subscriber(self, source: Source) -> Callable[[Any, Any], None]:
        add = self.queue.add
        mapper, predicates = source.mapper, source.predicates
        own_finalizer = self.registration.finalizer if source.primary else None
        own_writes, released, writing = self._own_writes, self._released, self._writing

        def on_event(old: Any, new: Any) -> None:
            if own_finalizer is not None and old is not None:
                if new is None:
                    if own_writes or released:
                        own_writes.pop(_ident(old), None)
                        released.pop(_ident(old), None)
                elif (writing or own_writes) and _is_our_echo(own_writes, writing, old, new, own_finalizer):
                    return  # our own finalizer write coming back (or held until we know)
                elif _finalizer_work(old, new, own_finalizer):
                    for key in mapper(old, new):  # past the predicates: the protocol needs it
                        add(key)
                    return
            for p in predicates:
                if not p(old, new):
                    return
            for key in mapper(old, new):
                add(key)

        return on_event

    async def _own_write(self, key: Request, obj: Any, write: Callable[[], Awaitable[Any]]) -> Any:
        """Run one finalizer patch of ours on ``obj`` and note what it produced, so that the echo
        filter drops its event and nothing else. Events that looked like it and arrived while it
        was in flight were held: those that were not ours are enqueued now."""
        ident = _ident(obj)
        self._writing[ident] = []
        written: Any = None
        try:
            written = await write()
            return written
        finally:
            held = self._writing.pop(ident, [])
            meta = written.get("metadata") if isinstance(written, dict) and written is not obj else None
            rv = meta.get("resourceVersion") if meta else None
            if rv and rv not in held and self._lookup(key) is not None:
                self._own_writes[ident] = rv  # its event is still to come
            if any(r != rv for r in held):
                self.queue.add(key)  # someone else's change: it must be reconciled

    def informers(self) -> list[Informer]:
        return [i for s in self.sources for i in s.informers]

    async def start(self, leadership: asyncio.Event | None = None) -> None:
        """Subscribe to every source, wait for the sync gate (and ``leadership``, if given), then
        start the workers. Caches warm up while a standby waits for the lease."""
        for source in self.sources:
            handler = self._subscriber(source)
            for informer in source.informers:
                informer.subscribe(handler)
        self._log.info("Starting Controller", extra={"kv": {"controller": self.name, "resource": str(self.resource)}})
        pending = self.informers()
        while True:
            try:
                await asyncio.wait_for(asyncio.gather(*(i.synced.wait() for i in pending)), timeout=120)
                break
            except asyncio.TimeoutError:
                stuck = [f"{i.name}: {i.last_error or 'no answer yet'}" for i in pending if not i.synced.is_set()]
                self._log.error(
                    "Caches have not synced after 120 s; still waiting",
                    extra={"kv": {"controller": self.name, "informers": stuck}},
                )
        self.synced.set()
        if leadership is not None and not leadership.is_set():
            await leadership.wait()
        if self._stopping:
            return
        n = self.registration.max_concurrent
        self.metrics.started(self.name, n)
        self._log.info("Starting workers", extra={"kv": {"controller": self.name, "worker count": n}})
        loop = asyncio.get_running_loop()
        self._workers = [loop.create_task(self._worker(), name=f"{self.name} worker {i}") for i in range(n)]

    def halt(self) -> None:
        """Stop intake now, synchronously: the queue shuts down and no worker takes another key
        (the manager calls it the moment the Lease is lost; :meth:`stop` then cancels workers)."""
        self._stopping = True
        self.queue.shutdown()

    async def stop(self, grace: float = 30.0) -> bool:
        """Stop taking keys, let in-flight reconciles finish within ``grace`` seconds.

        Keys still queued are dropped: the next start's initial list brings them back.
        Returns True when everything finished in time.
        """
        self._stopping = True
        self.queue.shutdown()
        if not self._workers:
            return True
        done, pending = await asyncio.wait(self._workers, timeout=grace)
        for task in pending:
            task.cancel()
        self._workers = []
        return not pending

    # -- the worker loop -----------------------------------------------------------------------
    async def _worker(self) -> None:
        queue = self.queue
        batching = not self.registration.is_async
        workers = self.registration.max_concurrent
        while True:
            try:
                key = await queue.get()
            except QueueShutDown:
                return
            if self._stopping:
                queue.done(key)
                return
            keys = [key]
            if batching:
                # Plain handlers run in a thread: one hop per batch instead of one per key.
                # Take more ready keys, but never more than this worker's share of the backlog,
                # so other workers are not starved. Taken keys are "processing": no other worker
                # can take them, and re-adds meanwhile cause exactly one more run after done().
                extra = min(BATCH - 1, len(queue) // workers)
                while extra > 0:
                    try:
                        keys.append(queue.get_nowait())
                    except (QueueEmpty, QueueShutDown):
                        break
                    extra -= 1
            self._inflight += len(keys)
            self.metrics.active(self.name, 1)
            try:
                await self._process(keys)
            except asyncio.CancelledError:
                raise
            except Exception:  # a framework bug: never kill the worker
                log.exception("Unexpected error while processing keys", extra={"kv": {"controller": self.name, "keys": [str(k) for k in keys]}})
                for k in keys:
                    queue.add_rate_limited(k)
            finally:
                self._inflight -= len(keys)
                self.metrics.active(self.name, -1)
                for k in keys:
                    queue.done(k)

    def _lookup(self, key: Request) -> Any:
        for informer in self._primary:
            if not informer.namespace or informer.namespace == key.namespace:
                obj = informer.store.get(key)
                if obj is not None:
                    return obj
        return None

    async def _process(self, keys: list[Request]) -> None:
        """Reconcile ``keys``: prepare each on the loop (cache read, phase, finalizer added before
        the handler sees CREATED), call the handler, release the finalizer after a successful
        DELETING call, and settle every outcome."""
        reg = self.registration
        fence = self.fence
        calls: list[_Call] = []
        for key in keys:
            if fence is not None and not fence():
                self._fence_closed(len(keys) - len(calls))
                break  # the rest of the batch never starts
            call = _Call(key, time.monotonic(), str(uuid.uuid4()))
            call.logger = ReconcileLogger(
                self._log,
                {"controller": self.name, "namespace": key.namespace, "name": key.name, "reconcileID": call.reconcile_id},
            )
            try:
                obj = self._lookup(key)
                call.phase = phase_of(obj, reg.finalizer)
                if call.phase is Phase.DELETING and self._released and self._stale(obj):
                    call.ran = call.stale = True  # its cleanup already succeeded: the cache lags
                    calls.append(call)
                    continue
                if call.phase is Phase.CREATED and reg.finalizer is not None:
                    # persist the finalizer before the handler can cause side effects
                    finalizer = reg.finalizer
                    obj = await self._own_write(
                        key, obj, lambda: ensure_finalizer(self.ctx.transport, self.resource, obj, finalizer)
                    )
                call.obj = obj
                client = (
                    AsyncClient(self.ctx, self.resource, key, self.name)
                    if reg.is_async
                    else Client(self.ctx, self.resource, key, self.name)
                )
                call.kwargs = reg.arguments(key, obj, call.phase, client, call.logger, call.reconcile_id)
            except Exception as exc:  # noqa: BLE001 - settled below like a handler error
                call.error, call.ran = exc, True
            calls.append(call)
        pending = [c for c in calls if not c.ran]
        self.reconciles += len(pending)
        if reg.is_async:
            for call in pending:
                if self._stopping and call is not pending[0]:
                    break
                if fence is not None and not fence():
                    self._fence_closed(len(pending) - pending.index(call))
                    break
                call.ran = True
                try:
                    call.outcome = await reg.fn(**call.kwargs)
                except Exception as exc:  # noqa: BLE001
                    call.error = exc
        elif pending:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self.executor, _run_batch, reg.fn, pending, self._is_stopping, fence)
            if fence is not None and not pending[-1].ran and not self._stopping:
                self._fence_closed(sum(not c.ran for c in pending))
        for call in calls:
            if not call.ran:
                continue  # dropped at shutdown (like keys still queued) or by the fence
            if (
                call.error is None
                and not call.stale
                and call.phase is Phase.DELETING
                and reg.finalizer is not None
                and (call.outcome is None or isinstance(call.outcome, Result))
            ):
                try:  # cleanup succeeded: only now may the object go
                    await self._release(call)
                except Exception as exc:  # noqa: BLE001
                    call.error = exc
            self._settle(call.key, call.outcome, call.error, call.logger, time.monotonic() - call.started)

    async def _release(self, call: _Call) -> None:
        """Remove our finalizer after a successful DELETING call. Works from the newest cached
        copy of the same object (the handler may have written it meanwhile, and the entries'
        indices must be current). If another controller changed the list first (a failed
        ``test``), :class:`~declop.errors.Conflict` retries the key with backoff."""
        finalizer = self.registration.finalizer
        assert finalizer is not None and call.obj is not None
        uid = (call.obj.get("metadata") or {}).get("uid")
        latest = self._lookup(call.key)
        base = latest if latest is not None and (latest.get("metadata") or {}).get("uid") == uid else call.obj
        await self._own_write(
            call.key, base, lambda: release_finalizer(self.ctx.transport, self.resource, base, finalizer)
        )
        if uid and self._lookup(call.key) is not None:  # (its deletion event pops it)
            self._released[_ident(call.obj)] = uid

    def _stale(self, obj: Any) -> bool:
        """``obj`` (being deleted) still shows our finalizer although we released it from this
        very object: the cache has not caught up with our own write."""
        meta = obj.get("metadata") or {}
        uid = self._released.get(_ident(obj))
        return uid is not None and uid == meta.get("uid") and self.registration.finalizer in (meta.get("finalizers") or ())

    def _fence_closed(self, keys: int) -> None:
        """The fence stopped ``keys`` keys. It never reopens: halt (the manager exits next)."""
        if not self.fenced:
            self._log.warning(
                "Not starting reconciles: the leader Lease is not known to be valid",
                extra={"kv": {"controller": self.name}},
            )
        self.fenced += keys
        self.halt()

    def _is_stopping(self) -> bool:
        return self._stopping

    def _settle(
        self, key: Request, outcome: Any, error: BaseException | None, logger: ReconcileLogger, seconds: float
    ) -> None:
        """The outcome table of design §2 — the one place outcomes become queue operations."""
        queue = self.queue
        if error is None and not (outcome is None or isinstance(outcome, Result)):
            error = TypeError(
                f"handler {self.name!r} returned {outcome!r}; return None or declop.Result(requeue_after=...)"
            )
        if isinstance(error, TerminalError):
            logger.error("Reconciler error (terminal, not retried)", exc_info=error)
            queue.forget(key)
            self.metrics.reconciled(self.name, "terminal_error", seconds)
        elif isinstance(error, Conflict):
            logger.info("Conflict, requeueing", error=str(error))
            queue.add_rate_limited(key)
            self.metrics.reconciled(self.name, "error", seconds)
        elif error is not None:
            logger.error("Reconciler error", exc_info=error)
            queue.add_rate_limited(key)
            self.metrics.reconciled(self.name, "error", seconds)
        elif isinstance(outcome, Result) and outcome.requeue_after is not None:
            queue.forget(key)
            queue.add_after(key, outcome.requeue_after)
            self.metrics.reconciled(self.name, "requeue_after", seconds)
        else:
            queue.forget(key)
            self.metrics.reconciled(self.name, "success", seconds)


#: at most this many keys per thread hop for plain handlers
BATCH = 64


class _Call:
    """One reconcile in flight: what the handler gets and what came of it."""

    __slots__ = ("key", "started", "reconcile_id", "logger", "phase", "obj", "kwargs", "ran", "outcome", "error", "stale")

    def __init__(self, key: Request, started: float, reconcile_id: str) -> None:
        self.key, self.started, self.reconcile_id = key, started, reconcile_id
        self.logger: ReconcileLogger
        self.phase: Phase = Phase.DELETED
        self.obj: Any = None
        self.kwargs: dict[str, Any] = {}
        self.ran = False
        self.outcome: Any = None
        self.error: BaseException | None = None
        self.stale = False  # a cached copy behind our own finalizer release: nothing to call


def _run_batch(
    fn: Callable[..., Any],
    calls: list[_Call],
    stopping: Callable[[], bool],
    fence: Callable[[], bool] | None = None,
) -> None:
    """In a worker thread: call ``fn`` for each prepared call, in order; stop early at shutdown
    (the first call always runs: it was taken before the stop) and as soon as ``fence()`` is
    False (checked just before *every* call, the first one included)."""
    for i, call in enumerate(calls):
        if (i and stopping()) or (fence is not None and not fence()):
            return
        call.ran = True
        try:
            call.outcome = fn(**call.kwargs)
        except Exception as exc:  # noqa: BLE001 - the outcome table handles every exception
            call.error = exc


def _ident(obj: Any) -> tuple[str | None, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace"), meta.get("name") or ""


def _is_our_echo(
    own_writes: dict[tuple[str | None, str], str],
    writing: dict[tuple[str | None, str], list[str]],
    old: Any,
    new: Any,
    finalizer: str,
) -> bool:
    """``new`` is the object one of our finalizer patches produced and nothing else changed — or
    it may be (a patch of that object is in flight and only our finalizer changed): then its
    resourceVersion is held for :meth:`Controller._own_write` to decide, and True is returned."""
    ident = _ident(new)
    rv: str | None = (new.get("metadata") or {}).get("resourceVersion")
    held = writing.get(ident) if writing else None
    if held is not None:
        if not _only_our_finalizer(old, new, finalizer):
            return False
        held.append(rv or "")
        return True
    if own_writes.get(ident) != rv or rv is None:
        return False
    del own_writes[ident]
    return _only_our_finalizer(old, new, finalizer)


def _finalizer_work(old: Any, new: Any, finalizer: str) -> bool:
    """The finalizer protocol must act: the deletion of an object carrying our finalizer began,
    or our finalizer was taken off an object that is not being deleted."""
    om, nm = old.get("metadata") or {}, new.get("metadata") or {}
    if nm.get("deletionTimestamp"):
        return not om.get("deletionTimestamp") and finalizer in (nm.get("finalizers") or ())
    return finalizer in (om.get("finalizers") or ()) and finalizer not in (nm.get("finalizers") or ())


def _only_our_finalizer(old: Any, new: Any, finalizer: str) -> bool:
    """True when ``new`` differs from ``old`` only by our finalizer being added or removed."""
    om, nm = old.get("metadata") or {}, new.get("metadata") or {}
    of, nf = list(om.get("finalizers") or ()), list(nm.get("finalizers") or ())
    if of == nf:
        return False
    if [f for f in of if f != finalizer] != [f for f in nf if f != finalizer]:
        return False
    if nm.get("deletionTimestamp") != om.get("deletionTimestamp"):
        return False
    ignore = {"resourceVersion", "finalizers", "managedFields"}
    if {k: v for k, v in om.items() if k not in ignore} != {k: v for k, v in nm.items() if k not in ignore}:
        return False
    return all(old.get(k) == new.get(k) for k in set(old) | set(new) if k != "metadata")
