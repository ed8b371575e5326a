"""declop.kube.transport: the pure helpers — verb classification, error mapping, query encoding."""

from __future__ import annotations

import json
from typing import Any

import pytest

from declop.errors import ApiError, Conflict, Forbidden, NotFound
from declop.kube.transport import (
    rbac_resource,
    PATCH_TYPES,
    TransportStatistics,
    _is_collection,
    _query,
    _retry_after,
    _verb,
    dumps,
    error_from,
    loads,
)

# -- _is_collection / _verb ------------------------------------------------------------------

COLLECTIONS = [
    "/api/v1/pods",  # core, all namespaces
    "/api/v1/namespaces/default/pods",  # core, namespaced
    "/api/v1/nodes",  # core, cluster-scoped
    "/api/v1/namespaces",  # the namespaces collection itself
    "/apis/apps/v1/deployments",  # grouped, all namespaces
    "/apis/apps/v1/namespaces/default/deployments",  # grouped, namespaced
    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",  # grouped, cluster-scoped
    "/apis/example.com/v1alpha1/namespaces/team-a/widgets",
    "/api/v1/namespaces/default/pods?labelSelector=app%3Dweb",
]

OBJECTS = [
    "/api/v1/namespaces/default/pods/nginx",
    "/api/v1/nodes/node-1",
    "/api/v1/namespaces/default",  # one namespace object
    "/apis/apps/v1/namespaces/default/deployments/web",
    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com",
    "/apis/example.com/v1alpha1/namespaces/team-a/widgets/w1",
    "/api/v1/namespaces/default/pods/nginx/status",  # subresource of a namespaced object
    "/apis/apps/v1/namespaces/default/deployments/web/scale",
    "/api/v1/nodes/node-1/status",  # subresource of a cluster-scoped object
    "/api/v1/namespaces/default/pods/nginx?pretty=true",
    "/api/v1/namespaces/default/status",  # subresource of one namespace (readNamespaceStatus)
]


@pytest.mark.parametrize("path", COLLECTIONS)
def test_collections(path: str) -> None:
    assert _is_collection(path) is True
    assert _verb("GET", path, None) == "list"
    assert _verb("GET", path, {"limit": 500}) == "list"


@pytest.mark.parametrize("path", OBJECTS)
def test_single_objects(path: str) -> None:
    assert _is_collection(path) is False
    assert _verb("GET", path, None) == "get"


@pytest.mark.parametrize("watch", ["1", "true", 1, True])
@pytest.mark.parametrize("path", ["/api/v1/pods", "/apis/apps/v1/namespaces/default/deployments"])
def test_watch(path: str, watch: Any) -> None:
    assert _verb("GET", path, {"watch": watch, "resourceVersion": "5"}) == "watch"


@pytest.mark.parametrize("watch", ["false", "0", 0, False, None])
def test_watch_false_is_a_list(watch: Any) -> None:
    assert _verb("GET", "/api/v1/pods", {"watch": watch}) == "list"


@pytest.mark.parametrize(
    ("method", "verb"),
    [
        ("POST", "create"),
        ("PUT", "update"),
        ("PATCH", "patch"),
        ("DELETE", "delete"),
        ("HEAD", "HEAD"),
    ],
)
def test_write_verbs(method: str, verb: str) -> None:
    assert _verb(method, "/api/v1/namespaces/default/pods/nginx", None) == verb
    assert _verb(method, "/api/v1/namespaces/default/pods", {"watch": "true"}) == verb


@pytest.mark.parametrize(
    ("path", "resource"),
    [
        ("/api/v1/namespaces/default/pods", ("", "pods")),
        ("/api/v1/namespaces/default/pods/nginx", ("", "pods")),
        ("/api/v1/namespaces/default/pods/nginx/status", ("", "pods/status")),
        ("/api/v1/namespaces", ("", "namespaces")),
        ("/api/v1/namespaces/default", ("", "namespaces")),
        ("/api/v1/namespaces/default/finalize", ("", "namespaces/finalize")),
        ("/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", ("coordination.k8s.io", "leases")),
        ("/apis/authentication.k8s.io/v1/tokenreviews", ("authentication.k8s.io", "tokenreviews")),
        ("/apis/example.com/v1/widgets/w/scale?x=1", ("example.com", "widgets/scale")),
        ("/api", None),
        ("/apis/apps/v1", None),
        ("/version", None),
    ],
)
def test_rbac_resource(path: str, resource: tuple[str, str] | None) -> None:
    assert rbac_resource(path) == resource


