"""declop.testing.cluster.recovery: a killed run's processes and folders are removed, a live one is left
alone, and a second claim on the host is refused with one line.

Real processes, a real ``flock``, records and the lock in a temporary folder (never /run). The
host state part of the clean-up (mounts, rules, links, sysctls) needs a real node:
tests/node/test_killed_node.py.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from declop.errors import ConfigError
from declop.testing.cluster import recovery
from declop.testing.cluster.runrecord import ProcessId, RunRecord


@pytest.fixture
def spawn() -> Iterator[object]:
    started: list[subprocess.Popen[bytes]] = []

    def start(*argv: str, cwd: Path | None = None) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(list(argv), cwd=cwd, start_new_session=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def dead_owner() -> ProcessId:
    proc = subprocess.Popen(["sleep", "0"])
    owner = ProcessId.of("owner", proc.pid) or ProcessId("owner", proc.pid, 1)
    proc.wait()
    return owner


def killed_run(records_dir: Path, folders: list[Path], processes: list[ProcessId]) -> RunRecord:
    """The record a run owned by a process that is gone left behind."""
    owner = dead_owner()
    record = RunRecord(records_dir / f"{owner.pid}.json", owner, "declop dev --node x.py", time.time())
    record.folders = [str(f) for f in folders]
    record.processes = processes
    record.save()
    return record


def gone(proc: subprocess.Popen[bytes]) -> bool:
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_a_killed_runs_processes_and_folders_are_removed_one_line_each(tmp_path: Path, spawn) -> None:  # type: ignore[no-untyped-def]
    records_dir, work = tmp_path / "records", tmp_path / "declop-node-1234"
    records_dir.mkdir()
    work.mkdir()
    (work / "state").mkdir()
    recorded = spawn("sleep", "301")
    inside = spawn("sleep", "302", cwd=work)  # started, then the owner died before recording it
    naming = spawn(sys.executable, "-c", "import time; time.sleep(303)", f"{work}/containerd.sock")  # names the folder
    stranger = spawn("sleep", "304")  # not the run's: its pid is in the record with another start time
    record = killed_run(
        records_dir,
        [work],
        [ProcessId.of("kubelet", recorded.pid), ProcessId("etcd", stranger.pid, 1)],  # type: ignore[list-item]
    )
    naming_name = Path(f"/proc/{naming.pid}/comm").read_text().strip()
    lines: list[str] = []
    assert recovery.recover(lines.append, lock_file=tmp_path / "lock", folder=records_dir) == 1
    assert gone(recorded) and gone(inside) and gone(naming)
    assert stranger.poll() is None  # a reused pid is never signalled
    assert not work.exists() and not record.path.exists()
    assert lines[0].startswith(f"A declop node (pid {record.owner.pid}, `declop dev --node x.py`, since ")
    assert sorted(lines[1:4]) == sorted([
        f"stopped kubelet (pid {recorded.pid})", f"stopped sleep (pid {inside.pid})", f"stopped {naming_name} (pid {naming.pid})",
    ])  # fmt: skip
    assert lines[4:] == [f"removed folder {work}", f"Cleaned up after the declop node of pid {record.owner.pid}."]
    # Nothing is left: a second clean-up finds nothing and says nothing.
    lines.clear()
    assert recovery.recover(lines.append, lock_file=tmp_path / "lock", folder=records_dir) == 0 and lines == []


def test_a_record_whose_owner_is_alive_is_left_alone_with_one_line(tmp_path: Path, spawn) -> None:  # type: ignore[no-untyped-def]
    owner = spawn("sleep", "305")
    work = tmp_path / "declop-node-live"
    work.mkdir()
    record = RunRecord(tmp_path / f"{owner.pid}.json", ProcessId.of("owner", owner.pid), "declop dev --node x.py", time.time())  # type: ignore[arg-type]
    record.folders = [str(work)]
    record.save()
    lines: list[str] = []
    with pytest.raises(ConfigError) as refused:
        recovery.recover(lines.append, lock_file=tmp_path / "lock", folder=tmp_path)
    assert str(refused.value) == (
        f"another declop node is running on this host ({record.describe()}); stop it with Ctrl-C in its "
        f"terminal or `kill {owner.pid}` (it cleans up on SIGINT, SIGTERM and SIGHUP)"
    )
    assert lines == [] and work.exists() and record.path.exists() and owner.poll() is None
    with pytest.raises(ConfigError, match="another declop node is running"):
        recovery.check_free(lock_file=tmp_path / "lock", folder=tmp_path)


def test_a_held_lock_refuses_a_second_claim_before_it_changes_anything(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    records_dir = tmp_path / "records"
    holder = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another node (even in this process: flock is per open file)
    try:
        with pytest.raises(ConfigError, match=rf"^another declop node is running on this host \(it holds {lock}\); stop it first$"):
            recovery.claim(lock_file=lock, folder=records_dir)
        assert not records_dir.exists()
    finally:
        os.close(holder)


def test_a_claim_cleans_up_then_records_the_host_and_releases(tmp_path: Path) -> None:
    records_dir = tmp_path / "records"
    records_dir.mkdir()
    leftover = tmp_path / "declop-cp-old"
    leftover.mkdir()
    killed = killed_run(records_dir, [leftover], [])
    (records_dir / f".{killed.path.name}.x1y2z3").write_text("{")  # killed while writing it aside
    lines: list[str] = []
    claim = recovery.claim(lines.append, lock_file=tmp_path / "lock", folder=records_dir)
    try:
        assert f"removed folder {leftover}" in lines and not leftover.exists()
        assert [p.name for p in records_dir.iterdir()] == [f"{os.getpid()}.json"]
        assert claim.record.host is not None and claim.record.host.bridge == "declop0"
        with pytest.raises(ConfigError):  # held while the run lives
            recovery.check_free(lock_file=tmp_path / "lock", folder=records_dir)
    finally:
        claim.release(undone=True)
    assert not any(records_dir.iterdir())
    recovery.check_free(lock_file=tmp_path / "lock", folder=records_dir)


def test_a_stop_that_did_not_finish_leaves_its_record_for_the_next_start(tmp_path: Path) -> None:
    claim = recovery.claim(lock_file=tmp_path / "lock", folder=tmp_path / "records")
    claim.release(undone=False)
    assert claim.record.path.exists()
    lines: list[str] = []
    # the owner (this process) is alive but no longer holds the host: its record is stale
    assert recovery.recover(lines.append, lock_file=tmp_path / "lock", folder=tmp_path / "records") == 1
    assert not claim.record.path.exists()


def test_lines_collapse_a_new_chains_rules_and_a_new_folders_files() -> None:
    changes = [
        "iptables nat chain KUBE-SERVICES",
        "iptables nat -A PREROUTING -m comment --comment portals -j KUBE-SERVICES",
        "iptables nat -A KUBE-SERVICES -d 10.0.0.1/32 -j KUBE-SVC-X",
        "path /var/lib/kubelet",
        "path /var/lib/kubelet/pods",
        "sysctl net/ipv4/conf/all/route_localnet=1 (was 0)",
    ]
    assert recovery._collapse(changes) == [
        "iptables nat chain KUBE-SERVICES",
        "iptables nat -A PREROUTING -m comment --comment portals -j KUBE-SERVICES",
        "path /var/lib/kubelet",
        "sysctl net/ipv4/conf/all/route_localnet=1 (was 0)",
    ]
