"""Collector: when CPython's cyclic garbage collector may run while declop holds large trees.

A full pass of the cyclic collector walks every tracked container of the process while holding
the interpreter, long with millions of objects, during which the event loop (Lease renewals,
probes, admissions) stands still. An informer's sync builds a large acyclic tree (a whole list)
and a pass that walks it buys nothing: reference counting frees it. So a sync pauses the
collector around that work, through one counter shared by every user. (A large webhook request
does not: under a steady stream of them a pause would never end; docs/webhooks.md.)

- :func:`pause` / :func:`resume` (or :func:`paused`) nest: the collector runs again when the
  last pause ends, and only if it was enabled when the first began;
- :func:`freeze` keeps what survived a sync out of later full passes;
- :func:`thaw` gives every frozen object back to the collector, for a process that runs managers
  one after another (the simulator's seeds, a test suite's runners);
- :func:`started` / :func:`ended` count the managers running in the process (``Manager.run``
  calls them); the last to end thaws, so a stopped manager's graph is freed once nothing runs;
- :func:`retrieved`, a done-callback for a future given up on (a timed-out probe, a shutdown
  step, a sync wait): its outcome is read, so the collector never reports it as "exception was
  never retrieved" with a traceback on stderr, outside the structured log.

Invariants:
- pauses are counted process-wide, from any thread (under a lock), so one user's resume never
  re-enables the collector under another's pause; a collector disabled by the application before the first pause stays
  disabled;
- allocations made while paused that are freed before the resume never enter a pass (CPython
  counts a freed container out of the youngest generation);
- :func:`freeze` collects first, so a cycle that became garbage while paused is freed, never
  pinned;
- :func:`pause` and :func:`resume` cost the same with a million frozen objects as with none:
  nothing they call walks the permanent generation;
- while any manager runs, nothing it froze is thawed by another's end (its cache stays out of
  full passes); when none runs, nothing stays frozen on their account.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Any, Iterator

__all__ = ["ended", "freeze", "pause", "paused", "resume", "retrieved", "started", "thaw"]

_pauses = 0
_was_enabled = True
#: Whether this module froze anything yet. A flag, not ``gc.get_freeze_count()``: that walks the
#: whole permanent generation (long with 100k cached objects), and ``pause`` runs on the event
#: loop before every big emission.
_froze = False
_lock = threading.Lock()
#: managers running in this process (:func:`started` minus :func:`ended`)
_running = 0


def pause() -> None:
    """Disable the cyclic GC until the matching :func:`resume` (counted across users).

    The first pause of a process in which declop froze nothing yet freezes the start-up heap (modules, the
    client): once, so that the collection before every later :func:`freeze` walks only what was
    allocated since. Without collecting it first: that full pass would cost every start more than the
    few unreachable import leftovers it finds, which stay, once."""
    global _pauses, _was_enabled, _froze
    with _lock:
        if _pauses == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
            if not _froze:
                gc.freeze()
                _froze = True
        _pauses += 1


def resume() -> None:
    """End one :func:`pause`; the last one re-enables the collector if it was enabled."""
    global _pauses
    with _lock:
        _pauses -= 1
        if _pauses == 0 and _was_enabled:
            gc.enable()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """:func:`pause` for the block."""
    pause()
    try:
        yield
    finally:
        resume()


def freeze() -> None:
    """Keep what survived a sync out of the cyclic collector's future full passes (seconds at
    100k objects). Collect first: ``gc.freeze()`` moves *every* tracked object to the permanent
    generation, so a cycle that became garbage while the collector was paused would otherwise
    never be freed. Frozen objects are never walked again, so this full collection costs what
    was allocated since the previous freeze, not the heap. A sync calls it after every page or
    chunk of objects, a short pause each, never once over the whole list (one long pause at
    100k; bench/FINDINGS.md). Called with the GC paused: no automatic pass walks the new objects
    first."""
    global _froze
    gc.collect()
    gc.freeze()
    _froze = True


def thaw() -> None:
    """Give every frozen object back to the cyclic collector.

    A freeze pins every container alive at that moment, and a cycle among them that dies later
    is never freed while it stays frozen: after a manager stops, its whole graph (loop, tasks,
    informers, caches) is such a cycle. A process that runs one manager until it exits loses
    nothing; one that runs many in turn (the simulator runs a world per seed) keeps every one of
    them until it thaws. The cost is one full pass: the next :func:`freeze` collects first (the
    flag stays set, so the next :func:`pause` does not freeze the heap uncollected)."""
    gc.unfreeze()


def started() -> None:
    """A manager begins a run: from now on its syncs may freeze what is alive."""
    global _running
    with _lock:
        _running += 1


def ended() -> None:
    """A manager's run ended. The last one running thaws: a process that runs managers in turn
    (a test suite's ``OperatorRunner`` per test, an application restarting its embedded
    operator) otherwise keeps every stopped manager's graph frozen — some 1,000 objects a run
    with a 300-object cache, measured, growing with the cache. Thawing is cheap (the objects
    move back to the oldest generation); the next sync's :func:`freeze` pays one full pass."""
    global _running
    with _lock:
        _running -= 1
        last = _running == 0
    if last:
        thaw()


def retrieved(future: Any) -> None:
    """Read the outcome of a done ``asyncio`` future nobody will await any more (use it as its
    done-callback): when it is freed, the collector has nothing to report."""
    if not future.cancelled():
        future.exception()
