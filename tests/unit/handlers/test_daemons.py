"""declop.handlers.daemons: the supervisor step starts, stops, restarts and hands over daemons.

The runner is driven here as the controller drives it — its step with the cached object and phase,
its keeper as a background hook — on a real event loop with a stand-in client (the controller,
the real apiserver and real operator processes: tests/integration/test_daemons_in_process.py and
tests/integration/test_daemon_faults.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable

import pytest

import declop
from declop.errors import RegistrationError
from declop.handlers.daemons import DaemonRunner, DaemonStillRunning, daemon_wants, default_finalizer
from declop.kube import fencing
from declop.kube.fencing import WriteFence
from declop.kube.keys import Request
from declop.kube.labels import parse_selector
from declop.reconcile.result import Phase, Result
from declop.registry import Registry

KEY = Request("ns", "w1")


class Ctx:
    """A stand-in ClientContext (the runner keys its book by it)."""


class _Live:
    def __init__(self, client: FakeClient) -> None:
        self.client = client

    async def get(self, key: Request) -> Any:
        return self.client.get(key)


class FakeClient:
    """What the step's client gives a daemon: ``get`` reads ``objects`` (the 'cache') now."""

    def __init__(self, ctx: Ctx, objects: dict[Request, Any]) -> None:
        self._ctx, self.objects = ctx, objects
        self.live = _Live(self)  # live.get: one GET; here the same dict

    def get(self, key: Request) -> Any:
        if key not in self.objects:
            raise declop.NotFound()
        return dict(self.objects[key])


