"""declop.webhooks.certs: the CA in a Secret (created once, shared, never overwritten) and a serving
certificate a client trusting only the CA accepts — before and after a renewal, without SNI."""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import socket
import ssl
import threading
from typing import Any

import pytest
from cryptography import x509

from declop.errors import ApiError, ConfigError, Conflict, Forbidden, NotFound
from declop.webhooks.certs import CertAuthority, GeneratedCert, MountedCert, load_or_create_ca


def handshake(ctx: ssl.SSLContext, ca_pem: bytes, server_hostname: str | None = None) -> x509.Certificate:
    """One TLS handshake against ``ctx`` to 127.0.0.1, verified with ``ca_pem`` (no SNI by default,
    as Go's client does for an IP); returns the certificate served."""
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
    client = ssl.create_default_context(cadata=ca_pem.decode())
    with socket.create_connection(("127.0.0.1", port)) as raw, client.wrap_socket(raw, server_hostname=server_hostname or "127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    t.join(5)
    server.close()
    assert der is not None
    return x509.load_der_x509_certificate(der)


def test_issued_certificate_is_trusted_through_the_ca_and_renewed():
    ca = CertAuthority.generate("test CA")
    cert = GeneratedCert(ca, ["127.0.0.1", "localhost"], validity=3600)
    first = handshake(cert.context, cert.ca_bundle)
    assert first.not_valid_after_utc - first.not_valid_before_utc == datetime.timedelta(seconds=3600, minutes=5)
    cert.renew()
    second = handshake(cert.context, cert.ca_bundle)
    assert second.serial_number != first.serial_number
    assert handshake(cert.context, cert.ca_bundle, server_hostname="localhost").serial_number == second.serial_number


def test_renewal_task_runs_after_two_thirds(monkeypatch):
    cert = GeneratedCert(CertAuthority.generate("ca"), ["127.0.0.1"], validity=10)
    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) > 2:
            raise asyncio.CancelledError

    async def go() -> None:
        monkeypatch.setattr(asyncio, "sleep", fake_sleep)
        with pytest.raises(asyncio.CancelledError):
            await cert._renew_forever()

    asyncio.run(go())
    assert sleeps == [pytest.approx(10 * 2 / 3)] * 3 and cert.renewals == 2


def test_short_validity_is_refused():
    with pytest.raises(ConfigError, match="--webhook-cert-validity must be at least 10 seconds"):
        GeneratedCert(CertAuthority.generate("ca"), ["127.0.0.1"], validity=1)


