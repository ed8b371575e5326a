"""The CRD generated from typed models, judged by the real apiserver: applied with kubectl it
becomes Established; a valid object is stored with its defaults filled in; invalid ones are
refused with the field named (a bound, an enum, a CEL rule, a wrong type); an int-or-string
takes both; a kind with two versions serves both from its one storage version."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

from declop.typed.crd import definitions, dump
from declop.typed.model import Column, CustomResource, FreeForm, IntOrString, ListType, Rule

GROUP = "typed.declop.example.com"


class Condition(BaseModel):
    type: str = Field(min_length=1)
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    lastTransitionTime: datetime


class GaugeSpec(BaseModel):
    """What a Gauge measures."""

    replicas: int = Field(1, ge=0, le=10, description="Bounded.")
    mode: Literal["fast", "slow"] = "fast"
    port: IntOrString = 80
    even: Annotated[int, Rule("self % 2 == 0", message="even must be an even number")] = 0
    image: str = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    extra: FreeForm = Field(default_factory=dict)
    owner: str | None = None
    tier: Literal["gold", "silver"] | None = None


class GaugeStatus(BaseModel):
    observedGeneration: int | None = None
    conditions: Annotated[list[Condition], ListType("map", keys=("type",))] = Field(default_factory=list)


class Gauge(
    CustomResource,
    group=GROUP,
    version="v1",
    kind="Gauge",
    short_names=("gg",),
    printer_columns=(Column("Replicas", ".spec.replicas", type="integer"),),
    rules=(Rule("self.spec.replicas == 0 || self.spec.image != 'none'", message="a Gauge with replicas runs an image"),),
):
    spec: GaugeSpec
    status: GaugeStatus | None = None


class SprocketPort(BaseModel):
    name: str = "http"
    number: int = Field(80, ge=1)


class SprocketSpec(BaseModel):
    replicas: int = Field(1, ge=0)
    image: str = "nginx:1.27"
    secretName: str | None = None
    ports: list[SprocketPort] = Field(default_factory=lambda: [SprocketPort()])
    labels: dict[str, str] = Field(default_factory=dict)


class Sprocket(CustomResource, group=GROUP, version="v1", kind="Sprocket"):
    """The examples' spelling: the spec a default_factory, so an object may leave it out."""

    spec: SprocketSpec = Field(default_factory=SprocketSpec)


class DialSpec(BaseModel):
    size: int = Field(1, ge=1)


class DialV1(CustomResource, group=GROUP, version="v1", kind="Dial"):
    spec: DialSpec


class DialV1beta1(CustomResource, group=GROUP, version="v1beta1", kind="Dial", storage=False):
    spec: DialSpec


CRDS = definitions([Gauge, Sprocket, DialV1, DialV1beta1])


