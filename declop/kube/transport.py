"""Transport: raw JSON over HTTP to the apiserver, with client-go's config and auth.

Owns:
- credentials from a :class:`~declop.kube.restconfig.RestConfig` (kubeconfig or in-cluster, see
  :mod:`declop.kube.kubeconfig`): headers and the TLS context are asked for before each request, so
  rotated tokens and exec-plugin certificates are used as soon as they change;
- three ``aiohttp`` sessions on the manager's event loop: requests (kept-alive, pooled), Lease
  traffic (a small pool of its own: a renewal never waits behind handler writes, see
  :attr:`Transport.lease_session`) and watches (a connection per watch, :attr:`Transport.stream_session`);
- client-side token buckets for requests (20 qps, burst 30 each — controller-runtime's defaults),
  one per *lane*, so a handler in a hot loop cannot flood the apiserver and cannot starve anyone
  else: ``"handler"`` (handler writes, finalizers, Events, discovery), ``"informer"`` (lists) and
  ``"leader"`` (Lease traffic: no client-side limit at all; it is one request per retry period)
  and ``"auth"`` (the TokenReviews and SubjectAccessReviews of ``/metrics`` callers: strangers
  choose how many of those are asked for, so they never spend the handlers' budget).
  client-go gives each client its own limiter for the same reason. Watches are long-lived and not
  counted. A wait that is cancelled gives its token back;
- ``request()`` for JSON calls and ``stream()`` for watch lines; 429/503 ``Retry-After`` honoured;
- request counters by verb, used by tests and benchmarks to prove "no reads on the hot path";
- the write fence of a reconcile call (:mod:`declop.kube.fencing`): a request other than a GET
  made for a call whose Lease is not known valid raises :class:`~declop.errors.Fenced` instead
  of being sent — checked before every attempt (after the rate-limit wait, after a retry's), and
  again once it holds its connection (:class:`~declop.kube.fencing.FencedConnector`: a write can
  wait in the pool, behind lists, or for a handshake, long after its first check); a refused
  request is not counted.

Invariants:
- no model object is ever built: bodies are decoded to plain dicts/lists (orjson when installed);
- the Authorization header is computed per request (:meth:`RestConfig.headers`), so a
  rotated projected token is picked up without a restart;
- a non-2xx answer raises an :class:`~declop.errors.ApiError` subclass carrying the Status message;
  a connection failure raises ``ApiError(status=0, reason="Unreachable")``, a failed TLS
  verification ``ApiError(0, "TLSVerification")`` naming the verification error;
- a watch stream that had begun and then ended abnormally raises :class:`StreamIdle` (silence) or
  :class:`StreamInterrupted` (cut), never "Unreachable": a working watch that ends is not a failure.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Mapping

import aiohttp

from declop.errors import ApiError, Conflict, Fenced, Forbidden, NotFound
from declop.kube.fencing import FencedConnector, current
from declop.kube.kubeconfig import RestConfig, from_kubernetes
from declop.kube.kubeconfig import load as load_kubeconfig
from declop.kube.proxy import redact_text
from declop.queue.ratelimit import TokenBucket

try:  # optional speed-up: declop[fast]
    import orjson

    def loads(data: bytes | str) -> Any:
        return orjson.loads(data)

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

except ImportError:  # pragma: no cover - exercised when orjson is absent

    def loads(data: bytes | str) -> Any:
        return json.loads(data)

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


__all__ = [
    "LANES",
    "StreamIdle",
    "StreamInterrupted",
    "Transport",
    "TransportStatistics",
    "dumps",
    "load_configuration",
    "loads",
    "rbac_resource",
]

#: connections of the ``"leader"`` lane's own pool (a few Leases, one request each per retry period)
LEASE_CONNECTIONS = 4
#: client-side rate-limit lanes of :meth:`Transport.request`
LANES = ("handler", "informer", "leader", "auth")

#: the ``"auth"`` lane's client-side limit (TokenReview/SubjectAccessReview for callers of /metrics)
AUTH_QPS, AUTH_BURST = 10.0, 20

#: a watch stream read in bulk (``stream(bulk=...)``): after a read of fewer than ``BULK_READ`` bytes
#: the connection is not read for ``BULK_PAUSE`` seconds, so the next read takes what arrived
#: meanwhile — a few hundred KiB per read instead of one event per read (far fewer reads and
#: less CPU for a streaming list; bench/FINDINGS.md)
BULK_PAUSE, BULK_READ = 0.002, 128 * 1024

#: content types accepted by ``patch``
PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}


def load_configuration(
    kubeconfig: str | None = None,
    context: str | None = None,
    *,
    in_cluster: bool | None = None,
    service_account_dir: str | None = None,
) -> RestConfig:
    """The apiserver and credentials, found as kubectl/client-go find them (kubeconfig.load)."""
    return load_kubeconfig(kubeconfig, context, in_cluster=in_cluster, service_account_dir=service_account_dir)


@dataclass(frozen=True, slots=True)
class TransportStatistics:
    """Requests sent so far, by verb (get, list, watch, create, update, patch, delete) and by
    ``(apiGroup, resource[/subresource], verb)`` — what an RBAC rule must allow (non-resource
    paths such as discovery are left out of ``by_resource``)."""

    by_verb: Mapping[str, int]
    by_resource: Mapping[tuple[str, str, str], int] = dataclasses.field(default_factory=dict)

    @property
    def reads(self) -> int:
        return self.by_verb.get("get", 0) + self.by_verb.get("list", 0)

    @property
    def writes(self) -> int:
        return sum(self.by_verb.get(v, 0) for v in ("create", "update", "patch", "delete"))


def _verb(method: str, path: str, params: Mapping[str, Any] | None) -> str:
    if method == "GET":
        if params and params.get("watch") in ("1", "true", 1, True):
            return "watch"
        # .../namespaces/{ns}/{plural}/{name} has an odd number of segments after the version
        return "list" if _is_collection(path) else "get"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, method)


def rbac_resource(path: str) -> tuple[str, str] | None:
    """``(apiGroup, resource[/subresource])`` of an API path, as RBAC names it; None for
    non-resource paths (``/api``, ``/apis/g/v``, ``/version``)."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if rest[:1] == ["namespaces"] and len(rest) >= 3 and not (len(rest) == 3 and rest[2] in ("status", "finalize")):
        rest = rest[2:]  # namespaces/{ns}/{resource}/… (not namespaces/{name}/status|finalize)
    resource = rest[0]
    if len(rest) >= 3:
        resource = f"{resource}/{rest[2]}"
    return group, resource


