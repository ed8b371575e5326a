"""Controller: one per registration — sources → predicates → workqueue → workers → outcome table.

A controller never tells its handler *what happened*. Sources (the primary resource's informers,
owned resources, watched resources) turn events into keys; predicates drop events first; keys go
on a deduplicating, rate-limited :class:`~declop.queue.workqueue.WorkQueue`; ``max_concurrent`` workers
take keys, read the object from the cache, deduce the :class:`~declop.reconcile.result.Phase` from its state,
drive the finalizer protocol, call the handler and settle the outcome.

Invariants:
- workers start only after every informer of every source has listed once (the sync gate);
- a key is never reconciled by two workers at once (the queue guarantees it);
- every key a worker takes ends with exactly one ``queue.done()``, or ``queue.give_back()`` when
  a slow call of a plain handler's batch hands the keys behind it to other workers
  (:mod:`declop.queue.batches`): a slow call holds no key but its own;
- :meth:`Controller._settle` is the only place where outcomes become queue operations;
- no exception from a handler ever escapes a worker; a framework bug is logged and the key retried;
- a reconcile reads only the cache: it makes no GET or LIST against the apiserver;
- with a ``fence`` (leader election), no reconcile starts — neither its finalizer write nor its
  handler call, checked just before each one, also inside a batch — unless ``fence()`` is True
  at that moment. A closed fence is final (it closes only when leadership is over): the
  controller halts, and the keys it held are dropped — the next leader lists every object;
- with ``shards`` (sharded mode, :mod:`declop.leases.shards`), a key is reconciled only while the
  Lease of its range is known valid and the range is not draining — checked when a worker takes
  the key and again just before the handler call; keys of other ranges are dropped (done(), not
  retried: their owner reconciles them). A key's range comes from the primary's uid (cached, or
  remembered from its last event) or from its namespace, per the registration's ``shard_by``;
  a key whose uid was never seen is dropped. Every reconcile of a range is counted in flight
  from the moment its key passes the check until its batch ends, so a drain waits for it;
- every key a source adds is noted in that key's :class:`~declop.reconcile.trigger.Trace`; a worker takes
  the trace with the key, so each reconcile knows every cause since its key's previous run
  (``trigger``); a delayed requeue or retry is attributed to the run it causes, not to one that
  an event brought forward;
- with a priority queue, keys from a sync (initial list, relist) and updates that changed only
  ``resourceVersion``/``managedFields`` (and ``status``, for the primary) are added with the
  registration's low priorities; everything else with :data:`~declop.queue.priority.NORMAL`;
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
import collections
import concurrent.futures
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable

from declop.queue.batches import STALL_AFTER, Batch, batch_size
from declop.cache.store import readonly
from declop.reconcile.client import AsyncClient, Client, ClientContext
from declop.kube.discovery import ResourceInfo
from declop.errors import Conflict, InvalidResult, ReconcileTimeout, TerminalError
from declop.hints import returned_dict
from declop.reconcile.finalizers import ensure_finalizer, release_finalizer
from declop.cache.informer import Informer
from declop.kube.keys import Request
from declop.logs import ReconcileLogger, trigger_in_context
from declop.reconcile.mapping import KeyMapper
from declop.reconcile.predicates import Predicate, is_builtin
from declop.queue.priority import NORMAL, PriorityQueue
from declop.queue.ratelimit import RateLimiter, default_controller_rate_limiter
from declop.reconcile.registration import Registration
from declop.leases.shards import ShardSet
from declop.reconcile.result import Phase, Result, describe, phase_of
from declop.reconcile.trigger import Trace, Trigger
from declop.queue.workqueue import QueueEmpty, QueueMetrics, QueueShutDown, WorkQueue

__all__ = ["Controller", "ControllerMetrics", "Source"]

log = logging.getLogger("declop.controller")


@dataclass(frozen=True, slots=True)
class Source:
    """Where keys come from: the informers of one resource, a key mapper and predicates.

    ``label`` names a secondary source in triggers and metrics (``owns:ConfigMap``,
    ``watches:secrets``; bounded: no object names); ``via`` the map function, if any."""

    informers: tuple[Informer, ...]
    mapper: KeyMapper
    predicates: tuple[Predicate, ...] = ()
    primary: bool = False
    label: str = ""
    via: str = ""


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

    def triggered(self, controller: str, trace: Trace) -> None:
        """One reconcile settled; ``trace`` holds its sources and coalesced event count."""
        pass

    def timed_out(self, controller: str, kind: str) -> None:
        """A handler call passed its timeout: ``kind`` is "cancelled" (async) or "overrun"."""
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
        recent: int = 0,
        shards: ShardSet | None = None,
    ) -> None:
        self.registration = registration
        self.name = registration.name
        self.resource = resource
        self.sources = tuple(sources)
        self.ctx = ctx
        self.executor = executor
        self.metrics = metrics or ControllerMetrics()
        if rate_limiter is None:
            limit = registration.rate_limit
            rate_limiter = limit.limiter() if limit is not None else default_controller_rate_limiter()
        queue_metrics = self.metrics.queue(self.name)
        priority = registration.priority
        self.queue: WorkQueue[Request] = (
            WorkQueue(name=self.name, rate_limiter=rate_limiter, metrics=queue_metrics)
            if priority is None
            else PriorityQueue(name=self.name, rate_limiter=rate_limiter, metrics=queue_metrics, aging=priority.aging)
        )
        # key -> why it was added since its last run (taken by the worker with the key)
        self._traces: dict[Request, Trace] = {}
        # key -> (source, detail) of its pending delayed add (requeue_after, retry)
        self._delayed: dict[Request, tuple[str, str | None]] = {}
        #: the last ``recent`` reconciles (for /debug/reconciles); None when off
        self.recent: collections.deque[dict[str, Any]] | None = (
            collections.deque(maxlen=recent) if recent > 0 else None
        )
        self._primary = [i for s in self.sources if s.primary for i in s.informers]
        self._log = logging.getLogger(f"declop.controller.{self.name}")
        self._workers: list[asyncio.Task[None]] = []
        self._stopping = False
        # keys whose finalizer we added for a CREATED call that was given back before it ran
        self._created: set[Request] = set()
        self.synced = asyncio.Event()
        self.reconciles = 0  # total handler calls, for tests and statistics
        #: may a reconcile start now? (the manager's Lease fence; None: always)
        self.fence = fence
        self.fenced = 0  # keys the fence stopped before their reconcile started
        #: this controller's ranges in sharded mode (None: not sharded)
        self.shards = shards
        self.unowned = 0  # keys dropped because their range is not ours (sharded mode)
        # key -> uid of the primary object, from its last event (sharded by uid: a deleted
        # object's key still finds its range)
        self._uids: dict[Request, str] | None = None
        if shards is not None:
            if registration.shard_by == "uid":
                self._uids = {}
            shards.on_gained = self.gained
        # (namespace, name) -> resourceVersion our last finalizer patch of that object produced
        self._own_writes: dict[tuple[str | None, str], str] = {}
        # (namespace, name) -> resourceVersions of finalizer-only events seen while our finalizer
        # patch of that object was in flight (ours or not is known once it answers)
        self._writing: dict[tuple[str | None, str], list[str]] = {}
        # (namespace, name) -> uid of the object being deleted whose finalizer we released
        self._released: dict[tuple[str | None, str], str] = {}

    # -- wiring ------------------------------------------------------------------------------
    def _subscriber(self, source: Source, informer: Informer | None = None) -> Callable[[Any, Any], None]:
        """The event handler of ``source`` on ``informer`` (default: its first)."""
        if informer is None:
            informer = source.informers[0]
        add = self.queue.add
        traces = self._traces
        mapper, predicates = source.mapper, source.predicates
        primary = source.primary
        own_finalizer = self.registration.finalizer if primary else None
        own_writes, released, writing = self._own_writes, self._released, self._writing
        priority = self.registration.priority if isinstance(self.queue, PriorityQueue) else None
        listed = priority.listed if priority is not None else NORMAL
        # None: updates are not compared (FIFO, or unchanged updates keep NORMAL priority)
        unchanged = priority.unchanged if priority is not None and priority.unchanged != NORMAL else None
        label = source.label or f"source:{informer.resource.kind}"
        kind, via = informer.resource.kind, source.via
        uids = self._uids if primary else None

        def note(key: Request, why: str, obj: Any) -> None:
            trace = traces.get(key)
            if trace is None:
                trace = traces[key] = Trace()
            if primary:
                trace.note(why, (obj.get("metadata") or {}).get("resourceVersion"))
            else:
                meta = obj.get("metadata") or {}
                ns = meta.get("namespace")
                who = f"{kind} {ns}/{meta.get('name')}" if ns else f"{kind} {meta.get('name')}"
                trace.note(label, None, f"{via}: {who}" if via else who)

        if all(is_builtin(p) for p in predicates):
            guard = None  # the built-ins only read: they get the cache's objects
        else:
            guard = readonly  # a user predicate gets read-only views (all of the source's do)

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
                        note(key, "finalizer", new)
                    return
            if predicates:
                o, n = (old, new) if guard is None else (guard(old), guard(new))
                for p in predicates:
                    if not p(o, n):
                        return
            rank = NORMAL
            if new is None:
                why, obj = "deleted", old
            elif informer.syncing:  # the initial list, a relist, a replay to a late subscriber
                why, obj, rank = ("initial-list" if informer.lists <= 1 else "relist"), new, listed
            elif old is None:
                why, obj = "created", new
            else:
                why, obj = "updated", new
                if unchanged is not None and _only_churn(old, new, primary):
                    rank = unchanged
            if primary:  # the hot path: Trace.note inlined (one event, no detail)
                meta = obj.get("metadata") or {}
                rv = meta.get("resourceVersion")
                if uids is not None and meta.get("uid"):
                    for key in mapper(old, new):
                        uids[key] = meta["uid"]
                for key in mapper(old, new):
                    add(key, rank)
                    trace = traces.get(key)
                    if trace is None:
                        trace = traces[key] = Trace()
                    trace.events += 1
                    counts = trace.sources
                    counts[why] = counts.get(why, 0) + 1
                    if rv is not None:
                        if trace.first_rv is None:
                            trace.first_rv = rv
                        trace.last_rv = rv
            else:
                for key in mapper(old, new):
                    add(key, rank)
                    note(key, why, obj)

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
                self._trace(key).note("updated", next(r for r in held if r != rv))

    def informers(self) -> list[Informer]:
        return [i for s in self.sources for i in s.informers]

    async def start(self, leadership: asyncio.Event | None = None) -> None:
        """Subscribe to every source, wait for the sync gate (and ``leadership``, if given), then
        start the workers. Caches warm up while a standby waits for the lease."""
        for source in self.sources:
            for informer in source.informers:
                informer.subscribe(self._subscriber(source, informer))
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
                extra = batch_size(len(queue), workers) - 1
                while extra > 0:
                    try:
                        keys.append(queue.get_nowait())
                    except (QueueEmpty, QueueShutDown):
                        break
                    extra -= 1
            self.metrics.active(self.name, 1)
            try:
                await self._process(keys)
            finally:
                self.metrics.active(self.name, -1)

    def _lookup(self, key: Request) -> Any:
        for informer in self._primary:
            if not informer.namespace or informer.namespace == key.namespace:
                obj = informer.store.get(key)
                if obj is not None:
                    return obj
        return None

    async def _process(self, keys: list[Request]) -> None:
        """Reconcile ``keys`` (taken from the queue by one worker) and settle every outcome.

        Each key is prepared on the loop (cache read, phase, the finalizer added before the
        handler can see CREATED), called (plain handlers in one thread hop for the batch), then
        settled, and ends with exactly one ``queue.done()`` — or ``queue.give_back()`` when a slow
        call hands the keys behind it to other workers (:mod:`declop.queue.batches`).
        """
        reg = self.registration
        calls: list[_Call] = []  # every call is "held" until its key is done() or given back
        shards = self.shards
        ranges: dict[Request, int] = {}
        if shards is not None:
            keys = self._owned(keys, ranges)
            if not keys:
                return
        try:
            finalizer, created, fence = reg.finalizer, self._created, self.fence
            traces, delayed = self._traces, self._delayed
            log_trigger = trigger_in_context()
            freeze = log_trigger or reg.wants_trigger or self.recent is not None
            for key in keys:
                if fence is not None and not fence():
                    self._fence_closed(len(keys) - len(calls))
                    break  # the rest never starts; their keys end with done() below
                call = _Call(key, time.monotonic(), str(uuid.uuid4()))
                trace = traces.pop(key, None)
                if trace is None:
                    trace = Trace()
                if delayed and key in delayed and not self.queue.is_waiting(key):
                    why, detail = delayed.pop(key)  # its delayed add is due: this run serves it
                    trace.note(why, None, detail)
                call.trace = trace
                context = {"controller": self.name, "namespace": key.namespace, "name": key.name, "reconcileID": call.reconcile_id}
                if shards is not None:
                    call.shard = ranges[key]
                    context["shard"] = f"{call.shard}/{shards.n}"
                if freeze:
                    call.trigger = trace.freeze()
                    if log_trigger:
                        context["trigger"] = str(call.trigger)
                call.logger = ReconcileLogger(self._log, context)
                if log_trigger and self._log.isEnabledFor(logging.DEBUG):
                    call.logger.debug("Reconciling")
                try:
                    obj = self._lookup(key)
                    call.phase = phase_of(obj, finalizer)
                    if call.phase is Phase.DELETING and self._released and self._stale(obj):
                        call.stale = call.finished = True  # its cleanup already succeeded: the cache lags
                        calls.append(call)
                        continue
                    if created and key in created:
                        # a CREATED call was given back after we added the finalizer: it is still
                        # CREATED (whether the cache shows our finalizer yet or not) until it runs
                        if call.phase is Phase.UPDATED or call.phase is Phase.CREATED:
                            call.phase = Phase.CREATED
                        else:
                            created.discard(key)  # being deleted, or gone
                    elif call.phase is Phase.CREATED and finalizer is not None:
                        # persist the finalizer before the handler can cause side effects
                        call.add_finalizer = True
                        obj = await self._own_write(
                            key, obj, lambda: ensure_finalizer(self.ctx.transport, self.resource, obj, finalizer)
                        )
                    call.obj = obj
                    client = (
                        AsyncClient(self.ctx, self.resource, key, self.name)
                        if reg.is_async
                        else Client(self.ctx, self.resource, key, self.name)
                    )
                    call.kwargs = reg.arguments(key, obj, call.phase, client, call.logger, call.reconcile_id, call.trigger)
                except Exception as exc:  # noqa: BLE001 - settled like a handler error
                    call.error = exc
                    call.finished = True
                calls.append(call)
            if reg.is_async:
                for call in calls:
                    if call.error is None and not call.stale:
                        if self._stopping and call is not calls[0]:
                            break  # dropped at shutdown, like keys still queued
                        if fence is not None and not fence():
                            self._fence_closed(len(calls) - calls.index(call))
                            break  # dropped: the fence never reopens
                        if shards is not None and not shards.may_start(call.shard):
                            self.unowned += 1
                            continue  # its range is draining or lost: dropped (done() below)
                        call.called = True
                        if reg.timeout is None:
                            try:
                                call.outcome = await reg.fn(**call.kwargs)
                            except Exception as exc:  # noqa: BLE001
                                call.error = exc
                        else:
                            await self._call_with_timeout(call, reg.timeout)
                    await self._finish(call)
            else:
                # Plain handlers: the prepared calls run in one executor job. With more than one
                # worker, a timer gives the calls that have not started back (their keys to the
                # queue) once a call has run STALL_AFTER; the calls that finished are settled then.
                runnable = [c for c in calls if c.error is None and not c.stale]
                if len(runnable) < len(calls):
                    for call in calls:
                        if call.finished:  # a failed preparation: settled now, not after the batch
                            self._complete(call)
                if runnable:
                    loop = asyncio.get_running_loop()
                    fn, stopping = reg.fn, self._is_stopping
                    timed = reg.timeout is not None
                    shard_fence = shards.may_start if shards is not None else None
                    if len(runnable) == 1 or reg.max_concurrent == 1:
                        # nothing to give back, or nobody to give it to: the plain loop, no timer
                        await loop.run_in_executor(self.executor, _run_batch, fn, runnable, stopping, fence, timed, shard_fence)
                    else:
                        batch: Batch[_Call] = Batch(runnable)
                        job = loop.run_in_executor(self.executor, _run_batch, fn, batch, stopping, fence, timed, shard_fence)
                        watch = _Watch(batch, calls, loop.create_future())
                        job.add_done_callback(watch.wake)
                        watch.timer = loop.call_later(STALL_AFTER, self._watch, watch)
                        try:
                            await watch.woken
                        finally:
                            watch.timer.cancel()
                        if not job.done():  # stalled: settle what finished before the slow call
                            for call in calls:
                                if call.finished and call.held:
                                    await self._finish(call)
                        await job
                if fence is not None and runnable and not runnable[-1].called and not self._stopping and not fence():
                    self._fence_closed(sum(not c.called for c in runnable))
                deleting = reg.finalizer is not None
                for call in calls:
                    if call.finished and call.held:
                        if deleting and call.phase is Phase.DELETING:
                            await self._finish(call)
                        else:
                            self._complete(call)
                # calls not started (the thread stopped at shutdown) are dropped like queued keys: done()
        except asyncio.CancelledError:
            raise
        except Exception:  # a framework bug: never kill the worker
            log.exception(
                "Unexpected error while processing keys",
                extra={"kv": {"controller": self.name, "keys": [str(k) for k in keys]}},
            )
            for k in _held(keys, calls):
                self.queue.add_rate_limited(k)
                self._delayed[k] = ("retry", "framework error")
        finally:
            for k in _held(keys, calls):  # dropped at shutdown, or a framework bug
                self.queue.done(k)
            if shards is not None:
                for r in ranges.values():
                    shards.end(r)

    def _shard_of(self, key: Request) -> int | None:
        """The range of ``key`` (None: its uid was never seen)."""
        assert self.shards is not None
        if self._uids is None:
            return self.shards.index(key.namespace)
        obj = self._lookup(key)
        uid = (obj.get("metadata") or {}).get("uid") if obj is not None else None
        if not uid:
            uid = self._uids.get(key)
        return self.shards.index(uid) if uid else None

    def _owned(self, keys: list[Request], ranges: dict[Request, int]) -> list[Request]:
        """The keys whose range may start a reconcile now, each counted in flight for its range
        (``ranges``); the others are done() at once — their range's owner reconciles them."""
        assert self.shards is not None
        shards, owned = self.shards, []
        for key in keys:
            r = self._shard_of(key)
            if r is None or not shards.may_start(r):
                self.unowned += 1
                self._traces.pop(key, None)
                self._delayed.pop(key, None)
                self.queue.done(key)
                continue
            shards.begin(r)
            ranges[key] = r
            owned.append(key)
        return owned

    def forget(self, informer: Informer, released: Iterable[Request]) -> int:
        """``released`` keys left ``informer``'s store because their range went to another
        replica: drop what this controller remembers of them (the uid of a primary object). A
        key still cached by another primary informer is kept. Returns how many were dropped;
        without it the map would hold every object that ever passed through this replica."""
        if self._uids is None or informer not in self._primary:
            return 0
        n = 0
        for key in released:
            if not any(i.store.get(key) is not None for i in self._primary) and self._uids.pop(key, None) is not None:
                n += 1
        return n

    def gained(self, index: int) -> None:
        """Range ``index`` became ours: queue every cached primary object of it (changes made
        while nobody owned the range are not missed)."""
        shards = self.shards
        assert shards is not None
        n = 0
        for informer in self._primary:
            for key in informer.store.keys():
                if self._shard_of(key) == index:
                    self.queue.add(key)
                    self._trace(key).note("shard-gained", None, f"shard {index}/{shards.n}")
                    n += 1
        self._log.info("Shard gained; queued its objects", extra={"kv": {"controller": self.name, "shard": f"{index}/{shards.n}", "keys": n}})
    def _watch(self, watch: _Watch) -> None:
        """Timer on the loop while a batch runs. Once a call has run for ``STALL_AFTER``, the calls
        waiting behind it are given back (their keys to the head of the queue), and the worker is
        woken to settle the calls that finished before it; then the timer stops (nothing is left
        but the slow call)."""
        if watch.woken.done():
            return
        batch = watch.batch
        running = batch.running_for()
        if running < STALL_AFTER:
            watch.timer = asyncio.get_running_loop().call_later(STALL_AFTER - running, self._watch, watch)
            return
        back = batch.take_back()
        if back:
            for call in back:
                call.held = False
                if call.add_finalizer:  # we added it for a CREATED call that has not run
                    self._created.add(call.key)
                self._restore(call.key, call.trace)
            self.queue.give_back(*(call.key for call in back))
            self._log.debug(
                "A call is slow; the keys behind it go back to the queue",
                extra={"kv": {"controller": self.name, "running_seconds": round(running, 3), "keys": len(back)}},
            )
        if back or any(c.finished and c.held for c in watch.calls):
            watch.wake()

    def _is_stopping(self) -> bool:
        return self._stopping

    def _trace(self, key: Request) -> Trace:
        """The trace of ``key``'s next run (created on first use)."""
        trace = self._traces.get(key)
        if trace is None:
            trace = self._traces[key] = Trace()
        return trace

    def _restore(self, key: Request, trace: Trace) -> None:
        """A given-back key keeps the causes it was taken with, ahead of any newer ones."""
        newer = self._traces.get(key)
        if newer is not None:
            trace.merge(newer)
        self._traces[key] = trace

    async def _call_with_timeout(self, call: _Call, timeout: float) -> None:
        """Await an async handler for at most ``timeout`` seconds; past it, the handler is
        cancelled and the call fails with :class:`~declop.errors.ReconcileTimeout` (retried with
        backoff). A ``TimeoutError`` the handler raises itself stays its own error."""
        try:
            async with asyncio.timeout(timeout) as scope:
                call.outcome = await self.registration.fn(**call.kwargs)
        except TimeoutError as exc:
            if not scope.expired():
                call.error = exc
                return
            self.metrics.timed_out(self.name, "cancelled")
            call.error = ReconcileTimeout(
                f"handler {self.name!r} did not finish within timeout={timeout:g} s for {call.key}; "
                "it was cancelled and the key is retried with backoff"
            )
        except Exception as exc:  # noqa: BLE001
            call.error = exc

    async def _finish(self, call: _Call) -> None:
        """After the handler: release the finalizer after a successful DELETING call, then
        :meth:`_complete`."""
        if (
            call.phase is Phase.DELETING
            and call.error is None
            and not call.stale
            and self.registration.finalizer is not None
            and (call.outcome is None or isinstance(call.outcome, Result))
        ):
            try:  # cleanup succeeded: only now may the object go
                await self._release(call)
            except Exception as exc:  # noqa: BLE001
                call.error = exc
        self._complete(call)

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

    def _complete(self, call: _Call) -> None:
        """Settle the outcome and mark the key done."""
        if self._uids is not None and call.obj is None:
            self._uids.pop(call.key, None)  # gone: its next event (a new object) brings a new uid
        if call.called:
            self.reconciles += 1
            if self._created:
                self._created.discard(call.key)
            timeout = self.registration.timeout
            if timeout is not None and call.ran > timeout:  # a plain handler (a thread cannot be killed)
                self.metrics.timed_out(self.name, "overrun")
                call.logger.warning(
                    "Reconcile overran its timeout (a plain handler cannot be cancelled)",
                    seconds=round(call.ran, 3),
                    timeout=timeout,
                )
        seconds = time.monotonic() - call.started
        result = self._settle(call.key, call.outcome, call.error, call.logger, seconds)
        self.metrics.triggered(self.name, call.trace)
        if self.recent is not None:
            self.recent.append(
                {
                    "key": str(call.key),
                    "reconcileID": call.reconcile_id,
                    "trigger": str(call.trigger),
                    "events": call.trace.events,
                    "finished": time.time(),
                    "seconds": round(seconds, 6),
                    "outcome": result,
                    **({"error": type(call.error).__name__} if call.error is not None else {}),
                }
            )
        call.held = False
        self.queue.done(call.key)

    def _settle(
        self, key: Request, outcome: Any, error: BaseException | None, logger: ReconcileLogger, seconds: float
    ) -> str:
        """The outcome table of design §2 — the one place outcomes become queue operations.
        Returns the result (the ``result`` label of the reconcile metrics)."""
        queue = self.queue
        if error is None:
            error = invalid_outcome(self.name, key, outcome)
        if isinstance(error, TerminalError):
            logger.error("Reconciler error (terminal, not retried)", exc_info=error)
            queue.forget(key)
            result = "terminal_error"
        elif isinstance(error, Conflict):
            logger.info("Conflict, requeueing", error=str(error))
            queue.add_rate_limited(key)
            self._delayed[key] = ("retry", "Conflict")
            result = "error"
        elif error is not None:
            logger.error("Reconciler error", exc_info=error)
            queue.add_rate_limited(key)
            self._delayed[key] = ("retry", type(error).__name__)
            result = "error"
        elif isinstance(outcome, Result) and outcome.requeue_after:
            # only a positive delay requeues: 0 is plain success, as in controller-runtime
            queue.forget(key)
            queue.add_after(key, outcome.requeue_after)
            self._delayed[key] = ("requeue_after", None)
            result = "requeue_after"
        else:
            queue.forget(key)
            result = "success"
        self.metrics.reconciled(self.name, result, seconds)
        return result


