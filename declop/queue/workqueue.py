"""WorkQueue: a deduplicating, delaying, rate-limited queue of hashable items.

The queue knows nothing about Kubernetes; it moves opaque hashable items (declop puts
``Request`` keys in it) from producers to workers. Its contract is client-go's
``util/workqueue``:

* **Fair** — items are handed out in the order they were added (FIFO).
* **Stingy** — an item is never handed to two workers at once, and adding an item several times
  before a worker takes it yields a single run.
* **Re-adds while processing are kept** — adding an item that a worker is processing does not
  queue it again right away; it marks the item *dirty*, and :meth:`WorkQueue.done` re-queues it
  once. However many adds arrive during one run, exactly one follow-up run happens.
* **Untaken work goes back to the front** — a worker that took items it has not started on (a
  batch stuck behind a slow call) may :meth:`WorkQueue.give_back` them: they return to the head of
  the queue for another worker, as if never taken. Not in client-go, which hands out one item per
  ``Get``.
* **Shutdown drains** — after :meth:`WorkQueue.shutdown` new adds are ignored, but workers keep
  receiving what is already queued; only an empty, shut-down queue raises :class:`QueueShutDown`.
  :meth:`WorkQueue.shutdown_with_drain` additionally waits for in-flight items to be ``done``;
  a later :meth:`WorkQueue.shutdown` ends that wait at once (client-go's ``ShutDown`` after
  ``ShutDownWithDrain``), so a caller can give up on a drain it started elsewhere.

Delays (:meth:`WorkQueue.add_after`, :meth:`WorkQueue.add_rate_limited`):

* **Earliest deadline wins** — an item waits in the delayed heap at most once; a second
  ``add_after`` only takes effect if its deadline is sooner. A later deadline never postpones.
* **The heap and the dirty set are independent** — an item may be queued now *and* wait in the
  heap; it then runs now and again when its deadline passes (as client-go).
* Due items enter the queue through :meth:`WorkQueue.add`, so deduplication applies to them.
  They move when someone looks: :meth:`WorkQueue.get_nowait` moves everything due by ``clock()``,
  and :meth:`WorkQueue.get` also arms one timer for the earliest deadline while workers wait.

State invariants (``queue`` = ready FIFO, ``dirty`` = needs processing, ``processing`` = in
flight):

* every item in ``queue`` is in ``dirty``, and appears in ``queue`` exactly once;
* an item in ``dirty`` is either in ``queue`` or in ``processing`` (a re-add during processing);
* no item is both in ``queue`` and in ``processing``;
* every live delayed entry is in the heap and in the ``waiting`` map; superseded heap entries
  are dropped when they reach the head, and the heap is compacted when they outnumber the live
  ones, so memory stays proportional to the number of waiting items.

Concurrency: a queue belongs to **one** asyncio event-loop thread. It is *not* thread-safe; call
every method from that loop (producers on other threads must use ``loop.call_soon_threadsafe``).
A worker that takes an item must call :meth:`WorkQueue.done` for it (or, if it never started on
it, :meth:`WorkQueue.give_back`), or the item never runs again and ``shutdown_with_drain`` waits
forever.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque
from typing import Generic, Hashable, TypeVar

from declop.clock import MONOTONIC, Clock
from declop.queue.ratelimit import RateLimiter, default_controller_rate_limiter
from declop.queue.stats import NO_METRICS as NO_METRICS
from declop.queue.stats import QueueMetrics as QueueMetrics
from declop.queue.stats import QueueStatistics as QueueStatistics

__all__ = [
    "NO_METRICS",
    "QueueEmpty",
    "QueueMetrics",
    "QueueShutDown",
    "QueueStatistics",
    "WorkQueue",
]

T = TypeVar("T", bound=Hashable)

# The delayed heap is rebuilt from live entries once superseded ones outnumber them (and it
# holds more than this many entries), which bounds it to about twice the waiting items.
_COMPACT_MIN = 64


class QueueEmpty(Exception):
    """:meth:`WorkQueue.get_nowait` found no ready item (the queue is not shut down)."""


class QueueShutDown(Exception):
    """The queue is shut down and has no ready item left: the worker should exit."""


class WorkQueue(Generic[T]):
    """A fair, stingy, delaying, rate-limited work queue (see the module docstring).

    ``rate_limiter`` defaults to :func:`~declop.queue.ratelimit.default_controller_rate_limiter`
    driven by the same ``clock``. ``metrics`` defaults to :data:`NO_METRICS`.
    """

    __slots__ = (
        "_adds",
        "_clock",
        "_dirty",
        "_drain",
        "_drainers",
        "_getters",
        "_heap",
        "_metrics",
        "_name",
        "_processing",
        "_queue",
        "_rate_limiter",
        "_retries",
        "_seq",
        "_shutting_down",
        "_timer",
        "_timer_at",
        "_waiting",
    )

    def __init__(
        self,
        *,
        name: str = "",
        rate_limiter: RateLimiter | None = None,
        clock: Clock = MONOTONIC,
        metrics: QueueMetrics | None = None,
    ) -> None:
        self._name = name
        self._clock = clock
        self._rate_limiter: RateLimiter = (
            rate_limiter if rate_limiter is not None else default_controller_rate_limiter(clock=clock)
        )
        # None when nobody listens, so the hot path skips the calls (and the clock reads).
        self._metrics: QueueMetrics | None = (
            None if metrics is None or metrics is NO_METRICS else metrics
        )
        self._queue: deque[T] = deque()
        # dirty item -> clock() when it became dirty (0.0 without metrics); ordered, O(1) lookup
        self._dirty: dict[T, float] = {}
        # in-flight item -> clock() when a worker took it
        self._processing: dict[T, float] = {}
        # delayed items: heap of (deadline, seq, item); `_waiting` maps item -> its live entry
        self._heap: list[tuple[float, int, T]] = []
        self._waiting: dict[T, tuple[float, int, T]] = {}
        self._seq = itertools.count()
        self._getters: deque[asyncio.Future[None]] = deque()
        self._drainers: list[asyncio.Future[None]] = []
        self._drain = False  # a shutdown_with_drain() is waiting and no shutdown() ended it
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # the heap deadline the timer was armed for
        self._shutting_down = False
        self._adds = 0
        self._retries = 0

    # ------------------------------------------------------------------ properties

    @property
    def name(self) -> str:
        """The queue's name, passed to every metrics callback."""
        return self._name

    @property
    def shutting_down(self) -> bool:
        """True once :meth:`shutdown` was called."""
        return self._shutting_down

    @property
    def rate_limiter(self) -> RateLimiter:
        """The limiter behind :meth:`add_rate_limited`, :meth:`forget` and :meth:`num_requeues`."""
        return self._rate_limiter

    # ------------------------------------------------------------------ intake

    def add(self, item: T, priority: int = 0) -> None:
        """Mark ``item`` as needing processing.

        Ignored after shutdown and while ``item`` is already dirty (queued, or re-added during
        processing). If a worker holds ``item`` it is only marked dirty; :meth:`done` queues it.
        ``priority`` is ignored: this queue is FIFO (:class:`~declop.queue.priority.PriorityQueue`
        honours it).
        """
        if self._shutting_down or item in self._dirty:
            return
        self._adds += 1
        metrics = self._metrics
        if metrics is None:
            self._dirty[item] = 0.0
        else:
            self._dirty[item] = self._clock()
            metrics.added(self._name)
        if item in self._processing:
            return
        self._queue.append(item)
        if self._getters:
            self._wake_one()

    def add_after(self, item: T, delay: float) -> None:
        """Add ``item`` once ``delay`` seconds have passed on the queue's clock.

        ``delay <= 0`` adds now. Otherwise the item waits in the delayed heap; if it already
        waits there, the earlier of the two deadlines is kept. Counts as a retry (even with
        ``delay <= 0``). Ignored after shutdown.
        """
        if self._shutting_down:
            return
        self._retries += 1
        if self._metrics is not None:
            self._metrics.retried(self._name)
        if not delay > 0:  # also NaN
            self.add(item)
            return
        deadline = self._clock() + delay
        current = self._waiting.get(item)
        if current is not None and current[0] <= deadline:
            return  # earliest deadline wins; a later one never postpones
        entry = (deadline, next(self._seq), item)
        self._waiting[item] = entry
        heapq.heappush(self._heap, entry)
        if current is not None:  # `current` is now a superseded heap entry
            size = len(self._heap)
            if size > _COMPACT_MIN and size > 2 * len(self._waiting):
                self._compact()
        if self._getters and self._heap[0] is entry:
            self._arm_timer(self._getters[0].get_loop())

    def add_rate_limited(self, item: T) -> None:
        """``add_after(item, rate_limiter.when(item))``; asks the limiter even after shutdown."""
        self.add_after(item, self._rate_limiter.when(item))

    def forget(self, item: T) -> None:
        """Clear ``item``'s rate-limiter history (it succeeded). :meth:`done` is still required."""
        self._rate_limiter.forget(item)

    def num_requeues(self, item: T) -> int:
        """How often ``item`` went through :meth:`add_rate_limited` since :meth:`forget`."""
        return self._rate_limiter.num_requeues(item)

    # ------------------------------------------------------------------ output

    def get_nowait(self) -> T:
        """Take the next ready item, first moving every delayed item that is due by ``clock()``.

        Raises :class:`QueueEmpty` if nothing is ready, :class:`QueueShutDown` if nothing is
        ready and the queue is shut down. The caller must call :meth:`done` for the item.
        """
        if self._heap:
            self._move_due(self._clock())
        if self._queue:
            return self._take()
        if self._shutting_down:
            raise QueueShutDown(self._name)
        raise QueueEmpty(self._name)

    async def get(self) -> T:
        """Wait for the next ready item and take it (see :meth:`get_nowait`).

        While waiting, a timer for the earliest delayed deadline (``deadline - clock()`` seconds)
        moves due items in. Raises :class:`QueueShutDown` once the queue is shut down and empty.
        Cancelling a waiting ``get`` takes nothing and loses no wake-up.
        """
        while True:
            if self._heap:
                self._move_due(self._clock())
            if self._queue:
                return self._take()
            if self._shutting_down:
                raise QueueShutDown(self._name)
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()
            self._getters.append(waiter)
            if self._heap:
                self._arm_timer(loop)
            try:
                await waiter
            except BaseException:
                # Cancelled. If we were already woken, pass the wake-up on to another getter.
                if waiter.done() and not waiter.cancelled():
                    if self._queue and self._getters:
                        self._wake_one()
                else:
                    try:
                        self._getters.remove(waiter)
                    except ValueError:
                        pass
                raise

    def done(self, item: T) -> None:
        """The worker finished ``item``. If it was re-added meanwhile, queue it once more.

        Calling ``done`` for an item that is not being processed does nothing.
        """
        started = self._processing.pop(item, None)
        if started is None:
            return
        if self._metrics is not None:
            self._metrics.done(self._name, self._clock() - started)
        if item in self._dirty:
            self._queue.append(item)
            if self._getters:
                self._wake_one()
        if not self._processing and self._drainers:
            self._wake_drainers()

    def give_back(self, *items: T) -> None:
        """Return items taken with :meth:`get` that no worker has started on: they leave
        processing and go back to the **head** of the ready queue, in the order given, as if
        they had never been taken (another worker may take them at once).

        For each item this replaces :meth:`done` for that get: call one or the other, never both.
        An item re-added while it was held is still queued once (that run serves the re-add).
        Items that are not being processed are ignored. No metrics callback runs: the next get
        reports the queue time since the item was given back (or re-added). After shutdown the
        items are queued all the same: they were accepted before it.
        """
        back: list[T] = []
        for item in items:
            if self._processing.pop(item, None) is None:
                continue
            if item not in self._dirty:
                self._dirty[item] = 0.0 if self._metrics is None else self._clock()
            back.append(item)
        if not back:
            return
        self._queue.extendleft(reversed(back))
        for _ in back:
            if not self._getters:
                break
            self._wake_one()
        if not self._processing and self._drainers:
            self._wake_drainers()

    # ------------------------------------------------------------------ shutdown

    def shutdown(self) -> None:
        """Stop intake: later adds are ignored and delayed items are dropped. Wakes every
        waiting getter; getters still receive the queued items, then :class:`QueueShutDown`.
        A pending :meth:`shutdown_with_drain` returns (False if items are still in flight).
        Idempotent."""
        self._drain = False
        drainers, self._drainers = self._drainers, []
        for drainer in drainers:
            if not drainer.done():
                drainer.set_result(None)
        self._stop_intake()

    def _stop_intake(self) -> None:
        self._shutting_down = True
        self._heap.clear()
        self._waiting.clear()
        self._cancel_timer()
        getters, self._getters = self._getters, deque()
        for getter in getters:
            if not getter.done():
                getter.set_result(None)

    async def shutdown_with_drain(self, timeout: float | None = None) -> bool:
        """:meth:`shutdown`, then wait until no item is being processed.

        Returns True when drained, False if ``timeout`` seconds passed first or :meth:`shutdown`
        was called meanwhile. Items re-added during the drain are lost (the queue is shut down);
        items made dirty *before* the shutdown are still re-queued by :meth:`done` and count as
        processing once taken.
        """
        self._drain = True
        self._stop_intake()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self._processing:
            if not self._drain:
                return False
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            drainer: asyncio.Future[None] = loop.create_future()
            self._drainers.append(drainer)
            try:
                await asyncio.wait((drainer,), timeout=remaining)
            finally:
                if not drainer.done():
                    drainer.cancel()
                    try:
                        self._drainers.remove(drainer)
                    except ValueError:
                        pass
        return True

    # ------------------------------------------------------------------ introspection

    def next_deadline(self) -> float | None:
        """The earliest delayed deadline, in clock units, or None if nothing waits."""
        heap, waiting = self._heap, self._waiting
        while heap:
            head = heap[0]
            if waiting.get(head[2]) is head:
                return head[0]
            heapq.heappop(heap)  # superseded entry
        return None

    def is_waiting(self, item: T) -> bool:
        """``item`` waits in the delayed heap (an ``add_after`` whose deadline has not passed)."""
        return item in self._waiting

    def __len__(self) -> int:
        """Ready items (informational: may change as soon as a worker runs)."""
        return len(self._queue)

    def statistics(self) -> QueueStatistics:
        """A snapshot of the queue's sizes, counters and in-flight ages."""
        now = self._clock()
        ages = [now - started for started in self._processing.values()]
        return QueueStatistics(
            name=self._name,
            depth=len(self),
            processing=len(self._processing),
            waiting=len(self._waiting),
            adds=self._adds,
            retries=self._retries,
            shutting_down=self._shutting_down,
            longest_running=max(ages, default=0.0),
            unfinished_work=sum(ages),
        )

    def __repr__(self) -> str:
        state = " shutting-down" if self._shutting_down else ""
        return (
            f"<{type(self).__name__} {self._name!r} depth={len(self)} "
            f"processing={len(self._processing)} waiting={len(self._waiting)}{state}>"
        )

    # ------------------------------------------------------------------ internals

    def _take(self) -> T:
        """Pop the head of the ready queue and hand it to the caller (queue must be non-empty)."""
        item = self._queue.popleft()
        now = self._clock()
        self._processing[item] = now
        added = self._dirty.pop(item)
        if self._metrics is not None:
            self._metrics.got(self._name, now - added)
        return item

    def _wake_drainers(self) -> None:
        drainers, self._drainers = self._drainers, []
        for drainer in drainers:
            if not drainer.done():
                drainer.set_result(None)

    def _wake_one(self) -> None:
        """Resolve the oldest still-pending getter future (skipping cancelled ones)."""
        getters = self._getters
        while getters:
            getter = getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    def _move_due(self, now: float) -> None:
        """Add every delayed item whose deadline is ``<= now``; drop superseded entries."""
        heap, waiting = self._heap, self._waiting
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            item = entry[2]
            if waiting.get(item) is entry:
                del waiting[item]
                self.add(item)

    def _compact(self) -> None:
        """Rebuild the heap from the live entries only."""
        heap = list(self._waiting.values())
        heapq.heapify(heap)
        self._heap = heap

    def _arm_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make sure a timer fires by the earliest delayed deadline while getters wait."""
        deadline = self.next_deadline()
        if deadline is None:
            return
        if self._timer is not None:
            if self._timer_at <= deadline:
                return
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = loop.call_later(max(0.0, deadline - self._clock()), self._on_timer, loop)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        """Timer callback: move due items in (waking getters), re-arm if getters still wait."""
        self._timer = None
        if self._heap:
            self._move_due(self._clock())
        if self._getters and self._heap:
            self._arm_timer(loop)
