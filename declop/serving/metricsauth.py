"""Who may read ``/metrics``: bearer tokens checked with TokenReview, access with
SubjectAccessReview — controller-runtime's ``filters.WithAuthenticationAndAuthorization``.

- no or malformed ``Authorization: Bearer`` header, or a token the apiserver does not
  authenticate: 401 ``Unauthorized``;
- an authenticated user without ``get`` on the non-resource URL (``/metrics``): 403
  ``Authorization denied for user <name>``;
- the apiserver cannot be asked: 500 (``Authentication failed`` / ``Authorization for user <name>
  failed``) and one log line; never a 200.

Decisions are cached as controller-runtime's delegating authenticator/authorizer cache them:
token reviews 1 minute (success and failure), allowed 5 minutes, denied 30 seconds; at most
``max_entries`` each, oldest first out. Tokens are cached under their SHA-256, never as text.
The reviews are sent by the manager's own identity, so its RBAC needs ``create`` on
``tokenreviews`` and ``subjectaccessreviews``.
"""

from __future__ import annotations

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


@dataclass(frozen=True, slots=True)
class UserInfo:
    """The user a TokenReview authenticated."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


class _TTLCache:
    def __init__(self, max_entries: int, clock: Clock) -> None:
        self._items: collections.OrderedDict[Any, tuple[float, Any]] = collections.OrderedDict()
        self._max, self._clock = max_entries, clock

    def get(self, key: Any) -> tuple[bool, Any]:
        item = self._items.get(key)
        if item is None:
            return False, None
        if item[0] <= self._clock():
            del self._items[key]
            return False, None
        return True, item[1]

    def put(self, key: Any, value: Any, ttl: float) -> None:
        self._items[key] = (self._clock() + ttl, value)
        self._items.move_to_end(key)
        while len(self._items) > self._max:
            self._items.popitem(last=False)


class MetricsAuth:
    """The authentication/authorization filter for the metrics server (an aiohttp middleware)."""

    def __init__(
        self,
        request: Callable[..., Awaitable[Any]],
        *,
        token_ttl: float = 60.0,
        allow_ttl: float = 300.0,
        deny_ttl: float = 30.0,
        max_entries: int = 1024,
        clock: Clock = MONOTONIC,
    ) -> None:
        #: ``Transport.request``-like: (method, path, body=...) -> decoded answer
        self._request = request
        self._token_ttl, self._allow_ttl, self._deny_ttl = token_ttl, allow_ttl, deny_ttl
        self._tokens = _TTLCache(max_entries, clock)
        self._access = _TTLCache(max_entries, clock)
        self.reviews = 0  # TokenReviews + SubjectAccessReviews sent (tests, statistics)

    async def authenticate(self, token: str) -> UserInfo | None:
        key = hashlib.sha256(token.encode()).digest()
        hit, cached = self._tokens.get(key)
        if hit:
            return cached if isinstance(cached, UserInfo) else None
        self.reviews += 1
        answer = await self._request(
            "POST", TOKEN_REVIEWS, body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        )
        status = (answer or {}).get("status") or {}
        user: UserInfo | None = None
        if status.get("authenticated"):
            info = status.get("user") or {}
            user = UserInfo(
                username=str(info.get("username") or ""),
                uid=str(info.get("uid") or ""),
                groups=tuple(info.get("groups") or ()),
                extra=tuple(sorted((k, tuple(v)) for k, v in (info.get("extra") or {}).items())),
            )
        self._tokens.put(key, user, self._token_ttl)
        return user

    async def authorize(self, user: UserInfo, verb: str, path: str) -> bool:
        key = (user, verb, path)
        hit, allowed = self._access.get(key)
        if hit:
            return bool(allowed)
        self.reviews += 1
        spec: dict[str, Any] = {
            "user": user.username,
            "groups": list(user.groups),
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        answer = await self._request(
            "POST", ACCESS_REVIEWS,
            body={"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec},
        )
        allowed = bool(((answer or {}).get("status") or {}).get("allowed"))
        self._access.put(key, allowed, self._allow_ttl if allowed else self._deny_ttl)
        return allowed

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return web.Response(status=401, text="Unauthorized\n")
        try:
            user = await self.authenticate(token)
        except Exception as exc:  # noqa: BLE001 - any failure to ask is a 500, never a 200
            log.error("Authentication failed", extra={"kv": {"error": str(exc)}})
            return web.Response(status=500, text="Authentication failed\n")
        if user is None:
            return web.Response(status=401, text="Unauthorized\n")
        try:
            allowed = await self.authorize(user, request.method.lower(), request.path)
        except Exception as exc:  # noqa: BLE001
            log.error("Authorization failed", extra={"kv": {"user": user.username, "error": str(exc)}})
            return web.Response(status=500, text=f"Authorization for user {user.username} failed\n")
        if not allowed:
            log.debug("Authorization denied", extra={"kv": {"user": user.username, "path": request.path}})
            return web.Response(status=403, text=f"Authorization denied for user {user.username}\n")
        return await handler(request)
