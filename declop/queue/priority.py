"""PriorityQueue: the work queue with priorities that age, so urgent keys jump a backlog and
nothing waits forever.

A :class:`~declop.queue.workqueue.WorkQueue` in every respect — dedup, one item one worker, a re-add
while processing gives exactly one more run, ``give_back`` to the head, delays, rate limiting,
shutdown and drain are inherited unchanged — except the order in which *ready* items are handed
out. Each :meth:`PriorityQueue.add` carries an integer ``priority`` (higher first; :data:`NORMAL`
is 0, :data:`LOW` is -100, controller-runtime's values), and an item that waits gains
``aging`` priority points per second:

    rank(item) = priority + aging * (now - enqueued)

The item with the highest rank goes first; equal ranks go in the order they were added (FIFO).
Because every waiting item ages at the same rate, comparing ranks does not depend on ``now``:
the order is fixed by ``priority - aging * enqueued`` when the item is queued, so the ready set
is a heap with a static key and :meth:`get` reads no clock for the order. With ``aging > 0`` no
item starves: a low item queued at ``t0`` is ahead of every normal item queued after
``t0 + (NORMAL - LOW) / aging`` (10 s with the defaults). With ``aging == 0`` priorities are
strict and a steady stream of normal items can starve low ones.

Invariants (on top of the WorkQueue's; ``ready`` = the heap, ``live`` = item -> its entry):

* an item is ready at most once: ``live`` holds exactly the queued items, each with one entry;
* a re-add of a ready item with a *higher* priority promotes it: it is re-ranked with the new
  priority and its original enqueue time (the wait it already did counts); a lower or equal
  priority changes nothing. The superseded entry stays in the heap until it surfaces and is
  dropped, and the heap is compacted when superseded entries outnumber the live ones;
* the head of the heap is always live (or the heap is empty), so a non-empty heap means an
  item is ready;
* a re-add while the item is processing remembers the highest priority asked for and the time
  of the first such re-add; :meth:`done` queues it with them;
* given-back items rank above everything (they were taken already), latest give-back first and
  in the order given within one call — the WorkQueue's "back to the head".

Delayed adds (``add_after``, ``add_rate_limited``: requeues and retries) enter with
:data:`NORMAL` priority when due.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from typing import Hashable, TypeVar

from declop.clock import MONOTONIC, Clock
from declop.errors import RegistrationError
from declop.queue.ratelimit import RateLimiter
from declop.queue.workqueue import QueueMetrics, WorkQueue

__all__ = ["DEFAULT_AGING", "LOW", "NORMAL", "Priority", "PriorityQueue"]

T = TypeVar("T", bound=Hashable)

#: priority of real changes and requeues (controller-runtime's default)
NORMAL = 0
#: priority of keys from a list or of updates that changed nothing a handler reads (controller-runtime's LowPriority)
LOW = -100
#: priority points a waiting item gains per second: a LOW item catches up with NORMAL in 10 s
DEFAULT_AGING = 10.0

_FRONT = -math.inf  # the sort key of given-back items: ahead of every ranked one
_COMPACT_MIN = 64

# a heap entry: (-rank key, seq, item, priority, enqueued); seq is unique, so tuples never
# compare items
_Entry = tuple[float, int, T, int, float]


def _valid_aging(aging: object) -> bool:
    return isinstance(aging, (int, float)) and not isinstance(aging, bool) and 0 <= aging < math.inf


@dataclass(frozen=True, slots=True)
class Priority:
    """A controller's queue priorities, as a decorator option: ``priority=Priority(aging=2)``.

    ``listed`` is the priority of keys added by an informer's initial list or a relist;
    ``unchanged`` that of updates that changed nothing but ``resourceVersion``,
    ``managedFields`` or (for the primary resource) ``status``; every other event, a requeue
    and a retry get :data:`NORMAL` (0). ``aging`` is in priority points per second: with the
    defaults a listed key waits at most 10 s behind keys queued after it. Bad values raise
    :class:`~declop.errors.RegistrationError` (a ``ConfigError``).
    """

    listed: int = LOW
    unchanged: int = LOW
    aging: float = DEFAULT_AGING

    def __post_init__(self) -> None:
        for field in ("listed", "unchanged"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool):
                raise RegistrationError(
                    f"priority: {field} must be an int (higher runs first; NORMAL is 0, LOW is -100), got {value!r}"
                )
        if not _valid_aging(self.aging):
            raise RegistrationError(
                f"priority: aging must be a number of priority points per second >= 0 (0: strict priorities), got {self.aging!r}"
            )


class PriorityQueue(WorkQueue[T]):
    """A :class:`~declop.queue.workqueue.WorkQueue` whose ready items go out by aged priority (see the
    module docstring). ``aging`` is in priority points per second, ``>= 0``."""

    __slots__ = ("_aging", "_again", "_back", "_live", "_order")

    def __init__(
        self,
        *,
        name: str = "",
        rate_limiter: RateLimiter | None = None,
        clock: Clock = MONOTONIC,
        metrics: QueueMetrics | None = None,
        aging: float = DEFAULT_AGING,
    ) -> None:
        if not _valid_aging(aging):
            raise ValueError(f"aging must be a number of priority points per second >= 0, got {aging!r}")
        super().__init__(name=name, rate_limiter=rate_limiter, clock=clock, metrics=metrics)
        self._aging = float(aging)
        self._queue: list[_Entry[T]] = []  # type: ignore[assignment]  # the ready heap
        self._live: dict[T, _Entry[T]] = {}
        # processing items re-added meanwhile -> (highest priority asked, enqueue time)
        self._again: dict[T, tuple[int, float]] = {}
        self._order = itertools.count()
        self._back = itertools.count(-1, -1)  # given-back entries: later ones sort first

    @property
    def aging(self) -> float:
        """Priority points a waiting item gains per second."""
        return self._aging

    # ------------------------------------------------------------------ intake

    def add(self, item: T, priority: int = NORMAL) -> None:
        """Mark ``item`` as needing processing with ``priority`` (higher goes first).

        As :meth:`WorkQueue.add <declop.queue.workqueue.WorkQueue.add>`; in addition a ready item
        re-added with a higher priority is promoted, and a processing item remembers the highest
        priority it was re-added with.
        """
        if self._shutting_down:
            return
        dirty = self._dirty
        if item in dirty:
            entry = self._live.get(item)
            if entry is not None:
                if priority > entry[3]:
                    self._promote(item, entry, priority)
            else:
                again = self._again.get(item)
                if again is not None and priority > again[0]:
                    self._again[item] = (priority, again[1])
            return
        self._adds += 1
        metrics = self._metrics
        aging = self._aging
        now = self._clock() if metrics is not None or aging else 0.0
        dirty[item] = now
        if metrics is not None:
            metrics.added(self._name)
        if item in self._processing:
            self._again[item] = (priority, now)
            return
        entry = (aging * now - priority, next(self._order), item, priority, now)  # _push, inlined
        self._live[item] = entry
        heapq.heappush(self._queue, entry)
        if self._getters:
            self._wake_one()

    # ------------------------------------------------------------------ output

    def done(self, item: T) -> None:
        """As :meth:`WorkQueue.done <declop.queue.workqueue.WorkQueue.done>`: a re-added item is queued
        once more, with the highest priority it was re-added with."""
        started = self._processing.pop(item, None)
        if started is None:
            return
        if self._metrics is not None:
            self._metrics.done(self._name, self._clock() - started)
        if item in self._dirty:
            priority, enqueued = self._again.pop(item, (NORMAL, self._dirty[item]))
            self._push(item, priority, enqueued)
            if self._getters:
                self._wake_one()
        if not self._processing and self._drainers:
            self._wake_drainers()

    def give_back(self, *items: T) -> None:
        """As :meth:`WorkQueue.give_back <declop.queue.workqueue.WorkQueue.give_back>`: the items go
        ahead of every ranked item, in the order given."""
        back: list[T] = []
        for item in items:
            if self._processing.pop(item, None) is None:
                continue
            if item not in self._dirty:
                self._dirty[item] = 0.0 if self._metrics is None else self._clock()
            self._again.pop(item, None)  # the given-back run serves the re-add
            back.append(item)
        if not back:
            return
        heap, live = self._queue, self._live
        for item in reversed(back):
            entry = (_FRONT, next(self._back), item, NORMAL, 0.0)
            live[item] = entry
            heapq.heappush(heap, entry)
        for _ in back:
            if not self._getters:
                break
            self._wake_one()
        if not self._processing and self._drainers:
            self._wake_drainers()

    def __len__(self) -> int:
        """Ready items (informational)."""
        return len(self._live)

    def ranks(self) -> list[tuple[T, int, float]]:
        """The ready items in hand-out order as ``(item, priority, seconds waited)`` (a snapshot
        for debugging and tests; O(n log n))."""
        now = self._clock()
        entries = sorted(self._live.values())
        return [(e[2], e[3], 0.0 if e[0] == _FRONT else now - e[4]) for e in entries]

    # ------------------------------------------------------------------ internals

    def _push(self, item: T, priority: int, enqueued: float) -> None:
        entry = (self._aging * enqueued - priority, next(self._order), item, priority, enqueued)
        self._live[item] = entry
        heapq.heappush(self._queue, entry)

    def _promote(self, item: T, entry: _Entry[T], priority: int) -> None:
        if entry[0] == _FRONT:
            return  # given back: already ahead of everything
        self._push(item, priority, entry[4])  # the old entry is superseded
        heap = self._queue
        if len(heap) > _COMPACT_MIN and len(heap) > 2 * len(self._live):
            heap = list(self._live.values())
            heapq.heapify(heap)
            self._queue = heap

    def _take(self) -> T:
        """Pop the best ready entry (the heap's head is live), then drop superseded heads."""
        heap, live = self._queue, self._live
        entry = heapq.heappop(heap)
        item = entry[2]
        del live[item]
        while heap:
            head = heap[0]
            if live.get(head[2]) is head:
                break
            heapq.heappop(heap)
        now = self._clock()
        self._processing[item] = now
        added = self._dirty.pop(item)
        if self._metrics is not None:
            self._metrics.got(self._name, now - added)
        return item
