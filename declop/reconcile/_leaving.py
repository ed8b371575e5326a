"""Leaving: what a ``labels=``/``fields=`` controller does about objects that leave its filter.

To the controller an object that leaves the filter is a deletion: the filtered watch sends
``DELETED`` and the handler gets a ``DELETED`` call. Two things follow.

- **Reads that lag.** The handler reads an object that left from the unfiltered cache, a second
  watch stream that can lag the first: :func:`unfiltered_subscriber` wakes the controller again
  (trigger ``left-filter``) when that cache catches up with such an object.
- **Our finalizer.** With a finalizer, once the ``DELETED`` call of an object that left with it
  succeeded, the finalizer is released (:func:`~declop.reconcile._outcome.finish`): no
  controller of that finalizer would see the object again, and a later delete would wait for
  ever. A leave no watch of ours saw (every replica down, this one restarted and listed after
  it, a range gained after it) is told by no event: :class:`Search` finds those with one LIST
  (:func:`scan`) once the filtered caches synced and after each range gained, and an
  unfiltered cache that lists such an object wakes the controller as well.

Invariants:
- a found object is queued (trigger ``left-filter``) and noted in ``FinalizerWrites.left``
  only when it carries our finalizer and is outside the filter; whether it still is when its
  call ends is judged again then, on a fresher copy;
- the scan starts after the filtered informers synced: a leave after their list is a
  ``DELETED`` event of theirs, one before it an object the scan's later LIST sees outside;
- the scan is paginated (:data:`PAGE`), metadata only when the filter reads only labels, in the
  ``informer`` lane, one at a time per controller, and retried with a capped backoff until it
  completes or the controller stops; it never writes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from declop.cache.listing import METADATA_LIST_ACCEPT
from declop.errors import ApiError
from declop.kube.keys import Request, key_of
from declop.reconcile._call import ControllerState
from declop.reconcile._filters import in_filter

__all__ = ["PAGE", "Search", "scan", "unfiltered_subscriber"]

log = logging.getLogger("declop.controller")

#: objects per page of the scan's LIST
PAGE = 500
#: the first and the longest wait before the scan's LIST is tried again
RETRY, RETRY_MAX = 1.0, 60.0


async def _list(transport: Any, path: str, accept: str | None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": PAGE}
    while True:
        try:
            page = await transport.request("GET", path, params=params, timeout=120, lane="informer", accept=accept)
        except ApiError as exc:
            if exc.status != 410 or "continue" not in params:
                raise
            params = {}  # the continue token expired: one unpaged LIST
            items.clear()
            continue
        items.extend(page.get("items") or ())
        token = (page.get("metadata") or {}).get("continue")
        if not token or "limit" not in params:
            return items
        params["continue"] = token


async def scan(
    transport: Any,
    paths: list[str],
    finalizer: str,
    selected: Callable[[Any], bool],
    metadata_only: bool,
    found: Callable[[Request, str], None],
    controller: str,
) -> int:
    """List ``paths`` (the primary informers' collections) and call ``found(key, uid)`` for each
    object that carries ``finalizer`` outside the filter. Returns how many were found."""
    accept = METADATA_LIST_ACCEPT if metadata_only else None
    delay = RETRY
    n = 0
    for path in paths:
        while True:
            try:
                items = await _list(transport, path, accept)
                break
            except Exception as exc:  # noqa: BLE001 — whatever the apiserver or the network did: later
                log.warning(
                    "Cannot list objects that left the filter with our finalizer; retrying",
                    extra={"kv": {"controller": controller, "error": str(exc), "delay": delay}},
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
        for obj in items:
            meta = obj.get("metadata") or {}
            if finalizer in (meta.get("finalizers") or ()) and not selected(obj):
                found(key_of(obj), meta.get("uid") or "")
                n += 1
    return n


def unfiltered_subscriber(c: ControllerState, selected: Callable[[Any], bool]) -> Callable[[Any, Any], None]:
    """The subscriber of a ``labels=``/``fields=`` controller (``selected``: its filter) on an
    unfiltered informer of its resource.

    Once an object has left the filter, the filtered cache no longer holds it and the handler
    reads it (``client.get(request)``, ``client.list()``) from the unfiltered cache, a second
    watch stream that can lag the first: woken by the filtered DELETED, the handler may read
    the object there as it was, still matching. So a change seen by the unfiltered cache of
    an object that matched this controller's informers before it (``old``), while those
    informers no longer hold it, wakes the controller (trigger ``left-filter``): the handler
    reads what that cache caught up to. An object still in a filtered cache is left to that
    cache's own events; other objects cost one look at ``old``'s labels (and fields). Sharded
    by uid, the wake notes ``old``'s uid: the book forgets it once a call found the key gone.

    With a finalizer, an object this cache lists (or sees created) outside the filter while it
    carries our finalizer left the filter while no watch of ours saw it go (this replica was
    down): it wakes the controller too, and its ``DELETED`` call releases our finalizer
    (:class:`~declop.reconcile._keys.FinalizerWrites` ``left``)."""
    add, own, keys, book = c.queue.add, c.primary, c.keys, c.gate.book
    uids = book.uids if book is not None else None
    finalizer, stranded = c.registration.finalizer, c.echoes.left

    def on_event(old: Any, new: Any) -> None:
        if old is None:
            if finalizer is None or new is None:
                return
            meta = new.get("metadata") or {}
            if finalizer in (meta.get("finalizers") or ()) and not selected(new):
                wake(new, new, meta.get("uid") or "")
            return
        if selected(old):
            wake(old, new, None)
        # else: an object that was not in the filter

    def wake(old: Any, new: Any, left: str | None) -> None:
        key = key_of(old)
        for informer in own.informers:
            if informer.namespace and informer.namespace != key.namespace:
                continue
            shard = informer.shard
            if shard is not None and not shard.matches(old):
                continue
            if informer.store.get(key) is not None:
                return  # still in the filtered cache: its own events wake the controller
            if uids is not None and (old.get("metadata") or {}).get("uid"):
                uids[key] = old["metadata"]["uid"]  # the key's range, for the gate
            if left is not None:
                stranded[key] = left
            add(key)
            keys.trace(key).note("left-filter", ((new or old).get("metadata") or {}).get("resourceVersion"))
            return

    return on_event


class Search:
    """The scans of one controller (a ``labels=``/``fields=`` registration with a finalizer): one
    at a time, and once more after it when asked again meanwhile (a range gained during a scan).
    Each found object is queued (trigger ``left-filter``) and noted in ``FinalizerWrites.left``,
    unless the filtered cache holds it again by then."""

    __slots__ = ("c", "task", "again")

    def __init__(self, c: ControllerState) -> None:
        self.c = c
        self.task: asyncio.Task[None] | None = None
        self.again = False

    def request(self) -> None:
        """A scan, now or after the running one. On the loop."""
        if not self.c.primary.informers:
            return
        if self.task is not None and not self.task.done():
            self.again = True
            return
        self.task = asyncio.get_running_loop().create_task(self._loop(), name=f"{self.c.name} stranded scan")

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()
            self.task = None

    async def _loop(self) -> None:
        self.again = True
        while self.again:
            self.again = False
            await self._once()

    async def _once(self) -> None:
        c = self.c
        reg, stranded, book = c.registration, c.echoes.left, c.gate.book
        uids = book.uids if book is not None else None

        def found(key: Request, uid: str) -> None:
            if c.primary.get(key) is not None:
                return  # back in the filter since: the filtered cache's own
            stranded[key] = uid
            if uids is not None and uid:
                uids[key] = uid  # the key's range, for the gate
            c.queue.add(key)
            c.keys.trace(key).note("left-filter", None)

        paths = [c.resource.path(namespace=i.namespace or None) for i in c.primary.informers]
        selected = in_filter(reg.labels, reg.fields)
        n = await scan(c.ctx.transport, paths, reg.finalizer or "", selected, not reg.fields, found, c.name)
        if n:
            log.info("Found objects that left the filter with our finalizer", extra={"kv": {"controller": c.name, "objects": n}})
