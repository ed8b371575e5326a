"""An injectable monotonic clock, so time-driven code is tested without sleeping.

``Clock`` is any zero-argument callable returning seconds; ``MONOTONIC`` is the real one and
:class:`FakeClock` only moves when told to.
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["MONOTONIC", "Clock", "FakeClock"]

Clock = Callable[[], float]
MONOTONIC: Clock = time.monotonic


class FakeClock:
    """A clock for tests: starts at ``start`` and moves only through :meth:`advance`."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self.now += seconds
