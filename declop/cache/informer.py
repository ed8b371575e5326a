"""Informer: keeps one :class:`~declop.cache.store.Store` in sync with the apiserver by list + watch.

One informer per (resource, namespace, label selector), shared by every controller that needs it
(:class:`InformerPool`). The :class:`Informer` owns its store, its subscribers and its task, and
is made of parts it composes, each readable and testable alone:

- :class:`~declop.cache.watch.ListWatch`: the list/watch loop, a state machine with one step
  function (:mod:`declop.cache.watch`), retrying with a :class:`~declop.cache.backoff.Backoff`;
- :class:`~declop.cache.listing.Sync`: the paginated LIST and the swap-in and emission of
  every sync (:mod:`declop.cache.listing`);
- :class:`~declop.cache.sharding.ShardScope`: the shard filter, a value the list and watch
  consult; :meth:`Informer.set_shard` changes its ranges;
- :class:`~declop.cache.stats.InformerStats`: its counters.

Every name these parts export that the informer's users need is importable from here too.

Invariants:
- events reach subscribers in the order the store applied them, after the store changed;
- subscribers are called on the event loop and must not block (they only enqueue keys); a
  subscriber that raises is logged and the others still get the event;
- ``syncing`` is true exactly while subscribers receive a sync's changes (the initial list, a
  relist, or the replay of the cache to a late subscriber);
- a late subscriber gets the cache replayed as additions before any later change;
- an informer that owns no shard range lists and watches nothing: its store is empty, and it is
  synced once one LIST of at most one object succeeded (:meth:`Informer._may_list`) — a replica
  that may not list the resource must not look synced, or it would take ranges it can never list;
- a range change never cuts short a sync whose changes are being emitted, and range changes
  take effect one after the other, in call order; ranges only narrowed: no sync (the watch
  resumes from the store's resourceVersion); a range gained: a sync, owed until one completes,
  even across later changes;
- one informer per (resource, namespace, label selector, field selector, metadata only, shard
  key) in a pool; the pool's informer list is replaced, never changed, so any thread may read it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Iterable, Literal

from declop import collector
from declop.cache.backoff import Backoff as Backoff
from declop.cache.listing import INITIAL_EVENTS_END as INITIAL_EVENTS_END
from declop.cache.listing import LIST_MODES as LIST_MODES
from declop.cache.listing import METADATA_ACCEPT as METADATA_ACCEPT
from declop.cache.listing import METADATA_LIST_ACCEPT as METADATA_LIST_ACCEPT
from declop.cache.listing import ListMode as ListMode
from declop.cache.listing import Query, Sync, may_list
from declop.cache.sharding import ShardChange as ShardChange
from declop.cache.sharding import ShardMode as ShardMode
from declop.cache.sharding import ShardScope, keeping_uid, release
from declop.cache.stats import InformerStats as InformerStats
from declop.cache.store import Store, Transform, Writer, strip_managed_fields
from declop.cache.watch import EMPTY, WATCHING, ListWatch
from declop.kube.discovery import ResourceInfo
from declop.kube.transport import Transport
from declop.leases.hashing import ShardFilter, ShardRange, difference

__all__ = [
    "INITIAL_EVENTS_END",
    "LIST_MODES",
    "METADATA_ACCEPT",
    "METADATA_LIST_ACCEPT",
    "Backoff",
    "EventHandler",
    "Informer",
    "InformerPool",
    "InformerStats",
    "ListMode",
    "ShardChange",
    "ShardMode",
    "all_synced",
]

log = logging.getLogger("declop.informer")

#: subscriber signature: (old, new); old is None for an addition, new is None for a deletion.
EventHandler = Callable[[Any, Any], None]


async def all_synced(gates: Iterable[asyncio.Event], timeout: float | None) -> None:
    """Wait until every sync gate (an informer's or a controller's ``synced``) is set; raise
    :class:`asyncio.TimeoutError` after ``timeout`` seconds (None: no bound).

    Invariant: a wait that ends early leaves nothing to report. Cancelled (a stop before the
    caches synced, possibly cancelled twice: the stop, then the loss's deadline), the gather it
    waited on may end only after the wait returned; its CancelledError is then retrieved when it
    ends, not logged by the collector as "_GatheringFuture exception was never retrieved" with a
    traceback on stderr, outside the operator's structured log."""
    waiting = asyncio.gather(*(gate.wait() for gate in gates))
    try:
        await asyncio.wait_for(waiting, timeout)
    finally:
        if not waiting.done():
            waiting.add_done_callback(collector.retrieved)
        elif not waiting.cancelled():
            waiting.exception()



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
        #: what it lists and watches
        self.query = Query(resource, namespace if resource.namespaced else "", label_selector, field_selector, metadata_only)
        where = f" in {self.query.namespace}" if self.query.namespace else ""
        how = [*([label_selector] if label_selector else []), *([field_selector] if field_selector else [])]
        how += ["metadata only"] if metadata_only else []
        how += [f"sharded by {shard.key}"] if shard is not None else []
        sel = f" ({'; '.join(how)})" if how else ""
        self.name = f"{resource.group_resource}{where}{sel}"
        self._kv = {"informer": self.name}
        self.store = Store(self.name)
        if shard is not None and shard.key == "uid" and transform is not None:
            transform = keeping_uid(transform)  # set_shard hashes cached objects again
        self._writer = Writer(self.store, transform)
        self.stats = InformerStats()
        # "client" from the start with shard_filtering="client" (no detection: to compare both
        # modes on one apiserver), else detected by the first pass
        mode: ShardMode = "client" if shard is not None and shard_filtering == "client" else ""
        self._scope = ShardScope(shard, mode, self.stats, self._kv)
        self.synced = asyncio.Event()
        #: True while subscribers receive a sync's changes (the initial list, a relist, or the
        #: replay of the cache to a late subscriber): controllers give such keys low priority
        self.syncing = False
        self._subscribers: list[EventHandler] = []
        sync = Sync(transport, self.query, self._writer, self._scope, self.stats, self._emit_listed, self.synced, page_size=page_size, kv=self._kv)
        #: the list/watch loop
        self.listwatch = ListWatch(
            transport, self.query, self._writer, self._scope, self.stats, sync, self._emit,
            list_mode=list_mode, backoff=backoff, idle_timeout=idle_timeout, min_watch_timeout=min_watch_timeout, kv=self._kv,
        )
        self._task: asyncio.Task[None] | None = None
        self._probe: asyncio.Task[None] | None = None  # owning no range at start: may we list?
        self._resharding = asyncio.Lock()
        # stats.lists at the last range change that needed a sync: one is owed until it moves on
        self._owed_at = -1

    # -- what it lists and watches, and its counters ---------------------------------------------

    @property
    def resource(self) -> ResourceInfo:
        return self.query.resource

    @property
    def namespace(self) -> str:
        return self.query.namespace

    @property
    def label_selector(self) -> str:
        return self.query.label_selector

    @property
    def field_selector(self) -> str:
        return self.query.field_selector

    @property
    def metadata_only(self) -> bool:
        """Lists and watches PartialObjectMetadata: the store holds metadata only."""
        return self.query.metadata_only

    @property
    def lists(self) -> int:
        """Completed syncs (1 + relists), streaming or paginated."""
        return self.stats.lists

    @property
    def last_sync_mode(self) -> str:
        """How the last sync was done: "stream" or "paged"."""
        return self.stats.last_sync_mode

    @property
    def last_error(self) -> str:
        """The last list or watch failure; "" once one works again."""
        return self.stats.last_error

    @property
    def events_received(self) -> int:
        return self.stats.events_received

    @property
    def objects_listed(self) -> int:
        return self.stats.objects_listed

    @property
    def dropped(self) -> int:
        return self.stats.dropped

    @property
    def released(self) -> int:
        return self.stats.released

    @property
    def path(self) -> str:
        return self.query.path

    @property
    def list_mode(self) -> ListMode:
        return self.listwatch.list_mode

    @property
    def page_size(self) -> int:
        return self.listwatch.sync.page_size

    @property
    def min_watch_timeout(self) -> int:
        return self.listwatch.min_watch_timeout

    @property
    def idle_timeout(self) -> float:
        """Seconds of silence after which a watch is re-opened (the next watch's)."""
        return self.listwatch.idle_timeout

    @idle_timeout.setter
    def idle_timeout(self, value: float) -> None:
        self.listwatch.idle_timeout = value

    @property
    def shard(self) -> ShardFilter | None:
        """The owned ranges (None: not sharded); change them with :meth:`set_shard` only."""
        return self._scope.filter

    @property
    def shard_mode(self) -> ShardMode:
        """How a sharded informer filters: "server", "client", or "" until its first pass."""
        return self._scope.mode

    @shard_mode.setter
    def shard_mode(self, mode: ShardMode) -> None:
        self._scope.mode = mode

    # -- subscribers -----------------------------------------------------------------------------

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

    def _emit(self, old: Any, new: Any) -> None:
        """A change a watch applied, to every subscriber."""
        for handler in self._subscribers:
            try:
                handler(old, new)
            except Exception:  # a subscriber bug must not kill the informer
                log.exception("Event handler failed", extra={"kv": self._kv})

    def _emit_listed(self, old: Any, new: Any) -> None:
        """A change of a sync, to every subscriber, with ``syncing`` set."""
        self.syncing = True
        try:
            for handler in self._subscribers:
                try:
                    handler(old, new)
                except Exception:  # a subscriber bug must not kill the informer
                    log.exception("Event handler failed", extra={"kv": self._kv})
        finally:
            self.syncing = False

    # -- running ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            if self.shard is not None and self.shard.empty:
                if self.synced.is_set():
                    self._own_nothing()
                elif self._probe is None or self._probe.done():
                    self._probe = asyncio.get_running_loop().create_task(self._may_list(), name=f"informer {self.name} probe")
                return
            self._stop_probe()
            self._task = asyncio.get_running_loop().create_task(self.listwatch.run(), name=f"informer {self.name}")

    async def _may_list(self) -> None:
        """Owning no range at start: the empty store is synced once :func:`~declop.cache.listing.may_list`
        succeeded — a replica refused the list (RBAC) stays unsynced and takes no range."""
        await may_list(self.transport, self.query, self.stats, self.listwatch.backoff, self._kv)
        if self._task is None and self.shard is not None and self.shard.empty:
            self._own_nothing()

    def _stop_probe(self) -> None:
        if self._probe is not None:
            if not self._probe.done():
                self._probe.cancel()
            self._probe = None

    async def stop(self) -> None:
        self._stop_probe()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
            self.listwatch.state = EMPTY  # a restart syncs

    def _own_nothing(self) -> None:
        """No owned ranges: nothing to list or watch; the store is (silently) empty and synced."""
        for key in self.store.keys():
            self._writer.delete(key)
        if not self.store.synced:
            self._writer.replace([], self.store.resource_version)
        self.synced.set()

    # -- shard ranges ----------------------------------------------------------------------------

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
        old = self._scope.filter
        assert old is not None
        new = old.with_ranges(ranges)
        gained = difference(new.ranges, old.ranges)
        if new == old:
            return ShardChange((), (), False)
        sync = self.listwatch.sync
        while sync.emitting:
            sync.calm.clear()
            await sync.calm.wait()
        running = self._task is not None
        if running:
            await self.stop()
        self._scope.filter = new
        gone = release(self.store, self._writer, new)
        self.stats.released += len(gone)
        # a sync still owed to an earlier gain (cut short by this change) is owed still
        owed = self._owed_at == self.stats.lists
        relist = bool(gained) or owed or not self.store.synced or not self.store.resource_version
        self._owed_at = self.stats.lists if relist and not new.empty else -1
        self.listwatch.state = EMPTY if relist else WATCHING
        log.info(
            f"Shard ranges changed: now {new}; {len(gone)} objects released"
            + (", re-listing for the gained ranges" if relist and not new.empty else ""),
            extra={"kv": {**self._kv, "released": len(gone), "gained": len(gained)}},
        )
        if running:
            self.start()
        return ShardChange(tuple(gone), gained, relist and not new.empty)


# size: the Informer is already its parts composed (listing, watch, sharding, store, stats: one
# module each); what is left is its read-through properties and the pool, which stays here.
# The pool stays in this module rather than one of its own: callers import InformerPool from
# here, and a pool module (which needs the Informer) could not be imported back by this one
# without an import cycle (tests/test_layers.py).
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
        # group_resource -> who is told of each of its unfiltered informers (:meth:`follow_unfiltered`)
        self._followers: dict[str, list[Callable[[Informer], None]]] = {}
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
                for follow in self._followers.get(gr, ()):
                    follow(informer)
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

    def follow_unfiltered(self, resource: ResourceInfo, follow: Callable[[Informer], None]) -> None:
        """Call ``follow`` with every unfiltered informer of ``resource``: those there are now, and
        each one created later, as it is created (before it starts). On the loop only."""
        self._followers.setdefault(resource.group_resource, []).append(follow)
        for informer in self._unfiltered.get(resource.group_resource, ()):
            follow(informer)

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
