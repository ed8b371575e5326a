"""Timers on a real control plane: a timer fires on its grid and re-arms, in the test process; and
with real ``declop run`` processes under leader election, a SIGKILL or a SIGTERM of the leader
while its timers tick neither doubles a tick nor fires one on a replica without the Lease.

The processes' handler appends one line per tick — replica, pid, key, grid index, ``time.time()``
— to a file they share (``O_APPEND``: each line is one ``write``); both processes run on this
machine, so their timestamps compare with each other and with the log records' ``ts``.
"""

from __future__ import annotations

import datetime
import json
import signal
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

import declop
from declop.handlers.timers import current_tick
from declop.leases.hashing import fnv1a64, range_index
from declop.testing import OperatorProcess, OperatorRunner, Replicas, wait_for

pytestmark = pytest.mark.integration

LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 4.0, 3.0, 0.5
INTERVAL = 1.0

HANDLERS = """
import json
import os
import time

import declop
from declop.handlers.timers import current_tick

OUT = os.environ["DECLOP_TEST_TICKS"]
REPLICA = os.environ["DECLOP_TEST_REPLICA"]

@declop.timer("configmaps", interval=float(os.environ["DECLOP_TEST_INTERVAL"]), labels="timer-test=yes")
def tick(name, obj):
    line = {"replica": REPLICA, "pid": os.getpid(), "key": name, "uid": obj["metadata"]["uid"], "tick": current_tick(), "at": time.time()}
    fd = os.open(OUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\\n").encode())
    finally:
        os.close(fd)
"""


def created(obj: Any) -> float:
    return obj.metadata.creation_timestamp.timestamp()  # type: ignore[no-any-return]


def test_a_timer_fires_on_its_grid_and_events_in_between_only_rearm(kubeconfig: str, namespace: str, k8s_api: Any) -> None:
    registry = declop.registry.Registry()
    ticks: list[tuple[str, int | None, float]] = []
    lock = threading.Lock()

    @declop.timer("configmaps", interval=INTERVAL, labels="timer-test=yes", registry=registry)
    def tick(name: str) -> None:
        with lock:
            ticks.append((name, current_tick(), time.time()))

    core = kubernetes.client.CoreV1Api(k8s_api)
    options = declop.manager.Options(namespaces=(namespace,))
    with OperatorRunner(registry, kubeconfig=kubeconfig, options=options):
        cm = core.create_namespaced_config_map(namespace, {"metadata": {"name": "t1", "labels": {"timer-test": "yes"}}})
        anchor = created(cm)
        wait_for(lambda: len(ticks) >= 2, timeout=20, what="two ticks")
        # events between ticks: ten updates in a burst, then wait for three more ticks
        for i in range(10):
            core.patch_namespaced_config_map("t1", namespace, {"data": {"n": str(i)}})
        seen = len(ticks)
        wait_for(lambda: len(ticks) >= seen + 3, timeout=20, what="three ticks after the updates")
        core.delete_namespaced_config_map("t1", namespace)
        wait_for(lambda: not core.list_namespaced_config_map(namespace, label_selector="timer-test=yes").items, timeout=20)
        after = len(ticks)
        time.sleep(3 * INTERVAL)  # no condition to await: nothing must happen
        assert len(ticks) == after, "no tick once the object is gone"
    indices = [k for _, k, _ in ticks]
    assert indices == list(range(indices[0], indices[0] + len(indices))), f"one tick per grid point, none twice: {indices}"
    late = [at - (anchor + k * INTERVAL) for _, k, at in ticks if k is not None]
    print(f"measured: {len(late)} ticks, lateness {min(late) * 1000:.1f}..{max(late) * 1000:.1f} ms")
    assert all(0 <= x < INTERVAL for x in late), f"each tick after its grid point and before the next: {late}"


# -- real processes, leader election ---------------------------------------------------------


def ts(record: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).timestamp()


def records(op: OperatorProcess, msg: str) -> list[dict[str, Any]]:
    return [r for r in (json.loads(line) for line in list(op.lines) if line.startswith("{")) if r.get("msg") == msg]