def test_statistics_reads_and_writes() -> None:
    stats = TransportStatistics(
        by_verb={"get": 2, "list": 3, "watch": 4, "create": 1, "patch": 5, "delete": 1}
    )
    assert stats.reads == 5
    assert stats.writes == 7
    assert TransportStatistics(by_verb={}).reads == 0


# -- error_from ---------------------------------------------------------------------------


def status_body(code: int, reason: str, message: str) -> bytes:
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
    ).encode()


@pytest.mark.parametrize(
    ("status", "reason", "cls"),
    [(404, "Not Found", NotFound), (409, "Conflict", Conflict), (403, "Forbidden", Forbidden)],
)
def test_error_from_maps_known_statuses(status: int, reason: str, cls: type[ApiError]) -> None:
    message = f'pods "nginx" is {reason.lower()}'
    err = error_from(
        status, reason, status_body(status, reason.replace(" ", ""), message), "GET", "/api/v1/x"
    )
    assert type(err) is cls
    assert err.status == status
    assert str(err) == message
    assert err.message == message
    assert isinstance(err.body, dict)
    assert err.body["code"] == status


def test_error_from_forbidden_is_a_permission_error_and_not_found_a_lookup_error() -> None:
    assert isinstance(error_from(403, "Forbidden", b"", "GET", "/p"), PermissionError)
    assert isinstance(error_from(404, "Not Found", b"", "GET", "/p"), LookupError)


def test_error_from_other_status_is_a_plain_api_error() -> None:
    body = status_body(500, "InternalError", "etcdserver: request timed out")
    err = error_from(500, "Internal Server Error", body, "PUT", "/api/v1/namespaces/a/pods/b")
    assert type(err) is ApiError
    assert err.status == 500
    assert err.reason == "Internal Server Error"
    assert str(err) == "etcdserver: request timed out"


def test_error_from_422_is_a_plain_api_error() -> None:
    err = error_from(
        422,
        "Unprocessable Entity",
        status_body(422, "Invalid", "the server rejected our request"),
        "PATCH",
        "/p",
    )
    assert type(err) is ApiError
    assert err.status == 422
    assert "rejected" in str(err)


@pytest.mark.parametrize(
    "payload", [b"", b"null", b"[]", b'{"kind": "Status"}', b'{"message": ""}']
)
def test_error_from_without_a_message_describes_the_request(payload: bytes) -> None:
    err = error_from(500, "Internal Server Error", payload, "DELETE", "/api/v1/namespaces/a/pods/b")
    assert str(err) == "DELETE /api/v1/namespaces/a/pods/b: 500 Internal Server Error"
    nf = error_from(404, "Not Found", payload, "GET", "/api/v1/nodes/x")
    assert type(nf) is NotFound
    assert str(nf) == "GET /api/v1/nodes/x: 404 Not Found"


def test_error_from_non_json_payload_uses_the_text() -> None:
    err = error_from(502, "Bad Gateway", b"<html>upstream down</html>", "GET", "/api/v1/pods")
    assert type(err) is ApiError
    assert str(err) == "<html>upstream down</html>"
    assert err.body is None


def test_error_from_truncates_long_non_json_payloads() -> None:
    err = error_from(500, "x", b"e" * 1000, "GET", "/p")
    assert str(err) == "e" * 200


# -- _query -------------------------------------------------------------------------------


def test_query_empty_is_none() -> None:
    assert _query(None) is None
    assert _query({}) is None


def test_query_bools_none_and_others() -> None:
    assert _query(
        {
            "watch": True,
            "allowWatchBookmarks": False,
            "resourceVersion": None,
            "limit": 500,
            "timeoutSeconds": 1.5,
            "labelSelector": "app=web",
        }
    ) == {
        "watch": "true",
        "allowWatchBookmarks": "false",
        "limit": "500",
        "timeoutSeconds": "1.5",
        "labelSelector": "app=web",
    }


def test_query_all_none() -> None:
    assert _query({"resourceVersion": None}) == {}


# -- small helpers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "attempt", "seconds"),
    [("2", 0, 2.0), ("0", 0, 0.1), ("100", 0, 30.0), (None, 0, 0.1)],
)
def test_retry_after_header(value: str | None, attempt: int, seconds: float) -> None:
    assert _retry_after(value, attempt) == seconds


@pytest.mark.parametrize(("attempt", "seconds"), [(0, 0.2), (1, 0.4), (3, 1.6), (20, 30.0)])
def test_retry_after_unparseable_backs_off(attempt: int, seconds: float) -> None:
    assert _retry_after("Wed, 21 Oct 2015 07:28:00 GMT", attempt) == pytest.approx(seconds)


