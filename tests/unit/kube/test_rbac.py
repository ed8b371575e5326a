"""declop.kube.rbac: names → API group and resource, the grants a set of registrations needs,
their verbs against the chart's permissions.json, and deterministic rendering."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import declop
from declop.errors import RegistrationError
from declop.kube.rbac import (
    CLUSTER,
    WATCHED,
    Grant,
    Permission,
    Source,
    group_resource,
    manifests,
    needs,
    reasons,
    rules,
    to_yaml,
    values,
)
from declop.registry import Registry

PERMISSIONS = json.loads((Path(__file__).resolve().parents[3] / "charts" / "declop" / "files" / "permissions.json").read_text())


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("pods", ("", "pods")),
        ("configmaps", ("", "configmaps")),
        ("pods.v1", ("", "pods")),
        ("deployments", ("apps", "deployments")),
        ("deployments.apps", ("apps", "deployments")),
        ("deployments.v1.apps", ("apps", "deployments")),
        ("cronjobs.batch", ("batch", "cronjobs")),
        ("ingresses.networking.k8s.io", ("networking.k8s.io", "ingresses")),
        ("widgets.example.com", ("example.com", "widgets")),
        ("widgets.v1.example.com", ("example.com", "widgets")),  # what a typed model registers
        ("widgets.v1alpha1.example.com", ("example.com", "widgets")),
        ("widgets.v2beta3.ops.example.com", ("ops.example.com", "widgets")),
        ("volumes.vendor.io", ("vendor.io", "volumes")),  # 'vendor' is not a version
        ("widgets.example.com/status", ("example.com", "widgets/status")),
        (" Pods ", ("", "pods")),
    ],
)
def test_group_resource_reads_names_as_the_apiserver_does(name: str, expected: tuple[str, str]) -> None:
    assert group_resource(name) == expected


def verbs(grants: list[Grant], group: str, resource: str, *, where: Any = WATCHED, name: str = "") -> list[str]:
    return [g.verb for g in grants if (g.where, g.group, g.resource, g.name) == (where, group, resource, name)]


def test_the_primary_and_every_source_gets_exactly_the_verbs_declop_sends() -> None:
    grants = needs(
        [Source("widgets.v1.example.com", finalizer=True, owns=("configmaps",), watches=("secrets",), name="w")],
        reads=["pods"],
    )
    assert verbs(grants, "example.com", "widgets") == PERMISSIONS["watch"]["verbs"] + PERMISSIONS["finalizers"]["verbs"]
    assert verbs(grants, "example.com", "widgets/status") == ["update", "patch"]  # sorted like PERMISSIONS["status"]
    assert set(verbs(grants, "example.com", "widgets/status")) == set(PERMISSIONS["status"]["verbs"])
    assert verbs(grants, "example.com", "widgets/finalizers") == ["update"]  # blockOwnerDeletion on the children
    assert verbs(grants, "", "configmaps") == ["get", "list", "watch", "create", "update", "patch", "delete"]
    assert verbs(grants, "", "secrets") == ["get", "list", "watch"]
    assert verbs(grants, "", "pods") == ["get", "list", "watch"]
    assert verbs(grants, PERMISSIONS["events"]["apiGroup"], "events") == PERMISSIONS["events"]["verbs"]
    # declop sends the reads and the finalizer patch itself; the handler may or may not write
    required = {(g.resource, g.verb) for g in grants if g.required}
    assert ("widgets", "patch") in required and ("configmaps", "list") in required
    assert not {("configmaps", "create"), ("widgets/status", "patch"), ("events", "create")} & required


def test_no_finalizer_no_patch_and_a_builtin_primary_gets_no_status() -> None:
    grants = needs([Source("deployments.apps")])
    assert verbs(grants, "apps", "deployments") == ["get", "list", "watch"]
    assert not [g for g in grants if "/" in g.resource]


def test_leases_webhooks_and_the_ca_secret_match_the_chart() -> None:
    grants = needs(
        [Source("pods")], leader=("ops", "my-lease"), webhook_name="ops-op", admission=True,
        converters=["widgets.v1.example.com"], ca_secret_namespace="ops",
    )  # fmt: skip
    lease = PERMISSIONS["lease"]
    assert verbs(grants, lease["apiGroup"], "leases", where="ops") == lease["unnamed"]
    assert verbs(grants, lease["apiGroup"], "leases", where="ops", name="my-lease") == lease["named"]
    hooks = PERMISSIONS["webhookConfigurations"]
    for resource in hooks["resources"]:
        assert verbs(grants, hooks["apiGroup"], resource, where=CLUSTER, name="ops-op") == hooks["named"]
        assert verbs(grants, hooks["apiGroup"], resource, where=CLUSTER) == []  # never create
    conversion = PERMISSIONS["conversion"]
    assert verbs(grants, conversion["apiGroup"], conversion["resource"], where=CLUSTER, name="widgets.example.com") == conversion["named"]
    ca = PERMISSIONS["webhookCA"]
    assert verbs(grants, ca["apiGroup"], ca["resource"], where="ops", name="ops-op-webhook-ca") == ca["named"]
    assert verbs(grants, ca["apiGroup"], ca["resource"], where="ops") == []
    sharded = needs([Source("pods")], shards="ops")
    assert verbs(sharded, "coordination.k8s.io", "leases", where="ops") == ["get", "list", "create", "update", "delete"]


def test_permissions_are_granted_and_validated_in_one_line() -> None:
    grants = needs([Source("pods", permissions=(Permission("create", "configmaps"), Permission("get", "secrets", "creds")))])
    assert verbs(grants, "", "configmaps") == ["create"]
    assert verbs(grants, "", "secrets", name="creds") == ["get"]
    assert all(g.required for g in grants if g.resource in ("configmaps", "secrets"))
    with pytest.raises(RegistrationError, match=r"^permissions=: unknown verb 'craete'; use one of get, list"):
        Permission("craete", "configmaps")
    with pytest.raises(RegistrationError, match=r"no wildcards"):
        Permission("get", "*")
    with pytest.raises(RegistrationError, match=r"name must be an object name"):
        Permission("get", "secrets", "Not A Name")


def test_the_decorator_takes_permissions_as_tuples_and_refuses_a_bare_tuple() -> None:
    registry = Registry()

    @declop.reconciler("pods", registry=registry, permissions=[("create", "configmaps"), ("get", "secrets", "creds")])
    def handler(request: Any) -> None: ...

    assert registry.registrations[0].permissions == (Permission("create", "configmaps"), Permission("get", "secrets", "creds"))
    assert verbs(registry.grants(), "", "configmaps") == ["create"]
    with pytest.raises(RegistrationError, match=r"^permissions= is a list of \('verb', 'resource'\) tuples"):
        declop.reconciler("pods", registry=registry, permissions=("create", "configmaps"))  # type: ignore[arg-type]
    with pytest.raises(RegistrationError, match=r"^permissions= entries are \('verb', 'resource'\)"):
        declop.reconciler("pods", registry=registry, permissions=["create configmaps"])  # type: ignore[list-item]


def test_the_registry_turns_indexes_transforms_and_webhooks_into_grants() -> None:
    registry = Registry()
    registry.index("nodes", "by-zone", lambda o: [])
    registry.transform("secrets", lambda o: o)

    @declop.validator("configmaps", registry=registry)
    def check(obj: Any) -> None: ...

    grants = registry.grants(webhook_name="w", ca_secret_namespace="ops")
    assert verbs(grants, "", "nodes") == verbs(grants, "", "secrets") == ["get", "list", "watch"]
    assert verbs(grants, "admissionregistration.k8s.io", "validatingwebhookconfigurations", where=CLUSTER, name="w") == ["patch"]
    assert verbs(grants, "", "secrets", where="ops", name="w-webhook-ca") == ["get", "update"]
    assert verbs(grants, "events.k8s.io", "events") == []  # no reconciler: no client to send Events


def test_rules_merge_verbs_per_resource_in_one_order() -> None:
    grants = needs([Source("widgets.example.com", finalizer=True, owns=("configmaps",))])
    assert rules(grants)[0] == {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}
    assert [r["resources"][0] for r in rules(grants)] == ["configmaps", "events", "widgets", "widgets/finalizers", "widgets/status"]


def test_output_is_the_same_whatever_the_order_of_declaration() -> None:
    a = needs([Source("pods", owns=("secrets",)), Source("widgets.example.com", finalizer=True)], leader=("ns", "l"))
    b = needs([Source("widgets.example.com", finalizer=True), Source("pods", owns=("secrets",))], leader=("ns", "l"))
    assert to_yaml(manifests(a)) == to_yaml(manifests(b))


def test_manifests_a_role_per_watched_namespace_and_bindings() -> None:
    grants = needs([Source("pods")], leader=("ops", "l"), webhook_name="w", admission=True, ca_secret_namespace="ops")
    docs = manifests(grants, name="op", namespaces=("b", "a"), service_account=("ops", "op-sa"))
    kinds = [(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) for d in docs]
    assert kinds == [
        ("ClusterRole", "op-cluster", None), ("ClusterRoleBinding", "op-cluster", None),
        ("Role", "op", "a"), ("RoleBinding", "op", "a"),
        ("Role", "op", "b"), ("RoleBinding", "op", "b"),
        ("Role", "op", "ops"), ("RoleBinding", "op", "ops"),  # the Lease and the webhook CA
    ]  # fmt: skip
    assert docs[1]["subjects"] == [{"kind": "ServiceAccount", "name": "op-sa", "namespace": "ops"}]
    # watching all namespaces: the cluster-scoped webhook configurations join the one ClusterRole
    cluster = manifests(grants, name="op")
    assert [(d["kind"], d["metadata"].get("namespace")) for d in cluster] == [("ClusterRole", None), ("Role", "ops")]
    assert {r["resources"][0] for r in cluster[0]["rules"]} == {"pods", "events", "validatingwebhookconfigurations", "mutatingwebhookconfigurations"}
    # a watched namespace that also holds the Lease: one Role there with both
    merged = manifests(grants, name="op", namespaces=("ops",))
    assert [(d["kind"], d["metadata"].get("namespace")) for d in merged] == [("ClusterRole", None), ("Role", "ops")]
    assert {r["resources"][0] for r in merged[1]["rules"]} == {"pods", "events", "leases", "secrets"}


def test_to_yaml_writes_verbs_on_one_line_and_parses_back() -> None:
    docs = manifests(needs([Source("pods")]))
    text = to_yaml(docs, header="generated")
    assert text.startswith("# generated\n---\n")
    assert "  verbs: [get, list, watch]\n" in text
    assert list(yaml.safe_load_all(text)) == docs


def test_values_hold_the_watched_rules_and_the_converters_crds() -> None:
    grants = needs([Source("pods")], leader=("ops", "l"), webhook_name="w", converters=["widgets.v1.example.com"])
    out = values(grants, webhooks=True)
    assert out["rbac"]["generated"] == rules(g for g in grants if g.where is WATCHED)
    assert out["webhooks"] == {"enabled": True, "conversionCRDs": ["widgets.example.com"]}
    assert "webhooks" not in values(grants)


def test_with_namespaces_a_cluster_scoped_resource_goes_to_the_clusterrole() -> None:
    grants = needs([Source("pods", watches=("nodes",))])
    docs = manifests(grants, name="op", namespaces=("a",))
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [("ClusterRole", "op-cluster"), ("Role", "op")]
    assert [r["resources"] for r in docs[0]["rules"]] == [["nodes"]]
    assert ["nodes"] not in [r["resources"] for r in docs[1]["rules"]]
    # all namespaces: one ClusterRole holds both
    assert [d["kind"] for d in manifests(grants, name="op")] == ["ClusterRole"]


def test_secure_metrics_add_the_review_creates_the_chart_grants() -> None:
    grants = needs([Source("pods")], metrics_auth=True)
    for rule in PERMISSIONS["metricsAuth"]["rules"]:
        assert verbs(grants, rule["apiGroup"], rule["resource"], where=CLUSTER) == rule["verbs"]
    assert not any(g.required for g in grants if g.where == CLUSTER)  # scrapes fail, reconciling goes on
    assert not [g for g in needs([Source("pods")]) if g.where == CLUSTER]


def test_each_rule_says_why_in_comments_and_still_parses() -> None:
    grants = needs([Source("widgets.example.com", finalizer=True, name="w")])
    docs = manifests(grants)
    text = to_yaml(docs, header="generated", notes=reasons(grants))
    assert (
        "# get, list, watch: @reconciler 'w': the primary's informer (get for client.live.get)\n"
        "# patch: @reconciler 'w': finalizer= (a JSON patch of metadata.finalizers)\n"
        "- apiGroups: [example.com]\n  resources: [widgets]\n  verbs: [get, list, watch, patch]\n"
    ) in text
    assert list(yaml.safe_load_all(text)) == docs


def test_a_reconcilers_own_namespaces_limit_its_grants_to_them() -> None:
    grants = needs([Source("configmaps", finalizer=True, namespaces=("a", "b")), Source("secrets")], reads=["configmaps"])
    assert verbs(grants, "", "configmaps", where="a") == verbs(grants, "", "configmaps", where="b") == ["get", "list", "watch", "patch"]
    assert verbs(grants, "", "configmaps") == []  # not where the operator watches; the index rides on its informers
    assert verbs(grants, "events.k8s.io", "events", where="a") == ["create", "patch"]
    assert verbs(grants, "", "secrets") == ["get", "list", "watch"]
    docs = manifests(grants, name="op")
    assert [(d["kind"], d["metadata"].get("namespace")) for d in docs] == [("ClusterRole", None), ("Role", "a"), ("Role", "b")]


def test_values_carry_every_grant_the_handlers_ask_for_and_none_of_the_machinery() -> None:
    grants = needs(
        [Source("configmaps", namespaces=("a",)), Source("pods")], leader=("ops", "l"), shards=None,
        webhook_name="w", admission=True, ca_secret_namespace="ops", metrics_auth=True,
    )  # fmt: skip
    generated = values(grants)["rbac"]["generated"]
    assert {r["resources"][0] for r in generated} == {"configmaps", "pods", "events"}


def test_a_record_on_the_primary_grants_patch_on_it() -> None:
    """Field changes keep a snapshot annotation on the primary (docs/changes.md)."""
    plain = needs([Source("widgets.v1.example.com", name="w")])
    assert "patch" not in verbs(plain, "example.com", "widgets")
    kept = needs([Source("widgets.v1.example.com", records=True, name="w")])
    assert "patch" in verbs(kept, "example.com", "widgets")
