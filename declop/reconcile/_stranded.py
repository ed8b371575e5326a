"""Stranded: objects that carry our finalizer outside a ``labels=``/``fields=`` filter.

An object that leaves the filter of a controller with a finalizer gets a ``DELETED`` call, and
once it succeeds our finalizer is released (:func:`~declop.reconcile._outcome.finish`): no
controller of that finalizer would see the object again, so a later delete would wait for ever.
A watch of ours tells of the leave (the filtered watch's ``DELETED``, or an unfiltered cache's
change: :class:`~declop.reconcile.controller.Controller`). One that happened while no replica
watched (every replica down, or this one restarted and listed after it) is told by nothing:
:func:`scan` finds those, with one LIST of the resource once the filtered caches synced.

Invariants:
- a scanned object is queued (trigger ``left-filter``) and noted in ``FinalizerWrites.left``
  only when it carries our finalizer and is outside the filter; whether it still is when its
  call ends is judged again then, on a fresher copy;
- the scan starts after the filtered informers synced: a leave after their list is a
  ``DELETED`` event of theirs, one before it an object the scan's later LIST sees outside;
- the scan is paginated (:data:`PAGE`), metadata only when the filter reads only labels, in the
  ``informer`` lane, and retried with a capped backoff until it completes or the controller
  stops; it never writes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from declop.cache.listing import METADATA_LIST_ACCEPT
from declop.errors import ApiError
from declop.kube.keys import Request, key_of

__all__ = ["PAGE", "scan"]

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