def test_json_round_trip() -> None:
    obj = {"a": [1, 2, {"b": None}], "c": "é"}
    assert loads(dumps(obj)) == obj
    assert isinstance(dumps(obj), bytes)
    assert loads('{"x": 1}') == {"x": 1}


def test_patch_types() -> None:
    assert PATCH_TYPES["json"] == "application/json-patch+json"
    assert PATCH_TYPES["merge"] == "application/merge-patch+json"


# -- rate-limit lanes ---------------------------------------------------------------------------


class _Config:
    """The few attributes of kubernetes.client.Configuration the transport reads."""

    def __init__(self, host: str) -> None:
        self.host = host

    def auth_settings(self) -> dict[str, Any]:
        return {}


def _run(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)


def test_lanes_never_wait_behind_each_other() -> None:
    """500 queued handler writes (25 s of budget at 20 qps) do not delay a Lease renewal or a list."""
    import asyncio
    import time

    from aiohttp import web

    from declop.kube.transport import LANES, Transport

    async def main() -> tuple[float, float, int]:
        async def ok(request: web.Request) -> web.Response:
            return web.json_response({})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", ok)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        transport = Transport(_Config(f"http://127.0.0.1:{port}"), qps=20, burst=30)
        try:
            writes = [asyncio.ensure_future(transport.request("PATCH", "/api/v1/namespaces/d/pods/p", body={}))
                      for _ in range(500)]
            await asyncio.sleep(0.05)  # the burst went out; 470 writes now wait on the handler lane
            t0 = time.monotonic()
            await transport.request("PUT", "/apis/coordination.k8s.io/v1/namespaces/d/leases/l", body={}, lane="leader")
            leader = time.monotonic() - t0
            t0 = time.monotonic()
            await transport.request("GET", "/api/v1/pods", lane="informer")
            informer = time.monotonic() - t0
            sent = sum(w.done() for w in writes)
            for w in writes:
                w.cancel()
            await asyncio.gather(*writes, return_exceptions=True)
            return leader, informer, sent
        finally:
            await transport.close()
            await runner.cleanup()

    leader, informer, sent = _run(main())
    assert sent < 60, "the handler lane must actually be saturated for this test to mean anything"
    assert leader < 0.5 and informer < 0.5
    assert LANES == ("handler", "informer", "leader", "auth")


def test_a_lease_renewal_never_waits_for_a_connection_behind_a_full_pool() -> None:
    """Every pooled connection held by a slow request (a burst of handler writes, a big list):
    a renewal on the "leader" lane still goes out at once, on its own pool — were it to wait,
    the Lease would pass its renew deadline and the replica lose it for no reason."""
    import asyncio
    import time

    from aiohttp import web

    from declop.kube.transport import Transport

    async def main() -> tuple[float, int]:
        release = asyncio.Event()

        async def answer(request: web.Request) -> web.Response:
            if "leases" not in request.path:
                await release.wait()  # holds its pooled connection until the renewal is through
            return web.json_response({})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        transport = Transport(_Config(f"http://127.0.0.1:{port}"), max_connections=2)
        try:
            slow = [asyncio.ensure_future(transport.request("PATCH", f"/api/v1/namespaces/d/pods/p{i}", body={})) for i in range(3)]
            await asyncio.sleep(0.2)  # two hold the pool's two connections, the third waits for one
            t0 = time.monotonic()
            await asyncio.wait_for(
                transport.request("PUT", "/apis/coordination.k8s.io/v1/namespaces/d/leases/l", body={}, lane="leader"), 5
            )
            renewal = time.monotonic() - t0
            waiting = sum(not w.done() for w in slow)
            release.set()
            await asyncio.gather(*slow)
            return renewal, waiting
        finally:
            await transport.close()
            await runner.cleanup()

    renewal, waiting = _run(main())
    assert waiting == 3, "the pool must actually be full for this test to mean anything"
    assert renewal < 0.5


