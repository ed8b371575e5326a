"""Listing: what an informer asks for, and its *sync* — every object once, swapped into the store.

Owns the list modes (:data:`ListMode`; :func:`is_refusal` says when ``"auto"`` falls back to
paginated LISTs), the metadata-only media types and kind, :class:`Query` (the resource,
namespace, selectors and media type of every request an informer makes), and :class:`Sync`:
the paginated LIST (pages of ``page_size``; an expired continue token falls back to one full
unpaged LIST, client-go's ``FullListIfExpired``) and what every sync ends with, a streaming
list's included: the new content computed aside, swapped in, and its changes emitted. The
streaming list's protocol and the GC pauses are explained in docs/list-and-watch.md.

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
- ``emitting`` counts the syncs whose changes are being emitted and ``calm`` is set when there
  is none: a change of shard ranges waits for it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Callable, Literal

from declop import collector
from declop.cache.backoff import Backoff
from declop.cache.sharding import ShardScope
from declop.cache.stats import InformerStats
from declop.cache.store import Store, Writer
from declop.errors import ApiError
from declop.kube.discovery import ResourceInfo
from declop.kube.transport import Transport

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
    "Query",
    "Sync",
    "is_refusal",
    "may_list",
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

#: changes a sync emits between two yields to the loop (each change costs its subscribers work:
#: a whole CHUNK at once would stall the loop)
EMIT_STEP = 250


def is_refusal(exc: ApiError) -> bool:
    """Whether a streaming-list request was refused as such (an old or configured-off apiserver
    answers 400/422 to ``sendInitialEvents``), rather than failing for a reason a paginated LIST
    would share (403, 404, 410, 429, 5xx, unreachable)."""
    return exc.status in (400, 405, 406, 415, 422, 501)


@dataclass(frozen=True)
class Query:
    """What one informer lists and watches: a resource, in one namespace ("" for all), with
    label and field selectors, whole or metadata only."""

    resource: ResourceInfo
    namespace: str = ""
    label_selector: str = ""
    field_selector: str = ""
    metadata_only: bool = False

    @property
    def path(self) -> str:
        return self.resource.path(namespace=self.namespace or None)

    @property
    def kind(self) -> str:
        """The kind of what the apiserver sends: the resource's, or PartialObjectMetadata."""
        return METADATA_KIND if self.metadata_only else self.resource.kind

    @property
    def api_version(self) -> str:
        return METADATA_API_VERSION if self.metadata_only else self.resource.api_version

    def selectors(self, params: dict[str, Any]) -> None:
        """Add the label and field selectors to a request's parameters."""
        if self.label_selector:
            params["labelSelector"] = self.label_selector
        if self.field_selector:
            params["fieldSelector"] = self.field_selector


