"""The watch loop: one informer's passes of *ListAndWatch*, the watch stream, and the rules for
how a stream or a pass ends.

Owns :class:`Watching`, the loop of :class:`~declop.cache.informer.Informer` — client-go's
reflector (``tools/cache/reflector.go``), in asyncio:

1. **Sync** (:mod:`declop.cache.listing`): a streaming list, read here since it is a watch
   stream, or a paginated LIST.
2. **Watch** from the synced resourceVersion, with bookmarks, a server ``timeoutSeconds`` drawn
   from [``min_watch_timeout``, 2 × ``min_watch_timeout``) (5 to 10 minutes), a client deadline
   60 s above it and an idle read timeout of ``idle_timeout`` (90 s).
3. **A watch that was working and ends re-watches at once** from the last resourceVersion,
   quietly: the server's timeout, an idle read (DEBUG), a connection reset or EOF (INFO). Only a
   failing watch *request* is an error: refused/unreachable or 429 (also as an in-stream ERROR
   event) back off and re-watch; any other failure (5xx, a stream that dies within 1 s with
   nothing in it) ends the pass.
4. **A pass ends with a relist after a backoff** (:class:`~declop.cache.backoff.Backoff`): a 410
   (in-stream or on connect), any other in-stream ERROR event (the object it concerns may be gone
   or undecodable: only a relist can tell), or a failure. ``Retry-After`` and
   ``retryAfterSeconds`` raise the delay. Failures log one ERROR line each, with the next delay.

A streaming list that does not complete: 429 backs off and retries it; a 410 for the
resourceVersion it resumed from retries at once from ``""`` (a consistent snapshot); a refusal
with ``list_mode="auto"`` switches the informer to paginated LISTs for good; anything else ends
the pass.

Invariants:
- events reach subscribers in the order the store applied them, after the store changed;
- bookmarks never reach the store or subscribers; an event of an unknown type, of another kind
  or without metadata is logged (contents not shown: it may be a Secret) and skipped, never
  applied;
- resourceVersions are opaque strings, compared for equality only; a watch resumes from the
  last one applied (or bookmarked, or dropped by the shard filter);
- no relist without a backoff delay before it; no re-watch delay after a watch that was working;
- the per-event path is the loop body of :meth:`Watching._watch`, inline: in the common case its
  only calls are decoding the line, the store write and the subscribers (it runs for every
  event: no helper layers, closures or allocations of its own).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import TYPE_CHECKING, Any

from declop import collector
from declop.cache.backoff import Backoff
from declop.cache.listing import CHUNK, INITIAL_EVENTS_END, METADATA_ACCEPT, ListMode, is_refusal
from declop.cache.sharding import ShardMode
from declop.cache.store import Store, Writer
from declop.errors import ApiError, Forbidden, NotFound
from declop.kube.discovery import ResourceInfo
from declop.kube.keys import key_of
from declop.kube.transport import StreamIdle, StreamInterrupted, Transport, loads
from declop.leases.hashing import ShardFilter

__all__ = ["Watching"]

log = logging.getLogger("declop.informer")

#: seconds after an informer starts during which "the watch cache is still filling" (429 "storage
#: is (re)initializing") is logged at DEBUG: routine at start (``declop dev`` applies a CRD and
#: starts at once); later (an apiserver restart) it is INFO. Any other 429 is an ERROR.
QUIET_START = 10.0

#: seconds into a streaming list without its initial-events-end bookmark when an INFO line says
#: so (a large list: 100k objects take ~12 s on a busy 2-core machine) and when a WARNING does
SLOW_LIST = (10.0, 60.0)

_WATCH_TYPES = frozenset(("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"))


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


class Watching:
    """The list-and-watch loop of :class:`~declop.cache.informer.Informer` (a part of it, not used
    alone)."""

    # the informer's state this part reads or writes (set in Informer.__init__)
    transport: Transport
    resource: ResourceInfo
    namespace: str
    store: Store
    _writer: Writer
    _kv: dict[str, str]
    label_selector: str
    field_selector: str
    metadata_only: bool
    idle_timeout: float
    list_mode: ListMode
    min_watch_timeout: int
    _kind: str
    _backoff: Backoff
    _streaming: bool
    _events: int
    _stream_synced: bool
    _resume_watch: bool
    last_error: str
    _run_started: float
    events_received: int
    objects_listed: int
    shard: ShardFilter | None
    shard_mode: ShardMode

    if TYPE_CHECKING:  # defined by the Informer and its other parts

        @property
        def path(self) -> str: ...

        def _emit(self, old: Any, new: Any) -> None: ...

        async def _list(self) -> None: ...

        async def _replace(self, items: list[dict[str, Any]], rv: str, mode: str) -> list[tuple[Any, Any]]: ...

        async def _emit_all(self, changes: list[Any]) -> None: ...

        async def _detect_shard_mode(self) -> None: ...

        def _shard_params(self, params: dict[str, Any]) -> None: ...

        def _outside(self, obj: dict[str, Any]) -> bool: ...

    # -- the loop -------------------------------------------------------------------------------

    async def _run(self) -> None:
        self._run_started = time.monotonic()
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
                level = self._retry_level(exc)
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
                if isinstance(ended, ApiError) and self.list_mode == "auto" and is_refusal(ended):
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
            level = self._retry_level(exc)
            log.log(level, f"{self.last_error}; re-watching in {delay:.1f} s", extra={"kv": {**self._kv, "retryIn": round(delay, 2)}})
        else:
            log.warning(f"Watch throttled (429); re-watching in {delay:.1f} s", extra={"kv": {**self._kv, "retryIn": round(delay, 2)}})
        await asyncio.sleep(delay)

    def _retry_level(self, exc: BaseException) -> int:
        """DEBUG for a watch cache still filling in the informer's first :data:`QUIET_START`
        seconds, INFO for one later; ERROR for any other failure."""
        if not _initialising(exc):
            return logging.ERROR
        return logging.DEBUG if time.monotonic() - self._run_started < QUIET_START else logging.INFO

    # -- the stream (a watch, or a streaming list that goes on as one) ----------------------------

    async def _watch(self, *, initial: bool, resource_version: str) -> None:
        """Consume one watch stream until it ends. With ``initial`` it is a streaming list: the
        initial events are collected aside until the initial-events-end bookmark, swapped into
        the store (``_stream_synced`` becomes true), and the same stream goes on as the watch.
        Until then the stream is read in bulk (``Transport.stream``'s ``bulk``): the initial
        events are a transfer, where fewer and larger reads save CPU and cost no latency."""
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
            collector.pause()
            paused = True
        listing_since = time.monotonic()
        warned_at = listing_since + SLOW_LIST[0]
        try:
            async for line in self.transport.stream(
                self.path,
                params,
                read_timeout=self.idle_timeout,
                total_timeout=timeout_seconds + 60.0,
                accept=METADATA_ACCEPT if self.metadata_only else None,
                # the initial events in bulk (fewer, larger reads); the watch proper at once
                bulk=(lambda: not self._stream_synced) if initial else None,
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
                                collector.resume()
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
                        if len(pending) % CHUNK == 0:
                            collector.freeze()  # this chunk's objects, now, rather than all at the end
                    if time.monotonic() > warned_at:
                        warned_at = self._still_listing(listing_since, len(pending))
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
                collector.resume()

    def _still_listing(self, since: float, count: int) -> float:
        """A streaming list without its initial-events-end bookmark after :data:`SLOW_LIST`
        seconds: INFO at the first (a large list takes that long), WARNING at the second (an
        apiserver that never ends its initial events keeps the controllers waiting). Returns
        when to say it next."""
        waited = time.monotonic() - since
        kv = {**self._kv, "objects": count}
        if waited < SLOW_LIST[1]:
            log.info(f"Streaming list: {count} objects after {waited:.0f} s, still listing", extra={"kv": kv})
            return since + SLOW_LIST[1]
        log.warning(
            f"Streaming list: {count} objects after {waited:.0f} s and no initial-events-end bookmark yet; "
            "controllers start once it arrives (if this apiserver never sends it, run with --list-mode=paged)",
            extra={"kv": kv},
        )
        return float("inf")

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


def _initialising(exc: BaseException) -> bool:
    """The apiserver's watch cache for this resource is not ready yet (k8s.io/apiserver
    storage/cacher: ``TooManyRequests("storage is (re)initializing")`` with a Retry-After)."""
    return isinstance(exc, ApiError) and exc.status == 429 and "initializing" in str(exc)


def _describe(exc: BaseException, informer: Watching) -> str:
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
        return (
            f"Waiting for the apiserver to load {r.group_resource} into its watch cache "
            "(normal for a few seconds after a CRD is created or the apiserver starts)"
        )
    if isinstance(exc, ApiError) and exc.status == 429:
        return f"throttled by the apiserver (429) while watching {r.group_resource}"
    return f"list/watch of {r.group_resource} failed: {exc}"
