"""The list/watch loop of one informer: client-go's reflector in asyncio, as a state machine.

Owns :class:`ListWatch`, its states (:class:`State`, :class:`Phase`) and :meth:`ListWatch.step`,
the one function that moves between them, and the watch stream (:meth:`ListWatch.watch`)::

    EMPTY ──▶ INITIAL_WATCH(rv) ──(initial-events-end)──▶ the same stream as the watch
      │            │ 410 and rv ≠ "": INITIAL_WATCH("") at once; refused ("auto"): LISTING
      └──▶ LISTING ──▶ WATCHING ──(server timeout, idle, cut after events)──▶ WATCHING
                          │ 429 or a failed request: WAITING(backoff) ──▶ WATCHING
                          │ 410, ERROR event, other failure: WAITING(backoff) ──▶ EMPTY

It writes through the store's :class:`~declop.cache.store.Writer` and calls the ``emit`` it is
given for every change a watch applies; a sync goes through :class:`~declop.cache.listing.Sync`.
It knows nothing of subscribers. The rules, with their reasons and client-go's numbers, are in
docs/list-and-watch.md.

Invariants:
- events are emitted in the order the store applied them, after the store changed;
- bookmarks never reach the store or the emit; an event of an unknown type, of another kind or
  without metadata is logged (contents not shown: it may be a Secret) and skipped, never applied;
- resourceVersions are opaque strings, compared for equality only; a watch resumes from the
  last one applied (or bookmarked, or dropped by the shard filter): the store's;
- a watch that was working and ends re-watches at once; only a failing watch *request* is an
  error: refused/unreachable or 429 back off and re-watch, anything else backs off and relists;
- no relist without a backoff delay before it (:class:`~declop.cache.backoff.Backoff`,
  ``Retry-After`` raising it), except a streaming list whose resourceVersion expired, which
  asks again at once from ``""``;
- the per-event path is the loop body of :meth:`ListWatch.watch`, inline: in the common case its
  only calls are decoding the line, the store write and the emit (no helper layers, closures or
  allocations of its own).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from declop import collector
from declop.cache.backoff import Backoff
from declop.cache.listing import CHUNK, INITIAL_EVENTS_END, METADATA_ACCEPT, ListMode, Query, Sync, is_refusal
from declop.cache.sharding import ShardScope
from declop.cache.stats import InformerStats
from declop.cache.store import Store, Writer
from declop.errors import ApiError, Forbidden, NotFound
from declop.kube.keys import key_of
from declop.kube.transport import StreamIdle, StreamInterrupted, Transport, loads

__all__ = ["EMPTY", "LISTING", "WATCHING", "Ending", "ListWatch", "Phase", "State", "initial_watch", "waiting"]

log = logging.getLogger("declop.informer")

#: seconds after an informer starts during which "the watch cache is still filling" (429 "storage
#: is (re)initializing") is logged at DEBUG: routine at start; later (an apiserver restart) it is
#: INFO. Any other 429 is an ERROR.
QUIET_START = 10.0

#: seconds into a streaming list without its initial-events-end bookmark when an INFO line says
#: so (a large list) and when a WARNING does
SLOW_LIST = (10.0, 60.0)

_WATCH_TYPES = frozenset(("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"))


class Phase(enum.Enum):
    """Where the list/watch loop is."""

    #: the store needs a sync: next, a streaming list or paginated LISTs
    EMPTY = "empty"
    #: paginated LISTs, then the watch
    LISTING = "listing"
    #: a streaming list from ``State.resource_version``; once its initial events are in, the
    #: same stream goes on as the watch
    INITIAL_WATCH = "initial watch"
    #: a watch from the store's resourceVersion
    WATCHING = "watching"
    #: a backoff delay (``State.delay``), then ``State.then``: a relist pending when that is EMPTY
    WAITING = "waiting"


@dataclass(frozen=True)
class State:
    """A state of the loop: its phase and the phase's data."""

    phase: Phase
    #: INITIAL_WATCH: the resourceVersion the streaming list asks for ("" : a consistent snapshot)
    resource_version: str = ""
    #: WAITING: seconds to wait
    delay: float = 0.0
    #: WAITING: the state after the delay
    then: State | None = None