def _is_collection(path: str) -> bool:
    parts = [p for p in path.split("?")[0].split("/") if p]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
        rest = rest[2:]
    return len(rest) == 1


class Transport:
    """JSON requests and watch streams to one apiserver. Create and close it on the loop it serves."""

    def __init__(
        self,
        configuration: Any,
        *,
        user_agent: str = "declop",
        max_connections: int = 100,
        retries: int = 5,
        qps: float = 20.0,
        burst: int = 30,
    ) -> None:
        self.configuration: RestConfig = from_kubernetes(configuration)
        self.host = self.configuration.host
        self.user_agent = user_agent
        self._retries = retries
        self._max_connections = max_connections
        #: "request" (pooled), "stream" (a connection per watch), "leader" (Lease traffic's own pool)
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self._counts: collections.Counter[str] = collections.Counter()
        self._by_resource: collections.Counter[tuple[str, str, str]] = collections.Counter()
        #: one bucket per lane; ``None`` means unlimited (see :data:`LANES`)
        self._buckets: dict[str, TokenBucket | None] = {
            "handler": TokenBucket(qps, burst),
            "informer": TokenBucket(qps, burst),
            "leader": None,
            # reviews of callers of the operator's own servers: their own budget, whatever the
            # handlers' qps, so a flood of unknown tokens never delays a reconcile's write
            "auth": TokenBucket(AUTH_QPS, AUTH_BURST),
        }
        #: called with (method, status) after every answered request (metrics)
        self.observer: Callable[[str, int], None] | None = None

    async def _connection(self) -> dict[str, Any]:
        """Per-request connection arguments: TLS context, tls-server-name, proxy."""
        cfg = self.configuration
        ctx = await cfg.ssl_context()
        kw: dict[str, Any] = {"ssl": ctx if ctx is not None else False}
        if cfg.server_name and ctx is not None:
            kw["server_hostname"] = cfg.server_name
        if cfg.proxy:
            kw["proxy"] = cfg.proxy
        return kw

    def _connect_error(self, exc: BaseException, what: str) -> ApiError:
        """A failure before any answer: TLS verification named as such, else Unreachable. A proxy
        URL's password never appears in the message (aiohttp's errors may quote the URL)."""
        error = self._connect_error_unredacted(exc, what)
        proxy = self.configuration.proxy
        if proxy and error.message:
            error = ApiError(error.status, error.reason, redact_text(error.message, proxy), error.body)
        return error

    def _connect_error_unredacted(self, exc: BaseException, what: str) -> ApiError:
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            cert_error = exc.certificate_error
            reason = getattr(cert_error, "verify_message", None) or str(cert_error)
            return ApiError(
                0, "TLSVerification",
                f"TLS verification of the apiserver at {self.host} failed: {reason}; check the "
                f"certificate authority and tls-server-name of {self.configuration.source or 'the kubeconfig'}",
            )
        if isinstance(exc, aiohttp.ClientSSLError):
            return ApiError(0, "TLSHandshake", f"TLS handshake with the apiserver at {self.host} failed: {exc}")
        if isinstance(exc, (aiohttp.ClientProxyConnectionError, aiohttp.ClientHttpProxyError)):
            return ApiError(0, "Unreachable", f"cannot reach the apiserver at {self.host} through the proxy {self.configuration.proxy_display}: {exc}")
        return ApiError(0, "Unreachable", f"{what}: {exc}")

    def _pool(self, kind: str) -> aiohttp.ClientSession:
        if (session := self._sessions.get(kind)) is None or session.closed:
            session = self._sessions[kind] = self._new_session(kind)
        return session

    @property
    def session(self) -> aiohttp.ClientSession:
        """The session of :meth:`request`: kept-alive connections, reused."""
        return self._pool("request")

    @property
    def lease_session(self) -> aiohttp.ClientSession:
        """The ``"leader"`` lane's own small pool: a renewal never waits for a connection behind
        ``max_connections`` handler writes and lists (and loses its Lease for no reason)."""
        return self._pool("leader")

    @property
    def stream_session(self) -> aiohttp.ClientSession:
        """The session of :meth:`stream`: every watch opens its own connection and closes it.

        A watch is re-opened at once after its connection is cut, exactly when a shared pool's
        kept-alive connections were cut too, unseen yet: a re-watch drawn from it would fail and
        back off. A watch lives for minutes: one handshake per watch, nothing per event."""
        return self._pool("stream")

    def _new_session(self, kind: str) -> aiohttp.ClientSession:
        # the request session's pool checks a fenced write again once it has a connection
        pool = FencedConnector if kind == "request" else aiohttp.TCPConnector
        connector = pool(limit=LEASE_CONNECTIONS if kind == "leader" else self._max_connections, force_close=kind == "stream")
        return aiohttp.ClientSession(
            # no Accept-Encoding: the apiserver would gzip every large LIST page, costing CPU
            # on both sides for no gain on loopback and in-cluster networks
            connector=connector, auto_decompress=True, skip_auto_headers=("User-Agent", "Accept-Encoding")
        )

    async def close(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await session.close()

    def statistics(self) -> TransportStatistics:
        return TransportStatistics(by_verb=dict(self._counts), by_resource=dict(self._by_resource))

    def _count(self, method: str, path: str, params: Mapping[str, Any] | None, n: int = 1) -> None:
        verb = _verb(method, path, params)
        self._counts[verb] += n
        resource = rbac_resource(path)
        if resource is not None:
            self._by_resource[(*resource, verb)] += n
        if n < 0:  # a refused request taken back: no zero entries left behind
            self._counts += collections.Counter()
            self._by_resource += collections.Counter()

    async def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": self.user_agent}
        if content_type:
            headers["Content-Type"] = content_type
        headers.update(await self.configuration.headers())
        return headers

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
        accept: str | None = None,
        timeout: float = 30.0,
        lane: str = "handler",
    ) -> Any:
        """Send one request and return the decoded JSON body (``None`` when empty).

        ``lane`` picks the client-side rate limit the request waits on (``"handler"``,
        ``"informer"``, ``"leader"`` or ``"auth"``); lanes never wait behind each other.
        """
        data = None if body is None else (body if isinstance(body, bytes) else dumps(body))
        if data is not None and content_type is None:
            content_type = "application/json"
        fence = current() if method != "GET" else None  # a write of a reconcile call under a Lease
        bucket = self._buckets[lane]
        if bucket is not None:
            delay = bucket.when(None)
            if delay > 0:
                try:
                    await asyncio.sleep(delay)
                except asyncio.CancelledError:
                    bucket.refund()  # the request will never be sent: free its slot
                    raise
        url = self.host + path
        reauthorized = False
        for attempt in range(self._retries + 1):
            headers, epoch = await self._headers(content_type), self.configuration.epoch  # (after a login it asked for)
            if fence is not None:
                fence.check(method, path)  # after every wait; FencedConnector checks once more
            if not attempt:
                self._count(method, path, params)
            if accept:
                headers["Accept"] = accept
            try:
                async with (self.session if lane != "leader" else self.lease_session).request(
                    method,
                    url,
                    params=_query(params),
                    data=data,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=timeout),
                    **(await self._connection()),
                ) as resp:
                    payload = await resp.read()
                    if self.observer is not None:
                        self.observer(method, resp.status)
                    if resp.status < 300:
                        return loads(payload) if payload else None
                    if resp.status == 401 and not reauthorized and self.configuration.unauthorized(epoch):
                        reauthorized = True  # an exec credential was revoked early: fetch a new one
                        continue
                    if resp.status in (429, 503) and attempt < self._retries:
                        await asyncio.sleep(_retry_after(resp.headers.get("Retry-After"), attempt))
                        continue
                    raise error_from(resp.status, resp.reason or "", payload, method, path)
            except Fenced:  # refused by FencedConnector after a wait for a connection: not sent
                if not attempt:
                    self._count(method, path, params, -1)
                raise
            except aiohttp.ClientConnectionError as exc:
                raise self._connect_error(exc, f"cannot reach the apiserver at {self.host}") from exc
            except asyncio.TimeoutError as exc:
                raise ApiError(0, "Timeout", f"{method} {path} timed out after {timeout} s") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def stream(
        self,
        path: str,
        params: Mapping[str, Any],
        *,
        read_timeout: float = 90.0,
        total_timeout: float | None = None,
        accept: str | None = None,
        bulk: Callable[[], bool] | None = None,
    ) -> AsyncIterator[bytes]:
        """Yield the body of a streaming GET (a watch) line by line, without decoding.

        ``bulk``, asked after each read's lines have been consumed: while it answers true (a
        streaming list's initial events: throughput, not latency), a read smaller than
        :data:`BULK_READ` is followed by :data:`BULK_PAUSE` seconds without reading, so the next
        read takes what arrived meanwhile. Lines are whole and in order either way; once it
        answers false (the watch proper) every read is handed on at once.

        How it ends tells the caller what happened (the informer re-watches at once after the
        first two and backs off only after the last two):

        - the server closed it normally (its ``timeoutSeconds`` elapsed): the iteration stops;
        - silence for ``read_timeout`` once the response has begun (an idle watch, or a half-open
          connection), or ``total_timeout`` elapsed: :class:`StreamIdle`;
        - the connection broke after the response had begun (reset, EOF mid-chunk):
          :class:`StreamInterrupted`;
        - the request itself failed (refused, TLS, no response headers within ``read_timeout``):
          ``ApiError(0, "Unreachable")``; a non-2xx answer: the :func:`error_from` error.
        """
        self._count("GET", path, params)
        started = False
        headers, epoch = await self._headers(None), self.configuration.epoch
        if accept:
            headers["Accept"] = accept
        try:
            async with self.stream_session.get(
                self.host + path,
                params=_query(params),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=total_timeout, sock_connect=10, sock_read=read_timeout),
                **(await self._connection()),
            ) as resp:
                if resp.status >= 300:
                    error = error_from(resp.status, resp.reason or "", await resp.read(), "WATCH", path)
                    if resp.status == 401:
                        self.configuration.unauthorized(epoch)  # the next watch gets a new exec credential
                    if resp.status in (429, 503) and resp.headers.get("Retry-After"):
                        error.retry_after = _retry_after(resp.headers.get("Retry-After"), 0)
                    raise error
                started = True
                buffer = b""
                connection = resp.connection
                pausable = connection.transport if bulk is not None and connection is not None else None
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    if b"\n" in chunk:
                        *lines, buffer = buffer.split(b"\n")
                        for line in lines:
                            if line:
                                yield line
                    if pausable is not None and len(chunk) < BULK_READ and bulk is not None and bulk():
                        pausable.pause_reading()
                        try:
                            await asyncio.sleep(BULK_PAUSE)
                        finally:
                            pausable.resume_reading()
                if buffer.strip():
                    yield buffer
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError) as exc:
            # aiohttp's read timeout is a ClientConnectionError *and* a TimeoutError: test it first
            if started:
                raise StreamIdle(0, "Idle", f"watch {path}: no data for {read_timeout} s") from exc
            raise ApiError(0, "Unreachable", f"watch {path}: no response within {read_timeout} s") from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            if started:
                raise StreamInterrupted(
                    0, "Interrupted", redact_text(f"watch {path}: connection lost: {exc}", self.configuration.proxy)
                ) from exc
            raise self._connect_error(exc, f"watch {path}") from exc


