"""At most one replica reconciles: two real ``declop run`` processes on a real apiserver, under the
faults that broke it — a rollout (SIGTERM during a long reconcile), a black-holed connection, a
frozen leader (SIGSTOP/SIGCONT), a handler stuck in its thread, and a Lease the identity may not
touch.

Handlers log ``reconcile start`` / ``reconcile end`` with ``time.time()`` (both processes run on
this machine, so their timestamps compare) and the tests compare the intervals. Lease timings are
short (4 s / 3 s / 0.5 s) so a takeover takes seconds, not 15.
"""

from __future__ import annotations

import datetime
import json
import signal
import socket
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.watch
import pytest

from declop.testing.cluster.faults import TcpProxy
from declop.testing.cluster.runner import OperatorProcess, wait_for

pytestmark = pytest.mark.integration

LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 4.0, 3.0, 0.5

HANDLERS = """
import os
import threading
import time

import declop

REPLICA = os.environ["DECLOP_TEST_REPLICA"]
SLOW = float(os.environ.get("DECLOP_TEST_SLOW", "0"))        # seconds the object "slow" takes
STUCK = os.environ.get("DECLOP_TEST_STUCK") == "1"             # every call blocks for ever
REQUEUE = float(os.environ.get("DECLOP_TEST_REQUEUE", "0"))  # look again after this long

@declop.reconciler("configmaps", labels="ha-test=yes")
def ha(name, logger, **_):
    logger.info("reconcile start", replica=REPLICA, key=name, at=time.time())
    if SLOW and name == "slow":
        time.sleep(SLOW)
    if STUCK:
        threading.Event().wait()
    logger.info("reconcile end", replica=REPLICA, key=name, at=time.time())
    if REQUEUE:
        return declop.Result(requeue_after=REQUEUE)
    return None

HEARTBEAT = float(os.environ.get("DECLOP_TEST_HEARTBEAT", "0"))  # a leader-only task writes this often
DEAF = os.environ.get("DECLOP_TEST_HEARTBEAT_DEAF") == "1"      # ... and goes on whatever it is told

if HEARTBEAT:
    @declop.background
    async def heartbeat(client, **_):
        import asyncio
        beat = 0
        while True:                                              # sleeps as most such loops do
            try:
                await asyncio.sleep(HEARTBEAT)
                beat += 1
                await client.apply({"apiVersion": "v1", "kind": "ConfigMap",
                                    "metadata": {"name": "heartbeat", "namespace": os.environ["DECLOP_TEST_NAMESPACE"]},
                                    "data": {"replica": REPLICA, "beat": str(beat)}})
            except BaseException:                                # its cancellation and Fenced too
                if not DEAF:
                    raise

if os.environ.get("DECLOP_TEST_STUCK_HOOKS") == "1":
    @declop.on_shutdown
    def stuck_hook(**_):
        threading.Event().wait()                                 # never returns

    @declop.background
    async def deaf(**_):
        import asyncio
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:                       # ignores its cancellation
                pass
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def records(op: OperatorProcess, msg: str | None = None) -> list[dict[str, Any]]:
    """The JSON log records of ``op`` (``--log-format json``), optionally only those with ``msg``."""
    out = []
    for line in list(op.lines):
        if line.startswith("{"):
            record = json.loads(line)
            if msg is None or record.get("msg") == msg:
                out.append(record)
    return out


def ts(record: dict[str, Any]) -> float:
    """The wall-clock time of a log record."""
    return datetime.datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).timestamp()


def starts(op: OperatorProcess) -> list[float]:
    return [r["at"] for r in records(op, "reconcile start")]


class Cluster:
    """Args, environment and helpers shared by the processes of one test."""

    def __init__(self, control_plane: Any, namespace: str, tmp_path: Path, lock: str) -> None:
        self.control_plane, self.namespace, self.lock = control_plane, namespace, lock
        self.handlers = tmp_path / "handlers.py"
        self.handlers.write_text(textwrap.dedent(HANDLERS))
        self.api = control_plane.api_client()
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.leases = kubernetes.client.CoordinationV1Api(self.api)

    def process(self, replica: str, *extra: str, **env: str) -> OperatorProcess:
        args = [
            str(self.handlers), "-n", self.namespace, "--log-format", "json",
            "--leader-elect", "--leader-election-id", self.lock, "--leader-election-namespace", self.namespace,
            "--lease-duration", str(LEASE_DURATION), "--renew-deadline", str(RENEW_DEADLINE),
            "--retry-period", str(RETRY_PERIOD), *extra,
        ]
        environment = {**self.control_plane.env(), "DECLOP_TEST_REPLICA": replica, **env}
        return OperatorProcess(args, env=environment)

    def configmap(self, name: str) -> None:
        self.core.create_namespaced_config_map(self.namespace, {"metadata": {"name": name, "labels": {"ha-test": "yes"}}})

    def lease(self) -> Any:
        return self.leases.read_namespaced_lease(self.lock, self.namespace)

    def close(self) -> None:
        self.api.close()


def grant(cluster: Cluster, user: str, role: str, rules: list[dict[str, Any]]) -> None:
    """Bind a Role of ``rules`` to ``user`` in the cluster's namespace."""
    rbac = kubernetes.client.RbacAuthorizationV1Api(cluster.api)
    rbac.create_namespaced_role(cluster.namespace, {"metadata": {"name": role}, "rules": rules})
    rbac.create_namespaced_role_binding(cluster.namespace, {
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
    })


