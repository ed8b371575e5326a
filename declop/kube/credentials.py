"""Credentials: the client certificates and tokens a kubeconfig user hands over, kept off disk.

Owns the ``exec`` credential plugin (:class:`ExecPlugin`, run by :func:`run_exec_plugin` into a
:class:`Credential`) and the client TLS context built from PEMs held in memory
(:func:`tls_context`, :func:`load_cert_chain`). :mod:`declop.kube.kubeconfig` decides which of them
a user has and when to ask again.

Invariants:
- no credential is ever written to a file: CA bundles are given to ``ssl`` in memory, client
  certificates and keys go through anonymous memory files (``memfd``) that vanish with their
  descriptor (elsewhere than Linux: a private temporary folder, removed before returning);
- an exec plugin gets no stdin, passes its stderr through, and has 120 s; every way it can fail
  (not found, non-zero exit, no ExecCredential, neither a token nor a certificate and key, a bad
  ``expirationTimestamp``) is one ``ApiError(0, "Credentials", …)`` naming the plugin and the user;
- a :class:`Credential` is due again a fifth of its remaining lifetime (at most a minute) before
  its ``expirationTimestamp``; without one, never.
"""

from __future__ import annotations

import datetime
import json
import os
import ssl
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from declop.errors import ApiError

__all__ = ["Credential", "ExecPlugin", "load_cert_chain", "run_exec_plugin", "tls_context"]


@dataclass(frozen=True, slots=True)
class ExecPlugin:
    """A ``users[].user.exec`` entry."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = "client.authentication.k8s.io/v1"
    install_hint: str = ""
    cluster: Mapping[str, Any] | None = None  # given to the plugin when provideClusterInfo

    def __repr__(self) -> str:
        # env values may be credentials (an API key for the plugin): names only
        env = tuple((name, "<redacted>") for name, _ in self.env)
        return f"ExecPlugin(command={self.command!r}, args={self.args!r}, env={env!r}, api_version={self.api_version!r})"


@dataclass(slots=True)
class Credential:
    """What an exec plugin handed out, and when to ask it again."""

    token: str | None = field(default=None, repr=False)
    cert: bytes | None = field(default=None, repr=False)
    key: bytes | None = field(default=None, repr=False)
    refresh_at: float = float("inf")  # monotonic


def run_exec_plugin(plugin: ExecPlugin, source: str) -> Credential:
    """Run ``plugin`` once (no stdin, its stderr passed through) and parse its ExecCredential."""
    spec: dict[str, Any] = {"interactive": False}
    if plugin.cluster is not None:
        spec["cluster"] = dict(plugin.cluster)
    env = {**os.environ, **dict(plugin.env)}
    env["KUBERNETES_EXEC_INFO"] = json.dumps({"apiVersion": plugin.api_version, "kind": "ExecCredential", "spec": spec})
    name = f"exec plugin {plugin.command} of {source}"
    try:
        done = subprocess.run(
            [plugin.command, *plugin.args], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            timeout=120, check=False,
        )
    except FileNotFoundError as exc:
        hint = f"; {plugin.install_hint.strip().splitlines()[0]}" if plugin.install_hint.strip() else ""
        raise ApiError(0, "Credentials", f"{name}: command not found{hint}") from exc
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ApiError(0, "Credentials", f"{name} failed to run: {exc}") from exc
    if done.returncode != 0:
        raise ApiError(0, "Credentials", f"{name} exited with code {done.returncode}")
    try:
        answer = json.loads(done.stdout)
        status = answer["status"]
        if not isinstance(status, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiError(0, "Credentials", f"{name} did not print an ExecCredential with a status") from exc
    cred = Credential(
        token=status.get("token") or None,
        cert=(status.get("clientCertificateData") or "").encode() or None,
        key=(status.get("clientKeyData") or "").encode() or None,
    )
    if not cred.token and not (cred.cert and cred.key):
        raise ApiError(0, "Credentials", f"{name} returned neither a token nor a client certificate and key")
    expires = status.get("expirationTimestamp")
    if expires:
        try:
            at = datetime.datetime.fromisoformat(str(expires).replace("Z", "+00:00"))
        except ValueError as exc:
            raise ApiError(0, "Credentials", f"{name}: bad expirationTimestamp {expires!r}") from exc
        left = at.timestamp() - time.time()
        margin = min(60.0, max(left, 0.0) / 5)
        cred.refresh_at = time.monotonic() + left - margin
    return cred


# -- TLS without files ---------------------------------------------------------------------------
def tls_context(ca: bytes | None, insecure: bool, cert: bytes | None, key: bytes | None) -> ssl.SSLContext:
    """A client TLS context trusting ``ca`` (the system roots when None), presenting ``cert``/``key``."""
    ctx = ssl.create_default_context(cadata=ca.decode() if ca else None)
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert and key:
        load_cert_chain(ctx, cert, key)
    return ctx


def load_cert_chain(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """``ctx.load_cert_chain`` from memory: ``ssl`` only reads paths, so the PEMs go through
    anonymous memory files (``memfd``, Linux) that exist only while their descriptors are open.
    Elsewhere a private temporary directory is used and removed before returning."""
    if hasattr(os, "memfd_create"):
        fds: list[int] = []
        try:
            for data in (cert, key):
                fd = os.memfd_create("declop-credential", getattr(os, "MFD_CLOEXEC", 0))
                fds.append(fd)
                _write_all(fd, data)
            ctx.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="declop-") as tmp:  # pragma: no cover - not Linux
        paths = []
        for name, data in (("cert", cert), ("key", key)):
            path = os.path.join(tmp, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
            paths.append(path)
        ctx.load_cert_chain(paths[0], paths[1])


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
