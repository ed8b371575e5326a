"""I13 (declop.testing.simulation.metrics): a replica's metrics agree with its workqueues — the
checker on its own, then in world runs where the queue's metrics are broken on purpose."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from declop.clock import FakeClock
from declop.queue.workqueue import WorkQueue
from declop.serving import metrics as serving
from declop.serving.metrics import Metrics
from declop.testing.simulation.metrics import problems
from declop.testing.simulation.world import World, run


def replica(clock: FakeClock) -> tuple[Any, Metrics, WorkQueue[str]]:
    """A manager of one controller ``widgets`` whose queue reports to a Metrics, as wired."""
    m = Metrics()
    queue: WorkQueue[str] = WorkQueue(name="widgets", metrics=m.queue("widgets"), clock=clock)
    m.watch_queue(queue.statistics)
    m.started("widgets", 2)
    return SimpleNamespace(controllers=[SimpleNamespace(name="widgets", queue=queue)]), m, queue


def test_a_queue_and_its_metrics_that_agree_have_no_problem() -> None:
    clock = FakeClock(100.0)
    manager, m, q = replica(clock)
    q.add("a")
    q.add("a")  # a duplicate: not an add
    q.add("b")
    clock.advance(1.0)
    taken = q.get_nowait()
    clock.advance(2.0)
    q.done(taken)
    q.add_after("c", 5.0)
    assert problems(manager, m, uptime=3.0) == []
    q.done(q.get_nowait())
    assert problems(manager, m, uptime=3.0, at_rest=True) == []


def test_each_disagreement_is_named() -> None:
    clock = FakeClock(100.0)
    manager, m, q = replica(clock)
    q.add("a")
    m.adds.labels("widgets", "widgets").inc()  # an add the queue never counted
    m.retries.labels("widgets", "widgets").inc()
    assert problems(manager, m, uptime=1.0) == [
        "widgets: workqueue_adds_total is 2, the queue counted 1 adds",
        "widgets: workqueue_retries_total is 1, the queue counted 0 retries",
    ]


def test_times_longer_than_the_replica_lived_or_negative_are_problems() -> None:
    clock = FakeClock(100.0)
    manager, m, q = replica(clock)
    q.add("a")
    clock.advance(10.0)
    q.get_nowait()
    (problem,) = problems(manager, m, uptime=5.0)  # it waited 10 s in a replica 5 s old
    assert problem.startswith("widgets: workqueue_queue_duration_seconds sums 10.000000 s over 1 observations, outside [0, 1 x 5.000 s")
    m.work_duration.labels("widgets", "widgets").observe(-1.0)
    assert any("workqueue_work_duration_seconds sums -1.000000 s" in p for p in problems(manager, m, uptime=60.0))


def test_at_rest_a_key_in_flight_or_an_active_worker_is_a_problem() -> None:
    clock = FakeClock(100.0)
    manager, m, q = replica(clock)
    q.add("a")
    q.get_nowait()
    assert problems(manager, m, uptime=1.0) == []
    assert problems(manager, m, uptime=1.0, at_rest=True) == ["widgets: at rest with 1 keys in flight and 0 active workers"]
    m.active("widgets", 3)
    assert "widgets: 3 active workers of 2" in problems(manager, m, uptime=1.0)


@pytest.mark.parametrize("shape", [{}, {"fifo": True}])
def test_a_queue_whose_adds_are_not_reported_fails_the_world(monkeypatch: pytest.MonkeyPatch, shape: dict[str, bool]) -> None:
    """The mutant the sweep was blind to (the world ran without metrics): the queue's ``added``
    callback dropped. Every world replica now has a registry, so I13 sees it (priority queue and
    the FIFO WorkQueue alike)."""
    world = World(mode="leader", objects=20, duration=20.0, kinds=(), **shape)
    assert run(world, seed=0).ok
    monkeypatch.setattr(serving._QueueHooks, "added", lambda self, name: None)
    result = run(world, seed=0)
    assert result.violations and {v.invariant for v in result.violations} == {"I13"}
    assert "workqueue_adds_total is 0, the queue counted" in result.violations[0].detail


def test_a_timer_s_tick_in_flight_at_the_end_is_not_a_problem_at_rest() -> None:
    """A timer's or a daemon's controller runs its ticks whenever they fall due, and the world
    does not track them as calls: one in flight at the end of a run is not a queue left busy."""
    clock = FakeClock(100.0)
    manager, m, q = replica(clock)
    q.add("a")
    q.get_nowait()
    assert problems(manager, m, uptime=1.0, at_rest=True, periodic={"widgets"}) == []
