"""declop.kube.fencing: the write fence of a reconcile call, as the real transport applies it.

The transport talks to a small aiohttp server that records every request it receives: a fenced
write must raise :class:`declop.Fenced` and never reach it; a read, a write made while the fence
is open, and any request made outside a call (no fence set) go through. The fence is checked
again after the client-side rate-limit wait and before a retry: a fence that closes meanwhile
stops the request there.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

import declop
from declop.errors import DeclopError, Fenced
from declop.kube import fencing
from declop.kube.fencing import FencedConnector, WriteFence
from declop.kube.keys import Request
from declop.kube.transport import Transport

KEY = Request("ns", "a")
PATH = "/api/v1/namespaces/ns/configmaps/a"
WRITES = [("POST", "/api/v1/namespaces/ns/configmaps"), ("PUT", PATH), ("PATCH", PATH), ("DELETE", PATH)]


class _Config:
    def __init__(self, host: str) -> None:
        self.host = host

    def auth_settings(self) -> dict[str, Any]:
        return {}


class Fence:
    """A fence whose ``valid()`` answers from a script (True, True, False …) or a flag."""

    def __init__(self, *answers: bool) -> None:
        self.answers = list(answers)
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


class Server:
    """Records ``(method, path)`` of every request; answers 503 to the first ``unavailable``."""

    def __init__(self, unavailable: int = 0) -> None:
        self.received: list[tuple[str, str]] = []
        self.unavailable = unavailable

    async def handle(self, request: web.Request) -> web.Response:
        self.received.append((request.method, request.path))
        if self.unavailable:
            self.unavailable -= 1
            return web.json_response({}, status=503, headers={"Retry-After": "0"})
        return web.json_response({"kind": "ConfigMap"})


async def _serve(server: Server, test: Callable[[Transport], Awaitable[Any]], **transport: Any) -> Any:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    t = Transport(_Config(f"http://127.0.0.1:{port}"), **transport)
    try:
        return await test(t)
    finally:
        await t.close()
        await runner.cleanup()


async def _under(fence: WriteFence, request: Awaitable[Any]) -> Any:
    token = fencing.enter(fence)
    try:
        return await request
    finally:
        fencing.leave(token)


def test_fenced_is_a_declop_error_at_the_front_door() -> None:
    assert declop.Fenced is Fenced and issubclass(Fenced, DeclopError)


def test_a_closed_fence_raises_with_the_request_the_lease_and_the_key_and_marks_the_fence() -> None:
    fence = WriteFence(lambda: False, "ops/widgets-shard-1-of-4", KEY)
    with pytest.raises(Fenced) as first:
        fence.check("PATCH", PATH)
    with pytest.raises(Fenced):
        fence.check("DELETE", PATH)
    message = str(first.value)
    assert message == (
        f"PATCH {PATH} was not sent: Lease ops/widgets-shard-1-of-4 is not known valid on this replica "
        "(lost or expired); the call ends and ns/a is left to the Lease's new owner"
    )
    assert "\n" not in message
    assert fence.tripped is first.value, "the first refusal is the call's"


def test_an_open_fence_passes_and_stays_untripped() -> None:
    fence = WriteFence(lambda: True, "ops/leader", KEY)
    fence.check("PATCH", PATH)
    assert fence.tripped is None


@pytest.mark.parametrize(("method", "path"), WRITES)
def test_a_fenced_write_is_never_sent(method: str, path: str) -> None:
    server = Server()
    fence = WriteFence(Fence(False), "ops/leader", KEY)

    async def test(t: Transport) -> None:
        with pytest.raises(Fenced):
            await _under(fence, t.request(method, path, body={}))
        assert t.statistics().writes == 0, "not even counted as sent"

    asyncio.run(_serve(server, test))
    assert server.received == []
    assert fence.tripped is not None


def test_reads_are_not_fenced_and_writes_pass_while_the_fence_is_open() -> None:
    server = Server()
    closed = WriteFence(Fence(False), "ops/leader", KEY)
    open_ = WriteFence(Fence(True), "ops/leader", KEY)

    async def test(t: Transport) -> None:
        await _under(closed, t.request("GET", PATH))
        for method, path in WRITES:
            await _under(open_, t.request(method, path, body={}))

    asyncio.run(_serve(server, test))
    assert server.received == [("GET", PATH), *WRITES]
    assert closed.tripped is None and open_.tripped is None


def test_outside_a_call_nothing_is_checked() -> None:
    """No fence set (the manager's own writes, a client used by hand, webhooks): sent as ever."""
    server = Server()

    async def test(t: Transport) -> None:
        assert fencing.current() is None
        for method, path in WRITES:
            await t.request(method, path, body={})

    asyncio.run(_serve(server, test))
    assert server.received == WRITES


def test_the_fence_set_in_a_call_does_not_leak_out_of_it() -> None:
    async def test() -> None:
        fence = WriteFence(lambda: False, "ops/leader", KEY)
        token = fencing.enter(fence)
        assert fencing.current() is fence
        fencing.leave(token)
        assert fencing.current() is None
        assert fencing.enter(None) is None  # no Lease: nothing set
        fencing.leave(None)

    asyncio.run(test())


def test_a_fence_that_closes_during_the_rate_limit_wait_stops_the_write_after_the_wait() -> None:
    """The handler lane's burst is used up: the write waits for a token. Its Lease was valid when
    it was made and expires while it waits: checked after the wait, it is not sent."""
    server = Server()
    leader = {"valid": True}
    fence = WriteFence(lambda: leader["valid"], "ops/leader", KEY)

    async def test(t: Transport) -> None:
        bucket = t._buckets["handler"]
        assert bucket is not None
        bucket.when(None)  # the burst is gone: the next request waits ~0.1 s for a token
        write = asyncio.ensure_future(_under(fence, t.request("PATCH", PATH, body={})))
        await asyncio.sleep(0.01)
        assert not write.done(), "waiting for its token"
        leader["valid"] = False  # the renew deadline passes meanwhile
        with pytest.raises(Fenced):
            await write

    asyncio.run(_serve(server, test, qps=10, burst=1))
    assert server.received == []


def test_a_write_waiting_for_a_pooled_connection_is_checked_again_when_it_gets_one() -> None:
    """Issue 42: the pool (one connection here) is held by a hanging list. A write passes its
    check, then waits for the connection; the Lease is lost while it waits. When the list ends,
    the write gets the connection and is refused there: nothing reaches the apiserver, and the
    connection goes back to the pool for the next request."""
    hanging, release = asyncio.Event(), asyncio.Event()
    server = Server()
    plain = server.handle

    async def handle(request: web.Request) -> web.Response:
        if request.path == "/hang":
            server.received.append((request.method, request.path))
            hanging.set()
            await release.wait()
            return web.json_response({})
        return await plain(request)

    server.handle = handle  # type: ignore[method-assign]
    leader = {"valid": True}
    checked = asyncio.Event()

    def valid() -> bool:
        checked.set()
        return leader["valid"]

    fence = WriteFence(valid, "ops/leader", KEY)

    async def test(t: Transport) -> None:
        listing = asyncio.ensure_future(t.request("GET", "/hang", lane="informer"))
        await hanging.wait()  # the only connection is taken
        write = asyncio.ensure_future(_under(fence, t.request("PATCH", PATH, body={})))
        await checked.wait()  # it passed its first check; no connection is free for it
        assert not write.done()
        leader["valid"] = False  # the Lease is lost while the write waits in the pool
        release.set()
        await listing
        with pytest.raises(Fenced):
            await write
        assert fence.tripped is not None
        assert t.statistics().writes == 0, "a refused write is not counted as sent"
        await t.request("GET", PATH)  # the connection went back to the pool

    asyncio.run(_serve(server, test, max_connections=1))
    assert server.received == [("GET", "/hang"), ("GET", PATH)]


def test_a_plain_handlers_write_waiting_for_a_pooled_connection_is_checked_again() -> None:
    """The same from a plain handler's thread: the sync client sends its write as a coroutine on
    the loop (``run_coroutine_threadsafe``, as ``Client._run`` does), which runs in a copy of the
    thread's context: the connection is asked for, and the fence checked, with the call's fence."""
    hanging, release = asyncio.Event(), asyncio.Event()
    server = Server()
    plain = server.handle

    async def handle(request: web.Request) -> web.Response:
        if request.path == "/hang":
            server.received.append((request.method, request.path))
            hanging.set()
            await release.wait()
            return web.json_response({})
        return await plain(request)

    server.handle = handle  # type: ignore[method-assign]
    leader = {"valid": True}
    fence = WriteFence(lambda: leader["valid"], "ops/leader", KEY)

    async def test(t: Transport) -> None:
        loop = asyncio.get_running_loop()
        checked = asyncio.Event()

        def valid() -> bool:  # asked in the loop's thread: the transport runs there
            checked.set()
            return leader["valid"]

        fence.valid = valid
        listing = asyncio.ensure_future(t.request("GET", "/hang", lane="informer"))
        await hanging.wait()  # the only connection is taken

        def handler() -> Any:  # a plain handler in its executor thread, under its call's fence
            token = fencing.enter(fence)
            try:
                return asyncio.run_coroutine_threadsafe(t.request("PATCH", PATH, body={}), loop).result()
            finally:
                fencing.leave(token)

        write = loop.run_in_executor(None, handler)
        await checked.wait()  # it passed its first check and waits for the connection
        assert not write.done()
        leader["valid"] = False
        release.set()
        await listing
        with pytest.raises(Fenced):
            await write

    asyncio.run(_serve(server, test, max_connections=1))
    assert server.received == [("GET", "/hang")]
    assert fence.tripped is not None


def test_aiohttps_own_resend_of_a_dropped_idempotent_write_is_checked_again() -> None:
    """aiohttp sends a PUT or DELETE once more, on a new connection, when the connection of the
    first attempt closes without an answer — a resend declop's loop never sees. The Lease is
    lost meanwhile: the resend is refused when it gets its connection, the caller gets Fenced."""
    server = Server()
    dropped = 0

    async def handle(request: web.Request) -> web.Response:
        nonlocal dropped
        server.received.append((request.method, request.path))
        if not dropped:  # the apiserver (or a load balancer) drops the first attempt unanswered
            dropped += 1
            assert request.transport is not None
            request.transport.close()
        return web.json_response({"kind": "ConfigMap"})

    server.handle = handle  # type: ignore[method-assign]
    script = Fence(True, True, False)  # the attempt: before it, with its connection; the resend
    fence = WriteFence(script, "ops/leader", KEY)

    async def test(t: Transport) -> None:
        with pytest.raises(Fenced):
            await _under(fence, t.request("PUT", PATH, body={}))
        await t.request("GET", PATH)  # the refused resend's connection went back to the pool

    asyncio.run(_serve(server, test))
    assert server.received == [("PUT", PATH), ("GET", PATH)], "the dropped attempt only; the resend never went out"
    assert script.asked == 3


def test_an_unfenced_request_gets_the_pools_own_connect_and_nothing_more() -> None:
    """The hot path: a GET, or a write with no fence set, is handed the pool's own ``connect``
    coroutine — no wrapper, no check; only a fenced write gets the checking one."""

    class Req:  # what connect() reads before the pool runs: the method
        def __init__(self, method: str) -> None:
            self.method = method

    closed = WriteFence(lambda: False, "ops/leader", KEY)
    cases = [("GET", None), ("PATCH", None), ("GET", closed), ("PATCH", closed)]

    async def test() -> list[Any]:
        connector, codes = FencedConnector(), []
        try:
            for method, fence in cases:
                token = fencing.enter(fence)
                try:
                    coro = connector.connect(Req(method), [], aiohttp.ClientTimeout())
                finally:
                    fencing.leave(token)
                codes.append(coro.cr_code)  # type: ignore[attr-defined]
                coro.close()  # never run: nothing was asked of the pool
        finally:
            await connector.close()
        return codes

    pools_own, checking = aiohttp.TCPConnector.connect.__code__, FencedConnector._connect_fenced.__code__
    assert asyncio.run(test()) == [pools_own, pools_own, pools_own, checking]
    assert closed.tripped is None, "no check before the wait"


def test_a_retry_is_checked_again_before_it_is_sent() -> None:
    """A 503 is retried after its Retry-After; a Lease that expired meanwhile stops the retry."""
    server = Server(unavailable=1)
    script = Fence(True, True, False)  # attempt 1: before it and with its connection; attempt 2
    fence = WriteFence(script, "ops/leader", KEY)

    async def test(t: Transport) -> None:
        with pytest.raises(Fenced):
            await _under(fence, t.request("PATCH", PATH, body={}))

    asyncio.run(_serve(server, test))
    assert server.received == [("PATCH", PATH)], "the first attempt went out, the retry did not"
    assert script.asked == 3


def test_a_task_started_by_an_async_handler_carries_the_fence() -> None:
    """``asyncio.gather(client.create(a), client.create(b))`` runs each write in its own task."""

    async def in_a_task() -> WriteFence | None:
        return fencing.current()

    async def test() -> tuple[list[WriteFence | None], WriteFence, WriteFence | None]:
        fence = WriteFence(lambda: True, "ops/leader", KEY)
        token = fencing.enter(fence)
        try:
            seen = await asyncio.gather(in_a_task())
        finally:
            fencing.leave(token)
        after = await asyncio.gather(in_a_task())
        return seen, fence, after[0]

    seen, fence, after = asyncio.run(test())
    assert seen == [fence] and after is None
