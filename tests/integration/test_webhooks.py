"""Admission and conversion webhooks end to end: real ``declop run`` processes serving HTTPS on
this host, the real kube-apiserver calling them at ``https://127.0.0.1:<port>``, kubectl as a user
types it.

Every test has its own API group (a fresh CRD), its own ``--webhook-name`` (configurations and
CA Secret) and removes them after, so the session's other tests never meet these webhooks. The
operator's namespace is ``default`` (the CA Secret lives there, and it is excluded from
admission); objects are written in the test's namespace.

The apiserver picks up a new webhook configuration through its own informer, a moment after
the operator applied it: :func:`wait_enforced` waits for a server-side dry run to be denied.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import kubernetes.client
import pytest
from cryptography import x509

from declop.testing.cluster.faults import TcpProxy
from declop.testing.cluster.runner import OperatorProcess, wait_for

pytestmark = pytest.mark.integration

OPERATOR_NS = "default"

HANDLERS = '''
import asyncio
import os

import declop

GROUP = os.environ["WH_GROUP"]
REPLICA = os.environ.get("WH_REPLICA", "")
POLICY = os.environ.get("WH_POLICY", "Fail")

@declop.validator(f"widgets.{GROUP}", failure_policy=POLICY)
def check_size(obj, dry_run, warnings, logger, **_):
    logger.info("validating", object=obj["metadata"]["name"], dryRun=dry_run, replica=REPLICA)
    size = obj.get("spec", {}).get("size", 0)
    if size > 10:
        raise declop.Rejected("must be at most 10", field="spec.size")
    if size == 7:
        warnings.append("7 is unlucky")

@declop.validator(f"widgets.{GROUP}", timeout=1, failure_policy="Ignore")
async def slow(obj, **_):
    if obj.get("spec", {}).get("size") == 9:
        await asyncio.sleep(3)

@declop.mutator(f"widgets.{GROUP}")
def default_color(obj, **_):
    if obj["metadata"].get("labels", {}).get("plain") != "yes":
        obj["spec"].setdefault("color", "blue")
'''

CONVERTER = '''
import os

import declop

GROUP = os.environ["WH_GROUP"]

def _clean(d):
    return {k: v for k, v in d.items() if v is not None}

@declop.converter(f"gadgets.{GROUP}")
def convert(obj, desired_api_version, logger):
    spec = obj.get("spec", {})
    if desired_api_version == f"{GROUP}/v1":
        obj["spec"] = _clean({"replicas": spec.get("size"), "appearance": _clean({"color": spec.get("color")})})
    else:
        obj["spec"] = _clean({"size": spec.get("replicas"), "color": spec.get("appearance", {}).get("color")})
    obj["metadata"].setdefault("labels", {})["converted-by"] = "declop"
    obj["metadata"]["name"] = "ignored"  # Kubernetes forbids it: declop keeps the original
    logger.info("converted", to=desired_api_version)
'''

TYPED = '''
import os
from datetime import datetime

from pydantic import BaseModel, Field

import declop
from declop.typed.model import CustomResource

GROUP = os.environ["WH_GROUP"]

class Limits(BaseModel):
    cpu: str = "100m"
    memory: str | None = None

class GizmoSpec(BaseModel):
    size: int = Field(1, ge=0, le=10)
    color: str = "blue"
    tags: dict[str, str] = Field(default_factory=dict)
    limits: Limits = Field(default_factory=Limits)
    stamped: datetime | None = None

class Gizmo(CustomResource, group=GROUP, version="v1", kind="Gizmo"):
    spec: GizmoSpec = Field(default_factory=GizmoSpec)

class GizmoSpecV2(BaseModel):
    replicas: int = 1
    paint: str = "blue"

class GizmoV2(CustomResource, group=GROUP, version="v2", kind="Gizmo", storage=False):
    spec: GizmoSpecV2 = Field(default_factory=GizmoSpecV2)

@declop.mutator(Gizmo)
def stamp(obj: Gizmo, **_):
    if obj.metadata.labels.get("stamp") != "yes":
        return
    obj.spec.tags.pop("drop-me", None)
    obj.spec.tags["stamped"] = "yes"
    obj.spec.limits.memory = "64Mi"
    obj.spec.stamped = datetime(2026, 1, 2, 3, 4, 5)  # naive: sent as UTC

@declop.converter(Gizmo)
def convert(obj: Gizmo | GizmoV2, desired_api_version, **_):
    if isinstance(obj, Gizmo):
        return GizmoV2(metadata=obj.metadata, spec=GizmoSpecV2(replicas=obj.spec.size, paint=obj.spec.color))
    return Gizmo(metadata=obj.metadata, spec=GizmoSpec(size=obj.spec.replicas, color=obj.spec.paint))
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kubectl(env: dict[str, str], *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["kubectl", *args], env=env, input=stdin, capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
    return result


def records(op: OperatorProcess, msg: str) -> list[dict[str, Any]]:
    return [r for r in (json.loads(line) for line in list(op.lines) if line.startswith("{")) if r.get("msg") == msg]


def widget(group: str, name: str, namespace: str, size: int, labels: dict[str, str] | None = None) -> str:
    meta = {"name": name, "namespace": namespace, **({"labels": labels} if labels else {})}
    return json.dumps({"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": meta, "spec": {"size": size}})


def widget_crd(group: str) -> str:
    schema = {"type": "object", "properties": {"spec": {"type": "object", "properties": {"size": {"type": "integer"}, "color": {"type": "string"}}}}}
    return json.dumps({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {"group": group, "scope": "Namespaced", "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}]},
    })


def gadget_crd(group: str) -> str:
    def schema(spec: dict[str, Any]) -> dict[str, Any]:
        return {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "properties": spec}}}}

    alpha = schema({"size": {"type": "integer"}, "color": {"type": "string"}})
    v1 = schema({"replicas": {"type": "integer"}, "appearance": {"type": "object", "properties": {"color": {"type": "string"}}}})
    return json.dumps({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"gadgets.{group}"},
        "spec": {"group": group, "scope": "Namespaced", "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
                 "versions": [{"name": "v1alpha1", "served": True, "storage": True, "schema": alpha},
                              {"name": "v1", "served": True, "storage": False, "schema": v1}]},
    })


class Setup:
    """One test's group, webhook name, handler file and environment; cleaned up after."""

    def __init__(self, env: dict[str, str], tmp_path: Path, namespace: str) -> None:
        self.group = f"wh-{secrets.token_hex(3)}.example.com"
        self.name = f"wh-{secrets.token_hex(3)}"
        self.env = {**env, "WH_GROUP": self.group}
        self.namespace = namespace
        self.handlers = tmp_path / "handlers.py"
        self.handlers.write_text(HANDLERS)
        self.converter = tmp_path / "converter.py"
        self.converter.write_text(CONVERTER)
        self.crds: list[str] = []

    def crd(self, manifest: str) -> None:
        name = json.loads(manifest)["metadata"]["name"]
        kubectl(self.env, "apply", "-f", "-", stdin=manifest)
        kubectl(self.env, "wait", "--for", "condition=established", f"crd/{name}", "--timeout=30s")
        self.crds.append(name)

    def operator(self, *extra: str, port: int | None = None, env: dict[str, str] | None = None, handlers: Path | None = None) -> OperatorProcess:
        args = [str(handlers or self.handlers), "--webhook-port", str(port or free_port()), "--webhook-name", self.name,
                "--webhook-namespace", OPERATOR_NS, "--log-format", "json", "-v", *extra]
        return OperatorProcess(args, env={**self.env, **(env or {})})

    def apply(self, manifest: str, *args: str) -> subprocess.CompletedProcess[str]:
        return kubectl(self.env, "apply", "-f", "-", *args, stdin=manifest, check=False)

    def wait_enforced(self, timeout: float = 20.0) -> None:
        """Until the apiserver calls the validator: a dry run of size 11 is denied."""
        probe = widget(self.group, "probe", self.namespace, 11)
        wait_for(lambda: "denied the request" in self.apply(probe, "--dry-run=server").stderr, timeout, 0.2, "the validator to be enforced")

    def cleanup(self) -> None:
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            kubectl(self.env, "delete", kind, self.name, "--ignore-not-found", check=False)
        kubectl(self.env, "delete", "secret", f"{self.name}-webhook-ca", "-n", OPERATOR_NS, "--ignore-not-found", check=False)
        for crd in self.crds:
            kubectl(self.env, "delete", "crd", crd, "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture
def setup(control_plane: Any, tmp_path: Path, namespace: str) -> Iterator[Setup]:
    s = Setup(control_plane.env(), tmp_path, namespace)
    try:
        yield s
    finally:
        s.cleanup()


def get(setup: Setup, resource: str, name: str) -> dict[str, Any]:
    return json.loads(kubectl(setup.env, "get", resource, name, "-n", setup.namespace, "-o", "json").stdout)


def ca_bundle(setup: Setup) -> bytes:
    config = json.loads(kubectl(setup.env, "get", "validatingwebhookconfiguration", setup.name, "-o", "json").stdout)
    bundles = {w["clientConfig"]["caBundle"] for w in config["webhooks"]}
    assert len(bundles) == 1
    return base64.b64decode(bundles.pop())


def served_certificate(port: int, ca: bytes) -> x509.Certificate:
    """The certificate the webhook server presents to a client that trusts only ``ca``."""
    ctx = ssl.create_default_context(cadata=ca.decode())
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def test_validator_denies_allows_warns_and_sees_dry_run(setup: Setup) -> None:
    setup.crd(widget_crd(setup.group))
    port = free_port()
    with setup.operator(port=port) as op:
        op.wait_for_line("Registered ValidatingWebhookConfiguration")
        setup.wait_enforced()

        denied = setup.apply(widget(setup.group, "big", setup.namespace, 11))
        assert denied.returncode != 0
        assert (
            f'admission webhook "check-size.widgets.{setup.group}" denied the request: spec.size: must be at most 10'
        ) in denied.stderr, denied.stderr
        assert "NotFound" in kubectl(setup.env, "get", "widget.v1." + setup.group, "big", "-n", setup.namespace, check=False).stderr

        allowed = setup.apply(widget(setup.group, "small", setup.namespace, 3))
        assert allowed.returncode == 0, allowed.stderr
        assert get(setup, f"widgets.{setup.group}", "small")["spec"]["size"] == 3

        warned = setup.apply(widget(setup.group, "seven", setup.namespace, 7))
        assert warned.returncode == 0 and "Warning: 7 is unlucky" in warned.stderr, warned.stderr

        dry = setup.apply(widget(setup.group, "dry", setup.namespace, 4), "--dry-run=server")
        assert dry.returncode == 0 and "(server dry run)" in dry.stdout, dry.stdout + dry.stderr
        seen = wait_for(lambda: [r for r in records(op, "validating") if r["object"] == "dry"], 10, what="the dry run at the handler")
        assert seen[0]["dryRun"] is True
        assert all(r["dryRun"] is False for r in records(op, "validating") if r["object"] == "small")

        # bad input over the real TLS listener: one 400 line, logged once, and the server keeps serving
        ctx = ssl.create_default_context(cadata=ca_bundle(setup).decode())
        url = f"https://127.0.0.1:{port}/validate/check-size.widgets.{setup.group}"
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(urllib.request.Request(url, data=b"not json", method="POST"), context=ctx, timeout=5)
        assert info.value.code == 400
        assert info.value.read().decode().startswith("bad request: the request body is not valid JSON")
        wait_for(lambda: len(records(op, "Bad webhook request")) == 1, 5, what="one log line for the bad request")
        assert setup.apply(widget(setup.group, "after", setup.namespace, 2)).returncode == 0


def test_mutator_defaults_are_stored_and_a_no_op_sends_no_patch(setup: Setup) -> None:
    setup.crd(widget_crd(setup.group))
    with setup.operator() as op:
        op.wait_for_line("Registered MutatingWebhookConfiguration")
        setup.wait_enforced()
        assert setup.apply(widget(setup.group, "defaulted", setup.namespace, 1)).returncode == 0
        assert get(setup, f"widgets.{setup.group}", "defaulted")["spec"] == {"size": 1, "color": "blue"}

        assert setup.apply(widget(setup.group, "plain", setup.namespace, 1, labels={"plain": "yes"})).returncode == 0
        assert get(setup, f"widgets.{setup.group}", "plain")["spec"] == {"size": 1}
        answers = wait_for(
            lambda: {r["name"]: r["patchOps"] for r in records(op, "Allowed") if "patchOps" in r and r["name"] in ("defaulted", "plain") and r["operation"] == "CREATE"},
            10, what="the mutator's answers",
        )
        assert answers == {"defaulted": 1, "plain": 0}


def test_handler_past_its_timeout_is_reported_and_the_policy_applies(setup: Setup) -> None:
    setup.crd(widget_crd(setup.group))
    with setup.operator() as op:
        op.wait_for_line("Registered ValidatingWebhookConfiguration")
        setup.wait_enforced()
        started = time.monotonic()
        result = setup.apply(widget(setup.group, "slow", setup.namespace, 9))
        assert result.returncode == 0, result.stderr  # failurePolicy Ignore: admitted after 1 s
        assert time.monotonic() - started < 10
        (record,) = wait_for(lambda: records(op, "Webhook handler took longer than its timeout; the failurePolicy applies"), 10)
        assert record["webhook"] == f"slow.widgets.{setup.group}" and record["timeoutSeconds"] == 1
        assert record["level"] == "ERROR" and record["failurePolicy"] == "Ignore"


def test_stopped_webhook_fail_names_it_ignore_admits(setup: Setup) -> None:
    setup.crd(widget_crd(setup.group))
    with setup.operator() as op:
        op.wait_for_line("Registered ValidatingWebhookConfiguration")
        setup.wait_enforced()
    assert op.returncode == 0
    refused = setup.apply(widget(setup.group, "while-down", setup.namespace, 1))
    assert refused.returncode != 0
    # the mutating webhook is called first: its name is the one kubectl shows
    assert f'failed calling webhook "default-color.widgets.{setup.group}"' in refused.stderr, refused.stderr

    with setup.operator(env={"WH_POLICY": "Ignore"}) as op:
        op.wait_for_line("Registered ValidatingWebhookConfiguration")
        wait_for(
            lambda: json.loads(kubectl(setup.env, "get", "validatingwebhookconfiguration", setup.name, "-o", "json").stdout)["webhooks"][0]["failurePolicy"] == "Ignore",
            10, what="failurePolicy Ignore",
        )
    kubectl(setup.env, "delete", "mutatingwebhookconfiguration", setup.name)  # the mutator is Fail: out of the way
    admitted = wait_for(lambda: setup.apply(widget(setup.group, "while-down", setup.namespace, 1)).returncode == 0, 20, 0.3, "admission while down with Ignore")
    assert admitted


def test_converter_round_trips_between_versions(setup: Setup) -> None:
    setup.crd(gadget_crd(setup.group))
    with setup.operator(handlers=setup.converter) as op:
        op.wait_for_line("Registered the conversion webhook")
        crd = json.loads(kubectl(setup.env, "get", "crd", f"gadgets.{setup.group}", "-o", "json").stdout)
        assert crd["spec"]["conversion"]["strategy"] == "Webhook"
        assert crd["spec"]["conversion"]["webhook"]["clientConfig"]["url"].endswith(f"/convert/convert.gadgets.{setup.group}")

        v1 = {"apiVersion": f"{setup.group}/v1", "kind": "Gadget",
              "metadata": {"name": "g", "namespace": setup.namespace, "labels": {"app": "demo"}, "annotations": {"note": "kept"}},
              "spec": {"replicas": 3, "appearance": {"color": "red"}}}
        # written at v1 (stored as v1alpha1 through the converter); the CRD change may take a moment to apply
        wait_for(lambda: kubectl(setup.env, "apply", "-f", "-", stdin=json.dumps(v1), check=False).returncode == 0, 20, 0.3, "a write at v1")

        alpha = get(setup, f"gadgets.v1alpha1.{setup.group}", "g")
        assert alpha["apiVersion"] == f"{setup.group}/v1alpha1"
        assert alpha["spec"] == {"size": 3, "color": "red"}
        assert alpha["metadata"]["labels"] == {"app": "demo", "converted-by": "declop"}
        assert alpha["metadata"]["annotations"]["note"] == "kept" and alpha["metadata"]["name"] == "g"

        back = get(setup, f"gadgets.v1.{setup.group}", "g")
        assert back["apiVersion"] == f"{setup.group}/v1" and back["spec"] == v1["spec"]
        assert back["metadata"]["uid"] == alpha["metadata"]["uid"]

        # written at v1alpha1, read at v1
        alpha["spec"]["size"] = 5
        kubectl(setup.env, "replace", "-f", "-", stdin=json.dumps(alpha))
        assert get(setup, f"gadgets.v1.{setup.group}", "g")["spec"] == {"replicas": 5, "appearance": {"color": "red"}}
        assert records(op, "converted")


def test_typed_mutator_and_converter_store_what_the_model_says(setup: Setup, tmp_path: Path) -> None:
    """``obj: Gizmo`` on a mutator and ``obj: Gizmo | GizmoV2`` on a converter, with the CRD from
    ``declop crd``: the stored object has what the mutator set and nothing it did not (the
    CRD's defaults, filled in before admission, stay; the removed tag goes; the naive time is
    UTC); an unchanged object gets no patch; each version reads as its model converts it."""
    handlers = tmp_path / "typed.py"
    handlers.write_text(TYPED)
    crd = subprocess.run([sys.executable, "-m", "declop", "crd", str(handlers)], env=setup.env, capture_output=True, text=True, timeout=60)
    assert crd.returncode == 0, crd.stderr
    kubectl(setup.env, "apply", "-f", "-", stdin=crd.stdout)
    setup.crds.append(f"gizmos.{setup.group}")
    kubectl(setup.env, "wait", "--for", "condition=established", f"crd/gizmos.{setup.group}", "--timeout=30s")

    def gizmo(name: str, version: str, spec: dict[str, Any], stamp: bool = True) -> str:
        meta = {"name": name, "namespace": setup.namespace, "labels": {"stamp": "yes" if stamp else "no"}}
        return json.dumps({"apiVersion": f"{setup.group}/{version}", "kind": "Gizmo", "metadata": meta, "spec": spec})

    with setup.operator(handlers=handlers) as op:
        op.wait_for_line("Registered the conversion webhook")
        op.wait_for_line("Registered MutatingWebhookConfiguration")
        probe = gizmo("probe", "v1", {})
        wait_for(lambda: "stamped" in setup.apply(probe, "--dry-run=server", "-o", "json").stdout, 20, 0.2, "the mutator to be called")

        manifest = gizmo("g", "v1", {"size": 2, "tags": {"drop-me": "x", "keep": "y"}})
        applied = setup.apply(manifest)
        assert applied.returncode == 0, applied.stderr
        stored = get(setup, f"gizmos.v1.{setup.group}", "g")
        assert stored["spec"] == {
            "size": 2, "color": "blue", "tags": {"keep": "y", "stamped": "yes"},
            "limits": {"cpu": "100m", "memory": "64Mi"}, "stamped": "2026-01-02T03:04:05Z",
        }
        kubectl(setup.env, "label", "gizmo.v1." + setup.group, "g", "-n", setup.namespace, "seen=1")  # nothing for the mutator to do
        answers = wait_for(
            lambda: (found := [(r["operation"], r["patchOps"]) for r in records(op, "Allowed") if r.get("name") == "g" and "patchOps" in r])[1:] and found,
            10, what="the mutator's answers to the create and the label",
        )
        # remove the tag, add a tag, limits.memory and stamped: four; the label: none
        assert answers[0] == ("CREATE", 4) and answers[1] == ("UPDATE", 0)
        assert get(setup, f"gizmos.v1.{setup.group}", "g")["spec"] == stored["spec"]

        v2 = get(setup, f"gizmos.v2.{setup.group}", "g")
        assert v2["spec"] == {"replicas": 2, "paint": "blue"} and v2["metadata"]["labels"] == {"stamp": "yes", "seen": "1"}

        written = setup.apply(gizmo("h", "v2", {"replicas": 4, "paint": "red"}, stamp=False))
        assert written.returncode == 0, written.stderr
        assert get(setup, f"gizmos.v1.{setup.group}", "h")["spec"] == {"size": 4, "color": "red", "tags": {}, "limits": {"cpu": "100m"}}


def test_certificate_renewed_while_running_fails_no_admission(setup: Setup, k8s_api: kubernetes.client.ApiClient) -> None:
    setup.crd(widget_crd(setup.group))
    port = free_port()
    api = kubernetes.client.CustomObjectsApi(k8s_api)
    with setup.operator("--webhook-cert-validity", "12", port=port) as op:
        op.wait_for_line("Registered ValidatingWebhookConfiguration")
        setup.wait_enforced()
        ca = ca_bundle(setup)
        first = served_certificate(port, ca)
        failures: list[str] = []
        created = 0
        stop = threading.Event()

        def write() -> None:
            nonlocal created
            while not stop.is_set():
                body = {"apiVersion": f"{setup.group}/v1", "kind": "Widget", "metadata": {"generateName": "r-"}, "spec": {"size": 1}}
                try:
                    api.create_namespaced_custom_object(setup.group, "v1", setup.namespace, "widgets", body)
                    created += 1
                except kubernetes.client.ApiException as exc:
                    failures.append(f"{exc.status} {exc.body}")

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        try:
            op.wait_for_line("Renewed the webhook serving certificate", count=1, timeout=30)
            second = served_certificate(port, ca)  # a new handshake gets the new pair, trusted by the same caBundle
            time.sleep(2)  # keep writing across the renewal for a moment
        finally:
            stop.set()
            writer.join(30)
        assert second.serial_number != first.serial_number
        assert ca_bundle(setup) == ca
        assert failures == [] and created > 5, (created, failures[:3])


@pytest.mark.parametrize("charts_secret", [False, True], ids=["secret absent", "chart's empty secret"])
def test_two_replicas_share_one_ca_and_either_answers(setup: Setup, charts_secret: bool) -> None:
    """Two replicas start at once: one CA between them, written once — created when the Secret is
    absent, or, with the chart's empty Secret, filled by one update (the other replica's update
    at the same resourceVersion gets 409 and it reads the winner's)."""
    setup.crd(widget_crd(setup.group))
    if charts_secret:
        kubectl(setup.env, "create", "secret", "generic", f"{setup.name}-webhook-ca", "-n", OPERATOR_NS)
    front = free_port()
    port_a, port_b = free_port(), free_port()
    url = ["--webhook-url", f"https://127.0.0.1:{front}"]
    with setup.operator(*url, port=port_a, env={"WH_REPLICA": "a"}) as a, setup.operator(*url, port=port_b, env={"WH_REPLICA": "b"}) as b:
        a.wait_for_line("Registered ValidatingWebhookConfiguration")
        b.wait_for_line("Registered ValidatingWebhookConfiguration")
        ca = ca_bundle(setup)
        secret = json.loads(kubectl(setup.env, "get", "secret", f"{setup.name}-webhook-ca", "-n", OPERATOR_NS, "-o", "json").stdout)
        assert base64.b64decode(secret["data"]["ca.crt"]) == ca
        assert served_certificate(port_a, ca).issuer == served_certificate(port_b, ca).issuer
        written = {m: len(records(a, m)) + len(records(b, m)) for m in ("Created the webhook CA", "Filled the webhook CA Secret")}
        assert written == ({"Created the webhook CA": 0, "Filled the webhook CA Secret": 1} if charts_secret
                           else {"Created the webhook CA": 1, "Filled the webhook CA Secret": 0})  # fmt: skip

        for replica, port in (("a", port_a), ("b", port_b)):
            with TcpProxy(f"127.0.0.1:{port}", listen_port=front):
                setup.wait_enforced()
                name = f"via-{replica}"
                assert setup.apply(widget(setup.group, name, setup.namespace, 2)).returncode == 0
                seen = [r["replica"] for op in (a, b) for r in records(op, "validating") if r["object"] == name]
                assert seen == [replica]


def test_a_removed_handler_leaves_no_entry_behind(setup: Setup, tmp_path: Path) -> None:
    """Restarted without its mutator, the operator empties the MutatingWebhookConfiguration:
    a stale entry with failurePolicy Fail would block every write of the resource."""
    setup.crd(widget_crd(setup.group))
    with setup.operator() as op:
        op.wait_for_line("Registered MutatingWebhookConfiguration")
    only_validator = tmp_path / "only_validator.py"
    only_validator.write_text(HANDLERS.split("@declop.mutator")[0])
    with setup.operator(handlers=only_validator) as op:
        op.wait_for_line("Registered MutatingWebhookConfiguration")
        mutating = json.loads(kubectl(setup.env, "get", "mutatingwebhookconfiguration", setup.name, "-o", "json").stdout)
        assert mutating.get("webhooks", []) == []
        setup.wait_enforced()
        assert setup.apply(widget(setup.group, "no-mutator", setup.namespace, 1)).returncode == 0
        assert get(setup, f"widgets.{setup.group}", "no-mutator")["spec"] == {"size": 1}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--webhook-service", "just-a-name"], "declop: error: --webhook-service 'just-a-name' is not NAMESPACE/NAME[:PORT], e.g. operators/widget-operator-webhook:443"),
        (["--webhook-url", "http://127.0.0.1:9443"], "declop: error: --webhook-url 'http://127.0.0.1:9443' must start with https:// (the apiserver calls webhooks over TLS only)"),
        (["--webhook-cert-validity", "1"], "declop: error: --webhook-cert-validity must be at least 10 seconds, got 1"),
        (["--webhook-cert-dir", "/nonexistent"], "declop: error: cannot read the webhook serving certificate /nonexistent/tls.crt: No such file or directory; mount a Secret with tls.crt and tls.key, or leave --webhook-cert-dir unset for a generated one"),
    ],
)
def test_bad_webhook_options_are_one_line(setup: Setup, args: list[str], expected: str) -> None:
    setup.crd(widget_crd(setup.group))
    result = subprocess.run(
        [sys.executable, "-m", "declop", "run", str(setup.handlers), "--webhook-name", setup.name, "--webhook-namespace", OPERATOR_NS, *args],
        env=setup.env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0
    assert [line for line in result.stderr.splitlines() if line.strip()] == [expected]
    assert "Traceback" not in result.stdout + result.stderr


def test_webhook_port_in_use_is_one_line(setup: Setup) -> None:
    setup.crd(widget_crd(setup.group))
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "declop", "run", str(setup.handlers), "--webhook-port", str(port), "--webhook-name", setup.name, "--webhook-namespace", OPERATOR_NS],
            env=setup.env, capture_output=True, text=True, timeout=60,
        )
    assert result.returncode != 0
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith(f"declop: error: cannot serve webhooks on port {port}: ") and line.endswith("pick another with --webhook-port"), line


