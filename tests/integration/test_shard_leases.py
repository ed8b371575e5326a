"""Range ownership with Leases: real ``declop run --shards 12`` processes on a real apiserver.

Every handler call appends ``{"key", "replica", "start", "end"}`` (``time.time()``: all processes
run on this machine, so their clocks compare) to a file of its replica; the tests compare every
pair of intervals of one key across replicas. Lease timings are short (4 s / 3 s / 0.5 s).

Size: the churn test uses the issue's 3,000 objects (DECLOP_TEST_SHARD_OBJECTS overrides): on the
2-core development machine shared with other jobs, creating them, three rounds of updates and
convergence took 102–107 s per gate mode, so its waits are generous (10 minutes). The other
tests use 60–90 objects: they are about handovers, not volume.

Every test runs twice: with the ShardedListAndWatch gate off (``control_plane``: the informers
filter client-side) and on (``sharded_control_plane``: the apiserver filters).
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import textwrap
import time
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from declop.leases.hashing import fnv1a64, range_index
from declop.testing import OperatorProcess, Replicas, wait_for
from declop.testing.cluster.faults import TcpProxy
from declop.testing.cluster.plugin import namespace_name

pytestmark = pytest.mark.integration

LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 4.0, 3.0, 0.5
SHARDS = 12
OBJECTS = int(os.environ.get("DECLOP_TEST_SHARD_OBJECTS", "3000"))

HANDLERS = """
import json
import os
import time

import declop

REPLICA = os.environ["DECLOP_TEST_REPLICA"]
OUT = os.environ["DECLOP_TEST_OUT"]
SLOW = float(os.environ.get("DECLOP_TEST_SLOW", "0"))  # seconds the object "slow" takes
TICK = float(os.environ.get("DECLOP_TEST_TICK", "0"))  # objects labelled tick=yes: look again after this long

@declop.reconciler("configmaps", labels="shard-test=yes")
def sharded(name, namespace, obj, client, logger, **_):
    start = time.time()
    logger.info("reconcile start", replica=REPLICA)
    time.sleep(0.01)  # long enough that two overlapping calls would show
    if obj is None:  # gone
        with open(OUT, "a") as f:
            f.write(json.dumps({"key": name, "replica": REPLICA, "start": start, "end": time.time(), "gone": True}) + "\\n")
        return None
    if name == "slow" and SLOW:
        logger.info("slow call running")
        time.sleep(SLOW)
    want = (obj.get("data") or {}).get("v")
    if (obj["metadata"].get("annotations") or {}).get("seen") != want:
        try:
            client.patch(obj, {"metadata": {"annotations": {"seen": want, "by": REPLICA}}})
        except declop.Fenced:  # not sent: this replica's Lease of the key's range is gone
            with open(OUT + ".fenced", "a") as f:
                f.write(json.dumps({"key": name, "replica": REPLICA, "at": time.time()}) + "\\n")
            raise
    with open(OUT, "a") as f:
        f.write(json.dumps({"key": name, "replica": REPLICA, "start": start, "end": time.time()}) + "\\n")
    if TICK and (obj["metadata"].get("labels") or {}).get("tick") == "yes":
        return declop.Result(requeue_after=TICK)  # from the queue alone: no event, no request
    return None
