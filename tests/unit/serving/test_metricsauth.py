"""declop.serving.metricsauth: 401/403/500/200, what is sent for review, and the decision cache TTLs."""

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
        self.fail = False

    async def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> Any:
        self.sent.append((path, body))
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
    assert all(not isinstance(k, str) for k in auth._tokens._items)


def test_the_cache_is_bounded(server: FakeApiserver) -> None:
    auth = MetricsAuth(server.request, clock=FakeClock(), max_entries=3)
    for i in range(10):
        call(auth, f"Bearer bad-{i}")
    assert len(auth._tokens._items) == 3
