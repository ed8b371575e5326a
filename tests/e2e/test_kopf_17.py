"""examples/kopf/17_admission.py, Kopf's 17-admission, as a user runs it: `declop run` serving
the webhooks over HTTPS on this host, the real kube-apiserver calling them, kubectl as a user
types it. What Kopf's example shows: warnings on every write, a denial unless it is a dry run, a
field=/value= filter that denies with its own code, a subresource="*" validator that denies a
status write and warns on a main-resource write, and a mutator limited by a label selector."""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from declop.testing.cluster.runner import OperatorProcess, wait_for

pytestmark = pytest.mark.integration

KOPF = Path(__file__).resolve().parents[2] / "examples" / "kopf"


def kubectl(env: dict[str, str], *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["kubectl", *args], env=env, input=stdin, capture_output=True, text=True, timeout=60)
    assert not check or done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kex(namespace: str, name: str, field: str, **labels: str) -> str:
    return json.dumps({"apiVersion": "kopf.dev/v1", "kind": "KopfExample",
                       "metadata": {"name": name, "namespace": namespace, "labels": labels}, "spec": {"field": field}})


def test_kopf_17_admission(control_plane: Any, namespace: str) -> None:
    env = control_plane.env()
    kubectl(env, "apply", "-f", str(KOPF / "crd.yaml"))
    kubectl(env, "wait", "--for=condition=Established", "crd/kopfexamples.kopf.dev")
    name = f"kopf17-{secrets.token_hex(3)}"

    def apply(manifest: str, *args: str) -> subprocess.CompletedProcess[str]:
        return kubectl(env, "apply", "-n", namespace, "-f", "-", *args, stdin=manifest, check=False)

    args = [str(KOPF / "17_admission.py"), "--webhook-port", str(free_port()), "--webhook-name", name,
            "--webhook-namespace", "default", "--log-format", "json"]
    try:
        with OperatorProcess(args, env=env) as op:
            op.wait_for_line("Registered MutatingWebhookConfiguration")
            lazy = kex(namespace, "lazy", "not-allowed")
            wait_for(lambda: "Go away!" in apply(lazy, "--dry-run=server").stderr, 20, 0.2, "the webhooks to be enforced")

            # validate2 (field=, value=): denied with its message, whatever else the object says
            denied = apply(lazy)
            assert denied.returncode != 0
            assert 'admission webhook "validate2.kopfexamples.kopf.dev" denied the request: ' \
                   "I'm too lazy anyway. Go away!" in denied.stderr, denied.stderr
            # validate1: "wrong" is denied, but a dry run of it passes
            assert "Meh! I don't like it" in apply(kex(namespace, "wrong", "wrong")).stderr
            dry = apply(kex(namespace, "wrong", "wrong"), "--dry-run=server")
            assert dry.returncode == 0, dry.stderr

            # authhook and validate_subresources on the main resource: warnings; mutate1 by label
            made = apply(kex(namespace, "kex1", "value", somelabel="somevalue"))
            assert made.returncode == 0, made.stderr
            assert "Warning: Accessing as user: " in made.stderr, made.stderr
            assert "Warning: Also update status.field to match spec.field: 'value' != None" in made.stderr
            assert apply(kex(namespace, "kex2", "value")).returncode == 0
            spec = {n: json.loads(kubectl(env, "get", "kex", n, "-n", namespace, "-o", "json").stdout)["spec"] for n in ("kex1", "kex2")}
            assert spec == {"kex1": {"field": "value", "injected": 123}, "kex2": {"field": "value"}}

            # validate_subresources on the status subresource: a mismatch is denied, a match stored
            status = ["patch", "kex", "kex2", "-n", namespace, "--type=merge", "--subresource=status", "-p"]
            mismatch = kubectl(env, *status, '{"status": {"field": "other"}}', check=False)
            assert mismatch.returncode != 0 and "status.field MUST be equal to spec.field!" in mismatch.stderr, mismatch.stderr
            kubectl(env, *status, '{"status": {"field": "value"}}')
            stored = json.loads(kubectl(env, "get", "kex", "kex2", "-n", namespace, "-o", "json").stdout)
            assert stored["status"] == {"field": "value"}
            again = apply(kex(namespace, "kex2", "value"))
            assert again.returncode == 0 and "Also update status.field" not in again.stderr, again.stderr
    finally:  # a Fail webhook of a stopped operator would block every later write of kopfexamples
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            kubectl(env, "delete", kind, name, "--ignore-not-found", check=False)
        kubectl(env, "delete", "secret", f"{name}-webhook-ca", "-n", "default", "--ignore-not-found", check=False)
