"""Metric names and hooks (client-go workqueue and controller-runtime names)."""

from __future__ import annotations

from declop.clock import FakeClock
from declop.serving.metrics import Metrics
from declop.queue.workqueue import WorkQueue


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
    from declop.reconcile.trigger import Trace

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


def test_informer_series_are_read_at_scrape_time() -> None:
    from types import SimpleNamespace

    from declop.leases.hashing import ShardFilter, split

    m = Metrics()
    assert "declop_informer_events_received_total{" not in m.exposition().decode()
    sharded = SimpleNamespace(
        name="configmaps (sharded by uid)", events_received=7, objects_listed=30, dropped=20, released=3,
        store=[1, 2], shard=ShardFilter("uid", split(2)[:1]), shard_mode="server",
    )
    plain = SimpleNamespace(name="pods", events_received=1, objects_listed=2, dropped=0, released=0, store=[1], shard=None, shard_mode="")
    m.watch_informers(lambda: (sharded, plain))
    text = m.exposition().decode()
    assert 'declop_informer_events_received_total{informer="configmaps (sharded by uid)"} 7.0' in text
    assert 'declop_informer_objects_listed_total{informer="pods"} 2.0' in text
    assert 'declop_informer_shard_dropped_total{informer="configmaps (sharded by uid)"} 20.0' in text
    assert 'declop_informer_shard_released_total{informer="configmaps (sharded by uid)"} 3.0' in text
    assert 'declop_informer_objects{informer="pods"} 1.0' in text
    assert 'declop_informer_shard_server_side{informer="configmaps (sharded by uid)"} 1.0' in text
    assert 'declop_informer_shard_server_side{informer="pods"}' not in text


def test_loop_lag_records_how_long_the_loop_stood_still():
    """A callback that holds the loop 120 ms shows up as one sample of at least 0.1 s."""
    import asyncio
    import time as _time

    from declop.serving.metrics import LoopLag, Metrics

    metrics = Metrics()

    async def go() -> LoopLag:
        lag = LoopLag(metrics.loop_lag, interval=0.01)
        lag.start()
        await asyncio.sleep(0.05)
        _time.sleep(0.12)  # the stall
        await asyncio.sleep(0.05)
        await lag.stop()
        return lag

    lag = asyncio.run(go())
    text = metrics.exposition().decode()
    count = float(next(l.split()[-1] for l in text.splitlines() if l.startswith("declop_event_loop_lag_seconds_count")))
    under = float(next(l.split()[-1] for l in text.splitlines() if l.startswith('declop_event_loop_lag_seconds_bucket{le="0.1"}')))
    assert lag.worst >= 0.1
    assert count >= 5 and count - under >= 1, text
