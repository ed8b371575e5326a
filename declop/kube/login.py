"""Login: credentials from a function of the user's (``@declop.on_login``) instead of a kubeconfig.

Kopf's ``@kopf.on.login``: the function returns a :class:`ConnectionInfo` (or a mapping with its
field names) — the server, a token or a client certificate and key, the CA — and declop talks to
the apiserver with that. :class:`LoginConfig` is the :class:`~declop.kube.restconfig.RestConfig`
the transport asks before each request.

When the function is called (exactly):

1. **once at start**, before the first request of the operator (discovery), from the manager's
   loop: an ``async def`` on the loop, a plain one in a worker thread — when the manager is
   given no configuration (``declop run`` and :class:`~declop.manager.Operator` give none when
   a login function is registered; a configuration given explicitly wins: ``declop dev`` runs
   against its own control plane). No kubeconfig is read;
   if it raises, or returns None, the start fails with one line naming it;
2. **before the first request made at or after its refresh time**, when the last answer had an
   ``expiration``: the refresh time is a fifth of the remaining lifetime (at most a minute)
   before it — the rule of kubeconfig exec plugins (:mod:`declop.kube.credentials`);
3. **after a 401**: the answer is dropped, and the request that got the 401 is sent once more
   with the next answer (the transport retries a request once after a 401; a second 401 is
   the request's error, and the next request asks the function again).

One call at a time: requests that need credentials meanwhile wait for that call's answer.
A call after the start that raises fails the request that waited for it (an ``ApiError`` naming
the function, retried like any failed request); the next request asks again. The server is read
from the first answer only (the transport is built for it): a later answer naming another server
is logged, and its credentials are used with the first server.

Invariants: no credential is written to a file or shown in a repr (as every RestConfig).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Awaitable, Callable

from declop.errors import ApiError
from declop.kube.restconfig import RestConfig

__all__ = ["ConnectionInfo", "LoginConfig"]

log = logging.getLogger("declop.login")


@dataclass(frozen=True)
class ConnectionInfo:
    """What a login function returns (a mapping with these keys does too).

    ``server``: the apiserver's URL. ``token``, or ``cert_data`` and ``key_data`` (PEM): who we
    are. ``ca_data`` (PEM): whom to trust (None: the system's roots); ``insecure``: trust anyone.
    ``expiration``: when the credentials stop working (an aware ``datetime`` or Unix seconds;
    None: until a 401)."""

    server: str
    token: str | None = field(default=None, repr=False)
    cert_data: bytes | str | None = field(default=None, repr=False)
    key_data: bytes | str | None = field(default=None, repr=False)
    ca_data: bytes | str | None = None
    insecure: bool = False
    expiration: datetime.datetime | float | None = None


def _bytes(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def connection_info(value: Any, name: str) -> ConnectionInfo:
    """``value`` as a :class:`ConnectionInfo`, or ValueError saying what is wrong with it."""
    if value is None:
        raise ValueError(f"login function {name!r} returned None: no credentials to connect with")
    if isinstance(value, Mapping):
        known = {f.name for f in fields(ConnectionInfo)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"login function {name!r} returned unknown keys {unknown}; the keys are {sorted(known)}")
        try:
            value = ConnectionInfo(**value)
        except TypeError as exc:
            raise ValueError(f"login function {name!r} returned no 'server'") from exc
    if not isinstance(value, ConnectionInfo):
        raise ValueError(f"login function {name!r} returned a {type(value).__name__}, not a ConnectionInfo or a mapping")
    if not isinstance(value.server, str) or not value.server.startswith(("https://", "http://")):
        raise ValueError(f"login function {name!r} returned server={value.server!r}; give the apiserver's https:// URL")
    if not value.token and not (value.cert_data and value.key_data):
        raise ValueError(f"login function {name!r} returned neither a token nor a client certificate and key")
    return value


def refresh_at(expiration: datetime.datetime | float | None) -> float:
    """The monotonic time to ask again: a fifth of the remaining lifetime (at most a minute)
    before ``expiration``; never without one."""
    if expiration is None:
        return float("inf")
    at = expiration.timestamp() if isinstance(expiration, datetime.datetime) else float(expiration)
    left = at - time.time()
    return time.monotonic() + left - min(60.0, max(left, 0.0) / 5)


@dataclass(eq=False, repr=False)
class LoginConfig(RestConfig):
    """A RestConfig whose credentials come from ``login`` (see the module docstring)."""

    login: Callable[[], Awaitable[Any]] | None = field(default=None, repr=False)
    login_name: str = ""
    #: calls of the login function so far
    logins: int = 0
    _due: float = field(default=float("inf"), repr=False)
    _lock: asyncio.Lock | None = field(default=None, repr=False)

    @classmethod
    async def first(cls, login: Callable[[], Awaitable[Any]], name: str) -> LoginConfig:
        """Call ``login`` for the first time and build the configuration from its answer; a
        function that raises or returns what is not a ConnectionInfo raises here."""
        info = connection_info(await login(), name)
        cfg = cls(host=info.server.rstrip("/"), source=f"login function {name!r}", login=login, login_name=name)
        cfg.logins = 1
        cfg._apply(info)
        return cfg

    def _apply(self, info: ConnectionInfo) -> None:
        if info.server.rstrip("/") != self.host:
            log.warning("The login function named another server; the first one is kept", extra={"kv": {"login": self.login_name, "server": self.host}})
        self.token = info.token or None
        self.cert_data, self.key_data = _bytes(info.cert_data), _bytes(info.key_data)
        self.ca_data, self.insecure = _bytes(info.ca_data), bool(info.insecure)
        self._ssl = None  # rebuilt with the new CA and certificate
        self._due = refresh_at(info.expiration)

    async def _current(self) -> None:
        if time.monotonic() < self._due:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # one call at a time; the others take its answer
            if time.monotonic() < self._due:
                return
            assert self.login is not None
            self.logins += 1
            try:
                info = connection_info(await self.login(), self.login_name)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.error("Login failed", exc_info=True, extra={"kv": {"login": self.login_name}})
                raise ApiError(0, "Credentials", f"login function {self.login_name!r} failed: {type(exc).__name__}") from exc
            self._apply(info)

    async def headers(self) -> dict[str, str]:
        await self._current()
        return await super().headers()

    async def ssl_context(self) -> Any:
        await self._current()
        return await super().ssl_context()

    @property
    def epoch(self) -> int:
        return self.logins

    def unauthorized(self, epoch: int | None = None) -> bool:
        """A 401: the next request asks the login function again — unless the request was sent
        with credentials an earlier 401 already replaced (``epoch``: several requests in flight
        with one refused credential ask for one login, not one each); True: retry the request."""
        if epoch is None or epoch == self.logins:
            self._due = 0.0
        return True

    def explain_401(self) -> str:
        return (
            f"the apiserver at {self.host} rejected the credentials returned by {self.source} (401), "
            "also when asked again; return valid ones"
        )

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", login={self.login_name!r})"
