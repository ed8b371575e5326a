"""The informer against a scripted fake list/watch server (declop.testing.ListWatchServer).

Tests named ``test_reflector_*`` mirror the client-go reflector test of that name
(``tools/cache/reflector_test.go``, ``reflector_watchlist_test.go``, v0.36.3); the others cover
what the reflector's tests do not (idle watches, cuts, bad events, GC). Backoffs are real
(client-go's numbers) unless a test compresses them to stay short, and says so.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import weakref
from typing import Any, Awaitable, Callable, TypeVar

import pytest

from declop.cache import watch as watch_module
from declop.cache.informer import Backoff, Informer, all_synced
from declop.testing.fakes.listwatch import ListWatchServer, Step

T = TypeVar("T")


def run(coro: Awaitable[T], timeout: float = 60.0) -> T:
    async def main() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(main())


async def until(condition: Callable[[], Any], timeout: float = 15.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what or condition}")


def informer_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "declop.informer"]


class Recorder:
    """A subscriber: every (old, new) as (old name or None, new name or None)."""

    def __init__(self) -> None:
        self.events: list[tuple[str | None, str | None]] = []

    def __call__(self, old: Any, new: Any) -> None:
        self.events.append((old and old["metadata"]["name"], new and new["metadata"]["name"]))


class RecordingBackoff(Backoff):
    """The real backoff (optionally compressed), remembering every delay it handed out."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.delays: list[float] = []

    def next(self) -> float:
        delay = super().next()
        self.delays.append(delay)
        return delay


async def start(server: ListWatchServer, **kw: Any) -> tuple[Informer, Recorder]:
    informer = Informer(server.transport(), server.resource, namespace="default", **kw)
    recorder = Recorder()
    informer.subscribe(recorder)
    informer.start()
    await asyncio.wait_for(informer.synced.wait(), 15)
    await until(lambda: not informer.listwatch.sync.emitting, what="the sync's changes emitted")
    return informer, recorder


def names(informer: Informer) -> set[str]:
    return {o["metadata"]["name"] for o in informer.store}


def gaps(server: ListWatchServer, verbs: tuple[str, ...] = ("list", "watch", "stream")) -> list[float]:
    times = [r.at for r in server.requests if r.verb in verbs]
    return [b - a for a, b in zip(times, times[1:])]


MODES = pytest.mark.parametrize("mode", ["stream", "paged"])


# -- sync and watch ---------------------------------------------------------------------------


@MODES
def test_reflector_list_and_watch(mode: str) -> None:
    """TestReflectorListAndWatch: sync, then watch from the synced resourceVersion; a watch the
    server closes is resumed from the last resourceVersion without a relist."""

    async def scenario() -> None:
        async with ListWatchServer() as server:
            server.add("a")
            server.add("b")
            if mode == "paged":
                server.script_watch(Step.history(), Step.bookmark(), Step.idle(0.2), Step.close())
            else:
                server.script_watch(Step.initial_events(), Step.bookmark(initial_end=True), Step.idle(0.2), Step.close())
            informer, rec = await start(server, list_mode=mode)
            assert names(informer) == {"a", "b"} and informer.last_sync_mode == mode
            synced_rv = informer.store.resource_version
            assert synced_rv == server.resource_version
            await until(lambda: len(server.requests) >= 2 if mode == "stream" else len(server.requests) >= 3)
            server.add("c")
            server.delete("a")
            await until(lambda: names(informer) == {"b", "c"})
            assert rec.events[-2:] == [(None, "c"), ("a", None)]
            rewatch = server.requests[-1]
            assert rewatch.verb == "watch" and rewatch.query["resourceVersion"] == synced_rv
            assert server.count("list") == (1 if mode == "paged" else 0)
            assert server.count("stream") == (1 if mode == "stream" else 0)
            assert informer.lists == 1
            await informer.stop()

    run(scenario())


def test_reflector_watch_list_one_stream_is_list_and_watch() -> None:
    """TestWatchList: the streaming list's request carries sendInitialEvents,
    resourceVersionMatch=NotOlderThan and bookmarks; nothing is visible before the
    initial-events-end bookmark; the same stream then carries the watch."""

    async def scenario() -> None:
        async with ListWatchServer() as server:
            for name in "abc":
                server.add(name)
            server.script_watch(Step.initial_events(), Step.idle(0.3), Step.bookmark(initial_end=True), then_live=True)
            informer = Informer(server.transport(), server.resource, namespace="default")
            informer.start()
            await until(lambda: server.requests)
            await asyncio.sleep(0.15)
            assert not informer.synced.is_set() and len(informer.store) == 0  # collected aside
            await asyncio.wait_for(informer.synced.wait(), 10)
            assert names(informer) == {"a", "b", "c"}
            query = server.requests[0].query
            assert query["sendInitialEvents"] == "true"
            assert query["resourceVersionMatch"] == "NotOlderThan"
            assert query["allowWatchBookmarks"] == "true"
            assert query["resourceVersion"] == ""  # first sync: a consistent snapshot
            server.modify("b", {"k": "v"})
            await until(lambda: (informer.store.get(_key("b")) or {}).get("data") == {"k": "v"})
            assert [r.verb for r in server.requests] == ["stream"]
            await informer.stop()

    run(scenario())


