"""An injectable monotonic clock, so time-driven code is tested without sleeping.

``Clock`` is any zero-argument callable returning seconds; ``MONOTONIC`` is the real one and
:class:`FakeClock` only moves when told to.

``LEASE_CLOCK`` is what Lease fencing measures with (leader election and shard Leases):
``CLOCK_BOOTTIME`` where the platform has it (Linux), else ``MONOTONIC``. Both ignore changes of
the wall clock (NTP steps, an operator setting the date); only BOOTTIME also counts the time the
machine was suspended (a laptop lid, a VM paused and resumed). With CLOCK_MONOTONIC a replica
suspended for a minute would wake up believing its Lease renewed a moment ago and start
reconciles in ranges others took meanwhile; with BOOTTIME the minute has passed and its fences
are closed before it does anything. A process stopped with SIGSTOP sees both clocks advance.

``WALL_CLOCK`` (``time.time``) is the wall clock, for timestamps written for humans and other
programs (a Lease's ``renewTime``); nothing decides from it. It is injectable too, so the
simulator (:mod:`declop.testing.simulation.leases`) can make every clock a replica reads virtual.
"""

from __future__ import annotations

import functools
import time
from typing import Callable

__all__ = ["LEASE_CLOCK", "MONOTONIC", "WALL_CLOCK", "Clock", "FakeClock"]

Clock = Callable[[], float]
MONOTONIC: Clock = time.monotonic
#: seconds since the epoch, for timestamps only (see the module docstring)
WALL_CLOCK: Clock = time.time


#: monotonic, and counting suspended time where the platform can (see the module docstring);
#: a partial, not a def: every fenced write reads it (``bench/fence_check.py``), and a Python
#: wrapper more than doubled the cost of a read
LEASE_CLOCK: Clock = (
    functools.partial(time.clock_gettime, time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else MONOTONIC
)


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
