"""declop.webhooks.configuration: the configuration objects the operator applies."""

from __future__ import annotations

import base64

import pytest

import declop
from declop.kube.discovery import ResourceInfo
from declop.errors import ConfigError
from declop.registry import Registry
from declop.typed.model import CustomResource
from declop.webhooks.configuration import ClientConfig, configuration, conversion_patch, parse_service

WIDGETS = ResourceInfo("example.com", "v1", "widgets", "Widget", True)


def hooks(**options):
    reg = Registry()
    declop.validator("widgets.example.com", registry=reg, **options)(lambda obj: None)
    return [(reg.webhooks[0], WIDGETS)]


def test_validating_configuration_with_url():
    client = ClientConfig(b"CA", url="https://127.0.0.1:9443")
    config = configuration("validator", "my-op", hooks(failure_policy="Ignore", timeout=5, labels="tier=web"), client, "ops")
    assert config["kind"] == "ValidatingWebhookConfiguration" and config["metadata"]["name"] == "my-op"
    (entry,) = config["webhooks"]
    assert entry == {
        "name": "lambda.widgets.example.com",
        "clientConfig": {"caBundle": base64.b64encode(b"CA").decode(), "url": "https://127.0.0.1:9443/validate/lambda.widgets.example.com"},
        "rules": [{"apiGroups": ["example.com"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["widgets"], "scope": "Namespaced"}],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "failurePolicy": "Ignore",
        "timeoutSeconds": 5,
        "matchPolicy": "Equivalent",
        "namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "kube-public", "kube-node-lease", "ops"]}
        ]},
        "objectSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]},
    }


def test_service_client_config_and_hosts():
    client = ClientConfig(b"CA", service_namespace="ops", service_name="op-webhook", service_port=443)
    assert client.for_path("/validate/x")["service"] == {"namespace": "ops", "name": "op-webhook", "port": 443, "path": "/validate/x"}
    assert client.hosts == ["op-webhook.ops.svc", "op-webhook.ops.svc.cluster.local", "op-webhook.ops", "op-webhook"]
    assert ClientConfig(b"", url="https://10.0.0.5:9443").hosts == ["10.0.0.5", "localhost", "127.0.0.1"]


def test_parse_service():
    assert parse_service("ops/op-webhook") == ("ops", "op-webhook", 443)
    assert parse_service("ops/op-webhook:8443") == ("ops", "op-webhook", 8443)
    for bad in ("op-webhook", "ops/", "ops/x:port", "ops/x:0"):
        with pytest.raises(ConfigError, match="is not NAMESPACE/NAME\\[:PORT\\]"):
            parse_service(bad)


def test_conversion_patch():
    reg = Registry()
    declop.converter("widgets.example.com", registry=reg)(lambda obj: obj)
    patch = conversion_patch(reg.webhooks[0], ClientConfig(b"CA", url="https://127.0.0.1:9443/"))
    assert patch["spec"]["conversion"]["strategy"] == "Webhook"
    webhook = patch["spec"]["conversion"]["webhook"]
    assert webhook["conversionReviewVersions"] == ["v1"]
    assert webhook["clientConfig"]["url"] == "https://127.0.0.1:9443/convert/lambda.widgets.example.com"


def test_out_of_a_cluster_only_the_system_namespaces_are_spared():
    reg = Registry()
    declop.mutator("widgets.example.com", registry=reg)(lambda obj: None)
    config = configuration("mutator", "my-op", [(reg.webhooks[0], WIDGETS)], ClientConfig(b"CA", url="https://127.0.0.1:9443"), None)
    (entry,) = config["webhooks"]
    assert entry["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "kube-public", "kube-node-lease"]}
    ]}
    assert config["kind"] == "MutatingWebhookConfiguration"


