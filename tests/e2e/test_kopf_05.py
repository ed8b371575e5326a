"""examples/kopf/05_handlers.py (Kopf's examples/05-handlers) as a user runs it: `declop run` as a
process, kubectl against the real control plane, the operator's stdout checked for what Kopf's
example prints — create, update, field and delete handlers once each per change, and nothing
handled again after a restart (the snapshots are on the object, not in the process)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from declop.testing.cluster.runner import OperatorProcess, wait_for

pytestmark = pytest.mark.integration

KOPF = Path(__file__).resolve().parents[2] / "examples" / "kopf"


def kubectl(env: dict[str, str], *args: str, input: str | None = None) -> str:
    result = subprocess.run(["kubectl", *args], env=env, input=input, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


def count(op: OperatorProcess, text: str) -> int:
    """How often ``text`` was printed (handlers print from several threads: lines may interleave)."""
    return "\n".join(op.lines).count(text)


def fields(op: OperatorProcess) -> list[str]:
    return re.findall(r"FIELD CHANGED: \w+ -> \w+", "\n".join(op.lines))


def test_kopf_05_handlers(control_plane: Any, namespace: str) -> None:
    env = {**control_plane.env(), "PYTHONUNBUFFERED": "1"}
    kubectl(env, "apply", "-f", str(KOPF / "crd.yaml"))
    kubectl(env, "wait", "--for=condition=Established", "crd/kopfexamples.kopf.dev", "--timeout=30s")
    example = {"apiVersion": "kopf.dev/v1", "kind": "KopfExample", "metadata": {"name": "kopf-example-1"},
               "spec": {"field": "value", "items": ["a"]}}  # fmt: skip
    args = [str(KOPF / "05_handlers.py"), "-n", namespace]
    with OperatorProcess(args, env=env) as op:
        op.wait_for_line("Starting workers")
        kubectl(env, "apply", "-n", namespace, "-f", "-", input=json.dumps(example))
        for line in ("CREATED 1st", "CREATED 2nd", "FIELD CHANGED: None -> value"):
            op.wait_for_line(line)
        kubectl(env, "patch", "-n", namespace, "kopfexample", "kopf-example-1", "--type=merge", "-p", '{"spec":{"field":"changed"}}')
        op.wait_for_line("FIELD CHANGED: value -> changed")
        op.wait_for_line("UPDATED")
        kubectl(env, "patch", "-n", namespace, "kopfexample", "kopf-example-1", "--type=merge", "-p", '{"spec":{"items":["a","b"]}}')
        op.wait_for_line("UPDATED", count=2)  # spec changed, spec.field did not
        assert count(op, "CREATED 1st") == count(op, "CREATED 2nd") == 1, op.lines
        assert count(op, "UPDATED") == 2, op.lines
        assert count(op, "RESUMED 1st") == count(op, "RESUMED 2nd") == 1, op.lines  # first_seen: once
        assert fields(op) == ["FIELD CHANGED: None -> value", "FIELD CHANGED: value -> changed"], op.lines
    with OperatorProcess(args, env=env) as again:  # a restart: what was handled stays handled
        again.wait_for_line("RESUMED 1st")
        again.wait_for_line("RESUMED 2nd")
        kubectl(env, "patch", "-n", namespace, "kopfexample", "kopf-example-1", "--type=merge", "-p", '{"spec":{"field":"third"}}')
        again.wait_for_line("FIELD CHANGED: changed -> third")
        again.wait_for_line("UPDATED")
        kubectl(env, "delete", "-n", namespace, "kopfexample", "kopf-example-1", "--wait=false")
        again.wait_for_line("DELETED 1st")
        again.wait_for_line("DELETED 2nd")
        wait_for(lambda: "kopf-example-1" not in kubectl(env, "get", "kopfexamples", "-n", namespace, "-o", "name"), 20,
                 what="the example to go")  # fmt: skip
        assert count(again, "CREATED 1st") == count(again, "CREATED 2nd") == 0, again.lines
        assert count(again, "UPDATED") == 1 and count(again, "DELETED 1st") == count(again, "DELETED 2nd") == 1, again.lines
        assert count(again, "RESUMED 1st") == count(again, "RESUMED 2nd") == 1, again.lines  # once per process: first_seen
    assert again.returncode == 0
