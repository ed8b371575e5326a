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
from declop.errors import ConfigError
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
