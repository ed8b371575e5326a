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
import shlex
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
from declop.testing.cluster.runner import OperatorRunner, wait_for

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
            f"print the RBAC the handlers need with: declop rbac {handlers} -n {namespace} --leader-elect "
            f"--service-account {namespace}:op-declop",
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
            f"--leader-election-id {env['DECLOP_LEADER_ELECTION_ID']} --leader-election-namespace {namespace} "
            f"--kubeconfig {kubeconfig} --service-account {namespace}:op-declop",
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


# -- issue 44: names read as `declop run` reads them, cluster-scoped models, the advice that fixes --

SPELLINGS_HANDLERS = """
import declop

@declop.reconciler("Pod", labels="rbac-spell=yes", owns=["Deployment", "cj", "statefulset.apps", "svc", "rs"],
                   permissions=[("get", "secret"), ("create", "tokenreviews")])
def spelled(request, client, obj):
    CALLS.append(request.name)

CALLS = []
"""


def test_declop_rbac_grants_what_declop_runs_resolver_resolves_and_the_check_passes(
    control_plane: Any, namespace: str, tmp_path: Path, loaded: Registry
) -> None:
    """Defect 7 of issue 44: each spelling `declop run` accepts (kind, short name, singular with
    its group) is granted as the resource the apiserver's discovery resolves it to — offline from
    the standard table and online from discovery, the same bytes — and under exactly that RBAC
    `declop run`'s start-up check passes (failed before: Pod, Deployment, cj, statefulset.apps,
    svc, rs and secret were printed as core-group `pod`, `deployment`, `cj` ... rules)."""
    import asyncio

    from declop.kube.catalog import discover
    from declop.kube.discovery import resolve

    tools = control_plane.env()
    handlers = tmp_path / "rbac_spellings.py"
    handlers.write_text(SPELLINGS_HANDLERS)
    sh(tools, "kubectl", "create", "serviceaccount", "spelled", "-n", namespace)
    args = (str(handlers), "-n", namespace, "--service-account", f"{namespace}:spelled", "--name", "spelled")
    offline = declop_rbac(tools, *args, "--offline")
    online = declop_rbac(tools, *args, "--kubeconfig", control_plane.kubeconfig_path)
    assert online == offline
    served = asyncio.run(discover(control_plane.configuration()))
    granted = {(rule["apiGroups"][0], rule["resources"][0]) for doc in yaml.safe_load_all(online) for rule in doc.get("rules", ())}
    for spelling in ("Pod", "Deployment", "cj", "statefulset.apps", "svc", "rs", "secret", "tokenreviews"):
        info = resolve(spelling, served, watchable=False)  # what declop run resolves it to
        assert (info.group, info.plural) in granted, (spelling, info)
    assert not [g for g in granted if g[0] == "" and g[1] in ("pod", "deployment", "cj", "svc", "rs", "secret", "statefulset")]
    sh(tools, "kubectl", "apply", "-f", "-", stdin=online)
    load([str(handlers)], [])
    calls = loaded.registrations[0].fn.__globals__["CALLS"]
    options = Options(namespaces=(namespace,), grace_period=2, check_permissions=True)
    try:
        with OperatorRunner(loaded, configuration=identity(control_plane, namespace, "spelled"), options=options):
            core = kubernetes.client.CoreV1Api(control_plane.api_client())
            core.create_namespaced_pod(namespace, {
                "metadata": {"name": "p", "labels": {"rbac-spell": "yes"}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]},
            })  # fmt: skip
            wait_for(lambda: "p" in calls, 20, what="the reconcile of p")
    finally:
        subprocess.run(["kubectl", "delete", "clusterrole,clusterrolebinding", "spelled-cluster", "--ignore-not-found"], env=tools, capture_output=True, check=False)


RACK_HANDLERS = """
import declop
from pydantic import BaseModel

class RackSpec(BaseModel):
    slots: int = 1

class RackStatus(BaseModel):
    used: int = 0

class Rack(declop.CustomResource, group="{group}", version="v1", kind="Rack", scope="Cluster"):
    spec: RackSpec
    status: RackStatus | None = None

@declop.reconciler(Rack, owns=["configmaps"], finalizer="example.com/cleanup")
def rack(request, client, obj):
    CALLS.append(request.name)
    if obj is not None:
        client.event(obj, "Seen", "the rack is known")

CALLS = []
"""


