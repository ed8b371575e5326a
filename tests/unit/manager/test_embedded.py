"""declop.Operator without a cluster (the manager stubbed): what it leaves to the host, how a
loss, a failed start and a second start reach the caller, from a thread and from a loop."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from typing import Any

import pytest

import declop
from declop.errors import ConfigError
from declop.kube.restconfig import RestConfig
from declop.manager import LeaseLost, Options, embedded
from declop.testing.cluster.runner import wait_for


class FakeManager:
    """Ready at once; runs until its stop event; may lose its Lease or fail to start."""

    script: list[str] = []
    #: a "lose" run loses its Lease once this is set (after the test saw it ready)
    lose_now = threading.Event()

    def __init__(self, configuration: Any, registry: Any, options: Any, metrics: Any = None) -> None:
        from declop.manager.loss import Loss

        self.configuration, self.options = configuration, options
        self.loss = Loss()
        self.exit_code = 0
        self.on_lost = None
        self._ready = False
        self.stopped = False

    def ready(self) -> bool:
        return self._ready

    async def run(self, stop: asyncio.Event) -> None:
        what = FakeManager.script.pop(0) if FakeManager.script else "run"
        if what == "fail":
            raise ConfigError("no reconciler is registered")
        self._ready = True
        if what == "lose":
            while not FakeManager.lose_now.is_set():
                await asyncio.sleep(0.005)
            self.loss.on_lost = self.on_lost
            self.exit_code = 1
            self.loss.declare()
            self.stopped = True
            return
        await stop.wait()
        self.stopped = True


@pytest.fixture(autouse=True)
def fake_manager(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "Manager", FakeManager)
    FakeManager.script = []
    FakeManager.lose_now = threading.Event()


def operator(**kw: Any) -> declop.Operator:
    return declop.Operator(declop.registry.Registry(), configuration=RestConfig(host="https://k8s:6443"), **kw)


def test_the_default_options_leave_the_hosts_switch_interval_and_signals_alone() -> None:
    before = (sys.getswitchinterval(), signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    op = operator()
    assert op.options.switch_interval is None
    with op:
        assert op.ready()
    assert (sys.getswitchinterval(), signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    assert operator(options=Options(switch_interval=0.001)).options.switch_interval == 0.001


def test_a_loss_from_a_thread_is_raised_by_wait_once_and_on_lost_is_called() -> None:
    FakeManager.script = ["lose"]
    lost: list[bool] = []
    op = operator(on_lost=lambda: lost.append(True))
    op.start()
    assert op.wait(0.05) is False  # still running
    FakeManager.lose_now.set()
    with pytest.raises(LeaseLost, match="lost its Lease"):
        op.wait(10)
    assert lost == [True] and op.exit_code == 1 and not op.running
    op.stop()  # already raised: not again


def test_a_loss_is_raised_by_stop_when_nobody_waited() -> None:
    FakeManager.script = ["lose"]
    op = operator()
    op.start()
    FakeManager.lose_now.set()
    wait_for(lambda: not op.running, 5, what="the run's end")
    with pytest.raises(LeaseLost):
        op.stop()


def test_a_failed_start_raises_in_the_caller_and_a_second_start_works() -> None:
    FakeManager.script = ["fail", "run"]
    op = operator()
    with pytest.raises(ConfigError, match="no reconciler"):
        op.start()
    assert not op.running
    with op:
        assert op.ready()
    assert not op.running and op.manager.stopped


def test_on_a_loop_run_raises_lease_lost_and_async_with_refuses_a_second_run() -> None:
    async def main() -> None:
        FakeManager.script = ["lose"]
        FakeManager.lose_now.set()
        op = operator()
        with pytest.raises(LeaseLost):
            await op.run()
        async with op:
            with pytest.raises(RuntimeError, match="^this Operator already runs: stop\\(\\) it before starting it again$"):
                await op.run()
            assert op.ready()
        assert not op.running

    asyncio.run(main())


def test_a_failed_astart_raises_and_leaves_nothing_running() -> None:
    async def main() -> None:
        FakeManager.script = ["fail"]
        op = operator()
        with pytest.raises(ConfigError):
            await op.astart()
        assert not op.running
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    asyncio.run(main())


def test_request_stop_before_the_run_began_still_stops_it() -> None:
    async def main() -> None:
        op = operator()
        task = asyncio.ensure_future(op.run())
        await asyncio.sleep(0)  # run() began: its stop event exists
        op.request_stop()
        await asyncio.wait_for(task, 5)
        assert op.manager.stopped

    asyncio.run(main())
