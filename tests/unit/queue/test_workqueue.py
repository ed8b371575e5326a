"""declop.queue.workqueue: client-go workqueue semantics, deterministic under a FakeClock.

Every test runs twice: against the FIFO :class:`WorkQueue` and against the
:class:`~declop.queue.priority.PriorityQueue` (all adds at one priority), which must keep every
guarantee. The priority queue's own ordering is tested in ``test_priorityqueue.py``.

Async tests drive their own loop with ``asyncio.run`` (no pytest-asyncio). Only the timer tests use
the real monotonic clock, with deadlines of 10 ms, and they wait by awaiting ``get``.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from declop.clock import MONOTONIC, FakeClock
from declop.queue.priority import PriorityQueue
from declop.queue.ratelimit import ItemExponential, RateLimiter
from declop.queue.workqueue import (
    NO_METRICS,
    QueueEmpty,
    QueueMetrics,
    QueueShutDown,
    QueueStatistics,
    WorkQueue,
)


QUEUE: type[WorkQueue] = WorkQueue  # type: ignore[type-arg]  # set per test by the fixture below


@pytest.fixture(autouse=True, params=[WorkQueue, PriorityQueue], ids=["fifo", "priority"])
def queue_class(request: pytest.FixtureRequest) -> type[WorkQueue]:  # type: ignore[type-arg]
    global QUEUE
    QUEUE = request.param
    return request.param  # type: ignore[no-any-return]


def make(
    *,
    name: str = "",
    rate_limiter: RateLimiter | None = None,
    metrics: QueueMetrics | None = None,
) -> tuple[WorkQueue[str], FakeClock]:
    """A queue of strings on a fresh FakeClock."""
    clock = FakeClock()
    queue = QUEUE(name=name, rate_limiter=rate_limiter, clock=clock, metrics=metrics)
    return queue, clock


def drain_ready(queue: WorkQueue[str]) -> list[str]:
    """Take every ready item (without calling done)."""
    items = []
    while True:
        try:
            items.append(queue.get_nowait())
        except QueueEmpty:
            return items


class RecordingMetrics:
    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def added(self, name: str) -> None:
        self.calls.append(("added", name))

    def got(self, name: str, queued_seconds: float) -> None:
        self.calls.append(("got", name, queued_seconds))

    def done(self, name: str, work_seconds: float) -> None:
        self.calls.append(("done", name, work_seconds))

    def retried(self, name: str) -> None:
        self.calls.append(("retried", name))


# ---------------------------------------------------------------------------- core queue


def test_fifo_and_dedup_before_get() -> None:
    queue, _ = make()
    for item in ["a", "b", "a", "c", "b", "a"]:
        queue.add(item)
    assert len(queue) == 3
    assert drain_ready(queue) == ["a", "b", "c"]
    assert len(queue) == 0


def test_no_two_concurrent_gets_of_one_item() -> None:
    queue, _ = make()
    queue.add("a")
    assert queue.get_nowait() == "a"
    queue.add("a")  # re-added while processing: marked dirty, not queued
    assert len(queue) == 0
    with pytest.raises(QueueEmpty):
        queue.get_nowait()
    queue.done("a")
    assert queue.get_nowait() == "a"


def test_add_during_processing_runs_exactly_once_more() -> None:
    queue, _ = make()
    queue.add("a")
    assert queue.get_nowait() == "a"
    queue.add("a")
    queue.done("a")
    assert queue.get_nowait() == "a"
    queue.done("a")  # nothing re-added during the second run
    with pytest.raises(QueueEmpty):
        queue.get_nowait()


def test_hundred_adds_while_processing_give_exactly_one_more_run() -> None:
    queue, _ = make()
    queue.add("a")
    assert queue.get_nowait() == "a"
    for _ in range(100):
        queue.add("a")
    queue.add("b")
    assert drain_ready(queue) == ["b"]
    queue.done("a")
    assert drain_ready(queue) == ["a"]
    queue.done("a")
    queue.done("b")
    assert drain_ready(queue) == []
    assert queue.statistics().adds == 3  # a, the one dirty re-add of a, b


def test_done_without_get_is_a_no_op() -> None:
    queue, _ = make()
    queue.add("a")
    queue.done("a")  # "a" is queued, not processing: must not be pushed twice
    queue.done("zzz")
    assert drain_ready(queue) == ["a"]


def test_items_can_be_any_hashable() -> None:
    queue = QUEUE(clock=FakeClock())
    queue.add(("ns", "x"))
    queue.add(("ns", "x"))
    assert queue.get_nowait() == ("ns", "x")


# ---------------------------------------------------------------------------- delays


def test_get_nowait_respects_the_clock() -> None:
    queue, clock = make()
    queue.add_after("a", 1.0)
    assert queue.next_deadline() == clock.now + 1.0
    with pytest.raises(QueueEmpty):
        queue.get_nowait()
    clock.advance(0.999)
    with pytest.raises(QueueEmpty):
        queue.get_nowait()
    clock.advance(0.001)
    assert queue.get_nowait() == "a"
    assert queue.next_deadline() is None


def test_add_after_earliest_deadline_wins() -> None:
    queue, clock = make()
    start = clock.now
    queue.add_after("a", 10.0)
    queue.add_after("a", 5.0)  # sooner: replaces
    queue.add_after("a", 7.0)  # later: ignored, does not postpone
    assert queue.next_deadline() == start + 5.0
    assert queue.statistics().waiting == 1
    clock.advance(5.0)
    assert drain_ready(queue) == ["a"]
    queue.done("a")
    clock.advance(10.0)  # the superseded 10 s entry must not fire again
    assert drain_ready(queue) == []
    assert queue.next_deadline() is None


def test_later_deadline_does_not_postpone() -> None:
    queue, clock = make()
    queue.add_after("a", 1.0)
    queue.add_after("a", 100.0)
    clock.advance(1.0)
    assert drain_ready(queue) == ["a"]


def test_due_items_are_fifo_by_deadline_and_deduplicated() -> None:
    queue, clock = make()
    queue.add_after("late", 3.0)
    queue.add_after("early", 1.0)
    queue.add_after("mid", 2.0)
    queue.add("mid")  # queued now AND delayed: heap and dirty set are independent
    clock.advance(3.0)
    # "mid" is still dirty/queued when its deadline passes, so it is not queued twice
    assert drain_ready(queue) == ["mid", "early", "late"]


def test_delayed_and_added_now_runs_twice() -> None:
    queue, clock = make()
    queue.add_after("a", 1.0)
    queue.add("a")
    assert queue.get_nowait() == "a"
    queue.done("a")
    clock.advance(1.0)
    assert queue.get_nowait() == "a"


def test_add_after_non_positive_delay_adds_now_and_counts_a_retry() -> None:
    queue, _ = make()
    queue.add_after("a", 0.0)
    queue.add_after("b", -1.0)
    assert drain_ready(queue) == ["a", "b"]
    stats = queue.statistics()
    assert (stats.retries, stats.adds, stats.waiting) == (2, 2, 0)


def test_add_rate_limited_forget_and_num_requeues() -> None:
    queue, clock = make(rate_limiter=ItemExponential(0.005, 1000.0))
    start = clock.now
    queue.add_rate_limited("a")
    assert queue.next_deadline() == pytest.approx(start + 0.005)
    assert queue.num_requeues("a") == 1
    clock.advance(0.005)
    assert queue.get_nowait() == "a"
    queue.done("a")
    queue.add_rate_limited("a")
    assert queue.next_deadline() == pytest.approx(clock.now + 0.010)
    assert queue.num_requeues("a") == 2
    queue.forget("a")
    assert queue.num_requeues("a") == 0


def test_default_rate_limiter_uses_the_queue_clock() -> None:
    queue, clock = make()
    queue.add_rate_limited("a")
    assert queue.next_deadline() == pytest.approx(clock.now + 0.005)


def test_superseded_heap_entries_stay_bounded() -> None:
    queue, clock = make()
    for i in range(10_000):
        queue.add_after("a", 10_000.0 - i)  # every call supersedes the previous deadline
    assert queue.statistics().waiting == 1
    assert len(queue._heap) <= 2 * 1 + 64 + 1  # internal: the heap is compacted
    clock.advance(1.0)
    assert drain_ready(queue) == ["a"]
    queue.done("a")
    clock.advance(20_000.0)
    assert drain_ready(queue) == []
    assert queue.next_deadline() is None


# ---------------------------------------------------------------------------- shutdown


def test_shutdown_drains_queued_items_then_raises() -> None:
    queue, clock = make()
    queue.add("a")
    queue.add("b")
    queue.add_after("c", 1.0)
    queue.shutdown()
    assert queue.shutting_down
    assert queue.get_nowait() == "a"
    assert queue.get_nowait() == "b"
    clock.advance(1.0)  # delayed items were dropped at shutdown
    with pytest.raises(QueueShutDown):
        queue.get_nowait()
    assert queue.next_deadline() is None


def test_adds_after_shutdown_are_ignored() -> None:
    queue, clock = make()
    queue.shutdown()
    queue.add("a")
    queue.add_after("b", 0.0)
    queue.add_after("c", 1.0)
    queue.add_rate_limited("d")
    clock.advance(10.0)
    with pytest.raises(QueueShutDown):
        queue.get_nowait()
    stats = queue.statistics()
    assert (stats.adds, stats.retries, stats.waiting, stats.depth) == (0, 0, 0, 0)
    queue.shutdown()  # idempotent


def test_dirty_before_shutdown_is_still_requeued_by_done() -> None:
    queue, _ = make()
    queue.add("a")
    assert queue.get_nowait() == "a"
    queue.add("a")  # dirty before the shutdown
    queue.shutdown()
    queue.add("a")  # ignored
    queue.done("a")
    assert queue.get_nowait() == "a"
    queue.done("a")
    with pytest.raises(QueueShutDown):
        queue.get_nowait()


def test_shutdown_with_drain_waits_for_done() -> None:
    async def scenario() -> None:
        queue, _ = make()
        queue.add("a")
        queue.add("b")
        assert queue.get_nowait() == "a"
        assert queue.get_nowait() == "b"
        loop = asyncio.get_running_loop()
        observed: list[QueueStatistics] = []

        def finish(item: str) -> None:
            observed.append(queue.statistics())
            queue.done(item)

        # scheduled to run while shutdown_with_drain is waiting
        loop.call_soon(finish, "a")
        loop.call_soon(loop.call_soon, finish, "b")
        assert await queue.shutdown_with_drain(timeout=5.0) is True
        assert [s.processing for s in observed] == [2, 1]
        assert all(s.shutting_down for s in observed)
        assert queue.statistics().processing == 0

    asyncio.run(scenario())


def test_shutdown_with_drain_timeout_and_empty() -> None:
    async def scenario() -> None:
        queue, _ = make()
        queue.add("a")
        queue.get_nowait()
        assert await queue.shutdown_with_drain(timeout=0.0) is False
        queue.done("a")
        assert await queue.shutdown_with_drain(timeout=0.0) is True
        idle, _ = make()
        assert await idle.shutdown_with_drain() is True

    asyncio.run(scenario())


def test_shutdown_ends_a_pending_drain() -> None:
    """client-go: ShutDown after ShutDownWithDrain makes the drain stop waiting."""

    async def scenario() -> None:
        queue, _ = make()
        queue.add("stuck")
        assert queue.get_nowait() == "stuck"  # never done(): a handler that hangs
        drain = asyncio.ensure_future(queue.shutdown_with_drain())
        await asyncio.sleep(0)
        assert not drain.done(), "the drain must wait while an item is in flight"
        queue.shutdown()
        assert await asyncio.wait_for(drain, timeout=5.0) is False  # ended, not drained
        assert queue.statistics().processing == 1
        # a drain started after the forced shutdown still waits for the in-flight item
        again = asyncio.ensure_future(queue.shutdown_with_drain())
        await asyncio.sleep(0)
        assert not again.done()
        queue.done("stuck")
        assert await asyncio.wait_for(again, timeout=5.0) is True

    asyncio.run(scenario())


# ---------------------------------------------------------------------------- async get


def test_async_get_wakes_on_add() -> None:
    async def scenario() -> None:
        queue, _ = make()
        loop = asyncio.get_running_loop()
        getter = asyncio.ensure_future(queue.get())
        await asyncio.sleep(0)  # one loop iteration: the getter is now waiting
        assert not getter.done()
        loop.call_soon(queue.add, "a")
        assert await getter == "a"
        assert queue.statistics().processing == 1

    asyncio.run(scenario())


def test_async_get_returns_ready_item_without_waiting() -> None:
    async def scenario() -> None:
        queue, _ = make()
        queue.add("a")
        assert await queue.get() == "a"

    asyncio.run(scenario())


def test_async_get_wakes_at_delayed_deadline() -> None:
    async def scenario() -> None:
        queue: WorkQueue[str] = QUEUE(clock=MONOTONIC)
        start = time.monotonic()
        queue.add_after("a", 0.01)
        assert await asyncio.wait_for(queue.get(), timeout=5.0) == "a"
        assert time.monotonic() - start >= 0.01

    asyncio.run(scenario())


def test_async_get_rearms_for_an_earlier_deadline_added_while_waiting() -> None:
    async def scenario() -> None:
        queue: WorkQueue[str] = QUEUE(clock=MONOTONIC)
        queue.add_after("late", 60.0)
        getter = asyncio.ensure_future(queue.get())
        await asyncio.sleep(0)  # waiting, timer armed for 60 s
        queue.add_after("soon", 0.01)
        assert await asyncio.wait_for(getter, timeout=5.0) == "soon"
        assert queue.statistics().waiting == 1

    asyncio.run(scenario())


def test_async_getters_are_woken_one_per_item() -> None:
    async def scenario() -> None:
        queue, _ = make()
        getters = [asyncio.ensure_future(queue.get()) for _ in range(3)]
        await asyncio.sleep(0)
        queue.add("a")
        queue.add("b")
        await asyncio.sleep(0)  # the two woken getters run before we resume
        assert [g.result() for g in getters[:2]] == ["a", "b"]  # woken in arrival order
        assert not getters[2].done()
        queue.shutdown()
        with pytest.raises(QueueShutDown):
            await getters[2]

    asyncio.run(scenario())


def test_cancelled_getter_does_not_lose_a_wakeup() -> None:
    async def scenario() -> None:
        queue, _ = make()
        first = asyncio.ensure_future(queue.get())
        second = asyncio.ensure_future(queue.get())
        await asyncio.sleep(0)
        queue.add("a")  # wakes `first` ...
        first.cancel()  # ... which is cancelled before it runs
        assert await asyncio.wait_for(second, timeout=5.0) == "a"
        with pytest.raises(asyncio.CancelledError):
            await first
        # a getter cancelled while waiting unregisters itself
        third = asyncio.ensure_future(queue.get())
        await asyncio.sleep(0)
        third.cancel()
        with pytest.raises(asyncio.CancelledError):
            await third
        queue.add("b")
        assert queue.get_nowait() == "b"

    asyncio.run(scenario())


def test_async_get_drains_then_raises_on_shutdown() -> None:
    async def scenario() -> None:
        queue, _ = make()
        waiting = asyncio.ensure_future(queue.get())
        await asyncio.sleep(0)
        queue.shutdown()
        with pytest.raises(QueueShutDown):
            await waiting
        drained, _ = make()
        drained.add("a")
        drained.shutdown()
        assert await drained.get() == "a"
        with pytest.raises(QueueShutDown):
            await drained.get()

    asyncio.run(scenario())


# ---------------------------------------------------------------------------- statistics, metrics


def test_statistics_values() -> None:
    queue, clock = make(name="things")
    queue.add("a")
    queue.add("b")
    queue.add("c")
    queue.add_after("d", 5.0)
    assert queue.get_nowait() == "a"
    clock.advance(2.0)
    assert queue.get_nowait() == "b"
    clock.advance(1.0)
    assert queue.statistics() == QueueStatistics(
        name="things",
        depth=1,
        processing=2,
        waiting=1,
        adds=3,
        retries=1,
        shutting_down=False,
        longest_running=3.0,
        unfinished_work=4.0,
    )
    queue.done("a")
    queue.done("b")
    stats = queue.statistics()
    assert (stats.processing, stats.longest_running, stats.unfinished_work) == (0, 0.0, 0.0)
    assert "things" in repr(queue) and "depth=1" in repr(queue)


def test_metrics_callbacks() -> None:
    metrics = RecordingMetrics()
    queue, clock = make(name="q", metrics=metrics)
    queue.add("a")
    queue.add("a")  # duplicate: no metric
    clock.advance(0.5)
    assert queue.get_nowait() == "a"
    clock.advance(2.0)
    queue.done("a")
    queue.add_after("b", 1.0)
    clock.advance(1.0)
    assert queue.get_nowait() == "b"
    queue.shutdown()
    queue.add_after("c", 1.0)  # ignored: no retry metric
    assert metrics.calls == [
        ("added", "q"),
        ("got", "q", 0.5),
        ("done", "q", 2.0),
        ("retried", "q"),
        ("added", "q"),
        ("got", "q", 0.0),
    ]


def test_no_metrics_is_a_silent_default() -> None:
    assert repr(NO_METRICS) == "NO_METRICS"
    NO_METRICS.added("x")
    NO_METRICS.got("x", 1.0)
    NO_METRICS.done("x", 1.0)
    NO_METRICS.retried("x")
    queue, _ = make(metrics=NO_METRICS)
    queue.add("a")
    assert queue.get_nowait() == "a"


# -- give_back: untaken items return to the head ------------------------------------------------
def test_give_back_returns_items_to_the_head_in_order() -> None:
    queue, _ = make()
    for item in "abcde":
        queue.add(item)
    for _ in range(3):  # a, b, c taken
        queue.get_nowait()
    queue.give_back("b", "c")
    queue.done("a")
    assert drain_ready(queue) == ["b", "c", "d", "e"]


def test_give_back_is_the_done_for_that_get_and_keeps_a_readd_to_one_run() -> None:
    queue, _ = make()
    queue.add("a")
    assert queue.get_nowait() == "a"
    queue.add("a")  # re-added while held: dirty, not queued
    assert len(queue) == 0
    queue.give_back("a")
    assert queue.statistics().processing == 0
    assert drain_ready(queue) == ["a"]  # one run serves both
    queue.done("a")
    assert drain_ready(queue) == []


def test_give_back_ignores_items_not_being_processed() -> None:
    queue, _ = make()
    queue.add("a")
    queue.give_back("a", "z")
    assert drain_ready(queue) == ["a"]
    queue.done("a")
    queue.give_back("a")
    assert drain_ready(queue) == []


def test_a_given_back_item_is_never_held_twice() -> None:
    queue, _ = make()
    queue.add("a")
    queue.get_nowait()
    queue.give_back("a")
    assert queue.get_nowait() == "a"  # another worker takes it
    queue.add("a")
    assert len(queue) == 0  # held by that worker: only marked dirty
    queue.done("a")
    assert drain_ready(queue) == ["a"]


def test_give_back_wakes_waiting_getters() -> None:
    async def main() -> list[str]:
        queue = QUEUE()
        for item in "ab":
            queue.add(item)
        first, second = queue.get_nowait(), queue.get_nowait()
        getters = [asyncio.ensure_future(queue.get()) for _ in range(2)]
        await asyncio.sleep(0)
        queue.give_back(first, second)
        return list(await asyncio.wait_for(asyncio.gather(*getters), 5))

    assert asyncio.run(main()) == ["a", "b"]


def test_give_back_after_shutdown_requeues_and_finishes_a_drain() -> None:
    async def main() -> tuple[bool, list[str]]:
        queue = QUEUE()
        queue.add("a")
        queue.get_nowait()
        drain = asyncio.ensure_future(queue.shutdown_with_drain(timeout=5))
        await asyncio.sleep(0)
        queue.give_back("a")
        drained = await drain
        items = [await queue.get()]
        return drained, items

    assert asyncio.run(main()) == (True, ["a"])


def test_the_delayed_heap_is_rebuilt_once_per_heap_of_superseded_deadlines(mocker) -> None:
    """An earlier deadline for a waiting item pushes a new heap entry and leaves the old one
    behind; the heap is rebuilt only once superseded entries outnumber the live ones, so a
    rate-limited re-add costs O(log n) amortized, not a heapify of every waiting item each time."""
    import declop.queue.workqueue as module

    queue, clock = make()
    names = [f"k{i}" for i in range(1000)]
    heapify = mocker.spy(module.heapq, "heapify")
    for delay in (100.0, 90.0, 80.0, 70.0, 60.0):  # each an earlier deadline: 4,000 superseded entries
        for name in names:
            queue.add_after(name, delay)
    assert 1 <= heapify.call_count <= 5
    assert queue.statistics().waiting == 1000
    clock.advance(60.0)
    assert sorted(drain_ready(queue)) == sorted(names)
    clock.advance(100.0)  # no superseded entry fires again
    assert drain_ready(queue) == []
