"""Controller: one per registration — sources → predicates → workqueue → workers → outcome table.

A controller never tells its handler *what happened*. Sources (the primary resource's informers,
owned resources, watched resources) turn events into keys; predicates drop events first; keys go
on a deduplicating, rate-limited :class:`~declop.queue.workqueue.WorkQueue`; ``max_concurrent``
workers take keys, and each key's reconcile goes through four steps, each in its own module:

- the fence (:mod:`~declop.reconcile._fence`): may this replica start it now (leader, shard)?
- its preparation (:mod:`~declop.reconcile._preparation`): the object from the cache, its
  :class:`~declop.reconcile.result.Phase`, our finalizer added first, the handler's arguments;
- the call (:mod:`~declop.reconcile._call`): async handlers awaited one by one, plain handlers in
  one executor job per batch, watched for stalls;
- its outcome (:mod:`~declop.reconcile._outcome`): our finalizer released after a successful
  DELETING call, the outcome table, ``queue.done()``.

This module owns the sources and their subscriber (which events become which keys, with which
priority and trace; the event filters are in :mod:`declop.reconcile._filters`), the workers,
:meth:`Controller.process` (the steps, in order, for a worker's keys) and start/stop.

Invariants:
- workers start only after every informer of every source has listed once (the sync gate);
- a key is never reconciled by two workers at once (the queue guarantees it);
- every key a worker takes ends with exactly one ``queue.done()``, or ``queue.give_back()`` when
  a slow call of a plain handler's batch hands the keys behind it to other workers
  (:mod:`declop.queue.batches`): a slow call holds no key but its own;
- :func:`~declop.reconcile._outcome.settle` is the only place where outcomes become queue operations;
- no exception from a handler ever escapes a worker; a framework bug is logged and the key retried;
- a reconcile reads only the cache: it makes no GET or LIST against the apiserver;
- no reconcile starts unless the fences allow it at that moment (:mod:`declop.reconcile._fence`);
  once started, none of its writes is sent unless its Lease is known valid at that moment
  (:mod:`declop.kube.fencing`; a refused one ends the call, settled as fenced: not retried);
- every key a source adds is noted in that key's :class:`~declop.reconcile.trigger.Trace`; a worker
  takes the trace with the key, so each reconcile knows every cause since its key's previous run
  (``trigger``);
- with a priority queue, keys from a sync (initial list, relist) and updates that changed only
  ``resourceVersion``/``managedFields`` (and ``status``, for the primary) are added with the
  registration's low priorities; everything else with :data:`~declop.queue.priority.NORMAL`;
- our own finalizer writes are not reconciled again, and the finalizer protocol does not depend
  on predicates (:mod:`declop.reconcile._filters`).
"""

