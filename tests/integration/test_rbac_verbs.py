"""RBAC exactly what is used: the operator runs under the ServiceAccount and the RBAC that
`helm template` renders, on the real apiserver, through every feature that sends requests
(informers in paged mode, a handler's live read, the finalizer protocol, Events with a series update, leader
election, the secure-metrics checks, webhooks with the generated CA). It must never be refused,
and the set of (apiGroup, resource, verb) it sent must equal the set the chart grants — nothing
granted that is not used; `kubectl auth can-i` tables show the named grants, and that there is no
`create` on webhook configurations or Secrets. Both sides come from charts/declop/files/permissions.json (the chart renders it; this
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
from declop.errors import ConfigError
from declop.kube.kubeconfig import RestConfig
from declop.manager import Options
from declop.testing.cluster.runner import OperatorRunner, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "declop"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
FINALIZER = "example.com/cleanup"
#: the start-up permission check (docs/rbac.md): every authenticated identity may ask about
#: itself (the built-in system:basic-user ClusterRole), so the chart grants nothing for it
SELF_REVIEW = ("authorization.k8s.io", "selfsubjectaccessreviews", "create")


def sh(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(list(args), env=env, input=stdin, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{' '.join(args)}: {result.stderr}"
    return result.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def can_i(env: dict[str, str], who: str, *args: str) -> bool:
    """``kubectl auth can-i ARGS --as=WHO``: the apiserver's own answer for these grants."""
    result = subprocess.run(["kubectl", "auth", "can-i", *args, f"--as={who}"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.stdout.strip() in ("yes", "no"), result.stdout + result.stderr
    return result.stdout.strip() == "yes"


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

        metrics, health = free_port(), free_port()
        options = Options(
            namespaces=(namespace,), grace_period=2, metrics_port=metrics,
            health_port=health, debug_reconciles=10,  # /debug/reconciles: the same checks as /metrics
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
            debug = urllib.request.Request(f"http://127.0.0.1:{health}/debug/reconciles", headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(debug, timeout=10) as r:
                assert r.status == 200
            # the metrics-reader ClusterRole as the apiserver evaluates it
            scraper = f"system:serviceaccount:{namespace}:scraper"
            reads = {"/metrics": True, "/debug/reconciles": True, "/debug/pprof/": False}
            assert {url: can_i(tools, scraper, "get", url) for url in reads} == reads
            assert not can_i(tools, scraper, "post", "/debug/reconciles")
            # the Lease: created at start, then renewed (update) every retry period
            wait_for(lambda: ("coordination.k8s.io", "leases", "update") in op.statistics().by_resource, 10,
                     what="a Lease renewal")
            sent = set(op.statistics().by_resource) - {SELF_REVIEW}
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
    """webhooks.enabled with the generated CA and a converter: the chart's release objects (the
    two empty configurations and the empty CA Secret) and its RBAC applied, `kubectl auth can-i`
    shows exactly the named grants and no `create` (positive and negative rows); the operator,
    as the chart's ServiceAccount, fills the CA Secret, registers both configurations and the
    CRD's conversion, and answers a review; what it sent to the webhook resources is exactly what
    the webhook Roles grant. Then a deleted configuration, and a deleted CA Secret, each stop the
    start with one line saying what to do (the operator may create neither)."""
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
    # the release objects the operator fills in: the chart creates them empty
    made = [d for d in docs if d["kind"] in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "Secret")]
    assert sorted(d["kind"] for d in made) == ["MutatingWebhookConfiguration", "Secret", "ValidatingWebhookConfiguration"]
    assert all("webhooks" not in d and "data" not in d and "stringData" not in d for d in made)
    env = {e["name"]: e.get("value") for e in next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    objects = f"{namespace}-objs"  # the release namespace itself is never sent for admission
    sh(tools, "kubectl", "apply", "-f", "-", stdin=yaml.safe_dump_all(rbac + made))
    sh(tools, "kubectl", "apply", "-f", "-", stdin=json.dumps(WEBHOOK_CRD))
    sh(tools, "kubectl", "wait", "--for=condition=Established", "--timeout=30s", f"crd/{crd}")
    sh(tools, "kubectl", "create", "namespace", objects)
    name = env["DECLOP_WEBHOOK_NAME"]
    ca_secret = f"{name}-webhook-ca"
    assert {(d["kind"], d["metadata"]["name"]) for d in made} == {
        ("ValidatingWebhookConfiguration", name), ("MutatingWebhookConfiguration", name), ("Secret", ca_secret),
    }
    api = control_plane.api_client()
    try:
        # the grants as the apiserver evaluates them: the named objects only, and no create
        who = f"system:serviceaccount:{namespace}:op-declop"
        vwc, mwc = "validatingwebhookconfigurations", "mutatingwebhookconfigurations"
        expect = {
            ("patch", f"{vwc}/{name}"): True,
            ("patch", f"{mwc}/{name}"): True,
            ("create", vwc): False,
            ("create", mwc): False,
            ("patch", f"{vwc}/another"): False,
            ("patch", f"{mwc}/another"): False,
            ("get", f"{vwc}/{name}"): False,  # server-side apply needs no read
            ("update", f"{mwc}/{name}"): False,
            ("delete", f"{vwc}/{name}"): False,
            ("delete", f"{mwc}/{name}"): False,
            ("list", vwc): False,
            ("get", f"secrets/{ca_secret}", "-n", namespace): True,
            ("update", f"secrets/{ca_secret}", "-n", namespace): True,
            ("patch", f"secrets/{ca_secret}", "-n", namespace): False,
            ("delete", f"secrets/{ca_secret}", "-n", namespace): False,
            ("create", "secrets", "-n", namespace): False,
            ("get", "secrets/another", "-n", namespace): False,
            ("update", "secrets/another", "-n", namespace): False,
            ("list", "secrets", "-n", namespace): False,
            ("watch", "secrets", "-n", namespace): False,
            ("get", f"secrets/{ca_secret}", "-n", objects): False,
            ("patch", f"customresourcedefinitions/{crd}"): True,
            ("patch", "customresourcedefinitions/another.example.com"): False,
            ("create", "customresourcedefinitions"): False,
        }
        table = {k: can_i(tools, who, *k) for k in expect}
        print("measured: can-i", table)
        assert table == expect
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
            sent = set(op.statistics().by_resource) - {SELF_REVIEW}
        # the chart's Secret, filled in place: Helm's labels and annotations kept (Helm still owns it)
        secret = json.loads(sh(tools, "kubectl", "get", "secret", ca_secret, "-n", namespace, "-o", "json"))
        assert {"ca.crt", "ca.key"} <= set(secret["data"])
        assert secret["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        bundle = json.loads(sh(tools, "kubectl", "get", "validatingwebhookconfiguration", name, "-o", "json"))["webhooks"][0]["clientConfig"]["caBundle"]
        assert bundle == secret["data"]["ca.crt"]

        # Deleted by hand, a configuration cannot come back from the operator (no create): the
        # start fails with one line that says how to restore it. (Both are deleted: a mutator with
        # failurePolicy Fail and no server would refuse every ConfigMap meanwhile.)
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            sh(tools, "kubectl", "delete", kind, name)
        with pytest.raises(ConfigError) as refused:
            with OperatorRunner(registry, configuration=identity, options=options):
                pass
        print("measured: missing configuration:", refused.value)
        assert str(refused.value) == (
            f"the ValidatingWebhookConfiguration {name!r} does not exist and this operator may not create it: the "
            "chart creates it (empty) at install; if it was deleted, `helm upgrade` the release to restore it "
            "(without the chart: create it, or grant create on validatingwebhookconfigurations) (403 Forbidden)"
        )
        # ... nor the CA Secret
        sh(tools, "kubectl", "delete", "secret", ca_secret, "-n", namespace)
        with pytest.raises(ConfigError) as refused:
            with OperatorRunner(registry, configuration=identity, options=options):
                pass
        print("measured: missing CA Secret:", refused.value)
        assert str(refused.value).startswith(
            f"the webhook CA Secret {namespace}/{ca_secret} does not exist and this operator may not create it; "
            "install with the chart"
        )
        assert "\n" not in str(refused.value)
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
    webhook_resources = {(g, r) for g, r, _ in granted(webhook_roles)}
    sent_here = {(g, r, v) for g, r, v in sent if (g, r) in webhook_resources}
    assert granted(webhook_roles) == sent_here, "the webhook Roles differ from what the operator sent"
    assert "unnamed" not in configurations and "unnamed" not in perms["webhookCA"], "create cannot be limited by name"
    assert {v for g, r, v in sent if r == "secrets"} == set(perms["webhookCA"]["named"]) == {"get", "update"}
    assert {v for g, r, v in sent if r == "customresourcedefinitions"} == set(perms["conversion"]["named"])
    for resource in configurations["resources"]:
        assert {v for g, r, v in sent if r == resource} == set(configurations["named"]) == {"patch"}, resource