def test_a_cluster_scoped_model_with_n_starts_under_the_rbac_the_advice_prints(
    control_plane: Any, namespace: str, tmp_path: Path, loaded: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    """Defect 4 of issue 44: `declop rbac -n NS` put a scope="Cluster" model in NS's Role, which
    cannot grant it; the start-up check stopped and named the same command (failed before, at the
    advice: no --service-account, and that command printed the racks in NS's Role only, as
    tests/unit/test_cli_rbac.py shows). Now: with no RBAC the check
    stops and names `declop rbac ... -n NS --service-account NS:racks`; what that prints (a
    ClusterRole for the racks, a Role in NS, the Events' Role in default, all bound) is applied,
    and the operator starts, reconciles a Rack and records its Event with no missing permission."""
    tools = control_plane.env()
    group = f"rack{secrets.token_hex(3)}.example.com"
    handlers = tmp_path / "rbac_racks.py"
    handlers.write_text(RACK_HANDLERS.format(group=group))
    crd = sh({**tools, "PYTHONPATH": str(ROOT)}, sys.executable, "-m", "declop", "crd", str(handlers))
    sh(tools, "kubectl", "apply", "-f", "-", stdin=crd)
    sh(tools, "kubectl", "wait", "--for=condition=Established", "--timeout=30s", f"crd/racks.{group}")
    sh(tools, "kubectl", "create", "serviceaccount", "racks", "-n", namespace)
    load([str(handlers)], [])
    calls = loaded.registrations[0].fn.__globals__["CALLS"]
    as_operator = identity(control_plane, namespace, "racks")
    options = Options(
        namespaces=(namespace,), grace_period=2, check_permissions=True, rbac_command=f"declop rbac {handlers} -n {namespace} --name racks",
    )  # fmt: skip
    custom = kubernetes.client.CustomObjectsApi(control_plane.api_client())
    try:
        with pytest.raises(ConfigError) as refused:
            with OperatorRunner(loaded, configuration=as_operator, options=options):
                pass
        advice = str(refused.value).splitlines()[-1]
        assert advice == f"print the RBAC the handlers need with: declop rbac {handlers} -n {namespace} --name racks --service-account {namespace}:racks"
        printed = declop_rbac(tools, *shlex.split(advice.partition(": ")[2])[2:])
        docs = list(yaml.safe_load_all(printed))
        roles = {(d["kind"], d["metadata"].get("namespace")): {r["resources"][0] for r in d["rules"]} for d in docs if "rules" in d}
        assert roles == {
            ("ClusterRole", None): {"racks", "racks/finalizers", "racks/status"},
            ("Role", "default"): {"events"},
            ("Role", namespace): {"configmaps"},
        }
        assert {d["kind"] for d in docs} == {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
        sh(tools, "kubectl", "apply", "-f", "-", stdin=printed)
        custom.create_cluster_custom_object(group, "v1", "racks", {"apiVersion": f"{group}/v1", "kind": "Rack", "metadata": {"name": "r1"}, "spec": {"slots": 4}})
        with caplog.at_level("DEBUG", logger="declop"):
            with OperatorRunner(loaded, configuration=as_operator, options=options):
                wait_for(lambda: "r1" in calls, 20, what="the reconcile of r1")
                events = kubernetes.client.EventsV1Api(control_plane.api_client())
                wait_for(lambda: any(e.regarding.name == "r1" for e in events.list_namespaced_event("default").items), 20,
                         what="the Rack's Event in default")  # fmt: skip
                wait_for(lambda: len([r for r in caplog.records if r.getMessage() == "Reviewed permissions"]) >= 2, 10,
                         what="both permission reviews")  # fmt: skip
        assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("missing permission")] == []
    finally:
        subprocess.run(["kubectl", "delete", "clusterrole,clusterrolebinding", "racks-cluster", "--ignore-not-found"], env=tools, capture_output=True, check=False)
        subprocess.run(["kubectl", "delete", "role,rolebinding", "racks", "-n", "default", "--ignore-not-found"], env=tools, capture_output=True, check=False)
        subprocess.run(["kubectl", "delete", "crd", f"racks.{group}", "--ignore-not-found", "--wait=false"], env=tools, capture_output=True, check=False)
