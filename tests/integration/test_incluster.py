"""Least privilege, proven: `helm install` the pods example, then run `declop run` in-cluster style
(KUBERNETES_SERVICE_HOST/PORT and the service-account files of the chart's ServiceAccount) and play
the seed scenario under that identity. Without the pods rule the start-up check names it and
exits 1; with the check off the operator says Forbidden, clearly, and never becomes ready."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from declop.testing.cluster.runner import OperatorProcess, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "declop"
PODS = ROOT / "examples" / "pods.py"


def sh(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed: {result.stderr}")
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz?verbose", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def in_cluster(control_plane: Any, namespace: str, release: str, tmp_path: Path) -> tuple[list[str], dict[str, str], int]:
    """What the kubelet would give the chart's container: its args and env, the handlers
    ConfigMap as files, and a token of its ServiceAccount. Returns (args, env, health port)."""
    tools = control_plane.env()
    deployment = json.loads(sh(tools, "kubectl", "get", "deployment", f"{release}-declop", "-n", namespace, "-o", "json").stdout)
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    cm = next(v for v in spec["volumes"] if v["name"] == "handlers")["configMap"]["name"]
    data = json.loads(sh(tools, "kubectl", "get", "configmap", cm, "-n", namespace, "-o", "json").stdout)["data"]
    handlers = tmp_path / "handlers"
    handlers.mkdir()
    for key, text in data.items():
        (handlers / key).write_text(text)
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(control_plane.service_account_token(namespace, spec["serviceAccountName"]))
    (sa / "ca.crt").write_text(Path(control_plane.ca_file).read_text())
    (sa / "namespace").write_text(namespace)
    host, port = control_plane.host.removeprefix("https://").rsplit(":", 1)
    health = free_port()
    env.update(
        {
            "PATH": os.environ["PATH"],
            "HOME": str(tmp_path),
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
            "DECLOP_SERVICE_ACCOUNT_DIR": str(sa),
            "DECLOP_PATHS": str(handlers),
            "DECLOP_HEALTH_PORT": str(health),
        }
    )
    env.pop("DECLOP_METRICS_PORT", None)
    return container.get("args", []), env, health


def helm_install(control_plane: Any, namespace: str, release: str, *values: str) -> None:
    sh(
        control_plane.env(),
        "helm", "install", release, str(CHART), "-n", namespace,
        "--set", "handlers.example=false",
        "--set-file", f"handlers.files.pods\\.py={PODS}",
        "--set", f"watchNamespaces[0]={namespace}",
        "--set", "rbac.scope=namespaces",
        "--set", "gracePeriod=5",
        *values,
    )


def test_seed_scenario_as_the_charts_service_account(control_plane, namespace, tmp_path):
    helm_install(control_plane, namespace, "seed", "--set", "rbac.watch[0].group=", "--set", "rbac.watch[0].resource=pods")
    args, env, health = in_cluster(control_plane, namespace, "seed", tmp_path)
    tools = control_plane.env()
    with OperatorProcess(args, env=env) as op:
        # the chart elects a leader; in a fresh namespace the Lease is created a lease duration
        # after the first read and leads a renew deadline later (~27 s, contract.md §7)
        op.wait_for_line("Starting workers", timeout=60)
        assert readyz(health)[0] == 200
        wait_for(lambda: sh(tools, "kubectl", "run", "nginx", "--image", "nginx", "-n", namespace, check=False).returncode == 0, 30)
        op.wait_for_line("INFO Pod created")
        sh(tools, "kubectl", "label", "pod", "nginx", "env=prod", "-n", namespace)
        op.wait_for_line("INFO Pod created", count=2)
        sh(tools, "kubectl", "delete", "pod", "nginx", "-n", namespace, "--grace-period=0", "--force")
        op.wait_for_line("INFO The pod was deleted")
        assert not [line for line in op.lines if line.startswith("ERROR")], op.lines
    assert op.returncode == 0
    # the identity really is the chart's ServiceAccount, and it may do no more than asked
    who = f"system:serviceaccount:{namespace}:seed-declop"
    assert sh(tools, "kubectl", "auth", "can-i", "list", "pods", "-n", namespace, "--as", who, check=False).stdout.strip() == "yes"
    assert sh(tools, "kubectl", "auth", "can-i", "delete", "pods", "-n", namespace, "--as", who, check=False).stdout.strip() == "no"
    assert sh(tools, "kubectl", "auth", "can-i", "list", "secrets", "-n", namespace, "--as", who, check=False).stdout.strip() == "no"


def test_without_the_pods_rule_it_says_forbidden_and_never_gets_ready(control_plane, namespace, tmp_path):
    helm_install(control_plane, namespace, "nopods")
    args, env, health = in_cluster(control_plane, namespace, "nopods", tmp_path)
    # At start: the permission check (docs/rbac.md) names what is missing and exits 1
    with OperatorProcess(args, env=env) as op:
        wait_for(lambda: op.proc.poll() is not None, 30, what="the start-up check to stop declop")
        wait_for(lambda: any(line.startswith("print the RBAC") for line in op.stderr), 5, what="the whole message")
    assert op.proc.returncode == 1
    assert f"missing permission: list pods in namespace {namespace}" in op.stderr
    assert not any("Traceback" in x for x in op.lines + op.stderr)
    # Later (the check off, as when RBAC is taken away from a running operator): the informer
    # says Forbidden, clearly, and the operator never gets ready
    env["DECLOP_CHECK_PERMISSIONS"] = "false"
    with OperatorProcess(args, env=env) as op:
        line = op.wait_for_line("Forbidden")[0]
        assert line.startswith("ERROR Forbidden: cannot list/watch pods in namespace " + namespace)
        # the apiserver's own words: the sync is a streaming list (a watch) on this apiserver
        assert 'cannot list resource "pods"' in line or 'cannot watch resource "pods"' in line
        assert "grant the verbs get, list, watch on pods" in line
        status, body = wait_for(lambda: (lambda r: r if r[0] else None)(readyz(health)), 10)
        assert status == 503 and "[-]informer-sync:example failed\n" in body and "Forbidden" not in body
        # one error per back-off step (0.8 s doubling), not a hot loop
        errors = op.wait_for_line("Forbidden", count=3, timeout=15)
        assert len(errors) <= 6
        assert readyz(health)[0] == 503
        assert not any("Traceback" in x for x in op.lines + op.stderr)
