"""What a lost Lease does to the rest of the stop: one clean-up budget for every later step.

A Lease lost under a running call (the leader Lease, a range Lease, or one left to expire by a
stop) means another replica may take over: the process must be gone within
:data:`~declop.leases.watchdog.EXIT_BOUND`. From the loss on, every step of the stop shares
:data:`LOST_CLEANUP_SECONDS`, and :attr:`Loss.on_lost` (where ``declop run`` arms its
:class:`~declop.leases.watchdog.Watchdog`) is called once, at the loss. docs/contract.md says why.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, TypeVar

from declop import collector

__all__ = ["LOST_CLEANUP_SECONDS", "Loss"]

log = logging.getLogger("declop.manager")

T = TypeVar("T")

#: seconds the clean-up after a lost Lease may take in all (the process must be gone within
#: :data:`~declop.leases.watchdog.EXIT_BOUND`; the watchdog fires a margin before it)
LOST_CLEANUP_SECONDS = 1.5


class Loss:
    """Whether a Lease was lost, by when the clean-up must be over, and the bounded steps."""

    def __init__(self) -> None:
        #: called (synchronously, once) the moment a Lease is lost
        self.on_lost: Callable[[], None] | None = None
        #: loop time by which the clean-up after a loss must be over (None: no loss)
        self.by: float | None = None
        self._event = asyncio.Event()

    @property
    def happened(self) -> bool:
        return self.by is not None

    def declare(self) -> None:
        """A Lease was lost: start the budget and call :attr:`on_lost` (the first time only)."""
        if self.by is not None:
            return
        self.by = asyncio.get_running_loop().time() + LOST_CLEANUP_SECONDS
        self._event.set()
        if self.on_lost is not None:
            self.on_lost()

    def left(self) -> float:
        """Seconds left of the budget (0 when used up)."""
        assert self.by is not None
        return max(0.0, self.by - asyncio.get_running_loop().time())

    async def bounded(self, step: Awaitable[T], seconds: float, what: str) -> T | None:
        """Await one stop step for at most ``seconds`` (at least 50 ms) — and, once a Lease is
        lost (before or during the step), no later than the budget's end; return its result, or
        log and return None if it takes longer (the step is cancelled, and not waited for: it
        may ignore the cancellation)."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(step)
        end = loop.time() + max(seconds, 0.05)
        lost = None if self.by is not None else asyncio.ensure_future(self._event.wait())
        try:
            while not task.done():
                if self.by is not None:
                    end = min(end, self.by)
                left = end - loop.time()
                if left <= 0:
                    break
                await asyncio.wait([task] if lost is None or lost.done() else [task, lost], timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if lost is not None:
                lost.cancel()
            if not task.done():
                task.cancel()
                task.add_done_callback(collector.retrieved)
        if not task.done() or task.cancelled():
            log.warning("Shutdown step timed out; going on", extra={"kv": {"step": what, "seconds": round(max(seconds, 0.05), 3)}})
            return None
        return task.result()

