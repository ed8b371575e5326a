"""At most one daemon per object across replicas, and none running once its finalizer is gone:
two real ``declop run`` processes on a real apiserver, under SIGKILL, SIGTERM and a black-holed
leader, and with ``--shards`` through a range handover.

Every daemon appends ``<pid> start|stop <key> <time.monotonic()>`` to one shared file opened
with O_APPEND (one ``write`` per line: lines never interleave; ``time.monotonic()`` is
CLOCK_MONOTONIC, system-wide on Linux, so the processes' times compare). The "stop" line is written
as the daemon's last act. A SIGKILLed process's open interval ends when the test saw it dead.
The tests check that the intervals of one key never overlap, across processes or within one,
and that when an object is gone (its finalizer released) no interval of it is open.
"""

from __future__ import annotations

import math
import textwrap
import time
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.rest import ApiException

from declop.testing.cluster.faults import TcpProxy
from declop.testing.cluster.runner import OperatorProcess, wait_for

pytestmark = pytest.mark.integration

LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 4.0, 3.0, 0.5
KEYS = tuple(f"d-{i}" for i in range(8))  # 8 keys: both of 2 ranges get some (but 1 time in 128)

HANDLERS = """
import asyncio
import os
import time

import declop

LOG = os.environ["DECLOP_TEST_DAEMON_LOG"]


def note(what, key):
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{os.getpid()} {what} {key} {time.monotonic():.6f}\\n".encode())
    finally:
        os.close(fd)


if os.environ.get("DECLOP_TEST_DAEMON_KIND") == "thread":

    @declop.daemon("configmaps", labels="dmn=yes", stop_timeout=2)
    def keeper(request, stop):
        note("start", request.name)
        try:
            stop.wait()
            time.sleep(0.2)  # ending takes a moment
        finally:
            note("stop", request.name)

else:

    @declop.daemon("configmaps", labels="dmn=yes", stop_timeout=2)
    async def keeper(request, stop):
        note("start", request.name)
        try:
            await stop.wait()
            await asyncio.sleep(0.2)  # ending takes a moment
        finally:
            note("stop", request.name)
"""