def test_reviews_of_strangers_tokens_do_not_delay_a_handler_write() -> None:
    """300 TokenReviews queued on the "auth" lane (what junk tokens at /metrics cause) leave the
    handler lane's budget whole: the next write goes out at once."""
    import asyncio
    import time

    from aiohttp import web

    from declop.kube.transport import AUTH_BURST, Transport

    async def main() -> tuple[float, int]:
        async def ok(request: web.Request) -> web.Response:
            return web.json_response({})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", ok)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        transport = Transport(_Config(f"http://127.0.0.1:{port}"))
        try:
            reviews = [
                asyncio.ensure_future(transport.request(
                    "POST", "/apis/authentication.k8s.io/v1/tokenreviews", body={}, lane="auth"))
                for _ in range(300)
            ]
            while sum(r.done() for r in reviews) < AUTH_BURST:
                await asyncio.sleep(0.01)  # the auth lane's burst went out; the rest wait on it
            t0 = time.monotonic()
            await transport.request("PATCH", "/api/v1/namespaces/d/pods/p", body={})
            write = time.monotonic() - t0
            sent = sum(r.done() for r in reviews)
            for r in reviews:
                r.cancel()
            await asyncio.gather(*reviews, return_exceptions=True)
            return write, sent
        finally:
            await transport.close()
            await runner.cleanup()

    write, sent = _run(main())
    assert sent < 60, "the auth lane must be saturated for this test to mean anything"
    assert write < 0.5


def test_a_proxy_password_never_appears_in_errors() -> None:
    """aiohttp's errors may quote the proxy URL: the message carries it as Go's url.Redacted does."""
    import socket

    from declop.kube.kubeconfig import RestConfig
    from declop.kube.transport import Transport

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens there once the socket is closed
    cfg = RestConfig(host="https://apiserver.example:6443", proxy=f"http://alice:pr%40xy-s3cret@127.0.0.1:{closed}")

    async def main() -> str:
        transport = Transport(cfg, retries=0)
        try:
            await transport.request("GET", "/api")
        except ApiError as exc:
            return str(exc)
        finally:
            await transport.close()
        raise AssertionError("the request cannot succeed")

    message = _run(main())
    assert "through the proxy http://alice:xxxxx@127.0.0.1" in message, message
    assert "s3cret" not in message and "pr@xy" not in message


def test_a_cancelled_wait_gives_its_token_back() -> None:
    import asyncio

    from declop.kube.transport import Transport

    async def main() -> float:
        transport = Transport(_Config("http://127.0.0.1:9"), qps=10, burst=1)
        bucket = transport._buckets["handler"]
        assert bucket is not None
        bucket.when(None)  # the burst is used
        waiters = [asyncio.ensure_future(transport.request("GET", "/api/v1/pods")) for _ in range(20)]
        await asyncio.sleep(0.01)
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        await transport.close()
        return bucket.when(None)  # 20 abandoned reservations left nothing behind them

    assert _run(main()) <= 0.1 + 1e-6


# -- how a watch stream ends (stream()) ------------------------------------------------------


async def _drain(transport: Any, path: str, **kw: Any) -> list[bytes]:
    return [line async for line in transport.stream(path, {"watch": "1"}, **kw)]


def _watch_outcome(steps: tuple[Any, ...], **kw: Any) -> Any:
    import asyncio

    from declop.testing.fakes.listwatch import ListWatchServer

    async def scenario() -> Any:
        async with ListWatchServer() as server:
            server.script_watch(*steps)
            try:
                return await _drain(server.transport(), server.path, **kw)
            except Exception as exc:  # noqa: BLE001 - the outcome under test
                return exc

    return asyncio.run(scenario())


def test_stream_idle_read_is_stream_idle_not_unreachable() -> None:
    """aiohttp's read timeout is a ClientConnectionError subclass: it must not read as Unreachable."""
    from declop.testing.fakes.listwatch import Step
    from declop.kube.transport import StreamIdle

    outcome = _watch_outcome((Step.bookmark(), Step.idle(2)), read_timeout=0.2)
    assert isinstance(outcome, StreamIdle) and outcome.reason == "Idle"


def test_stream_cut_after_it_began_is_interrupted() -> None:
    from declop.testing.fakes.listwatch import Step
    from declop.kube.transport import StreamInterrupted

    outcome = _watch_outcome((Step.bookmark(), Step.abort()))
    assert isinstance(outcome, StreamInterrupted) and outcome.reason == "Interrupted"


def test_stream_closed_by_the_server_just_ends() -> None:
    from declop.testing.fakes.listwatch import Step

    outcome = _watch_outcome((Step.bookmark(), Step.close()))
    assert isinstance(outcome, list) and len(outcome) == 1


def test_stream_error_status_carries_retry_after() -> None:
    from declop.testing.fakes.listwatch import Step

    outcome = _watch_outcome((Step.status(429, "TooManyRequests", retry_after=3),))
    assert isinstance(outcome, ApiError) and outcome.status == 429 and outcome.retry_after == 3.0


