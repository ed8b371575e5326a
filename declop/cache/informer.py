"""Informer: keeps one :class:`~declop.cache.store.Store` in sync with the apiserver by list + watch.

One informer per (resource, namespace, label selector), shared by every controller that needs it
(:class:`InformerPool`). The loop is client-go's reflector (``tools/cache/reflector.go``), in
asyncio; one pass of it is a *ListAndWatch*: sync the store (a streaming list, or paginated
LISTs), then watch from the synced resourceVersion; a watch that was working and ends re-watches
at once; a pass ends with a relist after a backoff.

This module owns the :class:`Informer` itself — its state, its subscribers, starting and stopping
it — and the pool. The Informer is made of parts, each in its own module:

- :mod:`declop.cache.listing`: the list strategies (streaming, paginated, metadata-only, the
  fallback between them) and the sync that swaps their result into the store;
- :mod:`declop.cache.watch`: the loop, the watch stream, and the rules for how a stream or a
  pass ends (resume, 410 → relist, bookmarks, idle and interrupted streams);
- :mod:`declop.cache.backoff`: the delay before every relist and retried watch request;
- :mod:`declop.cache.sharding`: server- or client-side shard filtering, and range changes
  (:meth:`Informer.set_shard`).

Every name these parts export that the informer's users need is importable from here too.

Invariants:
- events reach subscribers in the order the store applied them, after the store changed;
- subscribers are called on the event loop and must not block (they only enqueue keys); a
  subscriber that raises is logged and the others still get the event;
- a late subscriber gets the cache replayed as additions (with ``syncing`` set) before any
  later change;
- an informer that owns no shard range lists and watches nothing: its store is empty and synced;
- one informer per (resource, namespace, label selector, field selector, metadata only, shard
  key) in a pool; the pool's informer list is replaced, never changed, so any thread may read it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Literal

from declop.cache.backoff import Backoff as Backoff
from declop.cache.listing import INITIAL_EVENTS_END as INITIAL_EVENTS_END
from declop.cache.listing import LIST_MODES as LIST_MODES
from declop.cache.listing import METADATA_ACCEPT as METADATA_ACCEPT
from declop.cache.listing import METADATA_API_VERSION, METADATA_KIND, Listing
from declop.cache.listing import METADATA_LIST_ACCEPT as METADATA_LIST_ACCEPT
from declop.cache.listing import ListMode as ListMode
from declop.cache.sharding import ShardChange as ShardChange
from declop.cache.sharding import ShardFiltering, keeping_uid
from declop.cache.sharding import ShardMode as ShardMode
from declop.cache.store import Store, Transform, Writer, strip_managed_fields
from declop.cache.watch import Watching
from declop.kube.discovery import ResourceInfo
from declop.kube.transport import Transport
from declop.leases.hashing import ShardFilter

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


class Informer(Watching, Listing, ShardFiltering):
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
        self._kind = METADATA_KIND if metadata_only else resource.kind
        self._api_version = METADATA_API_VERSION if metadata_only else resource.api_version
        self.store = Store(self.name)
        if shard is not None and shard.key == "uid" and transform is not None:
            transform = keeping_uid(transform)  # set_shard hashes cached objects again
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

    @property
    def path(self) -> str:
        return self.resource.path(namespace=self.namespace or None)

    def _emit(self, old: Any, new: Any) -> None:
        for handler in self._subscribers:
            try:
                handler(old, new)
            except Exception:  # a subscriber bug must not kill the informer
                log.exception("Event handler failed", extra={"kv": self._kv})



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
