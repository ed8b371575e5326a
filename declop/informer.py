"""Informer: keeps one :class:`~declop.cache.Store` in sync with the apiserver by list + watch.

One informer per (resource, namespace, label selector), shared by every controller that needs it.
The loop (client-go's reflector, in asyncio):

1. LIST in pages of 500; the store is replaced atomically with the result and changes against the
   previous content are emitted — including synthesised deletions for keys that vanished (relist).
2. WATCH from the list's ``metadata.resourceVersion`` (never an item's), with bookmarks, a server
   timeout drawn from [5, 10) minutes and a client idle timeout of 90 s.
3. A normal close re-watches from the last seen resourceVersion (bookmarks advance it) without
   relisting. A 410 (Expired/Gone, in-stream or on connect) relists. Other failures back off
   0.8 s doubling to 30 s with full jitter (reset after 2 quiet minutes); 429 honours the backoff
   too; 403/404 log one clear error per back-off step.

Invariants:
- events reach subscribers in the order the store applied them, after the store changed;
- subscribers are called on the event loop and must not block (they only enqueue keys);
- bookmarks never reach the store or subscribers;
- resourceVersions are opaque strings, compared for equality only.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time
from typing import Any, Callable

from .cache import Store, Transform, Writer, strip_managed_fields
from .discovery import ResourceInfo
from .errors import ApiError, Forbidden, NotFound
from .keys import key_of
from .transport import Transport, loads

__all__ = ["Backoff", "EventHandler", "Informer", "InformerPool"]

log = logging.getLogger("declop.informer")

#: subscriber signature: (old, new); old is None for an addition, new is None for a deletion.
EventHandler = Callable[[Any, Any], None]


class Backoff:
    """Exponential backoff with full jitter: 0.8 s doubling to 30 s, reset after 2 quiet minutes."""

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


class _Expired(Exception):
    """The watch's resourceVersion is too old (410): relist."""


class Informer:
    """List + watch one resource into a Store; notify subscribers of every change."""

    def __init__(
        self,
        transport: Transport,
        resource: ResourceInfo,
        *,
        namespace: str = "",
        label_selector: str = "",
        transform: Transform | None = strip_managed_fields,
        page_size: int = 500,
        idle_timeout: float = 90.0,
    ) -> None:
        self.transport = transport
        self.resource = resource
        self.namespace = namespace if resource.namespaced else ""
        self.label_selector = label_selector
        self.page_size = page_size
        self.idle_timeout = idle_timeout
        where = f" in {self.namespace}" if self.namespace else ""
        sel = f" ({label_selector})" if label_selector else ""
        self.name = f"{resource.group_resource}{where}{sel}"
        self.store = Store(self.name)
        self._writer = Writer(self.store, transform)
        self._subscribers: list[EventHandler] = []
        self.synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._backoff = Backoff()
        self.last_error: str = ""
        self.lists = 0  # number of completed LISTs (1 + relists)

    def subscribe(self, handler: EventHandler) -> None:
        """Receive every future change; if already synced, replay the cache as additions first."""
        self._subscribers.append(handler)
        if self.store.synced:
            for obj in self.store:
                handler(None, obj)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"informer {self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    @property
    def path(self) -> str:
        return self.resource.path(namespace=self.namespace or None)

    def _emit(self, old: Any, new: Any) -> None:
        for handler in self._subscribers:
            try:
                handler(old, new)
            except Exception:  # a subscriber bug must not kill the informer
                log.exception("Event handler failed", extra={"kv": {"informer": self.name}})

    async def _run(self) -> None:
        need_list = True
        while True:
            try:
                if need_list:
                    await self._list()
                    need_list = False
                started = time.monotonic()
                events = await self._watch()
                # a normal close (server timeout): re-watch from the last RV, no relist;
                # but a watch that ends at once with nothing in it is a failure (no hot loop)
                if events == 0 and time.monotonic() - started < 1.0:
                    raise ApiError(0, "VeryShortWatch", "the watch closed immediately with no events")
            except asyncio.CancelledError:
                raise
            except _Expired:
                log.info("Watch expired, relisting", extra={"kv": {"informer": self.name}})
                need_list = True
            except asyncio.TimeoutError:
                # idle longer than the bookmark interval: a half-open connection; reconnect
                log.debug("Watch idle, reconnecting", extra={"kv": {"informer": self.name}})
            except Exception as exc:  # noqa: BLE001 - every failure backs off
                delay = self._backoff.next()
                self.last_error = _describe(exc, self)
                log.error(self.last_error, extra={"kv": {"informer": self.name, "retryIn": round(delay, 2)}})
                if isinstance(exc, ApiError) and exc.status == 410:
                    need_list = True  # expired on connect rather than in-stream
                await asyncio.sleep(delay)

    async def _list(self) -> None:
        # No cyclic collection while the cache grows page by page: full passes over a growing
        # heap are the long stalls (tens of ms at 10k objects, seconds at 100k). The heap is
        # frozen right after, so later passes skip the cache.
        _pause_gc()
        try:
            await self._list_pages()
        finally:
            _resume_gc()

    async def _list_pages(self) -> None:
        items: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": self.page_size}
        if self.label_selector:
            params["labelSelector"] = self.label_selector
        rv = ""
        kind = self.resource.kind
        api_version = self.resource.api_version
        while True:
            page = await self.transport.request("GET", self.path, params=params, timeout=120, lane="informer")
            for item in page.get("items") or ():
                # list items carry no kind/apiVersion; watch events do: make them alike
                item["kind"] = kind
                item["apiVersion"] = api_version
                items.append(item)
            meta = page.get("metadata") or {}
            rv = meta.get("resourceVersion", rv)
            token = meta.get("continue")
            if not token:
                break
            params["continue"] = token
        first = not self.store.synced
        changes = self._writer.replace(items, rv)
        self.lists += 1
        self.last_error = ""
        del items
        if len(changes) > 1000 or first:
            # objects that survive the list live as long as the cache: keep them out of the
            # cyclic collector's full passes (seconds at 100k objects); see docs/performance.md
            gc.freeze()
        self.synced.set()
        for i, (old, new) in enumerate(changes):
            self._emit(old, new)
            if i % 1000 == 999:
                await asyncio.sleep(0)  # let watches, probes and workers run between chunks

    async def _watch(self) -> int:
        params = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": self.store.resource_version,
            "timeoutSeconds": str(random.randint(300, 599)),
        }
        if self.label_selector:
            params["labelSelector"] = self.label_selector
        writer, store = self._writer, self.store
        count = 0
        async for line in self.transport.stream(self.path, params, read_timeout=self.idle_timeout):
            event = loads(line)
            count += 1
            etype = event.get("type")
            obj = event.get("object") or {}
            if etype == "BOOKMARK":
                store.resource_version = obj["metadata"]["resourceVersion"]
                continue
            if etype == "ERROR":
                code = obj.get("code")
                if code == 410:
                    raise _Expired()
                raise ApiError(code or 500, obj.get("reason") or "", obj.get("message") or "watch error")
            rv = obj["metadata"].get("resourceVersion")
            if etype == "DELETED":
                old = writer.delete(key_of(obj))
                store.resource_version = rv
                self._emit(old if old is not None else obj, None)
            else:  # ADDED / MODIFIED
                old, new = writer.upsert(obj)
                store.resource_version = rv
                self._emit(old, new)
        return count


