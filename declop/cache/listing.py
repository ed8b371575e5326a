"""Listing: how an informer syncs — gets every object once — and swaps the result into its store.

Owns the list strategies and what every sync ends with:

- the *list modes* (:data:`ListMode`): ``"stream"``, a streaming list; ``"paged"``, paginated
  LISTs; ``"auto"`` (the default), a streaming list wherever the apiserver accepts it and
  paginated LISTs for good, logged once, after a refusal (:func:`is_refusal` says what counts);
- the *streaming list*'s protocol: one watch with ``sendInitialEvents=true``,
  ``resourceVersionMatch=NotOlderThan`` and bookmarks, whose initial ADDED events end with the
  BOOKMARK annotated :data:`INITIAL_EVENTS_END`. The stream is the watch's, so its events are
  read by :meth:`~declop.cache.watch.Watching._watch`, and the fallbacks between the strategies
  (410 → a consistent snapshot, a refusal → paged) are rules of the pass
  (:meth:`~declop.cache.watch.Watching._list_and_watch`);
- the *paginated LIST* (:class:`Listing`): pages of ``page_size``; an expired continue token
  (410 on a later page) falls back to one full unpaged LIST (client-go's pager,
  ``FullListIfExpired``) rather than paging from scratch forever;
- *metadata-only* listing: :data:`METADATA_LIST_ACCEPT` / :data:`METADATA_ACCEPT`, and the
  kind and apiVersion (:data:`METADATA_KIND`, :data:`METADATA_API_VERSION`) of what comes back;
- the *sync* itself, for both strategies: :meth:`Listing._replace` computes the new store content
  aside and swaps it in, :meth:`Listing._emit_all` emits the changes against the old content,
  deletions synthesised for keys that vanished;
- the size of a sync's steps (:data:`CHUNK`); the collector is paused during a sync and while
  its changes are emitted (:mod:`declop.collector`).

Invariants:
- a sync swaps the new content into the store in one step, computed aside in chunks of
  :data:`CHUNK` objects with the loop running in between; no step of a sync walks or builds more
  than a chunk of objects, and its changes are emitted :data:`EMIT_STEP` at a time;
- list items get the kind and apiVersion of watch events, so the store holds one shape;
- the synced resourceVersion is the list's ``metadata.resourceVersion`` (or the end bookmark's),
  never an item's;
- the cyclic GC is paused while any informer syncs and while more than a chunk of a sync's
  changes is emitted, and the garbage of that time is collected before the heap is frozen
  (after every page or chunk): nothing is pinned but what survives;
- a change of shard ranges (:meth:`~declop.cache.sharding.ShardFiltering.set_shard`) waits while
  a sync's changes are emitted: ``_emitting`` counts such emissions, ``_calm`` is set when none is.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Literal

from declop import collector
from declop.cache.store import Store, Writer
from declop.errors import ApiError
from declop.kube.transport import Transport
from declop.leases.hashing import ShardFilter

__all__ = [
    "CHUNK",
    "EMIT_STEP",
    "INITIAL_EVENTS_END",
    "LIST_MODES",
    "METADATA_ACCEPT",
    "METADATA_API_VERSION",
    "METADATA_KIND",
    "METADATA_LIST_ACCEPT",
    "ListMode",
    "Listing",
    "is_refusal",
]

log = logging.getLogger("declop.informer")

#: how an informer syncs: streaming list with fallback (default), streaming only, paginated LIST only
ListMode = Literal["auto", "stream", "paged"]
LIST_MODES: tuple[str, ...] = ("auto", "stream", "paged")

#: the annotation on the bookmark that ends the initial events of a streaming list
INITIAL_EVENTS_END = "k8s.io/initial-events-end"

#: what a metadata-only informer accepts: the apiserver answers each object (watch events) or the
#: list as ``PartialObjectMetadata``(``List``) of ``meta.k8s.io/v1``, metadata only
METADATA_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
METADATA_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
METADATA_KIND, METADATA_API_VERSION = "PartialObjectMetadata", "meta.k8s.io/v1"

#: objects per step of a sync: each page or chunk of streamed objects is collected and frozen,
#: and the new store content is computed in steps of this many objects, yielding in between
CHUNK = 1000

#: changes a sync emits between two yields to the loop: a subscriber's work per change (a
#: controller's predicates and queue) is ~50 µs at 100k keys on a busy machine, so a whole
#: CHUNK at once was a 40-60 ms stall
EMIT_STEP = 250


class Listing:
    """The paginated LIST and the sync of :class:`~declop.cache.informer.Informer` (a part of it,
    not used alone)."""

    # the informer's state this part reads or writes (set in Informer.__init__)
    transport: Transport
    store: Store
    _writer: Writer
    _kv: dict[str, str]
    label_selector: str
    field_selector: str
    metadata_only: bool
    page_size: int
    _kind: str
    _api_version: str
    shard: ShardFilter | None
    objects_listed: int
    lists: int
    last_sync_mode: str
    last_error: str
    synced: asyncio.Event
    syncing: bool
    _sync_owed: bool
    _emitting: int
    _calm: asyncio.Event

    if TYPE_CHECKING:  # defined by the Informer and its other parts

        @property
        def path(self) -> str: ...

        def _emit(self, old: Any, new: Any) -> None: ...

        def _shard_params(self, params: dict[str, Any]) -> None: ...

        def _outside(self, obj: dict[str, Any]) -> bool: ...

    async def _list(self) -> None:
        # No cyclic collection while the cache grows page by page, nor while it is swapped in:
        # full passes over a growing heap are the long stalls (tens of ms at 10k objects,
        # seconds at 100k). _replace collects once and freezes the survivors.
        collector.pause()
        try:
            items, rv = await self._list_pages()
            changes = await self._replace(items, rv, "paged")
            del items
        finally:
            collector.resume()
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
            if len(items) >= CHUNK:
                collector.freeze()  # this page's objects, now, rather than all pages' at the end (a long stall)
            rv = meta.get("resourceVersion", rv)
            token = meta.get("continue")
            if not token or "limit" not in params:
                return items, rv
            params["continue"] = token

    async def _replace(self, items: list[dict[str, Any]], rv: str, mode: str) -> list[tuple[Any, Any]]:
        """Replace the store with ``items`` at ``rv`` (a sync); returns the changes to emit.

        The new content is computed aside in chunks of ``CHUNK`` objects, yielding to the loop
        between them, each chunk's allocations collected and frozen (:func:`declop.collector.freeze`); then it is
        swapped in at once (``Writer.begin_replace``): readers see the old store or the new one.
        Called with the cyclic GC paused."""
        big = not self.store.synced or len(items) > CHUNK  # a small relist freezes nothing
        job = self._writer.begin_replace(items, rv)
        while not job.step(CHUNK):
            collector.freeze()
            await asyncio.sleep(0)  # let watches, probes and workers run between chunks
        if big:
            collector.freeze()
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
        (freeing 100k objects in one go is a ~100 ms stall). :meth:`set_shard` waits for it.

        More than a chunk of changes is emitted with the collector paused, and what each chunk
        left (the queue's entries for its keys, above all) is frozen after it, as a sync's
        objects are: otherwise the queue growing by 100k entries sets off full passes over all
        of them while workers run (100-200 ms stalls, bench/FINDINGS.md)."""
        big = len(changes) > CHUNK
        self._emitting += 1
        if big:
            collector.pause()
        try:
            await self._emit_chunks(changes, big)
        finally:
            if big:
                collector.resume()
            self._emitting -= 1
            if not self._emitting:
                self._calm.set()

    async def _emit_chunks(self, changes: list[Any], freeze: bool) -> None:
        for i in range(len(changes)):
            old, new = changes[i]
            changes[i] = None
            self.syncing = True
            try:
                self._emit(old, new)
            finally:
                self.syncing = False
            if i % EMIT_STEP == EMIT_STEP - 1:
                del old, new
                if freeze and i % CHUNK == CHUNK - 1:
                    collector.freeze()
                await asyncio.sleep(0)  # let watches, probes and workers run between steps
        if freeze:
            collector.freeze()


def is_refusal(exc: ApiError) -> bool:
    """Whether a streaming-list request was refused as such (an old or configured-off apiserver
    answers 400/422 to ``sendInitialEvents``), rather than failing for a reason a paginated LIST
    would share (403, 404, 410, 429, 5xx, unreachable)."""
    return exc.status in (400, 405, 406, 415, 422, 501)


