"""The virtual-time loop: the clock jumps to the next timer, pausing holds an actor's callbacks,
killing cancels its tasks, and a loop waiting on nothing is a deadlock, not a hang."""

from __future__ import annotations

import asyncio
from typing import Any, Coroutine, TypeVar

import pytest

from declop.testing.simulation.loop import Actor, Deadlock, VirtualLoop, actor

T = TypeVar("T")


def run(loop: VirtualLoop, coro: Coroutine[Any, Any, T]) -> T:
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def test_an_hour_of_sleeping_takes_no_time() -> None:
    loop = VirtualLoop(start=100.0)

    async def main() -> float:
        await asyncio.sleep(3600)
        return loop.time()

    assert run(loop, main()) == 3700.0


def test_timeouts_fire_at_their_virtual_instant() -> None:
    loop = VirtualLoop()

    async def main() -> float:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(loop.create_future(), 5)
        return loop.time()

    assert run(loop, main()) == 5.0


def test_a_paused_actor_stands_still_while_the_clock_moves_and_catches_up_in_order() -> None:
    loop = VirtualLoop()
    ticks: list[float] = []

    async def ticker() -> None:
        assert actor() is a
        while True:
            await asyncio.sleep(1)
            ticks.append(loop.time())

    async def main() -> None:
        a.spawn(ticker())
        await asyncio.sleep(3.5)
        a.pause()
        await asyncio.sleep(5)
        assert ticks == [1.0, 2.0, 3.0]
        a.resume()
        await asyncio.sleep(2.2)
        a.kill()
        await asyncio.sleep(0)

    a = Actor(loop, "a")
    run(loop, main())
    assert ticks == [1.0, 2.0, 3.0, 8.5, 9.5, 10.5]  # the 4.0 tick ran at the resume
    assert actor() is None


def test_a_killed_actors_tasks_are_cancelled_and_finish() -> None:
    loop = VirtualLoop()
    a = Actor(loop, "a")
    cleaned: list[float] = []

    async def work() -> None:
        try:
            await asyncio.sleep(100)
        finally:
            cleaned.append(loop.time())

    async def main() -> None:
        task = a.spawn(work())
        await asyncio.sleep(1)
        a.pause()  # even a paused one
        a.kill()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert task.cancelled()

    run(loop, main())
    assert cleaned == [1.0]


def test_waiting_on_nothing_is_a_deadlock() -> None:
    loop = VirtualLoop()
    with pytest.raises(Deadlock):
        run(loop, loop.create_future())
