"""I13: what a replica's metrics say about its workqueues agrees with the queues themselves.

Every world replica runs with a :class:`~declop.serving.metrics.Metrics` of its own, as a pod
with ``--metrics-port`` does, so the queue's metrics callbacks run under the search like the rest
of the hot path. :func:`problems` reads the registry the way a scrape does and holds it to the
queues of the replica's controllers:

- ``workqueue_adds_total`` is the queue's own count of non-duplicate adds, and
  ``workqueue_retries_total`` its count of accepted ``add_after`` calls: the callbacks fire
  exactly when the queue counts;
- ``workqueue_depth`` is the number of ready items;
- every get is observed once by ``workqueue_queue_duration_seconds`` and every done by
  ``workqueue_work_duration_seconds``: gets >= dones + items in flight (a key given back by a
  stalled batch is a get without its done);
- no observed wait or work time is negative, and none is longer than the replica has lived
  (each histogram's sum lies within ``[0, count * uptime]``);
- the in-flight gauges: ``0 <= longest_running <= unfinished_work <= in flight * uptime``, both 0
  with nothing in flight; ``0 <= active_workers <= max_concurrent_reconciles``;
- at rest (``at_rest``: the run settled, nothing running) nothing is in flight and no worker is
  active.

Times are on the queue's clock (the replica's Lease clock); ``uptime`` is that clock's reading
now minus its reading when the manager was made.
"""

from __future__ import annotations

from typing import Any, Collection

__all__ = ["problems", "scrape"]

#: rounding slack on float sums (seconds)
_EPS = 1e-6


def problems(manager: Any, metrics: Any, uptime: float, *, at_rest: bool = False, periodic: Collection[str] = ()) -> list[str]:
    """What in ``metrics`` (a replica's :class:`~declop.serving.metrics.Metrics`) disagrees with
    the queues of ``manager``'s controllers; empty when all holds. The controllers named in
    ``periodic`` (timers, daemons: their ticks may run at any moment) are never judged at rest."""
    out: list[str] = []
    scraped = scrape(metrics.registry)
    for c in manager.controllers:
        name = c.name
        s = c.queue.statistics()
        q = (("controller", name), ("name", name))

        def value(metric: str, labels: tuple[tuple[str, str], ...] = q) -> float:
            return scraped.get((metric, labels), 0.0)

        adds, retries = value("workqueue_adds_total"), value("workqueue_retries_total")
        if adds != s.adds:
            out.append(f"{name}: workqueue_adds_total is {adds:g}, the queue counted {s.adds} adds")
        if retries != s.retries:
            out.append(f"{name}: workqueue_retries_total is {retries:g}, the queue counted {s.retries} retries")
        depth = value("workqueue_depth")
        if depth != len(c.queue):
            out.append(f"{name}: workqueue_depth is {depth:g}, {len(c.queue)} items are ready")
        gets, dones = value("workqueue_queue_duration_seconds_count"), value("workqueue_work_duration_seconds_count")
        if gets < dones + s.processing:
            out.append(f"{name}: {gets:g} gets observed, fewer than {dones:g} dones plus {s.processing} in flight")
        for metric, count in (("workqueue_queue_duration_seconds", gets), ("workqueue_work_duration_seconds", dones)):
            total = value(f"{metric}_sum")
            if not -_EPS <= total <= count * uptime + _EPS:
                out.append(f"{name}: {metric} sums {total:.6f} s over {count:g} observations, outside [0, {count:g} x {uptime:.3f} s of uptime]")
        longest, unfinished = value("workqueue_longest_running_processor_seconds"), value("workqueue_unfinished_work_seconds")
        if not (0.0 <= longest <= unfinished + _EPS and unfinished <= s.processing * uptime + _EPS):
            out.append(f"{name}: longest running {longest:.6f} s, unfinished work {unfinished:.6f} s with {s.processing} in flight and {uptime:.3f} s of uptime")
        one = (("controller", name),)
        active, limit = value("controller_runtime_active_workers", one), value("controller_runtime_max_concurrent_reconciles", one)
        if not 0 <= active <= max(limit, 0):
            out.append(f"{name}: {active:g} active workers of {limit:g}")
        if at_rest and name not in periodic and (s.processing or active):
            out.append(f"{name}: at rest with {s.processing} keys in flight and {active:g} active workers")
    return out


def scrape(registry: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``registry`` (one collection, as a scrape), by name and sorted labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in registry.collect()
        for sample in family.samples
    }