@pytest.fixture
def cluster(control_plane: Any, namespace: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    c = Cluster(control_plane, namespace, tmp_path, lock="ha-" + request.node.name[5:30].replace("_", "-").strip("-"))
    yield c
    c.close()


def test_rollout_renews_during_the_drain_and_the_standby_starts_after_the_last_reconcile_ends(cluster: Cluster) -> None:
    """The issue's rollout: a 25 s reconcile on the leader when SIGTERM arrives (the chart's
    RollingUpdate sends it once the new Pod is Ready). The old leader keeps renewing while it
    drains — 25 s is six lease durations — and releases after; the standby's first reconcile
    starts after the old leader's last one ended."""
    a = cluster.process("a", "--grace-period", "60", DECLOP_TEST_SLOW="25")
    b = cluster.process("b", "--grace-period", "60")
    a.start()
    try:
        a.wait_for_line("Successfully acquired lease")
        b.start()
        b.wait_for_line("Attempting to acquire leader lease")
        cluster.configmap("slow")
        a.wait_for_line('"reconcile start"')
        sigterm = time.time()
        a.proc.send_signal(signal.SIGTERM)
        b.wait_for_line('"reconcile start"', timeout=90)
        assert a.proc.wait(60) == 0, a.stderr[-20:]
        a_end = [r for r in records(a, "reconcile end") if r["key"] == "slow"]
        assert a_end, "the in-flight reconcile must finish within the grace period, not be abandoned"
        last_end = max(r["at"] for r in records(a, "reconcile end"))
        first_b = min(starts(b))
        assert last_end - sigterm > LEASE_DURATION * 5, "the reconcile ran through many lease durations after SIGTERM"
        print(f"measured: a's reconcile ended {last_end - sigterm:.3f} s after SIGTERM; b's first start {first_b - last_end:+.3f} s after that")
        assert first_b > last_end, f"overlap: b started {first_b - last_end:+.3f} s after a's last reconcile ended"
        released = records(a, "Released leader lease")
        assert released and ts(released[0]) >= last_end - 0.01  # released only after the drain
        acquired = records(b, "Successfully acquired lease")
        assert acquired and ts(acquired[0]) >= last_end - 0.01
        assert ts(acquired[0]) - ts(released[0]) < 5 * RETRY_PERIOD  # the release hands over at once
    finally:
        a.stop()
        b.stop()


def test_a_graceful_stop_leaves_the_lease_to_expire_while_a_handler_thread_runs(cluster: Cluster) -> None:
    """Issue 22, defect 2: SIGTERM with --grace-period 1 while a plain handler blocks in its
    thread. The Lease is not released under the running call — one line says so, its record still
    names the old leader — and the process exits; the standby takes over once it expired, after
    the old process (and its thread) is gone."""
    a = cluster.process("a", "--grace-period", "1", DECLOP_TEST_STUCK="1")
    b = cluster.process("b")
    a.start()
    try:
        a.wait_for_line("Successfully acquired lease")
        b.start()
        b.wait_for_line("Attempting to acquire leader lease")
        cluster.configmap("stuck")
        a.wait_for_line('"reconcile start"')
        a.proc.send_signal(signal.SIGTERM)
        a.proc.wait(30)
        exited = time.time()
        assert records(a, "Leaving the Lease to expire: calls under it still run"), a.lines[-20:]
        # a loss under a running call (defect 10): exit 1, and the stuck thread dies with it
        assert a.proc.returncode == 1, a.lines[-20:]
        assert not records(a, "Released leader lease")
        holder = cluster.lease().spec.holder_identity
        assert holder and holder != "", "the record still names the old leader"
        b.wait_for_line("Successfully acquired lease", timeout=LEASE_DURATION + 15)
        acquired = ts(records(b, "Successfully acquired lease")[0])
        print(f"measured: b acquired {acquired - exited:.3f} s after a exited")
        assert acquired > exited
    finally:
        a.stop()
        b.stop()


def test_a_black_holed_leader_stops_reconciling_within_the_renew_deadline(cluster: Cluster, tmp_path: Path) -> None:
    """Between the leader and the apiserver a proxy stops forwarding: requests hang, nothing errors.
    The leader keeps reconciling from its queue (requeue_after needs no network) until
    ``last renewal + renew_deadline``, then stops and exits non-zero; the standby's first
    reconcile comes after that."""
    with TcpProxy(cluster.control_plane.host) as proxy:
        kubeconfig = proxy.kubeconfig(cluster.control_plane.kubeconfig_path, tmp_path / "a.kubeconfig")
        a = cluster.process("a", "--kubeconfig", kubeconfig, DECLOP_TEST_REQUEUE="0.1")
        b = cluster.process("b", DECLOP_TEST_REQUEUE="0.1")
        a.start()
        try:
            a.wait_for_line("Successfully acquired lease")
            b.start()
            b.wait_for_line("Attempting to acquire leader lease")
            cluster.configmap("tick")
            wait_for(lambda: len(starts(a)) >= 5, 20, what="the leader reconciling in a loop")
            holder_a = cluster.lease().spec.holder_identity
            last_renewal: list[float] = []

            def watch_lease() -> bool:
                spec = cluster.lease().spec
                if spec.holder_identity == holder_a:
                    last_renewal.append(spec.renew_time.timestamp())
                    return False
                return True  # b holds it now

            blackholed = time.time()
            proxy.blackhole()
            wait_for(watch_lease, 30, interval=0.05, what="the standby to take the Lease")
            assert a.proc.wait(10) != 0, "a leader that lost its Lease exits non-zero"
            b.wait_for_line('"reconcile start"', timeout=20)
            renewed = max(last_renewal)
            a_last, b_first = max(starts(a)), min(starts(b))
            assert a_last > blackholed, "the leader must have been reconciling during the black hole"
            # the fence: no start after last renewal + renew deadline (the handler's own clock
            # read comes a moment after the framework's check, hence the small allowance)
            print(f"measured: last start {a_last - renewed:.3f} s, standby's first {b_first - renewed:.3f} s after the last renewal")
            assert a_last <= renewed + RENEW_DEADLINE + 0.5, f"a started {a_last - renewed:.3f} s after its last renewal"
            assert b_first > a_last
            assert b_first >= renewed + RENEW_DEADLINE
            assert records(a, "Leader election lost")
        finally:
            proxy.forward()
            a.stop()
            b.stop()


def test_a_frozen_leader_starts_no_reconcile_after_sigcont(cluster: Cluster) -> None:
    """SIGSTOP the leader past the lease duration; the standby takes over and reconciles objects
    created meanwhile, whose events wait in the frozen leader's watch connection. After SIGCONT
    the old leader must not start a single reconcile — its own clock says the Lease is stale —
    and must exit non-zero. The leader also looks again at "before" every 0.2 s, so when it
    continues, due timers compete with the buffered events and with its own loss detection."""
    a = cluster.process("a", DECLOP_TEST_REQUEUE="0.2")
    b = cluster.process("b")
    a.start()
    try:
        a.wait_for_line("Successfully acquired lease")
        b.start()
        b.wait_for_line("Attempting to acquire leader lease")
        cluster.configmap("before")
        a.wait_for_line('"reconcile end"')
        frozen = time.time()
        a.proc.send_signal(signal.SIGSTOP)
        try:
            b.wait_for_line("Successfully acquired lease", timeout=30)
            for name in ("during-1", "during-2", "during-3"):
                cluster.configmap(name)
            cluster.core.patch_namespaced_config_map("before", cluster.namespace, {"metadata": {"labels": {"touched": "yes"}}})
            wait_for(lambda: {"during-1", "during-2", "during-3", "before"} <= {r["key"] for r in records(b, "reconcile start")},
                     20, what="the new leader to reconcile what changed")
            # The standby may take over up to one retry period before the freeze began plus the
            # lease duration: it counts from when it last saw the record change, and the leader's
            # last renewal can precede the SIGSTOP. The freeze itself must outlast the lease
            # duration by the leader's own clock, so that is awaited, not assumed.
            wait_for(lambda: time.time() - frozen > LEASE_DURATION + RETRY_PERIOD, LEASE_DURATION + RETRY_PERIOD + 1,
                     what="the freeze to outlast the lease duration")
        finally:
            a.proc.send_signal(signal.SIGCONT)
        assert a.proc.wait(15) != 0
        after = [r for r in records(a, "reconcile start") if r["at"] >= frozen]
        assert after == [], f"the frozen leader started {len(after)} reconcile(s) after SIGCONT: {after}"
        assert records(a, "Leader election lost")
    finally:
        a.stop()
        b.stop()


@pytest.mark.parametrize("deaf", [False, True], ids=["plain", "deaf"])
def test_a_frozen_leader_s_background_task_changes_nothing_after_sigcont(cluster: Cluster, deaf: bool) -> None:
    """Both replicas run a leader-only background task that writes ConfigMap ``heartbeat``
    every 0.1 s. SIGSTOP the leader past the lease duration; the standby takes over and its task
    writes. After SIGCONT the old leader's task wakes on the same turn as its elector: none of
    its writes may land once the new leader's task has written — the task's writes are fenced by
    the Lease. ``deaf``: the task swallows every exception, its cancellation included, so it
    keeps writing until the process exits (up to 2 s after the loss). A watch of the ConfigMap
    sees every write that landed."""
    env = dict(DECLOP_TEST_HEARTBEAT="0.1", DECLOP_TEST_NAMESPACE=cluster.namespace, DECLOP_TEST_HEARTBEAT_DEAF="1" if deaf else "0")
    a = cluster.process("a", **env)
    b = cluster.process("b", **env)
    seen: list[tuple[str, str]] = []  # (replica, resourceVersion) of every write that landed, in order
    watch = kubernetes.watch.Watch()

    stopped = threading.Event()
    broke: list[BaseException] = []

    def observe() -> None:
        try:
            for event in watch.stream(cluster.core.list_namespaced_config_map, cluster.namespace,
                                      field_selector="metadata.name=heartbeat", timeout_seconds=120):  # fmt: skip
                if event["type"] in ("ADDED", "MODIFIED"):
                    obj = event["object"]
                    seen.append(((obj.data or {}).get("replica", "?"), obj.metadata.resource_version))
        except Exception as exc:  # noqa: BLE001 - the stream ends with an error once stopped
            if not stopped.is_set():
                broke.append(exc)

    observer = threading.Thread(target=observe, daemon=True)
    observer.start()
    a.start()
    try:
        a.wait_for_line("Successfully acquired lease")
        b.start()
        b.wait_for_line("Attempting to acquire leader lease")
        wait_for(lambda: any(r == "a" for r, _ in seen), 20, what="the leader's task to write")
        frozen = time.time()
        a.proc.send_signal(signal.SIGSTOP)
        try:
            b.wait_for_line("Successfully acquired lease", timeout=30)
            wait_for(lambda: any(r == "b" for r, _ in seen), 20, what="the new leader's task to write")
            wait_for(lambda: time.time() - frozen > LEASE_DURATION + RETRY_PERIOD, LEASE_DURATION + RETRY_PERIOD + 1,
                     what="the freeze to outlast the lease duration")
        finally:
            a.proc.send_signal(signal.SIGCONT)
        assert a.proc.wait(15) != 0
        landed = len(seen)
        wait_for(lambda: len(seen) >= landed + 3, 20, what="three more writes of the new leader's task")
    finally:
        a.stop()
        b.stop()
        stopped.set()
        watch.stop()
    assert broke == [], f"the watch of the ConfigMap broke, so writes may be missing: {broke}"
    first_b = next(i for i, (r, _) in enumerate(seen) if r == "b")
    late = [rv for r, rv in seen[first_b:] if r == "a"]
    print(f"measured: {first_b} write(s) of a's task, then {len(seen) - first_b} landed after b's first; a's among them: {len(late)}")
    assert late == [], f"the frozen leader's background task wrote {len(late)} time(s) after the new leader's task had: {late}"


def test_on_loss_the_process_exits_within_2_s_with_a_stuck_handler(cluster: Cluster, tmp_path: Path) -> None:
    """A plain handler blocks for ever in its thread, a shutdown hook blocks for ever in its
    thread and a background task ignores its cancellation; the Lease is lost (black hole). The
    process still exits 1 within 2 s of the loss (issue 22, defect 8), /healthz answers until
    then, and no credential file was ever written for the kubeconfig's embedded certificates."""
    health = free_port()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    with TcpProxy(cluster.control_plane.host) as proxy:
        kubeconfig = proxy.kubeconfig(cluster.control_plane.kubeconfig_path, tmp_path / "a.kubeconfig")
        a = cluster.process("a", "--kubeconfig", kubeconfig, "--health-port", str(health),
                            DECLOP_TEST_STUCK="1", DECLOP_TEST_STUCK_HOOKS="1", TMPDIR=str(scratch))
        a.start()
        try:
            a.wait_for_line("Successfully acquired lease")
            cluster.configmap("stuck")
            a.wait_for_line('"reconcile start"')
            a.wait_for_line("Starting background task")
            assert list(scratch.iterdir()) == [], "the embedded certificates stay in memory"
            exits: list[float] = []
            waiter = threading.Thread(target=lambda: (a.proc.wait(), exits.append(time.time())), daemon=True)
            waiter.start()
            proxy.blackhole()
            answers: list[tuple[float, int]] = []

            def healthz_until_exit() -> bool:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=1) as resp:
                        answers.append((time.time(), resp.status))
                except (urllib.error.URLError, ConnectionError, OSError):
                    pass
                return bool(exits)

            wait_for(healthz_until_exit, RENEW_DEADLINE + 15, interval=0.05, what="the process to exit")
            assert a.proc.returncode == 1
            lost = records(a, "Leader election lost")
            assert lost, a.lines[-20:]
            took = exits[0] - ts(lost[0])
            print(f"measured: exit {took:.3f} s after the loss was logged")
            assert took <= 2.0, f"exited {took:.2f} s after the loss"
            assert any(at >= ts(lost[0]) - 0.5 and status == 200 for at, status in answers), "/healthz answers until the exit"
            assert not any(r["msg"] == "reconcile end" for r in records(a)), "the handler really was stuck"
            assert list(scratch.iterdir()) == [], "no credential file is left behind by a forced exit"
        finally:
            proxy.forward()
            a.stop()


