"""Probes: ``/healthz`` and ``/readyz`` over plain HTTP, ``/metrics`` over HTTPS with
authentication and authorization by default (aiohttp on the manager's loop).

- ``/healthz`` answers 200 ``ok`` while the event loop runs (the answer itself proves it).
- ``/readyz`` answers 200 once every check the manager supplies passes — every controller passed
  its cache-sync gate, and Lease requests are not refused (401/403) — 503 before; it does not
  depend on leadership (a standby is ready). ``?verbose`` lists each check as ``[+]name ok`` /
  ``[-]name failed``, like the apiserver — never the reason: probes are unauthenticated, and
  the reasons (Forbidden messages naming the ServiceAccount…) are in the logs.
- ``/probes`` (only when a ``probes`` source is given: ``@declop.on_probe`` functions are
  registered) serves their values as JSON, ``{"probes": {name: value}, "failed": [name]}``, 503
  when one failed (:mod:`declop.handlers.probing`: cached, bounded, never an error's text).
- ``/metrics`` serves the Prometheus text format; with ``metrics_tls`` over HTTPS, and with
  ``metrics_auth`` (:class:`~declop.serving.metricsauth.MetricsAuth`) only to callers allowed ``get``.
- ``/debug/reconciles`` (only when a ``reconciles`` source is given: off by default) serves the
  last reconciles per controller as JSON — key, trigger, duration, outcome; names and counts,
  never object contents — on the health port, behind the same checks as ``/metrics``
  (``metrics_auth``: a bearer token allowed ``get`` on ``/debug/reconciles``) whenever they are
  given; without them (``--metrics-secure=false``) it is open like the probes.

Health and plain-HTTP metrics may share a port; secure metrics need their own. A port of
``None`` or ``0`` disables it. Every port is served with :data:`PROBE_LIMITS`
(:func:`declop.serving.http.serve`: body size, header/body/idle timeouts, connection and
in-flight caps).
"""

from __future__ import annotations

import logging
import ssl
from typing import Any, Awaitable, Callable, Iterable

from aiohttp import web

from declop.errors import ConfigError
from declop.serving.http import Guard, Limits, Serving, serve

__all__ = ["Check", "PROBE_LIMITS", "ProbeServer"]

log = logging.getLogger("declop.probes")

#: probes and metrics are GETs without a body: 64 KiB, headers in 10 s, idle 90 s (a one-minute
#: scrape interval reuses its connection), 128 connections, 32 requests at once
PROBE_LIMITS = Limits(max_body=64 * 1024, header_timeout=10.0, body_timeout=10.0, idle_timeout=90.0, max_connections=64, max_in_flight=32)

#: a named readiness check: returns "" when fine, else the reason it fails
Check = tuple[str, Callable[[], str]]


class ProbeServer:
    """Serves health, readiness and metrics on one or two ports."""

    def __init__(
        self,
        *,
        health_port: int | None,
        metrics_port: int | None,
        checks: Callable[[], Iterable[Check]],
        metrics: Callable[[], bytes] | None = None,
        host: str = "0.0.0.0",
        metrics_tls: ssl.SSLContext | None = None,
        metrics_auth: Any = None,
        reconciles: Callable[[], Any] | None = None,
        probes: Callable[[], Awaitable[tuple[dict[str, Any], list[str]]]] | None = None,
    ) -> None:
        self.health_port, self.metrics_port = health_port or None, metrics_port or None
        if self.metrics_port and self.metrics_port == self.health_port and (metrics_tls or metrics_auth):
            raise ConfigError(
                f"secure metrics need their own port: --metrics-port and --health-port are both {self.metrics_port}; "
                "pick two ports, or pass --metrics-secure=false"
            )
        self.metrics_tls = metrics_tls
        self.metrics_auth = metrics_auth
        self.checks = checks
        self.metrics = metrics
        self.reconciles = reconciles
        self.probes = probes
        self.host = host
        self._runners: list[Serving] = []

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _readyz(self, request: web.Request) -> web.Response:
        results = [(name, check()) for name, check in self.checks()]
        failed = [r for r in results if r[1]]
        if "verbose" in request.query:
            lines = [f"[-]{n} failed" if why else f"[+]{n} ok" for n, why in results]
            lines.append("readyz check failed" if failed else "readyz check passed")
            return web.Response(text="\n".join(lines) + "\n", status=503 if failed else 200)
        if failed:
            return web.Response(text="not ready: " + ", ".join(n for n, _ in failed), status=503)
        return web.Response(text="ok")

    async def _probes(self, request: web.Request) -> web.Response:
        assert self.probes is not None
        values, failed = await self.probes()
        body = {"probes": values, "failed": failed}
        return web.json_response(body, status=503 if failed else 200, headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"})

    async def _metrics(self, request: web.Request) -> web.Response:
        body = self.metrics() if self.metrics is not None else b""
        return web.Response(body=body, content_type="text/plain", charset="utf-8", headers={"X-Content-Type-Options": "nosniff"})

    async def _debug_reconciles(self, request: web.Request) -> web.Response:
        assert self.reconciles is not None
        return web.json_response(self.reconciles(), headers={"X-Content-Type-Options": "nosniff"})

    async def start(self) -> None:
        ports: dict[int, list[tuple[str, Callable[[web.Request], object]]]] = {}
        if self.health_port:
            ports.setdefault(self.health_port, []).extend([("/healthz", self._healthz), ("/readyz", self._readyz)])
            if self.probes is not None:
                ports[self.health_port].append(("/probes", self._probes))
            if self.reconciles is not None:
                # object keys and outcomes are not for anyone who reaches the port: the same
                # TokenReview + SubjectAccessReview as /metrics, on this route only
                debug = self._debug_reconciles if self.metrics_auth is None else self.metrics_auth.protect(self._debug_reconciles)
                ports[self.health_port].append(("/debug/reconciles", debug))
        if self.metrics_port:
            ports.setdefault(self.metrics_port, []).append(("/metrics", self._metrics))
        for port, routes in ports.items():
            secure = port == self.metrics_port and port != self.health_port
            middlewares = [self.metrics_auth.middleware] if secure and self.metrics_auth is not None else []
            guard = Guard(PROBE_LIMITS)
            app = guard.application(middlewares)
            for path, handler in routes:
                app.router.add_get(path, handler)  # type: ignore[arg-type]
            try:
                serving = await serve(app, guard, self.host, port, self.metrics_tls if secure else None)
            except OSError as exc:
                raise ConfigError(f"cannot serve probes on port {port}: {exc.strerror or exc}; pick another port") from exc
            self._runners.append(serving)
            scheme = "https" if secure and self.metrics_tls is not None else "http"
            if middlewares:
                auth = "TokenReview+SubjectAccessReview"
            elif self.metrics_auth is not None and any(path == "/debug/reconciles" for path, _ in routes):
                auth = "TokenReview+SubjectAccessReview on /debug/reconciles, none on the probes"
            else:
                auth = "none"
            log.info("Serving probes", extra={"kv": {"port": port, "scheme": scheme, "authentication": auth, "paths": [p for p, _ in routes]}})

    async def stop(self) -> None:
        for serving in self._runners:
            await serving.stop()
        self._runners = []
