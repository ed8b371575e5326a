"""Metrics: Prometheus series with the names client-go and controller-runtime use.

One :class:`Metrics` per manager, on its own ``CollectorRegistry`` (several managers in one
process — tests — never collide). Series, all labelled by ``controller`` (workqueue ones also by
``name``, which equals the controller name):

- ``workqueue_depth``, ``workqueue_adds_total``, ``workqueue_retries_total``,
  ``workqueue_queue_duration_seconds``, ``workqueue_work_duration_seconds``,
  ``workqueue_unfinished_work_seconds``, ``workqueue_longest_running_processor_seconds``;
- ``controller_runtime_reconcile_total{result=success|error|requeue_after|temporary_error|terminal_error|fenced}``
  (``fenced``: declop's own — a call whose write was refused because its Lease is not known valid),
  ``controller_runtime_reconcile_errors_total``, ``controller_runtime_terminal_reconcile_errors_total``,
  ``controller_runtime_reconcile_time_seconds``, ``controller_runtime_active_workers``,
  ``controller_runtime_max_concurrent_reconciles``;
- ``declop_reconcile_triggers_total{controller,source}`` (per settled reconcile, +1 for each
  source that caused it: ``created``, ``updated``, ``deleted``, ``initial-list``, ``relist``,
  ``owns:<Kind>``, ``watches:<resource>``, ``finalizer``, ``requeue_after``, ``retry``),
  ``declop_reconcile_coalesced_events{controller}`` (events per reconcile),
  ``declop_reconcile_timeouts_total{controller,kind=cancelled|overrun}``;
- ``leader_election_master_status{name}``; ``rest_client_requests_total{method}``;
- sharded mode: ``declop_shard_ranges_owned{controller}`` (range Leases this replica holds),
  ``declop_shard_handovers_total{controller,kind=acquired|released|lost}``;
- per informer (``informer`` is its name: resource, namespace, selectors, "sharded by uid"), read
  at scrape time: ``declop_informer_events_received_total`` (watch events of objects the
  apiserver sent after the sync, before any client-side shard filtering),
  ``declop_informer_objects_listed_total`` (objects received by syncs),
  ``declop_informer_shard_dropped_total`` (dropped by the shard filter),
  ``declop_informer_shard_released_total`` (left the cache with a released range),
  ``declop_informer_objects`` (objects in its cache) and, for sharded informers,
  ``declop_informer_shard_server_side`` (1: the apiserver filters, 0: client-side);
- ``declop_event_loop_lag_seconds`` (histogram): how late the manager's event loop woke from a
  timer, sampled every :data:`LOOP_LAG_INTERVAL` s by :class:`LoopLag` — the time everything on
  the loop (Lease renewals, probes, admissions, reconciles) stood still;
- ``controller_runtime_webhook_requests_total{webhook,code}``,
  ``controller_runtime_webhook_latency_seconds{webhook}``,
  ``controller_runtime_webhook_requests_in_flight{webhook}`` — ``webhook`` is the path served
  (``/validate/<name>``), as in controller-runtime.

Invariant: hot-path hooks (queue adds, reconcile results) only increment pre-bound children;
gauges that describe state (depth, in-flight ages) are read from the queues at scrape time. The
trigger series are plain dict/list counts on the loop, turned into families at scrape time
(``_TriggerState``): a reconcile pays a few integer increments for them, no lock.
"""

from __future__ import annotations

import asyncio
import bisect
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from declop.reconcile.controller import ControllerMetrics
from declop.reconcile.trigger import Trace
from declop.queue.workqueue import QueueMetrics, QueueStatistics

__all__ = ["LOOP_LAG_INTERVAL", "LoopLag", "Metrics"]

#: client-go's ExponentialBuckets(10e-9, 10, 12): 1 ns … 1000 s
QUEUE_BUCKETS = tuple(10e-9 * 10**i for i in range(12))
#: controller-runtime's reconcile_time_seconds buckets
RECONCILE_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 60,
)


#: declop_reconcile_coalesced_events buckets: events folded into one reconcile
COALESCED_BUCKETS = (1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000)