"""


def ts(record: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).timestamp()


def records(op: OperatorProcess, msg: str) -> list[dict[str, Any]]:
    out = []
    for line in list(op.lines):
        if line.startswith("{"):
            r = json.loads(line)
            if r.get("msg") == msg:
                out.append(r)
    return out


class Shards:
    """The processes, objects and Leases of one test."""

    def __init__(self, control_plane: Any, namespace: str, tmp_path: Path, lease_id: str) -> None:
        self.control_plane, self.namespace, self.tmp, self.lease_id = control_plane, namespace, tmp_path, lease_id
        self.handlers = tmp_path / "handlers.py"
        self.handlers.write_text(textwrap.dedent(HANDLERS))
        self.api = control_plane.api_client()
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.leases = kubernetes.client.CoordinationV1Api(self.api)
        args = [
            str(self.handlers), "-n", self.namespace, "--log-format", "json", "--shards", str(SHARDS),
            "--leader-election-id", self.lease_id, "--leader-election-namespace", self.namespace,
            "--lease-duration", str(LEASE_DURATION), "--renew-deadline", str(RENEW_DEADLINE),
            "--retry-period", str(RETRY_PERIOD), "--grace-period", "20",
        ]  # fmt: skip
        self.replicas = Replicas(args, env=control_plane.env())
        self.procs = self.replicas.procs
        #: what each replica's informer logs about the apiserver's filtering on this control plane
        self.mode = ""
        self.gate_on = False
        self.uids: dict[str, str] = {}

    def start(self, replica: str, **extra_env: str) -> OperatorProcess:
        out = str(self.tmp / f"{replica}.jsonl")
        return self.replicas.start(replica, DECLOP_TEST_REPLICA=replica, DECLOP_TEST_OUT=out, **extra_env)

    def create(self, n: int) -> None:
        for i in range(n):
            cm = self.core.create_namespaced_config_map(
                self.namespace, {"metadata": {"name": f"cm-{i}", "labels": {"shard-test": "yes"}}, "data": {"v": "0"}}
            )
            self.uids[cm.metadata.name] = cm.metadata.uid

    def update(self, names: list[str], value: str) -> None:
        for name in names:
            self.core.patch_namespaced_config_map(name, self.namespace, {"data": {"v": value}})

    def converged(self, value: str, names: list[str] | None = None) -> bool:
        items = self.core.list_namespaced_config_map(self.namespace, label_selector="shard-test=yes").items
        wanted = set(names) if names is not None else None
        return all(
            (cm.metadata.annotations or {}).get("seen") == value
            for cm in items
            if wanted is None or cm.metadata.name in wanted
        )

    def lease(self, index: int) -> Any:
        return self.leases.read_namespaced_lease(f"{self.lease_id}-sharded-shard-{index}-of-{SHARDS}", self.namespace)

    def holders(self) -> dict[int, str]:
        """Range index -> holder identity ("" when free), from the range Leases."""
        out: dict[int, str] = {}
        for lease in self.leases.list_namespaced_lease(self.namespace).items:
            name = lease.metadata.name
            if "-shard-" in name and name.startswith(self.lease_id):
                index = int(name.split("-shard-")[1].split("-of-")[0])
                out[index] = lease.spec.holder_identity or ""
        return out

    def identity(self, replica: str) -> str:
        """The replica's Lease identity, from its first log line of sharding ("" until then)."""
        joined = records(self.procs[replica], "Sharding: joining")
        return str(joined[0]["identity"]) if joined else ""

    def counts(self) -> dict[str, int]:
        by_holder: dict[str, int] = {}
        for holder in self.holders().values():
            by_holder[holder] = by_holder.get(holder, 0) + 1
        return by_holder

    def balanced(self, replicas: list[str]) -> bool:
        """Every range held by one of ``replicas``, each holding its share (or one less)."""
        holders = self.holders()
        ids = {self.identity(r) for r in replicas}
        if "" in ids or len(holders) < SHARDS or any(h not in ids for h in holders.values()):
            return False
        share = -(-SHARDS // len(replicas))
        counts = self.counts()
        return all(share - 1 <= counts.get(i, 0) <= share for i in ids) and sum(counts.get(i, 0) for i in ids) == SHARDS

    def received(self, replica: str) -> int:
        """Watch events of ConfigMaps the replica's informer received (its /metrics)."""
        return int(self.replicas.metric(replica, "declop_informer_events_received_total", 'informer="configmaps'))

    def apiserver_filtered(self) -> float:
        """``apiserver_watch_filtered_events_total`` of configmaps (0 without the gate)."""
        status, body = self.control_plane.request("GET", "/metrics", timeout=30)
        assert status == 200
        name = "apiserver_watch_filtered_events_total{"
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
            if line.startswith(name) and 'resource="configmaps"' in line
        )  # fmt: skip

    def acquired_since(self, replica: str, since: float) -> dict[int, float]:
        """Range -> when ``replica`` first acquired it at or after ``since`` (its own log)."""
        first: dict[int, float] = {}
        for rec in records(self.procs[replica], "Acquired shard"):
            if ts(rec) >= since:
                first.setdefault(int(rec["shard"].split("/")[0]), ts(rec))
        return first

    def shard_of(self, name: str) -> int:
        return range_index(fnv1a64(self.uids[name]), SHARDS)

    def intervals(self) -> list[dict[str, Any]]:
        out = []
        for f in self.tmp.glob("*.jsonl"):
            out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        return out

    def idle(self, replica: str, quiet: float) -> bool:
        """``replica`` finished its last call more than ``quiet`` seconds ago."""
        ends = [iv["end"] for iv in self.intervals() if iv["replica"] == replica]
        return bool(ends) and time.time() - max(ends) > quiet

    def assert_no_overlap(self, frozen: tuple[str, float] | None = None) -> int:
        """No two replicas' intervals of one key overlap. ``frozen`` (replica, SIGSTOP time):
        that replica's calls already running when it was stopped are exempt — they finish after
        SIGCONT and nothing can stop a running call (docs/sharding.md, contract.md §7); the
        replica then exits 1. Returns the number of intervals compared."""
        by_key: dict[str, list[dict[str, Any]]] = {}
        for iv in self.intervals():
            if frozen is not None and iv["replica"] == frozen[0] and iv["start"] < frozen[1] < iv["end"]:
                print(f"exempt: {iv['key']} was in flight on {frozen[0]} when it was stopped")
                continue
            by_key.setdefault(iv["key"], []).append(iv)
        for key, ivs in by_key.items():
            ivs.sort(key=lambda iv: iv["start"])
            for a, b in zip(ivs, ivs[1:]):
                if a["replica"] != b["replica"]:
                    assert b["start"] >= a["end"], f"{key}: {a['replica']} and {b['replica']} overlap: {a} / {b}"
        return sum(len(v) for v in by_key.values())

    def dump(self) -> None:
        """Print every replica's log but its per-reconcile lines (for a failed test's report)."""
        for name, op in self.procs.items():
            for line in list(op.lines):
                if '"reconcile start"' not in line and '"slow call running"' not in line:
                    print(f"[{name}] {line[:500]}")
        print("holders:", self.holders(), {r: self.identity(r) for r in self.procs})

    def close(self) -> None:
        self.replicas.stop()
        self.api.close()


