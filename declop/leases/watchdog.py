"""Watchdog: after a lost Lease the process is gone within :data:`EXIT_BOUND` s, whatever runs.

Once a replica has lost a Lease (its leader Lease, or a range Lease while a call of the range
ran) the process must be gone before another replica may take the Lease over (I5). The manager's
clean-up after a loss is bounded step by step, but some waits are not the manager's
(docs/leases.md lists them). :meth:`Watchdog.arm` is called at the moment the loss is detected;
``bound`` seconds later (minus :data:`MARGIN`, the time the exit itself takes) a daemon thread
writes one line to stderr and ends the process with ``os._exit`` — unless it ended first.

Invariants:

- the bound counts from the first :meth:`Watchdog.arm`; later calls change nothing;
- it fires at most once, and never before ``bound - MARGIN`` seconds after the arm;
- its timer is a daemon thread: it never delays an exit that comes first;
- the timer and what firing does are injectable (the simulator arms the same watchdog on
  virtual time, and kills a simulated replica instead of the process).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

__all__ = ["EXIT_BOUND", "MARGIN", "Watchdog"]

#: seconds from a detected loss to the process being gone, at most
EXIT_BOUND = 2.0
#: seconds kept for the exit itself (one write, ``os._exit``)
MARGIN = 0.25


def _thread_timer(seconds: float, fn: Callable[[], None]) -> Any:
    timer = threading.Timer(seconds, fn)
    timer.daemon = True
    timer.name = "declop-watchdog"
    timer.start()
    return timer


def _hard_exit(code: int, line: str) -> Callable[[], None]:
    def fire() -> None:
        try:
            os.write(2, line.encode())  # not through logging: its locks may be held by a stuck thread
        finally:
            os._exit(code)

    return fire


class Watchdog:
    """Ends the process ``bound`` seconds after :meth:`arm` (see the module docstring)."""

    def __init__(
        self,
        bound: float = EXIT_BOUND,
        *,
        code: int = 1,
        fire: Callable[[], None] | None = None,
        timer: Callable[[float, Callable[[], None]], Any] = _thread_timer,
    ) -> None:
        self.bound = bound
        self._fire = fire or _hard_exit(
            code, f"declop: error: still running {bound:g} s after the Lease was lost; exiting now (exit code {code})\n"
        )
        self._timer = timer
        self.armed = False
        self.fired = False

    def arm(self) -> None:
        """The loss was detected now: fire ``bound - MARGIN`` seconds from now (once)."""
        if self.armed:
            return
        self.armed = True
        self._timer(max(0.0, self.bound - MARGIN), self._go)

    def _go(self) -> None:
        if not self.fired:
            self.fired = True
            self._fire()
