"""Every example in examples/ runs as a user would run it: `declop run` as a process, kubectl
against the real control plane, assertions on the operator's real stdout and on the cluster."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from declop.testing.runner import OperatorProcess, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
UUID4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"


def kubectl(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
    return result


def get_json(env: dict[str, str], *args: str) -> dict | None:
    result = kubectl(env, "get", *args, "-o", "json", check=False)
    if result.returncode != 0:
        if "NotFound" in result.stderr or "not found" in result.stderr:
            return None
        raise AssertionError(result.stderr)
    return json.loads(result.stdout)


def test_seed_scenario_pods(control_plane, namespace):
    """kubectl run / label / delete give the seed's three lines, each with a fresh reconcileID."""
    env = control_plane.env()
    with OperatorProcess([str(EXAMPLES / "pods.py")], env=env) as op:
        op.wait_for_line("Starting workers")
        kubectl(env, "run", "nginx", "--image", "nginx", "-n", namespace)
        created = op.wait_for_line('"name": "nginx"')
        line = re.compile(
            r'^INFO Pod created \{"controller": "example", "namespace": "%s", "name": "nginx", "reconcileID": "(%s)"\}$'
            % (re.escape(namespace), UUID4)
        )
        first = line.match(created[0])
        assert first, created[0]

        kubectl(env, "label", "pod", "nginx", "env=prod", "-n", namespace)
        again = op.wait_for_line("INFO Pod created", count=2)
        second = line.match(again[1])
        assert second, again[1]
        assert second.group(1) != first.group(1)

        assert len([line for line in op.lines if "Pod created" in line]) == 2, "\n".join(op.lines)
        # No kubelet runs here, so delete as a kubelet would finish it. The apiserver first
        # records the deletionTimestamp (an update: the seed's handler still finds the pod and
        # may log "Pod created" once more), then removes the pod: NotFound in the cache.
        kubectl(env, "delete", "pod", "nginx", "-n", namespace, "--grace-period=0", "--force")
        gone = op.wait_for_line("The pod was deleted")
        assert re.match(
            r'^INFO The pod was deleted \{"controller": "example", "namespace": "%s", "name": "nginx", "reconcileID": "%s"\}$'
            % (re.escape(namespace), UUID4),
            gone[0],
        ), gone[0]
    assert op.returncode == 0


def test_finalizer_example(control_plane, namespace):
    env = control_plane.env()
    with OperatorProcess([str(EXAMPLES / "finalizer.py"), "-n", namespace], env=env) as op:
        op.wait_for_line("Starting workers")
        kubectl(env, "create", "configmap", "precious", "-n", namespace, "--from-literal=a=b")
        kubectl(env, "label", "configmap", "precious", "-n", namespace, "declop.example/backup=true")
        op.wait_for_line("Registering an external copy")
        cm = wait_for(
            lambda: (lambda o: o if (o["metadata"].get("annotations") or {}).get("declop.example/registered") else None)(
                get_json(env, "configmap", "precious", "-n", namespace)
            ),
            10,
        )
        assert cm["metadata"]["finalizers"] == ["declop.example/backup"]
        assert cm["metadata"]["annotations"]["declop.example/registered"] == cm["metadata"]["uid"]
        kubectl(env, "delete", "configmap", "precious", "-n", namespace, "--wait=false")
        op.wait_for_line("Releasing the external copy")
        wait_for(lambda: get_json(env, "configmap", "precious", "-n", namespace) is None, 10)
        op.wait_for_line("Gone; nothing left to do")
    assert op.returncode == 0


def test_crd_example(control_plane, namespace):
    env = control_plane.env()
    kubectl(env, "apply", "-f", str(EXAMPLES / "crd" / "widget-crd.yaml"))
    kubectl(env, "wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=30s")
    with OperatorProcess([str(EXAMPLES / "crd" / "handlers.py"), "-n", namespace], env=env) as op:
        op.wait_for_line("Starting workers")
        kubectl(env, "apply", "-n", namespace, "-f", str(EXAMPLES / "crd" / "widget.yaml"))
        cm = wait_for(lambda: get_json(env, "configmap", "hello-widget", "-n", namespace), 10)
        assert cm["data"] == {"message": "Hello from a Widget"}
        owner = cm["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "Widget" and owner["controller"] is True
        wait_for(lambda: (get_json(env, "widget", "hello", "-n", namespace).get("status") or {}).get("configMap") == "hello-widget", 10)

        # someone deletes the child by hand: the owner's reconciler puts it back
        kubectl(env, "delete", "configmap", "hello-widget", "-n", namespace)
        fresh = wait_for(
            lambda: (lambda o: o if o and o["metadata"]["uid"] != cm["metadata"]["uid"] else None)(
                get_json(env, "configmap", "hello-widget", "-n", namespace)
            ),
            10,
        )
        assert fresh["data"] == {"message": "Hello from a Widget"}
        # someone edits it by hand: repaired
        kubectl(env, "patch", "configmap", "hello-widget", "-n", namespace, "-p", '{"data":{"message":"tampered"}}')
        wait_for(lambda: get_json(env, "configmap", "hello-widget", "-n", namespace)["data"] == {"message": "Hello from a Widget"}, 10)
        op.wait_for_line("Repaired ConfigMap")

        # the Widget goes: the garbage collector removes its ConfigMap
        kubectl(env, "delete", "widget", "hello", "-n", namespace)
        op.wait_for_line("Widget deleted")
        wait_for(lambda: get_json(env, "configmap", "hello-widget", "-n", namespace) is None, 60)
    assert op.returncode == 0


def test_every_example_is_exercised():
    tested = {"pods.py", "finalizer.py", "crd"}
    present = {p.name for p in EXAMPLES.iterdir() if p.suffix == ".py" or p.is_dir()} - {"__pycache__"}
    untested = present - tested - set(os.environ.get("DECLOP_EXAMPLES_TESTED_ELSEWHERE", "").split(","))
    assert not untested, f"examples without a test: {sorted(untested)}"
