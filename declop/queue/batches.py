"""Batches: many keys per thread hop for plain handlers, without head-of-line blocking.

A worker of a plain ``def`` handler takes the key it waited for plus more ready keys, prepares
them on the loop and runs the calls one after another in one executor job: handing a single
reconcile to a thread and back is most of a cold start's reconcile phase at 10k objects
(bench/FINDINGS.md, F2). The risk is head-of-line blocking: one slow or hanging call would hold
every key queued behind it in its batch while other workers sit idle. A :class:`Batch` is the
hand-over of those calls between the worker (on the event loop) and the thread that avoids it:

- the thread takes calls from the front with :meth:`Batch.next`, which notes when each started;
- once the running call has run for :data:`STALL_AFTER` (:meth:`Batch.running_for`), the loop
  takes the calls that have not started back from the end with :meth:`Batch.take_back` and gives
  their keys back to the queue, where idle workers take them at once.

A call that runs past :data:`STALL_AFTER` costs at least 30 times the hop it saves, so giving its
followers back loses nothing measurable; fast calls never stall and keep the whole batch in one hop.

Invariants:
- every item is handed out exactly once: to the thread (``next``) or back to the loop
  (``take_back``), never both — each end is a single ``deque`` pop, atomic between threads;
- ``take_back`` returns the items in their original order;
- a batch never grows after it is made.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, Hashable, Iterable, Iterator, TypeVar

from declop.clock import MONOTONIC, Clock

__all__ = ["BATCH", "STALL_AFTER", "Batch", "batch_size"]

T = TypeVar("T", bound=Hashable)

#: at most this many keys per thread hop
BATCH = 64

#: a call running longer than this (seconds) gives the keys behind it back to the queue
STALL_AFTER = 0.005


def batch_size(ready: int, workers: int, limit: int = BATCH) -> int:
    """How many keys a worker takes: the one it waited for plus at most its share of the
    ``ready`` backlog (``ready // workers``), never more than ``limit`` in all."""
    return 1 + max(0, min(limit - 1, ready // max(workers, 1)))


class Batch(Generic[T]):
    """The items one worker took for one thread hop (see the module docstring)."""

    __slots__ = ("_clock", "_pending", "started_at")

    def __init__(self, items: Iterable[T], clock: Clock = MONOTONIC) -> None:
        self._pending: deque[T] = deque(items)
        self._clock = clock
        #: when the current call started (the batch's creation until the thread takes one)
        self.started_at = clock()

    def __len__(self) -> int:
        """Items not handed out yet (informational: the thread may take one at any moment)."""
        return len(self._pending)

    def next(self) -> T | None:
        """Thread side: the next item to run, or None when none is left; marks its start."""
        pending = self._pending
        if not pending:  # the common end of a batch, without raising
            return None
        try:
            item = pending.popleft()
        except IndexError:  # the loop took the rest back meanwhile
            return None
        self.started_at = self._clock()
        return item

    def __iter__(self) -> Iterator[T]:
        """Thread side: :meth:`next` until the batch is empty (or taken back)."""
        while (item := self.next()) is not None:
            yield item

    def running_for(self) -> float:
        """Seconds since the current call (or the batch) started."""
        return self._clock() - self.started_at

    def stalled(self, after: float = STALL_AFTER) -> bool:
        """True when items wait behind a call that has run for ``after`` seconds or more."""
        return bool(self._pending) and self._clock() - self.started_at >= after

    def take_back(self) -> list[T]:
        """Loop side: remove every item not handed to the thread yet; in their original order."""
        pending, back = self._pending, []
        while True:
            try:
                back.append(pending.pop())
            except IndexError:
                break
        back.reverse()
        return back

    def __repr__(self) -> str:
        return f"<Batch pending={len(self._pending)} running_for={self.running_for():.3f}s>"