def test_reflector_watch_list_refused_falls_back_to_paginated_list(caplog: pytest.LogCaptureFixture) -> None:
    """TestNewReflectorWithDisablementWatchList (server side): an apiserver that refuses
    sendInitialEvents (422) gets one logged fallback, then paginated LISTs only."""
    caplog.set_level(logging.INFO, "declop.informer")

    async def scenario() -> None:
        async with ListWatchServer(streaming=False) as server:
            server.add("a")
            server.script_watch(Step.status(422, "Invalid"))  # the streaming attempt
            server.script_watch(Step.history(), Step.error(410, "Expired"))  # the watch after the list
            informer, _ = await start(server)
            assert names(informer) == {"a"} and informer.last_sync_mode == "paged"
            await until(lambda: informer.lists == 2, what="the relist after the 410")
            assert [r.verb for r in server.requests][:4] == ["stream", "list", "watch", "list"]
            assert server.count("stream") == 1  # never tried again
            await informer.stop()

    run(scenario())
    fallbacks = [r for r in informer_records(caplog) if "refused a streaming list" in r.getMessage()]
    assert len(fallbacks) == 1 and fallbacks[0].levelno == logging.INFO


def test_forced_stream_mode_does_not_fall_back(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with ListWatchServer(streaming=False) as server:
            informer = Informer(
                server.transport(), server.resource, namespace="default", list_mode="stream",
                backoff=RecordingBackoff(initial=0.05, cap=0.1),
            )
            informer.start()
            await until(lambda: server.count("stream") >= 2)
            assert server.count("list") == 0 and not informer.synced.is_set()
            assert "422" in informer.last_error or "WatchList" in informer.last_error
            await informer.stop()

    run(scenario())


def test_reflector_watch_list_resource_version_expired_restarts_from_empty() -> None:
    """TestWatchListResourceVersion: a relist by streaming asks for the last known
    resourceVersion; when that is gone (410 on connect) it asks again at once with "" (a
    consistent snapshot), without a backoff."""

    async def scenario() -> None:
        async with ListWatchServer() as server:
            server.add("a")
            backoff = RecordingBackoff()
            informer, _ = await start(server, backoff=backoff)
            rv = informer.store.resource_version
            server.script_watch(Step.status(410, "Expired"))  # the relist's first attempt
            server.compact()  # the live watch gets an in-stream 410 and relists
            await until(lambda: informer.lists == 2, what="the relist")
            streams = [r for r in server.requests if r.verb == "stream"]
            assert [s.query["resourceVersion"] for s in streams] == ["", rv, ""]
            assert len(backoff.delays) == 1  # only before the relist, none before the retry
            await informer.stop()

    run(scenario())


def _key(name: str) -> Any:
    from declop.kube.keys import Request

    return Request("default", name)


# -- relist backoff ---------------------------------------------------------------------------


def test_in_stream_410_storm_is_backed_off_at_client_go_rates() -> None:
    """A server answering every watch with an in-stream 410 must not get a LIST per answer.
    With the real defaults (0.8 s doubling, jitter in [d, 2d)), 2.3 s hold at most 3."""

    async def scenario() -> None:
        async with ListWatchServer() as server:
            server.add("a")
            for _ in range(20):
                server.script_watch(Step.error(410, "Expired"))
            backoff = RecordingBackoff()
            informer, _ = await start(server, list_mode="paged", backoff=backoff)
            await asyncio.sleep(2.3)
            assert server.count("list") <= 3
            lists = [r.at for r in server.requests if r.verb == "list"]
            for (a, b), delay in zip(zip(lists, lists[1:]), backoff.delays):
                assert b - a >= delay >= 0.8
            await informer.stop()

    run(scenario())


@MODES
def test_every_relist_waits_for_a_growing_backoff(mode: str) -> None:
    """Every relist, in-stream 410 included, waits for the next backoff delay; the delays double
    (compressed here: 0.05 s doubling to 0.4 s, same code path)."""

    async def scenario() -> None:
        async with ListWatchServer() as server:
            server.add("a")
            for _ in range(6):
                if mode == "stream":
                    server.script_watch(Step.initial_events(), Step.bookmark(initial_end=True), Step.error(410, "Expired"))
                else:
                    server.script_watch(Step.error(410, "Expired"))
            backoff = RecordingBackoff(initial=0.05, cap=0.4)
            informer, _ = await start(server, list_mode=mode, backoff=backoff)
            await until(lambda: informer.lists >= 6, what="six syncs")
            syncs = [r.at for r in server.requests if r.verb == ("stream" if mode == "stream" else "list")]
            for (a, b), delay in zip(zip(syncs, syncs[1:]), backoff.delays):
                assert b - a >= delay
            base = [min(0.05 * 2**i, 0.4) for i in range(5)]
            assert all(b <= d < min(2 * b, 0.4) + 1e-9 for d, b in zip(backoff.delays, base))
            await informer.stop()

    run(scenario())


@pytest.mark.parametrize("code", [500, 503, 400, 404, 403])
def test_reflector_every_in_stream_error_but_429_relists(code: int, caplog: pytest.LogCaptureFixture) -> None:
    """TestRetryInternalError (with MaxInternalErrorRetryDuration 0, the default): any ERROR event
    but 429 ends the watch and relists, so an object the watch could not deliver (deleted while
    the apiserver could not decode it) leaves the cache."""
    caplog.set_level(logging.INFO, "declop.informer")

    async def scenario() -> None:
        async with ListWatchServer() as server:
            server.add("a")
            server.add("broken")
            server.script_watch(Step.error(code, "InternalError"))
            informer, rec = await start(server, list_mode="paged", backoff=RecordingBackoff(initial=0.05))
            server._state.objects.pop("broken")  # gone, and no watch event will ever say so
            await until(lambda: informer.lists == 2, what="a relist")
            assert names(informer) == {"a"}
            assert ("broken", None) in rec.events  # the deletion, synthesised by the relist
            await informer.stop()

    run(scenario())
    assert any(f"{code} InternalError" in r.getMessage() and "relisting in" in r.getMessage() for r in informer_records(caplog))


@pytest.mark.parametrize("where", ["in-stream", "on-connect"])
def test_reflector_no_relist_on_too_many_requests(where: str) -> None:
    """TestNoRelistOnTooManyRequests / TestBackoffOnTooManyRequests: 429 backs off (at least
    Retry-After / retryAfterSeconds) and re-watches from the same resourceVersion: no LIST."""

    async def scenario() -> None:
        async with ListWatchServer() as server:
            server.add("a")
            if where == "in-stream":
                server.script_watch(Step.error(429, "TooManyRequests", retry_after=1))
            else:
                server.script_watch(Step.status(429, "TooManyRequests", retry_after=1))
            informer, _ = await start(server, list_mode="paged", backoff=RecordingBackoff(initial=0.05))
            rv = informer.store.resource_version
            await until(lambda: server.count("watch") >= 2, what="the re-watch")
            watches = [r for r in server.requests if r.verb == "watch"]
            assert watches[1].at - watches[0].at >= 1.0  # Retry-After honoured
            assert watches[1].query["resourceVersion"] == rv
            assert server.count("list") == 1
            await informer.stop()

    run(scenario())


@pytest.mark.parametrize(
    "message, quiet_start, level",
    [
        ("storage is (re)initializing", 10.0, logging.DEBUG),  # at start: routine, not worth a line
        ("storage is (re)initializing", 0.0, logging.INFO),  # later (an apiserver restart): said plainly
        ("too many requests", 10.0, logging.ERROR),
    ],
)
def test_a_watch_cache_still_filling_is_not_an_error(
    message: str, quiet_start: float, level: int, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CRD created a moment ago: the apiserver answers the first streaming list 429 "storage is
    (re)initializing" with a Retry-After (k8s.io/apiserver cacher; a LIST's 429 is retried by the
    transport). That is expected: in the informer's first QUIET_START seconds it is logged at
    DEBUG (``declop dev`` applies a CRD and starts at once), after that at INFO, in words that do
    not read like an error (no status code, no "TooManyRequests"); the Retry-After is honoured
    and the informer syncs. Any other 429 stays an ERROR."""
    monkeypatch.setattr(watch_module, "QUIET_START", quiet_start)
    caplog.set_level(logging.DEBUG, "declop.informer")

    async def scenario() -> None:
        async with ListWatchServer() as server:
            server.add("a")
            server.script_watch(Step.status(429, "TooManyRequests", retry_after=1, message=message))
            informer, _ = await start(server, list_mode="stream", backoff=RecordingBackoff(initial=0.05))
            assert names(informer) == {"a"}
            streams = [r for r in server.requests if r.verb == "stream"]
            assert streams[1].at - streams[0].at >= 1.0  # Retry-After honoured
            await informer.stop()

    run(scenario())
    retried = [r for r in informer_records(caplog) if "retrying in" in r.getMessage()]
    assert [r.levelno for r in retried] == [level]
    if level != logging.ERROR:
        text = retried[0].getMessage()
        assert text.startswith("Waiting for the apiserver to load ") and "into its watch cache (normal for a few seconds" in text
        assert "429" not in text and "TooManyRequests" not in text and "initializing" not in text


def test_outage_of_500s_backs_off_logs_each_attempt_and_recovers(caplog: pytest.LogCaptureFixture) -> None:
    """Bad input and faults: every request answered with 500, then recovery. One ERROR line per
    attempt with the next delay; attempts spaced by the doubling backoff; after recovery the
    cache holds exactly what changed during the outage. Compressed: 0.05 s doubling to 0.4 s
    over ~2 s stands for 0.8 s doubling to 30 s over a minute (the count at real defaults is
    checked by test_backoff_at_real_defaults_allows_about_ten_lists_a_minute)."""
    caplog.set_level(logging.INFO, "declop.informer")

    async def scenario() -> None:
        async with ListWatchServer() as server:
            for name in "abc":
                server.add(name)
            backoff = RecordingBackoff(initial=0.05, cap=0.4)
            informer, rec = await start(server, list_mode="paged", backoff=backoff)
            await until(lambda: server._open, what="the watch")
            server.failing = 500
            server.compact()  # the watch breaks with a 410; every attempt after that meets a 500
            await until(lambda: server.count("list") >= 6, what="attempts during the outage")
            server.add("d")
            server.modify("b", {"changed": "yes"})
            server.delete("c")
            outage = list(server.requests)
            server.failing = None
            await until(lambda: names(informer) == {"a", "b", "d"}, what="recovery")
            assert informer.store.get(_key("b"))["data"] == {"changed": "yes"}
            assert ("c", None) in rec.events and (None, "d") in rec.events and ("b", "b") in rec.events
            lists = [r.at for r in outage if r.verb == "list"][1:]
            failing_delays = backoff.delays[1 : len(lists)]
            for (a, b), delay in zip(zip(lists, lists[1:]), failing_delays):
                assert b - a >= delay
            assert informer.last_error == ""
            await informer.stop()
            return backoff.delays

    delays = run(scenario())
    errors = [r.getMessage() for r in informer_records(caplog) if r.levelno == logging.ERROR]
    assert errors and all("failed" in m and "retrying in" in m for m in errors)
    # one ERROR line per failed attempt, each naming the delay it was followed by
    assert len(errors) == len(delays) - 1
    assert [float(m.rsplit("retrying in ", 1)[1].split()[0]) for m in errors] == [round(d, 1) for d in delays[1:]]


# -- watches that end -------------------------------------------------------------------------


def test_idle_watch_rewatches_at_once_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """A watch silent for the idle timeout (no bookmarks: watch cache off) is normal.
    DEBUG only, re-watch at once from the last resourceVersion, no LIST."""
    caplog.set_level(logging.DEBUG, "declop.informer")

    async def scenario() -> None:
        async with ListWatchServer() as server:
            server.add("a")
            for _ in range(3):
                server.script_watch(Step.history(), Step.idle(5))
            informer, _ = await start(server, list_mode="paged", idle_timeout=0.3)
            await until(lambda: server.count("watch") >= 4, what="three idle re-watches")
            watches = [r.at for r in server.requests if r.verb == "watch"]
            # the idle timeout, then at once (generous for a loaded machine: the logs below prove
            # that no backoff was taken)
            assert all(0.25 < b - a < 0.3 + 1.0 for a, b in zip(watches, watches[1:]))
            assert server.count("list") == 1
            await informer.stop()

    run(scenario())
    assert [r for r in informer_records(caplog) if r.levelno >= logging.INFO] == []
    assert any("idle" in r.getMessage() for r in informer_records(caplog))


def test_working_watch_cut_by_the_server_rewatches_without_delay(caplog: pytest.LogCaptureFixture) -> None:
    """The server drops the connection mid-stream after events (EOF, no terminating chunk):
    re-watched at once (INFO), no backoff taken, no LIST."""
    caplog.set_level(logging.INFO, "declop.informer")

    async def scenario() -> None:
        async with ListWatchServer() as server:
            server.add("a")
            backoff = RecordingBackoff()
            for i in range(5):
                server.script_watch(Step.history(), Step.idle(0.2), Step.event("ADDED", _cm(f"s{i}", 100 + i)), Step.abort())
            informer, _ = await start(server, list_mode="paged", backoff=backoff)
            await until(lambda: server.count("watch") >= 6, what="five cuts")
            assert {f"s{i}" for i in range(5)} <= names(informer)
            watches = [r.at for r in server.requests if r.verb == "watch"]
            assert max(b - a for a, b in zip(watches, watches[1:])) < 0.2 + 1.0
            assert server.count("list") == 1 and backoff.delays == []
            resumed = [r.query["resourceVersion"] for r in server.requests if r.verb == "watch"][1:]
            assert resumed == [str(100 + i) for i in range(5)]
            await informer.stop()

    run(scenario())
    assert not [r for r in informer_records(caplog) if r.levelno >= logging.WARNING]


def test_stream_that_dies_before_delivering_anything_backs_off(caplog: pytest.LogCaptureFixture) -> None:
    """A watch request whose stream dies at once with nothing in it is a failure: ERROR, backoff."""
    caplog.set_level(logging.INFO, "declop.informer")

    async def scenario() -> None:
        async with ListWatchServer() as server:
            server.add("a")
            backoff = RecordingBackoff(initial=0.2)
            server.script_watch(Step.abort())
            server.script_watch(Step.abort())
            informer, _ = await start(server, list_mode="paged", backoff=backoff)
            await until(lambda: server.count("watch") >= 3)
            watches = [r.at for r in server.requests if r.verb == "watch"]
            assert watches[1] - watches[0] >= backoff.delays[0] >= 0.2
            assert watches[2] - watches[1] >= backoff.delays[1] >= 0.4
            assert server.count("list") == 1  # unreachable-like: re-watch, the RV is still good
            await informer.stop()

    run(scenario())
    assert len([r for r in informer_records(caplog) if r.levelno == logging.ERROR]) == 2


def test_reflector_very_short_watch_backs_off_and_relists() -> None:
    """client-go's VeryShortWatchError: a watch closed normally at once with no events."""

    async def scenario() -> None:
        async with ListWatchServer() as server:
            server.add("a")
            backoff = RecordingBackoff(initial=0.2)
            server.script_watch(Step.close())
            informer, _ = await start(server, list_mode="paged", backoff=backoff)
            await until(lambda: informer.lists == 2)
            lists = [r.at for r in server.requests if r.verb == "list"]
            assert lists[1] - lists[0] >= backoff.delays[0] >= 0.2
            await informer.stop()

    run(scenario())


def test_reflector_watch_timeout_is_randomised_and_the_client_deadline_above_it() -> None:
    """TestWatchTimeout: timeoutSeconds in [min, 2 min)."""

    async def scenario() -> None:
        async with ListWatchServer() as server:
            informer, _ = await start(server, list_mode="paged", min_watch_timeout=1)
            await until(lambda: server.count("watch") >= 4, what="server-timed-out watches")
            values = {int(r.query["timeoutSeconds"]) for r in server.requests if r.verb == "watch"}
            assert values <= {1}
            await informer.stop()
            informer2, _ = await start(server, list_mode="paged")
            await until(lambda: server.count("watch") >= 5)
            last = int(server.requests[-1].query["timeoutSeconds"])
            assert 300 <= last < 600
            await informer2.stop()

    run(scenario())


# -- pagination -------------------------------------------------------------------------------


def test_reflector_full_list_if_expired() -> None:
    """TestReflectorFullListIfExpired: a 410 on a page with a continue token falls back to one
    full unpaged LIST, then the informer watches normally."""

    async def scenario() -> None:
        async with ListWatchServer() as server:
            for i in range(5):
                server.add(f"o{i}")
            server.script_list(Step.expire_continue(), Step.expire_continue())
            informer, _ = await start(server, list_mode="paged", page_size=2)
            assert names(informer) == {f"o{i}" for i in range(5)}
            lists = [r.query for r in server.requests if r.verb == "list"]
            assert [(q.get("limit"), q.get("continue")) for q in lists] == [("2", None), ("2", "2"), (None, None)]
            server.add("late")
            await until(lambda: "late" in names(informer))
            assert server.count("list") == 3 and informer.lists == 1
            await informer.stop()

    run(scenario())


# -- bookmarks and bad input ------------------------------------------------------------------


def test_reflector_bookmarks_advance_the_resource_version_only() -> None:
    async def scenario() -> None:
        async with ListWatchServer() as server:
            server.add("a")
            informer, rec = await start(server, list_mode="paged")
            before = list(rec.events)
            server._state.rv += 5
            server.script_watch(Step.bookmark(), Step.idle(5))
            await until(lambda: server._open, what="the watch")
            assert server.cut() == 1
            await until(lambda: informer.store.resource_version == server.resource_version)
            assert rec.events == before
            await informer.stop()

    run(scenario())


def test_bad_events_are_logged_once_each_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    """Bad input: an event of an unknown type, an object without metadata, another kind, a line
    that is not JSON. Each is logged once and skipped; the informer goes on (the next good
    event is applied on the same stream)."""
    caplog.set_level(logging.INFO, "declop.informer")

    async def scenario() -> None:
        async with ListWatchServer() as server:
            server.add("a")
            server.script_watch(
                Step.history(),
                Step.event("WEIRD", _cm("w", 50)),
                Step.event("ADDED", {"kind": "ConfigMap", "data": {}}),
                Step.event("MODIFIED", {"kind": "ConfigMap", "metadata": "nope"}),
                Step.event("ADDED", {**_cm("p", 51), "kind": "Pod"}),
                Step.raw(b"{not json"),
                Step.event("ADDED", _cm("good", 52)),
                then_live=True,
            )
            informer, _ = await start(server, list_mode="paged")
            await until(lambda: "good" in names(informer))
            assert names(informer) == {"a", "good"} and informer.store.resource_version == "52"
            assert server.count("watch") == 1 and server.count("list") == 1
            await informer.stop()

    run(scenario())
    skipped = [r for r in informer_records(caplog) if r.getMessage().startswith("Skipped a watch event")]
    assert len(skipped) == 5 and all(r.levelno == logging.WARNING for r in skipped)


def _cm(name: str, rv: int) -> dict[str, Any]:
    return {"kind": "ConfigMap", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": "default", "resourceVersion": str(rv)}, "data": {}}


@MODES
def test_relist_is_computed_in_chunks_and_swapped_in_atomically(mode: str) -> None:
    """A large relist yields to the loop while the new content is computed (no long stall), yet
    a reader on the loop sees the old store whole until the swap, then the new one whole; the
    changes reach subscribers in store order (changed and added objects in list order, then the
    synthesised deletions of vanished keys)."""

    async def scenario() -> None:
        async with ListWatchServer() as server:
            n = 3000  # three chunks of the informer's computation, and more
            for i in range(n):
                server.add(f"o{i:04d}")
            informer, rec = await start(server, list_mode=mode, backoff=RecordingBackoff(initial=0.01, cap=0.02))

            def content() -> frozenset[tuple[str, str]]:
                return frozenset((o["metadata"]["name"], o["metadata"]["resourceVersion"]) for o in informer.store)

            old = content()
            in_replace: list[bool] = [False]
            begin = informer._writer.begin_replace

            def begin_replace(objs: Any, rv: str) -> Any:
                job = begin(objs, rv)
                commit = job.commit

                def committed() -> Any:
                    in_replace[0] = False
                    return commit()

                job.commit = committed  # type: ignore[method-assign]
                in_replace[0] = True
                return job

            informer._writer.begin_replace = begin_replace  # type: ignore[method-assign]
            samples: list[tuple[bool, frozenset[tuple[str, str]]]] = []

            async def reader() -> None:
                while True:
                    samples.append((in_replace[0], content()))
                    await asyncio.sleep(0)

            objects = server._state.objects
            for i in range(0, n, 2):  # every other object changed
                objects[f"o{i:04d}"]["metadata"]["resourceVersion"] = str(100_000 + i)
            for i in range(n - 500, n):  # the last 500 vanished
                del objects[f"o{i:04d}"]
            for i in range(500):  # 500 new ones
                objects[f"p{i:04d}"] = _cm(f"p{i:04d}", 200_000 + i)
            new = frozenset((k, o["metadata"]["resourceVersion"]) for k, o in objects.items())
            del rec.events[:]
            task = asyncio.get_running_loop().create_task(reader())
            await until(lambda: server._open, what="the watch")
            server.compact()
            await until(lambda: informer.lists == 2, what="the relist")
            await until(lambda: len(rec.events) >= (n - 500) // 2 + 500 + 500, what="the relist's events")
            task.cancel()
            await informer.stop()

            assert content() == new
            during = [c for busy, c in samples if busy]
            assert len(during) >= 3, "the loop ran while the relist was being computed"
            assert all(c == old for c in during)  # never a partial view while computing
            assert {c for _, c in samples} <= {old, new}  # the swap is one step
            changed = [(f"o{i:04d}", f"o{i:04d}") for i in range(0, n - 500, 2)]
            added = [(None, f"p{i:04d}") for i in range(500)]
            deleted = [(f"o{i:04d}", None) for i in range(n - 500, n)]
            assert rec.events == changed + added + deleted

    run(scenario())


# -- GC ---------------------------------------------------------------------------------------


class Cycle:
    def __init__(self) -> None:
        self.me = self


@MODES
def test_gc_freeze_pins_no_garbage_made_during_a_list(mode: str) -> None:
    """Cycles that become garbage while the collector is paused for a sync are
    collected, not frozen forever; tracked objects return to their baseline after relists.

    A second informer whose streaming list never ends keeps the collector paused (as when many
    informers sync at start-up), so nothing but the informer's own collection can free them."""
    gc.collect()
    gc.unfreeze()
    made: list[weakref.ref[Cycle]] = []

    async def churn() -> None:  # the garbage some other part of the process makes meanwhile
        while True:
            if not gc.isenabled():
                made.append(weakref.ref(Cycle()))
            await asyncio.sleep(0.001)

    async def scenario() -> tuple[int, int]:
        async with ListWatchServer() as server, ListWatchServer() as slow:
            for i in range(1200):  # > 1000 changes per relist: every relist freezes
                server.add(f"o{i}")
            informer, _ = await start(server, list_mode=mode, backoff=RecordingBackoff(initial=0.01, cap=0.02))
            gc.collect()
            baseline = len(gc.get_objects()) + gc.get_freeze_count()
            slow.add("s")
            slow.script_watch(Step.initial_events(), Step.idle(60))
            holder = Informer(slow.transport(), slow.resource, namespace="default", list_mode="stream")
            holder.start()
            await until(lambda: not gc.isenabled(), what="the collector paused by a sync")
            task = asyncio.get_running_loop().create_task(churn())
            for round_ in range(3):
                for i in range(1200):
                    server._state.objects[f"o{i}"]["metadata"]["resourceVersion"] = f"{10_000 * (round_ + 1) + i}"
                await until(lambda: server._open, what="the watch")
                server.compact()
                await until(lambda r=round_: informer.lists == r + 2, what="a relist")
            # a relist of more than a chunk of changes emits them with the collector paused too
            await until(lambda: not informer.listwatch.sync.emitting, what="the last relist's changes emitted")
            task.cancel()
            await holder.stop()
            assert gc.isenabled()
            gc.collect()
            after = len(gc.get_objects()) + gc.get_freeze_count()
            assert informer.store.get(_key("o7"))["metadata"]["resourceVersion"] == "30007"
            await informer.stop()
            return baseline, after

    try:
        baseline, after = run(scenario())
        gc.collect()
        assert len(made) >= 10  # cycles were made while the collector was paused
        assert [r for r in made if r() is not None] == []  # and none of them was pinned
        assert after < baseline + 300, (baseline, after)
    finally:
        gc.unfreeze()
        gc.collect()


@MODES
def test_what_a_big_sync_emission_leaves_is_kept_out_of_full_collections(mode: str) -> None:
    """What subscribers keep for the changes of a sync of more than a chunk (a queue entry per
    key) is made with the collector paused and frozen chunk by chunk, so the full passes that
    follow do not walk it (long stalls at many keys otherwise); a small relist's changes
    are emitted with the collector running and freeze nothing."""
    gc.collect()
    gc.unfreeze()
    kept: list[list[str]] = []
    enabled: list[bool] = []

    def queue_like(old: Any, new: Any) -> None:
        enabled.append(gc.isenabled())
        kept.append([(new or old)["metadata"]["name"]])  # a tracked container that outlives the emission

    async def scenario() -> None:
        async with ListWatchServer() as server:
            for i in range(2500):
                server.add(f"o{i}")
            informer = Informer(server.transport(), server.resource, namespace="default", list_mode=mode)
            informer.subscribe(queue_like)
            informer.start()
            await asyncio.wait_for(informer.synced.wait(), 15)
            await until(lambda: len(kept) == 2500, what="the sync's changes")
            assert gc.isenabled()  # resumed once the emission ended
            tracked = {id(o) for o in gc.get_objects()}
            assert not any(id(entry) in tracked for entry in kept)  # frozen: out of every pass
            assert enabled == [False] * 2500
            del kept[:], enabled[:]
            for i in range(5):  # a small relist: 5 changes
                server._state.objects[f"o{i}"]["metadata"]["resourceVersion"] = f"{90_000 + i}"
            await until(lambda: server._open, what="the watch")
            server.compact()
            await until(lambda: len(kept) == 5, what="the relist's changes")
            assert enabled == [True] * 5
            tracked = {id(o) for o in gc.get_objects()}
            assert all(id(entry) in tracked for entry in kept)
            await informer.stop()

    try:
        run(scenario())
    finally:
        gc.unfreeze()
        gc.collect()


@MODES
def test_a_big_sync_emits_its_changes_a_step_at_a_time(mode: str) -> None:
    """The loop runs between every EMIT_STEP changes of a sync (each change costs a subscriber
    work: a whole chunk at once is a long stall), and every change is emitted once, in order."""
    from declop.cache.listing import EMIT_STEP

    ticks = 0
    per_tick: dict[int, int] = {}
    seen: list[str] = []

    def subscriber(old: Any, new: Any) -> None:
        per_tick[ticks] = per_tick.get(ticks, 0) + 1
        seen.append(new["metadata"]["name"])

    async def scenario() -> None:
        nonlocal ticks

        async def count_ticks() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0)
                ticks += 1

        async with ListWatchServer() as server:
            for i in range(3000):
                server.add(f"o{i:04d}")
            informer = Informer(server.transport(), server.resource, namespace="default", list_mode=mode)
            informer.subscribe(subscriber)
            counter = asyncio.get_running_loop().create_task(count_ticks())
            informer.start()
            await until(lambda: len(seen) == 3000, what="the sync's changes")
            counter.cancel()
            await informer.stop()

    run(scenario())
    assert seen == [f"o{i:04d}" for i in range(3000)]
    assert max(per_tick.values()) <= EMIT_STEP, max(per_tick.values())


def test_a_long_streaming_list_is_reported_at_10_s_and_warned_about_at_60_s(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A streaming list still without its initial-events-end bookmark after 10 s is one INFO
    line with the count so far (a large list), after 60 s one WARNING that names the way out;
    the list still completes. The informer's clock advances 5 s per reading here."""

    class SteppingClock:
        def __init__(self) -> None:
            self.now = time.monotonic()

        def monotonic(self) -> float:
            self.now += 5.0
            return self.now

    monkeypatch.setattr(watch_module, "time", SteppingClock())
    caplog.set_level(logging.INFO, logger="declop.informer")

    async def scenario() -> int:
        async with ListWatchServer() as server:
            for i in range(30):
                server.add(f"o{i}")
            informer, _ = await start(server, list_mode="stream")
            count = len(informer.store)
            await informer.stop()
            return count

    assert run(scenario()) == 30
    still = [r for r in informer_records(caplog) if "Streaming list" in r.getMessage()]
    assert [r.levelno for r in still] == [logging.INFO, logging.WARNING], [r.getMessage() for r in still]
    assert "still listing" in still[0].getMessage()
    assert "--list-mode=paged" in still[1].getMessage()


def test_watch_client_deadline_sits_above_the_randomised_server_timeout() -> None:
    """The client's total deadline for a watch is above the server's timeoutSeconds (so the
    server ends it normally), drawn from [5, 10) minutes per watch; the idle read timeout is
    the informer's idle_timeout."""
    from declop.kube.discovery import ResourceInfo

    seen: list[tuple[dict[str, str], dict[str, Any]]] = []

    class Recording:
        async def stream(self, path: str, params: dict[str, str], **kw: Any) -> Any:
            seen.append((dict(params), kw))
            if False:  # pragma: no cover - an async generator that yields nothing
                yield b""

    resource = ResourceInfo(group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True)

    async def scenario() -> None:
        informer = Informer(Recording(), resource, namespace="default", list_mode="paged")  # type: ignore[arg-type]
        for _ in range(20):
            await informer.listwatch.watch(initial=False, resource_version="7")

    run(scenario())
    values = [int(params["timeoutSeconds"]) for params, _ in seen]
    assert all(300 <= v < 600 for v in values) and len(set(values)) > 1
    for params, kw in seen:
        assert kw["total_timeout"] > int(params["timeoutSeconds"])
        assert kw["read_timeout"] == 90.0


# -- all_synced: the sync gates' wait ---------------------------------------------------------------


def _reported(go: Callable[[], Awaitable[None]]) -> list[dict[str, Any]]:
    """Run ``go`` on a fresh loop; return what reached the loop's exception handler, the
    collector's "exception was never retrieved" among it (collected before the loop closes)."""
    contexts: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: contexts.append(context))
        await go()
        for _ in range(3):
            await asyncio.sleep(0)
        gc.collect()

    asyncio.run(main())
    return contexts


def test_all_synced_returns_once_every_gate_is_set_and_times_out_otherwise() -> None:
    async def go() -> None:
        a, b = asyncio.Event(), asyncio.Event()
        waiting = asyncio.ensure_future(all_synced([a, b], timeout=5))
        a.set()
        await asyncio.sleep(0)
        assert not waiting.done()
        b.set()
        await asyncio.wait_for(waiting, 1)
        with pytest.raises(asyncio.TimeoutError):
            await all_synced([a, asyncio.Event()], timeout=0.01)

    assert _reported(go) == []


@pytest.mark.parametrize("cancels", [1, 2])
def test_a_wait_cancelled_before_the_caches_synced_leaves_nothing_never_retrieved(cancels: int) -> None:
    """A stop before the caches synced cancels the controller's wait, and the loss's deadline
    may cancel it again while the first cancellation is still unwinding the gather. The second
    ends the wait before the gather does; the gather's CancelledError must still be retrieved
    (it was printed as "_GatheringFuture exception was never retrieved" with a traceback)."""

    async def go() -> None:
        # with a bound, as the controller's (120 s): wait_for then waits on a future of its own
        task = asyncio.ensure_future(all_synced([asyncio.Event(), asyncio.Event()], timeout=60))
        await asyncio.sleep(0)  # waiting on the gates
        task.cancel()
        if cancels == 2:
            await asyncio.sleep(0)  # the first cancellation is unwinding the gather ...
            task.cancel()  # ... when the second arrives
        with pytest.raises(asyncio.CancelledError):
            await task

    assert [c["message"] for c in _reported(go)] == []