class Pair:
    """Two replicas of the timer operator under one leader Lease, and the ticks file they share."""

    def __init__(self, control_plane: Any, namespace: str, tmp_path: Path, lock: str) -> None:
        self.namespace, self.lock = namespace, lock
        self.handlers = tmp_path / "handlers.py"
        self.handlers.write_text(textwrap.dedent(HANDLERS))
        self.ticks_file = tmp_path / "ticks.jsonl"
        self.env = control_plane.env()
        self.api = control_plane.api_client()
        self.core = kubernetes.client.CoreV1Api(self.api)

    def process(self, replica: str, *extra: str) -> OperatorProcess:
        args = [
            str(self.handlers), "-n", self.namespace, "--log-format", "json",
            "--leader-elect", "--leader-election-id", self.lock, "--leader-election-namespace", self.namespace,
            "--lease-duration", str(LEASE_DURATION), "--renew-deadline", str(RENEW_DEADLINE),
            "--retry-period", str(RETRY_PERIOD), *extra,
        ]
        env = {**self.env, "DECLOP_TEST_REPLICA": replica, "DECLOP_TEST_TICKS": str(self.ticks_file),
               "DECLOP_TEST_INTERVAL": str(INTERVAL)}
        return OperatorProcess(args, env=env)

    def configmaps(self, n: int) -> None:
        for i in range(n):
            self.core.create_namespaced_config_map(self.namespace, {"metadata": {"name": f"cm-{i}", "labels": {"timer-test": "yes"}}})

    def ticks(self) -> list[dict[str, Any]]:
        if not self.ticks_file.exists():
            return []
        return [json.loads(line) for line in self.ticks_file.read_text().splitlines() if line.strip()]

    def of(self, replica: str) -> list[dict[str, Any]]:
        return [t for t in self.ticks() if t["replica"] == replica]


