"""Trigger: why a reconcile ran — the provenance of its key since the previous run.

Every time a source puts a key on a controller's queue, the controller notes *which* source did
it in that key's :class:`Trace`; a worker taking the key takes the trace with it and freezes it
into a :class:`Trigger`. So a reconcile knows every reason since the last run of its key, however
many were coalesced into it by the queue's deduplication.

Source names (also the ``source`` label of ``declop_reconcile_triggers_total``; the set is
bounded, names of objects go into :attr:`Trigger.details` instead):

- ``created``, ``updated``, ``deleted`` — a watch event of the primary resource;
- ``initial-list``, ``relist`` — the primary's object was (re)listed by its informer;
- ``owns:<Kind>`` — an owned child changed (detail: ``<Kind> <namespace>/<name>``);
- ``watches:<resource>`` — a watched object mapped to this key (detail: the map function and
  the object);
- ``left-filter`` — with ``labels=``/``fields=``: the object left the filter, and an unfiltered
  cache the handler then reads it from saw the change
  (:meth:`~declop.reconcile.controller.Controller.unfiltered_subscriber`);
- ``finalizer`` — the finalizer protocol needs the key (deletion started, our finalizer removed);
- ``requeue_after`` — the previous run returned ``Result(requeue_after=...)``;
- ``retry`` — the previous run failed (detail: the error's type) and was retried with backoff.

Invariants:
- a trace is only ever touched on the event loop; noting costs a few dict operations and never
  reads a clock, builds a string or copies an object (the hot path is one note per event);
- a :class:`Trigger` is immutable and holds no object contents — names, counts and
  resourceVersions only — so it is safe to log;
- triggers are for logging and debugging. A handler must stay level-triggered: the same state
  must lead to the same actions whatever the trigger says.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["MAX_DETAILS", "NO_TRIGGER", "Trace", "Trigger"]

#: at most this many distinct details are kept per reconcile (the rest are counted in sources)
MAX_DETAILS = 8


class Trigger(NamedTuple):
    """Why one reconcile ran (read-only; a NamedTuple: made once per reconcile, it must be cheap).

    ``sources`` pairs each source name with the number of its events since the previous run,
    in the order first seen; ``events`` is their sum (how many were coalesced into this run);
    ``details`` names the objects and errors behind them (at most :data:`MAX_DETAILS`);
    ``resource_versions`` the first and last resourceVersion of the primary object seen in
    those events (``None`` if no event carried one). Compare resourceVersions for equality only.
    """

    sources: tuple[tuple[str, int], ...] = ()
    events: int = 0
    details: tuple[str, ...] = ()
    resource_versions: tuple[str, str] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The source names, in the order first seen."""
        return tuple(name for name, _ in self.sources)

    def __str__(self) -> str:
        """Compact: ``updated*100 owns:ConfigMap(ConfigMap ns/a) rv=1201..1400``."""
        parts = [name if count == 1 else f"{name}*{count}" for name, count in self.sources]
        if self.details:
            parts.append("(" + ", ".join(self.details) + ")")
        rvs = self.resource_versions
        if rvs is not None:
            parts.append(f"rv={rvs[0]}" if rvs[0] == rvs[1] else f"rv={rvs[0]}..{rvs[1]}")
        return " ".join(parts) or "none"


_new = tuple.__new__

#: the trigger of a reconcile with no recorded cause (unit tests that call a handler directly)
NO_TRIGGER = Trigger()


class Trace:
    """The mutable accumulator behind a :class:`Trigger`: one per queued key."""

    __slots__ = ("details", "events", "first_rv", "last_rv", "sources")

    def __init__(self) -> None:
        self.sources: dict[str, int] = {}
        self.events = 0
        self.details: list[str] | None = None
        self.first_rv: str | None = None
        self.last_rv: str | None = None

    def note(self, source: str, rv: str | None = None, detail: str | None = None) -> None:
        """One more event from ``source`` (with the primary's resourceVersion, if any)."""
        self.events += 1
        sources = self.sources
        sources[source] = sources.get(source, 0) + 1
        if rv is not None:
            if self.first_rv is None:
                self.first_rv = rv
            self.last_rv = rv
        if detail is not None:
            self.add_detail(detail)

    def add_detail(self, detail: str) -> None:
        details = self.details
        if details is None:
            self.details = [detail]
        elif len(details) < MAX_DETAILS and detail not in details:
            details.append(detail)

    def merge(self, later: Trace) -> None:
        """Add ``later``'s events after this trace's (a given-back key meets new events)."""
        for source, count in later.sources.items():
            self.sources[source] = self.sources.get(source, 0) + count
        self.events += later.events
        for detail in later.details or ():
            self.add_detail(detail)
        if later.first_rv is not None:
            if self.first_rv is None:
                self.first_rv = later.first_rv
            self.last_rv = later.last_rv

    def freeze(self) -> Trigger:
        """The read-only :class:`Trigger` of this trace (once per reconcile: built directly with
        ``tuple.__new__``, a third cheaper than the NamedTuple's own constructor)."""
        first = self.first_rv
        rvs = None if first is None else (first, self.last_rv or first)
        details = tuple(self.details) if self.details else ()
        return _new(Trigger, (tuple(self.sources.items()), self.events, details, rvs))
