"""Who may read ``/metrics`` (and ``/debug/reconciles``): bearer tokens checked with TokenReview,
access with SubjectAccessReview — controller-runtime's ``filters.WithAuthenticationAndAuthorization``.

- no or malformed ``Authorization: Bearer`` header, or a token the apiserver does not
  authenticate: 401 ``Unauthorized``;
- an authenticated user without ``get`` on the non-resource URL (``/metrics``): 403
  ``Authorization denied for user <name>``;
- the apiserver cannot be asked: 500 (``Authentication failed`` / ``Authorization for user <name>
  failed``) and one log line; never a 200;
- more than ``max_in_flight`` reviews of unknown tokens already waiting: 429 ``Too many
  authentication requests`` with ``Retry-After: 1``, at once, without asking the apiserver.

Anyone who can reach the port chooses how many reviews are asked for, so they are contained:

- the reviews are sent on the transport's ``"auth"`` lane (its own client-side token bucket), never
  on the handlers' lane: a flood of junk tokens cannot delay a reconcile's write;
- at most ``max_in_flight`` reviews of tokens not known to be good wait at a time (past it: 429);
  a token whose last review succeeded is re-checked outside that bound, so a working scraper is
  not locked out by strangers when its cached decision expires;
- concurrent requests with the same token share one review; a review nobody waits for any more
  (every caller hung up) is cancelled, and its token-bucket slot given back;
- decisions are cached as controller-runtime's delegating authenticator/authorizer cache them —
  token reviews 1 minute, allowed 5 minutes, denied 30 seconds — but successes and failures in
  separate caches: authenticated tokens (``max_entries``) and allowed accesses live apart from
  the small, bounded caches of failures (``max_denied``), so junk can only push out other junk,
  never a working scraper's entry. Tokens are cached under their SHA-256, never as text.

The reviews are sent by the manager's own identity, so its RBAC needs ``create`` on
``tokenreviews`` and ``subjectaccessreviews``.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from declop.clock import MONOTONIC, Clock

__all__ = ["MetricsAuth", "UserInfo"]

log = logging.getLogger("declop.metricsauth")

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

#: how often a waiting request checks whether its client hung up (aiohttp cancels handlers on
#: disconnect only when the server is built with ``handler_cancellation``)
_DISCONNECT_POLL = 0.05

def _gone_response() -> web.Response:  # nobody reads it: the connection is closed
    return web.Response(status=499, text="Client closed the request\n")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class UserInfo:
    """The user a TokenReview authenticated."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


class _TTLCache:
    """At most ``max_entries`` values, each until its deadline; the oldest written goes first.
    With ``keep_expired``, an expired entry stays (as a "was good" mark) until pushed out."""

    def __init__(self, max_entries: int, clock: Clock) -> None:
        self._items: collections.OrderedDict[Any, tuple[float, Any]] = collections.OrderedDict()
        self._max, self._clock = max_entries, clock

    def get(self, key: Any) -> tuple[bool, Any]:
        item = self._items.get(key)
        if item is None:
            return False, None
        if item[0] <= self._clock():
            return False, None
        return True, item[1]

    def known(self, key: Any) -> bool:
        """Held, fresh or expired."""
        return key in self._items

    def put(self, key: Any, value: Any, ttl: float) -> None:
        self._items[key] = (self._clock() + ttl, value)
        self._items.move_to_end(key)
        while len(self._items) > self._max:
            self._items.popitem(last=False)

    def discard(self, key: Any) -> None:
        self._items.pop(key, None)

    def __len__(self) -> int:
        return len(self._items)


class TooManyReviews(Exception):
    """More reviews of unknown tokens are waiting than the bound allows (answered with 429)."""


class _Gone(Exception):
    """The caller hung up while its review was waiting."""


class _Shared:
    """One review, awaited by every request that needs it; cancelled once nobody waits."""

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.waiters = 0