EMPTY = State(Phase.EMPTY)
LISTING = State(Phase.LISTING)
WATCHING = State(Phase.WATCHING)


def initial_watch(resource_version: str) -> State:
    return State(Phase.INITIAL_WATCH, resource_version=resource_version)


def waiting(delay: float, then: State) -> State:
    return State(Phase.WAITING, delay=delay, then=then)


class Ending(NamedTuple):
    """How one watch stream ended."""

    #: what ended it (None: the server closed it normally)
    error: BaseException | None
    #: lines received, bookmarks and bad events included
    events: int
    #: a streaming list's initial events were swapped into the store
    listed: bool
    #: seconds from the request to the end
    elapsed: float


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


class ListWatch:
    """Keeps one store in sync by list and watch: :meth:`run` steps from ``state`` forever."""

    def __init__(
        self,
        transport: Transport,
        query: Query,
        writer: Writer,
        scope: ShardScope,
        stats: InformerStats,
        sync: Sync,
        emit: Callable[[Any, Any], None],
        *,
        list_mode: ListMode = "auto",
        backoff: Backoff | None = None,
        idle_timeout: float = 90.0,
        min_watch_timeout: int = 300,
        kv: dict[str, str],
    ) -> None:
        self.transport = transport
        self.query = query
        self.writer = writer
        self.store: Store = writer.store
        self.scope = scope
        self.stats = stats
        self.sync = sync
        self.emit = emit
        self.list_mode = list_mode
        #: whether a sync is a streaming list: "auto" turns it off for good when refused
        self.streaming = list_mode != "paged"
        self.backoff = backoff or Backoff()
        self.idle_timeout = idle_timeout
        self.min_watch_timeout = min_watch_timeout
        self._kv = kv
        #: where the next :meth:`run` starts (the state of the step in progress while it runs)
        self.state = EMPTY
        self._started = 0.0  # when run() started: QUIET_START counts from it

    async def run(self) -> None:
        self._started = time.monotonic()
        while True:
            self.state = await self.step(self.state)

    async def step(self, state: State) -> State:
        """Do what ``state`` calls for and return the next state: the loop's only transition."""
        try:
            phase = state.phase
            if phase is Phase.WAITING:
                await asyncio.sleep(state.delay)
                assert state.then is not None
                return state.then
            if phase is Phase.EMPTY:
                if self.scope.undetected:
                    await self.scope.detect(self.transport, self.query.path)
                return initial_watch(self.store.resource_version) if self.streaming else LISTING
            if phase is Phase.LISTING:
                await self.sync.list()
                return WATCHING
            if phase is Phase.INITIAL_WATCH:
                ending = await self.watch(initial=True, resource_version=state.resource_version)
                if ending.listed:
                    return self._watched(ending)  # the stream went on as the watch
                return self._listing_cut(state, ending)
            return self._watched(await self.watch(initial=False, resource_version=self.store.resource_version))
        except Exception as exc:  # noqa: BLE001 - every failure backs off
            return self._relist(exc)

    # -- the transitions after a stream ----------------------------------------------------------

    def _watched(self, ending: Ending) -> State:
        """A watch ended (or a streaming list's stream, after its sync): re-watch or relist."""
        ended = ending.error
        if ending.events:
            self.stats.last_error = ""  # a watch delivered something: whatever failed before works
        if ended is None:
            if ending.events == 0 and ending.elapsed < 1.0:
                # client-go's VeryShortWatchError: a server that closes every watch at once
                return self._relist(ApiError(0, "VeryShortWatch", "the watch closed immediately with no events"))
            log.debug("Watch closed by the server, re-watching", extra={"kv": self._kv})
            return WATCHING
        if isinstance(ended, StreamIdle):
            log.debug("Watch idle, re-watching", extra={"kv": self._kv})
            return WATCHING
        if isinstance(ended, StreamInterrupted):
            if ending.events == 0 and ending.elapsed < 1.0:
                # died before delivering anything: the request failed; the RV is still good
                return self._retry(None, ended, WATCHING)
            log.info(f"Watch interrupted ({ended}), re-watching", extra={"kv": self._kv})
            return WATCHING
        if isinstance(ended, _Throttled):
            return self._retry(ended.retry_after, None, WATCHING)
        if isinstance(ended, ApiError):
            if ended.status == 410:
                return self._relist(_Relist("Watch expired (410)", expected=True))
            if ended.status in (0, 429):
                # the watch request failed, the resourceVersion is still good: retry the watch
                return self._retry(ended.retry_after, ended, WATCHING)
        return self._relist(ended)

    def _listing_cut(self, state: State, ending: Ending) -> State:
        """A streaming list ended before its initial events were in: refused, failed, or cut."""
        ended = ending.error
        if isinstance(ended, _Throttled):
            return self._retry(ended.retry_after, None, state)
        expired = isinstance(ended, ApiError) and ended.status == 410
        if (expired or isinstance(ended, _Relist) and ended.expected) and state.resource_version:
            return initial_watch("")  # that resourceVersion is gone: a consistent snapshot instead
        if isinstance(ended, ApiError) and self.list_mode == "auto" and is_refusal(ended):
            log.info(
                f"The apiserver refused a streaming list ({ended.status}: {ended}); "
                "using paginated LISTs for this informer from now on",
                extra={"kv": self._kv},
            )
            self.streaming = False
            return LISTING
        return self._relist(ended or ApiError(0, "StreamingListIncomplete", "the streaming list ended before its last event"))

    def _retry(self, retry_after: float | None, exc: BaseException | None, then: State) -> State:
        """A request to retry after a backoff (at least ``retry_after``), without a relist."""
        delay = self.backoff.next()
        if retry_after:
            delay = max(delay, retry_after)
        kv = {**self._kv, "retryIn": round(delay, 2)}
        if exc is not None:
            self.stats.last_error = _describe(exc, self.query)
            log.log(self._retry_level(exc), f"{self.stats.last_error}; re-watching in {delay:.1f} s", extra={"kv": kv})
        else:
            log.warning(f"Watch throttled (429); re-watching in {delay:.1f} s", extra={"kv": kv})
        return waiting(delay, then)

    def _relist(self, exc: BaseException) -> State:
        """The pass ends: a relist after a backoff. A 410 or an ERROR event is logged as such;
        any other failure is an error (with ``Retry-After`` raising the delay)."""
        delay = self.backoff.next()
        kv = {**self._kv, "retryIn": round(delay, 2)}
        if isinstance(exc, _Relist):
            level = logging.INFO if exc.expected else logging.WARNING
            log.log(level, f"{exc}; relisting in {delay:.1f} s", extra={"kv": kv})
            return waiting(delay, EMPTY)
        if isinstance(exc, ApiError) and exc.retry_after:
            delay = max(delay, exc.retry_after)
            kv["retryIn"] = round(delay, 2)
        self.stats.last_error = _describe(exc, self.query)
        # A watch cache still filling (a CRD created a moment ago, an apiserver restart)
        # answers 429 "storage is (re)initializing" with a Retry-After: expected, not an error.
        log.log(self._retry_level(exc), f"{self.stats.last_error}; retrying in {delay:.1f} s", extra={"kv": kv})
        return waiting(delay, EMPTY)

    def _retry_level(self, exc: BaseException) -> int:
        """DEBUG for a watch cache still filling in the loop's first :data:`QUIET_START` seconds,
        INFO for one later; ERROR for any other failure."""
        if not _initialising(exc):
            return logging.ERROR
        return logging.DEBUG if time.monotonic() - self._started < QUIET_START else logging.INFO

    # -- the stream (a watch, or a streaming list that goes on as one) ----------------------------

    async def watch(self, *, initial: bool, resource_version: str) -> Ending:
        """Consume one watch stream until it ends; returns how. With ``initial`` it is a
        streaming list: the initial events are collected aside until the initial-events-end
        bookmark, swapped into the store (``listed``), and the same stream goes on as the watch.
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
        query = self.query
        query.selectors(params)
        self.scope.params(params)
        writer, store, kind, stats, emit, sync = self.writer, self.store, query.kind, self.stats, self.emit, self.sync
        outside = self.scope.outside if self.scope.filter is not None else None
        pending: list[dict[str, Any]] | None = [] if initial else None
        listed = False
        events = 0
        ended: BaseException | None = None
        paused = False
        if initial:
            collector.pause()
            paused = True
        started = time.monotonic()
        warned_at = started + SLOW_LIST[0]
        try:
            async for line in self.transport.stream(
                query.path,
                params,
                read_timeout=self.idle_timeout,
                total_timeout=timeout_seconds + 60.0,
                accept=METADATA_ACCEPT if query.metadata_only else None,
                # the initial events in bulk (fewer, larger reads); the watch proper at once
                bulk=(lambda: not listed) if initial else None,
            ):
                events += 1
                try:
                    event = loads(line)
                    etype = event["type"]
                    obj = event["object"]
                    if etype == "ERROR":
                        _error_event(obj)  # raises
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
                            changes = await sync.replace(items, rv, "stream")
                            del items
                            listed = True
                            if paused:
                                collector.resume()
                                paused = False
                            await sync.emit_all(changes)
                            del changes
                        continue
                    store.resource_version = rv
                    continue
                if etype not in _WATCH_TYPES or not name or obj.get("kind", kind) != kind:
                    why = f"unexpected type {etype!r}" if etype not in _WATCH_TYPES else "unexpected object"
                    self._skip(line, why)
                    continue
                if pending is None:
                    stats.events_received += 1
                else:
                    stats.objects_listed += 1
                if outside is not None and outside(obj):
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
                        warned_at = self._still_listing(started, len(pending))
                    continue
                if etype == "DELETED":
                    old = writer.delete(key_of(obj))
                    store.resource_version = rv
                    emit(old if old is not None else obj, None)
                else:  # ADDED / MODIFIED
                    old, new = writer.upsert(obj)
                    store.resource_version = rv
                    emit(old, new)
        except (StreamIdle, StreamInterrupted, _Throttled, _Relist, ApiError) as exc:
            ended = exc
        finally:
            if paused:
                collector.resume()
        return Ending(ended, events, listed, time.monotonic() - started)

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

    def _skip(self, line: bytes, why: str) -> None:
        # the line is not shown: it may be a Secret
        log.warning(f"Skipped a watch event ({why}; {len(line)} bytes, contents not shown)", extra={"kv": self._kv})


def _error_event(obj: Any) -> None:
    status = obj if isinstance(obj, dict) else {}
    code = status.get("code") or 500
    message = status.get("message") or status.get("reason") or "watch error"
    if code == 429:
        details = status.get("details") or {}
        raise _Throttled(details.get("retryAfterSeconds"))
    if code == 410:
        raise _Relist(f"Watch expired (410: {message})", expected=True)
    raise _Relist(f"Watch ended with an error ({code} {status.get('reason') or ''}: {message})", expected=False)


def _initialising(exc: BaseException) -> bool:
    """The apiserver's watch cache for this resource is not ready yet (k8s.io/apiserver
    storage/cacher: ``TooManyRequests("storage is (re)initializing")`` with a Retry-After)."""
    return isinstance(exc, ApiError) and exc.status == 429 and "initializing" in str(exc)


def _describe(exc: BaseException, query: Query) -> str:
    r = query.resource
    where = f" in namespace {query.namespace}" if query.namespace else " in all namespaces"
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
