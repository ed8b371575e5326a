"""The collector's pause counter: nested users, the application's own setting, freezing."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref

import pytest

from declop import collector


@pytest.fixture(autouse=True)
def restore():
    enabled, frozen = gc.isenabled(), gc.get_freeze_count()
    yield
    assert collector._pauses == 0, "a test left a pause open"
    gc.unfreeze() if gc.get_freeze_count() and not frozen else None
    (gc.enable if enabled else gc.disable)()


def test_pausing_never_walks_the_frozen_objects(mocker):
    """``gc.get_freeze_count()`` walks the whole permanent generation: 60-200 ms on the loop
    with 100k cached objects, before every big emission and webhook request."""
    collector.freeze()
    count = mocker.patch.object(gc, "get_freeze_count", side_effect=AssertionError("walked the frozen objects"))
    for _ in range(3):
        with collector.paused():
            assert not gc.isenabled()
    count.assert_not_called()


def test_nested_pauses_re_enable_the_collector_only_at_the_last_resume():
    gc.enable()
    collector.pause()
    collector.pause()
    assert not gc.isenabled()
    collector.resume()
    assert not gc.isenabled(), "one user's resume re-enabled the collector under another's pause"
    collector.resume()
    assert gc.isenabled()


def test_a_collector_the_application_disabled_stays_disabled():
    gc.disable()
    with collector.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_paused_resumes_when_the_block_raises():
    gc.enable()
    with pytest.raises(RuntimeError):
        with collector.paused():
            raise RuntimeError("boom")
    assert gc.isenabled() and collector._pauses == 0


def test_containers_freed_while_paused_never_reach_a_pass():
    """What a large request allocates and frees under a pause leaves the young generation's
    count where it was: the next automatic pass has nothing of it to walk."""
    gc.enable()
    gc.collect()
    with collector.paused():
        before = gc.get_count()[0]
        tree = [[{"k": [i]}] for i in range(200_000)]
        assert gc.get_count()[0] - before >= 400_000
        del tree
        assert gc.get_count()[0] - before < 1_000


def test_freeze_frees_the_cycles_made_while_paused():
    gc.enable()
    freed = []

    class Node:
        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            freed.append(1)

    with collector.paused():
        Node()
        assert not freed, "a cycle is only freed by a pass"
        collector.freeze()
    assert freed == [1]


def test_the_first_pause_freezes_the_start_up_heap_without_a_full_pass():
    """A full pass over the start-up heap cost 10-20 ms of every start for ~25 unreachable
    objects; the first pause only freezes (in a fresh process: nothing frozen yet)."""
    code = (
        "import gc\n"
        "from declop import collector\n"
        "calls = []\n"
        "gc.collect = lambda *a: calls.append(a) or 0\n"
        "assert gc.get_freeze_count() == 0\n"
        "collector.pause()\n"
        "assert gc.get_freeze_count() > 1000, gc.get_freeze_count()\n"
        "assert calls == [], calls\n"
        "collector.resume()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class _Node:
    other: object = None


def _cycle() -> tuple[_Node, _Node, weakref.ref[_Node]]:
    """Two objects that refer to each other (a manager's graph, in small), and a weak reference
    that says when the collector freed them."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return a, b, weakref.ref(a)


def test_a_thaw_frees_a_cycle_that_died_after_it_was_frozen():
    """A freeze pins every cycle alive at that moment; one that dies later (a stopped manager's
    graph) stays until a thaw, and the next pass frees it."""
    a, b, ref = _cycle()
    collector.freeze()
    del a, b
    gc.collect()
    assert ref() is not None, "frozen: no pass reaches it"
    collector.thaw()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None
    with collector.paused():  # the flag stays set: a pause after a thaw freezes nothing uncollected
        assert gc.get_freeze_count() == 0


def test_the_last_manager_to_end_thaws_and_no_earlier_one_does(monkeypatch):
    """Two managers run in one process; the first to end must not thaw the other's frozen cache
    (its full passes would walk it again); the last to end frees what every run pinned."""
    monkeypatch.setattr(collector, "_running", 0)  # a world run earlier in this process holds one
    a, b, ref = _cycle()
    collector.started()
    collector.started()
    collector.freeze()  # a sync of either
    del a, b
    collector.ended()
    gc.collect()
    assert gc.get_freeze_count() > 0 and ref() is not None, "one manager still runs: its cache stays frozen"
    collector.ended()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None, "the stopped managers' graph is freed once none runs"
    assert collector._running == 0


def test_a_future_given_up_on_and_retrieved_is_freed_without_a_never_retrieved_report() -> None:
    """The done-callback reads the outcome, so freeing the future reports nothing; without it the
    loop's exception handler hears "exception was never retrieved" (checked here too)."""
    import asyncio

    said: list[str] = []
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, context: said.append(context["message"]))
    try:
        for mark in (True, False):
            future = loop.create_future()
            if mark:
                future.add_done_callback(collector.retrieved)
            future.set_exception(RuntimeError("given up on"))
            loop.run_until_complete(asyncio.sleep(0))  # the done-callbacks run
            del future
            gc.collect()
            assert said == ([] if mark else ["Future exception was never retrieved"]), said
        cancelled = loop.create_future()
        cancelled.cancel()
        collector.retrieved(cancelled)  # a cancelled one has nothing to read, and does not raise
    finally:
        loop.close()
