"""What a work queue reports: the metrics callbacks it calls on every operation, and the
statistics snapshot it gives on demand.

Rules: the callbacks run synchronously on the queue's hot path, so they must be cheap and never
raise; :data:`NO_METRICS`, the default, records nothing; a :class:`QueueStatistics` is immutable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["NO_METRICS", "QueueMetrics", "QueueStatistics"]


class QueueMetrics(Protocol):
    """Callbacks for the workqueue metrics (client-go ``queueMetrics``); ``name`` is the queue's.

    ``added`` is called for non-duplicate adds only; ``got`` with the seconds the item waited in
    the ready queue; ``done`` with the seconds the worker held it; ``retried`` for every
    ``add_after``/``add_rate_limited`` accepted before shutdown (also with a zero delay, as
    client-go). Callbacks run synchronously on the hot path and must be cheap and never raise.
    """

    def added(self, name: str) -> None: ...

    def got(self, name: str, queued_seconds: float) -> None: ...

    def done(self, name: str, work_seconds: float) -> None: ...

    def retried(self, name: str) -> None: ...


class _NoMetrics:
    """The default :class:`QueueMetrics`: records nothing."""

    __slots__ = ()

    def added(self, name: str) -> None:
        return None

    def got(self, name: str, queued_seconds: float) -> None:
        return None

    def done(self, name: str, work_seconds: float) -> None:
        return None

    def retried(self, name: str) -> None:
        return None

    def __repr__(self) -> str:
        return "NO_METRICS"


NO_METRICS: QueueMetrics = _NoMetrics()


@dataclass(frozen=True, slots=True)
class QueueStatistics:
    """A point-in-time snapshot of one queue.

    ``depth`` ready items; ``processing`` items held by workers; ``waiting`` items in the delayed
    heap; ``adds`` non-duplicate adds and ``retries`` accepted ``add_after`` calls since creation;
    ``longest_running`` seconds the oldest in-flight item has been held (0 if none);
    ``unfinished_work`` the sum of all in-flight ages ("large values indicate stuck workers").
    """

    name: str
    depth: int
    processing: int
    waiting: int
    adds: int
    retries: int
    shutting_down: bool
    longest_running: float
    unfinished_work: float