def test_stream_refused_connection_is_unreachable() -> None:
    import asyncio
    import socket

    from declop.testing.fakes.listwatch import ListWatchServer
    from declop.kube.transport import StreamIdle, StreamInterrupted

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there

    async def scenario() -> Any:
        async with ListWatchServer() as server:
            transport = server.transport()
            transport.host = f"http://127.0.0.1:{port}"
            try:
                await _drain(transport, server.path)
            except Exception as exc:  # noqa: BLE001
                return exc

    outcome = asyncio.run(scenario())
    assert isinstance(outcome, ApiError) and outcome.reason == "Unreachable"
    assert not isinstance(outcome, (StreamIdle, StreamInterrupted))


# -- a pooled connection the network cut while it was idle -------------------------------------


class _StaleServer:
    """A raw HTTP/1.1 server whose chosen connections answer their first request, stay open for
    keep-alive, and reset on the next one without answering — what a kept-alive connection does
    after a proxy or NAT dropped it while idle and before the client's loop saw the reset. With
    ``reset_all`` every request is reset on arrival, answered or not."""

    def __init__(self, *, reset_all: bool = False) -> None:
        self.reset_all = reset_all
        self.connections = 0
        self.requests: list[str] = []
        self.server: Any = None

    async def __aenter__(self) -> "_StaleServer":
        import asyncio

        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.server.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: Any, writer: Any) -> None:
        import asyncio
        import socket
        import struct

        self.connections += 1
        served = 0
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return  # the client closed it
            self.requests.append(head.split(b" ", 2)[0].decode() + " " + head.split(b" ", 2)[1].decode())
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            if length:
                await reader.readexactly(length)
            if self.reset_all or served:
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()  # RST, nothing answered
                return
            body = b'{"kind":"Status","n":%d}\n' % len(self.requests)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
            served += 1


def _after_kept_alive_gets(second: Any, *, pooled: int = 1, **server_kw: Any) -> tuple[Any, _StaleServer]:
    """``pooled`` concurrent GETs that leave as many connections in the pool, then
    ``second(transport)`` on that pool."""
    import asyncio

    from declop.kube.transport import Transport

    async def main() -> tuple[Any, _StaleServer]:
        async with _StaleServer(**server_kw) as server:
            transport = Transport(_Config(server.url))
            try:
                if not server.reset_all:
                    await asyncio.gather(*(transport.request("GET", "/api/v1/pods") for _ in range(pooled)))
                    assert server.connections == pooled
                try:
                    return await second(transport), server
                except Exception as exc:  # noqa: BLE001 - the outcome under test
                    return exc, server
            finally:
                await transport.close()

    return _run(main())


WATCH = "GET /api/v1/namespaces/a/configmaps?watch=1"


@pytest.mark.parametrize("pooled", [1, 2, 5])
def test_a_rewatch_never_draws_a_pooled_connection_the_network_may_have_cut(pooled: int) -> None:
    """The CI flake of test_connection_resets_on_a_healthy_watch…: the proxy cut every connection;
    the re-watch drew a kept-alive one whose reset the loop had not seen yet, aiohttp's single
    replay drew another, and the informer logged an ERROR and backed off 1.6 s. A watch now opens
    its own connection: none of its requests lands on a pooled one."""
    outcome, server = _after_kept_alive_gets(lambda t: _drain(t, "/api/v1/namespaces/a/configmaps"), pooled=pooled)
    assert outcome == [b'{"kind":"Status","n":%d}' % (pooled + 1)]
    assert server.requests == ["GET /api/v1/pods"] * pooled + [WATCH]
    assert server.connections == pooled + 1


def test_a_watch_connection_is_closed_when_the_watch_ends_not_pooled() -> None:
    async def two_watches(transport: Any) -> list[bytes]:
        return await _drain(transport, "/api/v1/namespaces/a/configmaps") + await _drain(transport, "/api/v1/namespaces/a/configmaps")

    outcome, server = _after_kept_alive_gets(two_watches)
    assert len(outcome) == 2 and server.requests == ["GET /api/v1/pods", WATCH, WATCH]
    assert server.connections == 3


def test_a_get_on_a_pooled_connection_cut_while_idle_is_sent_again() -> None:
    """aiohttp (>= 3.10) replays an idempotent request once when a kept-alive connection breaks
    before an answer; the transport relies on it for a handler's reads after a network cut."""
    outcome, server = _after_kept_alive_gets(lambda t: t.request("GET", "/api/v1/namespaces/a/configmaps/x"))
    assert outcome == {"kind": "Status", "n": 3}
    assert server.connections == 2