# size: the worker loop and process keep the steps of a key's life in one readable order; the
# steps themselves live in fence, preparation, call and outcome. Past 500 lines by the
# bookkeeping of calls a stop abandons (running, _job_ended), which must sit beside the workers.

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from declop.cache.informer import Informer
from declop.clock import MONOTONIC, Clock
from declop.cache.store import readonly
from declop.kube.discovery import ResourceInfo
from declop.kube.keys import Request
from declop.leases.shards import ShardSet
from declop.logs import trigger_in_context
from declop.queue.batches import STALL_AFTER, Batch, batch_size
from declop.queue.priority import NORMAL, PriorityQueue
from declop.queue.ratelimit import RateLimiter, default_controller_rate_limiter
from declop.queue.workqueue import QueueEmpty, QueueShutDown, WorkQueue
from declop.reconcile._call import ControllerMetrics as ControllerMetrics
from declop.reconcile._call import Call, Watch, call_async, hand_off, held, returned, run_batch, watch
from declop.reconcile.client import ClientContext
from declop.reconcile._fence import fence_closed, lease_of, owned, shard_of
from declop.reconcile._filters import finalizer_work, ident, is_our_echo, only_churn
from declop.reconcile.mapping import KeyMapper
from declop.reconcile._outcome import complete, finish
from declop.reconcile._outcome import invalid_outcome as invalid_outcome
from declop.reconcile.predicates import Predicate, is_builtin
from declop.reconcile._preparation import add_finalizer, prepare
from declop.reconcile.registration import Registration
from declop.reconcile.result import Phase
from declop.reconcile.trigger import Trace

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
        clock: Clock = MONOTONIC,
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
            rate_limiter = limit.limiter(clock) if limit is not None else default_controller_rate_limiter(clock=clock)
        queue_metrics = self.metrics.queue(self.name)
        priority = registration.priority
        self.queue: WorkQueue[Request] = (
            WorkQueue(name=self.name, rate_limiter=rate_limiter, metrics=queue_metrics, clock=clock)
            if priority is None
            else PriorityQueue(name=self.name, rate_limiter=rate_limiter, metrics=queue_metrics, aging=priority.aging, clock=clock)
        )
        self._clock = clock  # the queue's, the rate limiter's and a batch's (the simulator's is virtual)
        # key -> why it was added since its last run (taken by the worker with the key)
        self._traces: dict[Request, Trace] = {}
        # key -> (source, detail) of its pending delayed add (requeue_after, retry)
        self._delayed: dict[Request, tuple[str, str | None]] = {}
        #: the last ``recent`` reconciles (for /debug/reconciles); None when off
        self.recent: collections.deque[dict[str, Any]] | None = (
            collections.deque(maxlen=recent) if recent > 0 else None
        )
        self._primary = [i for s in self.sources if s.primary for i in s.informers]
        self.own_stores = tuple(i.store for i in self._primary)
        self._log = logging.getLogger(f"declop.controller.{self.name}")
        self._workers: list[asyncio.Task[None]] = []
        #: workers :meth:`stop` cancelled that have not returned yet (a handler ignoring cancellation)
        self._cancelled: list[asyncio.Task[None]] = []
        #: batches of plain calls whose worker was cancelled while their thread runs -> the ranges
        #: they keep in flight (sharded mode) until the thread returns
        self._abandoned: dict[concurrent.futures.Future[None], list[int]] = {}
        self._stopping = False
        # keys whose finalizer we added for a CREATED call that was given back before it ran
        self._created: set[Request] = set()
        self.synced = asyncio.Event()
        self.reconciles = 0  # total handler calls, for tests and statistics
        #: may a reconcile start now? (the manager's Lease fence; None: always)
        self.fence = fence
        #: the Lease behind ``fence``, for the message of a fenced write
        self.fence_lease = lease_of(fence)
        self.fenced = 0  # keys the fence stopped before their reconcile started
        #: this controller's ranges in sharded mode (None: not sharded)
        self.shards = shards
        self.unowned = 0  # keys dropped because their range is not ours (sharded mode)
        # key -> uid of the primary object, from its last event (sharded by uid: a deleted
        # object's key still finds its range)
        self._uids: dict[Request, str] | None = None
        # range -> keys of deleted objects dropped at the fence (queued when the range is gained)
        self._tombstones: dict[int, set[Request]] = {}
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
        #: key -> the resourceVersion last reported as failing the typed handler's model
        self._invalid: dict[Request, str] = {}

    # -- wiring ------------------------------------------------------------------------------
    def subscriber(self, source: Source, informer: Informer | None = None) -> Callable[[Any, Any], None]:
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
                        own_writes.pop(ident(old), None)
                        released.pop(ident(old), None)
                elif (writing or own_writes) and is_our_echo(own_writes, writing, old, new, own_finalizer):
                    return  # our own finalizer write coming back (or held until we know)
                elif finalizer_work(old, new, own_finalizer):
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
                if unchanged is not None and only_churn(old, new, primary):
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

    def informers(self) -> list[Informer]:
        return [i for s in self.sources for i in s.informers]

    async def start(self, leadership: asyncio.Event | None = None) -> None:
        """Subscribe to every source, wait for the sync gate (and ``leadership``, if given), then
        start the workers. Caches warm up while a standby waits for the lease."""
        for source in self.sources:
            for informer in source.informers:
                informer.subscribe(self.subscriber(source, informer))
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

    async def stop(self, grace: float = 30.0, settle: float = 0.1) -> bool:
        """Stop taking keys, let in-flight reconciles finish within ``grace`` seconds, then cancel
        the workers and give them ``settle`` seconds to return.

        Keys still queued are dropped: the next start's initial list brings them back.
        Returns True when everything finished in time; :meth:`running` then tells whether calls
        still run (a plain handler's thread, a handler that ignores cancellation).
        """
        self._stopping = True
        self.queue.shutdown()
        if not self._workers:
            return True
        done, pending = await asyncio.wait(self._workers, timeout=grace)
        for task in pending:
            task.cancel()
        self._workers = []
        if pending:
            await asyncio.wait(pending, timeout=max(settle, 0.001))
            self._cancelled = [t for t in pending if not t.done()]
        return not pending

    def running(self) -> int:
        """Batches of calls still running although :meth:`stop` gave up on them: plain-handler
        batches whose thread has not returned (a thread cannot be stopped) and cancelled workers
        that have not returned. While it is not 0 the Leases these calls run under must not be
        released (invariant I6): the manager leaves them to expire."""
        self._cancelled = [t for t in self._cancelled if not t.done()]
        return len(self._abandoned) + len(self._cancelled)

    def _job_ended(self, job: concurrent.futures.Future[None]) -> None:
        """On the loop, once the thread of an abandoned batch returned: its ranges are free."""
        ranges = self._abandoned.pop(job, [])
        if self.shards is not None:
            for r in ranges:
                self.shards.end(r)

    # -- the worker loop -----------------------------------------------------------------------
    async def _worker(self) -> None:
        while True:
            keys = await self.take()
            if keys is None:
                return
            self.metrics.active(self.name, 1)
            try:
                await self.process(keys)
            finally:
                self.metrics.active(self.name, -1)

    async def take(self) -> list[Request] | None:
        """The keys one worker takes next, as a worker takes them: the next ready key and, for a
        plain handler, more ready keys up to this worker's share of the backlog. None once the
        queue shut down, or the controller stops (the key it had taken is done())."""
        queue = self.queue
        try:
            key = await queue.get()
        except QueueShutDown:
            return None
        if self._stopping:
            queue.done(key)
            return None
        keys = [key]
        if not self.registration.is_async:
            # Plain handlers run in a thread: one hop per batch instead of one per key.
            # Take more ready keys, but never more than this worker's share of the backlog,
            # so other workers are not starved. Taken keys are "processing": no other worker
            # can take them, and re-adds meanwhile cause exactly one more run after done().
            extra = batch_size(len(queue), self.registration.max_concurrent) - 1
            while extra > 0:
                try:
                    keys.append(queue.get_nowait())
                except (QueueEmpty, QueueShutDown):
                    break
                extra -= 1
        return keys

    def _lookup(self, key: Request) -> Any:
        for informer in self._primary:
            if not informer.namespace or informer.namespace == key.namespace:
                obj = informer.store.get(key)
                if obj is not None:
                    return obj
        return None

    async def process(self, keys: list[Request]) -> None:
        """Reconcile ``keys`` (taken from the queue by one worker: :meth:`take`) and settle every
        outcome, exactly as a worker does.

        Each key passes the fences (:mod:`~declop.reconcile._fence`), is prepared on the loop
        (:mod:`~declop.reconcile._preparation`), called (plain handlers in one thread hop for the
        batch: :mod:`~declop.reconcile._call`), then settled (:mod:`~declop.reconcile._outcome`),
        and ends with exactly one ``queue.done()`` — or ``queue.give_back()`` when a slow call
        hands the keys behind it to other workers (:mod:`declop.queue.batches`).
        """
        reg = self.registration
        calls: list[Call] = []  # every call is "held" until its key is done() or given back
        shards = self.shards
        job: concurrent.futures.Future[None] | None = None  # the batch's executor job, for plain handlers
        thread: asyncio.Future[None] | None = None  # resolved by that job's thread as its batch returns
        ranges: dict[Request, int] = {}
        if shards is not None:
            keys = owned(self, keys, ranges)
            if not keys:
                return
        try:
            fence = self.fence
            log_trigger = trigger_in_context()
            freeze = log_trigger or reg.wants_trigger or self.recent is not None
            for key in keys:
                if fence is not None and not fence():
                    fence_closed(self, len(keys) - len(calls))
                    break  # the rest never starts; their keys end with done() below
                call = prepare(self, key, ranges, freeze, log_trigger)
                if call.add_finalizer:  # CREATED: our finalizer first
                    await add_finalizer(self, call)
                calls.append(call)
            if reg.is_async:
                for call in calls:
                    if call.error is None and not call.stale:
                        if self._stopping and call is not calls[0]:
                            break  # dropped at shutdown, like keys still queued
                        if fence is not None and not fence():
                            fence_closed(self, len(calls) - calls.index(call))
                            break  # dropped: the fence never reopens
                        if shards is not None and not shards.may_start(call.shard):
                            self.unowned += 1
                            continue  # its range is draining or lost: dropped (done() below)
                        call.called = True
                        await call_async(self, call)  # with its write fence current
                    await finish(self, call)
            else:
                # Plain handlers: the prepared calls run in one executor job. With more than one
                # worker, a timer gives the calls that have not started back (their keys to the
                # queue) once a call has run STALL_AFTER; the calls that finished are settled then.
                runnable = [c for c in calls if c.error is None and not c.stale]
                if len(runnable) < len(calls):
                    for call in calls:
                        if call.finished:  # a failed preparation: settled now, not after the batch
                            complete(self, call)
                if runnable:
                    loop = asyncio.get_running_loop()
                    fn, stopping = reg.fn, self._is_stopping
                    timed = reg.timeout is not None
                    shard_fence = shards.may_start if shards is not None else None
                    if len(runnable) == 1 or reg.max_concurrent == 1:
                        # nothing to give back, or nobody to give it to: the plain loop, no timer
                        job, thread = self._submit(loop, fn, runnable, stopping, fence, timed, shard_fence)
                        await thread
                    else:
                        batch: Batch[Call] = Batch(runnable, self._clock)
                        job, thread = self._submit(loop, fn, batch, stopping, fence, timed, shard_fence)
                        w = Watch(batch, calls, loop.create_future())
                        thread.add_done_callback(w.wake)
                        w.timer = loop.call_later(STALL_AFTER, watch, self, w)
                        try:
                            await w.woken
                        finally:
                            w.timer.cancel()
                        if not thread.done():  # stalled: settle what finished before the slow call
                            for call in calls:
                                if call.finished and call.held:
                                    await finish(self, call)
                        await thread
                if fence is not None and runnable and not runnable[-1].called and not self._stopping and not fence():
                    fence_closed(self, sum(not c.called for c in runnable))
                deleting = reg.finalizer is not None
                for call in calls:
                    if call.finished and call.held:
                        if deleting and call.phase is Phase.DELETING:
                            await finish(self, call)
                        else:
                            complete(self, call)
                # calls not started (the thread stopped at shutdown) are dropped like queued keys: done()
        except asyncio.CancelledError:
            raise
        except Exception:  # a framework bug: never kill the worker
            log.exception(
                "Unexpected error while processing keys",
                extra={"kv": {"controller": self.name, "keys": [str(k) for k in keys]}},
            )
            for k in held(keys, calls):
                self.queue.add_rate_limited(k)
                self._delayed[k] = ("retry", "framework error")
        finally:
            for k in held(keys, calls):  # dropped at shutdown, or a framework bug
                self.queue.done(k)
            if job is not None and thread is not None and not returned(job, thread):
                # cancelled while the thread runs: its calls go on, and so do their ranges'
                # in-flight counts (a range is released only once idle) until it returns. (A
                # job cancelled before a thread took it is done: none of its calls ever runs.)
                self._abandoned[job] = list(ranges.values())
                job.add_done_callback(_on_loop(asyncio.get_running_loop(), self._job_ended))
            elif shards is not None:
                for r in ranges.values():
                    shards.end(r)

    def _submit(
        self, loop: asyncio.AbstractEventLoop, *args: Any
    ) -> tuple[concurrent.futures.Future[None] | None, asyncio.Future[None]]:
        """Hand a batch to the executor: its job (``None`` on the loop's default executor, which
        only tests use: not tracked for a stop) and the future the worker awaits."""
        if self.executor is None:
            return None, loop.run_in_executor(None, run_batch, *args)
        return hand_off(self.executor, loop, run_batch, *args)

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
        while nobody owned the range are not missed), and the deletions of it this replica
        dropped at its fence meanwhile (its tombstones)."""
        shards = self.shards
        assert shards is not None
        n = 0
        for informer in self._primary:
            for key in informer.store.keys():
                if shard_of(self, key) == index:
                    self.queue.add(key)
                    self._trace(key).note("shard-gained", None, f"shard {index}/{shards.n}")
                    n += 1
        for key in sorted(self._tombstones.pop(index, ())):  # deletions missed while it was not ours
            self.queue.add(key)
            self._trace(key).note("shard-gained", None, f"shard {index}/{shards.n}, deleted")
            n += 1
        self._log.info("Shard gained; queued its objects", extra={"kv": {"controller": self.name, "shard": f"{index}/{shards.n}", "keys": n}})

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


def _on_loop(
    loop: asyncio.AbstractEventLoop, fn: Callable[[concurrent.futures.Future[None]], None]
) -> Callable[[concurrent.futures.Future[None]], None]:
    """A done-callback for an executor job that runs ``fn(job)`` on ``loop`` (called in the
    thread, or at once if the job is done already; nothing if the loop is closed: the process is
    exiting)."""

    def later(job: concurrent.futures.Future[None]) -> None:
        try:
            loop.call_soon_threadsafe(fn, job)
        except RuntimeError:
            pass

    return later
