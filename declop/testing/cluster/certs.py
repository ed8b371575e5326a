"""PEM material for a test control plane: two CAs, the apiserver's serving cert, client certs, SA keys.

What :func:`generate` writes into a directory (names are fixed, see :class:`Certificates`):

- ``serving-ca.crt``/``.key``  self-signed CA that signs the apiserver's serving certificate;
  clients trust it (``certificate-authority``).
- ``apiserver.crt``/``.key``   leaf, CN ``localhost``, SANs DNS ``localhost`` + IP ``127.0.0.1``
  plus every extra name given to :func:`generate` (IP addresses become IP SANs), EKU serverAuth.
- ``client-ca.crt``/``.key``   a *separate* self-signed CA; the apiserver's ``--client-ca-file``.
- ``admin.crt``/``.key``       client leaf, CN ``admin``, O ``system:masters`` (bypasses RBAC).
- ``sa.key``/``sa.pub``        service-account token signing pair (PKCS#8 / SubjectPublicKeyInfo).

Invariants: every key is ECDSA P-256 in unencrypted PKCS#8 PEM; every certificate is valid from a
minute ago for one week; a client certificate's CN is the user name and each O is a group, which
is exactly how kube-apiserver's x509 authenticator reads them. Key files are written mode 0600.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Certificates", "KeyPair", "generate"]

VALIDITY = dt.timedelta(days=7)
_BACKDATE = dt.timedelta(minutes=1)


@dataclass(frozen=True)
class KeyPair:
    """Paths of a PEM certificate and its PEM private key."""

    cert: str
    key: str


@dataclass(frozen=True)
class Certificates:
    """Paths of everything :func:`generate` wrote; :meth:`issue_client` adds more users later."""

    directory: str
    serving_ca: KeyPair
    apiserver: KeyPair
    client_ca: KeyPair
    admin: KeyPair
    sa_private_key: str
    sa_public_key: str

    def issue_client(self, user: str, groups: Iterable[str] = ()) -> KeyPair:
        """Issue a client certificate for ``user`` in ``groups``, signed by the client CA.

        Files are ``user-<name>.crt``/``.key`` in :attr:`directory`; issuing the same user again
        overwrites them with a fresh pair.
        """
        ca_cert = x509.load_pem_x509_certificate(Path(self.client_ca.cert).read_bytes())
        ca_key = serialization.load_pem_private_key(Path(self.client_ca.key).read_bytes(), None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise TypeError(f"{self.client_ca.key} is not an ECDSA key")
        stem = "user-" + (re.sub(r"[^A-Za-z0-9_.-]+", "_", user) or "_")
        return _client_leaf(Path(self.directory), stem, user, groups, ca_cert, ca_key)


def generate(directory: str | os.PathLike[str], hosts: Iterable[str] = ()) -> Certificates:
    """Write a fresh set of control-plane certificates and keys into ``directory`` (created).

    ``hosts`` are extra names the apiserver's serving certificate is valid for: a host IP that
    Pods reach it on, the ``kubernetes`` Service's ClusterIP and DNS names.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    serving_ca_cert, serving_ca_key = _self_signed_ca("declop-serving-ca")
    client_ca_cert, client_ca_key = _self_signed_ca("declop-client-ca")
    serving_ca = _write_pair(out, "serving-ca", serving_ca_cert, serving_ca_key)
    client_ca = _write_pair(out, "client-ca", client_ca_cert, client_ca_key)

    leaf_key = _new_key()
    leaf = (
        _builder(_name("localhost"), serving_ca_cert.subject, leaf_key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_leaf_key_usage(), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName(_subject_alternative_names(["localhost", "127.0.0.1", *hosts])),
            critical=False,
        )
        .sign(serving_ca_key, hashes.SHA256())
    )
    apiserver = _write_pair(out, "apiserver", leaf, leaf_key)
    admin = _client_leaf(out, "admin", "admin", ["system:masters"], client_ca_cert, client_ca_key)

    sa_key = _new_key()
    sa_private, sa_public = out / "sa.key", out / "sa.pub"
    _write(sa_private, _key_pem(sa_key), private=True)
    _write(
        sa_public,
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    return Certificates(
        directory=str(out),
        serving_ca=serving_ca,
        apiserver=apiserver,
        client_ca=client_ca,
        admin=admin,
        sa_private_key=str(sa_private),
        sa_public_key=str(sa_public),
    )


def _subject_alternative_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    """IP SANs for addresses, DNS SANs for names; duplicates dropped, order kept."""
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _client_leaf(
    out: Path,
    stem: str,
    user: str,
    groups: Iterable[str],
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
) -> KeyPair:
    """Sign a clientAuth leaf whose CN is ``user`` and whose O attributes are ``groups``."""
    key = _new_key()
    cert = (
        _builder(_name(user, groups), ca_cert.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_leaf_key_usage(), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return _write_pair(out, stem, cert, key)


def _self_signed_ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _new_key()
    subject = _name(common_name, ["declop"])
    cert = (
        _builder(subject, subject, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + VALIDITY)
    )


def _leaf_key_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


def _name(common_name: str, organizations: Iterable[str] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    return x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write_pair(
    out: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> KeyPair:
    cert_path, key_path = out / f"{stem}.crt", out / f"{stem}.key"
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    _write(key_path, _key_pem(key), private=True)
    return KeyPair(cert=str(cert_path), key=str(key_path))


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    """Write ``data``; private files are created 0600 so no other user ever reads them."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