def invalid_outcome(controller: str, key: Request, outcome: Any) -> InvalidResult | None:
    """The terminal error for a handler that returned neither ``None`` nor a ``Result``, naming
    the type and the key — never the object itself: ``return client.patch(...)`` returns a Secret."""
    if outcome is None or isinstance(outcome, Result):
        return None
    what = f"handler {controller!r} returned {describe(outcome)} for {key}"
    kopf = returned_dict(outcome)
    if kopf is not None:  # Kopf's habit: a returned dict lands in the status
        return InvalidResult(f"{what}; {kopf} (or declop.Result(requeue_after=seconds))")
    return InvalidResult(
        f"{what}; return None or "
        "declop.Result(requeue_after=seconds) — e.g. call client.patch(...) and then return None"
    )


class _Watch:
    """A running batch, watched from the loop for stalls (see :meth:`Controller._watch`)."""

    __slots__ = ("batch", "calls", "timer", "woken")

    def __init__(
        self, batch: Batch[_Call], calls: list[_Call], woken: asyncio.Future[None]
    ) -> None:
        self.batch, self.calls, self.woken = batch, calls, woken
        self.timer: asyncio.TimerHandle

    def wake(self, _: object = None) -> None:
        if not self.woken.done():
            self.woken.set_result(None)