POD_HANDLERS = '''
import os

import declop

@declop.validator("pods", labels={"wh-test": os.environ["WH_GROUP"]})
def no_pods(obj, **_):
    raise declop.Rejected("no pods here")
'''


def test_system_namespaces_are_admitted_while_a_fail_webhook_is_down(setup: Setup, tmp_path: Path) -> None:
    """A Fail validator on pods whose operator is down blocks Pods in ordinary namespaces, but not
    in kube-system: CoreDNS and the CNI can come back while the operator cannot. (The webhook
    only matches Pods labelled for this test, so the session's other tests never meet it.)"""
    handlers = tmp_path / "pods.py"
    handlers.write_text(POD_HANDLERS)

    def pod(namespace: str, name: str) -> str:
        return json.dumps({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"wh-test": setup.group}},
            "spec": {"automountServiceAccountToken": False, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        })

    with setup.operator(handlers=handlers) as op:
        op.wait_for_line("Registered ValidatingWebhookConfiguration")
        config = json.loads(kubectl(setup.env, "get", "validatingwebhookconfiguration", setup.name, "-o", "json").stdout)
        (entry,) = config["webhooks"]
        assert entry["failurePolicy"] == "Fail"
        assert entry["namespaceSelector"] == {"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "NotIn",
            "values": ["kube-system", "kube-public", "kube-node-lease", OPERATOR_NS],
        }]}
        wait_for(lambda: "no pods here" in setup.apply(pod(setup.namespace, "probe"), "--dry-run=server").stderr,
                 20, 0.2, "the validator to be enforced")
    assert op.returncode == 0
    down = setup.apply(pod(setup.namespace, "while-down"))
    assert down.returncode != 0 and f'failed calling webhook "no-pods.pods.core"' in down.stderr, down.stderr
    name = f"{setup.name}-while-down"
    try:
        system = setup.apply(pod("kube-system", name))
        assert system.returncode == 0, system.stderr
    finally:
        kubectl(setup.env, "delete", "pod", name, "-n", "kube-system", "--ignore-not-found", "--wait=false", check=False)