def kubectl(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", *args], env=env, input=stdin, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def env(control_plane: Any) -> Iterator[dict[str, str]]:
    """The generated CRDs, applied with kubectl and Established; deleted afterwards."""
    environment: dict[str, str] = control_plane.env()
    applied = kubectl(environment, "apply", "-f", "-", stdin=dump(CRDS))
    assert applied.returncode == 0, applied.stderr
    names = [f"crd/{c['metadata']['name']}" for c in CRDS]
    established = kubectl(environment, "wait", "--for=condition=Established", *names, "--timeout=30s")
    assert established.returncode == 0, established.stderr
    try:
        yield environment
    finally:
        kubectl(environment, "delete", *names, "--ignore-not-found", "--wait=false")


def gauge(name: str, **spec: Any) -> str:
    return json.dumps({"apiVersion": f"{GROUP}/v1", "kind": "Gauge", "metadata": {"name": name}, "spec": {"image": "nginx", **spec}})


def create(env: dict[str, str], namespace: str, manifest: str) -> subprocess.CompletedProcess[str]:
    return kubectl(env, "create", "-n", namespace, "-f", "-", stdin=manifest)


def test_the_crds_are_established_with_their_names(env: dict[str, str]) -> None:
    crd = json.loads(kubectl(env, "get", "crd", f"gauges.{GROUP}", "-o", "json").stdout)
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True" and conditions["NamesAccepted"] == "True"
    assert crd["status"]["acceptedNames"]["shortNames"] == ["gg"]
    assert "NonStructuralSchema" not in conditions


def test_a_valid_object_is_stored_with_defaults_applied(env: dict[str, str], namespace: str) -> None:
    created = create(env, namespace, gauge("plain"))
    assert created.returncode == 0, created.stderr
    stored = json.loads(kubectl(env, "get", "gauge", "plain", "-n", namespace, "-o", "json").stdout)
    assert stored["spec"] == {"image": "nginx", "replicas": 1, "mode": "fast", "port": 80, "even": 0, "labels": {}, "extra": {}}
    printed = kubectl(env, "get", "gg", "plain", "-n", namespace).stdout  # the short name and the column
    assert printed.split("\n")[0].split() == ["NAME", "REPLICAS"] and printed.split("\n")[1].split() == ["plain", "1"]


def test_an_object_applied_without_spec_is_stored_with_the_default_factorys_spec(env: dict[str, str], namespace: str) -> None:
    """``spec: SprocketSpec = Field(default_factory=SprocketSpec)``: what Python would read is
    what the apiserver stores, nested defaults and the list's default item included."""
    manifest = json.dumps({"apiVersion": f"{GROUP}/v1", "kind": "Sprocket", "metadata": {"name": "bare"}})
    applied = kubectl(env, "apply", "-n", namespace, "-f", "-", stdin=manifest)
    assert applied.returncode == 0, applied.stderr
    stored = json.loads(kubectl(env, "get", "sprocket", "bare", "-n", namespace, "-o", "json").stdout)
    assert stored["spec"] == {"replicas": 1, "image": "nginx:1.27", "ports": [{"name": "http", "number": 80}], "labels": {}}
    assert Sprocket.model_validate(stored).spec == SprocketSpec()
    partial = json.dumps({"apiVersion": f"{GROUP}/v1", "kind": "Sprocket", "metadata": {"name": "partial"}, "spec": {"ports": [{"number": 8080}]}})
    assert kubectl(env, "apply", "-n", namespace, "-f", "-", stdin=partial).returncode == 0
    stored = json.loads(kubectl(env, "get", "sprocket", "partial", "-n", namespace, "-o", "json").stdout)
    assert stored["spec"] == {"replicas": 1, "image": "nginx:1.27", "ports": [{"name": "http", "number": 8080}], "labels": {}}


def test_the_status_subresource_keeps_the_typed_status(env: dict[str, str], namespace: str) -> None:
    assert create(env, namespace, gauge("with-status")).returncode == 0
    status = {"status": {"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-02T03:04:05Z"}]}}
    patched = kubectl(env, "patch", "gauge", "with-status", "-n", namespace, "--subresource=status", "--type=merge", "-p", json.dumps(status))
    assert patched.returncode == 0, patched.stderr
    stored = json.loads(kubectl(env, "get", "gauge", "with-status", "-n", namespace, "-o", "json").stdout)
    assert stored["status"]["conditions"] == [{"type": "Ready", "status": "True", "reason": "", "lastTransitionTime": "2026-01-02T03:04:05Z"}]
    wrong = {"status": {"conditions": [{"type": "Ready", "status": "Maybe", "lastTransitionTime": "2026-01-02T03:04:05Z"}]}}
    refused = kubectl(env, "patch", "gauge", "with-status", "-n", namespace, "--subresource=status", "--type=merge", "-p", json.dumps(wrong))
    assert refused.returncode != 0 and "status.conditions[0].status" in refused.stderr and "Unsupported value" in refused.stderr


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        ({"replicas": 11}, "spec.replicas", "should be less than or equal to 10"),
        ({"replicas": -1}, "spec.replicas", "should be greater than or equal to 0"),
        ({"mode": "medium"}, "spec.mode", 'Unsupported value: "medium"'),
        ({"even": 3}, "spec.even", "even must be an even number"),
        ({"replicas": "many"}, "spec.replicas", "must be of type integer"),
        ({"labels": {"a": 1}}, "spec.labels.a", "must be of type string"),
        ({"image": ""}, "spec.image", "should be at least 1 chars long"),
        ({"image": "none"}, "<nil>", "a Gauge with replicas runs an image"),
    ],
    ids=["above-maximum", "below-minimum", "enum", "cel-rule", "wrong-type", "dict-value-type", "min-length", "root-rule"],
)
def test_an_invalid_object_is_refused_naming_the_field(env: dict[str, str], namespace: str, spec: dict[str, Any], field: str, says: str) -> None:
    refused = create(env, namespace, gauge("bad", **spec))
    assert refused.returncode != 0
    assert "is invalid" in refused.stderr and field in refused.stderr and says in refused.stderr, refused.stderr


def test_a_missing_required_field_is_refused_naming_it(env: dict[str, str], namespace: str) -> None:
    manifest = json.dumps({"apiVersion": f"{GROUP}/v1", "kind": "Gauge", "metadata": {"name": "no-image"}, "spec": {}})
    refused = create(env, namespace, manifest)
    assert refused.returncode != 0 and "spec.image: Required value" in refused.stderr, refused.stderr


def test_int_or_string_takes_both_and_free_form_keeps_what_it_is_given(env: dict[str, str], namespace: str) -> None:
    assert create(env, namespace, gauge("by-number", port=8080)).returncode == 0
    assert create(env, namespace, gauge("by-name", port="http", extra={"any": {"thing": [1, "two"]}})).returncode == 0
    by_name = json.loads(kubectl(env, "get", "gauge", "by-name", "-n", namespace, "-o", "json").stdout)
    by_number = json.loads(kubectl(env, "get", "gauge", "by-number", "-n", namespace, "-o", "json").stdout)
    assert (by_number["spec"]["port"], by_name["spec"]["port"]) == (8080, "http")
    assert by_name["spec"]["extra"] == {"any": {"thing": [1, "two"]}}