def obj(generation: int = 1, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": KEY.name, "namespace": KEY.namespace, "generation": generation, **meta}}


def runner(fn: Callable[..., Any], **options: Any) -> DaemonRunner:
    settings = {"wants": daemon_wants(fn, "d"), "stop_timeout": 1.0, "backoff": 0.01, "initial_delay": None}
    settings.update(options)
    return DaemonRunner(fn, "d", client_for=lambda client, key, is_async: client, **settings)


class Harness:
    """A runner with its keeper running, and a client over a dict 'cache'."""

    def __init__(self, r: DaemonRunner) -> None:
        self.r = r
        self.ctx = Ctx()
        self.objects: dict[Request, Any] = {KEY: obj()}
        self.client = FakeClient(self.ctx, self.objects)
        self.stop = asyncio.Event()
        self.keeper: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Harness:
        self.keeper = asyncio.create_task(self.r.keep(self.client, self.stop))
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.stop.set()
        assert self.keeper is not None
        await asyncio.wait_for(self.keeper, 5)

    async def step(self, phase: Phase = Phase.UPDATED, key: Request = KEY) -> Any:
        o = self.objects.get(key)
        return await self.r.step(key, o, Phase.DELETED if o is None else phase, self.client, None)

    def running(self) -> list[Request]:
        return self.r.running(self.ctx)


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


def test_step_starts_the_daemon_once_and_deleting_stops_it_before_returning() -> None:
    log: list[str] = []

    async def daemon(name: str, stop: asyncio.Event) -> None:
        log.append(f"start {name}")
        await stop.wait()
        await asyncio.sleep(0.05)  # ending takes a moment: the step must wait for it
        log.append(f"stop {name}")

    async def main() -> None:
        async with Harness(runner(daemon)) as h:
            assert await h.step() is None
            await until(lambda: log == ["start w1"])
            assert await h.step() is None  # already running: not a second one
            await asyncio.sleep(0.02)
            assert log == ["start w1"] and h.running() == [KEY] and h.r.starts == 1
            assert await h.step(Phase.DELETING) is None
            assert log == ["start w1", "stop w1"]  # ended before the step returned
            assert h.running() == []

    asyncio.run(main())


def test_an_object_gone_or_out_of_the_filter_stops_the_daemon() -> None:
    seen: list[str] = []

    async def daemon(stop: asyncio.Event) -> None:
        seen.append("start")
        await stop.wait()
        seen.append("stop")

    async def main() -> None:
        async with Harness(runner(daemon)) as h:
            await h.step()
            await until(lambda: seen == ["start"])
            del h.objects[KEY]  # left the filtered cache: the step sees no object
            await h.step()
            assert seen == ["start", "stop"] and h.running() == []

    asyncio.run(main())


def test_an_async_daemon_that_ignores_stop_is_cancelled_after_stop_timeout() -> None:
    seen: list[Any] = []

    async def daemon() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main() -> None:
        async with Harness(runner(daemon, stop_timeout=0.2)) as h:
            await h.step()
            await until(lambda: h.running() == [KEY])
            await asyncio.sleep(0.01)
            loop = asyncio.get_running_loop()
            began = loop.time()
            await h.step(Phase.DELETING)
            took = loop.time() - began
            assert seen == ["cancelled"] and h.running() == []
            assert 0.2 <= took < 1.0

    asyncio.run(main())


def test_a_thread_that_ignores_stop_keeps_the_finalizer_until_it_returns() -> None:
    release = threading.Event()
    flags: list[Any] = []

    def daemon(stop: threading.Event) -> None:
        flags.append(stop)
        release.wait(10)

    async def main() -> None:
        async with Harness(runner(daemon, stop_timeout=0.1)) as h:
            await h.step()
            await until(lambda: bool(flags))
            assert isinstance(flags[0], threading.Event)
            with pytest.raises(DaemonStillRunning, match="did not end within stop_timeout=0.1"):
                await h.step(Phase.DELETING)
            assert flags[0].is_set() and h.running() == [KEY]
            release.set()
            await until(lambda: h.running() == [])
            assert await h.step(Phase.DELETING) is None

    asyncio.run(main())


def test_a_crash_restarts_after_backoff_with_retry_counted() -> None:
    retries: list[tuple[int, float]] = []

    async def daemon(retry: int, stop: asyncio.Event) -> None:
        retries.append((retry, asyncio.get_running_loop().time()))
        if retry < 2:
            raise RuntimeError("boom")
        await stop.wait()

    async def main() -> None:
        async with Harness(runner(daemon, backoff=0.1)) as h:
            await h.step()
            await until(lambda: len(retries) == 3)
            assert [r for r, _ in retries] == [0, 1, 2]
            gaps = [b - a for (_, a), (_, b) in zip(retries, retries[1:])]
            assert all(g >= 0.1 for g in gaps), gaps
            assert h.r.starts == 1  # restarted in place: one daemon, never two

    asyncio.run(main())


def test_an_exception_delay_overrides_backoff() -> None:
    times: list[float] = []

    class Later(Exception):
        delay = 0.05

    async def daemon(retry: int, stop: asyncio.Event) -> None:
        times.append(asyncio.get_running_loop().time())
        if retry == 0:
            raise Later()
        await stop.wait()

    async def main() -> None:
        async with Harness(runner(daemon, backoff=60)) as h:
            await h.step()
            await until(lambda: len(times) == 2, timeout=2)
            assert 0.05 <= times[1] - times[0] < 1

    asyncio.run(main())


def test_a_returned_daemon_is_done_until_the_generation_changes() -> None:
    runs: list[int] = []

    async def daemon(current: Callable[[], Any]) -> None:
        runs.append(current()["metadata"]["generation"])

    async def main() -> None:
        async with Harness(runner(daemon)) as h:
            await h.step()
            await until(lambda: runs == [1] and h.running() == [])
            await h.step()
            await asyncio.sleep(0.02)
            assert runs == [1]
            h.objects[KEY] = obj(generation=2)
            await h.step()
            await until(lambda: runs == [1, 2])

    asyncio.run(main())


def test_current_reads_the_cache_now_not_a_snapshot() -> None:
    seen: list[Any] = []
    go = asyncio.Event()

    async def daemon(current: Callable[[], Any], stop: asyncio.Event) -> None:
        seen.append(current()["metadata"].get("labels"))
        await go.wait()
        seen.append(current()["metadata"].get("labels"))
        await stop.wait()

    async def main() -> None:
        async with Harness(runner(daemon)) as h:
            await h.step()
            await until(lambda: len(seen) == 1)
            h.objects[KEY] = obj(labels={"a": "b"})
            go.set()
            await until(lambda: len(seen) == 2)
            assert seen == [None, {"a": "b"}]

    asyncio.run(main())


def test_initial_delay_waits_and_a_stop_ends_the_wait() -> None:
    started: list[float] = []

    async def daemon(stop: asyncio.Event) -> None:
        started.append(asyncio.get_running_loop().time())
        await stop.wait()

    async def main() -> None:
        async with Harness(runner(daemon, initial_delay=0.15)) as h:
            t0 = asyncio.get_running_loop().time()
            await h.step()
            await until(lambda: bool(started))
            assert started[0] - t0 >= 0.15
            await h.step(Phase.DELETING)
        async with Harness(runner(daemon, initial_delay=30)) as h:
            await h.step()
            await asyncio.sleep(0.01)
            t0 = asyncio.get_running_loop().time()
            await h.step(Phase.DELETING)
            assert asyncio.get_running_loop().time() - t0 < 0.5 and len(started) == 1

    asyncio.run(main())


def test_no_daemon_starts_without_the_keeper_and_its_stop_ends_them_all() -> None:
    events: list[str] = []

    async def daemon(name: str, stop: asyncio.Event) -> None:
        events.append(f"start {name}")
        await stop.wait()
        events.append(f"stop {name}")

    async def main() -> None:
        r = runner(daemon)
        h = Harness(r)
        assert await h.step() == Result(requeue_after=1.0)  # the keeper does not run yet
        assert events == []
        async with h:
            other = Request("ns", "w2")
            h.objects[other] = obj()
            await h.step()
            await h.step(key=other)
            await until(lambda: len(events) == 2)
        # the keeper returned only once both ended
        assert sorted(events[2:]) == ["stop w1", "stop w2"] and h.running() == []
        assert await h.step() == Result(requeue_after=1.0)  # closed: none starts after the stop

    asyncio.run(main())


def test_a_cancelled_keeper_cancels_async_daemons_at_once() -> None:
    seen: list[str] = []

    async def daemon() -> None:
        try:
            await asyncio.sleep(3600)  # ignores stop
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main() -> None:
        h = Harness(runner(daemon, stop_timeout=30))
        await h.__aenter__()
        await h.step()
        await until(lambda: h.running() == [KEY])
        h.stop.set()
        await asyncio.sleep(0.01)
        assert h.keeper is not None
        h.keeper.cancel()  # the lifecycle's grace is over (or a Lease was lost)
        await asyncio.wait_for(asyncio.gather(h.keeper, return_exceptions=True), 2)
        assert seen == ["cancelled"] and h.running() == []

    asyncio.run(main())


class FakeShards:
    """What a daemon uses of a ShardSet: in-flight counts and the drop notice."""

    def __init__(self) -> None:
        self.in_flight: dict[int, int] = {}
        self.on_dropped: Callable[[int], None] | None = lambda i: self.dropped.append(i)
        self.dropped: list[int] = []

    def begin(self, i: int) -> None:
        self.in_flight[i] = self.in_flight.get(i, 0) + 1

    def end(self, i: int) -> None:
        self.in_flight[i] -= 1


def test_a_daemon_writes_under_a_fence_of_its_own_and_counts_in_flight_in_its_range() -> None:
    shards = FakeShards()
    valid = [True]
    fences: list[Any] = []

    async def daemon(stop: asyncio.Event) -> None:
        fences.append(fencing.current())
        await stop.wait()
        await asyncio.sleep(0.05)

    async def main() -> None:
        async with Harness(runner(daemon)) as h:
            call_fence = WriteFence(lambda: valid[0], "ns/lease-3", KEY, (shards, 3))
            token = fencing.enter(call_fence)
            try:
                await h.step()
            finally:
                fencing.leave(token)
            await until(lambda: bool(fences))
            fence = fences[0]
            assert fence is not call_fence and fence.key == KEY and fence.lease == "ns/lease-3"
            fence.check("PATCH", "/x")  # valid: passes
            valid[0] = False
            with pytest.raises(declop.Fenced):
                fence.check("PATCH", "/x")
            assert call_fence.tripped is None  # the call's fence is not the daemon's
            assert shards.in_flight == {3: 1}
            assert shards.on_dropped is not None
            shards.on_dropped(3)  # range 3 starts draining (or is lost)
            assert shards.dropped == [3]  # what listened before still hears it
            await until(lambda: shards.in_flight == {3: 0})
            assert h.running() == []

    asyncio.run(main())


def test_a_drop_of_another_range_leaves_the_daemon_running() -> None:
    shards = FakeShards()

    async def daemon(stop: asyncio.Event) -> None:
        await stop.wait()

    async def main() -> None:
        async with Harness(runner(daemon)) as h:
            token = fencing.enter(WriteFence(lambda: True, "ns/l", KEY, (shards, 1)))
            try:
                await h.step()
            finally:
                fencing.leave(token)
            await until(lambda: h.running() == [KEY])
            assert shards.on_dropped is not None
            shards.on_dropped(2)
            await asyncio.sleep(0.02)
            assert h.running() == [KEY] and shards.in_flight == {1: 1}
        assert shards.in_flight == {1: 0}

    asyncio.run(main())


def test_a_sync_daemon_runs_in_its_own_thread_with_the_fence() -> None:
    seen: list[Any] = []

    def daemon(stop: threading.Event, current: Callable[[], Any], name: str) -> None:
        seen.append((threading.current_thread().name, fencing.current(), current()["metadata"]["name"], name))
        stop.wait(10)

    async def main() -> None:
        async with Harness(runner(daemon)) as h:
            token = fencing.enter(WriteFence(lambda: True, "ns/leader", KEY))
            try:
                await h.step()
            finally:
                fencing.leave(token)
            await until(lambda: bool(seen))
            thread, fence, got, name = seen[0]
            assert thread.startswith("daemon d ns/w1") and fence.key == KEY and got == name == "w1"
            await h.step(Phase.DELETING)
            assert h.running() == []

    asyncio.run(main())


# -- registration -------------------------------------------------------------------------------


def test_the_decorator_returns_the_function_and_registers_a_reconciler_and_a_keeper() -> None:
    reg = Registry()

    @declop.daemon("widgets.example.com", labels={"app": "x"}, registry=reg)
    async def watch_widget(stop: asyncio.Event) -> None:
        await stop.wait()

    assert callable(watch_widget) and watch_widget.__name__ == "watch_widget"
    (r,) = reg.registrations
    assert r.name == "watch_widget" and r.resource == "widgets.example.com" and r.is_async
    assert r.finalizer == default_finalizer("watch_widget") == "daemons.declop.dev/watch_widget"
    assert r.labels == "app=x"
    (hook,) = reg.hooks
    assert hook.kind == "background" and hook.every_replica and hook.name == "daemons of watch_widget"
    reg.daemon("widgets.example.com")(watch_widget)  # the same module imported twice: harmless
    assert len(reg.registrations) == 1 and len(reg.hooks) == 1


def test_finalizer_false_opts_out_and_a_string_is_used() -> None:
    reg = Registry()

    def a(stop: threading.Event) -> None: ...

    def b(stop: threading.Event) -> None: ...

    reg.daemon("widgets", finalizer=False)(a)
    reg.daemon("widgets", finalizer="example.com/b")(b)
    assert {r.name: r.finalizer for r in reg.registrations} == {"a": None, "b": "example.com/b"}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda reg: reg.daemon("widgets", stop_timeout=-1), "stop_timeout must be a finite number"),
        (lambda reg: reg.daemon("widgets", backoff="x"), "backoff must be a finite number"),
        (lambda reg: reg.daemon("widgets", initial_delay=-2), "initial_delay must be"),
        (lambda reg: reg.daemon("widgets", finalizer=True), "finalizer= is a finalizer name"),
        (lambda reg: reg.daemon("widgets", stop_timout=3), "unknown option stop_timout=: did you mean 'stop_timeout'"),
    ],
)
def test_misuse_is_one_line(call: Callable[[Registry], Any], message: str) -> None:
    def d(stop: Any) -> None: ...

    reg = Registry()
    with pytest.raises(RegistrationError, match=message):
        call(reg)(d)