HOSTILE_HANDLERS = '''
import os

import declop

GROUP = os.environ["WH_GROUP"]

@declop.validator(f"widgets.{GROUP}")
def check_size(obj, **_):
    if obj.get("spec", {}).get("size", 0) > 10:
        raise declop.Rejected("must be at most 10", field="spec.size")

@declop.reconciler("configmaps")
def mark(request, client, logger, **_):
    try:
        cm = client.get(request)
    except declop.NotFound:
        return None
    if (cm["metadata"].get("labels") or {}).get("hostile-test") == "yes":
        logger.info("reconciled", configmap=request.name)
    return None
'''


def _max_review(group: str, size: int) -> bytes:
    """An AdmissionReview of a Widget padded to ``size`` bytes (the server's maximum)."""
    item = {"name": "x" * 20, "labels": {"a": "b"}, "data": {f"k{j}": "v" * 20 for j in range(30)}}
    per = len(json.dumps(item)) + 2
    obj = {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "huge", "namespace": "x"},
           "spec": {"size": 3, "items": [item] * ((size - 600) // per)}}
    request = {"uid": "hostile-1", "operation": "CREATE", "object": obj, "namespace": "x", "name": "huge",
               "kind": {"group": group, "version": "v1", "kind": "Widget"}}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


def _attack(port: int, path: str, body: bytes, seconds: float, stats: dict[str, int]) -> None:
    """From one thread of this process: 16 clients sending maximum-size reviews over and over,
    1,000 slow clients (TLS, then one header byte a second) and 1,000 idle TCP connections,
    for ``seconds``. Counts what each got in ``stats``."""

    def count(key: str) -> None:
        stats[key] = stats.get(key, 0) + 1

    async def main() -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        deadline = time.monotonic() + seconds
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()

        async def big() -> None:
            while time.monotonic() < deadline:
                try:
                    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, ssl=ctx), 15)
                    writer.write(head + body)
                    await writer.drain()
                    line = await asyncio.wait_for(reader.readline(), 60)
                    count(f"big:{line.split(b' ')[1].decode()}" if line else "big:closed")
                    writer.close()
                except (OSError, asyncio.TimeoutError, ssl.SSLError, IndexError) as exc:
                    count(f"big:{type(exc).__name__}")
                    await asyncio.sleep(0.2)

        async def slow() -> None:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, ssl=ctx), 15)
                for byte in head:
                    if time.monotonic() > deadline:
                        break
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(1)
                    if reader.at_eof():
                        break
                writer.close()
                count("slow:done")
            except (OSError, asyncio.TimeoutError, ssl.SSLError):
                count("slow:cut")

        async def idle() -> None:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                await asyncio.wait_for(reader.read(), max(deadline - time.monotonic(), 0.1))
                count("idle:closed by the server")
                writer.close()
            except asyncio.TimeoutError:
                count("idle:still open")
            except OSError:
                count("idle:refused")

        bigs = [asyncio.create_task(big()) for _ in range(16)]
        await asyncio.sleep(1)
        others = [asyncio.create_task(slow()) for _ in range(1000)] + [asyncio.create_task(idle()) for _ in range(1000)]
        await asyncio.gather(*bigs, *others)

    asyncio.run(main())


