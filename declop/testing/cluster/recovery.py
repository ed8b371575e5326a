"""Taking the host for a local node, and undoing what a killed node left on it.

A node run starts with :func:`claim`: it takes the host's node lock (``flock`` on ``LOCK_FILE``,
which the kernel drops when its owner dies, however it dies), undoes every run record
(:mod:`declop.testing.cluster.runrecord`) whose owner is gone, then writes its own record with the host's
state before any change. :func:`recover` is the same clean-up alone (``declop dev --node --clean``).

Invariants:

- Two starts cannot race: the clean-up and the new record happen under the lock. A run that finds
  the lock held, or a record whose owner is alive, is refused with one line (``ConfigError``)
  naming that run and how to stop it, before it changes anything; the live run's record is left
  alone.
- The clean-up of a record touches only what the record names: processes by pid *and* start time,
  the processes running in or naming the record's own folders (whose names are random and
  recorded before they are made), the processes in its own cgroup root; then the host's state is
  restored to the record's :class:`~declop.testing.cluster.host.HostState` (mounts, cgroups, rules, links,
  sysctls, host folders: what appeared since the run started, never what was there before); then
  its folders are removed, then the record. Each thing removed is one line through ``echo``.
- Every step is idempotent: a clean-up that is itself killed is finished by the next one.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from declop.errors import ConfigError
from declop.testing.cluster import host
from declop.testing.cluster.runrecord import RECORDS_DIR, ProcessId, RunRecord, records

__all__ = ["LOCK_FILE", "Claim", "check_free", "claim", "recover", "undo"]

LOCK_FILE = Path("/run/declop-node.lock")
KILL_TIMEOUT = 10.0
STOP_HOW = "stop it with Ctrl-C in its terminal or `kill {pid}` (it cleans up on SIGINT, SIGTERM and SIGHUP)"

Echo = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class Claim:
    """This process's hold on the host: the node lock and the run's record."""

    lock: int
    record: RunRecord

    def release(self, *, undone: bool = True) -> None:
        """Let the lock go; delete the record first when ``undone`` (everything it names is
        undone) — else keep it for the next start to finish the clean-up."""
        if self.lock < 0:
            return
        if undone:
            self.record.remove()
        os.close(self.lock)
        self.lock = -1


def claim(
    echo: Echo = _stderr, *, lock_file: Path = LOCK_FILE, folder: Path = RECORDS_DIR
) -> Claim:
    """Take the host for a node run: the lock, the clean-up of killed runs, a new record.

    Raises:
        ConfigError: another node runs (one line naming it and how to stop it); nothing changed.
    """
    fd = _lock(lock_file, folder)
    try:
        _recover_locked(echo, folder, lock_file)
        return Claim(fd, RunRecord.create(folder, host.HostState.record(host.BRIDGE)))
    except BaseException:
        os.close(fd)
        raise


def check_free(*, lock_file: Path = LOCK_FILE, folder: Path = RECORDS_DIR) -> None:
    """Raise ``ConfigError`` (one line naming it) when another node runs; change nothing."""
    fd = _lock(lock_file, folder)
    try:
        live = [r for r in records(folder) if r.owner_alive() and r.owner.pid != os.getpid()]
        if live:
            raise ConfigError(_running_message(live, lock_file))
    finally:
        os.close(fd)


def recover(echo: Echo = _stderr, *, lock_file: Path = LOCK_FILE, folder: Path = RECORDS_DIR) -> int:
    """Undo what killed node runs left, and nothing else; return how many runs were cleaned.

    Raises:
        ConfigError: another node runs (one line); its record is left alone.
    """
    fd = _lock(lock_file, folder)
    try:
        return _recover_locked(echo, folder, lock_file)
    finally:
        os.close(fd)


def undo(record: RunRecord, echo: Echo = _stderr) -> None:
    """Undo everything ``record`` names (see the module's invariants), one line per thing."""
    _stop_processes(record, echo)
    if record.host is not None:
        state = record.host
        for mount in _mounts_under(record.folders):
            echo(f"unmounted {mount}")
            host.umount(mount)
        changes = _collapse(state.difference("", record.cgroup_root))
        state.restore(None, record.cgroup_root)
        for change in changes:
            echo(f"restored {change}" if change.startswith("sysctl ") else f"removed {change}")
        for left in state.difference("", record.cgroup_root):
            echo(f"could not remove {left}; remove it by hand")
    elif record.cgroup_root:
        host.remove_cgroups(record.cgroup_root)
    for folder in record.folders:
        if os.path.lexists(folder):
            host.unmount_under(Path(folder))
            shutil.rmtree(folder, ignore_errors=True)
            echo(f"removed folder {folder}")
    record.remove()


# -- the lock and the records ----------------------------------------------------------------


def _lock(lock_file: Path, folder: Path) -> int:
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(_running_message([r for r in records(folder) if r.owner_alive()], lock_file)) from None
    return fd


def _running_message(live: list[RunRecord], lock_file: Path) -> str:
    if not live:
        return f"another declop node is running on this host (it holds {lock_file}); stop it first"
    other = live[-1]
    return f"another declop node is running on this host ({other.describe()}); " + STOP_HOW.format(pid=other.owner.pid)


def _recover_locked(echo: Echo, folder: Path, lock_file: Path) -> int:
    """Under the lock: refuse if a record's owner is alive, else undo every record; count them."""
    found = records(folder)
    live = [r for r in found if r.owner_alive() and r.owner.pid != os.getpid()]
    if live:  # it does not hold the lock, yet runs: leave it alone, start nothing beside it
        raise ConfigError(_running_message(live, lock_file))
    for aside in folder.glob(".*.json.*"):  # a record half-written when its owner died; only the
        aside.unlink(missing_ok=True)  # lock's holder writes one, and that is this process, now
    for record in found:  # a record of this process is from an earlier run here that failed to stop
        echo(f"A declop node ({record.describe()}) was stopped without cleaning up; removing what it left:")
        undo(record, echo)
        echo(f"Cleaned up after the declop node of pid {record.owner.pid}.")
    return len(found)


# -- processes ---------------------------------------------------------------------------------


def _stop_processes(record: RunRecord, echo: Echo) -> None:
    """SIGKILL the record's processes (by pid and start time), those in or naming its folders,
    and those in its cgroup root; wait until they are gone."""
    targets: dict[int, ProcessId] = {}
    for process in record.processes:
        if process.alive():
            targets[process.pid] = process
    if record.cgroup_root:  # the Pods' processes (their folders are under the run's too)
        for pid in host.cgroup_pids(record.cgroup_root):
            found = ProcessId.of(f"container process {_comm(pid)}", pid)
            if found is not None and pid not in targets:
                targets[pid] = found
    for pid, name in _processes_of_folders(record.folders):
        if pid not in targets:
            found = ProcessId.of(name, pid)
            if found is not None:
                targets[pid] = found
    for process in targets.values():
        if process.alive():  # still this very process: signal it, never a recycled pid
            try:
                os.kill(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            echo(f"stopped {process.name} (pid {process.pid})")
    deadline = time.monotonic() + KILL_TIMEOUT
    while any(p.alive() for p in targets.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for process in targets.values():
        if process.alive():
            echo(f"could not stop {process.name} (pid {process.pid}); stop it by hand")


def _processes_of_folders(folders: list[str]) -> list[tuple[int, str]]:
    """(pid, name) of the processes whose working folder is in one of ``folders``, or whose
    command line or environment names one: the components (started in them), containerd's shims
    and ``ctr`` (their ``-address``), ``helm`` and ``kubectl`` (``KUBECONFIG`` in the control
    plane's folder)."""
    if not folders:
        return []
    roots = [f.rstrip("/") for f in folders]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd").removesuffix(" (deleted)")
        except OSError:
            cwd = ""
        try:
            named = (entry / "cmdline").read_bytes() + b"\0" + (entry / "environ").read_bytes()
        except OSError:
            continue
        text = named.decode(errors="replace")
        if any(cwd == r or cwd.startswith(r + "/") or r in text for r in roots):
            found.append((int(entry.name), _comm(int(entry.name))))
    return found


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


# -- lines ------------------------------------------------------------------------------------


def _mounts_under(folders: list[str]) -> list[str]:
    roots = [f.rstrip("/") + "/" for f in folders]
    return sorted(
        {m for m in host.mount_points() if any(m.startswith(r) or m + "/" == r for r in roots)},
        reverse=True,
    )


def _collapse(changes: list[str]) -> list[str]:
    """One line per thing: a new chain's rules go with the chain, a new folder's files with it."""
    chains = {c.split()[3] for c in changes if len(c.split()) == 4 and c.split()[2] == "chain"}
    paths = [c[5:] for c in changes if c.startswith("path ")]
    kept = []
    for change in changes:
        words = change.split()
        if len(words) > 3 and words[2] == "-A" and words[3] in chains:
            continue  # `iptables nat -A KUBE-SVC-X ...`: flushed with its chain
        if change.startswith("path ") and any(change[5:].startswith(p + "/") for p in paths):
            continue
        kept.append(change)
    return kept