class Journal:
    """The shared file's intervals: key -> [(pid, start, end)] (end: inf while open)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.killed: dict[int, float] = {}  # pid -> monotonic time it was seen dead

    def intervals(self) -> dict[str, list[tuple[int, float, float]]]:
        open_: dict[tuple[int, str], float] = {}
        out: dict[str, list[tuple[int, float, float]]] = {}
        text = self.path.read_text() if self.path.exists() else ""
        for line in text.splitlines():
            pid_s, what, key, at_s = line.split()
            pid, at = int(pid_s), float(at_s)
            if what == "start":
                assert (pid, key) not in open_, f"pid {pid} started {key} twice without a stop"
                open_[(pid, key)] = at
            else:
                began = open_.pop((pid, key))
                out.setdefault(key, []).append((pid, began, at))
        for (pid, key), began in open_.items():
            out.setdefault(key, []).append((pid, began, self.killed.get(pid, math.inf)))
        return out

    def running(self, pid: int) -> set[str]:
        """Keys with an open interval in ``pid``."""
        return {k for k, ivs in self.intervals().items() for p, _, end in ivs if p == pid and end == math.inf}

    def assert_never_two(self) -> None:
        gaps = []
        for key, ivs in self.intervals().items():
            ivs.sort(key=lambda iv: iv[1])
            for (p1, s1, e1), (p2, s2, e2) in zip(ivs, ivs[1:]):
                assert s2 >= e1, f"{key}: pid {p2} started it at {s2:.3f} while pid {p1} ran it ({s1:.3f}..{e1:.3f})"
                if p1 != p2:
                    gaps.append(s2 - e1)
        if gaps:
            print(f"measured: {len(gaps)} handovers, gap from one replica's end to the next one's start {min(gaps):.3f}..{max(gaps):.3f} s")

    def assert_none_open(self, keys: tuple[str, ...]) -> None:
        ivs = self.intervals()
        for key in keys:
            assert all(end != math.inf for _, _, end in ivs.get(key, ())), f"{key}: a daemon still runs after its object went"


class Cluster:
    def __init__(self, control_plane: Any, namespace: str, tmp_path: Path, lock: str, kind: str = "async") -> None:
        self.control_plane, self.namespace, self.lock, self.kind = control_plane, namespace, lock, kind
        self.handlers = tmp_path / "handlers.py"
        self.handlers.write_text(textwrap.dedent(HANDLERS))
        self.journal = Journal(tmp_path / "daemons.log")
        self.api = control_plane.api_client()
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.procs: list[OperatorProcess] = []

    def process(self, *extra: str, kubeconfig: str | None = None) -> OperatorProcess:
        args = [
            str(self.handlers), "-n", self.namespace,
            "--leader-election-id", self.lock, "--leader-election-namespace", self.namespace,
            "--lease-duration", str(LEASE_DURATION), "--renew-deadline", str(RENEW_DEADLINE),
            "--retry-period", str(RETRY_PERIOD), *extra,
        ]  # fmt: skip
        if kubeconfig is not None:
            args += ["--kubeconfig", kubeconfig]
        env = {**self.control_plane.env(), "DECLOP_TEST_DAEMON_LOG": str(self.journal.path), "DECLOP_TEST_DAEMON_KIND": self.kind}
        op = OperatorProcess(args, env=env)
        op.start()
        self.procs.append(op)
        return op

    def kill(self, op: OperatorProcess) -> None:
        op.proc.kill()
        op.proc.wait(10)
        self.journal.killed[op.proc.pid] = time.monotonic()

    def objects(self) -> None:
        for key in KEYS:
            self.core.create_namespaced_config_map(self.namespace, {"metadata": {"name": key, "labels": {"dmn": "yes"}}})

    def all_run_in(self, *ops: OperatorProcess) -> bool:
        running: set[str] = set()
        for op in ops:
            running |= self.journal.running(op.proc.pid)
        return running == set(KEYS)

    def delete_all_and_check(self) -> None:
        """Delete every object, wait until each is gone, and check no daemon of it is open."""
        for key in KEYS:
            self.core.delete_namespaced_config_map(key, self.namespace)

        def gone(key: str) -> bool:
            try:
                self.core.read_namespaced_config_map(key, self.namespace)
            except ApiException as exc:
                return exc.status == 404
            return False

        wait_for(lambda: all(gone(k) for k in KEYS), 30, what="every object to go (its finalizer released)")
        self.journal.assert_none_open(KEYS)
        self.journal.assert_never_two()

    def close(self) -> None:
        for op in self.procs:
            op.stop()
        self.api.close()
        # shown when a test fails: the journal and the end of each replica's output
        print(self.journal.path.read_text() if self.journal.path.exists() else "(no journal)")
        for op in self.procs:
            print(f"--- pid {op.proc.pid}, exit {op.returncode}", *op.lines[-40:], *op.stderr[-20:], sep="\n")


@pytest.fixture(params=["async", "thread"])
def cluster(control_plane: Any, namespace: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """Two daemon flavours: ``async def`` (a task) and ``def`` (a thread with a threading.Event)."""
    # no "shard" in the id: ShardSet.member_prefix cuts a range Lease's name at "-shard-"
    lock = "dm-" + request.node.originalname[5:30].replace("_", "-").replace("shard", "sh").strip("-")
    c = Cluster(control_plane, namespace, tmp_path, lock=lock + "-" + request.param[0], kind=request.param)
    yield c
    c.close()


def two_leader_elected(cluster: Cluster, a_kubeconfig: str | None = None) -> tuple[OperatorProcess, OperatorProcess]:
    a = cluster.process("--leader-elect", kubeconfig=a_kubeconfig)
    a.wait_for_line("Successfully acquired lease", timeout=30)
    b = cluster.process("--leader-elect")
    b.wait_for_line("Attempting to acquire leader lease", timeout=30)
    cluster.objects()
    wait_for(lambda: cluster.all_run_in(a), 30, what="every daemon running on the leader")
    return a, b


def test_sigkill_of_the_leader_during_its_daemons(cluster: Cluster) -> None:
    a, b = two_leader_elected(cluster)
    cluster.kill(a)
    wait_for(lambda: cluster.all_run_in(b), 30, what="every daemon running on the new leader")
    cluster.journal.assert_never_two()
    cluster.delete_all_and_check()


def test_sigterm_of_the_leader_stops_its_daemons_before_the_standby_starts_them(cluster: Cluster) -> None:
    a, b = two_leader_elected(cluster)
    assert a.stop() == 0
    assert cluster.journal.running(a.proc.pid) == set(), "a graceful stop ends every daemon"
    wait_for(lambda: cluster.all_run_in(b), 30, what="every daemon running on the new leader")
    cluster.journal.assert_never_two()
    cluster.delete_all_and_check()


def test_a_black_holed_leader_stops_its_daemons_before_the_standby_starts_them(cluster: Cluster, tmp_path: Path) -> None:
    with TcpProxy(cluster.control_plane.host) as proxy:
        kubeconfig = proxy.kubeconfig(cluster.control_plane.kubeconfig_path, tmp_path / "a.kubeconfig")
        a, b = two_leader_elected(cluster, str(kubeconfig))
        try:
            proxy.blackhole()
            wait_for(lambda: cluster.all_run_in(b), 40, what="every daemon running on the standby")
            assert a.proc.wait(10) != 0, "a leader that lost its Lease exits non-zero"
            cluster.journal.assert_never_two()
            assert cluster.journal.running(a.proc.pid) == set(), "the lost leader ended its daemons before exiting"
        finally:
            proxy.forward()
    cluster.delete_all_and_check()


def test_a_shard_range_handover_stops_the_daemons_before_the_new_owner_starts_them(cluster: Cluster) -> None:
    a = cluster.process("--shards", "2")
    cluster.objects()
    wait_for(lambda: cluster.all_run_in(a), 60, what="every daemon running on the only replica")
    b = cluster.process("--shards", "2")
    wait_for(lambda: cluster.journal.running(b.proc.pid) and cluster.all_run_in(a, b), 60, what="a range handed over to the second replica")
    cluster.journal.assert_never_two()
    cluster.kill(a)  # and its ranges go to b after they expire
    wait_for(lambda: cluster.all_run_in(b), 60, what="every daemon on the survivor")
    cluster.journal.assert_never_two()
    cluster.delete_all_and_check()
    cluster.objects()  # again, then a graceful stop: its daemons end, its ranges are released
    wait_for(lambda: cluster.all_run_in(b), 60, what="every new daemon running")
    assert b.stop() == 0, "a stop that ended every daemon releases its ranges and exits 0"
    assert cluster.journal.running(b.proc.pid) == set()
