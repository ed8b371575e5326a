"""A local node killed outright (SIGKILL: nothing of its own clean-up runs) is cleaned up by the
next start, which then runs the seed; a second node beside a live one is refused and changes nothing.

One chain of runs, each the next one's victim, so that every start both recovers and is killed:

1. ``declop dev --node examples/pods.py`` killed during the node's start (its kubelet just started);
2. the next one recovers, reaches the operator Pod Ready, refuses a second node (and a
   ``--clean``) beside it, and is killed right then;
3. the next one recovers, gets Ctrl-C, and is killed during its own clean-up (kubelet stopped,
   containerd not yet);
4. ``make run`` recovers, and is killed (its whole process group) while its node starts;
5. ``make run`` recovers, plays the seed scenario, and stops cleanly on SIGHUP (a closed terminal).

After each recovery, before the new run touches the host, the host is compared with the snapshot
taken before the first run (iptables, nftables, links, mounts, sysctls, cgroups, host folders,
node processes and folders) and everything the killed run's record named is checked gone: its
processes (pid and start time), folders, cgroup root and the record itself.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from declop.testing import wait_for
from declop.testing.cluster.host import cgroup_hierarchies
from declop.testing.cluster.runrecord import RECORDS_DIR, RunRecord

ROOT = Path(__file__).resolve().parents[2]
SEED = ["examples/pods.py"]
START = 600.0  # the first start may build declop's image (minutes); later ones reuse it
Snapshot = Callable[[], dict[str, object]]


class Run:
    """One ``declop dev --node`` or ``make run``, its output lines collected as they come."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv = argv
        # own session: `make run` is killed as a terminal would kill it, its whole process group
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self._path: Path | None = None
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines[-40:])

    def wait(self, condition: Callable[[], object], what: str, timeout: float = START) -> None:
        """wait_for, with this run's last lines (as they are then) when it times out."""
        try:
            wait_for(condition, timeout=timeout, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {' '.join(self.argv[-3:])} said:\n{self.output()}") from None

    def wait_line(self, text: str, timeout: float = START) -> str:
        self.wait(lambda: any(text in l for l in self.lines), repr(text), timeout)
        return next(l for l in self.lines if text in l)

    def record(self) -> RunRecord | None:
        """This run's record: the one whose owner is in this run's session (declop itself, or
        the declop that `make run` started)."""
        if self._path is None:
            for path in RECORDS_DIR.glob("*.json"):
                if _session(int(path.stem)) == self.proc.pid:
                    self._path = path
        if self._path is None:
            return None
        try:
            return RunRecord.load(self._path)
        except (OSError, ValueError):
            return None

    def wait_record(self, ready: Callable[[RunRecord], bool], what: str, timeout: float = START) -> RunRecord:
        self.wait(lambda: (r := self.record()) is not None and ready(r), what, timeout)
        record = self.record()
        assert record is not None
        return record

    def kill(self, sig: signal.Signals = signal.SIGKILL, *, group: bool = False) -> None:
        """Signal the process only (as the OOM killer or `kill -9 PID` does), or its whole
        process group (as a terminal does: Ctrl-C, a closed window)."""
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)