def test_a_name_too_long_for_the_default_finalizer_asks_for_one() -> None:
    def d(stop: Any) -> None: ...

    with pytest.raises(RegistrationError, match="pass name= or finalizer="):
        Registry().daemon("widgets", name="x" * 70)(d)


def test_kopf_arguments_are_refused_with_what_to_do() -> None:
    reg = Registry()

    def d(spec: Any, stopped: Any) -> None: ...

    with pytest.raises(RegistrationError, match=r"'spec'.*current\(\)"):
        reg.daemon("widgets")(d)


def test_the_keeper_stays_running_while_a_daemon_thread_runs_even_when_cancelled() -> None:
    release = threading.Event()

    def daemon(stop: threading.Event) -> None:
        release.wait(10)  # ignores stop

    async def main() -> None:
        h = Harness(runner(daemon, stop_timeout=0.05))
        await h.__aenter__()
        await h.step()
        await until(lambda: h.running() == [KEY])
        h.stop.set()
        await asyncio.sleep(0.3)
        assert h.keeper is not None and not h.keeper.done()
        h.keeper.cancel()  # the lifecycle gives up on it: it must still count as running
        await asyncio.sleep(0.05)
        assert not h.keeper.done() and h.running() == [KEY]
        release.set()
        await asyncio.wait_for(asyncio.gather(h.keeper, return_exceptions=True), 2)
        assert h.running() == []

    asyncio.run(main())


