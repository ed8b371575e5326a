"""`declop dev` (what `make run` starts) and the control-plane build (`declop assets build`, its
build.sh shipped in the package), as a user runs them."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "declop" / "assets" / "controlplane" / "build.sh"


def test_declop_dev_serves_a_cluster_until_ctrl_c(tmp_path):
    out = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "declop", "dev", str(ROOT / "examples" / "pods.py"), "--kubeconfig-out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        for line in proc.stdout:
            lines.append(line.rstrip())
            if "Starting workers" in line or time.monotonic() > deadline:
                break
        assert f"export KUBECONFIG={out}" in lines, "\n".join(lines)
        assets = next(re.search(r"export PATH=(\S+):", l).group(1) for l in lines if "export PATH=" in l)
        env = {**os.environ, "KUBECONFIG": str(out), "PATH": f"{assets}:{os.environ['PATH']}"}
        got = subprocess.run(["kubectl", "get", "ns", "default", "-o", "name"], env=env, capture_output=True, text=True, timeout=30)
        assert got.stdout.strip() == "namespace/default", got.stderr
        subprocess.run(["kubectl", "run", "web", "--image", "nginx"], env=env, check=True, capture_output=True, timeout=30)
        for line in proc.stdout:
            lines.append(line.rstrip())
            if '"name": "web"' in line:
                break
        assert any(l.startswith("INFO Pod created") and '"name": "web"' in l for l in lines)
        children = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()]
        assert children, "the control plane runs as child processes"
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        rest, _ = proc.communicate(timeout=60)
        lines.extend(rest.splitlines())
        assert proc.returncode == 0, "\n".join(lines)
        assert "Control plane stopped." in lines
        for pid in children:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_build_script_is_idempotent_and_fast_when_built():
    start = time.monotonic()
    result = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    folder = result.stdout.strip().splitlines()[-1]
    for binary in ("kube-apiserver", "kube-controller-manager", "etcd", "kubectl", "helm"):
        assert os.access(os.path.join(folder, binary), os.X_OK), binary
    again = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=60)
    assert again.stdout.strip() == folder and "up to date" in again.stderr
    assert time.monotonic() - start < 600


def test_declop_assets_build_finds_what_the_script_built_and_says_so_in_one_line():
    folder = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=600).stdout.strip()
    env = {k: v for k, v in os.environ.items() if k not in ("DECLOP_ASSETS_DIR", "KUBEBUILDER_ASSETS")}
    built = subprocess.run([sys.executable, "-m", "declop", "assets", "build"], capture_output=True, text=True, env=env, timeout=60)
    assert built.returncode == 0, built.stderr
    assert built.stdout.splitlines() == [folder]
    assert built.stderr.splitlines() == [f"[controlplane] up to date: {folder}"]
    path = subprocess.run([sys.executable, "-m", "declop", "assets", "path"], capture_output=True, text=True, env=env, timeout=60)
    assert (path.returncode, path.stdout, path.stderr) == (0, folder + "\n", "")


def test_kubectl_reports_the_pinned_version():
    folder = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=600).stdout.strip()
    out = subprocess.run([os.path.join(folder, "kubectl"), "version", "--client", "-o", "json"], capture_output=True, text=True)
    assert '"gitVersion": "v1.36.3"' in out.stdout


def test_build_script_without_go_says_what_to_install(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "sha256sum", "cut", "date", "mkdir", "awk", "cat"):
        path = shutil.which(tool)
        if path:
            os.symlink(path, bin_dir / tool)
    result = subprocess.run(
        ["bash", str(BUILD)],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
    )
    assert result.returncode == 2
    assert "'go' is not on PATH; install Go >= 1.26" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


DEV_SERVERS = """
import declop

@declop.reconciler("configmaps")
def seen(logger, **_):
    logger.info("Seen configmap")

@declop.validator("configmaps", labels={"dev-bind": "yes"})
def check(obj, **_):
    pass
"""


def _listening(port: int) -> set[str]:
    """The local addresses of the sockets listening on ``port`` (from /proc/net/tcp and tcp6)."""
    import ipaddress

    found: set[str] = set()
    for table, size in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            address, _, hex_port = local.partition(":")
            if state != "0A" or int(hex_port, 16) != port:
                continue
            raw = bytes.fromhex(address)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, size, 4))
            found.add(str(ipaddress.ip_address(raw)))
    return found


def test_declop_dev_listens_on_loopback_only(tmp_path):
    """Probes, metrics and webhooks of `declop dev` are on 127.0.0.1, never on the network."""
    import socket
    import urllib.request

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    handlers = tmp_path / "handlers.py"
    handlers.write_text(DEV_SERVERS)
    health, metrics, webhook = free_port(), free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "declop", "dev", str(handlers), "--kubeconfig-out", str(tmp_path / "kubeconfig"), "--no-reload",
         "--health-port", str(health), "--metrics-port", str(metrics), "--webhook-port", str(webhook)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 90
        for line in proc.stdout:
            lines.append(line.rstrip())
            if "Starting workers" in line or time.monotonic() > deadline:
                break
        assert any("Registered ValidatingWebhookConfiguration" in l for l in lines), "\n".join(lines)
        addresses = {port: _listening(port) for port in (health, metrics, webhook)}
        assert addresses == {health: {"127.0.0.1"}, metrics: {"127.0.0.1"}, webhook: {"127.0.0.1"}}, addresses
        with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=5) as r:
            assert r.read() == b"ok"
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
