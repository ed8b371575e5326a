"""Metric names and hooks (client-go workqueue and controller-runtime names)."""

from __future__ import annotations

from declop.clock import FakeClock
from declop.metrics import Metrics
from declop.workqueue import WorkQueue


def test_queue_and_reconcile_series() -> None:
    m = Metrics()
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(name="ctl", metrics=m.queue("ctl"), clock=clock)
    m.watch_queue(q.statistics)
    m.started("ctl", 2)
    q.add("a")
    q.add("a")  # a duplicate is not an add
    q.add("b")
    item = q.get_nowait()
    clock.advance(0.5)
    q.done(item)
    q.add_after("c", 1)
    m.reconciled("ctl", "success", 0.01)
    m.reconciled("ctl", "error", 0.02)
    m.leader.labels("lock").set(1)
    text = m.exposition().decode()
    assert 'workqueue_adds_total{controller="ctl",name="ctl"} 2.0' in text
    assert 'workqueue_retries_total{controller="ctl",name="ctl"} 1.0' in text
    assert 'workqueue_depth{controller="ctl",name="ctl"} 1.0' in text
    assert 'workqueue_work_duration_seconds_count{controller="ctl",name="ctl"} 1.0' in text
    assert 'controller_runtime_reconcile_total{controller="ctl",result="success"} 1.0' in text
    assert 'controller_runtime_reconcile_total{controller="ctl",result="requeue_after"} 0.0' in text
    assert 'controller_runtime_reconcile_errors_total{controller="ctl"} 1.0' in text
    assert 'controller_runtime_max_concurrent_reconciles{controller="ctl"} 2.0' in text
    assert 'leader_election_master_status{name="lock"} 1.0' in text


def test_two_managers_do_not_collide() -> None:
    Metrics()
    Metrics()


def test_trigger_and_timeout_series() -> None:
    from declop.trigger import Trace

    m = Metrics()
    trace = Trace()
    for _ in range(100):
        trace.note("updated", "1")
    trace.note("owns:Pod", None, "Pod ns/p")
    m.triggered("ctl", trace)
    single = Trace()
    single.note("updated")
    m.triggered("ctl", single)
    m.timed_out("ctl", "cancelled")
    text = m.exposition().decode()
    assert 'declop_reconcile_triggers_total{controller="ctl",source="updated"} 2.0' in text
    assert 'declop_reconcile_triggers_total{controller="ctl",source="owns:Pod"} 1.0' in text
    assert 'declop_reconcile_coalesced_events_bucket{controller="ctl",le="1.0"} 1.0' in text
    assert 'declop_reconcile_coalesced_events_bucket{controller="ctl",le="100.0"} 1.0' in text
    assert 'declop_reconcile_coalesced_events_sum{controller="ctl"} 102.0' in text
    assert 'declop_reconcile_timeouts_total{controller="ctl",kind="cancelled"} 1.0' in text