def _histogram(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket"):
            out[line.split('le="')[1].split('"')[0]] = float(line.split()[-1])
    return out


def test_hostile_clients_neither_stall_nor_exhaust_a_running_operator(control_plane: Any, setup: Setup) -> None:
    """A real operator (webhook, reconciler, leader election) under, at once, 16 clients sending
    maximum-size reviews without pause, 1,000 slow clients and 1,000 idle connections on its
    webhook port for 25 s: it keeps renewing its Lease and reconciling throughout, its memory
    stays within the chart's 256 Mi limit, its loop never stands still for long
    (``declop_event_loop_lag_seconds``), and afterwards it admits and denies as before."""
    setup.crd(widget_crd(setup.group))
    handlers = setup.handlers.parent / "hostile.py"
    handlers.write_text(HOSTILE_HANDLERS)
    port, metrics_port, lock = free_port(), free_port(), f"hostile-{secrets.token_hex(3)}"
    api = control_plane.api_client()
    core = kubernetes.client.CoreV1Api(api)
    from declop.webhooks.server import ADMISSION_MAX_BYTES

    body = _max_review(setup.group, ADMISSION_MAX_BYTES - 4096)
    path = f"/validate/check-size.widgets.{setup.group}"
    with setup.operator(
        "-n", setup.namespace, "--leader-elect", "--leader-election-id", lock, "--leader-election-namespace", setup.namespace,
        "--lease-duration", "8", "--renew-deadline", "6", "--retry-period", "1",
        "--metrics-port", str(metrics_port), "--metrics-secure", "false", port=port, handlers=handlers,
    ) as op:
        # a fresh Lease: created a lease duration after the first read, leading a renew deadline later
        op.wait_for_line("Successfully acquired lease", timeout=8 + 6 + 2 * 1.2 + 20)
        op.wait_for_line("Registered ValidatingWebhookConfiguration")
        setup.wait_enforced()
        status = Path(f"/proc/{op.proc.pid}/status")

        def rss(field: str) -> float:
            return int(next(l.split()[1] for l in status.read_text().splitlines() if l.startswith(field))) / 1024

        before = rss("VmRSS")
        stats: dict[str, int] = {}
        attacker = threading.Thread(target=_attack, args=(port, path, body, 25.0, stats), daemon=True)
        started = time.monotonic()
        attacker.start()
        # the Lease's own renewTime values (written by the operator), sampled by a thread of their
        # own: a slow reconcile awaited below must not look like a late renewal
        renewals: list[Any] = []
        lease_reader = kubernetes.client.CoordinationV1Api(control_plane.api_client())

        def sample_lease() -> None:
            while attacker.is_alive():
                renewed = lease_reader.read_namespaced_lease(lock, setup.namespace).spec.renew_time
                if not renewals or renewals[-1] != renewed:
                    renewals.append(renewed)
                time.sleep(0.3)

        sampler = threading.Thread(target=sample_lease, daemon=True)
        sampler.start()
        reconciled: list[float] = []
        n = 0
        while attacker.is_alive() and time.monotonic() - started < 120:
            if time.monotonic() - started > 3 * (n + 1) and time.monotonic() - started < 24:
                n += 1
                name = f"during-{n}"
                created = time.monotonic()
                core.create_namespaced_config_map(setup.namespace, {"metadata": {"name": name, "labels": {"hostile-test": "yes"}}})
                wait_for(lambda: [r for r in records(op, "reconciled") if r.get("configmap") == name], 15, 0.1, f"{name} reconciled")
                reconciled.append(time.monotonic() - created)
            time.sleep(0.3)
        attacker.join(120)
        assert not attacker.is_alive()
        sampler.join(30)
        peak, after = rss("VmHWM"), rss("VmRSS")
        assert op.proc.poll() is None, "the operator died under the attack"
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as resp:
            lag = _histogram(resp.read().decode(), "declop_event_loop_lag_seconds")
        gaps = [(b - a).total_seconds() for a, b in zip(renewals, renewals[1:])]
        print(f"attack: {dict(sorted(stats.items()))}")
        print(f"RSS {before:.0f} MiB before, peak {peak:.0f} MiB, {after:.0f} MiB after; Lease renewed {len(renewals)} times, "
              f"longest gap {max(gaps, default=0):.1f} s; {len(reconciled)} reconciles during it, slowest {max(reconciled, default=0):.2f} s")
        print(f"loop lag samples: {lag.get('+Inf', 0):.0f}; over 50 ms: {lag['+Inf'] - lag['0.05']:.0f}; "
              f"over 100 ms: {lag['+Inf'] - lag['0.1']:.0f}; over 250 ms: {lag['+Inf'] - lag['0.25']:.0f}")
        assert stats.get("big:200", 0) >= 16, "maximum-size reviews were not answered"
        assert peak < 256, f"peak RSS {peak:.0f} MiB is over the chart's 256 Mi limit"
        assert not records(op, "Leader election lost") and not records(op, "Failed to renew lease")
        assert len(renewals) >= 15 and max(gaps) < 4, renewals
        assert len(reconciled) >= 5 and max(reconciled) < 10
        # quiet, none of ~350 samples is over 250 ms (docs/webhooks.md); with the node tests
        # sharing the two cores `make test` once saw one of 427 between 0.5 and 1 s (the Lease
        # still renewed every 1.6 s at worst): one such sample is the machine, two are a stall
        assert lag["+Inf"] - lag["0.5"] <= 1, "the loop stood still for more than 0.5 s more than once"
        assert lag["+Inf"] - lag["1.0"] == 0, "the loop stood still for more than 1 s"
        # and afterwards, the webhook works as before
        assert "denied the request" in setup.apply(widget(setup.group, "big", setup.namespace, 11)).stderr
        assert setup.apply(widget(setup.group, "small", setup.namespace, 3)).returncode == 0
        # the refusals that cost the operator nothing, from the same running process
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        def status(head: str, data: bytes = b"") -> bytes:
            """The status line the running operator answers a raw request with."""
            with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10)) as tls:
                tls.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode() + data)
                return tls.recv(64).split(b"\r\n")[0]

        import gzip

        bomb = gzip.compress(body)  # 7 MiB inflated, a few KiB on the wire
        assert status(f"Content-Encoding: gzip\r\nContent-Length: {len(bomb)}\r\n", bomb).startswith(b"HTTP/1.1 415")
        assert status("Content-Length: 100000\r\n", b"[" * 100_000).startswith(b"HTTP/1.1 400")
        # announced as 100 MiB, nothing sent: refused before a byte of it is read
        assert status(f"Content-Length: {100 * 1024 * 1024}\r\n").startswith(b"HTTP/1.1 413")
        assert op.proc.poll() is None


