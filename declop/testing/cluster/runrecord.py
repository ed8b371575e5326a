"""The run record of a local node: a JSON file naming what one run started and changed on the host,
so that the next run can undo it when this one was killed (:mod:`declop.testing.cluster.recovery`).

One record per run, ``RECORDS_DIR/<owner pid>.json``, written by the process that owns the run
(``declop dev --node``, ``make run``'s ``declop``, a test's ``ControlPlane(node=True)``).

Invariants:

- Every change is recorded *before* it is made: the host's state (:class:`~declop.testing.cluster.host.HostState`)
  before the first change, a folder before it is created (:meth:`RunRecord.make_folder`), the
  cgroup root before it is created. A process is recorded right after it starts; the instant
  between is covered by the folders, since every process a run starts runs in one of the run's
  folders or names one in its command line.
- Each update replaces the file whole (written aside, then renamed), so a reader, or the run that
  recovers after a SIGKILL, sees the last complete record, never half of one.
- A process is named by its pid *and* its start time (``/proc/<pid>/stat``, field 22): a pid the
  kernel gave to another process since never matches (:meth:`ProcessId.alive`).
- The record is removed only once everything it names is undone (:meth:`RunRecord.remove`).
- ``RECORDS_DIR`` is on ``/run``, a tmpfs: a reboot, which undoes the processes, mounts, links and
  sysctls too, empties it.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from declop.testing.cluster.host import HostState

__all__ = ["RECORDS_DIR", "ProcessId", "RunRecord", "records", "start_time"]

RECORDS_DIR = Path("/run/declop-node")


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot); ``None`` when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):  # exited: only its exit status is left to reap
        return None
    return int(fields[19])  # field 22 of stat; fields[0] is field 3


@dataclass(frozen=True)
class ProcessId:
    """One process, named so that a reused pid never matches: ``pid`` and its ``start`` time."""

    name: str
    pid: int
    start: int

    @classmethod
    def of(cls, name: str, pid: int) -> ProcessId | None:
        """The identity of the running process ``pid``; ``None`` when it is already gone."""
        started = start_time(pid)
        return None if started is None else cls(name, pid, started)

    def alive(self) -> bool:
        """True while this very process runs (same pid, same start time, not a zombie)."""
        return start_time(self.pid) == self.start

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "pid": self.pid, "start": self.start}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessId:
        return cls(str(data["name"]), int(data["pid"]), int(data["start"]))


@dataclass
class RunRecord:
    """What one run must undo: its owner, its processes, folders, cgroup root and the host before it.

    Create it with :meth:`create` (owner: this process), read others with :func:`records`.
    """

    path: Path
    owner: ProcessId
    command: str
    started: float
    host: HostState | None = None
    folders: list[str] = field(default_factory=list)
    cgroup_root: str = ""
    processes: list[ProcessId] = field(default_factory=list)

    @classmethod
    def create(cls, folder: Path = RECORDS_DIR, host: HostState | None = None) -> RunRecord:
        """The record of a run owned by this process, written at once with ``host`` (the host's
        state before any change)."""
        owner = ProcessId.of("owner", os.getpid())
        assert owner is not None  # this process is alive
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        record = cls(folder / f"{owner.pid}.json", owner, _command_line(owner.pid), time.time(), host)
        record.save()
        return record

    @classmethod
    def load(cls, path: Path) -> RunRecord:
        """Read a record; ``ValueError`` when it is not one (malformed JSON or fields)."""
        try:
            data = json.loads(path.read_text())
            return cls(
                path=path,
                owner=ProcessId.from_json(data["owner"]),
                command=str(data["command"]),
                started=float(data["started"]),
                host=None if data["host"] is None else HostState.from_json(data["host"]),
                folders=[str(f) for f in data["folders"]],
                cgroup_root=str(data["cgroup_root"]),
                processes=[ProcessId.from_json(p) for p in data["processes"]],
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"{path} is not a run record: {exc}") from None

    def to_json(self) -> dict[str, Any]:
        return {
            "owner": self.owner.to_json(),
            "command": self.command,
            "started": self.started,
            "host": None if self.host is None else self.host.to_json(),
            "folders": self.folders,
            "cgroup_root": self.cgroup_root,
            "processes": [p.to_json() for p in self.processes],
        }

    def save(self) -> None:
        """Replace the file whole: written aside, flushed, then renamed over the old one."""
        fd, aside = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(self.to_json(), out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(aside, self.path)
        except BaseException:
            Path(aside).unlink(missing_ok=True)
            raise

    # -- what the run does, recorded as it goes --------------------------------------------

    def add_process(self, name: str, pid: int) -> None:
        """Record the process ``pid`` just started (a process already gone is not recorded)."""
        process = ProcessId.of(name, pid)
        if process is not None:
            self.processes.append(process)
            self.save()

    def make_folder(self, prefix: str) -> Path:
        """Record, then create, a new private folder ``<tmp>/<prefix><random>`` (mode 0700)."""
        while True:
            path = Path(tempfile.gettempdir()) / f"{prefix}{secrets.token_hex(4)}"
            if path.exists():
                continue
            self.folders.append(str(path))
            self.save()
            try:
                path.mkdir(mode=0o700)
            except FileExistsError:  # someone made it between the check and here: not ours
                self.folders.remove(str(path))
                continue
            return path

    def set_cgroup_root(self, root: str) -> None:
        """Record the run's cgroup root (``/declop-<random>``) before it is created."""
        self.cgroup_root = root
        self.save()

    def owner_alive(self) -> bool:
        return self.owner.alive()

    def remove(self) -> None:
        """Delete the record: everything it names has been undone."""
        self.path.unlink(missing_ok=True)

    def describe(self) -> str:
        """``pid 123, `declop dev --node x.py`, since 12:34:56``: which run this is, for a person."""
        since = time.strftime("%H:%M:%S", time.localtime(self.started))
        return f"pid {self.owner.pid}, `{self.command}`, since {since}"


def records(folder: Path = RECORDS_DIR) -> list[RunRecord]:
    """Every readable record in ``folder``, oldest first (a file that is not one is skipped)."""
    found = []
    try:
        paths = sorted(folder.glob("*.json"))
    except OSError:
        return []
    for path in paths:
        try:
            found.append(RunRecord.load(path))
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda r: r.started)


def _command_line(pid: int) -> str:
    """The command line of ``pid`` as a person typed it, shortened: ``declop dev --node x.py``."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    argv = [a for a in argv if a]
    # python -m declop dev ... / .venv/bin/declop dev ... / pytest ...: from the program's name on
    for i, arg in enumerate(argv):
        if arg == "-m" and i + 1 < len(argv):
            return " ".join([argv[i + 1], *argv[i + 2 :]])
    shown = [os.path.basename(argv[0]), *argv[1:]] if argv else ["?"]
    if len(shown) > 1 and shown[0].startswith("python") and shown[1].endswith((".py", "declop", "pytest")):
        shown = [os.path.basename(shown[1]), *shown[2:]]
    return " ".join(shown)
