"""declop.manager: what start does before it touches the apiserver (no cluster here)."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest

from declop.manager import Manager, Options


class _Stop(Exception):
    pass


@pytest.mark.parametrize(("given", "expected"), [(0.001, 0.001), (0.0005, 0.0005), (None, "unchanged")])
def test_start_sets_the_interpreter_switch_interval(monkeypatch: pytest.MonkeyPatch, given: float | None, expected: object) -> None:
    """A thread computing holds the loop's next step up to the switch interval: the manager
    sets it to 1 ms by default (Python's is 5 ms), or leaves it alone with None."""
    before = sys.getswitchinterval()

    async def no_cluster(self: Manager) -> None:
        raise _Stop()

    monkeypatch.setattr(Manager, "setup", no_cluster)
    try:
        sys.setswitchinterval(0.005)
        with pytest.raises(_Stop):
            asyncio.run(Manager(None, options=Options(switch_interval=given)).start())
        assert sys.getswitchinterval() == pytest.approx(0.005 if expected == "unchanged" else expected)
    finally:
        sys.setswitchinterval(before)


def test_the_default_is_one_millisecond() -> None:
    assert Options().switch_interval == 0.001


# -- issue 22: a stop never releases a Lease under a running call (I6); the exit after a loss is bounded
import concurrent.futures  # noqa: E402
import threading  # noqa: E402
from typing import Any  # noqa: E402

import declop  # noqa: E402
from declop.cache.store import Store, Writer  # noqa: E402
from declop.kube.discovery import ResourceInfo  # noqa: E402
from declop.kube.keys import Request  # noqa: E402
from declop.leases.leader import LeaderElector  # noqa: E402
from declop.lifecycle import Lifecycle, make_hook  # noqa: E402
from declop.manager import LOST_CLEANUP_SECONDS  # noqa: E402
from declop.manager.leadership import LeaderLease  # noqa: E402
from declop.reconcile.controller import Controller, Source  # noqa: E402
from declop.reconcile.mapping import enqueue_self  # noqa: E402
from declop.testing.fakes.apiserver import FakeApiServer  # noqa: E402

CM = ResourceInfo(group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True)


class _Informer:
    def __init__(self) -> None:
        self.store = Store("configmaps")
        Writer(self.store).upsert({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "ns", "resourceVersion": "1", "uid": "u1"}})
        self.namespace, self.name, self.resource = "", "configmaps", CM
        self.synced = asyncio.Event()
        self.synced.set()
        self.last_error, self.syncing, self.lists = "", False, 1

    def subscribe(self, handler: Any) -> None:
        pass


class _Context:
    transport = None
    recorder = None


class _Stuck:
    """A plain handler, a plain shutdown hook and a background task that never end by
    themselves (until :meth:`free`), the last one ignoring its cancellation."""

    def __init__(self) -> None:
        self.called = threading.Event()
        self.released = threading.Event()

    def handler(self, **_: Any) -> None:
        self.called.set()
        self.released.wait()

    def shutdown_hook(self, **_: Any) -> None:
        self.released.wait()

    async def background(self, **_: Any) -> None:
        while not self.released.is_set():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass  # ignores its cancellation

    def free(self) -> None:
        self.released.set()


def _manager(stuck: _Stuck, elector: Any, grace: float) -> tuple[Manager, Controller]:
    registry = declop.registry.Registry()
    registry.reconciler("configmaps")(stuck.handler)
    m = Manager(None, registry, Options(grace_period=grace, renew_deadline=3.0, lease_duration=4.0, retry_period=0.5))
    m.executor = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="declop-handler")
    c = Controller(registry.registrations[0], CM, [Source((_Informer(),), enqueue_self, primary=True)], _Context(), executor=m.executor)  # type: ignore[arg-type]
    m.controllers = [c]
    hooks = [make_hook(stuck.shutdown_hook, "shutdown"), make_hook(stuck.background, "background")]
    m.lifecycle = Lifecycle(hooks, _Context(), m.executor)  # type: ignore[arg-type]
    m.started_up = True
    m.elector, m.leadership = elector, asyncio.Event()
    return m, c


async def _start(m: Manager, c: Controller, stuck: _Stuck) -> asyncio.Event:
    stop = asyncio.Event()
    m._stop = stop
    loop = asyncio.get_running_loop()
    loop.create_task(c.start(m.leadership))  # as the manager does: caches warm while it campaigns
    m.group.start(LeaderLease(m))
    await m.leadership.wait()  # type: ignore[union-attr]
    assert m.lifecycle is not None
    m.lifecycle.start_background(every_replica=False)
    c.queue.add(Request("ns", "a"))
    assert await asyncio.to_thread(stuck.called.wait, 10), "the handler runs"
    return stop


