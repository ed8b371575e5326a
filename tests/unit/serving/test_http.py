"""declop.serving.http: a real server on a free port, raw sockets as hostile clients."""

from __future__ import annotations

import asyncio
import gzip
import time

from aiohttp import web

from declop.serving.http import Guard, Limits, body, serve


async def _echo(request: web.Request) -> web.Response:
    return web.Response(text=str(len(await body(request))))


async def _started(limits: Limits) -> tuple[object, int]:
    guard = Guard(limits)
    app = guard.application()
    app.router.add_post("/x", _echo)
    serving = await serve(app, guard, "127.0.0.1", 0)
    return serving, serving.port


async def _exchange(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


def _post(body_: bytes, **headers: str) -> bytes:
    head = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    return f"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body_)}\r\nConnection: close\r\n{head}\r\n".encode() + body_


def test_body_limits_and_compression():
    async def go() -> None:
        serving, port = await _started(Limits(max_body=1000))
        try:
            assert b" 200 " in (ok := await _exchange(port, _post(b"a" * 1000))) and ok.endswith(b"1000")
            big = await _exchange(port, _post(b"a" * 1001))
            assert big.startswith(b"HTTP/1.1 413"), big
            bomb = gzip.compress(b"0" * 8 * 1024 * 1024)
            print(f"gzip bomb: {len(bomb)} bytes on the wire, 8 MiB inflated")
            refused = await _exchange(port, _post(bomb, Content_Encoding="gzip"))
            assert refused.startswith(b"HTTP/1.1 415"), refused
            chunked = b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + b"400\r\n" + b"a" * 1024 + b"\r\n0\r\n\r\n"
            assert (await _exchange(port, chunked)).startswith(b"HTTP/1.1 413")
        finally:
            await serving.stop()  # type: ignore[attr-defined]

    asyncio.run(go())


def test_slow_headers_slow_body_and_idle_connections_are_cut():
    async def go() -> None:
        serving, port = await _started(Limits(header_timeout=0.5, body_timeout=0.5, idle_timeout=0.8))
        try:
            started = time.monotonic()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for byte in b"POST /x HTTP/1.1\r\nHost: x\r\n":  # slowloris: a byte every 50 ms
                if reader.at_eof():
                    break
                writer.write(bytes([byte]))
                try:
                    await asyncio.wait_for(reader.read(1), 0.05)
                    break
                except asyncio.TimeoutError:
                    pass
            assert await asyncio.wait_for(reader.read(), 5) == b""
            cut = time.monotonic() - started
            print(f"slow headers cut after {cut:.2f} s (header timeout 0.5 s)")
            assert 0.4 < cut < 2.5
            writer.close()

            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
            started = time.monotonic()
            answer = await asyncio.wait_for(reader.read(), 5)
            print(f"slow body answered {answer[:12]!r} after {time.monotonic() - started:.2f} s")
            assert answer.startswith(b"HTTP/1.1 408")
            writer.close()

            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab")
            first = await reader.readuntil(b"\r\n\r\n")
            assert first.startswith(b"HTTP/1.1 200")
            started = time.monotonic()
            rest = await asyncio.wait_for(reader.read(), 5)  # the body, then EOF when idle
            idle = time.monotonic() - started
            print(f"idle keep-alive connection closed after {idle:.2f} s (idle timeout 0.8 s)")
            assert rest.endswith(b"2") and 0.5 < idle < 3
            writer.close()
        finally:
            await serving.stop()  # type: ignore[attr-defined]

    asyncio.run(go())


def test_connection_and_in_flight_caps_answer_429():
    async def go() -> None:
        release = asyncio.Event()
        entered = asyncio.Event()

        async def hold(request: web.Request) -> web.Response:
            entered.set()
            await release.wait()
            return web.Response(text="done")

        guard = Guard(Limits(max_connections=3, max_in_flight=1))
        app = guard.application()
        app.router.add_post("/x", hold)
        serving = await serve(app, guard, "127.0.0.1", 0)
        try:
            first = asyncio.create_task(_exchange(serving.port, _post(b"")))
            await entered.wait()
            second = await _exchange(serving.port, _post(b""))
            assert second.startswith(b"HTTP/1.1 429") and b"Retry-After: 1" in second
            idle = [await asyncio.open_connection("127.0.0.1", serving.port) for _ in range(2)]
            refused = await _exchange(serving.port, _post(b""))
            print(f"connections past the cap: {refused.splitlines()[0]!r}; refused={guard.refused} shed={guard.shed}")
            assert refused.startswith(b"HTTP/1.1 429") and guard.refused == 1 and guard.shed == 1
            release.set()
            assert (await first).endswith(b"done")
            for _, w in idle:
                w.close()
        finally:
            await serving.stop()

    asyncio.run(go())


def test_the_budget_serves_large_bodies_in_arrival_order_and_gives_back_exactly_once():
    """Three 600-byte bodies against a 1000-byte budget: one at a time, in arrival order, the
    others unread until their turn; a waiter that gives up (cancelled) or runs out of time
    returns nothing it did not take; small bodies never wait."""
    from declop.serving.http import Budget

    async def go() -> None:
        budget = Budget(1000)
        assert await budget.take(600, 1)
        order: list[str] = []

        async def waiter(name: str, size: int, timeout: float) -> bool:
            ok = await budget.take(size, timeout)
            order.append(name)
            return ok

        second = asyncio.create_task(waiter("second", 600, 5))
        third = asyncio.create_task(waiter("third", 300, 5))  # fits now, but must not overtake
        gone = asyncio.create_task(waiter("gone", 600, 5))
        late = asyncio.create_task(waiter("late", 900, 0.05))
        await asyncio.sleep(0)
        assert budget.waiting == 4 and not order, "a body that fits overtook one that waits"
        gone.cancel()
        assert await late is False and order == ["late"], "the waiter past its time was not refused"
        assert budget.used == 600
        budget.give(600)  # the first answer is done: second (600) and third (300) fit together
        assert await second and await third
        assert order == ["late", "second", "third"] and budget.used == 900 and budget.waiting == 0
        budget.give(600)
        budget.give(300)
        assert budget.used == 0
        assert await budget.take(5000, 1) and budget.used == 1000, "a body above the total takes it all"
        budget.give(5000)
        assert budget.used == 0

    asyncio.run(go())


def test_large_bodies_past_the_budget_wait_unread_then_get_429():
    """A budget of 2,000 bytes: a large request in progress holds it; a second waits, its body
    unread, and gets 429 after body_timeout; small ones pass meanwhile."""
    gate = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        data = await body(request)
        if len(data) > 100:
            await gate.wait()
        return web.Response(text=str(len(data)))

    async def go() -> None:
        guard = Guard(Limits(max_body=100, max_body_by_path={"/x": 4000}, body_budget=2000, body_timeout=0.5))
        app = guard.application()
        app.router.add_post("/x", slow)
        serving = await serve(app, guard, "127.0.0.1", 0)
        try:
            first = asyncio.create_task(_exchange(serving.port, _post(b"a" * 1500)))
            while guard.budget is None or guard.budget.used != 1500:
                await asyncio.sleep(0.01)
            started = time.monotonic()
            second = await _exchange(serving.port, _post(b"b" * 1500))
            waited = time.monotonic() - started
            assert second.startswith(b"HTTP/1.1 429") and b"Retry-After: 1" in second, second
            assert 0.45 < waited < 3, waited
            small = await _exchange(serving.port, _post(b"c" * 50))
            assert small.endswith(b"50"), "a small body waited behind the budget"
            gate.set()
            assert (await first).endswith(b"1500")
            assert guard.budget.used == 0 and guard.shed == 1
        finally:
            await serving.stop()

    asyncio.run(go())


def test_tls_connections_are_counted_before_the_handshake_and_cut_when_it_never_comes():
    """300 TCP connections that never send a TLS hello: at most max_connections exist at once
    (the rest are closed at once), each is cut after header_timeout, and a real client is
    served afterwards. Before, a connection counted only after its handshake: any number of
    silent ones each held asyncio's 256 KiB TLS buffer for 60 s."""
    import ssl

    from declop.serving.cert import ServingCert

    async def go() -> None:
        guard = Guard(Limits(max_connections=20, header_timeout=1.0))
        app = guard.application()
        app.router.add_post("/x", _echo)
        serving = await serve(app, guard, "127.0.0.1", 0, ServingCert().context)
        silent = []
        opened = time.monotonic()
        try:
            for _ in range(300):
                silent.append(await asyncio.open_connection("127.0.0.1", serving.port))
            await asyncio.sleep(0)
            peak = guard.connections
            closed_at_once = 0
            for reader, _ in silent:
                try:
                    if await asyncio.wait_for(reader.read(1), 0.01) == b"":
                        closed_at_once += 1
                except (asyncio.TimeoutError, ConnectionError):
                    pass
            print(f"300 silent TCP connections: {peak} counted, {closed_at_once} closed at once, refused {guard.refused}")
            assert peak <= 20 + 1 and guard.refused >= 270, "silent connections past the cap were kept"
            while guard.connections:
                await asyncio.sleep(0.05)
                assert time.monotonic() - opened < 5, "silent connections were not cut"
            assert 0.9 < time.monotonic() - opened < 3 and guard.cut >= 19
            client = ssl.create_default_context()
            client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
            reader, writer = await asyncio.open_connection("127.0.0.1", serving.port, ssl=client)
            writer.write(_post(b"hello"))
            answer = await asyncio.wait_for(reader.read(), 5)
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"5"), answer
            writer.close()
        finally:
            for _, writer in silent:
                writer.close()
            await serving.stop()
        assert guard.connections == 0 and not guard.handshakes

    asyncio.run(go())
