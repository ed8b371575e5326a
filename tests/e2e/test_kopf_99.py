"""examples/kopf/99_all_at_once.py (Kopf's examples/99-all-at-once) as a user runs it: the two
create handlers' results land in status.create_1 and status.create_2 (the second after one
"Whoops!" retry, recorded on the object), create_1's Events are recorded once, the update handler
prints the spec's diff, the field handler spec.lst's old and new value, and the delete handler's
finalizer lets the object go."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from declop.testing.cluster.runner import OperatorProcess, wait_for

pytestmark = pytest.mark.integration

KOPF = Path(__file__).resolve().parents[2] / "examples" / "kopf"


def kubectl(env: dict[str, str], *args: str, input: str | None = None, check: bool = True) -> str:
    result = subprocess.run(["kubectl", *args], env=env, input=input, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 or not check, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


def test_kopf_99_all_at_once(control_plane: Any, namespace: str) -> None:
    env = {**control_plane.env(), "PYTHONUNBUFFERED": "1"}
    kubectl(env, "apply", "-f", str(KOPF / "crd.yaml"))
    kubectl(env, "wait", "--for=condition=Established", "crd/kopfexamples.kopf.dev", "--timeout=30s")
    example = {"apiVersion": "kopf.dev/v1", "kind": "KopfExample", "metadata": {"name": "kex-99"}, "spec": {"field": "value"}}

    def status() -> dict[str, Any]:
        out = kubectl(env, "get", "kex", "kex-99", "-n", namespace, "-o", "json", check=False)
        return (json.loads(out).get("status") or {}) if out else {}

    with OperatorProcess([str(KOPF / "99_all_at_once.py"), "-n", namespace], env=env) as op:
        op.wait_for_line("Starting workers", count=5)
        kubectl(env, "apply", "-n", namespace, "-f", "-", input=json.dumps(example))
        wait_for(lambda: status().get("create_1") == {"job1-status": 100} and status().get("create_2") == {"job2-status": 100},
                 30, what="both create handlers' results in the status")  # fmt: skip
        assert "\n".join(op.stderr + op.lines).count("Whoops!") >= 1
        events = json.loads(kubectl(env, "get", "events.events.k8s.io", "-n", namespace, "-o", "json"))["items"]
        reasons = sorted(e["reason"] for e in events if e["regarding"]["name"] == "kex-99")
        assert reasons == ["AnyReason", "SomeReason"], reasons
        kubectl(env, "patch", "kex", "kex-99", "-n", namespace, "--type=merge", "-p", '{"spec": {"lst": [1, 2]}}')
        op.wait_for_line("Handling the FIELD = None -> [1, 2]")
        op.wait_for_line("Handling the diff")
        op.wait_for_line("[Change(op='add', path=('lst',), old=None, new=[1, 2])]")
        kubectl(env, "delete", "kex", "kex-99", "-n", namespace, "--wait=false")
        wait_for(lambda: "kex-99" not in kubectl(env, "get", "kex", "-n", namespace, "-o", "name"), 20, what="the object to go")
        assert status() == {}
    assert op.returncode == 0
    assert "\n".join(op.lines).count("Handling the FIELD = None -> [1, 2]") == 1  # (and [1, 2] -> None as it goes: changes.md)
