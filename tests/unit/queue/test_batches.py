"""declop.queue.batches: the hand-over of a batch between the loop and a handler thread."""

from __future__ import annotations

import threading

import pytest

from declop.queue.batches import BATCH, STALL_AFTER, Batch, batch_size
from declop.clock import FakeClock


@pytest.mark.parametrize(
    ("ready", "workers", "size"),
    [(0, 1, 1), (10, 1, 11), (10, 2, 6), (200, 4, 51), (10_000, 1, BATCH), (3, 4, 1)],
)
def test_batch_size_is_one_plus_a_share_of_the_backlog(ready: int, workers: int, size: int) -> None:
    assert batch_size(ready, workers) == size


def test_the_thread_takes_from_the_front_and_marks_each_start() -> None:
    clock = FakeClock()
    batch = Batch("abc", clock)
    assert batch.started_at == clock()
    clock.advance(1)
    assert batch.next() == "a" and batch.started_at == clock()
    assert batch.next() == "b" and batch.next() == "c" and batch.next() is None
    assert len(batch) == 0


def test_stalled_only_with_items_waiting_behind_a_long_call() -> None:
    clock = FakeClock()
    batch = Batch("ab", clock)
    batch.next()
    clock.advance(STALL_AFTER / 2)
    assert not batch.stalled()
    clock.advance(STALL_AFTER / 2)
    assert batch.stalled() and batch.running_for() == pytest.approx(STALL_AFTER)
    batch.next()
    clock.advance(10)
    assert not batch.stalled()  # nothing waits behind the last call


def test_take_back_returns_the_untaken_items_in_order() -> None:
    batch = Batch("abcd", FakeClock())
    batch.next()
    assert batch.take_back() == ["b", "c", "d"]
    assert batch.next() is None and batch.take_back() == []


def test_every_item_goes_to_exactly_one_side_under_contention() -> None:
    for _ in range(200):
        items = list(range(500))
        batch = Batch(items)
        ran: list[int] = []
        go = threading.Event()

        def thread() -> None:
            go.wait()
            while (item := batch.next()) is not None:
                ran.append(item)

        t = threading.Thread(target=thread)
        t.start()
        go.set()
        back = batch.take_back()
        t.join()
        assert sorted(ran + back) == items and not set(ran) & set(back)
        assert back == sorted(back) and ran == sorted(ran)
