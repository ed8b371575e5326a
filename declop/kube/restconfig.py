"""RestConfig: how to talk to one apiserver once the kubeconfig (or the Pod) said where and who.

The transport asks it before each request for the Authorization header and the TLS context;
:mod:`declop.kube.kubeconfig` builds it.

Invariants:
- no credential is ever written to a file, and none is in a repr (tracebacks, debuggers, logs);
- an exec plugin runs in a worker thread, never on the event loop, one run at a time; its token
  and client certificate are cached until shortly before ``expirationTimestamp`` and fetched
  again then, or after a 401;
- a tokenFile (and the in-cluster token) is re-read at most every
  :data:`TOKEN_REREAD_SECONDS`, so a rotated projected token is picked up without a restart; a
  failed re-read keeps the last token;
- the TLS context is rebuilt only when the client certificate changes.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from declop.errors import ApiError
from declop.kube.credentials import Credential, ExecPlugin, run_exec_plugin, tls_context
from declop.kube.proxy import redact_url

__all__ = ["REDACTED", "TOKEN_REREAD_SECONDS", "RestConfig"]

TOKEN_REREAD_SECONDS = 60.0
#: what a repr shows instead of a credential
REDACTED = "<redacted>"


@dataclass(eq=False)
class RestConfig:
    """How to talk to one apiserver. Built by :func:`load`; the transport asks it for headers and
    the TLS context before each request (both may change while running)."""

    host: str
    #: where the credentials came from, for error messages: "kubeconfig PATH (user U)" or "in-cluster …"
    source: str = ""
    in_cluster: bool = False
    ca_data: bytes | None = None
    insecure: bool = False
    server_name: str | None = None
    proxy: str | None = field(default=None, repr=False)
    cert_data: bytes | None = field(default=None, repr=False)
    key_data: bytes | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    exec_plugin: ExecPlugin | None = None
    _token_cache: tuple[float, str] | None = field(default=None, repr=False)
    _exec: Credential | None = field(default=None, repr=False)
    _exec_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _ssl: tuple[Any, ssl.SSLContext] | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        # never the token, password, client key or a proxy's password: a repr ends up in
        # tracebacks, debuggers and log lines
        shown = {
            "host": self.host, "source": self.source, "in_cluster": self.in_cluster, "insecure": self.insecure,
            "server_name": self.server_name, "proxy": redact_url(self.proxy) if self.proxy else None,
            "client_certificate": self.cert_data is not None, "client_key": REDACTED if self.key_data else None,
            "token": REDACTED if self.token else None, "token_file": self.token_file,
            "username": self.username, "password": REDACTED if self.password else None,
            "exec_plugin": self.exec_plugin,
        }
        return "RestConfig(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"

    @property
    def proxy_display(self) -> str:
        """The proxy URL as it may be printed: its password replaced by ``xxxxx`` (as Go's
        ``url.Redacted``)."""
        return redact_url(self.proxy) if self.proxy else ""

    # -- what the transport asks ---------------------------------------------------------------
    async def headers(self) -> dict[str, str]:
        """The Authorization header (if any), refreshing an exec credential off the loop."""
        if self.exec_plugin is not None:
            cred = await self._exec_credential()
            return {"Authorization": f"Bearer {cred.token}"} if cred.token else {}
        token = self.token or self._file_token()
        if token:
            return {"Authorization": f"Bearer {token}"}
        if self.username is not None:
            basic = base64.b64encode(f"{self.username}:{self.password or ''}".encode()).decode()
            return {"Authorization": f"Basic {basic}"}
        return {}

    async def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for the next request (None for plain http); rebuilt only when an exec
        plugin hands out a new client certificate."""
        if not self.host.startswith("https"):
            return None
        cert, key = self.cert_data, self.key_data
        if self.exec_plugin is not None:
            cred = await self._exec_credential()
            if cred.cert:
                cert, key = cred.cert, cred.key
        ident = (cert, key)
        if self._ssl is None or self._ssl[0] != ident:
            self._ssl = (ident, tls_context(self.ca_data, self.insecure, cert, key))
        return self._ssl[1]

    @property
    def epoch(self) -> int:
        """Which credentials requests are sent with now, for :meth:`unauthorized` (changes only
        with a login function's answers: :class:`~declop.kube.login.LoginConfig`)."""
        return 0

    def unauthorized(self, epoch: int | None = None) -> bool:
        """A 401 came back for a request sent with the credentials of ``epoch``: forget a cached
        exec credential. True when retrying may help."""
        if self.exec_plugin is not None and self._exec is not None:
            self._exec = None
            return True
        if self.token_file:
            self._token_cache = None
        return False

    def explain_401(self) -> str:
        """What to do about a 401, fitting where the credentials came from."""
        if self.in_cluster:
            return (
                f"the apiserver at {self.host} rejected the service account token (401) read from "
                f"{self.token_file}; the token may have expired or its ServiceAccount been deleted — "
                "check the Pod's serviceAccountName and that its token is mounted"
            )
        what = "exec plugin credential" if self.exec_plugin else "client certificate" if self.cert_data else "token" if (self.token or self.token_file) else "credentials"
        return (
            f"the apiserver at {self.host} rejected the {what} of {self.source} (401); "
            "log in again or refresh that user's credentials, or pick another --context"
        )

    # -- tokens --------------------------------------------------------------------------------
    def _file_token(self) -> str | None:
        if not self.token_file:
            return None
        now = time.monotonic()
        if self._token_cache is not None and now - self._token_cache[0] < TOKEN_REREAD_SECONDS:
            return self._token_cache[1]
        try:
            with open(self.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            if self._token_cache is not None:
                return self._token_cache[1]  # keep the last one: a projected volume swaps files
            raise ApiError(0, "Credentials", f"cannot read the token file {self.token_file}: {exc.strerror}") from exc
        self._token_cache = (now, token)
        return token

    async def _exec_credential(self) -> Credential:
        cred = self._exec
        if cred is not None and time.monotonic() < cred.refresh_at:
            return cred
        # in a thread: a plugin may take seconds (a browser login, a cloud API call)
        return await asyncio.to_thread(self._run_exec)

    def _run_exec(self) -> Credential:
        with self._exec_lock:  # one plugin run at a time; the others take its answer
            cred = self._exec
            if cred is not None and time.monotonic() < cred.refresh_at:
                return cred
            cred = run_exec_plugin(self.exec_plugin, self.source)  # type: ignore[arg-type]
            self._exec = cred
            return cred