def test_a_misspelt_field_is_refused_by_kubectl_and_pruned_without_validation(env: dict[str, str], namespace: str) -> None:
    """No preserve-unknown-fields outside FreeForm: kubectl's strict field validation names the
    typo; a client that skips validation gets it dropped, never stored."""
    refused = create(env, namespace, gauge("typo", replicsa=3))
    assert refused.returncode != 0 and 'unknown field "spec.replicsa"' in refused.stderr, refused.stderr
    created = kubectl(env, "create", "-n", namespace, "--validate=false", "-f", "-", stdin=gauge("pruned", replicsa=3))
    assert created.returncode == 0, created.stderr
    stored = json.loads(kubectl(env, "get", "gauge", "pruned", "-n", namespace, "-o", "json").stdout)
    assert "replicsa" not in stored["spec"]


def test_an_optional_field_takes_null(env: dict[str, str], namespace: str) -> None:
    created = create(env, namespace, gauge("nulled", owner=None, tier=None))
    assert created.returncode == 0, created.stderr
    stored = json.loads(kubectl(env, "get", "gauge", "nulled", "-n", namespace, "-o", "json").stdout)
    assert stored["spec"]["owner"] is None and "tier" not in stored["spec"]  # nullable kept; an enum's null pruned
    assert create(env, namespace, gauge("gold", tier="gold")).returncode == 0
    refused = create(env, namespace, gauge("bronze", tier="bronze"))
    assert refused.returncode != 0 and "spec.tier" in refused.stderr and 'Unsupported value: "bronze"' in refused.stderr


def test_two_versions_one_storage_both_served(env: dict[str, str], namespace: str) -> None:
    dial = {"apiVersion": f"{GROUP}/v1beta1", "kind": "Dial", "metadata": {"name": "d"}, "spec": {}}
    created = create(env, namespace, json.dumps(dial))
    assert created.returncode == 0, created.stderr
    for version in ("v1", "v1beta1"):
        got = json.loads(kubectl(env, "get", f"dials.{version}.{GROUP}", "d", "-n", namespace, "-o", "json").stdout)
        assert (got["apiVersion"], got["spec"]) == (f"{GROUP}/{version}", {"size": 1})
    crd = json.loads(kubectl(env, "get", "crd", f"dials.{GROUP}", "-o", "json").stdout)
    assert crd["status"]["storedVersions"] == ["v1"]


class KnobSpec(BaseModel):
    turns: int = 0


class KnobV1(CustomResource, group=GROUP, version="v1", kind="Knob"):
    spec: KnobSpec


class KnobV2(CustomResource, group=GROUP, version="v2", kind="Knob", storage=False):
    spec: KnobSpec


def test_the_conversion_webhook_wired_by_declop_crd_is_completed_by_the_operator_and_kept_by_a_re_apply(control_plane: Any) -> None:
    """`declop crd` writes spec.conversion without a caBundle; the apiserver accepts it; the
    operator's start patches the caBundle in (its merge patch, as apply_configurations sends
    it); a later server-side apply of the same CRD (`declop dev`) keeps that caBundle."""
    from declop.webhooks.certs import CertAuthority
    from declop.webhooks.configuration import ClientConfig, conversion_patch
    from declop.webhooks.declaration import make_webhook

    env = control_plane.env()
    hook = make_webhook(lambda obj, **_: None, "converter", f"knobs.{GROUP}", name=f"convert.knobs.{GROUP}")
    config = {"url": f"https://127.0.0.1:9443{hook.path}"}
    (crd,) = definitions([KnobV1, KnobV2], conversions={f"knobs.{GROUP}": config})
    name = crd["metadata"]["name"]
    try:
        applied = kubectl(env, "apply", "--server-side", "--field-manager=declop-dev", "--force-conflicts", "-f", "-", stdin=dump([crd]))
        assert applied.returncode == 0, applied.stderr
        assert kubectl(env, "wait", "--for=condition=Established", f"crd/{name}", "--timeout=30s").returncode == 0

        ca = CertAuthority.generate("declop test CA")
        patch = conversion_patch(hook, ClientConfig(ca.cert_pem, url="https://127.0.0.1:9443"))
        patched = kubectl(env, "patch", "crd", name, "--type=merge", "-p", json.dumps(patch))
        assert patched.returncode == 0, patched.stderr

        again = kubectl(env, "apply", "--server-side", "--field-manager=declop-dev", "--force-conflicts", "-f", "-", stdin=dump([crd]))
        assert again.returncode == 0, again.stderr
        conversion = json.loads(kubectl(env, "get", "crd", name, "-o", "json").stdout)["spec"]["conversion"]
        assert conversion["strategy"] == "Webhook"
        assert conversion["webhook"]["clientConfig"]["url"] == config["url"]
        assert conversion["webhook"]["clientConfig"]["caBundle"] == patch["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"]
    finally:
        kubectl(env, "delete", "crd", name, "--ignore-not-found", "--wait=false")