#: the ``result`` label values of controller_runtime_reconcile_total
RESULTS = ("success", "error", "requeue_after", "temporary_error", "terminal_error", "fenced")


class _QueueHooks:
    """QueueMetrics for one controller's queue; children are bound once."""

    __slots__ = ("_adds", "_retries", "_queued", "_work")

    def __init__(self, m: Metrics, controller: str) -> None:
        self._adds = m.adds.labels(controller, controller)
        self._retries = m.retries.labels(controller, controller)
        self._queued = m.queue_duration.labels(controller, controller)
        self._work = m.work_duration.labels(controller, controller)

    def added(self, name: str) -> None:
        self._adds.inc()

    def got(self, name: str, queued_seconds: float) -> None:
        self._queued.observe(queued_seconds)

    def done(self, name: str, work_seconds: float) -> None:
        self._work.observe(work_seconds)

    def retried(self, name: str) -> None:
        self._retries.inc()


class _QueueState(Collector):
    """Depth and in-flight ages, read from the queues when scraped."""

    def __init__(self, sources: Callable[[], Iterable[QueueStatistics]]) -> None:
        self._sources = sources

    def collect(self) -> Iterable[Any]:
        depth = GaugeMetricFamily("workqueue_depth", "Current depth of workqueue", labels=["name", "controller"])
        unfinished = GaugeMetricFamily(
            "workqueue_unfinished_work_seconds",
            "Seconds of work in progress not yet observed by work_duration; large values indicate stuck workers.",
            labels=["name", "controller"],
        )
        longest = GaugeMetricFamily(
            "workqueue_longest_running_processor_seconds",
            "How many seconds the longest running processor has been running.",
            labels=["name", "controller"],
        )
        for s in self._sources():
            depth.add_metric([s.name, s.name], s.depth)
            unfinished.add_metric([s.name, s.name], s.unfinished_work)
            longest.add_metric([s.name, s.name], s.longest_running)
        yield depth
        yield unfinished
        yield longest

    def describe(self) -> Iterable[Any]:
        return []


class _InformerState(Collector):
    """What each informer received and holds, read from the informers when scraped."""

    def __init__(self, sources: Callable[[], Iterable[Any]]) -> None:
        self._sources = sources

    def collect(self) -> Iterable[Any]:
        labels = ["informer"]
        received = CounterMetricFamily(
            "declop_informer_events_received", "Watch events of objects received after the sync, before shard filtering.", labels=labels
        )
        listed = CounterMetricFamily("declop_informer_objects_listed", "Objects received by list syncs.", labels=labels)
        dropped = CounterMetricFamily("declop_informer_shard_dropped", "Objects and events dropped by the shard filter.", labels=labels)
        released = CounterMetricFamily(
            "declop_informer_shard_released", "Objects that left the cache because their shard range was released.", labels=labels
        )
        held = GaugeMetricFamily("declop_informer_objects", "Objects in the informer's cache.", labels=labels)
        server = GaugeMetricFamily(
            "declop_informer_shard_server_side", "1 when the apiserver filters by shard, 0 when filtering is client-side.", labels=labels
        )
        for i in self._sources():
            name = [i.name]
            received.add_metric(name, i.events_received)
            listed.add_metric(name, i.objects_listed)
            dropped.add_metric(name, i.dropped)
            released.add_metric(name, i.released)
            held.add_metric(name, len(i.store))
            if i.shard is not None and i.shard_mode:
                server.add_metric(name, int(i.shard_mode == "server"))
        yield from (received, listed, dropped, released, held, server)

    def describe(self) -> Iterable[Any]:
        return []


class _Triggers:
    """One controller's trigger counts: per source, and the coalesced-events histogram."""

    __slots__ = ("buckets", "count", "sources", "sum")

    def __init__(self) -> None:
        self.sources: dict[str, int] = {}
        self.buckets = [0] * len(COALESCED_BUCKETS)  # non-cumulative; beyond the last: count only
        self.sum = 0
        self.count = 0


