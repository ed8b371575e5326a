"""RBAC exactly what is used: the operator runs under the ServiceAccount and the RBAC that
`helm template` renders, on the real apiserver, through every feature that sends requests
(informers in paged mode, a handler's live read, the finalizer protocol, Events with a series update, leader
election, the secure-metrics checks). It must never be refused, and the set of
(apiGroup, resource, verb) it sent must equal the set the chart grants — nothing granted that is
not used. Both sides come from charts/declop/files/permissions.json (the chart renders it; this
test checks the code against it)."""

from __future__ import annotations

import json
import secrets
import socket
import ssl
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

import declop
import declop.reconcile.events
from declop.kube.kubeconfig import RestConfig
from declop.manager import Options
from declop.testing.runner import OperatorRunner, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "declop"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
FINALIZER = "example.com/cleanup"


def sh(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(list(args), env=env, input=stdin, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{' '.join(args)}: {result.stderr}"
    return result.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def granted(docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) every Role/ClusterRole of the render allows (resourceNames and
    nonResourceURLs aside: the Lease's name is checked by the apiserver as we run)."""
    out = set()
    for doc in docs:
        if doc["kind"] in ("Role", "ClusterRole"):
            for rule in doc["rules"]:
                for group in rule.get("apiGroups", ()):
                    for resource in rule.get("resources", ()):
                        out.update((group, resource, verb) for verb in rule["verbs"])
    return out


def test_the_chart_grants_exactly_the_verbs_declop_sends(control_plane: Any, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = control_plane.env()
    rendered = sh(
        tools, "helm", "template", "op", str(CHART), "-n", namespace,
        "--set", "handlers.module=m", "--set", "handlers.example=false",
        "--set", "leaderElection.enabled=true",
        "--set-json", 'rbac.watch=[{"resource": "configmaps", "finalizers": true}]',
    )
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    rbac = [d for d in docs if d["kind"] in RBAC_KINDS]
    env = {e["name"]: e.get("value") for e in docs[[d["kind"] for d in docs].index("Deployment")]["spec"]["template"]["spec"]["containers"][0]["env"]}
    sh(tools, "kubectl", "apply", "-f", "-", stdin=yaml.safe_dump_all(rbac))
    api = control_plane.api_client()
    core = kubernetes.client.CoreV1Api(api)
    try:
        reader = next(d["metadata"]["name"] for d in rbac if d["metadata"]["name"].endswith("-metrics-reader"))
        core.create_namespaced_service_account(namespace, {"metadata": {"name": "scraper"}})
        sh(tools, "kubectl", "create", "clusterrolebinding", f"{namespace}-scraper", f"--clusterrole={reader}",
           f"--serviceaccount={namespace}:scraper")
        identity = RestConfig(
            host=control_plane.host, source="the chart's ServiceAccount",
            ca_data=Path(control_plane.ca_file).read_bytes(),
            token=control_plane.service_account_token(namespace, "op-declop"),
        )
        monkeypatch.setattr(declop.reconcile.events, "SERIES_MIN_INTERVAL", 0.0)  # the 2nd Event patches the series
        registry = declop.registry.Registry()
        calls: list[str] = []

        @declop.reconciler("configmaps", finalizer=FINALIZER, registry=registry, labels="rbac-test=yes")
        def everything(request, client, obj, phase, **_: Any) -> None:
            if obj is not None:
                client.live.get(request)  # a handler's uncached read: the `get` of the watch rule
                client.event(obj, "Seen", "seen")
                client.event(obj, "Seen", "seen")
            calls.append(phase.name)

        metrics = free_port()
        options = Options(
            namespaces=(namespace,), grace_period=2, metrics_port=metrics,
            # paged: LIST then watch (the streaming list, the default where served, needs only
            # watch; list is its fallback on apiservers that refuse it)
            list_mode="paged",
            lease_duration=4.0, renew_deadline=3.0, retry_period=0.5,
            leader_elect=True, leader_election_id=env["DECLOP_LEADER_ELECTION_ID"], leader_election_namespace=namespace,
        )
        with OperatorRunner(registry, configuration=identity, options=options) as op:
            core.create_namespaced_config_map(namespace, {"metadata": {"name": "c", "labels": {"rbac-test": "yes"}}})
            wait_for(lambda: "CREATED" in calls, 20, what="the CREATED call")
            core.delete_namespaced_config_map("c", namespace)

            def gone() -> bool:
                try:
                    core.read_namespaced_config_map("c", namespace)
                    return False
                except kubernetes.client.ApiException as exc:
                    return exc.status == 404

            wait_for(gone, 20, what="the finalizer to be released")
            insecure = ssl.create_default_context()
            insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
            token = control_plane.service_account_token(namespace, "scraper")
            request = urllib.request.Request(f"https://127.0.0.1:{metrics}/metrics", headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(request, timeout=10, context=insecure) as r:
                assert r.status == 200
            # the Lease: created at start, then renewed (update) every retry period
            wait_for(lambda: ("coordination.k8s.io", "leases", "update") in op.statistics().by_resource, 10,
                     what="a Lease renewal")
            sent = set(op.statistics().by_resource)
    finally:
        subprocess.run(["kubectl", "delete", "clusterrolebinding", f"{namespace}-scraper", "--ignore-not-found"], env=tools, capture_output=True, check=False)
        for d in rbac:
            if d["kind"].startswith("Cluster"):
                subprocess.run(["kubectl", "delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found"], env=tools, capture_output=True, check=False)
        api.close()
    allowed = granted(rbac)
    print("measured: sent", sorted(sent))
    assert sent - allowed == set(), "sent without a grant (the apiserver would have refused)"
    assert allowed - sent == set(), "granted but never sent: the chart is wider than the code"
    perms = json.loads((CHART / "files" / "permissions.json").read_text())
    assert {v for g, r, v in sent if r == "configmaps"} == set(perms["watch"]["verbs"] + perms["finalizers"]["verbs"])
    assert {v for g, r, v in sent if r == "events"} == set(perms["events"]["verbs"])
    assert {v for g, r, v in sent if r == "leases"} == set(perms["lease"]["unnamed"] + perms["lease"]["named"])


WEBHOOK_GROUP = "rbacwh.example.com"
WEBHOOK_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"gadgets.{WEBHOOK_GROUP}"},
    "spec": {
        "group": WEBHOOK_GROUP,
        "scope": "Namespaced",
        "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
        "versions": [
            {"name": version, "served": True, "storage": version == "v1alpha1",
             "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}
            for version in ("v1alpha1", "v1")
        ],
    },
}  # fmt: skip


def test_the_chart_grants_exactly_the_verbs_webhooks_send(control_plane: Any) -> None:
    """webhooks.enabled with the generated CA and a converter: the operator, as the chart's
    ServiceAccount under the chart's RBAC, creates its CA Secret, registers both webhook
    configurations and the CRD's conversion, and answers a review; what it sent to the webhook
    resources must be what the webhook Roles grant, and nothing it sent may lack a grant."""
    tools = control_plane.env()
    # A short release namespace of its own: the CA's subject names <namespace>/<secret>, and
    # the fixture's long test namespaces would exceed X.509's 64-character CommonName
    namespace = f"wh-{secrets.token_hex(3)}"
    sh(tools, "kubectl", "create", "namespace", namespace)
    sh(tools, "kubectl", "create", "serviceaccount", "op-declop", "-n", namespace)
    crd = WEBHOOK_CRD["metadata"]["name"]
    rendered = sh(
        tools, "helm", "template", "op", str(CHART), "-n", namespace,
        "--set", "handlers.module=m", "--set", "handlers.example=false", "--set", "leaderElection.enabled=false",
        "--set", "webhooks.enabled=true", "--set-json", f'webhooks.conversionCRDs=["{crd}"]',
    )  # fmt: skip
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    rbac = [d for d in docs if d["kind"] in RBAC_KINDS]
    webhook_roles = [d for d in rbac if d["kind"] in ("Role", "ClusterRole") and d["metadata"]["name"].endswith(("-webhooks", "-webhook-ca"))]
    assert len(webhook_roles) == 2, [d["metadata"]["name"] for d in webhook_roles]
    env = {e["name"]: e.get("value") for e in next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    objects = f"{namespace}-objs"  # the release namespace itself is never sent for admission
    sh(tools, "kubectl", "apply", "-f", "-", stdin=yaml.safe_dump_all(rbac))
    sh(tools, "kubectl", "apply", "-f", "-", stdin=json.dumps(WEBHOOK_CRD))
    sh(tools, "kubectl", "wait", "--for=condition=Established", "--timeout=30s", f"crd/{crd}")
    sh(tools, "kubectl", "create", "namespace", objects)
    name = env["DECLOP_WEBHOOK_NAME"]
    api = control_plane.api_client()
    try:
        identity = RestConfig(
            host=control_plane.host, source="the chart's ServiceAccount",
            ca_data=Path(control_plane.ca_file).read_bytes(),
            token=control_plane.service_account_token(namespace, "op-declop"),
        )
        registry = declop.registry.Registry()

        @declop.validator("configmaps", registry=registry)
        def no_forbidden(obj: Any, **_: Any) -> None:
            if "forbidden" in (obj.get("data") or {}):
                raise declop.Rejected("no key 'forbidden'", field="data")

        @declop.mutator("configmaps", registry=registry)
        def labelled(obj: Any, **_: Any) -> None:
            obj["metadata"].setdefault("labels", {})["checked"] = "yes"

        @declop.converter(crd, registry=registry)
        def convert(obj: Any, desired_api_version: str, **_: Any) -> None:
            obj["apiVersion"] = desired_api_version

        # the chart's settings, except the client config: no kube-proxy here, so the apiserver
        # calls the local URL form (its RBAC is the same: the configurations are the same objects)
        options = Options(
            namespaces=(namespace,), grace_period=2, webhook_port=free_port(),
            webhook_name=name, webhook_namespace=env["DECLOP_WEBHOOK_NAMESPACE"],
        )
        with OperatorRunner(registry, configuration=identity, options=options) as op:
            def denied() -> str | None:
                result = subprocess.run(
                    ["kubectl", "create", "configmap", "bad", "-n", objects, "--from-literal=forbidden=1"],
                    env=tools, capture_output=True, text=True, timeout=30, check=False,
                )
                return result.stderr if "data: no key 'forbidden'" in result.stderr else None

            wait_for(denied, 30, what="the validator's denial (the operator registered its webhooks)")
            sh(tools, "kubectl", "create", "configmap", "good", "-n", objects)
            labels = json.loads(sh(tools, "kubectl", "get", "configmap", "good", "-n", objects, "-o", "json"))["metadata"]["labels"]
            assert labels == {"checked": "yes"}
            conversion = json.loads(sh(tools, "kubectl", "get", "crd", crd, "-o", "json"))["spec"]["conversion"]
            assert conversion["strategy"] == "Webhook"
            sent = set(op.statistics().by_resource)
        secret = json.loads(sh(tools, "kubectl", "get", "secret", f"{name}-webhook-ca", "-n", namespace, "-o", "json"))
        assert {"ca.crt", "ca.key"} <= set(secret["data"])
    finally:
        for d in rbac:
            if d["kind"].startswith("Cluster"):
                subprocess.run(["kubectl", "delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found"], env=tools, capture_output=True, check=False)
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            subprocess.run(["kubectl", "delete", kind, name, "--ignore-not-found"], env=tools, capture_output=True, check=False)
        subprocess.run(["kubectl", "delete", "crd", crd, "--ignore-not-found", "--wait=false"], env=tools, capture_output=True, check=False)
        subprocess.run(["kubectl", "delete", "namespace", objects, namespace, "--wait=false"], env=tools, capture_output=True, check=False)
        api.close()
    print("measured: sent", sorted(sent))
    assert sent - granted(rbac) == set(), "sent without a grant (the apiserver would have refused)"
    perms = json.loads((CHART / "files" / "permissions.json").read_text())
    configurations = perms["webhookConfigurations"]
    # The configurations are server-side applied: every request is a PATCH to their name, but the
    # apply that creates one is authorized as `create` too (without a name: the apiserver refused
    # it with only `patch`). So `create` is granted and never appears as a verb sent.
    applied_create = {(configurations["apiGroup"], r, "create") for r in configurations["resources"]}
    assert applied_create <= granted(webhook_roles)
    webhook_resources = {(g, r) for g, r, _ in granted(webhook_roles)}
    sent_here = {(g, r, v) for g, r, v in sent if (g, r) in webhook_resources}
    assert granted(webhook_roles) - applied_create == sent_here, "the webhook Roles differ from what the operator sent"
    assert {v for g, r, v in sent if r == "secrets"} == set(perms["webhookCA"]["unnamed"] + perms["webhookCA"]["named"])
    assert {v for g, r, v in sent if r == "customresourcedefinitions"} == set(perms["conversion"]["named"])
    for resource in configurations["resources"]:
        assert {v for g, r, v in sent if r == resource} == set(configurations["named"]), resource
