"""InformerStats: the counters of one informer, read by the metrics, the manager and the benchmarks.

Invariants:
- only the informer's own parts write them, on the event loop; readers on other threads (a
  metrics scrape) see each counter whole, never a torn value;
- the counters only grow; ``last_error`` is "" once a list or a watch works again.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["InformerStats"]


@dataclass(slots=True)
class InformerStats:
    """What one informer did and saw."""

    #: completed syncs (1 + relists), streaming or paginated
    lists: int = 0
    #: how the last sync was done: "stream" or "paged"
    last_sync_mode: str = ""
    #: the last failure of a list or watch request, "" once one works again
    last_error: str = ""
    #: object events (not bookmarks) received on watch streams after their sync, before any
    #: client-side filtering: what the apiserver sent this informer
    events_received: int = 0
    #: objects received by syncs (LIST items, initial events of a streaming list)
    objects_listed: int = 0
    #: objects and events dropped by the shard filter
    dropped: int = 0
    #: objects that left the store because their shard range was released
    released: int = 0
