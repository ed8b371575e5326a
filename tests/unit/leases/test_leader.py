"""Lease leader election against a fake in-memory Lease store (the protocol, not the network).

Timing tests run on a *virtual-time* event loop: its ``time()`` is a :class:`FakeClock`, and
when nothing is ready it advances that clock to the next timer instead of sleeping. The elector
gets the same clock, so ``asyncio.sleep``, ``asyncio.wait_for`` and the elector's deadlines all
see one consistent time and a 10 s renew deadline is tested in microseconds, exactly.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import selectors
from typing import Any, Callable, Coroutine, TypeVar

import pytest

from declop.clock import FakeClock
from declop.errors import ApiError, ConfigError, Conflict, Forbidden, NotFound
from declop.leases.leader import LeaderElector

T = TypeVar("T")


class _VirtualSelector(selectors.BaseSelector):
    """Delegates to a real selector but never blocks: a wait of ``t`` seconds advances the clock."""

    def __init__(self, clock: FakeClock) -> None:
        self._real = selectors.DefaultSelector()
        self._clock = clock

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise RuntimeError("virtual time: nothing is scheduled and nothing can wake the loop (deadlock)")
        self._clock.advance(timeout)
        return []

    def close(self) -> None:
        self._real.close()

    def get_map(self) -> Any:
        return self._real.get_map()


def run_virtual(clock: FakeClock, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``main()`` on an event loop whose time is ``clock`` and which never really waits."""
    loop = asyncio.SelectorEventLoop(_VirtualSelector(clock))
    loop.time = clock  # type: ignore[method-assign]
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


