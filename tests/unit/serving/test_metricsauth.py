"""declop.serving.metricsauth: 401/403/429/500/200, what is sent for review (on the "auth" lane),
the decision caches (TTLs; junk cannot evict a working token), the bound on reviews in flight,
shared reviews, and cancellation when the caller hangs up."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from declop.clock import FakeClock
from declop.serving.metricsauth import ACCESS_REVIEWS, TOKEN_REVIEWS, MetricsAuth


class FakeApiserver:
    """Answers TokenReviews (token "good-*" → user "alice-*") and SubjectAccessReviews (alice-ok
    allowed). A unit boundary: the real apiserver is in tests/integration/test_metrics_auth.py."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []
        self.lanes: list[str | None] = []
        self.fail = False
        #: when set, reviews wait for it (a slow apiserver)
        self.gate: asyncio.Event | None = None
        self.cancelled = 0

    async def request(self, method: str, path: str, *, body: Any = None, lane: str | None = None, **_: Any) -> Any:
        self.sent.append((path, body))
        self.lanes.append(lane)
        if self.gate is not None:
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if self.fail:
            raise OSError("apiserver down")
        if path == TOKEN_REVIEWS:
            token = body["spec"]["token"]
            if token.startswith("good-"):
                return {"status": {"authenticated": True, "user": {"username": "alice-" + token[5:], "uid": "u1", "groups": ["g"], "extra": {"x": ["y"]}}}}
            return {"status": {"authenticated": False}}
        return {"status": {"allowed": body["spec"]["user"] == "alice-ok"}}


def call(auth: MetricsAuth, header: str | None) -> web.StreamResponse:
    headers = {"Authorization": header} if header is not None else {}
    request = make_mocked_request("GET", "/metrics", headers=headers)

    async def handler(_: web.Request) -> web.Response:
        return web.Response(text="metrics")

    return asyncio.run(auth.middleware(request, handler))


@pytest.fixture
def server() -> FakeApiserver:
    return FakeApiserver()


@pytest.mark.parametrize("header", [None, "", "Basic dTpw", "Bearer ", "Bearer bad"])
def test_no_valid_bearer_token_is_401(server: FakeApiserver, header: str | None) -> None:
    response = call(MetricsAuth(server.request), header)
    assert response.status == 401 and response.text == "Unauthorized\n"


