"""declop.serving.cert: a self-signed pair that a TLS client accepts for localhost, and a mounted
tls.crt/tls.key pair picked up again after renewal without a restart."""

from __future__ import annotations

import os
import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509

from declop.serving import cert as servingcert
from declop.errors import ConfigError
from declop.serving.cert import ServingCert, self_signed


def handshake(ctx: ssl.SSLContext, cafile_pem: bytes | None = None) -> bytes:
    """Serve one TLS handshake with ``ctx``; return the certificate the client saw (DER)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        conn, _ = server.accept()
        try:
            with ctx.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)
        except (ssl.SSLError, OSError):
            pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    client = ssl.create_default_context(cadata=cafile_pem.decode()) if cafile_pem else ssl.create_default_context()
    if not cafile_pem:
        client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port)) as raw, client.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
    t.join(5)
    server.close()
    assert der is not None
    return der


def test_self_signed_is_valid_for_localhost(tmp_path: Path) -> None:
    cert, key = self_signed(["localhost", "127.0.0.1"])
    parsed = x509.load_pem_x509_certificate(cert)
    sans = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    # a client trusting exactly this certificate verifies the handshake for "localhost"
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    servingcert.load_cert_chain(ctx, cert, key)
    handshake(ctx, cert)


def test_no_cert_dir_generates_one_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    handshake(ServingCert().context)
    assert list(tmp_path.iterdir()) == []


def test_a_mounted_pair_is_reloaded_after_renewal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, data in zip(("tls.crt", "tls.key"), self_signed(["localhost"])):
        (tmp_path / name).write_bytes(data)
    serving = ServingCert(str(tmp_path))
    first = handshake(serving.context)
    assert first == x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes()).public_bytes(
        encoding=__import__("cryptography.hazmat.primitives.serialization", fromlist=["Encoding"]).Encoding.DER
    )
    renewed = self_signed(["localhost"])
    for name, data in zip(("tls.crt", "tls.key"), renewed):
        (tmp_path / name).write_bytes(data)
        os.utime(tmp_path / name, (1, 1))  # a different mtime, whatever the clock's resolution
    monkeypatch.setattr(servingcert, "RELOAD_CHECK_SECONDS", 0.0)
    assert handshake(serving.context) != first


def test_a_missing_pair_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read the metrics serving certificate .*tls.crt: No such file"):
        ServingCert(str(tmp_path))