_gc_pauses = 0
_gc_was_enabled = True


def _pause_gc() -> None:
    """Disable the cyclic GC while any informer lists (counted across informers)."""
    global _gc_pauses, _gc_was_enabled
    if _gc_pauses == 0:
        _gc_was_enabled = gc.isenabled()
        gc.disable()
    _gc_pauses += 1


def _resume_gc() -> None:
    global _gc_pauses
    _gc_pauses -= 1
    if _gc_pauses == 0 and _gc_was_enabled:
        gc.enable()


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
    if isinstance(exc, ApiError) and exc.status == 429:
        return f"throttled by the apiserver (429) while watching {r.group_resource}"
    return f"list/watch of {r.group_resource} failed: {exc}"



class InformerPool:
    """Every informer of one manager, created on demand and shared: one per
    (resource, namespace, label selector).

    ``namespaces`` is the operator's scope: empty means all namespaces (one cluster-wide informer
    per resource); otherwise one informer per listed namespace for namespaced resources.

    Informers are created on the loop only; :meth:`existing` is also called from handler threads
    (cache reads) and reads an immutable snapshot that the loop replaces, never changes, when it
    adds an informer — so a reader never iterates a dict that is growing.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        namespaces: tuple[str, ...] = (),
        transform: Transform | None = strip_managed_fields,
    ) -> None:
        self.transport = transport
        self.namespaces = tuple(namespaces)
        self.transform = transform
        self._informers: dict[tuple[str, str, str], Informer] = {}
        # group_resource -> its unfiltered informers; copy-on-write, read from any thread
        self._unfiltered: dict[str, tuple[Informer, ...]] = {}
        self._started = False
        self.indexers: dict[str, dict[str, Any]] = {}

    def scope(self, resource: ResourceInfo, namespaces: tuple[str, ...] | None = None) -> tuple[str, ...]:
        if not resource.namespaced:
            return ("",)
        chosen = self.namespaces if namespaces is None else namespaces
        return tuple(chosen) or ("",)

    def get(self, resource: ResourceInfo, namespace: str = "", label_selector: str = "") -> Informer:
        """The shared informer for this triple, created (and started, if the pool runs) on first use."""
        key = (resource.group_resource, namespace if resource.namespaced else "", label_selector)
        informer = self._informers.get(key)
        if informer is None:
            informer = Informer(
                self.transport, resource, namespace=key[1], label_selector=label_selector, transform=self.transform
            )
            for name, fn in self.indexers.get(resource.group_resource, {}).items():
                informer.store.add_indexer(name, fn)
            self._informers[key] = informer
            if not label_selector:
                gr = resource.group_resource
                self._unfiltered = {**self._unfiltered, gr: (*self._unfiltered.get(gr, ()), informer)}
            if self._started:
                informer.start()
        return informer

    def for_resource(
        self, resource: ResourceInfo, namespaces: tuple[str, ...] | None = None, label_selector: str = ""
    ) -> list[Informer]:
        return [self.get(resource, ns, label_selector) for ns in self.scope(resource, namespaces)]

    def existing(self, resource: ResourceInfo) -> list[Informer]:
        """Unfiltered informers of ``resource`` that exist already (no creation). Thread-safe."""
        return list(self._unfiltered.get(resource.group_resource, ()))

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
        return iter(list(self._informers.values()))

    def all_synced(self) -> bool:
        return all(i.store.synced for i in self._informers.values())