class Sync:
    """The syncs of one informer's store: the paginated LIST, and the swap-in and emission that
    end every sync. Changes are emitted through ``emit`` (the informer's subscribers, told it is a
    sync); ``synced`` is set by the first sync."""

    def __init__(
        self,
        transport: Transport,
        query: Query,
        writer: Writer,
        scope: ShardScope,
        stats: InformerStats,
        emit: Callable[[Any, Any], None],
        synced: asyncio.Event,
        *,
        page_size: int,
        kv: dict[str, str],
    ) -> None:
        self.transport = transport
        self.query = query
        self.writer = writer
        self.store: Store = writer.store
        self.scope = scope
        self.stats = stats
        self.emit = emit
        self.synced = synced
        self.page_size = page_size
        self._kv = kv
        #: syncs whose changes are being emitted (not to be cut short by a range change)
        self.emitting = 0
        #: set when ``emitting`` is 0
        self.calm = asyncio.Event()
        self.calm.set()

    async def list(self) -> None:
        """A sync by paginated LISTs. The cyclic GC is paused while the pages arrive and while
        they are swapped in; :meth:`replace` collects once and freezes the survivors."""
        collector.pause()
        try:
            items, rv = await self._pages()
            changes = await self.replace(items, rv, "paged")
            del items
        finally:
            collector.resume()
        await self.emit_all(changes)

    async def _pages(self) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": self.page_size}
        query, scope, stats = self.query, self.scope, self.stats
        query.selectors(params)
        scope.params(params)
        accept = METADATA_LIST_ACCEPT if query.metadata_only else None
        path, kind, api_version = query.path, query.kind, query.api_version
        sharded = scope.filter is not None
        rv = ""
        while True:
            try:
                page = await self.transport.request("GET", path, params=params, timeout=120, lane="informer", accept=accept)
            except ApiError as exc:
                if exc.status != 410 or "continue" not in params:
                    raise
                # the continue token outlived the compaction window: one full unpaged LIST
                # (client-go's pager FullListIfExpired) rather than paging from scratch forever
                log.info("List continue token expired; listing everything in one request", extra={"kv": self._kv})
                params.pop("continue")
                params.pop("limit")
                items.clear()
                page = await self.transport.request("GET", path, params=params, timeout=300, lane="informer", accept=accept)
            for item in page.get("items") or ():
                stats.objects_listed += 1
                if sharded and scope.outside(item):
                    continue
                # list items carry no kind/apiVersion; watch events do: make them alike
                item["kind"] = kind
                item["apiVersion"] = api_version
                items.append(item)
            meta = page.get("metadata") or {}
            del page
            if len(items) >= CHUNK:
                collector.freeze()  # this page's objects, now, rather than all pages' at the end
            rv = meta.get("resourceVersion", rv)
            token = meta.get("continue")
            if not token or "limit" not in params:
                return items, rv
            params["continue"] = token

    async def replace(self, items: list[dict[str, Any]], rv: str, mode: str) -> list[tuple[Any, Any]]:
        """Replace the store with ``items`` at ``rv``; returns the changes to emit.

        The new content is computed aside in chunks of ``CHUNK`` objects, yielding to the loop
        between them, each chunk's allocations collected and frozen (:func:`declop.collector.freeze`);
        then it is swapped in at once (``Writer.begin_replace``): readers see the old store or
        the new one. Called with the cyclic GC paused."""
        big = not self.store.synced or len(items) > CHUNK  # a small relist freezes nothing
        job = self.writer.begin_replace(items, rv)
        while not job.step(CHUNK):
            collector.freeze()
            await asyncio.sleep(0)  # let watches, probes and workers run between chunks
        if big:
            collector.freeze()
        changes = job.commit()
        stats = self.stats
        stats.lists += 1
        stats.last_sync_mode = mode
        stats.last_error = ""
        self.synced.set()
        return changes

    async def emit_all(self, changes: list[Any]) -> None:
        """Emit a sync's changes in order, in steps, dropping each pair once emitted: the old
        objects of a relist are freed step by step rather than all at once when the list goes.

        More than a chunk of changes is emitted with the collector paused, and what each chunk
        left (the queue's entries for its keys, above all) is frozen after it, as a sync's
        objects are: otherwise full passes over them stall the loop while workers run."""
        big = len(changes) > CHUNK
        self.emitting += 1
        if big:
            collector.pause()
        try:
            await self._emit_steps(changes, big)
        finally:
            if big:
                collector.resume()
            self.emitting -= 1
            if not self.emitting:
                self.calm.set()

    async def _emit_steps(self, changes: list[Any], freeze: bool) -> None:
        emit = self.emit
        for i in range(len(changes)):
            old, new = changes[i]
            changes[i] = None
            emit(old, new)
            if i % EMIT_STEP == EMIT_STEP - 1:
                del old, new
                if freeze and i % CHUNK == CHUNK - 1:
                    collector.freeze()
                await asyncio.sleep(0)  # let watches, probes and workers run between steps
        if freeze:
            collector.freeze()


async def may_list(transport: Transport, query: Query, stats: InformerStats, backoff: Backoff, kv: dict[str, Any]) -> None:
    """Return once one LIST of at most one object (metadata only) of ``query`` succeeded, trying
    again after each failure with ``backoff`` (each failure is ``stats.last_error``). What a
    sharded informer owning no range does before it calls itself synced: a replica that may not
    list the resource must not look synced, or it would take ranges it can never list."""
    params: dict[str, Any] = {"limit": 1}
    query.selectors(params)
    while True:
        try:
            await transport.request("GET", query.path, params=params, timeout=60, lane="informer", accept=METADATA_LIST_ACCEPT)
            break
        except Exception as exc:  # noqa: BLE001 — the apiserver or the network: tried again
            stats.last_error = str(exc)
            delay = backoff.next()
            log.warning(f"Cannot list; retrying in {delay:.1f} s", extra={"kv": {**kv, "error": str(exc)}})
            await asyncio.sleep(delay)
    stats.last_error = ""
