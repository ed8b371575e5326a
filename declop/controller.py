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
- a reconcile reads only the cache: it makes no GET or LIST against the apiserver.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .cache import clone
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
from .workqueue import QueueMetrics, QueueShutDown, WorkQueue

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

    # -- wiring ------------------------------------------------------------------------------
    def _subscriber(self, source: Source) -> Callable[[Any, Any], None]:
        add = self.queue.add
        mapper, predicates = source.mapper, source.predicates
        own_finalizer = self.registration.finalizer if source.primary else None

        def on_event(old: Any, new: Any) -> None:
            for p in predicates:
                if not p(old, new):
                    return
            if own_finalizer is not None and old is not None and new is not None and _only_our_finalizer(
                old, new, own_finalizer
            ):
                return  # our own finalizer write coming back: nothing new to reconcile
            for key in mapper(old, new):
                add(key)

        return on_event

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
        while True:
            try:
                key = await queue.get()
            except QueueShutDown:
                return
            if self._stopping:
                queue.done(key)
                return
            self._inflight += 1
            self.metrics.active(self.name, 1)
            try:
                await self._process(key)
            except asyncio.CancelledError:
                raise
            except Exception:  # a framework bug: never kill the worker
                log.exception("Unexpected error while processing a key", extra={"kv": {"controller": self.name, "key": str(key)}})
                queue.add_rate_limited(key)
            finally:
                self._inflight -= 1
                self.metrics.active(self.name, -1)
                queue.done(key)

    def _lookup(self, key: Request) -> Any:
        for informer in self._primary:
            if not informer.namespace or informer.namespace == key.namespace:
                obj = informer.store.get(key)
                if obj is not None:
                    return obj
        return None

    async def _process(self, key: Request) -> None:
        started = time.monotonic()
        reg = self.registration
        reconcile_id = str(uuid.uuid4())
        logger = ReconcileLogger(
            self._log,
            {"controller": self.name, "namespace": key.namespace, "name": key.name, "reconcileID": reconcile_id},
        )
        outcome: Any = None
        error: BaseException | None = None
        try:
            obj = self._lookup(key)
            phase = phase_of(obj, reg.finalizer)
            if phase is Phase.CREATED and reg.finalizer is not None:
                # persist the finalizer before the handler can cause side effects
                obj = await ensure_finalizer(self.ctx.transport, self.resource, obj, reg.finalizer)
            outcome = await self._call(key, obj, phase, logger, reconcile_id)
            if phase is Phase.DELETING and reg.finalizer is not None and (outcome is None or isinstance(outcome, Result)):
                # cleanup succeeded: only now may the object go
                await release_finalizer(self.ctx.transport, self.resource, obj, reg.finalizer)
        except Exception as exc:  # noqa: BLE001 - the outcome table handles every exception
            error = exc
        self._settle(key, outcome, error, logger, time.monotonic() - started)

    async def _call(self, key: Request, obj: Any, phase: Phase, logger: ReconcileLogger, reconcile_id: str) -> Any:
        reg = self.registration
        client: Client | AsyncClient
        client = (
            AsyncClient(self.ctx, self.resource, key, self.name)
            if reg.is_async
            else Client(self.ctx, self.resource, key, self.name)
        )
        kwargs = reg.arguments(key, obj, phase, client, logger, reconcile_id)
        self.reconciles += 1
        if reg.is_async:
            return await reg.fn(**kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(reg.fn, **kwargs))

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