async def _cleanup(m: Manager, stuck: _Stuck) -> None:
    stuck.free()
    assert m.lifecycle is not None
    for t in m.lifecycle._tasks:
        t.task.cancel()
    await asyncio.gather(*(t.task for t in m.lifecycle._tasks), return_exceptions=True)
    assert m.executor is not None
    await asyncio.to_thread(m.executor.shutdown, True)


def test_after_a_loss_the_clean_up_ends_within_its_budget_whatever_is_stuck() -> None:
    """Issue 22, defect 8: a plain handler stuck in its thread, a plain shutdown hook stuck in
    its thread and a background task that ignores its cancellation. The Lease is lost: the
    manager's whole stop takes at most LOST_CLEANUP_SECONDS (1.5 s) from the loss, and
    ``on_lost`` — where ``declop run`` arms the 2 s watchdog — is called once, at the loss.
    Before, stop_background waited for the background task for ever."""

    class Elector:
        def __init__(self) -> None:
            self.lost = asyncio.Event()
            self.released = False

        async def acquire(self) -> None:
            pass

        async def hold(self) -> None:
            await self.lost.wait()

        def lose(self, why: str) -> None:
            pass

        def valid(self) -> bool:
            return not self.lost.is_set()

        async def release(self) -> None:
            self.released = True

    async def main() -> None:
        stuck, elector = _Stuck(), Elector()
        m, c = _manager(stuck, elector, grace=30.0)
        loop = asyncio.get_running_loop()
        armed: list[float] = []
        m.on_lost = lambda: armed.append(loop.time())
        stop = await _start(m, c, stuck)
        elector.lost.set()
        try:
            await asyncio.wait_for(stop.wait(), 5)
            await asyncio.wait_for(m.shutdown(), 5)
            took = loop.time() - armed[0]
            assert len(armed) == 1 and m.exit_code == 1
            assert took <= LOST_CLEANUP_SECONDS + 0.1, f"the clean-up took {took:.3f} s after the loss"
            assert c.running() == 1, "the handler's thread still runs (the process exit ends it)"
            assert m.lifecycle is not None and m.lifecycle.running == ["background"]
        finally:
            await _cleanup(m, stuck)

    asyncio.run(main())


def test_a_replica_campaigns_for_the_leader_lease_only_once_its_caches_synced() -> None:
    """A replica whose caches never sync (a 403 on a watched resource) would hold the Lease and
    reconcile nothing while a synced standby waits: the world's ``unsynced`` kind found it (I3,
    leader seeds 6, 40, 41, 74, 76 of ``unsynced,crash,hang``). It campaigns once synced."""

    class Elector:
        def __init__(self) -> None:
            self.acquiring = asyncio.Event()

        async def acquire(self) -> None:
            self.acquiring.set()
            await asyncio.Event().wait()

    async def main() -> None:
        stuck, elector = _Stuck(), Elector()
        m, c = _manager(stuck, elector, grace=1.0)
        task = asyncio.get_running_loop().create_task(LeaderLease(m).run())
        try:
            for _ in range(20):  # every pending step of the task runs; it stays before acquire()
                await asyncio.sleep(0)
            assert not elector.acquiring.is_set() and not c.synced.is_set()
            c.synced.set()
            await asyncio.wait_for(elector.acquiring.wait(), 5)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await _cleanup(m, stuck)

    asyncio.run(main())


