"""RBAC generated from the registrations, on the real apiserver.

- The chart, given `declop rbac --values` output, grants what the operator needs; with ONE verb
  removed from its Role, `declop run`'s start-up check stops before any informer with the line
  that names it (and the command that prints the fix); with the Role intact it starts.
- `declop rbac` output alone (a ServiceAccount bound to exactly those Roles, no chart): an
  operator with a finalizer, an owned child, status writes, Events and leader election starts,
  reconciles, and is never refused (no 403 in its log or its request counts).
- What the check costs: start → first reconcile with and without it (printed as "measured:").
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator

import kubernetes.client
import pytest
import yaml

import declop.registry as registry_module
from declop.errors import ConfigError
from declop.kube.kubeconfig import RestConfig
from declop.loader import load
from declop.manager import Options
from declop.registry import Registry
from declop.serving.metrics import Metrics
from declop.testing.runner import OperatorRunner, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "declop"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def sh(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(list(args), env=env, input=stdin, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{' '.join(args)}: {result.stderr}"
    return result.stdout


def declop_rbac(env: dict[str, str], *args: str) -> str:
    """``declop rbac ARGS`` as a user runs it (a process of its own)."""
    return sh({**env, "PYTHONPATH": str(ROOT)}, sys.executable, "-m", "declop", "rbac", *args)


@pytest.fixture()
def loaded(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    """A fresh default registry that :func:`declop.loader.load` fills, as ``declop run`` does."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    fresh = Registry()
    monkeypatch.setattr(registry_module, "default_registry", fresh)
    yield fresh
    for name in set(sys.modules) - before:
        del sys.modules[name]


def identity(control_plane: Any, namespace: str, account: str) -> RestConfig:
    return RestConfig(
        host=control_plane.host, source=f"ServiceAccount {namespace}/{account}",
        ca_data=Path(control_plane.ca_file).read_bytes(),
        token=control_plane.service_account_token(namespace, account),
    )  # fmt: skip


CONFIGMAP_HANDLERS = """
import declop

@declop.reconciler("configmaps", finalizer="example.com/cleanup", labels="rbac-gen=yes")
def mirror(request, client, obj):
    CALLS.append(request.name)

CALLS = []
"""