class _Call:
    """One reconcile: what the handler gets and what came of it."""

    __slots__ = (
        "key", "started", "reconcile_id", "logger", "phase", "obj", "kwargs", "add_finalizer", "called",
        "finished", "held", "outcome", "error", "stale", "trace", "trigger", "ran", "shard",
    )

    def __init__(self, key: Request, started: float, reconcile_id: str) -> None:
        self.key, self.started, self.reconcile_id = key, started, reconcile_id
        self.logger: ReconcileLogger
        self.phase: Phase = Phase.DELETED
        self.obj: Any = None
        self.kwargs: dict[str, Any] = {}
        self.add_finalizer = False
        self.called = False  # the handler was called
        self.finished = False  # prepared with an error, or the handler returned: ready to settle
        self.held = True  # the worker still owes its key a done() (False: done, or given back)
        self.outcome: Any = None
        self.error: BaseException | None = None
        self.stale = False  # a cached copy behind our own finalizer release: nothing to call
        self.trace: Trace  # why it runs (taken from the controller with the key)
        self.trigger: Trigger | None = None  # the frozen trace, when someone reads it
        self.ran = 0.0  # seconds a plain handler ran (measured only with a timeout)
        self.shard = -1  # the key's range in sharded mode


def _held(keys: list[Request], calls: list[_Call]) -> list[Request]:
    """Keys a worker still owes a ``done()``: calls neither settled nor given back, and keys it
    took but had not prepared yet."""
    return [c.key for c in calls if c.held] + keys[len(calls):]


