"""examples/kopf/07_subhandlers.py (Kopf's examples/07-subhandlers) as a user runs it: one
sub-handler per item of spec.items, each run once — not again on later changes of the object nor
after a restart (the steps record is on the object) — and an item added later is handled too."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from declop.testing.cluster.runner import OperatorProcess

pytestmark = pytest.mark.integration

KOPF = Path(__file__).resolve().parents[2] / "examples" / "kopf"


def kubectl(env: dict[str, str], *args: str, input: str | None = None) -> str:
    result = subprocess.run(["kubectl", *args], env=env, input=input, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


def handled(op: OperatorProcess, item: str) -> int:
    return sum(1 for line in list(op.lines) if line == f"=== Handling creation for {item}. ===")


def test_kopf_07_subhandlers(control_plane: Any, namespace: str) -> None:
    env = {**control_plane.env(), "PYTHONUNBUFFERED": "1"}
    kubectl(env, "apply", "-f", str(KOPF / "crd.yaml"))
    kubectl(env, "wait", "--for=condition=Established", "crd/kopfexamples.kopf.dev", "--timeout=30s")
    example = {"apiVersion": "kopf.dev/v1", "kind": "KopfExample", "metadata": {"name": "kopf-example-1"},
               "spec": {"items": ["item1", "item2"]}}  # fmt: skip
    args = [str(KOPF / "07_subhandlers.py"), "-n", namespace]
    with OperatorProcess(args, env=env) as op:
        op.wait_for_line("Starting workers")
        kubectl(env, "apply", "-n", namespace, "-f", "-", input=json.dumps(example))
        op.wait_for_line("=== Handling creation for item1. ===")
        op.wait_for_line("=== Handling creation for item2. ===")
        kubectl(env, "patch", "-n", namespace, "kopfexample", "kopf-example-1", "--type=merge", "-p",
                '{"spec":{"items":["item1","item2","item3"]}}')  # fmt: skip
        op.wait_for_line("=== Handling creation for item3. ===")
        assert [handled(op, i) for i in ("item1", "item2", "item3")] == [1, 1, 1], op.lines
    with OperatorProcess(args, env=env) as again:  # a restart: nothing is handled again
        again.wait_for_line("Starting workers")
        kubectl(env, "patch", "-n", namespace, "kopfexample", "kopf-example-1", "--type=merge", "-p",
                '{"spec":{"items":["item1","item2","item3","item4"]}}')  # fmt: skip
        again.wait_for_line("=== Handling creation for item4. ===")
        assert [handled(again, i) for i in ("item1", "item2", "item3")] == [0, 0, 0], again.lines
    assert again.returncode == 0
