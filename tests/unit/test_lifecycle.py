"""declop.lifecycle: hooks run in order, failures, background supervision (restart, stop, cancel).

The hooks here run on a real event loop with a stand-in ClientContext (hooks that read the
cluster are tested against the real apiserver in tests/integration/test_lifecycle_hooks.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

import pytest

from declop.reconcile.client import AsyncClient, Client
from declop.errors import ConfigError, Fenced
from declop.kube import fencing
from declop.cache.informer import Backoff
from declop.lifecycle import Lifecycle, make_hook


def quick() -> Backoff:
    return Backoff(initial=0.01, cap=0.02)


def lifecycle(*hooks: Any) -> Lifecycle:
    executor = concurrent.futures.ThreadPoolExecutor(2)
    return Lifecycle(list(hooks), ctx=object(), executor=executor, backoff=quick)  # type: ignore[arg-type]


def test_startup_hooks_run_in_order_with_the_client_flavour_of_their_kind() -> None:
    seen: list[Any] = []

    def first(client: Any, logger: Any, stop: Any) -> None:
        seen.append(("first", type(client), type(stop), threading.current_thread().name != "MainThread"))
        logger.info("prepared")

    async def second(client: Any, stop: Any) -> None:
        seen.append(("second", type(client), type(stop)))

    lc = lifecycle(make_hook(first, "startup"), make_hook(second, "startup"))
    asyncio.run(lc.startup())
    assert seen == [
        ("first", Client, threading.Event, True),
        ("second", AsyncClient, asyncio.Event),
    ]


def test_a_failing_startup_hook_stops_the_rest_with_one_line_naming_it() -> None:
    ran: list[str] = []

    def broken() -> None:
        raise RuntimeError("the database is not reachable")

    def after() -> None:
        ran.append("after")

    lc = lifecycle(make_hook(broken, "startup"), make_hook(after, "startup"))
    with pytest.raises(ConfigError) as err:
        asyncio.run(lc.startup())
    assert str(err.value) == (
        "startup hook 'broken' failed: RuntimeError: the database is not reachable; the operator did not start"
    )
    assert ran == []


def test_shutdown_hooks_all_run_and_a_failure_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    ran: list[str] = []

    async def one(stop: asyncio.Event) -> None:
        ran.append(f"one stop={stop.is_set()}")
        raise ValueError("nope")

    def two(stop: threading.Event) -> None:
        ran.append(f"two stop={stop.is_set()}")

    lc = lifecycle(make_hook(one, "shutdown"), make_hook(two, "shutdown"))
    assert asyncio.run(lc.shutdown()) is False
    assert ran == ["one stop=True", "two stop=True"]
    assert "Shutdown hook failed" in caplog.text


def test_a_crashing_background_task_is_restarted_with_backoff_and_a_returning_one_is_not() -> None:
    runs: list[int] = []

    async def flaky(stop: asyncio.Event) -> None:
        runs.append(len(runs))
        if len(runs) < 3:
            raise RuntimeError("crash")

    async def main() -> Lifecycle:
        lc = lifecycle(make_hook(flaky, "background"))
        lc.start_background(every_replica=False)
        for _ in range(200):
            if len(runs) == 3 and not lc.running:
                break
            await asyncio.sleep(0.01)
        return lc

    lc = asyncio.run(main())
    assert runs == [0, 1, 2]
    assert lc.starts == {"flaky": 3}
    assert lc.running == []


def test_stop_sets_the_event_first_and_cancels_what_outlives_the_grace() -> None:
    events: list[str] = []

    async def polite(stop: asyncio.Event) -> None:
        await stop.wait()
        events.append("polite saw stop")

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            events.append("stubborn cancelled")
            raise

    async def main() -> None:
        lc = lifecycle(make_hook(polite, "background"), make_hook(stubborn, "background"))
        lc.start_background(every_replica=False)
        await asyncio.sleep(0.05)
        assert sorted(lc.running) == ["polite", "stubborn"]
        await lc.stop_background(grace=0.2)
        assert lc.running == []

    asyncio.run(main())
    assert events == ["polite saw stop", "stubborn cancelled"]


def test_leadership_loss_cancels_only_leader_tasks_at_once() -> None:
    async def leader_only() -> None:
        await asyncio.sleep(3600)

    async def everywhere() -> None:
        await asyncio.sleep(3600)

    async def main() -> list[str]:
        lc = lifecycle(make_hook(leader_only, "background"), make_hook(everywhere, "background", every_replica=True))
        lc.start_background(every_replica=True)
        lc.start_background(every_replica=False)
        lc.start_background(every_replica=False)  # started once only
        await asyncio.sleep(0.01)
        assert lc.starts == {"everywhere": 1, "leader_only": 1}
        await asyncio.wait_for(lc.stop_background(grace=0, leader_only=True), 1)
        left = lc.running
        await lc.stop_background(grace=0)
        return left

    assert asyncio.run(main()) == ["everywhere"]


class _Lease:
    """A stand-in for an elector's ``valid``: the Lease is known valid while ``held``."""

    def __init__(self) -> None:
        self.held = True

    def valid(self) -> bool:
        return self.held


