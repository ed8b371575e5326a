"""Controller: one per registration — sources → predicates → workqueue → workers → outcome table.

A controller never tells its handler *what happened*. Sources (the primary resource's informers,
owned resources, watched resources) turn events into keys; predicates drop events first; keys go
on a deduplicating, rate-limited :class:`~declop.queue.workqueue.WorkQueue`; ``max_concurrent``
workers take keys (:meth:`Controller.take`), and each batch of keys goes through
:meth:`Controller.process`: owned → prepare → run → settle, finally done —

- the fence (:mod:`~declop.reconcile._fence`): may this replica start it now (leader, shard)?
- its preparation (:mod:`~declop.reconcile._preparation`): the object from the cache, its
  :class:`~declop.reconcile.result.Phase`, our finalizer added first, the handler's arguments;
- the run (:mod:`~declop.reconcile._run`): async handlers awaited one by one, plain handlers in
  one executor job per batch, watched for stalls;
- its outcome (:mod:`~declop.reconcile._outcome`): our finalizer released after a successful
  DELETING call, the outcome table, ``queue.done()``.

What the controller remembers of keys between runs has owners (:mod:`declop.reconcile._keys`):
``keys`` (traces, delayed adds, invalid reports), ``echoes`` (our finalizer writes) and the
gate's ``book`` (sharded mode). This module owns the sources and their subscriber (which events
become which keys, with which priority and trace; the event filters are in
:mod:`declop.reconcile._filters`), the workers and start/stop.

Invariants:
- workers start only after every informer of every source has listed once (the sync gate);
- a key is never reconciled by two workers at once (the queue guarantees it);
- every key a worker takes ends with exactly one ``queue.done()``, or ``queue.give_back()`` when
  a slow call of a plain handler's batch hands the keys behind it to other workers
  (:mod:`declop.queue.batches`): a slow call holds no key but its own;
- outcomes become queue operations only in :func:`~declop.reconcile._outcome.apply`;
- no exception from a handler ever escapes a worker; a framework bug is logged and the key retried;
- a reconcile reads only the cache: it makes no GET or LIST against the apiserver;
- no reconcile starts unless :meth:`~declop.reconcile._fence.Gate.may_start` allows it at that
  moment; once started, none of its writes is sent unless its Lease is known valid at that moment
  (:mod:`declop.kube.fencing`; a refused one ends the call, settled as fenced: not retried);
- every key a source adds is noted in that key's :class:`~declop.reconcile.trigger.Trace`; a worker
  takes the trace with the key, so each reconcile knows every cause since its key's previous run;
- with a priority queue, keys from a sync (initial list, relist) and updates that changed only
  ``resourceVersion``/``managedFields`` (and ``status``, for the primary) are added with the
  registration's low priorities; everything else with :data:`~declop.queue.priority.NORMAL`;
- our own finalizer writes are not reconciled again, and the finalizer protocol does not depend
  on predicates (:mod:`declop.reconcile._filters`);
- with ``labels=``/``fields=``, a controller is subscribed to every cache its handler reads its
  own resource from: its filtered informers, and each unfiltered one of the resource
  (:meth:`Controller.unfiltered_subscriber`), so no cache the handler read is left to catch up
  without waking it.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from declop.cache.informer import Informer, all_synced
from declop.cache.store import readonly
from declop.clock import MONOTONIC, Clock
from declop.kube.discovery import ResourceInfo
from declop.kube.keys import Request
from declop.leases.shards import ShardSet
from declop.queue.batches import batch_size
from declop.queue.priority import NORMAL, PriorityQueue
from declop.queue.ratelimit import RateLimiter, default_controller_rate_limiter
from declop.queue.workqueue import QueueEmpty, QueueShutDown, WorkQueue
from declop.reconcile._call import Call, held
from declop.reconcile._call import ControllerMetrics as ControllerMetrics
from declop.reconcile._fence import Gate
from declop.kube.keys import key_of
from declop.reconcile._filters import finalizer_work, in_filter, only_churn
from declop.reconcile._keys import FinalizerWrites, KeyNotes, PrimaryCache
from declop.reconcile._outcome import retry
from declop.reconcile._preparation import prepare_all
from declop.reconcile._run import Crew
from declop.reconcile._leaving import Search, unfiltered_subscriber
from declop.reconcile.client import ClientContext
from declop.reconcile.mapping import KeyMapper
from declop.reconcile.predicates import Predicate, is_builtin
from declop.reconcile.registration import Registration
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

    __slots__ = (
        "registration", "name", "resource", "sources", "ctx", "metrics", "queue", "recent", "reconciles", "primary",
        "keys", "echoes", "gate", "crew", "log", "scan",
    )

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
        #: the last ``recent`` reconciles (for /debug/reconciles); None when off
        self.recent: collections.deque[dict[str, Any]] | None = (
            collections.deque(maxlen=recent) if recent > 0 else None
        )
        self.reconciles = 0  # total handler calls, for tests and statistics
        self.log = logging.getLogger(f"declop.controller.{self.name}")
        #: the caches of the informers whose events wake this controller
        self.primary = PrimaryCache(i for s in self.sources if s.primary for i in s.informers)
        self.keys = KeyNotes()
        self.echoes = FinalizerWrites()
        #: may a call start now? (the manager's Lease fence, this controller's ranges, stopping)
        self.gate = Gate(fence, shards, registration.shard_by == "uid", self.halt, self.log, self.name)
        # the queue's, the rate limiter's and a batch's clock (the simulator's is virtual)
        self.crew = Crew(executor, clock, shards, registration.is_async)
        #: with a finalizer and labels=/fields=: the search for objects that left the filter unseen
        self.scan = Search(self) if registration.finalizer and (registration.labels or registration.fields) else None
        if shards is not None:
            shards.on_gained = self.gained

    # -- read-through names the manager, the probes and tests use --------------------------------
    @property
    def synced(self) -> asyncio.Event:
        """Set once every informer of every source has listed once (the sync gate)."""
        return self.crew.synced

    @property
    def executor(self) -> concurrent.futures.Executor | None:
        return self.crew.executor

    @executor.setter
    def executor(self, executor: concurrent.futures.Executor | None) -> None:
        self.crew.executor = executor

    @property
    def fence(self) -> Callable[[], bool] | None:
        """May a reconcile start now? (the manager's Lease fence; None: always)"""
        return self.gate.leader

    @fence.setter
    def fence(self, fence: Callable[[], bool] | None) -> None:
        self.gate.leader = fence

    @property
    def fenced(self) -> int:
        """Keys the fence stopped before their reconcile started."""
        return self.gate.fenced

    @property
    def shards(self) -> ShardSet | None:
        """This controller's ranges in sharded mode (None: not sharded)."""
        return self.gate.shards

    @property
    def unowned(self) -> int:
        """Keys dropped because their range is not ours (sharded mode)."""
        book = self.gate.book
        return book.unowned if book is not None else 0

    # -- wiring ------------------------------------------------------------------------------
    def subscriber(self, source: Source, informer: Informer | None = None) -> Callable[[Any, Any], None]:
        """The event handler of ``source`` on ``informer`` (default: its first)."""
        if informer is None:
            informer = source.informers[0]
        add = self.queue.add
        traces = self.keys.traces
        mapper, predicates = source.mapper, source.predicates
        primary = source.primary
        own_finalizer = self.registration.finalizer if primary else None
        echoes = self.echoes
        own_writes, released, writing, stranded = echoes.own_writes, echoes.released, echoes.writing, echoes.left
        # with labels=/fields=: a filtered DELETED may be the object leaving the filter
        filtered = bool(self.registration.labels or self.registration.fields)
        priority = self.registration.priority if isinstance(self.queue, PriorityQueue) else None
        listed = priority.listed if priority is not None else NORMAL
        # None: updates are not compared (FIFO, or unchanged updates keep NORMAL priority)
        unchanged = priority.unchanged if priority is not None and priority.unchanged != NORMAL else None
        label = source.label or f"source:{informer.resource.kind}"
        kind, via = informer.resource.kind, source.via
        book = self.gate.book
        uids = book.uids if primary and book is not None else None

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
                        echoes.gone(old)
                    if filtered and own_finalizer in ((old.get("metadata") or {}).get("finalizers") or ()):
                        # the apiserver deletes no object that still has a finalizer: this one left
                        # the filter (or may have, on a relist). Its DELETED call releases ours,
                        # past the predicates: the protocol needs it
                        key, uid = key_of(old), old["metadata"].get("uid") or ""
                        stranded[key] = uid
                        if uids is not None and uid:
                            uids[key] = uid  # the key's range, for the gate
                        add(key)
                        note(key, "deleted", old)
                        return
                elif (writing or own_writes) and echoes.is_echo(old, new, own_finalizer):
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

    def unfiltered_subscriber(self, selected: Callable[[Any], bool]) -> Callable[[Any, Any], None]:
        """The subscriber of a ``labels=``/``fields=`` controller (``selected``: its filter) on an
        unfiltered informer of its resource (:func:`declop.reconcile._leaving.unfiltered_subscriber`)."""
        return unfiltered_subscriber(self, selected)

    def informers(self) -> list[Informer]:
        return [i for s in self.sources for i in s.informers]

    async def start(self, leadership: asyncio.Event | None = None) -> None:
        """Subscribe to every source, wait for the sync gate (and ``leadership``, if given), then
        start the workers. Caches warm up while a standby waits for the lease."""
        for source in self.sources:
            for informer in source.informers:
                informer.subscribe(self.subscriber(source, informer))
        reg = self.registration
        if (reg.labels or reg.fields) and self.primary.informers:
            selected = in_filter(reg.labels, reg.fields)
            self.ctx.informers.follow_unfiltered(self.resource, lambda i: i.subscribe(self.unfiltered_subscriber(selected)))
        self.log.info("Starting Controller", extra={"kv": {"controller": self.name, "resource": str(self.resource)}})
        pending = self.informers()
        while True:
            try:
                await all_synced((i.synced for i in pending), timeout=120)
                break
            except asyncio.TimeoutError:
                stuck = [f"{i.name}: {i.last_error or 'no answer yet'}" for i in pending if not i.synced.is_set()]
                self.log.error(
                    "Caches have not synced after 120 s; still waiting",
                    extra={"kv": {"controller": self.name, "informers": stuck}},
                )
        self.synced.set()
        self.search_stranded()
        if leadership is not None and not leadership.is_set():
            await leadership.wait()
        if self.gate.stopping:
            return
        n = self.registration.max_concurrent
        self.metrics.started(self.name, n)
        self.log.info("Starting workers", extra={"kv": {"controller": self.name, "worker count": n}})
        loop = asyncio.get_running_loop()
        self.crew.tasks = [loop.create_task(self._worker(), name=f"{self.name} worker {i}") for i in range(n)]

    def search_stranded(self) -> None:
        """Look for objects that left the filter with our finalizer while no watch of ours saw
        them go (:class:`~declop.reconcile._leaving.Search`): after the first sync, and after
        each range gained (its new owner's watch did not see what happened in it meanwhile)."""
        if self.scan is not None and not self.gate.stopping:
            self.scan.request()

    def halt(self) -> None:
        """Stop intake now, synchronously: the queue shuts down and no worker takes another key
        (the manager calls it the moment the Lease is lost; :meth:`stop` then cancels workers)."""
        self.gate.stopping = True
        self.queue.shutdown()

    async def stop(self, grace: float = 30.0, settle: float = 0.1) -> bool:
        """Stop taking keys, let in-flight reconciles finish within ``grace`` seconds, then cancel
        the workers and give them ``settle`` seconds to return.

        Keys still queued are dropped: the next start's initial list brings them back.
        Returns True when everything finished in time; :meth:`running` then tells whether calls
        still run (a plain handler's thread, a handler that ignores cancellation).
        """
        self.halt()
        if self.scan is not None:
            self.scan.cancel()
        crew = self.crew
        if not crew.tasks:
            return True
        pending = list(crew.tasks)
        try:
            pending = list((await asyncio.wait(crew.tasks, timeout=grace))[1])
        finally:  # also when the manager's bound on the drain cancels us: count what still runs
            pending = [t for t in pending if not t.done()]
            for task in pending:
                task.cancel()
            crew.tasks = []
            crew.cancelled = [*crew.cancelled, *pending]
        if pending:
            await asyncio.wait(pending, timeout=max(settle, 0.001))
        return not pending

    def running(self) -> int:
        """Batches of calls still running although :meth:`stop` gave up on them: plain-handler
        batches whose thread has not returned (a thread cannot be stopped) and cancelled workers
        that have not returned. While it is not 0 the Leases these calls run under must not be
        released: the manager leaves them to expire."""
        return self.crew.running()

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
        if self.gate.stopping:
            queue.done(key)
            return None
        keys = [key]
        if not self.registration.is_async:
            # Plain handlers run in a thread: one hop per batch instead of one per key. Take more
            # ready keys, but never more than this worker's share of the backlog, so other workers
            # are not starved. Taken keys are "processing": no other worker can take them, and
            # re-adds meanwhile cause exactly one more run after done().
            extra = batch_size(len(queue), self.registration.max_concurrent) - 1
            while extra > 0:
                try:
                    keys.append(queue.get_nowait())
                except (QueueEmpty, QueueShutDown):
                    break
                extra -= 1
        return keys

    async def process(self, keys: list[Request]) -> None:
        """Reconcile ``keys`` (taken from the queue by one worker: :meth:`take`) and settle every
        outcome, exactly as a worker does: the keys whose range is ours
        (:meth:`~declop.reconcile._fence.Gate.owned`) are prepared
        (:mod:`~declop.reconcile._preparation`), run and settled by the handler kind's runner
        (:mod:`~declop.reconcile._run`), and each ends with exactly one ``queue.done()`` — or
        ``queue.give_back()`` when a slow call hands the keys behind it to other workers.
        """
        gate, queue = self.gate, self.queue
        ranges: dict[Request, int] = {}  # sharded: each key's range, in flight until the end
        if gate.shards is not None:
            keys = gate.owned(keys, ranges, self.primary, self.keys, queue)
            if not keys:
                return
        calls: list[Call] = []  # every call is "held" until its key is done() or given back
        try:
            await prepare_all(self, keys, ranges, calls)
            await self.crew.runner.run(self, calls, ranges)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a framework bug: never kill the worker
            log.exception(
                "Unexpected error while processing keys",
                extra={"kv": {"controller": self.name, "keys": [str(k) for k in keys]}},
            )
            retry(self, held(keys, calls), exc)
        finally:
            for k in held(keys, calls):  # not started (shutdown, a fence), or a framework bug
                queue.done(k)
            if ranges:  # (a batch abandoned by a stop took its ranges over: Crew.abandon)
                shards = gate.shards
                assert shards is not None
                for r in ranges.values():
                    shards.end(r)

    def forget(self, informer: Informer, released: Iterable[Request]) -> int:
        """``released`` keys left ``informer``'s store because their range went to another
        replica: drop what this controller remembers of them (the uid of a primary object). A
        key still cached by another primary informer is kept. Returns how many were dropped;
        without it the map would hold every object that ever passed through this replica."""
        book = self.gate.book
        if book is None or informer not in self.primary:
            return 0
        seen = self.keys.seen
        if seen:
            released = list(released)
            seen.difference_update(released)  # first_seen again when the range comes back
        return book.forget(released, self.primary)

    def gained(self, index: int) -> None:
        """Range ``index`` became ours: queue every cached primary object of it (changes made
        while nobody owned the range are not missed), and the deletions of it this replica
        dropped at its fence meanwhile (its tombstones)."""
        gate = self.gate
        shards, book = gate.shards, gate.book
        assert shards is not None and book is not None
        n = 0
        for informer in self.primary.informers:
            for key in informer.store.keys():
                if gate.shard_of(key, self.primary.get(key)) == index:
                    self.queue.add(key)
                    self.keys.trace(key).note("shard-gained", None, f"shard {index}/{shards.n}")
                    n += 1
        for key in book.tombstones_of(index):  # deletions missed while it was not ours
            self.queue.add(key)
            self.keys.trace(key).note("shard-gained", None, f"shard {index}/{shards.n}, deleted")
            n += 1
        self.log.info("Shard gained; queued its objects", extra={"kv": {"controller": self.name, "shard": f"{index}/{shards.n}", "keys": n}})
        self.search_stranded()