DEEP_HANDLERS = '''
import os

import declop

GROUP = os.environ["WH_GROUP"]

@declop.validator(f"blobs.{GROUP}", failure_policy="Ignore")
def refuse_bad(obj, **_):
    if obj["spec"].get("bad"):
        raise declop.Rejected("bad blob")

@declop.mutator(f"blobs.{GROUP}", failure_policy="Ignore")
def stamp(obj, **_):
    obj["spec"]["checked"] = True
'''


def blob_crd(group: str) -> str:
    spec = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return json.dumps({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"blobs.{group}"},
        "spec": {"group": group, "scope": "Namespaced", "names": {"plural": "blobs", "singular": "blob", "kind": "Blob", "listKind": "BlobList"},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": spec}}}}]},
    })


def test_hostile_objects_through_the_apiserver_are_handled_or_denied_never_admitted_unchecked(setup: Setup, tmp_path: Path) -> None:
    """Objects nested 10, 500, 1,000 and 10,000 levels and one of 300,000 empty lists, created
    through the real apiserver against a validator and a mutator whose failurePolicy is Ignore
    (an HTTP 500 would admit them unchecked): each is either stored mutated (handled) or refused
    with a clear message — never stored without the mutator's stamp. (10,000 levels: the
    apiserver refuses it itself, Go's JSON depth limit.)"""
    setup.crd(blob_crd(setup.group))
    handlers = tmp_path / "deep.py"
    handlers.write_text(DEEP_HANDLERS)

    def nested(depth: int) -> Any:
        value: Any = "leaf"
        for _ in range(depth):
            value = {"n": value}
        return value

    def create(name: str, spec_json: str) -> subprocess.CompletedProcess[str]:
        body = tmp_path / f"{name}.json"
        body.write_text('{"apiVersion":"%s/v1","kind":"Blob","metadata":{"name":"%s"},"spec":%s}' % (setup.group, name, spec_json))
        uri = f"/apis/{setup.group}/v1/namespaces/{setup.namespace}/blobs"
        return kubectl(setup.env, "create", "--raw", uri, "-f", str(body), check=False)

    def deep_json(depth: int) -> str:  # built as text: json.dumps recurses once per level
        return '{"n":' * depth + '"leaf"' + "}" * depth

    with setup.operator(handlers=handlers) as op:
        op.wait_for_line("Registered MutatingWebhookConfiguration")
        wait_for(lambda: "bad blob" in create("probe", '{"bad":true}').stderr, 20, 0.2, "the validator to be enforced")
        outcomes = {}
        for depth in (10, 500, 1000, 10000):
            result = create(f"deep-{depth}", deep_json(depth))
            outcomes[depth] = result
            print(f"depth {depth}: rc={result.returncode} {result.stderr.strip()[:200]}")
        dense = create("dense", '{"x":[' + "[]," * 300_000 + "[]]}")
        print(f"300,000 empty lists: rc={dense.returncode} {dense.stderr.strip()[:200]}")

    def spec_of(name: str) -> str | None:
        """The stored object as the apiserver's text (kubectl get -o json would decode it)."""
        got = kubectl(setup.env, "get", "--raw", f"/apis/{setup.group}/v1/namespaces/{setup.namespace}/blobs/{name}", check=False)
        return got.stdout if got.returncode == 0 else None

    for depth in (10, 500):
        assert outcomes[depth].returncode == 0, outcomes[depth].stderr
        assert '"checked":true' in (spec_of(f"deep-{depth}") or ""), f"depth {depth} was stored without the mutator's stamp"
    assert outcomes[1000].returncode != 0
    assert "nested deeper than 512 levels" in outcomes[1000].stderr, outcomes[1000].stderr
    assert spec_of("deep-1000") is None
    assert outcomes[10000].returncode != 0 and spec_of("deep-10000") is None, "depth 10,000 was admitted"
    assert dense.returncode != 0 and spec_of("dense") is None, "the dense object was admitted unchecked"
    assert "RequestEntityTooLarge" in dense.stderr and "JSON objects and arrays" in dense.stderr, dense.stderr