def test_a_forbidden_lease_says_so_on_every_retry_and_in_readyz(cluster: Cluster, tmp_path: Path) -> None:
    """An identity that may list and watch ConfigMaps but not touch Leases: one error line per
    retry naming verb, resource and namespace; the process keeps trying and /readyz says why."""
    control_plane, namespace = cluster.control_plane, cluster.namespace
    user = f"no-lease-{namespace[-5:]}"
    kubeconfig = control_plane.add_user(user)
    grant(cluster, user, "configmaps-only", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}])
    health = free_port()
    # --no-check-permissions: the start-up check would stop at the missing Lease grant (docs/rbac.md);
    # this is the Lease refused at run time, as when its RBAC is taken away from a running operator
    a = cluster.process("a", "--kubeconfig", kubeconfig, "--health-port", str(health), "--no-check-permissions")
    a.start()
    try:
        wait_for(lambda: len([r for r in records(a) if r["level"] == "ERROR"]) >= 3, 30, what="three failed Lease attempts")
        errors = [r for r in records(a) if r["level"] == "ERROR"]
        for r in errors:
            assert r["msg"].startswith(f'cannot get leases.coordination.k8s.io "{cluster.lock}" in namespace "{namespace}": ')
            assert "forbidden" in r["msg"]
            assert f'allow get, create and update on leases (group coordination.k8s.io) in namespace "{namespace}"' in r["msg"]
        gaps = [ts(b) - ts(a_) for a_, b in zip(errors, errors[1:])]
        assert all(g >= RETRY_PERIOD * 0.9 for g in gaps), f"one line per retry, not a burst: {gaps}"
        assert a.proc.poll() is None, "the process keeps trying"

        def readyz() -> tuple[int, str]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz?verbose", timeout=2) as resp:
                    return resp.status, resp.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read().decode()

        def synced() -> tuple[int, str] | None:
            answer = readyz()
            return answer if "[+]informer-sync" in answer[1] else None

        status, body = wait_for(synced, 20, what="the caches to sync")
        assert status == 503
        assert "[-]leader-election failed\n" in body and "cannot get" not in body  # the name, not the error text
        # granted now: the next retry succeeds and /readyz turns ready
        grant(cluster, user, "lease", [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}])
        a.wait_for_line("Successfully acquired lease", timeout=20)
        wait_for(lambda: readyz()[0] == 200, 10, what="/readyz to turn ready")
    finally:
        a.stop()


