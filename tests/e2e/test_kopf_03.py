"""examples/kopf/03_exceptions.py (Kopf's examples/03-exceptions) as a user runs it: `declop run`
as a process, kubectl against the real control plane. What Kopf's example does: the handler fails
three times — a temporary error (retried after its delay), an ordinary exception (retried after
the backoff), a permanent one (never again) — and a restart neither repeats nor forgets it: the
steps record on the object says so."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from declop.testing.cluster.runner import OperatorProcess, wait_for

pytestmark = pytest.mark.integration

KOPF = Path(__file__).resolve().parents[2] / "examples" / "kopf"
RECORD = "steps.declop.dev/create_fn"


def kubectl(env: dict[str, str], *args: str, input: str | None = None) -> str:
    result = subprocess.run(["kubectl", *args], env=env, input=input, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


def record(env: dict[str, str], namespace: str) -> dict[str, Any]:
    obj = json.loads(kubectl(env, "get", "-n", namespace, "kopfexample", "kopf-example-1", "-o", "json"))
    return json.loads((obj["metadata"].get("annotations") or {}).get(RECORD) or "{}").get("create_fn") or {}


def test_kopf_03_exceptions(control_plane: Any, namespace: str) -> None:
    env = {**control_plane.env(), "PYTHONUNBUFFERED": "1"}
    kubectl(env, "apply", "-f", str(KOPF / "crd.yaml"))
    kubectl(env, "wait", "--for=condition=Established", "crd/kopfexamples.kopf.dev", "--timeout=30s")
    example = {"apiVersion": "kopf.dev/v1", "kind": "KopfExample", "metadata": {"name": "kopf-example-1"},
               "spec": {"field": "value"}}  # fmt: skip
    args = [str(KOPF / "03_exceptions.py"), "-n", namespace]
    with OperatorProcess(args, env=env) as op:
        op.wait_for_line("Starting workers")
        kubectl(env, "apply", "-n", namespace, "-f", "-", input=json.dumps(example))
        op.wait_for_line("First failure.")  # the TemporaryError: retried after its delay of 1 s
        op.wait_for_line("Second failure.")  # MyException: retried after backoff=1
        op.wait_for_line("Third failure, the final one.")  # the TerminalError: failed for good
        wait_for(lambda: record(env, namespace).get("failed") == "Third failure, the final one.", 20, what="the failure on record")
        assert record(env, namespace)["attempts"] == 3
        assert sum("Second failure." in line for line in op.lines) >= 1
    with OperatorProcess(args, env=env) as again:  # a restart: the failure is not repeated, nor forgotten
        again.wait_for_line("Starting workers")
        again.wait_for_line("failed for good")  # the record says so: TerminalError, and no new attempt
        kubectl(env, "annotate", "-n", namespace, "kopfexample", "kopf-example-1", "touch=1")  # another wake-up
        again.wait_for_line("failed for good", count=2)
        assert not any(f in line for line in again.lines for f in ("First failure.", "Second failure.")), again.lines
        assert record(env, namespace)["attempts"] == 3