class StreamIdle(ApiError):
    """A watch stream that had begun went silent for the read timeout (or hit its total timeout).
    Normal for quiet resources without bookmarks; also how a half-open connection ends."""


class StreamInterrupted(ApiError):
    """A watch stream that had begun was cut (connection reset, EOF mid-chunk)."""


def _query(params: Mapping[str, Any] | None) -> dict[str, str] | None:
    if not params:
        return None
    out = {}
    for k, v in params.items():
        if v is None:
            continue
        out[k] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return out


def _retry_after(value: str | None, attempt: int) -> float:
    try:
        seconds: float = float(value or 0)
        return min(max(seconds, 0.1), 30.0)
    except ValueError:
        return min(0.2 * 2.0**attempt, 30.0)


def error_from(status: int, reason: str, payload: bytes, method: str, path: str) -> ApiError:
    """The ApiError subclass for an HTTP status, with the apiserver's Status message."""
    body: Any = None
    message = ""
    try:
        body = loads(payload) if payload else None
        if isinstance(body, dict):
            message = body.get("message") or ""
    except ValueError:
        message = payload[:200].decode(errors="replace")
    message = message or f"{method} {path}: {status} {reason}"
    if status == 404:
        return NotFound(message, body)
    if status == 409:
        return Conflict(message, body)
    if status == 403:
        return Forbidden(message, body)
    return ApiError(status, reason, message, body)