def test_an_object_that_left_the_filter_loses_the_finalizer_once_its_daemon_ended() -> None:
    sent: list[tuple[str, str, Any]] = []

    class Transport:
        async def request(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
            sent.append((method, path, body))
            return {}

    class Resource:
        group_resource = "configmaps"

        def path(self, namespace: str, name: str) -> str:
            return f"/api/v1/namespaces/{namespace}/configmaps/{name}"

    async def daemon(stop: asyncio.Event) -> None:
        await stop.wait()

    async def main() -> None:
        h = Harness(runner(daemon, finalizer="daemons.declop.dev/d", selector=parse_selector("app=x")))
        h.ctx.transport = Transport()  # type: ignore[attr-defined]
        h.client.primary = Resource()  # type: ignore[attr-defined]
        async with h:
            await h.step()
            await until(lambda: h.running() == [KEY])
            # the filtered cache no longer holds it (obj None); the apiserver still has it in
            # the filter (the cache is ahead, or it is deleted meanwhile): nothing to release
            h.client.objects[KEY] = obj(uid="u1", finalizers=["other", "daemons.declop.dev/d"], labels={"app": "x"})
            assert await h.r.step(KEY, None, Phase.DELETED, h.client, None) is None
            assert h.running() == [] and sent == []
            h.client.objects[KEY] = obj(uid="u1", finalizers=["other", "daemons.declop.dev/d"], labels={"app": "y"})
            assert await h.r.step(KEY, None, Phase.DELETED, h.client, None) is None
            (method, path, ops), = sent
            assert method == "PATCH" and path.endswith("/ns/configmaps/w1")
            assert {"op": "remove", "path": "/metadata/finalizers/1"} in ops
            del h.client.objects[KEY]  # gone for good: nothing to release
            assert await h.r.step(KEY, None, Phase.DELETED, h.client, None) is None
            assert len(sent) == 1

    asyncio.run(main())


def test_the_default_finalizer_is_granted_and_a_daemon_without_one_needs_no_patch() -> None:
    reg = Registry()

    async def held(stop: asyncio.Event) -> None: ...

    async def free(stop: asyncio.Event) -> None: ...

    reg.daemon("configmaps")(held)
    verbs = {(g.resource, g.verb) for g in reg.grants() if g.required}
    assert ("configmaps", "patch") in verbs and ("configmaps", "get") in verbs
    other = Registry()
    other.daemon("configmaps", finalizer=False)(free)
    assert ("configmaps", "patch") not in {(g.resource, g.verb) for g in other.grants() if g.required}
