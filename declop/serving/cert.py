"""Serving certificate for the HTTPS metrics endpoint (and the webhook server's mounted one):
from a mounted directory, or self-signed.

- ``cert_dir`` given: ``tls.crt`` and ``tls.key`` in it (a Secret mounted as a volume, as
  cert-manager writes it). The files are checked for changes at most every 10 s, on new TLS
  handshakes, and a renewed pair is used without a restart (controller-runtime's certwatcher).
- no ``cert_dir``: a fresh self-signed ECDSA P-256 certificate for the pod's host name,
  ``localhost`` and ``127.0.0.1``, valid one year, generated at start with ``cryptography`` and
  kept in memory only (as controller-runtime generates one when no CertDir is set).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl
import time

from declop.errors import ConfigError
from declop.kube.kubeconfig import load_cert_chain

__all__ = ["ServingCert", "self_signed"]

RELOAD_CHECK_SECONDS = 10.0


def self_signed(hosts: list[str]) -> tuple[bytes, bytes]:
    """A self-signed (certificate PEM, key PEM) for ``hosts`` (DNS names or IP addresses)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _server_context(cert: bytes, key: bytes) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    load_cert_chain(ctx, cert, key)
    return ctx


class ServingCert:
    """The TLS context of the metrics server; :attr:`context` is handed to the listener once and
    switches to a renewed pair from ``cert_dir`` by itself (through its SNI callback)."""

    def __init__(
        self,
        cert_dir: str | None = None,
        *,
        what: str = "metrics",
        flag: str = "--metrics-cert-dir",
        reload_check: float | None = None,
    ) -> None:
        self.cert_dir = cert_dir
        self.what, self.flag, self.reload_check = what, flag, reload_check
        self._stamp: tuple[float, float] | None = None
        self._checked = 0.0
        if cert_dir:
            self._current = self._load()
        else:
            hostname = socket.gethostname() or "localhost"
            self._current = _server_context(*self_signed([hostname, "localhost", "127.0.0.1"]))
        self.context = self._current
        if cert_dir:
            outer = _server_context(*self._read())
            outer.sni_callback = self._sni
            self.context = outer

    def _paths(self) -> tuple[str, str]:
        assert self.cert_dir is not None
        return os.path.join(self.cert_dir, "tls.crt"), os.path.join(self.cert_dir, "tls.key")

    def _read(self) -> tuple[bytes, bytes]:
        crt, key = self._paths()
        try:
            with open(crt, "rb") as f:
                cert_pem = f.read()
            with open(key, "rb") as f:
                key_pem = f.read()
            self._stamp = (os.stat(crt).st_mtime, os.stat(key).st_mtime)
        except OSError as exc:
            raise ConfigError(f"cannot read the {self.what} serving certificate {exc.filename}: {exc.strerror}; "
                              f"mount a Secret with tls.crt and tls.key, or leave {self.flag} unset for a generated one") from exc
        return cert_pem, key_pem

    def _load(self) -> ssl.SSLContext:
        try:
            return _server_context(*self._read())
        except ssl.SSLError as exc:
            raise ConfigError(f"the {self.what} serving certificate in {self.cert_dir} does not load: {exc.reason or exc}") from exc

    def _sni(self, sslobj: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> None:
        now = time.monotonic()
        every = RELOAD_CHECK_SECONDS if self.reload_check is None else self.reload_check
        if now - self._checked >= every:
            self._checked = now
            crt, key = self._paths()
            try:
                stamp = (os.stat(crt).st_mtime, os.stat(key).st_mtime)
                if stamp != self._stamp:
                    self._current = self._load()
            except (OSError, ConfigError):
                pass  # keep serving the pair we have; a half-written renewal is retried later
        sslobj.context = self._current