@pytest.fixture(params=["gate-off", "gate-on"])
def shards(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """Each test twice: on an apiserver without the ShardedListAndWatch gate (the informers
    filter client-side) and on one with it (the apiserver sends each replica only its ranges)."""
    gate_on = request.param == "gate-on"
    cp = request.getfixturevalue("sharded_control_plane" if gate_on else "control_plane")
    namespace = namespace_name(request.node.originalname)
    api = cp.api_client()
    kubernetes.client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
    s = Shards(cp, namespace, tmp_path, "sh-" + request.node.originalname[5:25].replace("_", "-").strip("-"))
    s.mode = "the apiserver filters by shard" if gate_on else "the apiserver does not filter"
    s.gate_on = gate_on
    yield s
    if getattr(request.node, "declop_failed", False):
        s.dump()
    s.close()
    kubernetes.client.CoreV1Api(api).delete_namespace(namespace)
    api.close()


@pytest.mark.timeout(900)  # 3,000 objects x 5 updates through 3 replicas: near the 300-s default on a loaded machine (a pre-check run went past it); its own waits allow 600 s each
def test_three_replicas_share_twelve_ranges_and_never_overlap_under_churn(shards: Shards) -> None:
    """3 replicas, 12 ranges, 3,000 objects updated three times while they run: every object
    converges, each replica ends with 4 ranges and reconciled some keys, and no key was ever
    reconciled by two replicas at overlapping times (the start-up rebalancing included)."""
    for r in "abc":
        shards.start(r)
    shards.create(OBJECTS)
    names = [f"cm-{i}" for i in range(OBJECTS)]
    for v in "123":
        shards.update(names, v)
    wait_for(lambda: shards.balanced(["a", "b", "c"]), 90, what="4 ranges per replica")
    # one LIST of every object per second: polling faster would load the apiserver under test
    wait_for(lambda: shards.converged("3"), 600, interval=1.0, what="every object reconciled at its last value")
    total = shards.assert_no_overlap()
    for r in "abc":  # the filtering each replica's informer detected
        assert any(shards.mode in line for line in shards.procs[r].lines), f"replica {r}: no {shards.mode!r}"
    per_replica = {r: sum(1 for iv in shards.intervals() if iv["replica"] == r) for r in "abc"}
    print(f"measured: {total} reconciles, per replica {per_replica}")
    assert all(per_replica.values()), per_replica
    # each replica reconciled only keys of ranges it held at the time: the ranges of its keys
    # are exactly those its "Acquired shard" lines name
    for r in "abc":
        acquired = {int(rec["shard"].split("/")[0]) for rec in records(shards.procs[r], "Acquired shard")}
        keys = {iv["key"] for iv in shards.intervals() if iv["replica"] == r}
        assert {shards.shard_of(k) for k in keys} <= acquired

    # What each replica *receives*, with the ranges settled: one more update of every object
    # makes exactly 2 watch events per object (the update, then the handler's annotation patch).
    # Gate on: the apiserver sends each event only to the replica owning the object's range, so a
    # replica receives 2 × its objects (about a third) and the apiserver counts the rest of every
    # sharded watch as filtered; gate off: every replica receives all of them.
    holders = shards.holders()
    owner = {r: {i for i, h in holders.items() if h == shards.identity(r)} for r in "abc"}
    before = {r: shards.received(r) for r in "abc"}
    filtered_before = shards.apiserver_filtered()
    shards.update(names, "4")
    wait_for(lambda: shards.converged("4"), 600, interval=1.0, what="every object reconciled at 4")
    sent = 2 * OBJECTS
    if shards.gate_on:
        expected = {r: 2 * sum(1 for n in names if shards.shard_of(n) in owner[r]) for r in "abc"}
    else:
        expected = dict.fromkeys("abc", sent)
    wait_for(lambda: {r: shards.received(r) - before[r] for r in "abc"} == expected, 60, interval=0.5,
             what=f"events received per replica {expected}")  # fmt: skip
    assert shards.holders() == holders, "the ranges moved during the measurement"
    filtered = shards.apiserver_filtered() - filtered_before
    print(f"measured: events received per replica {expected} of {sent}; apiserver filtered {filtered:g}")
    if shards.gate_on:
        assert sum(expected.values()) == sent
        assert all(0.25 * sent <= n <= 0.42 * sent for n in expected.values()), expected
        # each of the 3 sharded watches had the other replicas' events filtered out; the apiserver
        # counts a filtered update twice (its cacher tests the old and the new object: v1.36.3
        # cacher.go filterWithAttrsAndPrefixFunction), and every event here is an update
        assert filtered >= 2 * (3 * sent - sent)
    else:
        assert filtered == 0


def test_kill_9_ranges_taken_over_within_lease_duration_and_two_retry_periods(shards: Shards) -> None:
    """kill -9 of one replica: every range it held is taken by the survivors within lease
    duration + 2 retry periods of its last renewal (the Leases' renewTime and acquireTime, both
    written with this host's clock), and objects changed while nobody owned them are reconciled."""
    for r in "abc":
        shards.start(r)
    shards.create(60)
    wait_for(lambda: shards.balanced(["a", "b", "c"]), 90, what="4 ranges per replica")
    wait_for(lambda: shards.converged("0"), 120, what="first pass")
    victim = shards.identity("c")
    lost = [i for i, h in shards.holders().items() if h == victim]
    assert len(lost) == 4
    assert shards.replicas.kill("c") == -signal.SIGKILL
    # the victim's last renewals (renewTime is written with this host's clock, like acquireTime)
    last = {i: shards.lease(i).spec.renew_time.timestamp() for i in lost}
    orphans = [f"cm-{i}" for i in range(60) if shards.shard_of(f"cm-{i}") in lost]
    assert orphans
    shards.update(orphans, "1")  # changed while nobody owns their range
    survivors = {shards.identity("a"), shards.identity("b")}
    wait_for(lambda: all(shards.holders()[i] in survivors for i in lost), 60, what="the victim's ranges taken over")
    took = max(shards.lease(i).spec.acquire_time.timestamp() - last[i] for i in lost)
    print(f"measured: ranges taken over at most {took:.2f} s after the victim's last renewal (bound {LEASE_DURATION + 2 * RETRY_PERIOD:g} s)")
    # the bound plus 0.5 s for the requests of the taking round on a loaded machine
    assert took <= LEASE_DURATION + 2 * RETRY_PERIOD + 0.5
    wait_for(lambda: shards.converged("1", orphans), 60, what="objects changed while unowned reconciled")
    shards.assert_no_overlap()


def test_scale_three_to_four_to_two_rebalances_without_overlap(shards: Shards) -> None:
    """3 → 4 replicas: 3 ranges each within two lease periods of the 4th joining (it drains
    from the others, who release only when idle); 4 → 2 (two graceful stops): 6 each. Under
    churn throughout; no overlap."""
    for r in "abc":
        shards.start(r)
    shards.create(90)
    names = [f"cm-{i}" for i in range(90)]
    wait_for(lambda: shards.balanced(["a", "b", "c"]), 90, what="4 ranges per replica")
    d = shards.start("d")
    d.wait_for_line("Sharding: joining", timeout=60)
    joined = time.time()
    shards.update(names, "1")
    wait_for(lambda: shards.balanced(["a", "b", "c", "d"]), 60, what="3 ranges per replica")
    print(f"measured: 3 → 4 rebalanced {time.time() - joined:.2f} s after the 4th joined")
    assert time.time() - joined <= 2 * LEASE_DURATION + 2.0
    wait_for(lambda: shards.converged("1"), 120, what="converged with 4 replicas")
    for r in "ab":
        shards.procs[r].proc.send_signal(signal.SIGTERM)
    stopped = time.time()
    shards.update(names, "2")
    for r in "ab":
        assert shards.procs[r].proc.wait(60) == 0
    wait_for(lambda: shards.balanced(["c", "d"]), 60, what="6 ranges per replica")
    print(f"measured: 4 → 2 rebalanced {time.time() - stopped:.2f} s after SIGTERM")
    wait_for(lambda: shards.converged("2"), 120, what="converged with 2 replicas")
    shards.assert_no_overlap()


def test_a_frozen_replica_does_not_reconcile_a_range_it_lost(shards: Shards) -> None:
    """SIGSTOP one replica past its Leases; the others take its ranges and reconcile changes;
    SIGCONT: it must not start a reconcile of a key of a range it lost until it acquired that
    range again (its own log says when), and no key overlaps — except a call that was already
    running when the replica was stopped: it finishes after SIGCONT (nothing can stop a running
    call), and the replica then exits 1 rather than keep a range it lost under a running call."""
    for r in "abc":
        shards.start(r)
    shards.create(60)
    names = [f"cm-{i}" for i in range(60)]
    wait_for(lambda: shards.balanced(["a", "b", "c"]), 90, what="4 ranges per replica")
    wait_for(lambda: shards.converged("0"), 120, what="first pass")
    # frozen while idle (the echo of its own annotation patch reconciled too), so that after
    # SIGCONT it stays up and shows what it does with ranges it lost
    wait_for(lambda: shards.idle("c", 1.5), 60, what="replica c idle for 1.5 s")
    frozen = shards.identity("c")
    lost = {i for i, h in shards.holders().items() if h == frozen}
    op = shards.procs["c"]
    shards.replicas.signal("c", signal.SIGSTOP)
    stopped = time.time()
    survivors = {shards.identity("a"), shards.identity("b")}
    wait_for(lambda: all(shards.holders()[i] in survivors for i in lost), 60, what="the frozen replica's ranges taken over")
    shards.update(names, "1")
    wait_for(lambda: shards.converged("1"), 120, what="reconciled by the others")
    cont = time.time()
    shards.replicas.signal("c", signal.SIGCONT)
    shards.update(names, "2")  # events reach the frozen replica's informers too
    wait_for(lambda: shards.converged("2"), 120, what="converged after SIGCONT")
    wait_for(lambda: len(records(op, "Shard lease lost")) >= len(lost) or op.proc.poll() is not None, 30, what="the loss noticed")
    assert op.proc.poll() is None, "idle when frozen: it must stay up and rejoin"
    wait_for(lambda: shards.balanced(["a", "b", "c"]), 60, what="rebalanced after SIGCONT")
    shards.update(names, "3")  # now c owns ranges again: it must reconcile their keys
    wait_for(lambda: shards.converged("3"), 120, what="converged after the rebalancing")
    reacquired = shards.acquired_since("c", cont)
    after = [iv for iv in shards.intervals() if iv["replica"] == "c" and iv["start"] >= cont]
    for iv in after:
        r = shards.shard_of(iv["key"])
        assert r in reacquired and iv["start"] >= reacquired[r], f"reconciled {iv['key']} of lost range {r} after SIGCONT"
    assert after, "the resumed replica rejoined and reconciled its new ranges"
    print(f"measured: {len(after)} reconciles by the resumed replica after SIGCONT, all in ranges it acquired again")
    shards.assert_no_overlap(frozen=("c", stopped))


def test_a_replica_frozen_inside_a_reconcile_exits_1_once_it_runs_again(shards: Shards) -> None:
    """A call cannot be stopped: a replica frozen past its Leases *during* a reconcile resumes
    that call after SIGCONT and exits 1 at once — within 2 s, before starting anything else — as
    after a lost leader Lease. The call's write after the freeze never reaches the apiserver:
    it is fenced (``declop.Fenced``: the range's Lease is not valid on the replica's clock), or
    the process is gone before the call gets to it — both are seen; the object only ever shows
    the new owner's write. The others hold all the ranges."""
    a = shards.start("a", DECLOP_TEST_SLOW="3")
    wait_for(lambda: shards.balanced(["a"]), 60, what="a holds every range")
    shards.core.create_namespaced_config_map(
        shards.namespace, {"metadata": {"name": "slow", "labels": {"shard-test": "yes"}}, "data": {"v": "0"}}
    )
    a.wait_for_line('"slow call running"', timeout=60)
    a.proc.send_signal(signal.SIGSTOP)
    b = shards.start("b")
    wait_for(lambda: shards.balanced(["b"]), 60, what="b took every range of the frozen replica")
    resumed = time.monotonic()
    a.proc.send_signal(signal.SIGCONT)
    assert a.proc.wait(30) == 1
    assert time.monotonic() - resumed < 5, "the replica did not exit within the 2 s (+ slack) after it ran again"
    assert records(a, "A reconcile of a lost shard is still running; exiting so it cannot overlap with the next owner")
    assert [iv["key"] for iv in shards.intervals() if iv["replica"] == "a"] == [], "a's call never completed its write"
    wait_for(lambda: any(iv["key"] == "slow" for iv in shards.intervals() if iv["replica"] == "b"), 60, what="b reconciled the slow object")
    annotations = shards.core.read_namespaced_config_map("slow", shards.namespace).metadata.annotations or {}
    assert annotations.get("by") == "b", f"the frozen replica's write reached the apiserver: {annotations}"
    refused = shards.tmp / "a.jsonl.fenced"
    fenced = [json.loads(line)["key"] for line in refused.read_text().splitlines()] if refused.exists() else []
    assert fenced in ([], ["slow"]), fenced
    logged = records(a, "Write fenced; the call ended and the key is left to the Lease's new owner")
    print(f"measured: the resumed call's write was {'fenced' if fenced else 'never attempted (exited first)'}; "
          f"'Write fenced' logged {len(logged)} time(s)")
    assert b.proc.poll() is None


def test_a_partitioned_replica_stops_at_its_renew_deadline_and_its_ranges_move(shards: Shards) -> None:
    """A proxy between replica b and the apiserver stops forwarding (requests hang, nothing
    errors; the held bytes, stale renewals among them, are delivered when it heals). b keeps
    reconciling a key of its own from its queue alone (``requeue_after``) until its Leases are
    ``renew_deadline`` old on its clock, then starts nothing of those ranges; a takes them once
    they expire and reconciles the changes b cannot see. Healed, b rejoins and gets its share
    back, or — if a call of a lost range was running at the loss — exits 1 (never a third way).
    No key overlaps."""
    with TcpProxy(shards.control_plane.host) as proxy:
        via_proxy = proxy.kubeconfig(shards.control_plane.kubeconfig_path, shards.tmp / "b.kubeconfig")
        shards.start("a")
        b = shards.start("b", KUBECONFIG=via_proxy, DECLOP_TEST_TICK="0.2")
        shards.create(60)
        names = [f"cm-{i}" for i in range(60)]
        wait_for(lambda: shards.balanced(["a", "b"]), 90, what="6 ranges per replica")
        wait_for(lambda: shards.converged("0"), 120, what="first pass")
        partitioned = shards.identity("b")
        lost = {i for i, h in shards.holders().items() if h == partitioned}
        tick = next(n for n in names if shards.shard_of(n) in lost)
        shards.core.patch_namespaced_config_map(tick, shards.namespace, {"metadata": {"labels": {"tick": "yes"}}})
        wait_for(lambda: sum(iv["key"] == tick and iv["replica"] == "b" for iv in shards.intervals()) >= 5, 30,
                 what="b reconciling its key in a loop")  # fmt: skip
        renewals: dict[int, float] = {}

        def taken_over() -> bool:
            specs = {i: shards.lease(i).spec for i in lost}  # holder and renewTime from one read
            for i, spec in specs.items():
                if spec.holder_identity == partitioned:
                    renewals[i] = spec.renew_time.timestamp()
            return all(spec.holder_identity == shards.identity("a") for spec in specs.values())

        taken_over()
        blackholed = time.time()
        proxy.blackhole()
        try:
            shards.update(names, "1")  # b sees none of these
            wait_for(taken_over, 60, interval=0.05, what="a to take the partitioned replica's ranges")
            wait_for(lambda: shards.converged("1"), 120, what="a reconciled every change")
        finally:
            proxy.forward()
        last_renewal = max(renewals.values())
        b_starts = [iv["start"] for iv in shards.intervals() if iv["replica"] == "b" and shards.shard_of(iv["key"]) in lost]
        b_last = max(b_starts)
        assert b_last > blackholed, "b must have been reconciling during the black hole"
        acquired = {i: shards.lease(i).spec.acquire_time.timestamp() for i in lost}
        print(f"measured: b's last start {b_last - last_renewal:.3f} s, a's takeover "
              f"{min(acquired.values()) - last_renewal:.3f}–{max(acquired.values()) - last_renewal:.3f} s after b's last renewal")  # fmt: skip
        # the fence (the handler reads its clock a moment after the framework's check)
        assert b_last <= last_renewal + RENEW_DEADLINE + 0.5, f"b started {b_last - last_renewal:.3f} s after its last renewal"
        for i in lost:  # a took each range only once it had expired, and after b's last start
            assert acquired[i] >= renewals[i] + LEASE_DURATION - 0.05 and acquired[i] > b_last, (i, renewals, acquired, b_last)
        wait_for(lambda: len(records(b, "Shard lease lost")) >= len(lost) or b.proc.poll() is not None, 30, what="b noticed the loss")
        # decided by its log, not by poll(): the process may still be on its way out
        if records(b, "A reconcile of a lost shard is still running; exiting so it cannot overlap with the next owner"):
            assert b.proc.wait(10) == 1  # a call of a lost range was running when the loss was seen
        else:
            wait_for(lambda: shards.balanced(["a", "b"]), 60, what="b rejoined and got its share back")
            shards.update(names, "2")
            wait_for(lambda: shards.converged("2"), 120, what="converged after healing")
            # after its fence b reconciled only keys of ranges it had acquired again, from then on
            fence = last_renewal + RENEW_DEADLINE + 0.5
            again = shards.acquired_since("b", blackholed)
            after = [iv for iv in shards.intervals() if iv["replica"] == "b" and iv["start"] > fence]
            assert after, "b rejoined and reconciled its new ranges"
            for iv in after:
                r = shards.shard_of(iv["key"])
                assert r in again and iv["start"] >= again[r], f"b reconciled {iv['key']} of range {r} it had not acquired again"
        print(f"measured: {shards.assert_no_overlap()} intervals compared, b {'exited 1' if b.proc.poll() is not None else 'rejoined'}")
        assert b.proc.poll() is None or records(b, "A reconcile of a lost shard is still running; exiting so it cannot overlap with the next owner")


def test_an_apiserver_outage_past_the_renew_deadline_leaves_no_range_unowned(shards: Shards) -> None:
    """kube-apiserver stops for longer than the lease duration, and etcd is compacted meanwhile,
    so every watch's resourceVersion is history (410 on the way back). Every replica loses every
    range at its renew deadline while the range Leases still name it — nobody could take them.
    Both were idle: they stay up, take their ranges again (the others see a live holder and never
    would), re-list, and reconcile every later change and deletion. No overlap, no reconcile
    started while the fences were closed."""
    for r in "ab":
        shards.start(r)
    shards.create(60)
    names = [f"cm-{i}" for i in range(60)]
    wait_for(lambda: shards.balanced(["a", "b"]), 90, what="6 ranges per replica")
    wait_for(lambda: shards.converged("0"), 120, what="first pass")
    wait_for(lambda: shards.idle("a", 1.5) and shards.idle("b", 1.5), 60, what="both replicas idle")
    cp = shards.control_plane
    cp.stop_apiserver()
    stopped = time.time()
    cp.compact_etcd()
    wait_for(lambda: all(len(records(shards.procs[r], "Shard lease lost")) >= 6 for r in "ab"), 30,
             what="both replicas' fences closed")  # fmt: skip
    time.sleep(max(0.0, stopped + LEASE_DURATION + 1 - time.time()))  # an outage past the lease duration
    cp.start_apiserver()
    back = time.time()
    wait_for(lambda: shards.balanced(["a", "b"]), 60, what="every range held again, 6 per replica")
    print(f"measured: the apiserver was down {back - stopped:.1f} s; ranges balanced {time.time() - back:.2f} s after it was back")
    shards.update(names[1:], "1")
    shards.core.delete_namespaced_config_map(names[0], shards.namespace)
    wait_for(lambda: shards.converged("1"), 120, what="every change after the outage reconciled")
    owner = next(r for r in "ab" if shards.identity(r) == shards.holders()[shards.shard_of(names[0])])
    wait_for(lambda: [iv for iv in shards.intervals() if iv["key"] == names[0] and iv.get("gone")], 60,
             what="the deletion reconciled")  # fmt: skip
    gone = [iv["replica"] for iv in shards.intervals() if iv["key"] == names[0] and iv.get("gone")]
    assert gone == [owner], gone
    assert all(shards.procs[r].proc.poll() is None for r in "ab"), "idle at the loss: both stay up"
    # between its fences closing and taking a range again, a replica starts nothing of that range
    again = {r: shards.acquired_since(r, stopped) for r in "ab"}
    closed = [
        iv for iv in shards.intervals()
        if stopped + RENEW_DEADLINE + 0.5 < iv["start"] < again[iv["replica"]].get(shards.shard_of(iv["key"]), float("inf"))
    ]  # fmt: skip
    assert closed == [], f"reconciles started while their range's fence was closed: {closed}"
    print(f"measured: {shards.assert_no_overlap()} intervals compared")


def test_a_replica_whose_lists_are_refused_takes_no_range(shards: Shards) -> None:
    """The simulator's `unsynced` fault, sharded (`declop sim examples/kopf/15_timers.py --seed 16
    --mode sharded`): a replica whose identity may get ConfigMaps and manage Leases but not list
    them owns no range at start, so its sharded informer had nothing to list and called itself
    synced — and the replica took ranges it could never list; their objects were never
    reconciled. Now it stays unsynced and takes nothing: the other replica keeps every range and
    reconciles every object."""
    namespace = shards.namespace
    user = f"no-list-{namespace[-5:]}"
    kubeconfig = shards.control_plane.add_user(user)
    rbac = kubernetes.client.RbacAuthorizationV1Api(shards.api)
    rbac.create_namespaced_role(namespace, {
        "metadata": {"name": "no-list"},
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list", "create", "update", "delete"]},
        ],
    })
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "no-list"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "no-list"},
        "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
    })
    shards.start("a")
    shards.create(30)
    wait_for(lambda: shards.balanced(["a"]), 60, what="every range on a")
    wait_for(lambda: shards.converged("0"), 60, what="first pass")
    b = shards.start("b", KUBECONFIG=kubeconfig, DECLOP_KUBECONFIG=kubeconfig, DECLOP_CHECK_PERMISSIONS="false")
    wait_for(lambda: shards.identity("b"), 30, what="b started")
    time.sleep(LEASE_DURATION * 2)  # an absence: b had every chance to join and take ranges
    assert not records(b, "Acquired shard"), list(b.lines)[-20:]
    assert shards.balanced(["a"]), shards.holders()
    assert any("Cannot list" in line for line in list(b.lines)), list(b.lines)[-20:]  # it says why
    shards.update([f"cm-{i}" for i in range(30)], "1")
    wait_for(lambda: shards.converged("1"), 60, what="every object reconciled by a")
    assert b.proc.poll() is None  # b keeps trying