def test_system_namespaces_opt_in_keeps_the_operators_own_namespace_out():
    client = ClientConfig(b"CA", url="https://127.0.0.1:9443")
    (entry,) = configuration("validator", "my-op", hooks(system_namespaces=True), client, "ops")["webhooks"]
    assert entry["namespaceSelector"]["matchExpressions"] == [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["ops"]}]
    (entry,) = configuration("validator", "my-op", hooks(system_namespaces=True), client, None)["webhooks"]
    assert "namespaceSelector" not in entry
    # an operator running in kube-system is not listed twice
    (entry,) = configuration("validator", "my-op", hooks(), client, "kube-system")["webhooks"]
    assert entry["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "kube-public", "kube-node-lease"]


def test_apply_sends_both_configurations_and_the_crd_patch():
    import asyncio

    from declop.errors import ApiError
    from declop.webhooks.configuration import apply_configurations

    reg = Registry()
    declop.validator("widgets.example.com", registry=reg)(lambda obj: None)
    declop.converter("widgets.example.com", registry=reg)(lambda obj: obj)
    sent = []

    async def request(method, path, **kw):
        sent.append((method, path, kw.get("params"), kw.get("content_type"), kw.get("body")))

    client = ClientConfig(b"CA", url="https://127.0.0.1:9443")
    asyncio.run(apply_configurations(request, "my-op", [(h, WIDGETS) for h in reg.webhooks], client, "ops"))
    assert [(m, p, q, c) for m, p, q, c, _ in sent] == [
        ("PATCH", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/my-op",
         {"fieldManager": "declop-webhooks", "force": "true"}, "application/apply-patch+yaml"),
        ("PATCH", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/my-op",
         {"fieldManager": "declop-webhooks", "force": "true"}, "application/apply-patch+yaml"),
        ("PATCH", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com", None, "application/merge-patch+json"),
    ]
    assert [w["name"] for w in sent[0][4]["webhooks"]] == ["lambda.widgets.example.com"]
    assert sent[1][4]["webhooks"] == []  # applied empty: entries of removed mutators go away

    async def refuse(method, path, **kw):
        raise ApiError(403, "Forbidden", "validatingwebhookconfigurations.admissionregistration.k8s.io \"my-op\" is forbidden")

    with pytest.raises(ConfigError, match=r"^cannot apply the ValidatingWebhookConfiguration 'my-op': validatingwebhookconfigurations"):
        asyncio.run(apply_configurations(refuse, "my-op", [(h, WIDGETS) for h in reg.webhooks], client, "ops"))


@pytest.mark.parametrize(
    "error",
    [
        # what the apiserver answers an apply to a missing configuration under the chart's RBAC
        # (patch on the name, no create): the apply would create it, and create is refused
        (403, "Forbidden", 'validatingwebhookconfigurations.admissionregistration.k8s.io "my-op" is forbidden: User '
         '"system:serviceaccount:ops:op-declop" cannot create resource "validatingwebhookconfigurations" in API group '
         '"admissionregistration.k8s.io" at the cluster scope'),
        (404, "NotFound", 'validatingwebhookconfigurations.admissionregistration.k8s.io "my-op" not found'),
    ],
    ids=["403 cannot create", "404"],
)  # fmt: skip
def test_a_missing_configuration_says_the_chart_makes_it(error):
    import asyncio

    from declop.errors import ApiError
    from declop.webhooks.configuration import apply_configurations

    async def refuse(method, path, **kw):
        raise ApiError(*error)

    with pytest.raises(ConfigError) as info:
        asyncio.run(apply_configurations(refuse, "my-op", hooks(), ClientConfig(b"CA", url="https://127.0.0.1:9443"), "ops"))
    assert str(info.value) == (
        "the ValidatingWebhookConfiguration 'my-op' does not exist and this operator may not create it: the chart "
        "creates it (empty) at install; if it was deleted, `helm upgrade` the release to restore it (without the "
        f"chart: create it, or grant create on validatingwebhookconfigurations) ({error[0]} {error[1]})"
    )


class TypedWidget(CustomResource, group="example.com", version="v1", kind="Widget"):
    pass


def test_a_typed_validator_or_mutator_is_sent_its_models_version_only():
    """``obj: Widget`` is one version's model: with ``matchPolicy: Equivalent`` the apiserver
    converts an object written at another version to that one before calling the webhook (and
    converts a mutator's patched object back), so the model never reads another version's fields."""
    def check(obj: TypedWidget) -> None: ...

    reg = Registry()
    declop.validator(TypedWidget, registry=reg)(check)
    declop.mutator(TypedWidget, registry=reg)(check)
    declop.mutator("widgets.example.com", registry=reg)(lambda obj: None)
    client = ClientConfig(b"CA", url="https://127.0.0.1:9443")
    for kind, expected in (("validator", [["v1"]]), ("mutator", [["v1"], ["*"]])):
        config = configuration(kind, "my-op", [(h, WIDGETS) for h in reg.webhooks if h.kind == kind], client, None)
        assert [e["rules"][0]["apiVersions"] for e in config["webhooks"]] == expected
        assert all(e["matchPolicy"] == "Equivalent" for e in config["webhooks"])
