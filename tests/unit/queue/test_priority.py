"""declop.queue.priority: ordering by aged priority. The WorkQueue guarantees it keeps are tested
by running all of ``test_workqueue.py`` against it."""

from __future__ import annotations

import pytest

from declop.clock import FakeClock
from declop.queue.priority import DEFAULT_AGING, LOW, NORMAL, PriorityQueue
from declop.queue.workqueue import QueueEmpty


def make(aging: float = DEFAULT_AGING) -> tuple[PriorityQueue[str], FakeClock]:
    clock = FakeClock()
    return PriorityQueue[str](clock=clock, aging=aging), clock


def drain(queue: PriorityQueue[str]) -> list[str]:
    out = []
    while True:
        try:
            out.append(queue.get_nowait())
        except QueueEmpty:
            return out


def test_higher_priority_goes_first_fifo_within_a_priority() -> None:
    queue, _ = make()
    for name in ("l1", "l2", "l3"):
        queue.add(name, LOW)
    queue.add("n1")
    queue.add("h", 5)
    queue.add("n2", NORMAL)
    assert drain(queue) == ["h", "n1", "n2", "l1", "l2", "l3"]


def test_a_low_item_overtakes_normal_items_after_the_aging_bound() -> None:
    # aging 10/s: a LOW item (-100) catches up with NORMAL items queued 10 s after it
    queue, clock = make(aging=10.0)
    queue.add("backlog", LOW)
    clock.advance(9.9)
    queue.add("early")  # queued 9.9 s after the backlog item: still ahead of it
    clock.advance(0.2)
    queue.add("late")  # 10.1 s after: behind it
    assert drain(queue) == ["early", "backlog", "late"]


def test_no_low_item_starves_under_a_steady_stream_of_normal_items() -> None:
    # one worker, a normal item every 0.1 s, each run takes 0.1 s: without aging the 50 low
    # items would never run; with it each waits at most the aging bound plus its backlog.
    queue, clock = make(aging=10.0)
    low = [f"low-{i}" for i in range(50)]
    for name in low:
        queue.add(name, LOW)
    started: dict[str, float] = {}
    t0 = clock()
    for seq in range(1200):  # 120 s
        queue.add(f"normal-{seq}")
        item = queue.get_nowait()
        started[item] = clock() - t0
        clock.advance(0.1)
        queue.done(item)
    assert set(low) <= set(started), "a low-priority item starved"
    worst = max(started[name] for name in low)
    assert 10.0 <= worst <= 10.0 + 0.1 * (len(low) + 2)
    assert started["low-0"] >= 9.9  # strict priority until the bound: normal items went first


def test_without_aging_priorities_are_strict() -> None:
    queue, clock = make(aging=0.0)
    queue.add("low", LOW)
    clock.advance(3600)
    queue.add("normal")
    assert drain(queue) == ["normal", "low"]


def test_a_readd_with_higher_priority_promotes_and_keeps_its_wait() -> None:
    queue, clock = make(aging=10.0)
    queue.add("a", LOW)
    queue.add("b", LOW)
    clock.advance(1.0)
    queue.add("n")
    queue.add("b", NORMAL)  # promoted; queued at t=0, so ahead of "n" queued at t=1
    queue.add("b", LOW)  # a lower priority never demotes
    assert len(queue) == 3
    assert [(i, p) for i, p, _ in queue.ranks()] == [("b", NORMAL), ("n", NORMAL), ("a", LOW)]
    assert drain(queue) == ["b", "n", "a"]
    assert drain(queue) == []  # the superseded entry of "b" is never handed out


def test_a_readd_while_processing_keeps_the_highest_priority_for_the_next_run() -> None:
    queue, _ = make()
    queue.add("x", LOW)
    assert queue.get_nowait() == "x"
    queue.add("x", LOW)
    queue.add("x", NORMAL)
    queue.add("x", LOW)
    queue.add("other", LOW)
    assert len(queue) == 1
    queue.done("x")
    assert drain(queue) == ["x", "other"]
    queue.done("x")
    assert drain(queue) == []


def test_given_back_items_go_ahead_of_higher_priorities_in_order() -> None:
    queue, _ = make()
    for name in "abc":
        queue.add(name, LOW)
    taken = [queue.get_nowait(), queue.get_nowait()]
    queue.add("urgent", 50)
    queue.give_back(*taken)
    queue.add("a", 100)  # given back: already at the head, nothing to promote
    assert drain(queue) == ["a", "b", "urgent", "c"]


def test_due_delayed_items_enter_with_normal_priority() -> None:
    queue, clock = make()
    queue.add("low", LOW)
    queue.add_after("requeued", 1.0)
    clock.advance(1.0)
    assert drain(queue) == ["requeued", "low"]


def promoted_four_times(n: int = 1000) -> tuple[PriorityQueue, list[str]]:
    """A queue of ``n`` LOW items, each then promoted four times (4n superseded entries)."""
    queue, _ = make()
    names = [f"k{i}" for i in range(n)]
    for name in names:
        queue.add(name, LOW)
    for p in range(1, 5):
        for name in names:
            queue.add(name, LOW + p)
    return queue, names


def test_superseded_entries_stay_bounded() -> None:
    queue, names = promoted_four_times()
    assert len(queue) == 1000
    assert len(queue._queue) <= 2 * 1000 + 1  # type: ignore[attr-defined]
    assert sorted(drain(queue)) == sorted(names)


def test_compaction_is_amortized_one_rebuild_per_heap_of_superseded_entries(mocker) -> None:
    """A promotion pushes a new entry and leaves the old one behind; the heap is rebuilt only
    once superseded entries outnumber the live ones, so a promotion costs O(log n) amortized —
    not a heapify of the whole queue each time."""
    import declop.queue.priority as module

    heapify = mocker.spy(module.heapq, "heapify")
    queue, names = promoted_four_times()
    # 4,000 promotions over 1,000 live items: one rebuild per ~1,000 superseded entries
    assert 1 <= heapify.call_count <= 5
    assert sorted(drain(queue)) == sorted(names)


def test_a_small_queue_is_never_compacted(mocker) -> None:
    import declop.queue.priority as module

    heapify = mocker.spy(module.heapq, "heapify")
    queue, _ = make()
    queue.add("a", LOW)
    for p in range(1, 60):
        queue.add("a", LOW + p)  # 60 entries, 1 live: below the compaction floor
    assert heapify.call_count == 0
    assert drain(queue) == ["a"]


@pytest.mark.parametrize("aging", [-1.0, float("nan"), float("inf"), "fast", True])
def test_bad_aging_is_refused(aging: object) -> None:
    with pytest.raises(ValueError, match="aging must be a number of priority points per second >= 0"):
        PriorityQueue[str](aging=aging)  # type: ignore[arg-type]