def test_a_replica_whose_caches_never_sync_leaves_the_lease_to_one_whose_caches_did(cluster: Cluster) -> None:
    """The simulator's `unsynced` fault (leader seeds 6, 40, 41, 74, 76) on a real apiserver: a
    replica that may get ConfigMaps but not list or watch them never syncs. It starts first, with
    the Lease free, and must not campaign — a leader with no cache reconciles nothing while a
    synced standby waits for ever. The second replica, synced, takes the Lease and reconciles."""
    control_plane, namespace = cluster.control_plane, cluster.namespace
    user = f"no-list-{namespace[-5:]}"
    kubeconfig = control_plane.add_user(user)
    grant(cluster, user, "get-only", [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
    ])
    cluster.configmap("x")
    health = free_port()
    a = cluster.process("a", "--kubeconfig", kubeconfig, "--health-port", str(health), "--no-check-permissions")
    b = cluster.process("b")
    a.start()
    try:
        def readyz() -> str:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz?verbose", timeout=2) as resp:
                    return resp.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.read().decode()
            except OSError:
                return ""

        # a runs, its list refused: before the fix it held the Lease by now (it campaigned at once)
        wait_for(lambda: "[-]informer-sync" in readyz(), 20, what="a's caches failing to sync")
        b.start()
        b.wait_for_line("Successfully acquired lease", timeout=20)
        wait_for(lambda: "x" in [r["key"] for r in records(b, "reconcile start")], 20, what="b reconciling x")
        holder = cluster.lease().spec.holder_identity
        assert holder and records(b, "Successfully acquired lease")[0].get("identity", holder) == holder
        assert not records(a, "Successfully acquired lease") and not records(a, "reconcile start"), a.lines[-20:]
        assert "[-]informer-sync" in readyz() and a.proc.poll() is None  # still waiting, still running
    finally:
        a.stop()
        b.stop()