def test_a_write_on_a_pooled_connection_cut_while_idle_is_not_replayed() -> None:
    """A POST may have been acted on before the reset: it fails as Unreachable, sent once."""
    outcome, server = _after_kept_alive_gets(
        lambda t: t.request("POST", "/api/v1/namespaces/a/configmaps", body={"metadata": {"name": "x"}})
    )
    assert isinstance(outcome, ApiError) and outcome.reason == "Unreachable"
    assert server.requests == ["GET /api/v1/pods", "POST /api/v1/namespaces/a/configmaps"]


def test_a_watch_whose_connection_is_reset_before_an_answer_is_unreachable() -> None:
    outcome, server = _after_kept_alive_gets(lambda t: _drain(t, "/api/v1/namespaces/a/configmaps"), reset_all=True)
    assert isinstance(outcome, ApiError) and outcome.reason == "Unreachable"


# -- bulk reads (stream(bulk=...): a streaming list's initial events) ---------------------------


def _read_batches(bulk: Any, events: int) -> tuple[list[bytes], int]:
    """Stream ``events`` lines written one by one, 0.2 ms apart; return the lines and the number
    of distinct loop iterations they were handed on in (lines of one read share one)."""
    import asyncio

    from declop.testing.fakes.listwatch import ListWatchServer, Step

    async def scenario() -> tuple[list[bytes], int]:
        ticks = 0

        async def count_ticks() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0)
                ticks += 1

        steps: list[Any] = []
        for i in range(events):
            steps += [Step.raw(b'{"n": %d}' % i), Step.idle(0.0002)]
        async with ListWatchServer() as server:
            server.script_watch(*steps, Step.close())
            counter = asyncio.ensure_future(count_ticks())
            lines, seen = [], set()
            try:
                async for line in server.transport().stream(server.path, {"watch": "1"}, bulk=bulk):
                    lines.append(line)
                    seen.add(ticks)
            finally:
                counter.cancel()
            return lines, len(seen)

    return asyncio.run(scenario())


def test_bulk_stream_reads_what_arrived_together_and_loses_nothing() -> None:
    """While ``bulk`` answers true, a small read is followed by a pause: later lines pile up and
    come in one read, whole and in order, instead of one read per line."""
    lines, batches = _read_batches(lambda: True, 200)
    assert lines == [b'{"n": %d}' % i for i in range(200)]
    plain_lines, plain_batches = _read_batches(None, 200)
    assert plain_lines == lines
    assert batches * 3 <= plain_batches, (batches, plain_batches)


def test_bulk_stream_reads_at_once_once_bulk_answers_false() -> None:
    """``bulk`` is asked after each read: the stream reads in bulk only while it answers true,
    and every line still arrives, in order."""
    asked = 0

    def first_half() -> bool:
        nonlocal asked
        asked += 1
        return asked <= 5

    lines, batches = _read_batches(first_half, 100)
    assert lines == [b'{"n": %d}' % i for i in range(100)]
    bulk_lines, bulk_batches = _read_batches(lambda: True, 100)
    assert bulk_lines == lines and batches > bulk_batches, (batches, bulk_batches)


def test_bulk_stream_cut_mid_transfer_is_interrupted_not_hung() -> None:
    """A connection cut while the stream is read in bulk (paused between reads) ends the stream
    as StreamInterrupted, not a hang; what came before the cut came as whole lines, in order (a
    reset may discard bytes still unread in the kernel, so a prefix)."""
    import asyncio

    from declop.kube.transport import StreamInterrupted
    from declop.testing.fakes.listwatch import ListWatchServer, Step

    async def scenario() -> tuple[list[bytes], BaseException | None]:
        steps: list[Any] = []
        for i in range(50):
            steps += [Step.raw(b'{"n": %d}' % i), Step.idle(0.0002)]
        async with ListWatchServer() as server:
            server.script_watch(*steps, Step.abort())
            lines: list[bytes] = []
            try:
                async for line in server.transport().stream(server.path, {"watch": "1"}, bulk=lambda: True):
                    lines.append(line)
            except Exception as exc:  # noqa: BLE001 - the outcome under test
                return lines, exc
            return lines, None

    lines, outcome = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert isinstance(outcome, StreamInterrupted), outcome
    assert lines == [b'{"n": %d}' % i for i in range(len(lines))]
