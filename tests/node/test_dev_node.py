"""`declop dev --node examples/pods.py` (what `make run` starts), as a new user runs it.

One command: a control plane and a node, the image from the Dockerfile, the chart with the file
as its handlers and the RBAC `declop rbac examples/pods.py --values` generates (no wildcard: the
seed has no rbac-values.yaml); the operator runs as a Pod, its lines reach the terminal and
`kubectl logs`, and Ctrl-C leaves the host as it was.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from declop.testing import wait_for

ROOT = Path(__file__).resolve().parents[2]


def test_declop_dev_node_runs_the_seed_in_cluster_and_ctrl_c_leaves_nothing(
    tmp_path: Path, host_snapshot: Callable[[], dict[str, object]]
) -> None:
    before = host_snapshot()
    out = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "declop", "dev", "--node", "examples/pods.py", "--kubeconfig-out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        wait_for(lambda: any("Operator running in-cluster" in l for l in lines), timeout=300,
                 what="the operator Pod to be Ready:\n" + "\n".join(lines))  # fmt: skip
        assets = next(re.search(r"export PATH=(\S+):", l).group(1) for l in lines if "export PATH=" in l)  # type: ignore[union-attr]
        env = {**os.environ, "KUBECONFIG": str(out), "PATH": f"{assets}:{os.environ['PATH']}"}

        def kubectl(*args: str) -> str:
            done = subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=120, check=False)
            assert done.returncode == 0, done.stderr
            return done.stdout

        def seen(message: str) -> int:
            return sum(1 for l in lines if l.startswith(f"INFO {message}") and '"name": "nginx"' in l)

        assert any("No rbac-values.yaml beside the handlers" in l for l in lines), "\n".join(lines)
        role = json.loads(kubectl("get", "clusterrole", "declop-system-declop", "-o", "json"))
        granted = {(r["apiGroups"][0], r["resources"][0]) for r in role["rules"]}
        assert {("", "pods"), ("events.k8s.io", "events")} <= granted and ("*", "*") not in granted, role["rules"]
        kubectl("run", "nginx", "--image", "nginx")
        wait_for(lambda: seen("Pod created") >= 1, timeout=60, what="'Pod created' in the terminal")  # a fresh Lease: ~27 s
        kubectl("label", "pod", "nginx", "env=prod")
        wait_for(lambda: seen("Pod created") >= 2, timeout=30, what="'Pod created' after the label")
        kubectl("delete", "pod", "nginx")
        wait_for(lambda: seen("The pod was deleted") >= 1, timeout=60, what="'The pod was deleted'")
        logs = kubectl("logs", "-n", "declop-system", "deploy/declop")
        assert "INFO The pod was deleted" in logs and '"name": "nginx"' in logs
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=90) == 0, "\n".join(lines[-30:])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(10)
    assert "Control plane stopped." in lines
    assert host_snapshot() == before