def test_a_leader_only_task_writes_under_its_lease_s_fence_and_an_every_replica_task_under_none() -> None:
    """The transport checks :func:`declop.kube.fencing.current` before every write: a leader-only
    task's is its Lease's fence (refusing once the Lease is not known valid), an every-replica
    task has none, and neither has one without a Lease (no leader election)."""
    lease = _Lease()
    seen: dict[str, Any] = {}

    async def leader_only() -> None:
        fence = seen["leader_only"] = fencing.current()
        if fence is None:
            return
        fence.check("PATCH", "/api/v1/namespaces/ns/configmaps/beat")  # sent while valid
        lease.held = False
        try:
            fence.check("PATCH", "/api/v1/namespaces/ns/configmaps/beat")
        except Fenced as exc:
            seen["refused"] = str(exc)

    async def everywhere() -> None:
        seen["everywhere"] = fencing.current()

    async def main(with_lease: bool) -> None:
        lc = lifecycle(make_hook(leader_only, "background"), make_hook(everywhere, "background", every_replica=True))
        given = (lease.valid, "ns/lock") if with_lease else None
        lc.start_background(every_replica=True, lease=given)
        lc.start_background(every_replica=False, lease=given)
        for _ in range(200):  # until both ran (a stop before their first step would skip them)
            if {"leader_only", "everywhere"} <= seen.keys():
                break
            await asyncio.sleep(0.01)
        await lc.stop_background(grace=1.0)

    asyncio.run(main(True))
    assert seen["everywhere"] is None
    assert seen["leader_only"].lease == "ns/lock" and "'leader_only'" in seen["leader_only"].key
    assert seen["refused"].startswith("PATCH /api/v1/namespaces/ns/configmaps/beat was not sent: Lease ns/lock is not known valid")
    assert seen["leader_only"].tripped is not None
    assert fencing.current() is None  # the caller's context never had it
    seen.clear()
    asyncio.run(main(False))  # no Lease: nothing to fence with
    assert seen == {"leader_only": None, "everywhere": None}


def test_a_leader_only_task_is_not_started_again_once_its_lease_is_not_known_valid(caplog: pytest.LogCaptureFixture) -> None:
    """A crash's backoff can end in the turn a process resumes after a pause, before its elector
    has seen the loss: the supervisor asks the Lease first, and leaves the task to the next
    holder. A task that ended with Fenced is not restarted either, even were the Lease valid."""
    lease = _Lease()
    runs: list[str] = []

    async def crashes_then_loses() -> None:
        runs.append("crashes")
        lease.held = False
        raise RuntimeError("crash")

    async def fenced() -> None:
        runs.append("fenced")
        fence = fencing.current()
        assert fence is not None
        lease.held = False
        try:
            fence.check("PUT", "/x")
        finally:
            lease.held = True  # valid again: the supervisor must still not restart it

    async def main(hook: Any) -> Lifecycle:
        lc = lifecycle(make_hook(hook, "background"))
        lc.start_background(every_replica=False, lease=(lease.valid, "ns/lock"))
        for _ in range(200):
            if not lc.running:
                break
            await asyncio.sleep(0.01)
        return lc

    assert asyncio.run(main(crashes_then_loses)).running == []
    assert runs == ["crashes"]
    assert "Not starting the background task: its Lease is not known valid" in caplog.text
    lease.held = True
    runs.clear()
    lc = asyncio.run(main(fenced))
    assert runs == ["fenced"] and lc.starts == {"fenced": 1} and lc.running == []
    assert "Write fenced; the background task ended and is left to the Lease's next holder" in caplog.text