class MetricsAuth:
    """The authentication/authorization filter for the metrics server (an aiohttp middleware,
    or :meth:`protect` for one route)."""

    def __init__(
        self,
        request: Callable[..., Awaitable[Any]],
        *,
        token_ttl: float = 60.0,
        allow_ttl: float = 300.0,
        deny_ttl: float = 30.0,
        max_entries: int = 1024,
        max_denied: int = 256,
        max_in_flight: int = 16,
        clock: Clock = MONOTONIC,
        lane: str | None = "auth",
    ) -> None:
        #: ``Transport.request``-like: (method, path, body=..., lane=...) -> decoded answer
        self._request = request
        self._lane = lane
        self._token_ttl, self._allow_ttl, self._deny_ttl = token_ttl, allow_ttl, deny_ttl
        # successes and failures apart: junk tokens fill only the small failure caches
        self._tokens = _TTLCache(max_entries, clock)
        self._bad_tokens = _TTLCache(max_denied, clock)
        self._allowed = _TTLCache(max_entries, clock)
        self._denied = _TTLCache(max_denied, clock)
        self._max_in_flight = max_in_flight
        self._in_flight = 0  # reviews of tokens not known to be good, now waiting
        self._shared: dict[Any, _Shared] = {}
        self.reviews = 0  # TokenReviews + SubjectAccessReviews sent (tests, statistics)
        self.refused = 0  # requests answered 429 because too many reviews were waiting
        self.cancelled = 0  # reviews cancelled because every caller had gone

    # -- the reviews ---------------------------------------------------------------------------
    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        self.reviews += 1
        if self._lane is None:
            return await self._request("POST", path, body=body)
        return await self._request("POST", path, body=body, lane=self._lane)

    async def _review_token(self, token: str) -> UserInfo | None:
        answer = await self._post(
            TOKEN_REVIEWS, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        )
        status = (answer or {}).get("status") or {}
        if not status.get("authenticated"):
            return None
        info = status.get("user") or {}
        return UserInfo(
            username=str(info.get("username") or ""),
            uid=str(info.get("uid") or ""),
            groups=tuple(info.get("groups") or ()),
            extra=tuple(sorted((k, tuple(v)) for k, v in (info.get("extra") or {}).items())),
        )

    async def _review_access(self, user: UserInfo, verb: str, path: str) -> bool:
        spec: dict[str, Any] = {
            "user": user.username,
            "groups": list(user.groups),
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        answer = await self._post(
            ACCESS_REVIEWS, {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        )
        return bool(((answer or {}).get("status") or {}).get("allowed"))

    async def _once(self, key: Any, trusted: bool, start: Callable[[], Awaitable[Any]], gone: Callable[[], bool] | None) -> Any:
        """Await the review for ``key``, shared with concurrent callers. A review of an untrusted
        key counts against the in-flight bound (:class:`TooManyReviews` past it). When ``gone``
        says the caller hung up, stop waiting; the review is cancelled once nobody waits."""
        shared = self._shared.get(key)
        if shared is None:
            if not trusted and self._in_flight >= self._max_in_flight:
                self.refused += 1
                raise TooManyReviews()
            counted = not trusted

            async def run() -> Any:
                try:
                    return await start()
                finally:
                    if counted:
                        self._in_flight -= 1
                    self._shared.pop(key, None)

            if counted:
                self._in_flight += 1
            shared = _Shared(asyncio.get_running_loop().create_task(run(), name="declop metrics review"))
            self._shared[key] = shared
        shared.waiters += 1
        try:
            while True:
                done, _ = await asyncio.wait({shared.task}, timeout=_DISCONNECT_POLL if gone is not None else None)
                if done:
                    return shared.task.result()
                if gone is not None and gone():
                    raise _Gone()
        finally:
            shared.waiters -= 1
            if shared.waiters == 0 and not shared.task.done():
                shared.task.cancel()  # nobody wants the answer: free the lane's slot
                self.cancelled += 1

    # -- the decisions -------------------------------------------------------------------------
    async def authenticate(self, token: str, gone: Callable[[], bool] | None = None) -> UserInfo | None:
        key = hashlib.sha256(token.encode()).digest()
        hit, user = self._tokens.get(key)
        if hit:
            return user  # type: ignore[no-any-return]
        hit, _ = self._bad_tokens.get(key)
        if hit:
            return None
        user = await self._once(("token", key), self._tokens.known(key), lambda: self._review_token(token), gone)
        if user is None:
            self._tokens.discard(key)
            self._bad_tokens.put(key, None, self._token_ttl)
        else:
            self._bad_tokens.discard(key)
            self._tokens.put(key, user, self._token_ttl)
        return user  # type: ignore[no-any-return]

    async def authorize(self, user: UserInfo, verb: str, path: str, gone: Callable[[], bool] | None = None) -> bool:
        key = (user, verb, path)
        hit, _ = self._allowed.get(key)
        if hit:
            return True
        hit, _ = self._denied.get(key)
        if hit:
            return False
        # only authenticated users get here: their reviews are bounded by who holds a token
        allowed = bool(await self._once(("access", key), True, lambda: self._review_access(user, verb, path), gone))
        if allowed:
            self._denied.discard(key)
            self._allowed.put(key, True, self._allow_ttl)
        else:
            self._allowed.discard(key)
            self._denied.put(key, False, self._deny_ttl)
        return allowed

    async def check(self, request: web.Request) -> web.StreamResponse | None:
        """``None`` when the caller may proceed, else the answer to send (401/403/429/500)."""
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return web.Response(status=401, text="Unauthorized\n")

        def gone() -> bool:
            transport = request.transport
            return transport is None or transport.is_closing()

        try:
            user = await self.authenticate(token, gone)
        except TooManyReviews:
            return web.Response(status=429, text="Too many authentication requests\n", headers={"Retry-After": "1"})
        except _Gone:
            return _gone_response()
        except Exception as exc:  # noqa: BLE001 - any failure to ask is a 500, never a 200
            log.error("Authentication failed", extra={"kv": {"error": str(exc)}})
            return web.Response(status=500, text="Authentication failed\n")
        if user is None:
            return web.Response(status=401, text="Unauthorized\n")
        try:
            allowed = await self.authorize(user, request.method.lower(), request.path, gone)
        except _Gone:
            return _gone_response()
        except Exception as exc:  # noqa: BLE001
            log.error("Authorization failed", extra={"kv": {"user": user.username, "error": str(exc)}})
            return web.Response(status=500, text=f"Authorization for user {user.username} failed\n")
        if not allowed:
            log.debug("Authorization denied", extra={"kv": {"user": user.username, "path": request.path}})
            return web.Response(status=403, text=f"Authorization denied for user {user.username}\n")
        return None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refusal = await self.check(request)
        return refusal if refusal is not None else await handler(request)

    def protect(self, handler: Handler) -> Handler:
        """``handler`` behind the same checks, for one route of a server without the middleware."""

        async def protected(request: web.Request) -> web.StreamResponse:
            refusal = await self.check(request)
            return refusal if refusal is not None else await handler(request)

        return protected