FILTERED = '''
import os

import declop

GROUP = os.environ["WH_GROUP"]

@declop.validator(f"widgets.{GROUP}", subresource="status", operations=["UPDATE"])
def status_phase(obj, subresource, logger, **_):
    logger.info("status validating", object=obj["metadata"]["name"], subresource=subresource)
    if obj.get("status", {}).get("phase") == "Broken":
        raise declop.Rejected("Broken is not a phase", field="status.phase")

@declop.mutator(f"widgets.{GROUP}", subresource="scale", operations=["UPDATE"])
def cap_scale(obj, subresource, logger, **_):
    logger.info("scale mutating", object=obj["metadata"]["name"], kind=obj["kind"], apiVersion=obj["apiVersion"], subresource=subresource)
    obj["spec"]["replicas"] = min(obj["spec"]["replicas"], 3)

@declop.validator(f"widgets.{GROUP}", field="spec.replicas")
def replicas(obj, logger, **_):
    logger.info("replicas validating", object=obj["metadata"]["name"])
    if obj["spec"]["replicas"] > 3:
        raise declop.Rejected("must be at most 3", field="spec.replicas")
'''


def status_widget_crd(group: str) -> str:
    crd = json.loads(widget_crd(group))
    version = crd["spec"]["versions"][0]
    version["subresources"] = {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}}
    props = version["schema"]["openAPIV3Schema"]["properties"]
    props["spec"]["properties"]["replicas"] = {"type": "integer"}
    props["status"] = {"type": "object", "properties": {"phase": {"type": "string"}, "replicas": {"type": "integer"}}}
    return json.dumps(crd)