class LeaseServer:
    """Just enough of the coordination.k8s.io Lease API: GET, POST, PUT with resourceVersion checks.

    The Lease exists, free (as a graceful stop leaves it), unless ``existing=False``: a missing
    Lease is created only a lease duration after a candidate first found it missing."""

    def __init__(self, existing: bool = True) -> None:
        self.lease: dict[str, Any] | None = None
        if existing:
            self.lease = {"metadata": {"name": "lock", "namespace": "ns", "resourceVersion": "0"}, "spec": {}}
        self.rv = 0

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        if method == "GET":
            if self.lease is None:
                raise NotFound()
            return copy.deepcopy(self.lease)
        if method == "POST":
            if self.lease is not None:
                raise Conflict()
            self.rv += 1
            self.lease = {**copy.deepcopy(body), "metadata": {**body["metadata"], "resourceVersion": str(self.rv)}}
            return copy.deepcopy(self.lease)
        if method == "PUT":
            if self.lease is None:
                raise NotFound()
            if body["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
                raise Conflict()
            self.rv += 1
            self.lease = copy.deepcopy(body)
            self.lease["metadata"]["resourceVersion"] = str(self.rv)
            return copy.deepcopy(self.lease)
        raise AssertionError(method)


def elector(server: LeaseServer, identity: str, clock: FakeClock) -> LeaderElector:
    return LeaderElector(server, name="lock", namespace="ns", identity=identity, clock=clock)


def test_first_candidate_takes_a_free_lease_at_once_and_creates_a_missing_one_a_lease_duration_later() -> None:
    server, clock = LeaseServer(), FakeClock()
    a = elector(server, "a", clock)
    assert asyncio.run(a.try_acquire_or_renew())
    assert server.lease["spec"]["holderIdentity"] == "a"
    assert server.lease["spec"]["leaseDurationSeconds"] == 15
    server, clock = LeaseServer(existing=False), FakeClock()
    a = elector(server, "a", clock)
    assert not asyncio.run(a.try_acquire_or_renew()) and a.gone and server.lease is None
    asyncio.run(polled(a, clock, 14.9))
    clock.advance(0.2)
    assert asyncio.run(a.try_acquire_or_renew())
    assert server.lease["spec"]["holderIdentity"] == "a"


def test_the_wait_for_a_missing_lease_starts_again_after_a_gap_without_answers() -> None:
    """A partition or a pause longer than the renew deadline: the Lease may have been created and
    deleted again meanwhile (by a holder whose fence is open), so the wait starts over."""
    server, clock = LeaseServer(existing=False), FakeClock()
    a = elector(server, "a", clock)
    assert not asyncio.run(a.try_acquire_or_renew())
    clock.advance(10.5)  # no read for longer than the renew deadline
    assert not asyncio.run(a.try_acquire_or_renew())
    asyncio.run(polled(a, clock, 14.9))
    clock.advance(0.2)
    assert asyncio.run(a.try_acquire_or_renew())


async def polled(e: LeaderElector, clock: FakeClock, seconds: float) -> None:
    """``e`` reads the missing Lease every 2 s for ``seconds`` (clock time), and never creates it."""
    end = clock() + seconds
    while clock() < end:
        clock.advance(min(2.0, end - clock()))
        assert not await e.try_acquire_or_renew() and e.gone


def test_a_held_lease_is_not_taken_until_it_expires_on_our_clock() -> None:
    server, clock = LeaseServer(), FakeClock()
    a, b = elector(server, "a", clock), elector(server, "b", clock)
    assert asyncio.run(a.try_acquire_or_renew())
    assert not asyncio.run(b.try_acquire_or_renew())
    clock.advance(14)
    assert not asyncio.run(b.try_acquire_or_renew())
    clock.advance(1.5)  # 15.5 s since b first saw this record: expired
    assert asyncio.run(b.try_acquire_or_renew())
    assert server.lease["spec"]["holderIdentity"] == "b"
    assert server.lease["spec"]["leaseTransitions"] == 1


def test_renewals_keep_it_and_reset_the_expiry_seen_by_others() -> None:
    server, clock = LeaseServer(), FakeClock()
    a, b = elector(server, "a", clock), elector(server, "b", clock)
    asyncio.run(a.try_acquire_or_renew())
    for _ in range(10):
        clock.advance(10)
        server.lease["spec"]["renewTime"] = f"t{clock()}"  # a renews (renewTime changes)
        assert asyncio.run(a.try_acquire_or_renew())
        assert not asyncio.run(b.try_acquire_or_renew())


def test_a_released_lease_is_taken_at_once() -> None:
    server, clock = LeaseServer(), FakeClock()
    a, b = elector(server, "a", clock), elector(server, "b", clock)
    asyncio.run(a.try_acquire_or_renew())
    a.is_leader = True
    assert not asyncio.run(b.try_acquire_or_renew())
    asyncio.run(a.release())
    assert server.lease["spec"]["holderIdentity"] == ""
    assert asyncio.run(b.try_acquire_or_renew())


def test_a_lost_race_is_not_leadership() -> None:
    server, clock = LeaseServer(), FakeClock()
    a = elector(server, "a", clock)
    asyncio.run(a.try_acquire_or_renew())
    real = server.request

    async def racing(method: str, path: str, body: Any = None, **kw: Any) -> Any:
        if method == "PUT":
            raise Conflict()
        return await real(method, path, body, **kw)

    server.request = racing  # type: ignore[method-assign]
    assert not asyncio.run(a.try_acquire_or_renew())


def test_invalid_timings_are_refused() -> None:
    with pytest.raises(ConfigError, match="lease_duration > renew_deadline"):
        LeaderElector(LeaseServer(), name="l", namespace="n", lease_duration=10, renew_deadline=10, retry_period=2)


# -- client-go's timing contract, on virtual time -------------------------------------------------


class FaultyLeases(LeaseServer):
    """A LeaseServer whose answers a test scripts by time: ``fault(now)`` returns "ok", "fail"
    (a fast 500) or "hang" (no answer, ever). Records (time, method, timeout) of every request."""

    def __init__(self, clock: FakeClock, fault: Callable[[float], str]) -> None:
        super().__init__()
        self.clock, self.fault = clock, fault
        self.calls: list[tuple[float, str, float | None]] = []

    async def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        now = self.clock()
        self.calls.append((now, method, kw.get("timeout")))
        what = self.fault(now)
        if what == "fail":
            raise ApiError(500, "Internal Server Error", "etcdserver: request timed out")
        if what == "hang":
            await asyncio.Event().wait()
        return await super().request(method, path, body, **kw)


def leading(server: LeaseServer, clock: FakeClock, **timings: float) -> LeaderElector:
    e = LeaderElector(server, name="lock", namespace="ns", identity="a", clock=clock, **timings)
    return e


def test_fast_failures_then_a_hung_request_lose_exactly_at_last_renewal_plus_deadline() -> None:
    """The issue's case: fast failures for 8 s after the last renewal, then a request that hangs.
    The old per-attempt deadline gave up ~20 s after the last renewal; client-go's round bound
    gives up at last renewal + renew_deadline (10 s), before any standby can take over (15 s)."""
    clock = FakeClock()
    t0 = clock()
    server = FaultyLeases(clock, lambda now: "ok" if now == t0 else "fail" if now < t0 + 8 else "hang")
    a = leading(server, clock)

    async def main() -> float:
        await a.acquire()
        assert a.renewed_at == t0 and a.valid()
        await a.hold()
        return clock()

    lost_at = run_virtual(clock, main)
    assert lost_at == pytest.approx(t0 + 10.0, abs=1e-6)
    assert not a.is_leader and not a.valid()
    assert [m for _, m, _ in server.calls[1:]].count("PUT") >= 4  # it kept trying in between
    assert all(timeout is not None and timeout <= 5.0 for _, _, timeout in server.calls)
    # the hung request was cut at the deadline, not allowed its full 5 s
    hung = [(at, timeout) for at, _, timeout in server.calls if at >= t0 + 8]
    assert hung and all(at + timeout <= t0 + 10.0 + 1e-9 for at, timeout in hung)


def test_every_lease_request_is_cut_at_half_the_renew_deadline() -> None:
    clock = FakeClock()
    t0 = clock()
    server = FaultyLeases(clock, lambda now: "ok" if now == t0 else "hang")
    a = leading(server, clock)

    async def main() -> float:
        await a.acquire()
        await a.hold()
        return clock()

    lost_at = run_virtual(clock, main)
    assert lost_at == pytest.approx(t0 + 10.0, abs=1e-6)
    timeouts = [timeout for at, _, timeout in server.calls if at > t0]
    # first renew at t0+2: 5 s (= 10/2); it hangs to t0+7; retry at t0+9 gets the 1 s left
    assert timeouts == pytest.approx([5.0, 1.0])


def test_one_hung_request_does_not_cost_the_lease() -> None:
    """Because a request gets only half the deadline, a retry still fits in the round."""
    clock = FakeClock()
    t0 = clock()
    server = FaultyLeases(clock, lambda now: "hang" if t0 < now < t0 + 3 else "ok")
    a = leading(server, clock)

    async def main() -> None:
        await a.acquire()
        holding = asyncio.ensure_future(a.hold())
        await asyncio.sleep(30)
        assert not holding.done(), "a single hung request must not end the leadership"
        holding.cancel()

    run_virtual(clock, main)
    assert a.is_leader and a.valid()
    assert a.renewed_at is not None and a.renewed_at > t0 + 25


def test_the_fence_closes_on_the_clock_alone() -> None:
    """A frozen process (SIGSTOP) makes no request and gets no answer: valid() must still turn
    False once renewed_at + renew_deadline has passed, and hold() must report the loss before it
    sends anything."""
    clock = FakeClock()
    server = FaultyLeases(clock, lambda now: "ok")
    a = leading(server, clock)
    run_virtual(clock, a.acquire)
    assert a.valid()
    clock.advance(9.999)
    assert a.valid()
    clock.advance(0.002)
    assert not a.valid() and a.is_leader  # the fence closed before anyone noticed the loss
    sent = len(server.calls)
    clock.advance(20)  # the freeze goes on past the lease duration

    async def resume() -> None:
        await a.hold()

    run_virtual(clock, resume)
    assert not a.is_leader
    assert len(server.calls) == sent, "the loss is decided from our own clock, without a request"


def test_a_renewal_that_finds_another_holder_loses_at_once() -> None:
    clock = FakeClock()
    server = FaultyLeases(clock, lambda now: "ok")
    a = leading(server, clock)

    async def main() -> float:
        await a.acquire()
        assert server.lease is not None
        # someone else wrote the Lease (e.g. it thought ours expired): our fast-path PUT conflicts
        server.lease["spec"]["holderIdentity"] = "b"
        server.lease["spec"]["renewTime"] = "later"
        server.rv += 1
        server.lease["metadata"]["resourceVersion"] = str(server.rv)
        started = clock()
        await a.hold()
        return clock() - started

    took = run_virtual(clock, main)
    assert took == pytest.approx(2.0)  # the first renewal (one retry period) found b: lost now
    assert not a.is_leader and a.holder == "b"


def test_a_hold_cancelled_in_the_turn_its_renewal_is_answered_ends_cancelled() -> None:
    """The stop cancels the renewal loop; if the renewal's answer lands in the same turn, the
    cancellation must still win. ``asyncio.wait_for`` on Python 3.11 returns the answer and
    drops the cancellation (CPython gh-86296), and the loop went on renewing beside the stop's
    release; ``asyncio.timeout`` keeps it."""
    clock = FakeClock()
    answered: list[asyncio.Future[Any]] = []

    class Held(LeaseServer):
        renewing = False

        async def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
            out = await super().request(method, path, body, **kw)
            if method == "PUT" and self.renewing:
                future = asyncio.get_running_loop().create_future()
                answered.append(future)
                await future  # the answer is on its way
            return out

    server = Held()
    a = leading(server, clock)

    async def main() -> str:
        await a.acquire()
        server.renewing = True
        hold = asyncio.ensure_future(a.hold())
        while not answered:
            await asyncio.sleep(0.1)
        answered[0].set_result(None)  # the renewal's answer arrives ...
        hold.cancel()  # ... in the turn the stop cancels the loop
        done, _ = await asyncio.wait([hold], timeout=30)
        if not done:
            hold.cancel()
            return "still renewing 30 s after its cancellation"
        return "cancelled" if hold.cancelled() else f"returned {hold.result()!r} (the cancellation was lost)"

    assert run_virtual(clock, main) == "cancelled"


def test_a_leader_renews_with_one_request() -> None:
    """client-go's fast path: the leader updates the record it wrote, without reading it first."""
    clock = FakeClock()
    server = FaultyLeases(clock, lambda now: "ok")
    a = leading(server, clock)

    async def main() -> None:
        await a.acquire()
        holding = asyncio.ensure_future(a.hold())
        await asyncio.sleep(2 * 10 + 1)
        holding.cancel()

    run_virtual(clock, main)
    renewals = [m for at, m, _ in server.calls if at > 1000.0]
    assert renewals == ["PUT"] * 10


def test_lease_duration_is_rounded_up_in_the_record() -> None:
    server, clock = LeaseServer(), FakeClock()
    a = LeaderElector(server, name="l", namespace="n", identity="a", clock=clock,
                      lease_duration=4.5, renew_deadline=3, retry_period=0.5)
    assert asyncio.run(a.try_acquire_or_renew())
    assert server.lease is not None and server.lease["spec"]["leaseDurationSeconds"] == 5


# -- bad input and faults --------------------------------------------------------------------------


def test_forbidden_lease_one_clear_line_per_retry_and_a_reason_for_readyz(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    allowed = {"yes": False}
    message = (
        'leases.coordination.k8s.io "lock" is forbidden: User "op" cannot get resource "leases" in API '
        'group "coordination.k8s.io" in the namespace "ns"'
    )

    class Rbac(LeaseServer):
        async def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
            if not allowed["yes"]:
                raise Forbidden(message)
            return await super().request(method, path, body, **kw)

    a = LeaderElector(Rbac(), name="lock", namespace="ns", identity="a", clock=clock, retry_period=2)
    caplog.set_level(logging.INFO, logger="declop.leader")

    async def main() -> None:
        acquiring = asyncio.ensure_future(a.acquire())
        await asyncio.sleep(7)  # attempts at 0 s and after ~2, ~4, ~6 s (jittered up to 20 %)
        assert not acquiring.done()
        assert a.problem.startswith('cannot get leases.coordination.k8s.io "lock" in namespace "ns"')
        allowed["yes"] = True
        await asyncio.wait_for(acquiring, 3)

    run_virtual(clock, main)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert 3 <= len(errors) <= 4
    for record in errors:
        line = record.getMessage()
        assert "\n" not in line
        assert line.startswith('cannot get leases.coordination.k8s.io "lock" in namespace "ns": ')
        assert 'allow get, create and update on leases (group coordination.k8s.io) in namespace "ns"' in line
    assert a.is_leader and a.problem == ""


def test_500_queued_handler_writes_do_not_delay_a_renewal() -> None:
    """A real Transport against a small Lease server: the handler lane is saturated (20 qps,
    500 writes = 25 s of budget) and the elector's renewal still goes out at once."""
    import time

    from aiohttp import web

    from declop.kube.transport import Transport

    class _Config:
        def __init__(self, host: str) -> None:
            self.host = host

        def auth_settings(self) -> dict[str, Any]:
            return {}

    store = LeaseServer()

    async def lease_api(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        try:
            return web.json_response(await store.request(request.method, request.path, body))
        except NotFound:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        except Conflict:
            return web.json_response({"kind": "Status", "code": 409}, status=409)

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({})

    async def main() -> tuple[float, int, float | None]:
        app = web.Application()
        app.router.add_route("*", "/apis/coordination.k8s.io/{tail:.*}", lease_api)
        app.router.add_route("*", "/{tail:.*}", ok)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        transport = Transport(_Config(f"http://127.0.0.1:{port}"), qps=20, burst=30)
        a = LeaderElector(transport, name="lock", namespace="ns", identity="a")
        try:
            await a.acquire()
            writes = [asyncio.ensure_future(transport.request("PATCH", "/api/v1/namespaces/d/pods/p", body={}))
                      for _ in range(500)]
            await asyncio.sleep(0.05)  # the burst went out; the rest wait on the handler lane
            before = a.renewed_at
            t0 = time.monotonic()
            assert await a.try_acquire_or_renew()
            took = time.monotonic() - t0
            sent = sum(w.done() for w in writes)
            for w in writes:
                w.cancel()
            await asyncio.gather(*writes, return_exceptions=True)
            return took, sent, before
        finally:
            await transport.close()
            await runner.cleanup()

    took, sent, before = asyncio.run(main())
    assert sent < 60, "the handler lane must be saturated for this test to mean anything"
    assert before is not None
    assert took < 0.5, f"a renewal behind 500 queued writes took {took:.2f} s"


def test_a_closed_fence_never_reopens() -> None:
    """The fence closed (a worker saw the deadline pass) while a renewal was in flight; its late
    success must not reopen it: workers already dropped keys, so the loss has to follow."""
    clock = FakeClock()
    t0 = clock()
    frozen = {"on": False, "fence": True}

    class Frozen(LeaseServer):
        async def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
            answer = await super().request(method, path, body, **kw)
            if frozen["on"]:
                clock.advance(8.5)  # the process froze with the answer on its way
                frozen["fence"] = a.valid()  # a worker thread checks the fence first
            return answer

    a = LeaderElector(Frozen(), name="lock", namespace="ns", identity="a", clock=clock)

    async def main() -> float:
        await a.acquire()
        frozen["on"] = True
        await a.hold()
        return clock()

    lost_at = run_virtual(clock, main)
    assert frozen["fence"] is False
    assert a.renewed_at == t0 + 2  # the renewal did succeed, from t0 + 2 ...
    assert not a.valid() and not a.is_leader  # ... but the closed fence stays closed
    assert lost_at == pytest.approx(t0 + 2 + 8.5)


def test_a_deleted_lease_closes_the_holders_fence_and_is_created_again_only_a_lease_duration_later() -> None:
    """Issue 22, defect 7 (found by declop.testing.simulation.leases): a standby re-created a deleted Lease at
    once while the holder's fence was still open."""
    clock, server = FakeClock(), LeaseServer()
    a, b = elector(server, "a", clock), elector(server, "b", clock)

    async def main() -> None:
        assert await a.try_acquire_or_renew()
        a.won()
        assert not await b.try_acquire_or_renew()  # held: b has seen the record
        server.lease = None  # an administrator deletes it
        assert not await b.try_acquire_or_renew() and b.gone and server.lease is None
        assert a.valid()  # a does not know yet ...
        clock.advance(2)
        assert not await a.try_acquire_or_renew()  # ... until its renewal finds it gone
        assert not a.valid() and a.gone
        await polled(b, clock, 12.9)  # 14.9 s after b first found it gone
        assert server.lease is None
        clock.advance(0.2)
        assert await b.try_acquire_or_renew() and not b.gone
        assert server.lease is not None and server.lease["spec"]["holderIdentity"] == "b"

    asyncio.run(main())


def test_a_candidate_that_never_saw_the_lease_waits_a_lease_duration_too() -> None:
    """Issue 22, defect 7 (the part left open): a replica started just after an administrator
    deleted the Lease never saw it; before, it created it at once while the holder's fence was
    still open. It cannot tell a deleted Lease from one never created: it waits a lease duration."""
    clock, server = FakeClock(), LeaseServer()
    a = elector(server, "a", clock)

    async def main() -> None:
        assert await a.try_acquire_or_renew()
        a.won()
        server.lease = None  # an administrator deletes it
        c = elector(server, "c", clock)  # a replica (re)started just now
        assert not await c.try_acquire_or_renew() and c.gone and server.lease is None
        assert a.valid()  # the holder's fence is still open ...
        clock.advance(2)
        assert not await a.try_acquire_or_renew() and not a.valid()  # ... until its renewal finds it gone
        await polled(c, clock, 12.9)  # 14.9 s after c first found it missing
        assert server.lease is None
        clock.advance(0.2)
        assert await c.try_acquire_or_renew()
        assert server.lease is not None and server.lease["spec"]["holderIdentity"] == "c"

    asyncio.run(main())


def test_release_leaves_the_lease_to_expire_while_a_call_under_it_runs(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 22, defect 2 (invariant I6): a graceful stop whose grace period ended with a plain
    handler still in its thread does not release the Lease: the fence closes, one line says so,
    and the record keeps naming us until it expires; with nothing running, it is released."""
    clock, server = FakeClock(), LeaseServer()
    a = elector(server, "a", clock)
    running = [1]
    a.running = lambda: running[0]

    async def main() -> None:
        assert await a.try_acquire_or_renew()
        a.won()
        with caplog.at_level(logging.WARNING, logger="declop.leader"):
            await a.release()
        assert not a.valid() and not a.is_leader
        assert server.lease is not None and server.lease["spec"]["holderIdentity"] == "a"
        (line,) = [r for r in caplog.records if r.getMessage() == "Leaving the Lease to expire: calls under it still run"]
        assert line.kv == {"lease": "ns/lock", "running": 1, "expiresIn": 15.0}  # type: ignore[attr-defined]
        running[0] = 0
        assert await a.try_acquire_or_renew()
        a.won()
        await a.release()
        assert server.lease["spec"]["holderIdentity"] == ""

    asyncio.run(main())


def test_a_lost_race_to_create_it_ends_the_wait() -> None:
    """Another replica created it between our read and our create (409): it exists again, so a
    later 404 (deleted once more) starts a new wait — seed 749's first form in the simulator."""
    server, clock = LeaseServer(existing=False), FakeClock()
    c = elector(server, "c", clock)
    rival = {"metadata": {"name": "lock"}, "spec": {"holderIdentity": "x", "leaseDurationSeconds": 15}}

    async def main() -> None:
        assert not await c.try_acquire_or_renew()
        await polled(c, clock, 14.9)
        clock.advance(0.2)
        real = server.request

        async def racing(method: str, path: str, body: Any = None, **kw: Any) -> Any:
            if method == "POST":  # someone creates it between our GET and our POST
                await real("POST", path, rival)
            return await real(method, path, body, **kw)

        server.request = racing  # type: ignore[method-assign]
        assert not await c.try_acquire_or_renew() and not c.gone
        server.request = real  # type: ignore[method-assign]
        server.lease = None  # deleted once more
        clock.advance(2)
        assert not await c.try_acquire_or_renew() and c.gone
        await polled(c, clock, 12.9)
        assert server.lease is None

    asyncio.run(main())


def test_a_created_lease_opens_the_fence_only_after_a_renewal_a_renew_deadline_later(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 22, defect 7 (the window left open, seed 749): a Lease we create may be deleted
    again before a waiting candidate's next read, which then creates it while we lead. So our
    fence opens only once a renewal started renew_deadline after the creation succeeded: the
    record then stood longer than any gap between a waiter's reads. ``acquire()`` returns then."""
    server, clock = LeaseServer(existing=False), FakeClock()
    a = elector(server, "a", clock)

    t0 = clock()

    async def main() -> float:
        with caplog.at_level(logging.INFO, logger="declop.leader"):
            await a.acquire()
        return clock() - t0

    acquired = run_virtual(clock, main)
    created = [r for r in caplog.records if r.getMessage().startswith("Created the lease")]
    assert len(created) == 1 and created[0].kv == {"lease": "ns/lock", "waitSeconds": 10.0}  # type: ignore[attr-defined]
    # created about 15 s in (a lease duration after the first 404), open ~10 s after that
    assert 25.0 <= acquired <= 15.0 + 2.4 + 10.0 + 2.4 + 0.1
    assert a.valid() and a.is_leader and not a.opening
    assert a.renewed_at is not None and a.renewed_at - t0 >= 25.0


def test_a_re_created_lease_deleted_again_before_it_stood_never_opened_its_creators_fence() -> None:
    """Seed 749's form, on the electors: ``a`` waits for the missing Lease; ``b`` creates it, and
    an administrator deletes it again before ``a`` reads once more. ``a`` never saw it and
    creates it when its own wait ends — while ``b`` holds nothing valid: ``b``'s fence never
    opened, and its next renewal finds the Lease gone."""
    server, clock = LeaseServer(existing=False), FakeClock()
    a, b = elector(server, "a", clock), elector(server, "b", clock)

    async def main() -> None:
        assert not await b.try_acquire_or_renew()  # t=0: b's wait starts
        clock.advance(1)
        assert not await a.try_acquire_or_renew()  # t=1: a's wait starts
        for _ in range(7):  # both read every 2 s: b at 2, 4, … 14; a at 3, 5, … 15
            clock.advance(1)
            assert not await b.try_acquire_or_renew()
            clock.advance(1)
            assert not await a.try_acquire_or_renew() and a.gone
        clock.advance(0.1)
        assert await b.try_acquire_or_renew()  # t=15.1: b creates it ...
        b.won()
        assert b.opening and not b.valid() and b.live()
        clock.advance(0.5)
        server.lease = None  # ... and it is deleted again (t=15.6), between two reads of a
        clock.advance(0.9)
        assert await a.try_acquire_or_renew()  # t=16.5: a never saw it; its lease duration has passed
        assert server.lease is not None and server.lease["spec"]["holderIdentity"] == "a"
        assert not b.valid()  # b never had an open fence under either record
        clock.advance(0.6)
        assert not await b.try_acquire_or_renew() and not b.valid()  # its renewal finds a's record

    asyncio.run(main())


def test_the_gap_between_reads_counts_from_the_send_of_the_earlier_read() -> None:
    """A read answers at some instant between its send and its answer: the wait must start over
    when the answer comes more than renew_deadline after the *send* of the previous read that
    found the Lease missing — a slow earlier read must not hide a creation and a deletion."""
    server, clock = LeaseServer(existing=False), FakeClock()
    a = elector(server, "a", clock)
    real = server.request

    async def slow(method: str, path: str, body: Any = None, **kw: Any) -> Any:
        clock.advance(4.0)  # the apiserver answers late (within the 5-s request timeout)
        return await real(method, path, body, **kw)

    async def main() -> None:
        assert not await a.try_acquire_or_renew()
        gone_at = a._gone_at
        server.request = slow  # type: ignore[method-assign]
        clock.advance(1.0)
        assert not await a.try_acquire_or_renew()  # sent at 1, answered at 5
        server.request = real  # type: ignore[method-assign]
        assert a._gone_at == gone_at
        clock.advance(6.5)  # answered 10.5 s after the send of the slow read, 6.5 s after its answer
        assert not await a.try_acquire_or_renew()
        assert a._gone_at == clock()  # the wait started over

    asyncio.run(main())


def test_micro_time_is_rfc3339_utc_with_microseconds_whatever_the_instant() -> None:
    import datetime
    import random

    from declop.leases.leader import _now_micro

    rng = random.Random(7)
    for t in [0.0, 0.5, 1.0000005, 1764700000.999999, 4102444799.0] + [rng.random() * 4e9 for _ in range(2000)]:
        expected = datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        assert _now_micro(lambda t=t: t) == expected


def test_a_lease_request_with_no_answer_is_a_timeout_with_no_http_status() -> None:
    """A Lease request the apiserver never answers ends at ``request_timeout`` as ``ApiError(0,
    "Timeout")``: status 0 is declop's "no HTTP answer" (the preflight and ``declop rbac`` read it
    so), never a status the apiserver could send. (A `make mutate` survivor: the 0 made 1.)"""

    class Silent(LeaseServer):
        async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
            await asyncio.Event().wait()

    clock = FakeClock()
    a = elector(Silent(), "a", clock)

    async def main() -> ApiError:
        with pytest.raises(ApiError) as caught:
            await a._request("GET", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/lock")
        return caught.value

    error = run_virtual(clock, main)
    assert (error.status, error.reason) == (0, "Timeout")
    assert "no answer within" in str(error)