def test_a_graceful_stop_leaves_the_lease_to_expire_while_a_handler_thread_runs(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 22, defect 2: SIGTERM with a grace period; a plain handler outlives it in its thread.
    The real LeaderElector, on a fake apiserver, keeps its record naming us — left to expire,
    with one log line — instead of releasing it under the running call. Before, it was released."""

    async def main() -> None:
        server = FakeApiServer()
        elector = LeaderElector(server, name="lock", namespace="ns", identity="me", lease_duration=4.0, renew_deadline=3.0, retry_period=0.5)
        stuck = _Stuck()
        m, c = _manager(stuck, elector, grace=0.2)
        stop = await _start(m, c, stuck)
        stop.set()
        try:
            await asyncio.wait_for(m.shutdown(), 10)
            lease = await server.request("GET", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/lock")
            assert lease["spec"]["holderIdentity"] == "me", "not released: it expires"
            assert not elector.valid() and m.running() >= 1
            lines = [r for r in caplog.records if r.getMessage() == "Leaving the Lease to expire: calls under it still run"]
            assert len(lines) == 1 and lines[0].kv["running"] >= 1  # type: ignore[attr-defined]
            over = [r for r in caplog.records if r.getMessage() == "Grace period over; some reconciles did not finish"]
            assert len(over) == 1 and over[0].kv == {"gracePeriod": 0.2}  # type: ignore[attr-defined]
        finally:
            await _cleanup(m, stuck)

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())


def test_a_graceful_stop_that_leaves_the_lease_to_expire_exits_as_after_a_loss() -> None:
    """Simulator `shared-id` seed 402 (tests/unit/testing/simulation/test_leases.py): a Lease left to expire
    under a call still in its thread is a loss — ``on_lost`` (the 2 s watchdog) is called at that
    moment, the exit status is 1, and every later step shares the loss's budget, so the process
    and the stuck thread are gone before another replica may take the Lease. Before, the stop
    went on with steps bounded by 10-30 s each."""

    async def main() -> None:
        server = FakeApiServer()
        elector = LeaderElector(server, name="lock", namespace="ns", identity="me", lease_duration=4.0, renew_deadline=3.0, retry_period=0.5)
        stuck = _Stuck()
        m, c = _manager(stuck, elector, grace=0.2)
        loop = asyncio.get_running_loop()
        armed: list[float] = []
        m.on_lost = lambda: armed.append(loop.time())
        stop = await _start(m, c, stuck)
        stop.set()
        try:
            await asyncio.wait_for(m.shutdown(), 10)
            assert len(armed) == 1 and m.exit_code == 1
            assert loop.time() - armed[0] <= LOST_CLEANUP_SECONDS + 0.1
            assert not elector.valid() and m.running() >= 1
        finally:
            await _cleanup(m, stuck)

    asyncio.run(main())


def test_a_graceful_stop_that_leaves_a_range_to_expire_does_not_wait_for_the_other_releases() -> None:
    """Sharded, `shared-id` seed 402: r2 is cut off (requests hang), SIGTERM ends its grace
    period with a call of range 0 in its thread. release_all() leaves range 0 to expire, then
    releases range 3 and deletes the member Lease — 5 s each to time out under the partition —
    and the process outlived range 0's expiry: another replica took it while the call ran (I5).
    Now ``busy()`` ranges make the stop a loss: armed at once, release_all cut at the budget."""

    class Elector:  # leader election is not what this test is about: never lost
        is_leader = False

        async def acquire(self) -> None:
            pass

        async def hold(self) -> None:
            await asyncio.Event().wait()

        def valid(self) -> bool:
            return True

    class ShardLeases:
        stopping = False
        released = False

        def busy(self) -> list[tuple[str, int]]:
            return [("configmaps", 0)]

        async def release_all(self) -> None:
            await asyncio.sleep(10)  # the releases and deletes, timing out under a partition
            self.released = True

    async def main() -> None:
        stuck = _Stuck()
        m, c = _manager(stuck, Elector(), grace=0.2)
        loop = asyncio.get_running_loop()
        armed: list[float] = []
        m.on_lost = lambda: armed.append(loop.time())
        stop = await _start(m, c, stuck)
        m.elector, leases = None, ShardLeases()
        m.shard_leases = leases  # type: ignore[assignment]
        stop.set()
        try:
            await asyncio.wait_for(m.shutdown(), 10)
            assert len(armed) == 1 and m.exit_code == 1
            assert loop.time() - armed[0] <= LOST_CLEANUP_SECONDS + 0.1, "cut at the loss's budget"
            assert not leases.released
        finally:
            await _cleanup(m, stuck)

    asyncio.run(main())


def test_metrics_are_recorded_only_when_served_or_asked_for() -> None:
    """Nobody can scrape the metrics of a run without ``metrics_port``: nothing is recorded (the
    controllers get the no-op hooks, ~10 µs of CPU per reconcile saved) and no loop-lag sampler
    runs; a metrics port, or a ``Metrics`` given by the caller (a test), records as before."""
    from declop.serving.metrics import Metrics

    assert Manager(None, options=Options()).metrics is None
    assert Manager(None, options=Options()).loop_lag is None
    assert isinstance(Manager(None, options=Options(metrics_port=8443)).metrics, Metrics)
    given = Metrics()
    m = Manager(None, options=Options(), metrics=given)
    assert m.metrics is given and m.loop_lag is not None