class FakeSecrets:
    """GET/POST/PUT of one Secret as the apiserver answers them: a PUT must carry the current
    resourceVersion (else 409); optionally another replica wins the create or the fill once, and
    a create can be refused (the chart's RBAC has no ``create``)."""

    def __init__(self, lose_race: bool = False, *, lose_fill: bool = False, may_create: bool = True) -> None:
        self.stored: dict[str, Any] | None = None
        self.lose_race = lose_race
        self.lose_fill = lose_fill
        self.may_create = may_create
        self.posts = 0
        self.puts: list[dict[str, Any]] = []
        self.sent: list[tuple[str, str]] = []
        self.version = 0

    def theirs(self) -> dict[str, Any]:
        other = CertAuthority.generate("theirs")
        return {"ca.crt": base64.b64encode(other.cert_pem).decode(), "ca.key": base64.b64encode(other.key_pem).decode()}

    def store(self, obj: dict[str, Any]) -> None:
        self.version += 1
        self.stored = {**obj, "metadata": {**obj.get("metadata", {}), "resourceVersion": str(self.version)}}

    async def __call__(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        self.sent.append((method, path))
        if method == "GET":
            if self.stored is None:
                raise NotFound()
            return copy.deepcopy(self.stored)
        if method == "PUT":
            self.puts.append(body)
            if self.stored is None:
                raise NotFound()
            if self.lose_fill:  # another replica filled it between our GET and PUT
                self.lose_fill = False
                self.store({**self.stored, "data": self.theirs()})
            if body["metadata"].get("resourceVersion") != self.stored["metadata"]["resourceVersion"]:
                raise Conflict("the object has been modified")
            self.store(body)
            return self.stored
        assert method == "POST", method
        self.posts += 1
        if not self.may_create:
            raise Forbidden('secrets is forbidden: User "system:serviceaccount:ops:op" cannot create resource "secrets"')
        if self.lose_race:
            self.lose_race = False
            self.store({"data": self.theirs()})
            raise Conflict()
        self.store(body)
        return self.stored


def charts_empty_secret() -> dict[str, Any]:
    """The Secret as the chart creates it: Helm's labels and annotations, no data."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {
            "name": "ca", "namespace": "ops", "uid": "u-1",
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {"meta.helm.sh/release-name": "op", "meta.helm.sh/release-namespace": "ops"},
            "managedFields": [{"manager": "helm", "operation": "Update"}],
        },
    }  # fmt: skip


def test_ca_is_created_once_and_then_shared():
    api = FakeSecrets()
    first = asyncio.run(load_or_create_ca(api, "ops", "declop-webhook-ca"))
    second = asyncio.run(load_or_create_ca(api, "ops", "declop-webhook-ca"))
    assert first == second and api.posts == 1
    assert api.stored is not None and api.stored["metadata"] | {"resourceVersion": None} == {"resourceVersion": None, "name": "declop-webhook-ca", "namespace": "ops", "labels": {"app.kubernetes.io/managed-by": "declop"}}


def test_a_long_release_namespace_and_name_still_make_a_ca():
    """The chart names the Secret <namespace>-<release>-declop-webhook-ca: a 12-character namespace
    used to crash the start (X.509 CommonName > 64 characters). The name is cut and made unique."""
    api = FakeSecrets()
    ca = asyncio.run(load_or_create_ca(api, "platform-ops", "platform-ops-widgets-declop-webhook-ca"))
    (cn,) = x509.load_pem_x509_certificate(ca.cert_pem).subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)
    assert len(cn.value) <= 64 and cn.value.startswith("declop webhook CA platform-ops/")
    other = CertAuthority.generate("declop webhook CA platform-ops/platform-ops-widgets-declop-webhook-ca2")
    (other_cn,) = x509.load_pem_x509_certificate(other.cert_pem).subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)
    assert other_cn.value != cn.value


def test_a_lost_create_race_reads_the_winner():
    api = FakeSecrets(lose_race=True)
    ca = asyncio.run(load_or_create_ca(api, "ops", "ca"))
    assert api.stored is not None and ca.cert_pem == base64.b64decode(api.stored["data"]["ca.crt"])


def test_a_broken_secret_is_not_overwritten():
    api = FakeSecrets()
    api.stored = {"data": {"ca.crt": base64.b64encode(b"junk").decode()}}
    with pytest.raises(ConfigError, match=r"the webhook CA Secret ops/ca has no usable ca.crt/ca.key \(KeyError\); delete it"):
        asyncio.run(load_or_create_ca(api, "ops", "ca"))
    assert api.posts == 0


def test_forbidden_secret_read_is_one_line():
    async def forbidden(method: str, path: str, **_: Any) -> Any:
        raise ApiError(403, "Forbidden", 'secrets "ca" is forbidden')

    with pytest.raises(ConfigError, match=r'^cannot read the webhook CA Secret ops/ca: secrets "ca" is forbidden$'):
        asyncio.run(load_or_create_ca(forbidden, "ops", "ca"))


def test_the_charts_empty_secret_is_filled_by_an_update_and_then_shared():
    """Under the chart: GET finds the empty Secret, one PUT at the version read fills it (Helm's
    labels and annotations kept, so Helm still owns it); no create is ever sent."""
    api = FakeSecrets(may_create=False)
    api.store(charts_empty_secret())
    first = asyncio.run(load_or_create_ca(api, "ops", "ca"))
    second = asyncio.run(load_or_create_ca(api, "ops", "ca"))
    assert first == second and api.posts == 0
    assert {m for m, _ in api.sent} == {"GET", "PUT"} and {p for _, p in api.sent} == {"/api/v1/namespaces/ops/secrets/ca"}
    (put,) = api.puts
    assert put["metadata"]["resourceVersion"] == "1"
    assert put["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "Helm"}
    assert put["metadata"]["annotations"] == {"meta.helm.sh/release-name": "op", "meta.helm.sh/release-namespace": "ops"}
    assert "managedFields" not in put["metadata"]  # the apiserver keeps its own
    assert base64.b64decode(put["data"]["ca.crt"]) == first.cert_pem and base64.b64decode(put["data"]["ca.key"]) == first.key_pem


def test_a_lost_fill_race_reads_the_winner():
    """Two replicas read the empty Secret; the other one's update lands first: ours gets 409, and
    we serve with their CA (never overwrite it)."""
    api = FakeSecrets(lose_fill=True, may_create=False)
    api.store(charts_empty_secret())
    ca = asyncio.run(load_or_create_ca(api, "ops", "ca"))
    assert api.stored is not None and len(api.puts) == 1 and api.posts == 0
    assert ca.cert_pem == base64.b64decode(api.stored["data"]["ca.crt"])
    assert base64.b64decode(api.puts[0]["data"]["ca.crt"]) != ca.cert_pem
    assert [m for m, _ in api.sent] == ["GET", "PUT", "GET"]


def test_an_empty_secret_deleted_before_the_fill_is_created():
    """The Secret disappears between the GET and the PUT (404): read again; absent, so create."""
    api = FakeSecrets()
    api.store(charts_empty_secret())
    real = api.__call__

    async def delete_before_put(method: str, path: str, body: Any = None, **kw: Any) -> Any:
        if method == "PUT":
            api.stored = None
        return await real(method, path, body, **kw)

    ca = asyncio.run(load_or_create_ca(delete_before_put, "ops", "ca"))
    assert [m for m, _ in api.sent] == ["GET", "PUT", "GET", "POST"]
    assert api.stored is not None and base64.b64decode(api.stored["data"]["ca.crt"]) == ca.cert_pem


def test_absent_secret_without_create_permission_says_what_to_do():
    api = FakeSecrets(may_create=False)
    with pytest.raises(ConfigError) as info:
        asyncio.run(load_or_create_ca(api, "ops", "ca"))
    message = str(info.value)
    assert "\n" not in message
    assert message == (
        "the webhook CA Secret ops/ca does not exist and this operator may not create it; install with the chart "
        "(it creates the Secret empty and grants get/update on it), create it yourself (kubectl create secret "
        "generic ca -n ops; declop fills it in and needs get and update on it), or mount a certificate with "
        "--webhook-cert-dir"
    )


def test_a_refused_fill_is_one_line():
    async def refuse_put(method: str, path: str, body: Any = None, **_: Any) -> Any:
        if method == "GET":
            return charts_empty_secret()
        raise Forbidden('secrets "ca" is forbidden: User "x" cannot update resource "secrets"')

    with pytest.raises(ConfigError, match=r'^cannot fill the webhook CA Secret ops/ca: secrets "ca" is forbidden: .*; the operator needs get and update on it$'):
        asyncio.run(load_or_create_ca(refuse_put, "ops", "ca"))


def test_a_secret_with_other_data_is_not_overwritten():
    """Only a Secret without data is filled: one with other keys is someone's, and an error."""
    api = FakeSecrets()
    api.store({**charts_empty_secret(), "data": {"tls.crt": base64.b64encode(b"x").decode()}})
    with pytest.raises(ConfigError, match=r"^the webhook CA Secret ops/ca has no usable ca.crt/ca.key \(KeyError\)"):
        asyncio.run(load_or_create_ca(api, "ops", "ca"))
    assert api.puts == [] and api.posts == 0


def test_mounted_certificate_uses_ca_crt_as_bundle(tmp_path):
    ca = CertAuthority.generate("cert-manager CA")
    crt, key = ca.issue(["127.0.0.1"], datetime.timedelta(hours=1))
    (tmp_path / "tls.crt").write_bytes(crt)
    (tmp_path / "tls.key").write_bytes(key)
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    mounted = MountedCert(str(tmp_path))
    assert mounted.ca_bundle == ca.cert_pem
    handshake(mounted.context, mounted.ca_bundle)


def test_mounted_certificate_missing_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read the webhook serving certificate .*tls.crt: No such file or directory; .* leave --webhook-cert-dir unset"):
        MountedCert(str(tmp_path))


def test_the_ca_repr_never_shows_its_key() -> None:
    ca = CertAuthority.generate("declop-webhook-ca")
    text = repr(ca)
    assert "PRIVATE KEY" not in text and ca.key_pem.decode() not in text
    assert "cert_pem" in text
