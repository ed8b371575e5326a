"""declop.testing.cluster.node: a real node starts, runs Pods, and leaves nothing behind when stopped.

The leftovers check does not trust :meth:`Node.leftovers` alone: it also looks at the host with
the usual tools (``/proc``, ``mount``, ``iptables-save``, ``ip link``, ``/proc/sys``).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from declop.errors import ConfigError
from declop.testing import ControlPlane, wait_for
from declop.testing.cluster.node import Node

ROOT = Path(__file__).resolve().parents[2]


def sh(cp: ControlPlane, *args: str) -> str:
    result = subprocess.run(list(args), env=cp.env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{' '.join(args)}: {result.stderr}"
    return result.stdout


def test_a_node_runs_pods_reaches_the_apiserver_and_leaves_nothing_behind(
    host_snapshot: Callable[[], dict[str, object]],
) -> None:
    before = host_snapshot()
    cp = ControlPlane(node=True)
    cp.start()
    try:
        node = cp.node
        assert node is not None
        ready = sh(cp, "kubectl", "get", "node", node.name, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}")
        assert ready == "True"
        # A Pod with the sandbox image and a NodePort Service: CNI, kube-proxy rules, mounts.
        sh(cp, "kubectl", "run", "sleeper", "--image=declop.local/pause:1", "--image-pull-policy=Never")
        sh(cp, "kubectl", "expose", "pod", "sleeper", "--port=80", "--type=NodePort")
        sh(cp, "kubectl", "wait", "--for=condition=Ready", "pod/sleeper", "--timeout=60s")
        ip = sh(cp, "kubectl", "get", "pod", "sleeper", "-o", "jsonpath={.status.podIP}")
        assert ip.startswith("10.244.0.")
        pids = dict(node._pids)
    finally:
        cp.stop()
    assert node.leftovers() == []
    for name, pid in pids.items():
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2], name
    assert host_snapshot() == before
    assert "declop-node" not in Path("/proc/self/mountinfo").read_text()


def test_a_second_node_on_the_same_host_is_refused_with_one_line() -> None:
    with ControlPlane(node=True) as cp:
        first = cp.node
        assert first is not None
        second = ControlPlane(node=True)
        with pytest.raises(ConfigError, match=r"^another declop node is running on this host \(pid \d+, `.*`, since .*\); stop it with Ctrl-C"):
            second.start()
        assert second.node is None and not second.pids  # refused before anything started
        # The first node is untouched by the refusal.
        wait_for(lambda: " Ready " in sh(cp, "kubectl", "get", "nodes", "--no-headers"), timeout=10)
    assert first.leftovers() == []


def test_without_root_declop_dev_node_says_so_in_one_line() -> None:
    result = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
         sys.executable, "-m", "declop", "dev", "--node", "examples/pods.py"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result
    assert result.stderr.splitlines() == [
        "declop: error: a local node needs root (containerd, kubelet and kube-proxy manage "
        "mounts, cgroups and iptables); run as root, or leave the node out (make test-fast)"
    ], result.stderr


def test_a_missing_package_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from declop.testing.cluster import node as module

    monkeypatch.setitem(module.PACKAGES, "containernetworking-plugins", "/nonexistent/bridge")
    with pytest.raises(ConfigError, match=r"needs the Debian packages containernetworking-plugins;"):
        Node.__new__(Node).check()