class _TriggerState(Collector):
    """declop_reconcile_triggers_total and declop_reconcile_coalesced_events, at scrape time."""

    def __init__(self, triggers: dict[str, _Triggers]) -> None:
        self._triggers = triggers

    def collect(self) -> Iterable[Any]:
        counter = CounterMetricFamily(
            "declop_reconcile_triggers",
            "Reconciles per controller and source that caused them (a reconcile with several sources counts for each)",
            labels=["controller", "source"],
        )
        histogram = HistogramMetricFamily(
            "declop_reconcile_coalesced_events", "Source events coalesced into one reconcile", labels=["controller"]
        )
        for controller, t in list(self._triggers.items()):
            for source, n in list(t.sources.items()):
                counter.add_metric([controller, source], n)
            cumulative, buckets = 0, []
            for le, n in zip(COALESCED_BUCKETS, t.buckets):
                cumulative += n
                buckets.append((str(float(le)), cumulative))
            buckets.append(("+Inf", t.count))
            histogram.add_metric([controller], buckets, t.sum)
        yield counter
        yield histogram

    def describe(self) -> Iterable[Any]:
        return []


#: seconds between two samples of the event loop's lag (10 wake-ups a second)
LOOP_LAG_INTERVAL = 0.1


class LoopLag:
    """Samples how late the running loop wakes from a timer into ``histogram``.

    Invariant: one sample per wake-up, the lateness beyond the interval (never negative);
    :attr:`worst` is the largest seen since start."""

    def __init__(self, histogram: Histogram, interval: float = LOOP_LAG_INTERVAL) -> None:
        self.histogram, self.interval = histogram, interval
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._sample(), name="event loop lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        observe, interval = self.histogram.observe, self.interval
        while True:
            started = loop.time()
            await asyncio.sleep(interval)
            lag = max(loop.time() - started - interval, 0.0)
            observe(lag)
            if lag > self.worst:
                self.worst = lag


