"""Webhook certificates: the TLS identity the apiserver checks when it calls the webhook server.

Two sources (docs/webhooks.md):

- **generated** (default): a private CA kept in the Secret ``<name>-webhook-ca`` of the
  operator's namespace (``ca.crt``, ``ca.key``) — filled in by the first replica (the chart
  creates the Secret empty; run outside the chart, declop creates it), read by every other, so
  all replicas serve certificates the one ``caBundle`` trusts — and a serving
  certificate signed by it for the configured DNS names and IPs, in memory only. It is renewed
  after two thirds of its validity: the new pair serves every new TLS handshake from then on,
  connections already open finish on the old one (still valid), so no admission fails.
- **mounted** (``--webhook-cert-dir``): ``tls.crt``/``tls.key`` as cert-manager writes them,
  re-read when they change (checked on new handshakes, at most every few seconds); the
  ``caBundle`` is ``ca.crt`` from the same folder, else ``tls.crt`` (self-signed).

Invariants:
- a CA is written into the Secret only where there is none: an absent Secret is created (a 409:
  another replica won the race, read theirs); an empty one (no ``data``: the chart's) is filled
  with an update carrying the resourceVersion it was read at, keeping its metadata (a 409:
  another replica filled it first, read theirs). A Secret with data but without a loadable
  ``ca.crt``/``ca.key`` pair is a :class:`~declop.errors.ConfigError` naming it (declop never
  overwrites it);
- the only Secret requests are a GET of that name, an update (PUT) of that name only after the
  GET found it empty, and a create (POST) only after the GET answered 404 — so under the chart's
  RBAC (``get``/``update`` on the name) no ``create`` is ever sent; a refused create is a
  one-line ConfigError saying what to do;
- :attr:`~WebhookCert.context` is handed to the listener once and never replaced: the pair it
  serves is switched through its SNI callback, which runs on every handshake (with or without
  SNI).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import logging
import os
import ssl
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from declop.errors import ApiError, ConfigError
from declop.kube.kubeconfig import load_cert_chain
from declop.serving.cert import ServingCert

__all__ = ["CertAuthority", "GeneratedCert", "MountedCert", "WebhookCert", "load_or_create_ca"]

log = logging.getLogger("declop.webhook")

CA_VALIDITY = datetime.timedelta(days=3650)
#: a serving certificate is renewed once this share of its validity has passed
RENEW_AT = 2 / 3

Request = Callable[..., Awaitable[Any]]


def _server_context(cert: bytes, key: bytes) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    load_cert_chain(ctx, cert, key)
    return ctx


@dataclass(frozen=True)
class CertAuthority:
    """A CA (PEMs) that issues serving certificates."""

    cert_pem: bytes
    #: never in the repr: a CA key signs certificates every client of the webhooks trusts
    key_pem: bytes = field(repr=False)

    @classmethod
    def generate(cls, common_name: str) -> CertAuthority:
        """A fresh CA (ECDSA P-256, 10 years). X.509 caps a CommonName at 64 characters: a longer
        ``common_name`` keeps its first 55 and ends with 8 hex digits of its sha256, so names that
        differ only at the end still differ."""
        import hashlib

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        if len(common_name) > 64:
            common_name = f"{common_name[:55]} {hashlib.sha256(common_name.encode()).hexdigest()[:8]}"
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + CA_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                    encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        return cls(cert.public_bytes(serialization.Encoding.PEM), key_pem)

    def check(self) -> None:
        """Raise ``ValueError`` unless the PEMs load and the key belongs to the certificate."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        cert = x509.load_pem_x509_certificate(self.cert_pem)
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        if cert.public_key().public_numbers() != key.public_key().public_numbers():  # type: ignore[union-attr]
            raise ValueError("ca.key does not belong to ca.crt")

    def issue(self, hosts: list[str], validity: datetime.timedelta) -> tuple[bytes, bytes]:
        """A serving (certificate PEM, key PEM) for ``hosts`` (DNS names or IPs), signed by this CA."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        ca_cert = x509.load_pem_x509_certificate(self.cert_pem)
        ca_key = serialization.load_pem_private_key(self.key_pem, password=None)
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0][:64])]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + validity)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
        )
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        return cert.public_bytes(serialization.Encoding.PEM), key_pem


_NO_CREATE = (
    "install with the chart (it creates the Secret empty and grants get/update on it), "
    "create it yourself (kubectl create secret generic {secret} -n {namespace}; declop fills it in "
    "and needs get and update on it), or mount a certificate with --webhook-cert-dir"
)


async def load_or_create_ca(request: Request, namespace: str, secret: str) -> CertAuthority:
    """The CA in Secret ``namespace/secret``: read; an empty Secret (the chart's) is filled, an
    absent one created (a lost race reads the winner's).

    ``request`` is :meth:`declop.kube.transport.Transport.request`."""
    path = f"/api/v1/namespaces/{namespace}/secrets/{secret}"
    where = f"{namespace}/{secret}"
    for _attempt in range(3):
        try:
            found = await request("GET", path)
        except ApiError as exc:
            if exc.status != 404:
                raise ConfigError(f"cannot read the webhook CA Secret {where}: {exc}") from None
            found = None
        if found is not None and (found.get("data") or {}):
            return _from_secret(found, namespace, secret)
        ca = CertAuthority.generate(f"declop webhook CA {where}")
        data = {"ca.crt": base64.b64encode(ca.cert_pem).decode(), "ca.key": base64.b64encode(ca.key_pem).decode()}
        if found is not None:
            # the chart's empty Secret: fill it at the version read (its labels and Helm's
            # annotations kept: Helm must still own it); a 409 means another replica was first
            body = {k: v for k, v in found.items() if k != "stringData"}
            body["metadata"] = {k: v for k, v in (found.get("metadata") or {}).items() if k != "managedFields"}
            body["data"] = data
            try:
                await request("PUT", path, body=body)
            except ApiError as exc:
                if exc.status in (404, 409):
                    continue  # filled (or deleted) meanwhile: read again
                need = "; the operator needs get and update on it" if exc.status == 403 else ""
                raise ConfigError(f"cannot fill the webhook CA Secret {where}: {exc}{need}") from None
            log.info("Filled the webhook CA Secret", extra={"kv": {"secret": where}})
            return ca
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": secret, "namespace": namespace, "labels": {"app.kubernetes.io/managed-by": "declop"}},
            "type": "Opaque",
            "data": data,
        }
        try:
            await request("POST", f"/api/v1/namespaces/{namespace}/secrets", body=body)
        except ApiError as exc:
            if exc.status == 409:
                continue  # another replica created it first: read theirs
            if exc.status == 403:
                raise ConfigError(
                    f"the webhook CA Secret {where} does not exist and this operator may not create it; "
                    + _NO_CREATE.format(secret=secret, namespace=namespace)
                ) from None
            raise ConfigError(f"cannot create the webhook CA Secret {where}: {exc}") from None
        log.info("Created the webhook CA", extra={"kv": {"secret": where}})
        return ca
    raise ConfigError(f"the webhook CA Secret {where} keeps appearing and disappearing; is another operator deleting it?")


def _from_secret(secret_obj: Any, namespace: str, secret: str) -> CertAuthority:
    data = (secret_obj or {}).get("data") or {}
    try:
        ca = CertAuthority(base64.b64decode(data["ca.crt"]), base64.b64decode(data["ca.key"]))
        ca.check()
    except (KeyError, ValueError, TypeError) as exc:
        raise ConfigError(
            f"the webhook CA Secret {namespace}/{secret} has no usable ca.crt/ca.key ({type(exc).__name__}); "
            "delete it to have declop make a new CA (with the chart, `helm upgrade` then creates it again, empty), "
            "or mount your own certificate with --webhook-cert-dir"
        ) from None
    return ca


class WebhookCert:
    """What the webhook server and the registration need: a TLS context and the caBundle."""

    context: ssl.SSLContext
    ca_bundle: bytes

    async def start(self) -> None:
        """Begin renewing (generated certificates); nothing for mounted ones."""

    async def stop(self) -> None:
        """Stop renewing."""


class MountedCert(WebhookCert):
    """``tls.crt``/``tls.key`` (and ``ca.crt``) from ``cert_dir``, reloaded when they change."""

    def __init__(self, cert_dir: str, *, reload_check: float = 2.0) -> None:
        self.serving = ServingCert(cert_dir, what="webhook", flag="--webhook-cert-dir", reload_check=reload_check)
        self.context = self.serving.context
        ca_path = os.path.join(cert_dir, "ca.crt")
        path = ca_path if os.path.exists(ca_path) else os.path.join(cert_dir, "tls.crt")
        try:
            with open(path, "rb") as f:
                self.ca_bundle = f.read()
        except OSError as exc:
            raise ConfigError(f"cannot read the webhook CA {path}: {exc.strerror}") from None


class GeneratedCert(WebhookCert):
    """A serving certificate from ``ca`` for ``hosts``, renewed after two thirds of ``validity``."""

    def __init__(self, ca: CertAuthority, hosts: list[str], validity: float) -> None:
        if validity < 10:
            raise ConfigError(f"--webhook-cert-validity must be at least 10 seconds, got {validity:g}")
        self.ca, self.hosts, self.validity = ca, hosts, validity
        self.ca_bundle = ca.cert_pem
        self.renewals = 0
        pair = ca.issue(hosts, datetime.timedelta(seconds=validity))
        self._current = _server_context(*pair)
        self.context = _server_context(*pair)
        self.context.sni_callback = self._sni
        self._task: asyncio.Task[None] | None = None

    def _sni(self, sslobj: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> None:
        sslobj.context = self._current

    def renew(self) -> None:
        """Issue a new serving certificate; new handshakes get it from now on."""
        self._current = _server_context(*self.ca.issue(self.hosts, datetime.timedelta(seconds=self.validity)))
        self.renewals += 1
        log.info("Renewed the webhook serving certificate", extra={"kv": {"validSeconds": self.validity}})

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._renew_forever(), name="webhook certificate renewal")

    async def _renew_forever(self) -> None:
        delay = self.validity * RENEW_AT
        while True:
            await asyncio.sleep(delay)
            try:
                self.renew()
                delay = self.validity * RENEW_AT
            except Exception:  # keep serving the pair we have (a third of its life left); try again soon
                log.exception("Renewing the webhook serving certificate failed; retrying in 10 s")
                delay = 10.0

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