@pytest.fixture
def pair(control_plane: Any, namespace: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    p = Pair(control_plane, namespace, tmp_path, lock="timer-" + request.node.name[5:30].replace("_", "-").strip("-"))
    yield p
    p.api.close()


def assert_no_tick_doubled(ticks: list[dict[str, Any]]) -> None:
    fired: dict[tuple[str, int], list[str]] = {}
    for t in ticks:
        fired.setdefault((t["key"], t["tick"]), []).append(t["replica"])
    doubled = {k: v for k, v in fired.items() if len(v) > 1}
    assert doubled == {}, f"grid indices fired more than once: {doubled}"


def handover(pair: Pair, stop: str) -> None:
    """Leader a ticks, ``stop`` ("kill" or "term") ends it, standby b takes over and ticks."""
    a, b = pair.process("a"), pair.process("b")
    a.start()
    try:
        a.wait_for_line("Successfully acquired lease")
        b.start()
        b.wait_for_line("Attempting to acquire leader lease")
        pair.configmaps(3)
        wait_for(lambda: len({t["key"] for t in pair.of("a")}) == 3 and len(pair.of("a")) >= 9, timeout=30, what="a's ticks")
        a.proc.send_signal(signal.SIGKILL if stop == "kill" else signal.SIGTERM)
        a.proc.wait(30)
        ended = time.time()  # a's process is gone: it ticks no more
        wait_for(lambda: len({t["key"] for t in pair.of("b")}) == 3 and len(pair.of("b")) >= 9, timeout=60, what="b's ticks")
    finally:
        a.stop()
        b.stop()
    a_held_from = ts(records(a, "Successfully acquired lease")[0])
    b_held_from = ts(records(b, "Successfully acquired lease")[0])
    if stop == "term":
        released = records(a, "Released leader lease")
        assert released, a.lines[-20:]
        a_held_until = ts(released[0])
    else:
        a_held_until = ended
    ticks = pair.ticks()
    assert_no_tick_doubled(ticks)
    for t in ticks:
        held = (a_held_from, a_held_until) if t["replica"] == "a" else (b_held_from, float("inf"))
        assert held[0] <= t["at"] <= held[1], f"a tick on a replica without the Lease: {t} (held {held})"
    assert b_held_from >= a_held_until - 0.01, "b took the Lease only after a let it go"
    for key in {t["key"] for t in ticks}:
        last_a = max(t["tick"] for t in ticks if t["replica"] == "a" and t["key"] == key)
        first_b = min(t["tick"] for t in ticks if t["replica"] == "b" and t["key"] == key)
        assert first_b > last_a
        print(f"measured ({stop}): {key}: a's last tick {last_a}, b's first {first_b}: {first_b - last_a - 1} ticks in the handover window")
    assert a.returncode == (0 if stop == "term" else -signal.SIGKILL)


def test_sigkill_of_the_leader_while_its_timers_tick(pair: Pair) -> None:
    handover(pair, "kill")


def test_sigterm_of_the_leader_while_its_timers_tick(pair: Pair) -> None:
    handover(pair, "term")


# -- real processes, sharded -------------------------------------------------------------------

SHARDS = 4


def held_intervals(op: OperatorProcess, until: float) -> dict[int, list[tuple[float, float]]]:
    """Range -> the intervals a replica held it, from its log: "Acquired shard" opens one,
    "Released shard" or "Shard lease lost" closes it; one still open ends at ``until``."""
    out: dict[int, list[tuple[float, float]]] = {}
    opened: dict[int, float] = {}
    for line in list(op.lines):
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if r.get("msg") not in ("Acquired shard", "Released shard", "Shard lease lost"):
            continue
        i = int(r["shard"].split("/")[0])
        if r["msg"] == "Acquired shard":
            opened[i] = ts(r)
        elif i in opened:
            out.setdefault(i, []).append((opened.pop(i), ts(r)))
    for i, start in opened.items():
        out.setdefault(i, []).append((start, until))
    return out


def test_range_handover_and_sigkill_with_shards(control_plane: Any, namespace: str, tmp_path: Path) -> None:
    """Replica 0 alone holds the 4 ranges and ticks 8 objects; replica 1 joins and takes its
    share (a drained handover); then replica 1 is SIGKILLed and 0 takes its ranges back once
    their Leases expired. Every tick is on the replica that held the key's range at that moment,
    and no grid index of any object fires twice."""
    handlers = tmp_path / "handlers.py"
    handlers.write_text(textwrap.dedent(HANDLERS))
    ticks_file = tmp_path / "ticks.jsonl"
    args = [
        str(handlers), "-n", namespace, "--log-format", "json", "--shards", str(SHARDS),
        "--leader-election-namespace", namespace, "--leader-election-id", "timer-shards",
        "--lease-duration", str(LEASE_DURATION), "--renew-deadline", str(RENEW_DEADLINE), "--retry-period", str(RETRY_PERIOD),
    ]
    env = {**control_plane.env(), "DECLOP_TEST_TICKS": str(ticks_file), "DECLOP_TEST_INTERVAL": str(INTERVAL)}
    api = control_plane.api_client()
    core = kubernetes.client.CoreV1Api(api)

    def ticks() -> list[dict[str, Any]]:
        if not ticks_file.exists():
            return []
        return [json.loads(line) for line in ticks_file.read_text().splitlines() if line.strip()]

    def keys_of(replica: str, since: float = 0.0) -> set[str]:
        return {t["key"] for t in ticks() if t["replica"] == replica and t["at"] > since}

    ends: dict[str, float] = {}
    try:
        with Replicas(args, env=env) as replicas:
            replicas.start("0", DECLOP_TEST_REPLICA="0")
            wait_for(lambda: replicas.metric("0", "declop_shard_ranges_owned") == SHARDS, timeout=60, what="replica 0 holds every range")
            for i in range(8):
                core.create_namespaced_config_map(namespace, {"metadata": {"name": f"cm-{i}", "labels": {"timer-test": "yes"}}})
            wait_for(lambda: len(keys_of("0")) == 8, timeout=30, what="ticks of every object on replica 0")
            replicas.start("1", DECLOP_TEST_REPLICA="1")
            wait_for(lambda: replicas.metric("1", "declop_shard_ranges_owned") == SHARDS // 2, timeout=60, what="replica 1 takes its share")
            joined = time.time()
            wait_for(lambda: keys_of("1", joined), timeout=30, what="ticks on replica 1")
            assert replicas.kill("1") == -signal.SIGKILL
            ends["1"] = time.time()
            wait_for(lambda: replicas.metric("0", "declop_shard_ranges_owned") == SHARDS, timeout=60, what="replica 0 takes the ranges back")
            back = time.time()
            wait_for(lambda: len(keys_of("0", back)) == 8, timeout=30, what="every object ticks on replica 0 again")
            replicas.stop("0")
            ends["0"] = time.time()
            held = {name: held_intervals(replicas[name], ends[name]) for name in ("0", "1")}
    finally:
        api.close()
    all_ticks = ticks()
    assert_no_tick_doubled(all_ticks)
    for t in all_ticks:
        r = range_index(fnv1a64(t["uid"]), SHARDS)
        spans = held[t["replica"]].get(r, [])
        assert any(a <= t["at"] <= b for a, b in spans), f"a tick of range {r} on replica {t['replica']}, which did not hold it then: {t} {spans}"
    on_1 = {t["key"] for t in all_ticks if t["replica"] == "1"}
    assert on_1 and on_1 != {t["key"] for t in all_ticks}, "the ranges were split between the replicas"
    print(f"measured: {len(all_ticks)} ticks, {len(on_1)} objects ticked on replica 1 before its SIGKILL")
