"""RBAC exactly what is used: the operator runs under the ServiceAccount and the RBAC that
`helm template` renders, on the real apiserver, through every feature that sends requests
(informers in paged mode, a handler's live read, the finalizer protocol, Events with a series update, leader
election, the secure-metrics checks). It must never be refused, and the set of
(apiGroup, resource, verb) it sent must equal the set the chart grants — nothing granted that is
not used. Both sides come from charts/declop/files/permissions.json (the chart renders it; this
test checks the code against it)."""

from __future__ import annotations

import json
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
import declop.events
from declop.kubeconfig import RestConfig
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
        monkeypatch.setattr(declop.events, "SERIES_MIN_INTERVAL", 0.0)  # the 2nd Event patches the series
        registry = declop.Registry()
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