def _session(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None


def using(folders: list[str]) -> list[str]:
    """Processes whose working folder, command line or environment names one of ``folders``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            seen = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
            seen += os.readlink(entry / "cwd").encode()
        except OSError:
            continue
        if any(f.encode() in seen for f in folders) and _session(int(entry.name)) is not None:
            found.append(f"{entry.name}: {seen[:200]!r}")
    return found


def names(record: RunRecord) -> set[str]:
    return {p.name for p in record.processes}


def node_started(record: RunRecord) -> bool:
    return any("/declop-node-" in f for f in record.folders)


def recovered(run: Run, killed: RunRecord, before: dict[str, object], snapshot: Snapshot) -> list[str]:
    """Wait for ``run`` to clean up after ``killed``; check the host is back to ``before`` while
    ``run`` has not touched it yet; return the clean-up's lines."""
    done = run.wait_line(f"Cleaned up after the declop node of pid {killed.owner.pid}.", timeout=120)
    now = snapshot()
    mine = run.record()
    # the new run's own record (and the copy it may be writing aside), made before its first change
    now["run records"] = [n for n in now["run records"] if _session(int(n.lstrip(".").split(".")[0])) != run.proc.pid]  # type: ignore[attr-defined]
    assert now == before
    assert mine is None or not node_started(mine), "the snapshot came too late: the new node had started"
    assert [p for p in killed.processes if p.alive()] == []
    assert using(killed.folders) == []  # helm, `kubectl logs -f`, shims: nothing runs in, names or uses them
    assert [f for f in killed.folders if os.path.lexists(f)] == []
    assert not killed.path.exists()
    root = killed.cgroup_root.lstrip("/")
    assert not root or not any((h / root).exists() for h in cgroup_hierarchies())
    first = next(i for i, l in enumerate(run.lines) if l.startswith(f"A declop node (pid {killed.owner.pid},"))
    return run.lines[first + 1 : run.lines.index(done)]


def test_a_killed_node_is_cleaned_up_by_the_next_start(tmp_path: Path, host_snapshot: Snapshot) -> None:
    env = {**os.environ, "DECLOP_KUBECONFIG_OUT": str(tmp_path / "kubeconfig")}
    # the baseline: what an earlier killed run may have left is removed first (`--clean` alone)
    clean = subprocess.run([sys.executable, "-m", "declop", "dev", "--node", "--clean"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert clean.returncode == 0, clean.stderr
    before = host_snapshot()
    dev = [sys.executable, "-m", "declop", "dev", "--node", *SEED]
    make = ["make", "run", f"VENV={Path(sys.executable).parent.parent}"]
    runs: list[Run] = []
    try:
        # 1. killed during the node's start: containerd is up, the kubelet has just started
        first = Run(dev, env)
        runs.append(first)
        killed = first.wait_record(lambda r: "kubelet" in names(r), "the node's start")
        first.kill()
        first.proc.wait()

        # 2. recovers; killed right after the operator Pod is Ready
        second = Run(dev, env)
        runs.append(second)
        lines = recovered(second, killed, before, host_snapshot)
        kubelet = next(p for p in killed.processes if p.name == "kubelet")
        assert f"stopped kubelet (pid {kubelet.pid})" in lines and "stopped containerd" in "\n".join(lines), lines
        assert any(l.startswith("removed folder /tmp/declop-node-") for l in lines), lines
        second.wait_line("Operator running in-cluster")
        refused_a_second_node_beside(second, env, host_snapshot)
        killed = second.record()  # type: ignore[assignment]
        second.kill()  # its helm and `kubectl logs -f` children live on: the clean-up finds them
        second.proc.wait()

        # 3. recovers (the Pod and its iptables rules were there); killed during its own clean-up
        third = Run(dev, env)
        runs.append(third)
        lines = recovered(third, killed, before, host_snapshot)
        assert any(l.startswith("stopped container process") for l in lines), lines  # the operator Pod
        assert any(l.startswith("removed iptables nat chain KUBE-SVC-") for l in lines), lines
        assert "removed interface declop0" in lines, lines
        if before["sysctls"]["net/ipv4/conf/all/route_localnet"] == "0\n":  # type: ignore[index]
            assert "restored sysctl net/ipv4/conf/all/route_localnet=1 (was 0)" in lines, lines
        third.wait_line("Operator running in-cluster")
        record = third.record()
        assert record is not None
        kubelet = next(p for p in record.processes if p.name == "kubelet")
        containerd = next(p for p in record.processes if p.name == "containerd")
        third.kill(signal.SIGINT, group=True)  # Ctrl-C: the clean-up stops the scheduler, kube-proxy, kubelet…
        third.wait(lambda: not kubelet.alive(), "the kubelet stopped by the clean-up", timeout=60)
        third.kill()
        third.proc.wait()
        assert containerd.alive() and record.path.exists(), "killed after its clean-up, not during it"
        killed = record

        # 4. `make run` recovers; killed (its process group) while its node starts
        fourth = Run(make, env)
        runs.append(fourth)
        lines = recovered(fourth, killed, before, host_snapshot)
        assert f"stopped containerd (pid {containerd.pid})" in lines, lines
        killed = fourth.wait_record(lambda r: "kube-proxy" in names(r), "make run's node start")
        fourth.kill(group=True)
        fourth.proc.wait()

        # 5. `make run` recovers and plays the seed; a closed terminal (SIGHUP) stops it cleanly
        fifth = Run(make, env)
        runs.append(fifth)
        recovered(fifth, killed, before, host_snapshot)
        fifth.wait_line("Operator running in-cluster")
        play_the_seed(fifth, tmp_path / "kubeconfig")
        fifth.kill(signal.SIGHUP, group=True)
        fifth.wait(lambda: "Control plane stopped." in fifth.lines, "the stop on SIGHUP", timeout=120)
        fifth.proc.wait()
    finally:
        for run in runs:
            if run.proc.poll() is None:
                run.kill(group=True)
                run.proc.wait()
    assert host_snapshot() == before


def refused_a_second_node_beside(running: Run, env: dict[str, str], snapshot: Snapshot) -> None:
    """A second `declop dev --node` (and a `--clean`) while ``running`` lives: one line, exit 1,
    and nothing changed — not the host, not the running node's record."""
    record = running.record()
    assert record is not None
    state, saved = snapshot(), record.path.read_bytes()
    expected = (
        f"declop: error: another declop node is running on this host ({record.describe()}); stop it with "
        f"Ctrl-C in its terminal or `kill {record.owner.pid}` (it cleans up on SIGINT, SIGTERM and SIGHUP)"
    )
    for args in (SEED, ["--clean"]):
        refused = subprocess.run(
            [sys.executable, "-m", "declop", "dev", "--node", *args], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert (refused.returncode, refused.stdout, refused.stderr.splitlines()) == (1, "", [expected])
    assert snapshot() == state and record.path.read_bytes() == saved
    assert all(p.alive() for p in record.processes)


def play_the_seed(run: Run, kubeconfig: Path) -> None:
    """README's scenario: kubectl run, label, delete — the operator's lines reach the terminal."""
    assets = next(re.search(r"export PATH=(\S+):", l).group(1) for l in run.lines if "export PATH=" in l)  # type: ignore[union-attr]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PATH": f"{assets}:{os.environ['PATH']}"}

    def kubectl(*args: str) -> None:
        done = subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr

    def seen(message: str) -> int:
        return sum(1 for l in run.lines if l.startswith(f"INFO {message}") and '"name": "nginx"' in l)

    kubectl("run", "nginx", "--image", "nginx")
    run.wait(lambda: seen("Pod created") >= 1, "'Pod created'", timeout=90)
    kubectl("label", "pod", "nginx", "env=prod")
    run.wait(lambda: seen("Pod created") >= 2, "'Pod created' after the label", timeout=30)
    kubectl("delete", "pod", "nginx")
    run.wait(lambda: seen("The pod was deleted") >= 1, "'The pod was deleted'", timeout=60)


pytestmark = pytest.mark.node
