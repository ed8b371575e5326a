"""declop.testing.cluster.runrecord: the record a node run keeps of what it started and changed.

Real processes and files (in a temporary folder, never /run): a record round-trips through its
file, each update replaces the file whole, a folder is in the record before it exists, and a
process is named by pid *and* start time so that a reused pid never matches.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from declop.testing.cluster.host import HostState, Rules
from declop.testing.cluster.runrecord import ProcessId, RunRecord, records, start_time


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def a_host_state() -> HostState:
    return HostState(
        bridge="declop0",
        bridge_existed=False,
        sysctls={"net/ipv4/ip_forward": "0"},
        paths={"/var/lib/kubelet": None, "/var/lib/cni": {"/var/lib/cni", "/var/lib/cni/x"}},
        mounts={"/", "/proc"},
        iptables={"iptables": Rules({"nat": ({"DOCKER"}, ["-A POSTROUTING -j MASQUERADE"])})},
        nft_tables={"ip nat"},
    )


def test_a_host_state_round_trips_through_json() -> None:
    state = a_host_state()
    assert HostState.from_json(state.to_json()) == state


def test_a_record_round_trips_through_its_file(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    record = RunRecord.create(tmp_path, a_host_state())
    assert record.path == tmp_path / f"{os.getpid()}.json"
    record.add_process("sleep", sleeper.pid)
    record.set_cgroup_root("/declop-abcd")
    loaded = RunRecord.load(record.path)
    assert loaded == record
    assert loaded.owner.pid == os.getpid() and loaded.owner.alive()
    assert loaded.processes == [ProcessId("sleep", sleeper.pid, start_time(sleeper.pid) or -1)]
    assert "pytest" in loaded.command or "py" in loaded.command
    assert [p.name for p in tmp_path.iterdir()] == [record.path.name]  # nothing written aside is left


def test_a_folder_is_recorded_before_it_is_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    record = RunRecord.create(tmp_path)
    seen: list[tuple[list[str], bool]] = []
    save = record.save

    def spy() -> None:
        save()
        seen.append((RunRecord.load(record.path).folders, any((tmp_path / "tmp").iterdir())))

    monkeypatch.setattr(record, "save", spy)
    folder = record.make_folder("declop-node-")
    assert folder.is_dir() and folder.name.startswith("declop-node-") and folder.stat().st_mode & 0o777 == 0o700
    assert seen == [([str(folder)], False)]  # in the file while the folder did not exist yet


def test_a_reused_pid_never_matches(sleeper: subprocess.Popen[bytes]) -> None:
    found = ProcessId.of("sleep", sleeper.pid)
    assert found is not None and found.alive()
    assert not ProcessId("sleep", sleeper.pid, found.start + 1).alive()  # same pid, another process


def test_an_exited_process_is_gone_even_before_it_is_reaped() -> None:
    proc = subprocess.Popen(["true"])
    found = ProcessId.of("true", proc.pid)
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # a zombie now: exited, not reaped
    assert start_time(proc.pid) is None
    assert found is None or not found.alive()
    proc.wait()


def test_records_skip_files_that_are_not_records(tmp_path: Path) -> None:
    (tmp_path / "1.json").write_text("{not json")
    (tmp_path / "2.json").write_text('{"owner": 3}')
    mine = RunRecord.create(tmp_path)
    assert records(tmp_path) == [mine]
    with pytest.raises(ValueError, match="is not a run record"):
        RunRecord.load(tmp_path / "2.json")


def test_describe_names_the_owner_and_its_command(tmp_path: Path) -> None:
    record = RunRecord.create(tmp_path)
    record.command = "declop dev --node examples/pods.py"
    assert record.describe().startswith(f"pid {os.getpid()}, `declop dev --node examples/pods.py`, since ")
