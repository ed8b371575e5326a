"""The plain handler's thread hop (:func:`declop.reconcile._run.hand_off`): the thread wakes the
loop itself, and cancellation still flows both ways as it did through ``asyncio.wrap_future``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from declop.queue.batches import STALL_AFTER, Batch
from declop.reconcile._run import Watch, hand_off, returned, watch
from declop.testing.simulation.loop import VirtualLoop


def test_the_waiter_ends_once_the_function_returned_and_carries_its_exception() -> None:
    ran: list[str] = []

    def work(name: str) -> None:
        ran.append(threading.current_thread().name)

    def broken() -> None:
        raise KeyError("framework bug")

    async def go() -> None:
        loop = asyncio.get_running_loop()
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hop") as pool:
            job, waiter = hand_off(pool, loop, work, "a")
            await waiter
            assert ran and ran[0].startswith("hop") and returned(job, waiter)
            job, waiter = hand_off(pool, loop, broken)
            with pytest.raises(KeyError, match="framework bug"):
                await waiter
            assert returned(job, waiter)

    asyncio.run(go())


def test_a_cancelled_waiter_cancels_a_job_no_thread_took_and_nothing_runs() -> None:
    gate, ran = threading.Event(), []

    async def go() -> None:
        loop = asyncio.get_running_loop()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            busy, busy_waiter = hand_off(pool, loop, gate.wait)  # holds the only thread
            job, waiter = hand_off(pool, loop, ran.append, "never")
            waiter.cancel()
            await asyncio.sleep(0)  # a future's callbacks run on the loop's next turn, as with wrap_future
            assert job.cancelled() and returned(job, waiter)
            assert not returned(busy, busy_waiter)  # still running: its ranges stay in flight
            busy_waiter.cancel()  # a running job cannot be cancelled: it goes on ...
            await asyncio.sleep(0)
            assert not busy.cancelled() and not returned(busy, busy_waiter)
            gate.set()
            await asyncio.wrap_future(busy)  # ... until its thread returns
            assert returned(busy, busy_waiter)
        assert ran == []

    try:
        asyncio.run(go())
    finally:
        gate.set()  # a failed assertion must not leave the pool's exit waiting on the gate


def test_a_job_cancelled_at_shutdown_cancels_its_waiter_so_no_worker_waits_for_ever() -> None:
    gate = threading.Event()

    async def go() -> None:
        loop = asyncio.get_running_loop()
        pool = concurrent.futures.ThreadPoolExecutor(1)
        _, first = hand_off(pool, loop, gate.wait)
        job, waiter = hand_off(pool, loop, lambda: None)
        pool.shutdown(wait=False, cancel_futures=True)
        assert job.cancelled()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiter, 5)
        gate.set()
        await asyncio.wait_for(first, 5)

    try:
        asyncio.run(go())
    finally:
        gate.set()


class _Turns(VirtualLoop):
    """A virtual loop that gives up after a bounded number of turns (a spin at one instant)."""

    turns = 0

    def _run_once(self) -> None:
        self.turns += 1
        if self.turns > 1_000:
            raise RuntimeError(f"still spinning at t={self.time()!r}")
        super()._run_once()


def _calls(*keys: str) -> list[Any]:
    """Calls of a batch as ``watch`` sees them: held, not finished, no trace, no finalizer owed."""
    return [SimpleNamespace(finished=False, held=True, key=k, trace=None, add_finalizer=False) for k in keys]


def _controller(given_back: list[Any]) -> Any:
    """The parts of a controller ``watch`` touches; keys it gives back land in ``given_back``."""
    return SimpleNamespace(
        keys=SimpleNamespace(restore=lambda key, trace: None), echoes=None, name="widgets",
        queue=SimpleNamespace(give_back=lambda *keys: given_back.extend(keys)), log=logging.getLogger("test"),
    )


def test_a_stall_on_a_clock_moved_only_by_timers_is_noticed_at_its_deadline_not_spun_on() -> None:
    """``declop sim``'s clock moves only when a timer fires. At t=26 the timer armed for
    ``STALL_AFTER`` fires with ``clock() - started`` a rounding error short of it, and re-arming
    for the difference landed on the same instant for ever (the world's plain handler hit its
    step bound with three calls made). A timer armed for the call still running is the stall."""
    loop = _Turns(start=26.0)
    assert (26.0 + STALL_AFTER) - 26.0 < STALL_AFTER  # the rounding this test is about
    calls = _calls("a", "b")
    batch = Batch(calls, loop.time)
    assert batch.next() is calls[0]  # the thread runs the first call; the second waits behind it
    given_back: list[Any] = []
    try:
        w = Watch(batch, calls, loop.create_future(), batch.started_at)
        w.timer = loop.call_later(STALL_AFTER, watch, _controller(given_back), w)
        loop.run_until_complete(w.woken)
        assert given_back == ["b"] and loop.time() == 26.0 + STALL_AFTER
        assert loop.turns < 10
    finally:
        loop.close()


def test_a_later_call_of_the_batch_gets_its_own_stall_allowance() -> None:
    """The timer armed for the batch finds another call started meanwhile: that call's time is
    measured from its own start, and nothing is given back before it too ran ``STALL_AFTER``."""
    loop = _Turns(start=10.0)
    calls = _calls("a", "b", "c")
    batch = Batch(calls, loop.time)
    batch.next()
    given_back: list[Any] = []
    try:
        w = Watch(batch, calls, loop.create_future(), batch.started_at)
        w.timer = loop.call_later(STALL_AFTER, watch, _controller(given_back), w)
        loop.call_later(STALL_AFTER / 2, batch.next)  # the second call starts half way
        loop.run_until_complete(w.woken)
        assert given_back == ["c"]
        assert loop.time() == pytest.approx(10.0 + STALL_AFTER * 1.5)
    finally:
        loop.close()
