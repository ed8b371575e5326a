"""examples/kopf/12_embedded.py on a real control plane: the application starts the embedded
operator, creates and deletes three KopfExamples while it reconciles them, and exits 0 after a
graceful stop — what Kopf's examples/12-embedded does with kopf.operator() in a thread."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import kubernetes.client
from kubernetes.client.rest import ApiException

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kopf" / "12_embedded.py"

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "kopfexamples.zalando.org"},
    "spec": {
        "group": "zalando.org",
        "scope": "Namespaced",
        "names": {"plural": "kopfexamples", "singular": "kopfexample", "kind": "KopfExample"},
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        }],
    },
}  # fmt: skip


def ensure_crd(api: kubernetes.client.ApiClient) -> None:
    ext = kubernetes.client.ApiextensionsV1Api(api)
    try:
        ext.create_custom_resource_definition(CRD)
    except ApiException as exc:
        if exc.status != 409:
            raise
    deadline = time.monotonic() + 30
    while True:
        conditions = ext.read_custom_resource_definition(CRD["metadata"]["name"]).status.conditions or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            return
        assert time.monotonic() < deadline, "the KopfExample CRD was not established"
        time.sleep(0.1)


def test_the_embedded_operator_reconciles_while_the_app_works_and_stops_gracefully(control_plane, k8s_api):
    ensure_crd(k8s_api)
    done = subprocess.run([sys.executable, str(EXAMPLE)], env=control_plane.env(), capture_output=True, text=True, timeout=120)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert lines[0] == "Starting the main app." and lines[-1] == "Exiting the main app."
    assert [line for line in lines if line.startswith("Do the main app")] == [f"Do the main app activity here. Step {i}/3." for i in (1, 2, 3)]
    for step in range(3):  # each object reconciled while it existed, and once it was gone
        assert f"Reconciled kopf-example-{step}: exists" in lines, done.stdout
        assert f"Reconciled kopf-example-{step}: gone" in lines, done.stdout
