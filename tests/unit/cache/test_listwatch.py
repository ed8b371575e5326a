"""declop.cache.watch.ListWatch alone: each transition of its step function.

The list/watch loop is driven here one step at a time against a scripted transport (no server,
no Informer): the step is given a state, does its one request, stream or delay, and the test
checks the state it returns and what it wrote to the store, the emit and the counters. The
loop as a whole, against a fake apiserver, is tests/unit/cache/test_informer.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

import pytest

from declop.cache.backoff import Backoff
from declop.cache.listing import Query, Sync
from declop.cache.sharding import ShardScope
from declop.cache.stats import InformerStats
from declop.cache.store import Store, Writer
from declop.cache.watch import EMPTY, LISTING, WATCHING, ListWatch, Phase, State, initial_watch, waiting
from declop.errors import ApiError
from declop.kube.discovery import ResourceInfo
from declop.kube.transport import StreamIdle, StreamInterrupted
from declop.leases.hashing import ShardFilter, split

CONFIGMAPS = ResourceInfo(group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True)


def cm(name: str, rv: int) -> dict[str, Any]:
    return {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": name, "namespace": "default", "resourceVersion": str(rv)}}


def event(etype: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": etype, "object": obj}).encode()


def bookmark(rv: int, *, initial_end: bool = False) -> bytes:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return event("BOOKMARK", {"kind": "ConfigMap", "metadata": meta})


def error(code: int, **details: Any) -> bytes:
    return event("ERROR", {"kind": "Status", "code": code, "reason": "Reason", "message": "m", "details": details})


class Script:
    """A transport whose next watch stream yields ``lines`` then ends (with ``end`` raised, if
    given), and whose LISTs answer ``pages`` in turn (an exception in the list is raised)."""

    def __init__(self) -> None:
        self.streams: list[tuple[list[bytes], BaseException | None]] = []
        self.pages: list[Any] = []
        self.watched: list[dict[str, str]] = []
        self.listed: list[dict[str, Any]] = []

    def stream_then(self, *lines: bytes, end: BaseException | None = None) -> None:
        self.streams.append((list(lines), end))

    async def stream(self, path: str, params: dict[str, str], **_: Any) -> AsyncIterator[bytes]:
        self.watched.append(dict(params))
        lines, end = self.streams.pop(0)
        for line in lines:
            yield line
        if end is not None:
            raise end

    async def request(self, method: str, path: str, *, params: dict[str, Any], **_: Any) -> Any:
        self.listed.append(dict(params))
        page = self.pages.pop(0)
        if isinstance(page, BaseException):
            raise page
        return page


class Parts:
    """A ListWatch with its store, stats and sync, and what it emitted (``listed`` for a sync)."""

    def __init__(self, *, list_mode: Any = "auto", shard: ShardFilter | None = None, mode: Any = "") -> None:
        self.transport = Script()
        self.store = Store("configmaps")
        writer = Writer(self.store)
        self.stats = InformerStats()
        scope = ShardScope(shard, mode, self.stats, {})
        query = Query(CONFIGMAPS, "default")
        self.events: list[tuple[Any, Any, bool]] = []
        self.synced = asyncio.Event()
        sync = Sync(self.transport, query, writer, scope, self.stats, self._listed, self.synced, page_size=500, kv={})  # type: ignore[arg-type]
        self.lw = ListWatch(
            self.transport, query, writer, scope, self.stats, sync, self._watched,  # type: ignore[arg-type]
            list_mode=list_mode, backoff=Backoff(initial=0.01, cap=0.02), kv={},
        )

    def _listed(self, old: Any, new: Any) -> None:
        self.events.append((old and old["metadata"]["name"], new and new["metadata"]["name"], True))

    def _watched(self, old: Any, new: Any) -> None:
        self.events.append((old and old["metadata"]["name"], new and new["metadata"]["name"], False))

    def step(self, state: State) -> State:
        return asyncio.run(asyncio.wait_for(self.lw.step(state), 10))

    def synced_at(self, rv: int, *names: str) -> None:
        """The store as after a sync at ``rv`` holding ``names``."""
        self.lw.writer.replace([cm(n, rv) for n in names], str(rv))


def relist(state: State) -> bool:
    return state.phase is Phase.WAITING and state.then == EMPTY and state.delay > 0


def rewatch(state: State) -> bool:
    return state.phase is Phase.WAITING and state.then == WATCHING and state.delay > 0


# -- EMPTY, WAITING ---------------------------------------------------------------------------


def test_empty_goes_to_a_streaming_list_from_the_store_resource_version_or_to_listing() -> None:
    p = Parts()
    assert p.step(EMPTY) == initial_watch("")
    p.synced_at(7)
    assert p.step(EMPTY) == initial_watch("7")
    assert Parts(list_mode="paged").step(EMPTY) == LISTING
    assert p.transport.listed == [] and p.transport.watched == []


def test_empty_detects_the_shard_filtering_mode_once() -> None:
    p = Parts(list_mode="paged", shard=ShardFilter("uid", split(2)[:1]))
    p.transport.pages.append({"metadata": {"shardInfo": {"selector": "x"}}, "items": []})
    assert p.step(EMPTY) == LISTING
    assert p.lw.scope.mode == "server" and p.transport.listed[0]["limit"] == 1
    assert p.step(EMPTY) == LISTING and len(p.transport.listed) == 1


def test_a_failed_detection_relists_after_a_backoff() -> None:
    p = Parts(shard=ShardFilter("uid", split(2)[:1]))
    p.transport.pages.append(ApiError(503, "ServiceUnavailable"))
    assert relist(p.step(EMPTY)) and p.stats.last_error and p.lw.scope.mode == ""


def test_waiting_sleeps_its_delay_then_goes_on() -> None:
    p = Parts()
    assert p.step(waiting(0.01, WATCHING)) == WATCHING
    assert p.step(waiting(0.01, EMPTY)) == EMPTY


# -- LISTING ----------------------------------------------------------------------------------


def test_listing_syncs_the_store_and_goes_to_watching() -> None:
    p = Parts(list_mode="paged")
    p.transport.pages.append({"metadata": {"resourceVersion": "9"}, "items": [{"metadata": cm("a", 3)["metadata"]}]})
    assert p.step(LISTING) == WATCHING
    assert p.store.synced and p.store.resource_version == "9" and p.synced.is_set()
    assert p.events == [(None, "a", True)] and p.stats.lists == 1 and p.stats.last_sync_mode == "paged"
    assert p.store.get(next(iter(p.store.keys())))["kind"] == "ConfigMap"  # type: ignore[index]


def test_a_failed_list_relists_after_a_backoff() -> None:
    p = Parts(list_mode="paged")
    p.transport.pages.append(ApiError(500, "InternalError"))
    assert relist(p.step(LISTING)) and "failed" in p.stats.last_error and not p.store.synced


# -- INITIAL_WATCH ----------------------------------------------------------------------------


def test_a_streaming_list_swaps_in_at_its_end_bookmark_and_goes_on_as_the_watch() -> None:
    p = Parts()
    p.transport.stream_then(event("ADDED", cm("a", 3)), bookmark(5, initial_end=True), event("ADDED", cm("b", 6)))
    assert p.step(initial_watch("")) == WATCHING  # closed by the server after events: re-watch
    query = p.transport.watched[0]
    assert query["sendInitialEvents"] == "true" and query["resourceVersionMatch"] == "NotOlderThan"
    assert p.events == [(None, "a", True), (None, "b", False)]
    assert p.store.resource_version == "6" and p.stats.lists == 1 and p.stats.last_sync_mode == "stream"
    assert p.stats.objects_listed == 1 and p.stats.events_received == 1


def test_a_streaming_list_whose_resource_version_expired_asks_again_from_empty_at_once() -> None:
    p = Parts()
    p.transport.stream_then(end=ApiError(410, "Expired"))
    assert p.step(initial_watch("7")) == initial_watch("")
    p.transport.stream_then(error(410))
    assert p.step(initial_watch("7")) == initial_watch("")
    p.transport.stream_then(end=ApiError(410, "Expired"))
    assert relist(p.step(initial_watch("")))


def test_a_refused_streaming_list_falls_back_to_listing_for_good_in_auto_mode_only() -> None:
    p = Parts()
    p.transport.stream_then(end=ApiError(422, "Invalid"))
    assert p.step(initial_watch("")) == LISTING and not p.lw.streaming
    assert p.step(EMPTY) == LISTING
    forced = Parts(list_mode="stream")
    forced.transport.stream_then(end=ApiError(422, "Invalid"))
    assert relist(forced.step(initial_watch(""))) and forced.lw.streaming


def test_a_throttled_streaming_list_is_retried_from_the_same_resource_version() -> None:
    p = Parts()
    p.transport.stream_then(error(429, retryAfterSeconds=2))
    after = p.step(initial_watch("7"))
    assert after.phase is Phase.WAITING and after.then == initial_watch("7") and after.delay >= 2


def test_a_streaming_list_cut_short_relists_and_changes_nothing() -> None:
    p = Parts()
    p.transport.stream_then(event("ADDED", cm("a", 3)), end=StreamInterrupted(0, "Interrupted"))
    assert relist(p.step(initial_watch("")))
    assert len(p.store) == 0 and p.events == [] and not p.store.synced
    p.transport.stream_then(event("ADDED", cm("a", 3)))  # closed before its end bookmark
    assert relist(p.step(initial_watch("")))


# -- WATCHING ---------------------------------------------------------------------------------


def test_watching_applies_events_from_the_store_resource_version_and_rewatches_when_closed() -> None:
    p = Parts()
    p.synced_at(5, "a", "b")
    p.transport.stream_then(event("MODIFIED", cm("a", 6)), event("DELETED", cm("b", 7)), bookmark(9), event("ADDED", cm("c", 10)))
    assert p.step(WATCHING) == WATCHING
    assert p.transport.watched[0]["resourceVersion"] == "5" and "sendInitialEvents" not in p.transport.watched[0]
    assert p.events == [("a", "a", False), ("b", None, False), (None, "c", False)]
    assert p.store.resource_version == "10" and p.stats.events_received == 3


def test_a_watch_closed_at_once_with_nothing_relists() -> None:
    p = Parts()
    p.synced_at(5)
    p.transport.stream_then()
    assert relist(p.step(WATCHING)) and "closed immediately" in p.stats.last_error


@pytest.mark.parametrize(
    "lines, end",
    [
        ([], StreamIdle(0, "Idle")),
        ([bookmark(6)], StreamInterrupted(0, "Interrupted")),
    ],
)
def test_an_idle_or_cut_working_watch_rewatches_at_once(lines: list[bytes], end: BaseException) -> None:
    p = Parts()
    p.synced_at(5)
    p.stats.last_error = "an earlier failure"
    p.transport.stream_then(*lines, end=end)
    assert p.step(WATCHING) == WATCHING
    assert p.stats.last_error == ("" if lines else "an earlier failure")


@pytest.mark.parametrize(
    "lines, end",
    [
        ([], StreamInterrupted(0, "Interrupted")),  # died before delivering anything
        ([error(429)], None),
        ([], ApiError(429, "TooManyRequests")),
        ([], ApiError(0, "Unreachable")),
    ],
)
def test_a_failed_or_throttled_watch_request_rewatches_after_a_backoff(lines: list[bytes], end: BaseException | None) -> None:
    p = Parts()
    p.synced_at(5)
    p.transport.stream_then(*lines, end=end)
    assert rewatch(p.step(WATCHING))
    assert p.stats.lists == 0 and p.transport.listed == []


@pytest.mark.parametrize(
    "lines, end",
    [
        ([error(410)], None),
        ([], ApiError(410, "Gone")),
        ([error(500)], None),
        ([], ApiError(500, "InternalError")),
        ([], ApiError(403, "Forbidden")),
    ],
)
def test_an_expired_or_failed_watch_relists_after_a_backoff(lines: list[bytes], end: BaseException | None) -> None:
    p = Parts()
    p.synced_at(5, "a")
    p.transport.stream_then(*lines, end=end)
    assert relist(p.step(WATCHING))
    assert len(p.store) == 1 and p.events == []


def test_a_retry_after_raises_the_backoff() -> None:
    p = Parts()
    p.synced_at(5)
    p.transport.stream_then(error(429, retryAfterSeconds=3))
    assert p.step(WATCHING).delay >= 3


def test_bad_events_are_skipped_and_the_watch_goes_on() -> None:
    p = Parts()
    p.synced_at(5)
    p.transport.stream_then(b"{not json", event("WEIRD", cm("w", 6)), event("ADDED", {**cm("p", 7), "kind": "Pod"}), event("ADDED", cm("good", 8)))
    assert p.step(WATCHING) == WATCHING
    assert p.events == [(None, "good", False)] and p.store.resource_version == "8"


def test_a_client_side_shard_filter_drops_objects_outside_and_resumes_after_them() -> None:
    halves = split(2)
    inside = ShardFilter("namespace", (halves[0],))
    p = Parts(shard=inside, mode="client")
    p.synced_at(5)
    objs = [{**cm(f"o{i}", 6 + i), "metadata": {**cm(f"o{i}", 6 + i)["metadata"], "namespace": f"{i:02d}-ns"}} for i in range(20)]
    p.transport.stream_then(*(event("ADDED", o) for o in objs))
    assert p.step(WATCHING) == WATCHING
    kept = [o["metadata"]["name"] for o in objs if inside.matches(o)]
    assert 0 < len(kept) < 20 and [new for _, new, _ in p.events] == kept
    assert p.stats.dropped == 20 - len(kept) and p.store.resource_version == "25"
    assert "shardSelector" not in p.transport.watched[0]