def test_status_and_scale_webhooks_see_their_subresource_only_and_a_field_filter_skips(setup: Setup, tmp_path: Path) -> None:
    """``subresource="status"``: a status write is denied while a main-resource write (which
    the apiserver stores without its status) neither reaches it nor is refused. ``field=``:
    objects without ``spec.replicas`` are admitted without a call. ``subresource="scale"``: the
    mutator gets a Scale, and a scale write reaches no main-resource webhook."""
    setup.crd(status_widget_crd(setup.group))
    handlers = tmp_path / "filtered.py"
    handlers.write_text(FILTERED)
    with setup.operator(handlers=handlers) as op:
        op.wait_for_line("Registered ValidatingWebhookConfiguration")
        config = json.loads(kubectl(setup.env, "get", "validatingwebhookconfiguration", setup.name, "-o", "json").stdout)
        assert {w["name"].split(".")[0]: w["rules"][0]["resources"] for w in config["webhooks"]} == {
            "status-phase": ["widgets/status"], "replicas": ["widgets"],
        }
        probe = json.dumps({"apiVersion": f"{setup.group}/v1", "kind": "Widget",
                            "metadata": {"name": "probe", "namespace": setup.namespace}, "spec": {"replicas": 9}})
        wait_for(lambda: "denied the request" in setup.apply(probe, "--dry-run=server").stderr, 20, 0.2, "the validators to be enforced")

        # field=: no spec.replicas, no call; with it, the handler decides
        assert setup.apply(widget(setup.group, "plain", setup.namespace, 1)).returncode == 0
        counted = json.loads(probe)
        counted["metadata"]["name"], counted["spec"]["replicas"] = "counted", 2
        assert setup.apply(json.dumps(counted)).returncode == 0
        wait_for(lambda: [r for r in records(op, "replicas validating") if r["object"] == "counted"], 10, what="the call for counted")
        skipped = wait_for(lambda: [r for r in records(op, "Skipped") if r["name"] == "plain"], 10, what="the skip of plain")
        assert skipped[0]["webhook"] == f"replicas.widgets.{setup.group}" and skipped[0]["reason"] == "filters"
        assert not [r for r in records(op, "replicas validating") if r["object"] == "plain"]

        # the main resource: a spec write carrying a status passes (the apiserver drops the
        # status of a main-resource write) and does not reach the status validator
        patch = ["patch", f"widgets.{setup.group}", "plain", "-n", setup.namespace, "--type=merge"]
        main = kubectl(setup.env, *patch, "-p", '{"spec": {"size": 2}, "status": {"phase": "Broken"}}', check=False)
        assert main.returncode == 0, main.stderr
        stored = get(setup, f"widgets.{setup.group}", "plain")
        assert stored["spec"]["size"] == 2 and "status" not in stored

        # subresource="status": the status write is denied, another status allowed
        denied = kubectl(setup.env, *patch, "--subresource=status", "-p", '{"status": {"phase": "Broken"}}', check=False)
        assert denied.returncode != 0
        assert (
            f'admission webhook "status-phase.widgets.{setup.group}" denied the request: status.phase: Broken is not a phase'
        ) in denied.stderr, denied.stderr
        kubectl(setup.env, *patch, "--subresource=status", "-p", '{"status": {"phase": "Ready"}}')
        assert get(setup, f"widgets.{setup.group}", "plain")["status"] == {"phase": "Ready"}
        # in order: a call for the main write would have been logged before these two
        calls = wait_for(lambda: [r for r in records(op, "status validating") if r["object"] == "plain"][1:] and
                         [r["subresource"] for r in records(op, "status validating") if r["object"] == "plain"], 10, what="two status calls")
        assert calls == ["status", "status"]

        # subresource="scale": the mutator gets an autoscaling/v1 Scale and its patch is applied;
        # the main resource's validator (at most 3) is not called for a scale write at all
        kubectl(setup.env, "scale", f"widgets.{setup.group}", "counted", "-n", setup.namespace, "--replicas=9")
        assert get(setup, f"widgets.{setup.group}", "counted")["spec"]["replicas"] == 3
        (scaled,) = wait_for(lambda: records(op, "scale mutating"), 10, what="the scale mutator's call")
        assert (scaled["kind"], scaled["apiVersion"], scaled["subresource"]) == ("Scale", "autoscaling/v1", "scale")
        # a later write's line: every line of the scale write has been read by then
        kubectl(setup.env, "patch", f"widgets.{setup.group}", "counted", "-n", setup.namespace, "--type=merge",
                "--subresource=status", "-p", '{"status": {"phase": "Ready"}}')
        wait_for(lambda: [r for r in records(op, "status validating") if r["object"] == "counted"], 10, what="the marker write")
        assert len([r for r in records(op, "replicas validating") if r["object"] == "counted"]) == 1  # its CREATE only