def test_authenticated_but_not_allowed_is_403(server: FakeApiserver) -> None:
    response = call(MetricsAuth(server.request), "Bearer good-no")
    assert response.status == 403 and response.text == "Authorization denied for user alice-no\n"
    review = server.sent[1][1]
    assert server.sent[1][0] == ACCESS_REVIEWS
    assert review["spec"] == {"user": "alice-no", "groups": ["g"], "uid": "u1", "extra": {"x": ["y"]},
                              "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}


def test_allowed_is_served(server: FakeApiserver) -> None:
    response = call(MetricsAuth(server.request), "Bearer good-ok")
    assert response.status == 200 and response.text == "metrics"


def test_an_apiserver_failure_is_500_never_200(server: FakeApiserver) -> None:
    server.fail = True
    response = call(MetricsAuth(server.request), "Bearer good-ok")
    assert response.status == 500 and response.text == "Authentication failed\n"


@pytest.mark.parametrize(
    ("token", "ttl", "again"),
    [("good-ok", 300.0, TOKEN_REVIEWS), ("good-no", 30.0, ACCESS_REVIEWS)],
    ids=["allowed-5min", "denied-30s"],
)
def test_decisions_are_cached_like_controller_runtime(server: FakeApiserver, token: str, ttl: float, again: str) -> None:
    """Tokens 1 minute, allowed 5 minutes, denied 30 seconds: whichever expires first is asked again."""
    clock = FakeClock()
    auth = MetricsAuth(server.request, clock=clock)
    call(auth, f"Bearer {token}")
    assert auth.reviews == 2
    clock.advance(min(ttl, 60.0) - 1)
    call(auth, f"Bearer {token}")
    assert auth.reviews == 2  # both cached
    clock.advance(2)
    call(auth, f"Bearer {token}")
    assert auth.reviews == 3 and server.sent[-1][0] == again


def test_failed_token_reviews_are_cached_too_and_tokens_never_kept_as_text(server: FakeApiserver) -> None:
    auth = MetricsAuth(server.request, clock=FakeClock())
    call(auth, "Bearer bad")
    call(auth, "Bearer bad")
    assert auth.reviews == 1
    assert all(not isinstance(k, str) for k in (*auth._tokens._items, *auth._bad_tokens._items))


def test_junk_tokens_fill_only_the_small_failure_cache(server: FakeApiserver) -> None:
    """Successes and failures are cached apart: a flood of junk tokens never pushes a working
    scraper's token (or its allowed access) out, so it is not reviewed again."""
    auth = MetricsAuth(server.request, clock=FakeClock(), max_entries=3, max_denied=5)

    async def main() -> None:
        assert (await auth.middleware(mocked("good-ok"), metrics)).status == 200
        assert auth.reviews == 2
        for i in range(200):
            assert (await auth.middleware(mocked(f"bad-{i}"), metrics)).status == 401
        assert len(auth._bad_tokens) == 5 and len(auth._tokens) == 1
        assert (await auth.middleware(mocked("good-ok"), metrics)).status == 200

    asyncio.run(main())
    assert auth.reviews == 2 + 200  # the good token was not reviewed again


def test_reviews_use_their_own_lane(server: FakeApiserver) -> None:
    """Never the handlers' client-side rate limit (declop.kube.transport LANES)."""
    call(MetricsAuth(server.request), "Bearer good-ok")
    assert server.lanes == ["auth", "auth"]


class Peer:
    """The transport of a mocked request: open until ``hang_up``."""

    def __init__(self) -> None:
        self.closing = False

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def sent(server: FakeApiserver, n: int) -> None:
    """Until ``n`` reviews reached the fake apiserver."""
    while len(server.sent) < n:
        await asyncio.sleep(0)


def mocked(token: str, peer: Peer | None = None) -> web.Request:
    return make_mocked_request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"}, transport=peer or Peer())


async def metrics(_: web.Request) -> web.Response:
    return web.Response(text="metrics")


def test_reviews_in_flight_are_bounded_and_the_rest_get_429(server: FakeApiserver) -> None:
    async def main() -> None:
        server.gate = asyncio.Event()
        auth = MetricsAuth(server.request, max_in_flight=4)
        waiting = [asyncio.create_task(auth.middleware(mocked(f"bad-{i}"), metrics)) for i in range(4)]
        await sent(server, 4)
        refused = [await auth.middleware(mocked(f"bad-x{i}"), metrics) for i in range(50)]
        assert {(r.status, r.text, r.headers.get("Retry-After")) for r in refused} == {
            (429, "Too many authentication requests\n", "1")
        }
        assert len(server.sent) == 4 and auth.refused == 50
        server.gate.set()
        assert [r.status for r in await asyncio.gather(*waiting)] == [401] * 4
        assert (await auth.middleware(mocked("bad-after"), metrics)).status == 401  # room again

    asyncio.run(main())


def test_a_token_that_was_good_is_rechecked_past_the_bound(server: FakeApiserver) -> None:
    """A working scraper whose cached decision expired during a flood is not locked out."""

    async def main() -> None:
        clock = FakeClock()
        auth = MetricsAuth(server.request, max_in_flight=2, clock=clock)
        assert (await auth.middleware(mocked("good-ok"), metrics)).status == 200
        clock.advance(61)  # the token review expired
        server.gate = asyncio.Event()
        flood = [asyncio.create_task(auth.middleware(mocked(f"bad-{i}"), metrics)) for i in range(2)]
        await sent(server, 4)
        assert (await auth.middleware(mocked("bad-more"), metrics)).status == 429
        scraper = asyncio.create_task(auth.middleware(mocked("good-ok"), metrics))
        await sent(server, 5)
        server.gate.set()
        assert (await scraper).status == 200
        await asyncio.gather(*flood)

    asyncio.run(main())


def test_concurrent_requests_with_one_token_share_one_review(server: FakeApiserver) -> None:
    async def main() -> None:
        server.gate = asyncio.Event()
        auth = MetricsAuth(server.request, max_in_flight=1)
        same = [asyncio.create_task(auth.middleware(mocked("good-ok"), metrics)) for _ in range(20)]
        await sent(server, 1)
        for _ in range(10):
            await asyncio.sleep(0)  # the other 19 join the same review (a second would show in sent)
        server.gate.set()
        assert {r.status for r in await asyncio.gather(*same)} == {200}
        assert auth.reviews == 2  # one TokenReview, one SubjectAccessReview

    asyncio.run(main())


def test_a_review_is_cancelled_when_its_caller_hangs_up(server: FakeApiserver) -> None:
    """The review stops (its token-bucket slot is given back by the transport) and its place
    among the reviews in flight is free again."""

    async def main() -> None:
        server.gate = asyncio.Event()
        auth = MetricsAuth(server.request, max_in_flight=1)
        peer = Peer()
        waiting = asyncio.create_task(auth.middleware(mocked("bad-slow", peer), metrics))
        await sent(server, 1)
        assert (await auth.middleware(mocked("bad-other"), metrics)).status == 429
        peer.closing = True
        response = await waiting
        assert response.status == 499 and auth.cancelled == 1
        while server.cancelled == 0:
            await asyncio.sleep(0)
        server.gate.set()
        assert (await auth.middleware(mocked("bad-other"), metrics)).status == 401  # the slot is free

    asyncio.run(main())


def test_a_handler_cancelled_on_disconnect_cancels_the_review(server: FakeApiserver) -> None:
    """A server built with aiohttp's handler_cancellation cancels the handler instead."""

    async def main() -> None:
        server.gate = asyncio.Event()
        auth = MetricsAuth(server.request)
        waiting = asyncio.create_task(auth.middleware(mocked("bad-slow"), metrics))
        await sent(server, 1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        while server.cancelled == 0:
            await asyncio.sleep(0)
        assert auth.cancelled == 1 and auth._in_flight == 0

    asyncio.run(main())


def test_protect_puts_one_route_behind_the_same_checks(server: FakeApiserver) -> None:
    auth = MetricsAuth(server.request)
    protected = auth.protect(metrics)

    async def main() -> tuple[int, int, int]:
        none = await protected(make_mocked_request("GET", "/debug/reconciles"))
        denied = await protected(make_mocked_request("GET", "/debug/reconciles", headers={"Authorization": "Bearer good-no"}))
        allowed = await protected(make_mocked_request("GET", "/debug/reconciles", headers={"Authorization": "Bearer good-ok"}))
        return none.status, denied.status, allowed.status

    assert asyncio.run(main()) == (401, 403, 200)
    assert server.sent[-1][1]["spec"]["nonResourceAttributes"] == {"path": "/debug/reconciles", "verb": "get"}
