"""tools/node/build.sh and its pause (tools/node/pause.c), for real: the binaries it prints,
its one-line error without root, and pause's contract as a Pod sandbox's PID 1 (exits 0 on
SIGTERM/SIGINT, reaps orphans). Needs root (the binaries are built on first use)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from declop.testing import wait_for

pytestmark = pytest.mark.node

ROOT = Path(__file__).resolve().parents[2]
NODE_BUILD = ROOT / "tools" / "node" / "build.sh"
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
BINARIES = {"kubelet", "kube-scheduler", "kube-proxy", "buildkitd", "buildctl", "pause"}


def test_build_prints_a_folder_with_every_binary(node_assets: Path) -> None:
    assert {p.name for p in node_assets.iterdir() if os.access(p, os.X_OK)} >= BINARIES
    assert not list(node_assets.glob("*.tmp"))
    again = subprocess.run(
        [str(NODE_BUILD)], capture_output=True, text=True, timeout=30, check=False
    )
    assert again.returncode == 0 and again.stdout == f"{node_assets}\n"
    assert "up to date" in again.stderr
    kubelet = subprocess.run([str(node_assets / "kubelet"), "--version"], capture_output=True,
                             text=True, check=False)  # fmt: skip
    assert kubelet.stdout.strip() == "Kubernetes v1.36.3"
    buildkitd = subprocess.run([str(node_assets / "buildkitd"), "--version"],
                               capture_output=True, text=True, check=False)  # fmt: skip
    assert buildkitd.stdout.startswith("buildkitd github.com/moby/buildkit v0.")


def test_pause_exits_0_on_sigterm_and_sigint(node_assets: Path) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        pause = subprocess.Popen([str(node_assets / "pause")])
        wait_for(lambda pid=pause.pid: _state(pid) == "S", what="pause asleep")
        pause.send_signal(sig)
        assert pause.wait(10) == 0


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def test_pause_as_pid_1_reaps_orphans(node_assets: Path) -> None:
    """An orphan in pause's PID namespace becomes its child; when it dies, no zombie stays."""
    outer = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--", str(node_assets / "pause")], start_new_session=True
    )
    try:
        pause = wait_for(lambda: _children(outer.pid), what="pause under unshare")[0]
        # a shell in pause's namespace starts a short sleep and exits: the sleep is orphaned
        subprocess.run(
            ["nsenter", "--target", str(pause), "--pid", "--", "sh", "-c", "sleep 1 & exit 0"],
            check=True,
        )
        orphan = wait_for(lambda: _children(pause), what="the orphan reparented to pause")[0]
        wait_for(lambda: _state(orphan) in ("", "X"), what="the orphan reaped, not a zombie")
        assert _children(pause) == []
    finally:
        for child in _children(outer.pid):  # pause first: unshare does not forward SIGTERM
            os.kill(child, signal.SIGTERM)
        assert outer.wait(10) == 0  # unshare exits with pause's status


def test_node_build_without_root_names_missing_packages(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path),
           "DECLOP_NODE_DEB_PACKAGES": "containerd declop-no-such-package runc"}  # fmt: skip
    result = subprocess.run(
        [*NOBODY, str(NODE_BUILD)], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        (
            "[node] error: the local node needs the Debian packages declop-no-such-package, and "
            "installing them needs root: run this as root, or 'sudo apt-get install -y "
            "--no-install-recommends declop-no-such-package' first"
        )
    ]
