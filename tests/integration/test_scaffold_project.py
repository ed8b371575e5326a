"""`declop new` as a user runs it: the generated project's own tests pass on a real control plane,
and its chart values grant exactly what its handlers send.

1. ``declop new Widget --group example.com`` (the CLI, in a subprocess) writes a project into a
   temporary folder; that project's ``pytest`` (its unit tests and its integration test, which
   starts its own control plane through declop's pytest plugin) runs as a subprocess with this
   virtualenv's Python — green.
2. The generated ``values.yaml`` and ``rbac-values.yaml`` (what ``declop rbac handlers.py
   --values`` writes, made by ``declop new``) are rendered by ``helm template`` with the
   generated ``handlers.py`` (``--set-file``, as its README says), and the CRD is what ``declop
   crd handlers.py`` prints; the generated handlers then run under the rendered ServiceAccount
   and RBAC through the whole life of a resource (create, child repaired, delete with the
   finalizer): never refused, and nothing granted beyond the verbs declop's rules always grant.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

import declop
import declop.registry
from declop.kube.kubeconfig import RestConfig
from declop.loader import load
from declop.manager import Options
from declop.testing.cluster.runner import OperatorRunner, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "declop"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def declop_new(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "declop", "new", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.timeout(900)
def test_the_generated_project_passes_its_own_tests(tmp_path: Path) -> None:
    declop_new("Widget", "--group", "example.com", cwd=tmp_path)
    project = tmp_path / "widget-operator"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA"],
        cwd=project, env=env, capture_output=True, text=True, timeout=840, check=False,
    )
    print(result.stdout[-4000:], result.stderr[-2000:])
    assert result.returncode == 0
    passed = [line for line in result.stdout.splitlines() if line.startswith("PASSED ")]
    assert len(passed) == 10, result.stdout  # eight unit tests, one in the simulator, one on the real control plane
    assert any("test_integration.py::" in line for line in passed)
    assert any("test_sim.py::" in line for line in passed)
    assert re.search(r"^10 passed in ", result.stdout, re.M), result.stdout  # nothing failed, skipped or errored


def sh(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(list(args), env=env, input=stdin, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{' '.join(args)}: {result.stderr}"
    return result.stdout


def granted(docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    out = set()
    for doc in docs:
        if doc["kind"] in ("Role", "ClusterRole"):
            for rule in doc["rules"]:
                for group in rule.get("apiGroups", ()):
                    for resource in rule.get("resources", ()):
                        out.update((group, resource, verb) for verb in rule["verbs"])
    return out


def test_the_generated_values_grant_what_the_generated_handlers_use(
    control_plane: Any, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    group, plural = "scaffold.example.com", "gizmos"
    declop_new("Gizmo", "--group", group, "--dir", "gizmo", cwd=tmp_path)
    project = tmp_path / "gizmo"
    tools = control_plane.env()
    rendered = sh(
        tools, "helm", "template", "op", str(CHART), "-n", namespace,
        "-f", str(project / "values.yaml"), "-f", str(project / "rbac-values.yaml"), "--set-file", f"handlers.files.handlers\\.py={project / 'handlers.py'}",
        "--set", "leaderElection.enabled=false", "--set", "metrics.enabled=false",
    )
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    configmap = next(d for d in docs if d["kind"] == "ConfigMap" and "handlers.py" in d.get("data", {}))
    assert configmap["data"]["handlers.py"] == (project / "handlers.py").read_text()
    rbac = [d for d in docs if d["kind"] in RBAC_KINDS]
    ours = {plural, f"{plural}/status", f"{plural}/finalizers", "configmaps", "events"}
    allowed = {g for g in granted(rbac) if g[1] in ours}

    crd = sh(tools, sys.executable, "-m", "declop", "crd", str(project / "handlers.py"))
    sh(tools, "kubectl", "apply", "-f", "-", stdin=crd)
    sh(tools, "kubectl", "wait", "--for=condition=Established", f"crd/{plural}.{group}", "--timeout=30s")
    sh(tools, "kubectl", "apply", "-f", "-", stdin=yaml.safe_dump_all(rbac))
    api = control_plane.api_client()
    custom = kubernetes.client.CustomObjectsApi(api)
    core = kubernetes.client.CoreV1Api(api)
    registry = declop.registry.Registry()
    monkeypatch.setattr(declop.registry, "default_registry", registry)  # the project's @declop.reconciler lands here
    (handlers,) = load([str(project / "handlers.py")])
    identity = RestConfig(
        host=control_plane.host, source="the chart's ServiceAccount",
        ca_data=Path(control_plane.ca_file).read_bytes(),
        token=control_plane.service_account_token(namespace, "op-declop"),
    )
    example = yaml.safe_load((project / "example.yaml").read_text())
    name = example["metadata"]["name"]

    def get() -> dict[str, Any] | None:
        try:
            return custom.get_namespaced_custom_object(group, "v1", namespace, plural, name)  # type: ignore[no-any-return]
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def ready() -> dict[str, Any] | None:
        obj = get()
        return obj if obj and declop.conditions.is_true((obj.get("status") or {}).get("conditions"), "Ready") else None

    try:
        options = Options(namespaces=(namespace,), grace_period=2, list_mode="paged")
        with OperatorRunner(registry, configuration=identity, options=options) as op:
            custom.create_namespaced_custom_object(group, "v1", namespace, plural, example)
            obj = wait_for(ready, 20, what="Ready=True")
            assert handlers.FINALIZER in obj["metadata"]["finalizers"]
            assert core.read_namespaced_config_map(name, namespace).data == {"message": example["spec"]["message"]}
            core.patch_namespaced_config_map(name, namespace, {"data": {"message": "tampered"}})
            wait_for(lambda: core.read_namespaced_config_map(name, namespace).data == {"message": example["spec"]["message"]},
                     20, what="the ConfigMap to be put back")
            custom.delete_namespaced_custom_object(group, "v1", namespace, plural, name)
            wait_for(lambda: get() is None, 20, what="the finalizer to be released")
            sent = {g for g in op.statistics().by_resource if g[1] in ours}
            stats = op.statistics()
    finally:
        for d in rbac:
            if d["kind"].startswith("Cluster"):
                subprocess.run(["kubectl", "delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found"],
                               env=tools, capture_output=True, check=False)
        api.close()
    print("sent", sorted(sent), "granted", sorted(allowed), stats)
    assert sent - allowed == set(), "sent without a grant"
    # what `declop rbac` grants for these declarations beyond what this run sent (docs/rbac.md §1):
    # `get` on sources (client.live reads), `update` on /status (client.update of the subresource),
    # patch/delete on the owned ConfigMaps (client.apply, client.delete), Events (client.event),
    # and /finalizers `update`, which admission checks for blockOwnerDeletion and is never a request
    assert allowed - sent == {
        (group, plural, "get"), (group, f"{plural}/status", "update"), (group, f"{plural}/finalizers", "update"),
        ("", "configmaps", "get"), ("", "configmaps", "patch"), ("", "configmaps", "delete"),
        ("events.k8s.io", "events", "create"), ("events.k8s.io", "events", "patch"),
    }
