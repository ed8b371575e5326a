"""Informer: keeps one :class:`~declop.cache.store.Store` in sync with the apiserver by list + watch.

One informer per (resource, namespace, label selector), shared by every controller that needs it.
The loop is client-go's reflector (``tools/cache/reflector.go``), in asyncio; one pass of it is a
*ListAndWatch*:

1. **Sync.** Either a *streaming list* (``list_mode="stream"``; the default ``"auto"`` uses it
   wherever the apiserver accepts it): one watch with ``sendInitialEvents=true``,
   ``resourceVersionMatch=NotOlderThan`` and bookmarks, whose initial ADDED events are collected
   aside until the BOOKMARK annotated ``k8s.io/initial-events-end``, then swapped in — and the same
   stream goes on as the watch. Or a *paginated LIST* (``"paged"``, and the automatic, logged
   fallback when the server refuses streaming): pages of 500; an expired continue token (410 on a
   later page) falls back to one full unpaged LIST (client-go's pager, ``FullListIfExpired``).
   Either way the store is replaced atomically and the changes against its previous content are
   emitted, deletions synthesised for keys that vanished.
2. **Watch** from the synced resourceVersion (the list's ``metadata.resourceVersion`` or the end
   bookmark's, never an item's), with bookmarks, a server ``timeoutSeconds`` drawn from
   [5, 10) minutes, a client deadline 60 s above it and an idle read timeout of 90 s.
3. **A watch that was working and ends re-watches at once** from the last resourceVersion, quietly:
   the server's timeout, an idle read (DEBUG), a connection reset or EOF (INFO). Only a failing
   watch *request* is an error: refused/unreachable or 429 (also as an in-stream ERROR event)
   back off and re-watch; any other failure (5xx, a stream that dies within 1 s with nothing in
   it) ends the pass.
4. **A pass ends with a relist after a backoff**: a 410 (in-stream or on connect), any other
   in-stream ERROR event (the object it concerns may be gone or undecodable: only a relist can
   tell), or a failure. The backoff is client-go's: 0.8 s doubling to 30 s with full jitter
   (uniform in [d, 2d), capped), reset after 2 minutes without backing off; ``Retry-After`` and
   ``retryAfterSeconds`` raise the delay. Failures log one ERROR line each, with the next delay.

**Sharding** (``shard=``, a :class:`~declop.leases.hashing.ShardFilter`): the informer holds only the
objects whose shard hash is in the owned ranges. At the start of its first pass it asks the
apiserver once (a LIST of one item with the ``shardSelector``): an answer carrying
``metadata.shardInfo`` means server-side filtering (``shard_mode == "server"``: every LIST and
watch carries the selector, so the apiserver sends only owned objects); an answer without it
(the ``ShardedListAndWatch`` gate off, an apiserver before v1.36) means client-side filtering
(``"client"``: the full list and watch, objects outside the ranges dropped before the store).
In both modes every object is also checked against the filter before the store, with the same
FNV-1a hash as the apiserver's, so an apiserver that stops filtering (a restart with the gate off)
costs bandwidth, never correctness. :meth:`Informer.set_shard` changes the owned ranges (see
there; docs/sharding.md explains the choice of re-list).

Invariants:
- events reach subscribers in the order the store applied them, after the store changed;
- subscribers are called on the event loop and must not block (they only enqueue keys);
- bookmarks never reach the store or subscribers; an event of an unknown type, of another kind
  or without metadata is logged and skipped, never applied;
- resourceVersions are opaque strings, compared for equality only;
- no relist without a backoff delay before it; no re-watch delay after a watch that was working;
- a sync swaps the new content into the store in one step, computed aside in chunks with the
  loop running in between; no step of a sync walks or builds more than a chunk of objects;
- the cyclic GC is paused while any informer syncs, and the garbage of that time is collected
  before the heap is frozen (after every page or chunk): nothing is pinned but what survives;
- with a shard filter, the store never holds an object outside the owned ranges, and an object
  that leaves the store because its range was released is never emitted as a deletion.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal

from declop.cache.store import Store, Transform, Writer, strip_managed_fields
from declop.kube.discovery import ResourceInfo
from declop.errors import ApiError, Forbidden, NotFound
from declop.kube.keys import Request, key_of
from declop.leases.hashing import ShardFilter, ShardRange, difference
from declop.kube.transport import StreamIdle, StreamInterrupted, Transport, loads

__all__ = [
    "INITIAL_EVENTS_END",
    "LIST_MODES",
    "METADATA_ACCEPT",
    "METADATA_LIST_ACCEPT",
    "Backoff",
    "EventHandler",
    "Informer",
    "InformerPool",
    "ListMode",
    "ShardChange",
    "ShardMode",
]

log = logging.getLogger("declop.informer")

#: subscriber signature: (old, new); old is None for an addition, new is None for a deletion.
EventHandler = Callable[[Any, Any], None]

#: how an informer syncs: streaming list with fallback (default), streaming only, paginated LIST only
ListMode = Literal["auto", "stream", "paged"]
LIST_MODES: tuple[str, ...] = ("auto", "stream", "paged")

#: the annotation on the bookmark that ends the initial events of a streaming list
INITIAL_EVENTS_END = "k8s.io/initial-events-end"

#: what a metadata-only informer accepts: the apiserver answers each object (watch events) or the
#: list as ``PartialObjectMetadata``(``List``) of ``meta.k8s.io/v1``, metadata only
METADATA_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
METADATA_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
_METADATA_KIND, _METADATA_API_VERSION = "PartialObjectMetadata", "meta.k8s.io/v1"

#: how a sharded informer filters: "server" (the apiserver applies the shardSelector), "client"
#: (full list and watch, filtered here), "" (not detected yet, or not sharded)
ShardMode = Literal["", "server", "client"]


@dataclass(frozen=True)
class ShardChange:
    """What :meth:`Informer.set_shard` did. ``released`` are the keys that left the store (never
    emitted as deletions: a controller forgets them, it does not reconcile them); ``gained`` the
    ranges newly owned; ``relisted`` whether a sync was needed to bring their objects in."""

    released: tuple[Request, ...]
    gained: tuple[ShardRange, ...]
    relisted: bool


_WATCH_TYPES = frozenset(("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"))


class Backoff:
    """Exponential backoff with full jitter: 0.8 s doubling to 30 s, reset after 2 quiet minutes.

    ``next()`` returns a delay uniform in [d, 2d) capped at ``cap``, where d starts at ``initial``
    and doubles on every call; 2 minutes without a call (a healthy watch) start it over."""

    def __init__(
        self,
        initial: float = 0.8,
        cap: float = 30.0,
        factor: float = 2.0,
        reset_after: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.initial, self.cap, self.factor, self.reset_after = initial, cap, factor, reset_after
        self.clock = clock
        self._current = 0.0
        self._last = -1e18

    def next(self) -> float:
        now = self.clock()
        if now - self._last > self.reset_after:
            self._current = 0.0
        self._last = now
        self._current = self.initial if self._current == 0 else min(self._current * self.factor, self.cap)
        # jitter factor 1.0 as in client-go: uniform in [d, 2d), then capped
        return min(self._current * (1 + random.random()), self.cap)


class _Relist(Exception):
    """The watch ended in a way only a relist repairs (410, an in-stream ERROR event)."""

    def __init__(self, message: str, *, expected: bool) -> None:
        super().__init__(message)
        self.expected = expected  # a 410 is routine (INFO); other ERROR events are not (WARNING)


class _Throttled(Exception):
    """429 as an in-stream ERROR event: back off, re-watch from the same resourceVersion."""

    def __init__(self, retry_after: float | None) -> None:
        super().__init__("throttled")
        self.retry_after = retry_after


class Informer:
    """List + watch one resource into a Store; notify subscribers of every change."""

    def __init__(
        self,
        transport: Transport,
        resource: ResourceInfo,
        *,
        namespace: str = "",
        label_selector: str = "",
        field_selector: str = "",
        metadata_only: bool = False,
        transform: Transform | None = strip_managed_fields,
        page_size: int = 500,
        idle_timeout: float = 90.0,
        list_mode: ListMode = "auto",
        backoff: Backoff | None = None,
        min_watch_timeout: int = 300,
        shard: ShardFilter | None = None,
        shard_filtering: Literal["auto", "client"] = "auto",
    ) -> None:
        if list_mode not in LIST_MODES:
            raise ValueError(f"list_mode must be one of {', '.join(LIST_MODES)}, not {list_mode!r}")
        if shard_filtering not in ("auto", "client"):
            raise ValueError(f"shard_filtering must be auto or client, not {shard_filtering!r}")
        self.transport = transport
        self.resource = resource
        self.namespace = namespace if resource.namespaced else ""
        self.label_selector = label_selector
        self.field_selector = field_selector
        #: lists and watches PartialObjectMetadata: the store holds metadata only
        self.metadata_only = metadata_only
        self.page_size = page_size
        self.idle_timeout = idle_timeout
        self.list_mode = list_mode
        self.min_watch_timeout = min_watch_timeout
        where = f" in {self.namespace}" if self.namespace else ""
        how = [*([label_selector] if label_selector else []), *([field_selector] if field_selector else [])]
        how += ["metadata only"] if metadata_only else []
        how += [f"sharded by {shard.key}"] if shard is not None else []
        sel = f" ({'; '.join(how)})" if how else ""
        self.name = f"{resource.group_resource}{where}{sel}"
        # the kind/apiVersion of what the apiserver sends: the resource's, or PartialObjectMetadata
        self._kind = _METADATA_KIND if metadata_only else resource.kind
        self._api_version = _METADATA_API_VERSION if metadata_only else resource.api_version
        self.store = Store(self.name)
        if shard is not None and shard.key == "uid" and transform is not None:
            transform = _keeping_uid(transform)  # set_shard hashes cached objects again
        self._writer = Writer(self.store, transform)
        self._subscribers: list[EventHandler] = []
        self.synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._backoff = backoff or Backoff()
        self._streaming = list_mode != "paged"  # "auto" turns this off for good when refused
        self._events = 0  # events of the current watch stream
        self._stream_synced = False  # the current stream's initial events are in the store
        self.last_error: str = ""
        self.lists = 0  # number of completed syncs (1 + relists), streaming or paginated
        #: True while subscribers receive a sync's changes (the initial list, a relist, or the
        #: replay of the cache to a late subscriber): controllers give such keys low priority
        self.syncing = False
        self.last_sync_mode = ""  # "stream" or "paged": how the last sync was done
        self._kv = {"informer": self.name}
        #: the owned ranges (None: not sharded); change them with :meth:`set_shard` only
        self.shard = shard
        #: "client" from the start with ``shard_filtering="client"`` (no detection: to compare
        #: both modes on one apiserver), else detected by the first pass
        self.shard_mode: ShardMode = "client" if shard is not None and shard_filtering == "client" else ""
        #: object events (not bookmarks) received on watch streams after their sync, before any
        #: client-side filtering: what the apiserver sent this informer
        self.events_received = 0
        #: objects received by syncs (LIST items, initial events of a streaming list)
        self.objects_listed = 0
        #: objects and events dropped by the shard filter (client-side filtering)
        self.dropped = 0
        #: objects that left the store because their range was released
        self.released = 0
        self._emitting = 0  # >0 while a sync's changes are being emitted (not to be cut short)
        self._calm = asyncio.Event()
        self._calm.set()
        self._resume_watch = False  # next pass: watch from the store's resourceVersion, no sync
        self._resharding = asyncio.Lock()
        self._sync_owed = False  # a gained range's objects are not in the store until the next sync
        self._warned_unfiltered = False

    def subscribe(self, handler: EventHandler) -> None:
        """Receive every future change; if already synced, replay the cache as additions first."""
        self._subscribers.append(handler)
        if self.store.synced:
            self.syncing = True
            try:
                for obj in self.store:
                    handler(None, obj)
            finally:
                self.syncing = False

    def start(self) -> None:
        if self._task is None:
            if self.shard is not None and self.shard.empty:
                self._own_nothing()
                return
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"informer {self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def _own_nothing(self) -> None:
        """No owned ranges: nothing to list or watch; the store is (silently) empty and synced."""
        for key in self.store.keys():
            self._writer.delete(key)
        if not self.store.synced:
            self._writer.replace([], self.store.resource_version)
        self.synced.set()

    async def set_shard(self, ranges: Iterable[ShardRange]) -> ShardChange:
        """Own exactly ``ranges`` from now on; returns what changed.

        - Objects of released ranges leave the store at once and are *not* emitted: they were
          not deleted, they are someone else's now. Their keys are in the result so that the
          caller can drop them from its queue.
        - Ranges only released (no range gained): the watch restarts with the narrower selector
          from the store's resourceVersion; no sync, no request beyond the new watch.
        - A range gained: the informer syncs again with the new selector (server-side) or the
          full list (client-side). The sync's diff against the store emits the gained objects as
          additions, plus any change missed in kept ranges; unchanged objects emit nothing.
        - A sync whose changes are being emitted is never cut short: this waits for it.

        Call on the informer's loop; concurrent calls take effect one after the other, in order.
        Must be a sharded informer (``shard=`` given)."""
        if self.shard is None:
            raise ValueError(f"informer {self.name} is not sharded; create it with shard=")
        async with self._resharding:
            return await self._set_shard(ranges)

    async def _set_shard(self, ranges: Iterable[ShardRange]) -> ShardChange:
        assert self.shard is not None
        new = self.shard.with_ranges(ranges)
        old = self.shard
        gained = difference(new.ranges, old.ranges)
        if new == old:
            return ShardChange((), (), False)
        while self._emitting:
            self._calm.clear()
            await self._calm.wait()
        running = self._task is not None
        if running:
            await self.stop()
        self.shard = new
        released: list[Request] = []
        for key in self.store.keys():
            obj = self.store.get(key)
            if obj is not None and not new.matches(obj):
                self._writer.delete(key)
                released.append(key)
        self.released += len(released)
        # a sync still owed to an earlier gain (cut short by this change) is owed still
        relist = bool(gained) or self._sync_owed or not self.store.synced or not self.store.resource_version
        self._resume_watch = not relist
        self._sync_owed = relist and not new.empty
        log.info(
            f"Shard ranges changed: now {new}; {len(released)} objects released"
            + (", re-listing for the gained ranges" if relist and not new.empty else ""),
            extra={"kv": {**self._kv, "released": len(released), "gained": len(gained)}},
        )
        if running:
            self.start()
        return ShardChange(tuple(released), gained, relist and not new.empty)

    @property
    def path(self) -> str:
        return self.resource.path(namespace=self.namespace or None)

    def _emit(self, old: Any, new: Any) -> None:
        for handler in self._subscribers:
            try:
                handler(old, new)
            except Exception:  # a subscriber bug must not kill the informer
                log.exception("Event handler failed", extra={"kv": self._kv})

    # -- the loop -------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                await self._list_and_watch()
                continue  # pragma: no cover - _list_and_watch only ends by raising
            except asyncio.CancelledError:
                raise
            except _Relist as exc:
                delay = self._backoff.next()
                level = logging.INFO if exc.expected else logging.WARNING
                log.log(level, f"{exc}; relisting in {delay:.1f} s", extra={"kv": {**self._kv, "retryIn": round(delay, 2)}})
            except Exception as exc:  # noqa: BLE001 - every failure backs off
                delay = self._backoff.next()
                if isinstance(exc, ApiError) and exc.retry_after:
                    delay = max(delay, exc.retry_after)
                self.last_error = _describe(exc, self)
                # A watch cache still filling (a CRD created a moment ago, an apiserver restart)
                # answers 429 "storage is (re)initializing" with a Retry-After: expected, not an error.
                level = logging.INFO if _initialising(exc) else logging.ERROR
                log.log(
                    level,
                    f"{self.last_error}; retrying in {delay:.1f} s",
                    extra={"kv": {**self._kv, "retryIn": round(delay, 2)}},
                )
            await asyncio.sleep(delay)

    async def _list_and_watch(self) -> None:
        """Sync the store, then watch until only a relist can help (raises ``_Relist``) or the
        pass fails (raises the error). Never returns."""
        if self.shard is not None and not self.shard_mode:
            await self._detect_shard_mode()
        streaming = self._streaming  # the current stream is a streaming list not yet synced
        rv_for_stream = self.store.resource_version
        if self._resume_watch:
            self._resume_watch = False  # only the ranges narrowed: the store is current at its RV
            streaming = False
        elif not streaming:
            await self._list()
        while True:
            self._events = 0
            self._stream_synced = False
            started = time.monotonic()
            ended: BaseException | None = None
            try:
                await self._watch(
                    initial=streaming, resource_version=rv_for_stream if streaming else self.store.resource_version
                )
            except (StreamIdle, StreamInterrupted, _Throttled, _Relist, ApiError) as exc:
                ended = exc
            if self._stream_synced:
                streaming = False  # the streaming list is in; that stream went on as the watch
            if self._events and not streaming:
                self.last_error = ""  # a watch delivered something: whatever failed before works
            elapsed = time.monotonic() - started
            if streaming:
                # the streaming list did not complete: refused, failed, or cut short
                if isinstance(ended, _Throttled):
                    await self._throttled(ended.retry_after)
                    continue
                expired = isinstance(ended, ApiError) and ended.status == 410
                if (expired or isinstance(ended, _Relist) and ended.expected) and rv_for_stream:
                    rv_for_stream = ""  # that resourceVersion is gone: a consistent snapshot instead
                    continue
                if isinstance(ended, ApiError) and self.list_mode == "auto" and _is_refusal(ended):
                    log.info(
                        f"The apiserver refused a streaming list ({ended.status}: {ended}); "
                        "using paginated LISTs for this informer from now on",
                        extra={"kv": self._kv},
                    )
                    self._streaming = streaming = False
                    await self._list()
                    continue
                raise ended or ApiError(0, "StreamingListIncomplete", "the streaming list ended before its last event")
            if ended is None:
                if self._events == 0 and elapsed < 1.0:
                    # client-go's VeryShortWatchError: a server that closes every watch at once
                    raise ApiError(0, "VeryShortWatch", "the watch closed immediately with no events")
                log.debug("Watch closed by the server, re-watching", extra={"kv": self._kv})
            elif isinstance(ended, StreamIdle):
                log.debug("Watch idle, re-watching", extra={"kv": self._kv})
            elif isinstance(ended, StreamInterrupted):
                if self._events == 0 and elapsed < 1.0:
                    # died before delivering anything: the request failed; the RV is still good
                    await self._throttled(None, ended)
                    continue
                log.info(f"Watch interrupted ({ended}), re-watching", extra={"kv": self._kv})
            elif isinstance(ended, _Throttled):
                await self._throttled(ended.retry_after)
            elif isinstance(ended, _Relist):
                raise ended
            elif isinstance(ended, ApiError):
                if ended.status == 410:
                    raise _Relist("Watch expired (410)", expected=True) from ended
                if ended.status in (0, 429):
                    # the watch request failed, the resourceVersion is still good: retry the watch
                    await self._throttled(ended.retry_after, ended)
                    continue
                raise ended

    async def _throttled(self, retry_after: float | None, exc: ApiError | None = None) -> None:
        delay = self._backoff.next()
        if retry_after:
            delay = max(delay, retry_after)
        if exc is not None:
            self.last_error = _describe(exc, self)
            level = logging.INFO if _initialising(exc) else logging.ERROR
            log.log(level, f"{self.last_error}; re-watching in {delay:.1f} s", extra={"kv": {**self._kv, "retryIn": round(delay, 2)}})
        else:
            log.warning(f"Watch throttled (429); re-watching in {delay:.1f} s", extra={"kv": {**self._kv, "retryIn": round(delay, 2)}})
        await asyncio.sleep(delay)

    # -- sharding -------------------------------------------------------------------------------

    async def _detect_shard_mode(self) -> None:
        """One LIST of at most one object with the shardSelector: ``shardInfo`` in the answer
        means the apiserver filters (server mode); its absence, or a 400/422 refusing the
        parameter, that it does not (client mode). Other failures raise (the pass backs off)."""
        assert self.shard is not None and not self.shard.empty
        params = {"limit": 1, "shardSelector": self.shard.selector}
        try:
            page = await self.transport.request("GET", self.path, params=params, timeout=60, lane="informer")
            served = bool((page.get("metadata") or {}).get("shardInfo"))
        except ApiError as exc:
            if exc.status not in (400, 422):
                raise
            served = False
        self.shard_mode = "server" if served else "client"
        if served:
            log.info("Sharded list and watch: the apiserver filters by shard", extra={"kv": self._kv})
        else:
            log.info(
                "Sharded list and watch: the apiserver does not filter (feature gate ShardedListAndWatch "
                "off, or Kubernetes before v1.36); filtering client-side, every event is received",
                extra={"kv": self._kv},
            )

    def _shard_params(self, params: dict[str, Any]) -> None:
        if self.shard is not None and self.shard_mode == "server":
            params["shardSelector"] = self.shard.selector

    def _outside(self, obj: dict[str, Any]) -> bool:
        """Whether the shard filter drops ``obj`` (counted; warned once in server mode)."""
        shard = self.shard
        if shard is None or shard.matches(obj):
            return False
        self.dropped += 1
        if self.shard_mode == "server" and not self._warned_unfiltered:
            self._warned_unfiltered = True
            log.warning(
                "The apiserver sent an object outside the shardSelector (was it restarted with the "
                "ShardedListAndWatch gate off?); dropping such objects client-side",
                extra={"kv": self._kv},
            )
        return True

    # -- sync: paginated LIST -------------------------------------------------------------------

    async def _list(self) -> None:
        # No cyclic collection while the cache grows page by page, nor while it is swapped in:
        # full passes over a growing heap are the long stalls (tens of ms at 10k objects,
        # seconds at 100k). _replace collects once and freezes the survivors.
        _pause_gc()
        try:
            items, rv = await self._list_pages()
            changes = await self._replace(items, rv, "paged")
            del items
        finally:
            _resume_gc()
        await self._emit_all(changes)

    async def _list_pages(self) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": self.page_size}
        if self.label_selector:
            params["labelSelector"] = self.label_selector
        if self.field_selector:
            params["fieldSelector"] = self.field_selector
        self._shard_params(params)
        accept = METADATA_LIST_ACCEPT if self.metadata_only else None
        rv = ""
        kind = self._kind
        api_version = self._api_version
        while True:
            try:
                page = await self.transport.request(
                    "GET", self.path, params=params, timeout=120, lane="informer", accept=accept
                )
            except ApiError as exc:
                if exc.status != 410 or "continue" not in params:
                    raise
                # the continue token outlived the compaction window: one full unpaged LIST
                # (client-go's pager FullListIfExpired) rather than paging from scratch forever
                log.info("List continue token expired; listing everything in one request", extra={"kv": self._kv})
                params.pop("continue")
                params.pop("limit")
                items.clear()
                page = await self.transport.request(
                    "GET", self.path, params=params, timeout=300, lane="informer", accept=accept
                )
            for item in page.get("items") or ():
                self.objects_listed += 1
                if self.shard is not None and self._outside(item):
                    continue
                # list items carry no kind/apiVersion; watch events do: make them alike
                item["kind"] = kind
                item["apiVersion"] = api_version
                items.append(item)
            meta = page.get("metadata") or {}
            del page
            if len(items) >= _CHUNK:
                _freeze()  # this page's objects, now, rather than all pages' at the end (a long stall)
            rv = meta.get("resourceVersion", rv)
            token = meta.get("continue")
            if not token or "limit" not in params:
                return items, rv
            params["continue"] = token

    async def _replace(self, items: list[dict[str, Any]], rv: str, mode: str) -> list[tuple[Any, Any]]:
        """Replace the store with ``items`` at ``rv`` (a sync); returns the changes to emit.

        The new content is computed aside in chunks of ``_CHUNK`` objects, yielding to the loop
        between them, each chunk's allocations collected and frozen (:func:`_freeze`); then it is
        swapped in at once (``Writer.begin_replace``): readers see the old store or the new one.
        Called with the cyclic GC paused."""
        big = not self.store.synced or len(items) > _CHUNK  # a small relist freezes nothing
        job = self._writer.begin_replace(items, rv)
        while not job.step(_CHUNK):
            _freeze()
            await asyncio.sleep(0)  # let watches, probes and workers run between chunks
        if big:
            _freeze()
        changes = job.commit()
        self._sync_owed = False
        self.lists += 1
        self.last_sync_mode = mode
        self.last_error = ""
        self.synced.set()
        return changes

    async def _emit_all(self, changes: list[Any]) -> None:
        """Emit a sync's changes in order, in chunks, dropping each pair once emitted: the old
        objects of a relist are freed chunk by chunk rather than all at once when the list goes
        (freeing 100k objects in one go is a ~100 ms stall). :meth:`set_shard` waits for it."""
        self._emitting += 1
        try:
            await self._emit_chunks(changes)
        finally:
            self._emitting -= 1
            if not self._emitting:
                self._calm.set()

    async def _emit_chunks(self, changes: list[Any]) -> None:
        for i in range(len(changes)):
            old, new = changes[i]
            changes[i] = None
            self.syncing = True
            try:
                self._emit(old, new)
            finally:
                self.syncing = False
            if i % _CHUNK == _CHUNK - 1:
                del old, new
                await asyncio.sleep(0)  # let watches, probes and workers run between chunks

    # -- watch (and streaming list) -------------------------------------------------------------

    async def _watch(self, *, initial: bool, resource_version: str) -> None:
        """Consume one watch stream until it ends. With ``initial`` it is a streaming list: the
        initial events are collected aside until the initial-events-end bookmark, swapped into
        the store (``_stream_synced`` becomes true), and the same stream goes on as the watch."""
        timeout_seconds = self.min_watch_timeout + int(random.random() * self.min_watch_timeout)
        params: dict[str, str] = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
        }
        if initial:
            params["sendInitialEvents"] = "true"
            params["resourceVersionMatch"] = "NotOlderThan"
        if self.label_selector:
            params["labelSelector"] = self.label_selector
        if self.field_selector:
            params["fieldSelector"] = self.field_selector
        self._shard_params(params)
        writer, store, kind = self._writer, self.store, self._kind
        sharded = self.shard is not None
        pending: list[dict[str, Any]] | None = [] if initial else None
        paused = False
        if initial:
            _pause_gc()
            paused = True
        warned_at = time.monotonic() + 10.0
        try:
            async for line in self.transport.stream(
                self.path,
                params,
                read_timeout=self.idle_timeout,
                total_timeout=timeout_seconds + 60.0,
                accept=METADATA_ACCEPT if self.metadata_only else None,
            ):
                self._events += 1
                try:
                    event = loads(line)
                    etype = event["type"]
                    obj = event["object"]
                    if etype == "ERROR":
                        self._error_event(obj)  # raises
                    meta = obj["metadata"]
                    rv = meta["resourceVersion"]
                    name = meta.get("name")
                except (ValueError, TypeError, KeyError, AttributeError) as exc:
                    self._skip(line, f"no {exc}" if isinstance(exc, KeyError) else str(exc))
                    continue
                if etype == "BOOKMARK":
                    if pending is not None:
                        if (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                            items, pending = pending, None
                            changes = await self._replace(items, rv, "stream")
                            del items
                            self._stream_synced = True
                            if paused:
                                _resume_gc()
                                paused = False
                            await self._emit_all(changes)
                            del changes
                        continue
                    store.resource_version = rv
                    continue
                if etype not in _WATCH_TYPES or not name or obj.get("kind", kind) != kind:
                    why = f"unexpected type {etype!r}" if etype not in _WATCH_TYPES else "unexpected object"
                    self._skip(line, why)
                    continue
                if pending is None:
                    self.events_received += 1
                else:
                    self.objects_listed += 1
                if sharded and self._outside(obj):
                    if pending is None:
                        store.resource_version = rv  # the watch moved on: resume after it
                    continue
                if pending is not None:
                    if etype == "DELETED":  # not part of the protocol; honoured all the same
                        gone = key_of(obj)
                        pending[:] = [o for o in pending if key_of(o) != gone]
                    else:  # a later event for the same key wins in Writer.replace
                        pending.append(obj)
                        if len(pending) % _CHUNK == 0:
                            _freeze()  # this chunk's objects, now, rather than all at the end
                    if time.monotonic() > warned_at:
                        warned_at = float("inf")
                        log.warning("Streaming list: no initial-events-end bookmark after 10 s yet", extra={"kv": self._kv})
                    continue
                if etype == "DELETED":
                    old = writer.delete(key_of(obj))
                    store.resource_version = rv
                    self._emit(old if old is not None else obj, None)
                else:  # ADDED / MODIFIED
                    old, new = writer.upsert(obj)
                    store.resource_version = rv
                    self._emit(old, new)
        finally:
            if paused:
                _resume_gc()

    def _error_event(self, obj: Any) -> None:
        status = obj if isinstance(obj, dict) else {}
        code = status.get("code") or 500
        message = status.get("message") or status.get("reason") or "watch error"
        if code == 429:
            details = status.get("details") or {}
            raise _Throttled(details.get("retryAfterSeconds"))
        if code == 410:
            raise _Relist(f"Watch expired (410: {message})", expected=True)
        raise _Relist(f"Watch ended with an error ({code} {status.get('reason') or ''}: {message})", expected=False)

    def _skip(self, line: bytes, why: str) -> None:
        # the line is not shown: it may be a Secret
        log.warning(f"Skipped a watch event ({why}; {len(line)} bytes, contents not shown)", extra={"kv": self._kv})


def _keeping_uid(fn: Transform) -> Transform:
    """``fn``, with ``metadata.uid`` put back if it dropped it: a uid-sharded informer hashes its
    cached objects again when its ranges change (transforms must keep name, namespace and
    resourceVersion anyway; the uid is kept for them)."""

    def transform(obj: Any) -> Any:
        uid = (obj.get("metadata") or {}).get("uid")
        out = fn(obj)
        meta = out.get("metadata") if isinstance(out, dict) else None
        if uid and isinstance(meta, dict) and "uid" not in meta:
            meta["uid"] = uid
        return out

    transform.__name__ = getattr(fn, "__name__", "transform")
    return transform


def _is_refusal(exc: ApiError) -> bool:
    """Whether a streaming-list request was refused as such (an old or configured-off apiserver
    answers 400/422 to ``sendInitialEvents``), rather than failing for a reason a paginated LIST
    would share (403, 404, 410, 429, 5xx, unreachable)."""
    return exc.status in (400, 405, 406, 415, 422, 501)


_gc_pauses = 0
_gc_was_enabled = True


def _pause_gc() -> None:
    """Disable the cyclic GC while any informer syncs (counted across informers).

    The first pause of a process that froze nothing yet collects and freezes the start-up heap
    (modules, the client): once, before any list arrives, so that the collection before every
    later freeze walks only what was allocated since (see :func:`_freeze`)."""
    global _gc_pauses, _gc_was_enabled
    if _gc_pauses == 0:
        _gc_was_enabled = gc.isenabled()
        gc.disable()
        if not gc.get_freeze_count():
            gc.collect()
            gc.freeze()
    _gc_pauses += 1


def _resume_gc() -> None:
    global _gc_pauses
    _gc_pauses -= 1
    if _gc_pauses == 0 and _gc_was_enabled:
        gc.enable()


#: objects per step of a sync: each page or chunk of streamed objects is collected and frozen,
#: and the new store content is computed in steps of this many objects, yielding in between
_CHUNK = 1000


def _freeze() -> None:
    """Keep what survived a sync out of the cyclic collector's future full passes (seconds at
    100k objects). Collect first: ``gc.freeze()`` moves *every* tracked object to the permanent
    generation, so a cycle that became garbage while the collector was paused would otherwise
    never be freed. Frozen objects are never walked again, so this full collection costs what
    was allocated since the previous freeze, not the heap. A sync calls it after every page or
    chunk of objects (about 1.3 µs per new object: ~1-2 ms a chunk), never once over the whole
    list (130 ms at 100k). Called with the GC paused: no automatic pass walks the new objects
    first."""
    gc.collect()
    gc.freeze()


def _initialising(exc: BaseException) -> bool:
    """The apiserver's watch cache for this resource is not ready yet (k8s.io/apiserver
    storage/cacher: ``TooManyRequests("storage is (re)initializing")`` with a Retry-After)."""
    return isinstance(exc, ApiError) and exc.status == 429 and "initializing" in str(exc)


def _describe(exc: BaseException, informer: Informer) -> str:
    r = informer.resource
    where = f" in namespace {informer.namespace}" if informer.namespace else " in all namespaces"
    if isinstance(exc, Forbidden):
        return (
            f"Forbidden: cannot list/watch {r.group_resource}{where}: {exc}; "
            f"grant the verbs get, list, watch on {r.group_resource} to this identity"
        )
    if isinstance(exc, NotFound):
        return f"{r.group_resource} is no longer served by the apiserver (404); was its CRD deleted?"
    if _initialising(exc):
        return f"the apiserver is still filling its watch cache for {r.group_resource} (429: {exc})"
    if isinstance(exc, ApiError) and exc.status == 429:
        return f"throttled by the apiserver (429) while watching {r.group_resource}"
    return f"list/watch of {r.group_resource} failed: {exc}"


class InformerPool:
    """Every informer of one manager, created on demand and shared: one per
    (resource, namespace, label selector, field selector, metadata only, shard key).

    A sharded informer (``shard=``) is keyed by its shard *key*, not its ranges: the ranges change
    over its life (:meth:`Informer.set_shard`), the informer stays. Asking again with other
    ranges returns the existing informer unchanged.

    ``namespaces`` is the operator's scope: empty means all namespaces (one cluster-wide informer
    per resource); otherwise one informer per listed namespace for namespaced resources.

    Informers are created on the loop only; :meth:`existing` is also called from handler threads
    (cache reads) and reads an immutable snapshot that the loop replaces, never changes, when it
    adds an informer — so a reader never iterates a dict that is growing.

    Each informer's objects go through one transform before its store: the resource's entry in
    ``transforms`` (a user's, guarded by :func:`~declop.cache.store.guarded`) or else the pool's default
    ``transform`` (:func:`~declop.cache.store.strip_managed_fields`).
    """

    def __init__(
        self,
        transport: Transport,
        *,
        namespaces: tuple[str, ...] = (),
        transform: Transform | None = strip_managed_fields,
        list_mode: ListMode = "auto",
    ) -> None:
        self.transport = transport
        self.namespaces = tuple(namespaces)
        self.transform = transform
        self.list_mode = list_mode
        self._informers: dict[tuple[str, str, str, str, bool, str], Informer] = {}
        self._all: tuple[Informer, ...] = ()  # the same informers; copy-on-write, read from any thread
        # group_resource -> its unfiltered informers, full ones first; copy-on-write, read from any thread
        self._unfiltered: dict[str, tuple[Informer, ...]] = {}
        #: group_resource -> the user's transform for it (replaces the default)
        self.transforms: dict[str, Transform] = {}
        self._started = False
        self.indexers: dict[str, dict[str, Any]] = {}

    def scope(self, resource: ResourceInfo, namespaces: tuple[str, ...] | None = None) -> tuple[str, ...]:
        if not resource.namespaced:
            return ("",)
        chosen = self.namespaces if namespaces is None else namespaces
        return tuple(chosen) or ("",)

    def get(
        self,
        resource: ResourceInfo,
        namespace: str = "",
        label_selector: str = "",
        *,
        field_selector: str = "",
        metadata_only: bool = False,
        shard: ShardFilter | None = None,
    ) -> Informer:
        """The shared informer for these settings, created (and started, if the pool runs) on first use."""
        key = (
            resource.group_resource,
            namespace if resource.namespaced else "",
            label_selector,
            field_selector,
            metadata_only,
            shard.key if shard is not None else "",
        )
        informer = self._informers.get(key)
        if informer is None:
            informer = Informer(
                self.transport,
                resource,
                namespace=key[1],
                label_selector=label_selector,
                field_selector=field_selector,
                metadata_only=metadata_only,
                transform=self.transforms.get(resource.group_resource, self.transform),
                list_mode=self.list_mode,
                shard=shard,
            )
            for name, fn in self.indexers.get(resource.group_resource, {}).items():
                informer.store.add_indexer(name, fn)
            self._informers[key] = informer
            self._all = (*self._all, informer)
            if not label_selector and not field_selector:
                gr = resource.group_resource
                both = (*self._unfiltered.get(gr, ()), informer)
                order = lambda i: (i.metadata_only, i.shard is not None)  # noqa: E731
                self._unfiltered = {**self._unfiltered, gr: tuple(sorted(both, key=order))}
            if self._started:
                informer.start()
        return informer

    def for_resource(
        self,
        resource: ResourceInfo,
        namespaces: tuple[str, ...] | None = None,
        label_selector: str = "",
        *,
        field_selector: str = "",
        metadata_only: bool = False,
        shard: ShardFilter | None = None,
    ) -> list[Informer]:
        return [
            self.get(resource, ns, label_selector, field_selector=field_selector, metadata_only=metadata_only, shard=shard)
            for ns in self.scope(resource, namespaces)
        ]

    def existing(self, resource: ResourceInfo) -> list[Informer]:
        """Unfiltered informers of ``resource`` that exist already (no creation). Thread-safe.

        One kind of informer, the first there is of: full, full sharded (by one shard key),
        metadata-only, metadata-only sharded. Cache reads of a resource cached only as metadata
        return metadata; of a sharded one, only the owned objects. One kind only, so that a
        list never returns an object twice."""
        informers = self._unfiltered.get(resource.group_resource, ())
        if not informers:
            return []
        first = informers[0]
        kind = (first.metadata_only, first.shard.key if first.shard is not None else "")
        return [i for i in informers if (i.metadata_only, i.shard.key if i.shard is not None else "") == kind]

    def add_indexer(self, resource: ResourceInfo, name: str, fn: Any) -> None:
        self.indexers.setdefault(resource.group_resource, {})[name] = fn
        for informer in self._informers.values():
            if informer.resource.group_resource == resource.group_resource:
                informer.store.add_indexer(name, fn)

    def start(self) -> None:
        self._started = True
        for informer in self._informers.values():
            informer.start()

    async def stop(self) -> None:
        self._started = False
        await asyncio.gather(*(i.stop() for i in self._informers.values()))

    def __iter__(self) -> Any:
        """Every informer, as a snapshot (safe from any thread, e.g. a metrics scrape)."""
        return iter(self._all)

    def all_synced(self) -> bool:
        return all(i.store.synced for i in self._informers.values())
