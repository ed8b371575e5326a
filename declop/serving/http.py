"""HTTP serving with limits: the one set-up of the webhook, metrics and probe servers (aiohttp).

Every server declop opens to the network is built by :func:`serve` from a :class:`Limits`, so
a hostile or broken client costs a bounded amount of memory, time and event-loop work:

- **bodies**: a ``Content-Length`` above the path's limit is answered 413 before a byte of the
  body is read; a chunked body is cut (413) as soon as it passes the limit; a
  ``Content-Encoding`` other than ``identity`` is answered 415 (aiohttp's decompression is off,
  so a small compressed body never turns into a large one; the apiserver never compresses
  webhook requests);
- **time**: the first request line and headers within ``header_timeout`` of the connection
  opening, later ones within ``idle_timeout`` of the previous answer (aiohttp's keep-alive
  timer); the body within ``body_timeout`` of the headers (408, connection closed); an idle
  keep-alive connection is closed after ``idle_timeout``;
- **load**: at most ``max_connections`` open connections, counted from the TCP accept, before
  any TLS work (the next one is answered 429 and closed, or closed at once on a TLS server: a
  TLS client cannot read anything before its handshake); the handshake is part of the first
  request's ``header_timeout`` and ``max_in_flight`` requests being answered at once (the next one gets 429 with
  ``Retry-After: 1``);
- **memory**: bodies larger than ``max_body`` share a budget of ``body_budget`` bytes (read and
  being answered at once); a request whose body does not fit waits for its turn, in arrival
  order, without its body being read (the client's socket holds it), and gets 429 if its turn
  has not come within ``body_timeout``. So however many clients send large bodies at once, the
  memory they cost is that of about one of them.

Handlers read the body with :func:`body` (already read, within the limits, by the guard).

Invariants:
- a refused request costs no more than its headers (8 KiB lines, 128 headers);
- the guard's middleware is the outermost but ``outer`` ones (metrics observers), so
  authentication and handlers only ever see requests within the limits;
- a connection is counted from its TCP accept until it is closed, whichever way (refused, a
  failed or late handshake, the client leaving) — exactly once;
- the bytes taken from the budget are given back exactly once per request, when its answer is
  returned or it fails or is cancelled, waiting or not; waiters are served first come, first
  served (a small body never overtakes a large one that waits: no starvation).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Mapping

from aiohttp import web

__all__ = ["Budget", "Limits", "Guard", "Serving", "body", "serve"]

log = logging.getLogger("declop.http")

MiB = 1024 * 1024

_BODY: web.RequestKey[bytes] = web.RequestKey("declop.body", bytes)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Limits:
    """What one server accepts from a client; the defaults fit probes and metrics."""

    #: bytes of a request body (on the wire; compressed bodies are refused)
    max_body: int = 64 * 1024
    #: per-path limits above or below ``max_body`` (a webhook path → its kind's limit)
    max_body_by_path: Mapping[str, int] = field(default_factory=dict)
    #: seconds from the connection opening to the end of the first request's headers
    header_timeout: float = 10.0
    #: seconds from the headers to the end of the body
    body_timeout: float = 10.0
    #: seconds an idle keep-alive connection stays open (also bounds later requests' headers)
    idle_timeout: float = 30.0
    #: open connections at once
    max_connections: int = 128
    #: requests being answered at once
    max_in_flight: int = 32
    #: bytes of bodies above ``max_body`` read or being answered at once (None: no budget)
    body_budget: int | None = None

    def body_limit(self, path: str) -> int:
        return self.max_body_by_path.get(path, self.max_body)


_REFUSED = (
    b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: 21\r\n\r\ntoo many connections\n"
)


class _Connection(asyncio.Protocol):
    """One accepted TCP connection: counts it, refuses it past the cap, does the TLS handshake
    (when the server has a certificate), cuts it when its first request's headers are late, and
    hands everything else to aiohttp's protocol.

    Counted from the TCP accept, before any TLS work: a client that opens connections and never
    finishes a handshake holds a slot (and asyncio's 256 KiB TLS buffer) for at most
    ``header_timeout``, and at most ``max_connections`` of them exist at once."""

    def __init__(self, guard: Guard, make: Callable[[], asyncio.Protocol], ssl_context: ssl.SSLContext | None) -> None:
        self.guard = guard
        self.make = make
        self.ssl_context = ssl_context
        self.inner: asyncio.Protocol | None = None
        self.raw: asyncio.Transport | None = None
        self.transport: asyncio.Transport | None = None  # the one aiohttp writes to (TLS or raw)
        self.timer: asyncio.TimerHandle | None = None
        self.counted = False
        #: what arrived between the end of the handshake and start_tls returning (a client
        #: writes its request at once): handed to aiohttp first
        self.early: list[bytes] = []
        self.early_eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.raw = transport
        guard = self.guard
        guard.connections += 1
        self.counted = True
        if guard.connections > guard.limits.max_connections:
            guard.refused += 1
            if self.ssl_context is None:
                transport.write(_REFUSED)
                transport.close()
            else:  # nothing readable can be said before a handshake: close at once
                transport.abort()
            return
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(guard.limits.header_timeout, self._late)
        if self.ssl_context is None:
            self._serve(transport)
        else:
            task = loop.create_task(self._handshake(), name="TLS handshake")
            guard.handshakes.add(task)
            task.add_done_callback(guard.handshakes.discard)

    async def _handshake(self) -> None:
        assert self.raw is not None and self.ssl_context is not None
        loop = asyncio.get_running_loop()
        try:
            tls = await loop.start_tls(
                self.raw, self, self.ssl_context, server_side=True, ssl_handshake_timeout=self.guard.limits.header_timeout
            )
        except (OSError, ssl.SSLError, asyncio.TimeoutError, RuntimeError, ConnectionError) as exc:
            log.debug("TLS handshake failed", extra={"kv": {"error": type(exc).__name__}})
            self.raw.abort()
            self._release()
            return
        except asyncio.CancelledError:  # the server stops
            self.raw.abort()
            self._release()
            raise
        if tls is None or tls.is_closing():
            self._release()
            return
        self._serve(tls)

    def _serve(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.guard.open[transport] = self
        inner = self.inner = self.make()
        inner.connection_made(transport)
        early, self.early = self.early, []
        for data in early:
            inner.data_received(data)
        if self.early_eof and not inner.eof_received():
            transport.close()

    def started(self) -> None:
        """The first request's headers arrived: from now on aiohttp's timers apply."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _late(self) -> None:
        self.timer = None
        self.guard.cut += 1
        log.debug("Closing a connection whose request headers did not arrive in time")
        if self.raw is not None:
            self.raw.abort()

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)
        elif self.transport is None and self.raw is not None:
            self.early.append(data)
            if sum(map(len, self.early)) > 64 * 1024:
                self.raw.abort()

    def eof_received(self) -> bool | None:
        if self.inner is not None:
            return self.inner.eof_received()
        self.early_eof = True
        return True  # keep the transport open: _serve hands the EOF over

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def _release(self) -> None:
        """Uncount this connection (once, whichever way it ended)."""
        if self.counted:
            self.counted = False
            self.guard.connections -= 1
        self.started()
        if self.transport is not None:
            self.guard.open.pop(self.transport, None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        if self.inner is not None:
            inner, self.inner = self.inner, None
            inner.connection_lost(exc)


class Budget:
    """Bytes shared by the requests with large bodies, handed out first come, first served."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def take(self, size: int, timeout: float) -> bool:
        """Take ``size`` bytes (at most the total), waiting up to ``timeout`` s; False past it."""
        size = min(size, self.total)
        if not self._waiting and self.used + size <= self.total:
            self.used += size
            return True
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, turn)
        self._waiting.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(turn), timeout)
            return True
        except asyncio.TimeoutError:
            if turn.done():  # granted as the wait ran out: give it back
                self.give(size)
            return False
        except BaseException:
            if turn.done() and not turn.cancelled():
                self.give(size)
            raise
        finally:
            if not turn.done():
                turn.cancel()
                self._waiting.remove(entry)
                self._wake()

    def give(self, size: int) -> None:
        self.used -= min(size, self.total)
        self._wake()

    def _wake(self) -> None:
        while self._waiting:
            size, turn = self._waiting[0]
            if self.used + size > self.total:
                return
            self._waiting.popleft()
            self.used += size
            turn.set_result(None)


class Guard:
    """The limits of one server: its middleware, its connection factory and its counters."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.budget = Budget(limits.body_budget) if limits.body_budget is not None else None
        #: open connections (refused ones until they are closed)
        self.connections = 0
        self.open: dict[asyncio.BaseTransport, _Connection] = {}
        self.in_flight = 0
        #: TLS handshakes under way (each holds a counted connection)
        self.handshakes: set[asyncio.Task[None]] = set()
        #: connections refused past the cap, cut for late headers; requests shed with 429
        self.refused = 0
        self.cut = 0
        self.shed = 0

    def application(self, middlewares: Iterable[Any] = (), *, outer: Iterable[Any] = ()) -> web.Application:
        """An application whose requests pass the guard (after ``outer``, before ``middlewares``)."""
        biggest = max([self.limits.max_body, *self.limits.max_body_by_path.values()])
        return web.Application(client_max_size=biggest, middlewares=[*outer, self.middleware, *middlewares])

    def protocol_factory(self, runner: web.BaseRunner, ssl_context: ssl.SSLContext | None = None) -> Callable[[], asyncio.Protocol]:
        def make() -> asyncio.Protocol:
            server = runner.server
            assert server is not None
            return _Connection(self, server, ssl_context)

        return make

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        connection = self.open.get(request.transport) if request.transport is not None else None
        if connection is not None:
            connection.started()
        if self.in_flight >= self.limits.max_in_flight:
            self.shed += 1
            return web.Response(status=429, text="too many requests in flight\n", headers={"Retry-After": "1"})
        self.in_flight += 1
        taken = 0
        try:
            if request.body_exists:
                taken = self._budgeted(request)
                if taken and self.budget is not None and not await self.budget.take(taken, self.limits.body_timeout):
                    taken = 0
                    self.shed += 1
                    return web.Response(status=429, text="too many large requests at once\n", headers={"Retry-After": "1"})
                refused = await self._read(request)
                if refused is not None:
                    return refused
            return await handler(request)
        finally:
            self.in_flight -= 1
            request.pop(_BODY, None)  # a keep-alive connection may hold its last request a while
            if taken and self.budget is not None:
                self.budget.give(taken)

    def _budgeted(self, request: web.Request) -> int:
        """The bytes ``request`` takes from the budget: 0 for a small body (or no budget)."""
        if self.budget is None:
            return 0
        length, limit = request.content_length, self.limits.body_limit(request.path)
        if length is not None and length > limit:
            return 0  # refused by _read before a byte is read
        size = length if length is not None else limit
        return size if size > self.limits.max_body else 0

    async def _read(self, request: web.Request) -> web.Response | None:
        """Read the body into ``request`` within the limits; the refusal when it is not."""
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            return _closing(415, f"Content-Encoding {encoding[:20]!r} is not accepted; send the body uncompressed\n")
        limit = self.limits.body_limit(request.path)
        length = request.content_length
        if length is not None and length > limit:
            return _closing(413, f"the request body is {length} bytes; this path accepts at most {limit}\n")
        chunks: list[bytes] = []
        size = 0

        async def read() -> bool:
            nonlocal size
            async for chunk in request.content.iter_any():
                size += len(chunk)
                if size > limit:
                    return False
                chunks.append(chunk)
            return True

        try:
            within = await asyncio.wait_for(read(), self.limits.body_timeout)
        except asyncio.TimeoutError:
            return _closing(408, f"the request body did not arrive within {self.limits.body_timeout:g} s\n")
        if not within:
            return _closing(413, f"the request body is over {limit} bytes; this path accepts at most {limit}\n")
        request[_BODY] = b"".join(chunks)
        return None


def _closing(status: int, text: str) -> web.Response:
    response = web.Response(status=status, text=text)
    response.force_close()
    return response


async def body(request: web.Request) -> bytes:
    """The request's body as the guard read it (read here when no guard ran)."""
    given = request.get(_BODY)
    return given if isinstance(given, bytes) else await request.read()


class _Site(web.BaseSite):
    """aiohttp's TCPSite, with the guard's connection factory in front of aiohttp's protocol."""

    def __init__(self, runner: web.BaseRunner, guard: Guard, host: str, port: int, ssl_context: ssl.SSLContext | None) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._guard, self._host, self._port = guard, host, port

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(  # TLS is the connection's: after it is counted
            self._guard.protocol_factory(self._runner, self._ssl_context), self._host, self._port,
            backlog=self._backlog, reuse_address=True,
        )


@dataclass
class Serving:
    """A running server: its guard (counters) and the port it listens on."""

    runner: web.AppRunner
    guard: Guard
    port: int

    async def stop(self) -> None:
        handshakes = list(self.guard.handshakes)
        for task in handshakes:
            task.cancel()
        await asyncio.gather(*handshakes, return_exceptions=True)
        await self.runner.cleanup()


async def serve(app: web.Application, guard: Guard, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> Serving:
    """Start ``app`` (built by ``guard.application``) on ``host:port`` with the guard's limits.

    ``port`` 0 picks a free port (:attr:`Serving.port`). Raises :class:`OSError` when the port
    cannot be bound (nothing is left running)."""
    limits = guard.limits
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False,
        keepalive_timeout=limits.idle_timeout, auto_decompress=False,
        max_line_size=8190, max_field_size=8190, max_headers=128, lingering_time=1.0,
    )
    await runner.setup()
    site = _Site(runner, guard, host, port, ssl_context)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    server = site._server
    sockets = server.sockets if isinstance(server, asyncio.Server) else ()
    bound = sockets[0].getsockname()[1] if sockets else port
    return Serving(runner, guard, bound)
