"""Probes: ``/healthz`` and ``/readyz`` over plain HTTP, ``/metrics`` over HTTPS with
authentication and authorization by default (aiohttp on the manager's loop).

- ``/healthz`` answers 200 ``ok`` while the event loop runs (the answer itself proves it).
- ``/readyz`` answers 200 once every check the manager supplies passes — every controller passed
  its cache-sync gate, and Lease requests are not refused (401/403) — 503 before; it does not
  depend on leadership (a standby is ready). ``?verbose`` lists each check as ``[+]name ok`` /
  ``[-]name failed``, like the apiserver — never the reason: probes are unauthenticated, and
  the reasons (Forbidden messages naming the ServiceAccount…) are in the logs.
- ``/metrics`` serves the Prometheus text format; with ``metrics_tls`` over HTTPS, and with
  ``metrics_auth`` (:class:`~declop.serving.metricsauth.MetricsAuth`) only to callers allowed ``get``.
- ``/debug/reconciles`` (only when a ``reconciles`` source is given: off by default) serves the
  last reconciles per controller as JSON — key, trigger, duration, outcome; names and counts,
  never object contents — on the health port, behind the same checks as ``/metrics``
  (``metrics_auth``: a bearer token allowed ``get`` on ``/debug/reconciles``) whenever they are
  given; without them (``--metrics-secure=false``) it is open like the probes.

Health and plain-HTTP metrics may share a port; secure metrics need their own. A port of
``None`` or ``0`` disables it.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any, Callable, Iterable

from aiohttp import web

from declop.errors import ConfigError

__all__ = ["Check", "ProbeServer"]

log = logging.getLogger("declop.probes")

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
        self.host = host
        self._runners: list[web.AppRunner] = []

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
            app = web.Application(middlewares=middlewares)
            for path, handler in routes:
                app.router.add_get(path, handler)  # type: ignore[arg-type]
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            try:
                await web.TCPSite(runner, self.host, port, ssl_context=self.metrics_tls if secure else None).start()
            except OSError as exc:
                await runner.cleanup()
                raise ConfigError(f"cannot serve probes on port {port}: {exc.strerror or exc}; pick another port") from exc
            self._runners.append(runner)
            scheme = "https" if secure and self.metrics_tls is not None else "http"
            auth = "TokenReview+SubjectAccessReview" if middlewares else "none"
            log.info("Serving probes", extra={"kv": {"port": port, "scheme": scheme, "authentication": auth, "paths": [p for p, _ in routes]}})

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners = []
