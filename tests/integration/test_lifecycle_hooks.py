"""Lifecycle hooks and background tasks against a real kube-apiserver: the order of startup hooks,
informers, background tasks, the drain and shutdown hooks; a failing startup hook (exit 1, one
line); and a leader-only background task with two real ``declop run`` processes, cancelled when
the leader loses its Lease and started on the new leader."""

from __future__ import annotations

import datetime
import json
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

import declop
from declop.manager import Options
from declop.testing.cluster.faults import TcpProxy
from declop.testing.cluster.runner import OperatorProcess, OperatorRunner, wait_for


def test_startup_informers_background_drain_shutdown_happen_in_that_order(kubeconfig, k8s_api, namespace):
    core = kubernetes.client.CoreV1Api(k8s_api)
    registry = declop.registry.Registry()
    events: list[tuple[Any, ...]] = []
    lock = threading.Lock()
    slow_started, slow_may_end = threading.Event(), threading.Event()

    def record(*what: Any) -> None:
        with lock:
            events.append(what)

    runner = OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=10))
    manager = runner.manager

    @declop.on_startup(registry=registry)
    def prepare(client, logger):
        informers = list(manager.informers)
        record("startup", len(informers), all(i._task is None for i in informers))
        # writes work before any informer runs; reads go to the apiserver (client.live)
        client.create("configmaps", {"metadata": {"name": "from-startup", "namespace": namespace}, "data": {}})
        record("live read", client.live.get("configmaps", f"{namespace}/from-startup")["metadata"]["name"])

    @declop.background(registry=registry)
    async def watcher(stop, logger):
        record("background start", manager.ready())
        await stop.wait()
        record("background saw stop")

    @registry.reconciler("configmaps")
    def handle(name, **_):
        record("reconcile", name)
        if name == "slow":
            slow_started.set()
            slow_may_end.wait(10)
            record("slow end")

    @declop.on_shutdown(registry=registry)
    async def cleanup(client):
        record("shutdown")
        await client.delete("configmaps", f"{namespace}/from-startup")  # the client still works

    with runner:
        wait_for(lambda: ("reconcile", "from-startup") in events, 10, what="the startup hook's ConfigMap reconciled")
        wait_for(lambda: any(e[0] == "background start" for e in events), 10, what="the background task")
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "slow"}})
        assert slow_started.wait(10)
        stopper = threading.Thread(target=runner.stop)
        stopper.start()
        wait_for(lambda: ("background saw stop",) in events, 10, what="the stop event set during the drain")
        assert ("shutdown",) not in events, "the shutdown hook waits for the drain"
        slow_may_end.set()
        stopper.join(30)

    kinds = [e[0] for e in events]
    assert events[0] == ("startup", 1, True), events  # the informer exists, none was started yet
    assert events[1] == ("live read", "from-startup")
    assert ("background start", True) in events, "background tasks start once the caches synced"
    assert kinds.index("slow end") < kinds.index("shutdown"), events
    assert kinds.index("background saw stop") < kinds.index("shutdown"), events
    assert kinds[-1] == "shutdown"
    with pytest.raises(kubernetes.client.ApiException) as gone:
        core.read_namespaced_config_map("from-startup", namespace)
    assert gone.value.status == 404


def test_a_failing_startup_hook_exits_1_with_one_line_and_starts_nothing(control_plane, namespace, tmp_path):
    handlers = tmp_path / "handlers.py"
    handlers.write_text(
        textwrap.dedent(
            """
            import declop

            @declop.on_startup
            def check_database(logger):
                raise RuntimeError("database db.example.com:5432 is unreachable")

            @declop.reconciler("configmaps")
            def handle(**_):
                pass
            """
        )
    )
    op = OperatorProcess([str(handlers), "-n", namespace], env=control_plane.env())
    op.start()
    assert op.proc.wait(60) == 1
    wait_for(lambda: op.stderr, 5)
    assert op.stderr[-1] == (
        "declop: error: startup hook 'check_database' failed: RuntimeError: database db.example.com:5432 "
        "is unreachable; the operator did not start"
    ), op.stderr
    assert not any("Traceback" in line for line in op.stderr + op.lines)
    assert not any("Starting Controller" in line for line in op.lines)


LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 4.0, 3.0, 0.5

HANDLERS = """
import asyncio
import os
import time

import declop

REPLICA = os.environ["DECLOP_TEST_REPLICA"]

@declop.reconciler("configmaps", labels="bg-test=yes")
def noop(**_):
    pass

@declop.background
async def leader_task(logger, stop):
    logger.info("leader task started", replica=REPLICA, at=time.time())
    try:
        while not stop.is_set():
            logger.info("leader tick", replica=REPLICA, at=time.time())
            try:
                await asyncio.wait_for(stop.wait(), 0.2)
            except asyncio.TimeoutError:
                pass
    except asyncio.CancelledError:
        logger.info("leader task cancelled", replica=REPLICA, at=time.time())
        raise

@declop.background(every_replica=True)
async def replica_task(logger, stop):
    logger.info("replica task started", replica=REPLICA, at=time.time())
    await stop.wait()
    logger.info("replica task stopped", replica=REPLICA, at=time.time())
"""


def records(op: OperatorProcess, msg: str) -> list[dict[str, Any]]:
    return [r for r in (json.loads(line) for line in list(op.lines) if line.startswith("{")) if r.get("msg") == msg]


def test_a_leader_only_task_runs_on_the_leader_is_cancelled_on_loss_and_moves_to_the_new_leader(
    control_plane, namespace, tmp_path: Path
):
    handlers = tmp_path / "handlers.py"
    handlers.write_text(textwrap.dedent(HANDLERS))
    lock = "bg-" + namespace[-5:]

    def process(replica: str, *extra: str) -> OperatorProcess:
        args = [
            str(handlers), "-n", namespace, "--log-format", "json", "--leader-elect",
            "--leader-election-id", lock, "--leader-election-namespace", namespace,
            "--lease-duration", str(LEASE_DURATION), "--renew-deadline", str(RENEW_DEADLINE),
            "--retry-period", str(RETRY_PERIOD), *extra,
        ]
        return OperatorProcess(args, env={**control_plane.env(), "DECLOP_TEST_REPLICA": replica})

    with TcpProxy(control_plane.host) as proxy:
        kubeconfig = proxy.kubeconfig(control_plane.kubeconfig_path, tmp_path / "a.kubeconfig")
        a = process("a", "--kubeconfig", kubeconfig)
        b = process("b")
        a.start()
        try:
            a.wait_for_line('"leader task started"')
            b.start()
            b.wait_for_line('"replica task started"')  # every replica: on the standby too
            a.wait_for_line('"replica task started"')
            # B is a ready standby: while A keeps ticking (10 more ticks), B's leader task never starts
            ticks = len(records(a, "leader tick"))
            wait_for(lambda: len(records(a, "leader tick")) >= ticks + 10, 10, what="ten more ticks on the leader")
            assert records(b, "leader task started") == []

            proxy.blackhole()  # A can no longer renew: it loses the Lease within the renew deadline
            try:
                cancelled = wait_for(lambda: records(a, "leader task cancelled"), RENEW_DEADLINE + 10, what="A's task cancelled")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; A exited {a.proc.poll()}:\n" + "\n".join(a.lines[-40:] + a.stderr[-20:])) from None
            assert a.proc.wait(10) == 1, "a replica that lost its Lease exits 1"
            (lost,) = records(a, "Leader election lost")
            lost_at = datetime.datetime.fromisoformat(lost["ts"].replace("Z", "+00:00")).timestamp()
            assert cancelled[0]["at"] - lost_at < 1.0, "cancelled as soon as the loss is known"
            last_tick = max(r["at"] for r in records(a, "leader tick"))

            started = b.wait_for_line('"leader task started"', timeout=LEASE_DURATION + 15)
            b_start = json.loads(started[0])["at"]
            assert b_start > cancelled[0]["at"] >= last_tick, "never two leader tasks at once"
            b.wait_for_line('"leader tick"')
        finally:
            proxy.forward()
            a.stop()
            b.stop()
    assert b.returncode == 0
    assert records(b, "leader task cancelled") == [], "a graceful stop sets the event and the task returns"
    assert records(b, "replica task stopped")


SINGLETON = """
import json
import os
import time

import declop

REPLICA, OUT = os.environ["DECLOP_TEST_REPLICA"], os.environ["DECLOP_TEST_OUT"]


def note(what):
    with open(OUT, "a") as f:
        f.write(json.dumps({"replica": REPLICA, "what": what, "at": time.time()}) + "\\n")


@declop.reconciler("configmaps", labels="singleton-test=yes")
def nothing(**_):
    pass


@declop.background
async def singleton(stop, logger):
    import asyncio

    note("start")
    while not stop.is_set():
        note("tick")
        try:
            await asyncio.wait_for(stop.wait(), 0.1)
        except asyncio.TimeoutError:
            pass
    note("end")


@declop.background(every_replica=True)
async def everywhere(stop, logger):
    note("everywhere")
    await stop.wait()
"""


def test_sharded_replicas_run_a_leader_only_task_on_one_replica_at_a_time(control_plane, namespace, tmp_path):
    """Sharding has no leader, but a leader-only background task must still run once: on the
    holder of the --leader-election-id Lease. 3 replicas: one runs it (every_replica tasks run on
    all three); kill -9 of it: another takes over once the Lease expired; SIGTERM of that one: it
    ends its task and releases, and the last takes over within a few retry periods. Never two at
    overlapping times."""
    from declop.testing import Replicas

    handlers = tmp_path / "singleton.py"
    handlers.write_text(SINGLETON)
    out = tmp_path / "notes.jsonl"
    args = [
        str(handlers), "-n", namespace, "--log-format", "json", "--shards", "6",
        "--leader-election-id", "singleton", "--leader-election-namespace", namespace,
        "--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5",
    ]  # fmt: skip

    def notes() -> list[dict[str, Any]]:
        return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []

    def runners() -> list[str]:
        return sorted({n["replica"] for n in notes() if n["what"] == "start"})

    with Replicas(args, env=control_plane.env()) as replicas:
        for r in "abc":
            replicas.start(r, DECLOP_TEST_REPLICA=r, DECLOP_TEST_OUT=str(out))
        wait_for(lambda: len({n["replica"] for n in notes() if n["what"] == "everywhere"}) == 3, 60, what="every_replica tasks on all 3")
        first = wait_for(lambda: runners()[0] if runners() else None, 60, what="one replica running the task")
        replicas["a"].wait_for_line("Acquired shard", timeout=30)
        wait_for(lambda: sum(1 for n in notes() if n["what"] == "tick" and n["replica"] == first) >= 20, 30, what="ticks")
        assert runners() == [first], "a leader-only task ran on two replicas"
        assert replicas.kill(first) == -9
        killed_at = time.time()
        second = wait_for(lambda: next((r for r in runners() if r != first), None), 30, what="a second replica taking over")
        took = min(n["at"] for n in notes() if n["replica"] == second and n["what"] == "start") - killed_at
        print(f"measured: leader-only task moved {took:.2f} s after kill -9 (lease duration 4 s)")
        assert took <= 4 + 2 * 0.5 + 1.0
        assert replicas.stop(second)[second] == 0
        stopped_at = max(n["at"] for n in notes() if n["replica"] == second and n["what"] == "end")
        third = wait_for(lambda: next((r for r in runners() if r not in (first, second)), None), 30, what="the last replica taking over")
        took = min(n["at"] for n in notes() if n["replica"] == third and n["what"] == "start") - stopped_at
        print(f"measured: leader-only task moved {took:.2f} s after a graceful stop (released)")
        assert took < 4, "a released Lease is taken within a retry period or two, not after expiry"
    # never two at once: each replica's run is [start, last tick or end]; the runs do not overlap
    runs = []
    for r in (first, second, third):
        mine = [n["at"] for n in notes() if n["replica"] == r and n["what"] in ("start", "tick", "end")]
        runs.append((min(mine), max(mine), r))
    runs.sort()
    for (_, end, a), (start, _, b) in zip(runs, runs[1:]):
        assert start > end, f"{b} started its task at {start} before {a}'s ended at {end}"
