"""examples/kopf/14_daemons.py does what Kopf's 14-daemons does, run as a user runs it: both daemons
fail three times and are restarted, then ping with the object's field; the sync one writes its
failures to the status; deleting the object stops both (the async one cancelled after its
stop_timeout, the thread at its stop flag, writing its last status) before the object goes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from declop.testing.cluster.runner import OperatorProcess, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KOPF = ROOT / "examples" / "kopf"


def kubectl(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr}")
    return done


def test_kopf_14_daemons(control_plane: Any, namespace: str) -> None:
    env = control_plane.env()
    kubectl(env, "apply", "-f", str(KOPF / "crd.yaml"))
    kubectl(env, "wait", "--for=condition=Established", "crd/kopfexamples.kopf.dev")
    with OperatorProcess([str(KOPF / "14_daemons.py"), "-n", namespace], env=env) as op:
        op.wait_for_line("Starting workers", count=2)
        kubectl(env, "apply", "-n", namespace, "-f", str(KOPF / "obj.yaml"))
        op.wait_for_line("=> Ping from a sync daemon: field='value', retry=3", timeout=30)
        op.wait_for_line("=> Ping from an async daemon: field='value'", timeout=30)
        assert len([line for line in op.lines if "Daemon failed; restarting in 1 s" in line]) == 6

        def status() -> Any:
            got = json.loads(kubectl(env, "get", "-n", namespace, "kopfexample", "kopf-example-1", "-o", "json").stdout)
            return got.get("status", {}).get("message")

        assert status() == "Failed 3 times."
        finalizers = json.loads(kubectl(env, "get", "-n", namespace, "kopfexample", "kopf-example-1", "-o", "json").stdout)["metadata"]["finalizers"]
        assert sorted(finalizers) == ["daemons.declop.dev/background_async", "daemons.declop.dev/background_sync"]
        kubectl(env, "delete", "-n", namespace, "kopfexample", "kopf-example-1", "--wait=true", "--timeout=30s")
        # gone: both daemons ended first
        op.wait_for_line("Daemon cancelled", timeout=5)
        op.wait_for_line("Daemon stopped", timeout=5)
    assert op.returncode == 0