class Metrics(ControllerMetrics):
    """Every metric of one manager."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        qlabels = ["name", "controller"]
        self.adds = Counter("workqueue_adds_total", "Total number of adds handled by workqueue", qlabels, registry=r)
        self.retries = Counter("workqueue_retries_total", "Total number of retries handled by workqueue", qlabels, registry=r)
        self.queue_duration = Histogram(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            qlabels,
            buckets=QUEUE_BUCKETS,
            registry=r,
        )
        self.work_duration = Histogram(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            qlabels,
            buckets=QUEUE_BUCKETS,
            registry=r,
        )
        self.reconcile_total = Counter(
            "controller_runtime_reconcile_total", "Total number of reconciliations per controller", ["controller", "result"], registry=r
        )
        self.reconcile_errors = Counter(
            "controller_runtime_reconcile_errors_total", "Total number of reconciliation errors per controller", ["controller"], registry=r
        )
        self.terminal_errors = Counter(
            "controller_runtime_terminal_reconcile_errors_total",
            "Total number of terminal reconciliation errors per controller",
            ["controller"],
            registry=r,
        )
        self.reconcile_time = Histogram(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            ["controller"],
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )
        self.active_workers = Gauge(
            "controller_runtime_active_workers", "Number of currently used workers per controller", ["controller"], registry=r
        )
        self.max_concurrent = Gauge(
            "controller_runtime_max_concurrent_reconciles", "Maximum number of concurrent reconciles per controller", ["controller"], registry=r
        )
        self.leader = Gauge(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master.",
            ["name"],
            registry=r,
        )
        self.shard_ranges = Gauge(
            "declop_shard_ranges_owned", "Hash ranges whose Lease this replica holds, per controller (sharded mode)", ["controller"], registry=r
        )
        self.shard_handovers = Counter(
            "declop_shard_handovers_total",
            "Range Leases acquired, released (after a drain) or lost, per controller (sharded mode)",
            ["controller", "kind"],
            registry=r,
        )
        self.rest_requests = Counter(
            "rest_client_requests_total", "Number of HTTP requests, partitioned by method and code.", ["method", "code"], registry=r
        )
        self._triggers: dict[str, _Triggers] = {}
        r.register(_TriggerState(self._triggers))
        self.timeouts = Counter(
            "declop_reconcile_timeouts_total",
            "Handler calls past their timeout: cancelled (async) or overrun (plain, reported only)",
            ["controller", "kind"],
            registry=r,
        )
        self.webhook_requests = Counter(
            "controller_runtime_webhook_requests_total",
            "Total number of admission requests by HTTP status code.",
            ["webhook", "code"],
            registry=r,
        )
        self.webhook_latency = Histogram(
            "controller_runtime_webhook_latency_seconds",
            "Histogram of the latency of processing admission requests",
            ["webhook"],
            registry=r,
        )
        self.webhook_in_flight = Gauge(
            "controller_runtime_webhook_requests_in_flight",
            "Current number of admission requests being served.",
            ["webhook"],
            registry=r,
        )
        self.loop_lag = Histogram(
            "declop_event_loop_lag_seconds",
            "How late the event loop woke from a timer: the time everything on it stood still",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=r,
        )
        self._queues: list[Callable[[], QueueStatistics]] = []
        self._bound: dict[str, dict[str, Any]] = {}
        r.register(_QueueState(lambda: [q() for q in self._queues]))
        self._informers: Callable[[], Iterable[Any]] = lambda: ()
        r.register(_InformerState(lambda: self._informers()))

    def watch_informers(self, informers: Callable[[], Iterable[Any]]) -> None:
        """Report the counters of the informers ``informers()`` returns at scrape time (called
        from the metrics server's thread: it must return a snapshot, not a growing dict). A
        later call replaces the source (a manager started again)."""
        self._informers = informers

    def watch_queue(self, statistics: Callable[[], QueueStatistics]) -> None:
        """Report depth and in-flight ages of a queue at scrape time."""
        self._queues.append(statistics)

    # -- ControllerMetrics hooks ----------------------------------------------------------------
    def queue(self, controller: str) -> QueueMetrics | None:
        return _QueueHooks(self, controller)

    def started(self, controller: str, max_concurrent: int) -> None:
        self.max_concurrent.labels(controller).set(max_concurrent)
        self.active_workers.labels(controller).set(0)
        self._children(controller)  # every series exists (at 0) from the start

    def _children(self, controller: str) -> dict[str, Any]:
        children = self._bound.get(controller)
        if children is None:
            children = self._bound[controller] = {
                "time": self.reconcile_time.labels(controller),
                "error": self.reconcile_errors.labels(controller),
                "terminal_error": self.terminal_errors.labels(controller),
                "active": self.active_workers.labels(controller),
                **{f"total:{r}": self.reconcile_total.labels(controller, r) for r in RESULTS},
            }
        return children

    def reconciled(self, controller: str, result: str, seconds: float) -> None:
        c = self._children(controller)
        c[f"total:{result}"].inc()
        c["time"].observe(seconds)
        if result in ("error", "terminal_error"):
            c[result].inc()
        elif result == "temporary_error":  # an error too (controller_runtime_reconcile_errors_total)
            c["error"].inc()

    def triggered(self, controller: str, trace: Trace) -> None:
        t = self._triggers.get(controller)
        if t is None:
            t = self._triggers[controller] = _Triggers()
        counts = t.sources
        for source in trace.sources:
            counts[source] = counts.get(source, 0) + 1
        events = trace.events
        t.count += 1
        t.sum += events
        if events <= 1:
            t.buckets[0] += 1
        elif events <= COALESCED_BUCKETS[-1]:
            t.buckets[bisect.bisect_left(COALESCED_BUCKETS, events)] += 1

    def timed_out(self, controller: str, kind: str) -> None:
        self.timeouts.labels(controller, kind).inc()

    def active(self, controller: str, delta: int) -> None:
        self._children(controller)["active"].inc(delta)

    def request(self, method: str, code: int) -> None:
        self.rest_requests.labels(method, str(code)).inc()

    def webhook(self, path: str, code: int, seconds: float) -> None:
        """One webhook request answered (the WebhookServer's observer)."""
        self.webhook_requests.labels(path, str(code)).inc()
        self.webhook_latency.labels(path).observe(seconds)

    def webhook_serving(self, path: str, delta: int) -> None:
        self.webhook_in_flight.labels(path).inc(delta)

    def exposition(self) -> bytes:
        """The text format served on /metrics."""
        return generate_latest(self.registry)
