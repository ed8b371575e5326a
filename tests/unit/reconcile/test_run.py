"""The plain handler's thread hop (:func:`declop.reconcile._run.hand_off`): the thread wakes the
loop itself, and cancellation still flows both ways as it did through ``asyncio.wrap_future``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from declop.reconcile._run import hand_off, returned


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