def test_the_chart_with_generated_values_and_one_permission_removed(
    control_plane: Any, namespace: str, tmp_path: Path, loaded: Registry
) -> None:
    tools = control_plane.env()
    handlers = tmp_path / "rbac_gen_chart.py"
    handlers.write_text(CONFIGMAP_HANDLERS)
    values = tmp_path / "rbac-values.yaml"
    declop_rbac(tools, str(handlers), "--values", str(values))
    rendered = sh(
        tools, "helm", "template", "op", str(CHART), "-n", namespace, "-f", str(values),
        "--set", "handlers.module=m", "--set", "handlers.example=false", "--set", "leaderElection.enabled=true",
        "--set", "rbac.scope=namespaces", "--set-json", f'watchNamespaces=["{namespace}"]',
    )  # fmt: skip
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    rbac = [d for d in docs if d["kind"] in RBAC_KINDS]
    env = {e["name"]: e.get("value") for e in next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    role = next(d for d in rbac if d["kind"] == "Role" and d["metadata"]["name"] == "op-declop")
    rule = next(r for r in role["rules"] if r["resources"] == ["configmaps"])
    assert rule["verbs"] == ["get", "list", "watch", "patch"]  # what --values wrote, rendered by the chart
    rule["verbs"] = ["get", "watch", "patch"]  # the ONE permission removed: list
    sh(tools, "kubectl", "apply", "-f", "-", stdin=yaml.safe_dump_all(rbac))
    load([str(handlers)], [])
    options = Options(
        namespaces=(namespace,), grace_period=2, lease_duration=4.0, renew_deadline=3.0, retry_period=0.5,
        leader_elect=True, leader_election_id=env["DECLOP_LEADER_ELECTION_ID"], leader_election_namespace=namespace,
        rbac_command=f"declop rbac {handlers} -n {namespace} --leader-elect",
    )  # fmt: skip
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    try:
        as_operator = identity(control_plane, namespace, "op-declop")
        with pytest.raises(ConfigError) as refused:
            with OperatorRunner(loaded, configuration=as_operator, options=options):
                pass
        print("measured: start-up line:", refused.value)
        assert str(refused.value).splitlines() == [
            "this identity lacks 1 permission the handlers need (SelfSubjectAccessReview):",
            f"missing permission: list configmaps in namespace {namespace}",
            f"print the RBAC the handlers need with: declop rbac {handlers} -n {namespace} --leader-elect",
        ]
        # ... through the CLI: one line each, the fix, exit 1, no traceback
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "op",
            "clusters": [{"name": "c", "cluster": {"server": control_plane.host, "certificate-authority": str(control_plane.ca_file)}}],
            "users": [{"name": "op", "user": {"token": as_operator.token}}],
            "contexts": [{"name": "op", "context": {"cluster": "c", "user": "op"}}],
        }))  # fmt: skip
        run = subprocess.run(
            [sys.executable, "-m", "declop", "run", str(handlers), "-n", namespace, "--kubeconfig", str(kubeconfig),
             "--leader-elect", "--leader-election-id", env["DECLOP_LEADER_ELECTION_ID"], "--leader-election-namespace", namespace],
            env={**tools, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert run.returncode == 1, run.stderr
        assert "Traceback" not in run.stderr
        assert run.stderr.splitlines()[-3:] == [
            "declop: error: this identity lacks 1 permission the handlers need (SelfSubjectAccessReview):",
            f"missing permission: list configmaps in namespace {namespace}",
            f"print the RBAC the handlers need with: declop rbac {handlers} -n {namespace} --leader-elect "
            f"--leader-election-namespace {namespace}",
        ]
        # the chart's Role as rendered from the generated values: the operator starts and reconciles
        rule["verbs"] = ["get", "list", "watch", "patch"]
        sh(tools, "kubectl", "apply", "-f", "-", stdin=yaml.safe_dump_all([role]))
        calls = loaded.registrations[0].fn.__globals__["CALLS"]
        with OperatorRunner(loaded, configuration=as_operator, options=options):
            core.create_namespaced_config_map(namespace, {"metadata": {"name": "c", "labels": {"rbac-gen": "yes"}}})
            wait_for(lambda: "c" in calls, 20, what="the reconcile of c")
            wait_for(lambda: "example.com/cleanup" in (core.read_namespaced_config_map("c", namespace).metadata.finalizers or ()), 10,
                     what="the finalizer")  # fmt: skip
    finally:
        for d in rbac:
            if d["kind"].startswith("Cluster"):
                subprocess.run(["kubectl", "delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found"], env=tools, capture_output=True, check=False)


GIZMO_HANDLERS = """
import time

import declop
from declop.reconcile.ownership import set_controller_reference

CALLS = []

@declop.reconciler("gizmos.v1.{group}", finalizer="example.com/cleanup", owns=["configmaps"])
def gizmo(request, client, obj, phase):
    CALLS.append(time.monotonic())
    if obj is None or phase is declop.Phase.DELETING:
        return None
    child = {{"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {{"name": request.name, "namespace": request.namespace}},
              "data": {{"size": str(obj["spec"].get("size", 0))}}}}
    set_controller_reference(child, obj)
    declop.create_or_update(client, child)
    client.patch_status(request, {{"status": {{"size": obj["spec"].get("size", 0)}}}})
    client.event(obj, "Reconciled", "the ConfigMap is up to date")
"""


def crd(group: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"gizmos.{group}"},
        "spec": {
            "group": group, "scope": "Namespaced",
            "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo", "listKind": "GizmoList"},
            "versions": [{
                "name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }],
        },
    }  # fmt: skip


def test_an_operator_under_exactly_the_generated_rbac_reconciles_without_a_403(
    control_plane: Any, namespace: str, tmp_path: Path, loaded: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    tools = control_plane.env()
    group = f"rbacgen{secrets.token_hex(3)}.example.com"
    handlers = tmp_path / "rbac_gen_gizmos.py"
    handlers.write_text(textwrap.dedent(GIZMO_HANDLERS.format(group=group)))
    sh(tools, "kubectl", "apply", "-f", "-", stdin=json.dumps(crd(group)))
    sh(tools, "kubectl", "wait", "--for=condition=Established", "--timeout=30s", f"crd/gizmos.{group}")
    sh(tools, "kubectl", "create", "serviceaccount", "gizmo-op", "-n", namespace)
    printed = declop_rbac(
        tools, str(handlers), "-n", namespace, "--leader-elect", "--leader-election-id", "gizmo-op",
        "--leader-election-namespace", namespace, "--name", "gizmo-op", "--service-account", f"{namespace}:gizmo-op",
    )  # fmt: skip
    # one Role: the watched namespace is also the Lease's
    assert [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(printed)] == [("Role", "gizmo-op"), ("RoleBinding", "gizmo-op")]
    sh(tools, "kubectl", "apply", "-f", "-", stdin=printed)
    load([str(handlers)], [])
    calls: list[float] = loaded.registrations[0].fn.__globals__["CALLS"]
    api = control_plane.api_client()
    custom = kubernetes.client.CustomObjectsApi(api)
    core = kubernetes.client.CoreV1Api(api)
    as_operator = identity(control_plane, namespace, "gizmo-op")
    custom.create_namespaced_custom_object(group, "v1", namespace, "gizmos", {
        "apiVersion": f"{group}/v1", "kind": "Gizmo", "metadata": {"name": "g"}, "spec": {"size": 3},
    })  # fmt: skip
    costs: dict[bool, list[float]] = {True: [], False: []}
    checked = 0
    try:
        for check in (True, False) * 5:
            options = Options(
                namespaces=(namespace,), grace_period=2, lease_duration=4.0, renew_deadline=3.0, retry_period=0.5,
                leader_elect=True, leader_election_id="gizmo-op", leader_election_namespace=namespace,
                check_permissions=check,
            )  # fmt: skip
            calls.clear()
            started = time.monotonic()
            with caplog.at_level("DEBUG", logger="declop"):
                with OperatorRunner(loaded, configuration=as_operator, options=options, metrics=Metrics()) as op:
                    wait_for(lambda: calls, 30, what="the first reconcile")
                    costs[check].append(calls[0] - started)
                    wait_for(lambda: (custom.get_namespaced_custom_object(group, "v1", namespace, "gizmos", "g").get("status") or {}).get("size") == 3,
                             20, what="the status write")  # fmt: skip
                    child = core.read_namespaced_config_map("g", namespace)
                    assert child.data == {"size": "3"} and child.metadata.owner_references[0].name == "g"
                    if check:  # the optional writes are reviewed while the caches fill: wait for that too
                        wait_for(lambda: len([r for r in caplog.records if r.getMessage() == "Reviewed permissions"]) >= 2 * (checked + 1),
                                 10, what="both permission reviews")  # fmt: skip
                        checked += 1
                    exposition = op.manager.metrics.exposition()
                    text = exposition.decode() if isinstance(exposition, bytes) else str(exposition)
                    assert 'code="403"' not in text, "a request was refused"
        # the object's delete runs the finalizer protocol, still without a refusal
        options = Options(namespaces=(namespace,), grace_period=2, check_permissions=True)
        with caplog.at_level("DEBUG", logger="declop"):
            with OperatorRunner(loaded, configuration=as_operator, options=options):
                custom.delete_namespaced_custom_object(group, "v1", namespace, "gizmos", "g")

                def gone() -> bool:
                    try:
                        custom.get_namespaced_custom_object(group, "v1", namespace, "gizmos", "g")
                        return False
                    except kubernetes.client.ApiException as exc:
                        return exc.status == 404

                wait_for(gone, 20, what="the finalizer released")
    finally:
        subprocess.run(["kubectl", "delete", "crd", f"gizmos.{group}", "--ignore-not-found", "--wait=false"], env=tools, capture_output=True, check=False)
        api.close()
    refused = [r.getMessage() for r in caplog.records if "403" in r.getMessage() or "forbidden" in r.getMessage().lower()]
    assert refused == []
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("missing permission")]
    assert warned == []  # the optional writes (child, status, Events) are granted too
    median = {k: sorted(v)[len(v) // 2] for k, v in costs.items()}
    print(f"measured: start -> first reconcile, median of 5: with the check {median[True] * 1000:.0f} ms, "
          f"without {median[False] * 1000:.0f} ms; runs {costs}")  # fmt: skip