def _run_batch(
    fn: Callable[..., Any],
    calls: Iterable[_Call],
    stopping: Callable[[], bool],
    fence: Callable[[], bool] | None = None,
    timed: bool = False,
    shard_fence: Callable[[int], bool] | None = None,
) -> None:
    """In a worker thread: call ``fn`` for each prepared call, in order — from a list, or from a
    :class:`~declop.queue.batches.Batch` the loop may take calls back from; stop early at shutdown (the
    first call always runs: it was taken before the stop) and as soon as ``fence()`` is False
    (checked just before *every* call, the first one included). A call whose range
    ``shard_fence`` refuses is skipped (not called: its key is done() by the worker)."""
    for i, call in enumerate(calls):
        if (i and stopping()) or (fence is not None and not fence()):
            return
        if shard_fence is not None and not shard_fence(call.shard):
            continue
        call.called = True
        began = time.monotonic() if timed else 0.0
        try:
            call.outcome = fn(**call.kwargs)
        except Exception as exc:  # noqa: BLE001 - the outcome table handles every exception
            call.error = exc
        if timed:
            call.ran = time.monotonic() - began
        call.finished = True  # last: everything above is final when the loop sees it


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


_CHURN = frozenset({"resourceVersion", "managedFields"})


def _only_churn(old: Any, new: Any, status: bool) -> bool:
    """``new`` differs from ``old`` at most in ``metadata.resourceVersion``/``managedFields``
    (and in ``status``, when ``status``): nothing a handler of the object acts on changed.
    Metadata first: labels and annotations are small and the likeliest to differ."""
    om, nm = old.get("metadata") or {}, new.get("metadata") or {}
    if om.get("annotations") != nm.get("annotations") or om.get("labels") != nm.get("labels"):
        return False  # the common real change of a ConfigMap-like object, found in two lookups
    for k, v in nm.items():
        if k not in _CHURN and om.get(k, _MISSING) != v:
            return False
    for k in om:
        if k not in nm and k not in _CHURN:
            return False
    for k, v in new.items():
        if k == "metadata" or (status and k == "status"):
            continue
        if old.get(k, _MISSING) != v:
            return False
    for k in old:
        if k not in new and k != "metadata" and not (status and k == "status"):
            return False
    return True


_MISSING = object()


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
