"""Backoff: how long an informer waits before it relists or retries a failed watch request.

Owns :class:`Backoff`, client-go's reflector backoff: 0.8 s doubling to 30 s with full jitter,
started over after 2 minutes without a call. The watch loop (:mod:`declop.cache.watch`) asks it
for the delay before every relist and every retried watch request; ``declop.lifecycle`` uses it
for its own retries. It never sleeps: the caller waits.

Invariants:
- ``next()`` returns a delay uniform in ``[d, 2d)`` (jitter factor 1.0, as in client-go), then
  capped: never above ``cap``;
- ``d`` starts at ``initial`` and is multiplied by ``factor`` on every call, never above ``cap``;
- a call more than ``reset_after`` seconds after the previous one (by the injected ``clock``)
  starts over at ``initial``: a healthy stretch forgets earlier failures.
"""

from __future__ import annotations

import random
import time
from typing import Callable

__all__ = ["Backoff"]


class Backoff:
    """Exponential backoff with full jitter: 0.8 s doubling to 30 s, reset after 2 quiet minutes.

    ``next()`` returns a delay uniform in [d, 2d) capped at ``cap``, where d starts at ``initial``
    and doubles on every call; 2 minutes without a call (a healthy watch) start it over."""

    def __init__(
        self,
        initial: float = 0.8,
        cap: float = 30.0,
        factor: float = 2.0,
        reset_after: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.initial, self.cap, self.factor, self.reset_after = initial, cap, factor, reset_after
        self.clock = clock
        self._current = 0.0
        self._last = -1e18

    def next(self) -> float:
        now = self.clock()
        if now - self._last > self.reset_after:
            self._current = 0.0
        self._last = now
        self._current = self.initial if self._current == 0 else min(self._current * self.factor, self.cap)
        # jitter factor 1.0 as in client-go: uniform in [d, 2d), then capped
        return min(self._current * (1 + random.random()), self.cap)
