"""The history of each object in a world run: what a failing seed's report shows of the object
its first violation is about.

A world run (:mod:`declop.testing.simulation.world`) notes, per object (its ``namespace/name``), the
workload's changes to it (created, updated, deleted), each handler call of it (start, with its
phase and resourceVersion, and end, with its outcome) and each write such a call sent (verb,
target, whether it changed anything, or the 409/429/5xx it was answered). :meth:`History.about`
finds the object a violation is about — the first ``namespace/name`` its message names that has a
history — and :meth:`History.table` prints its last rows:

::

    the history of ns-c/w002 (its last 16 of 31 rows):
             t  by    handler     what
        97.502  r1#1  make_child  reconcile start (RECONCILING, rv 41), the idempotence check's
        97.514  r1#1  make_child  POST secrets ns-c/w002-vrizw: changed
        ...

Invariants:
- a row costs one tuple appended to a bounded ring per object (:data:`ROWS`): memory is bounded
  by the number of objects, and nothing is formatted until a report asks;
- rows of one object are in the order they happened (virtual time, then the loop's order);
- the rows are a record only: noting them changes nothing of the run (no draw, no await).
"""

from __future__ import annotations

import collections
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from declop.testing.simulation.leases import Violation

__all__ = ["ROWS", "History"]

#: rows kept per object (the last ones)
ROWS = 16
#: what a violation's message names an object by (``ns-a/w000``, ``default/my-thing``)
_KEY = re.compile(r"[a-z0-9][a-z0-9.-]*/[a-z0-9][a-z0-9.-]*")

Row = tuple[float, str, str, str]  # at, by (a replica, "admin", "-"), handler ("" for none), what


class History:
    """The last :data:`ROWS` rows of every object of a run, and how many there were."""

    __slots__ = ("rows", "_rings", "_counts")

    def __init__(self, rows: int = ROWS) -> None:
        self.rows = rows
        self._rings: dict[str, collections.deque[Row]] = {}
        self._counts: collections.Counter[str] = collections.Counter()

    def note(self, key: Any, at: float, by: str, handler: str, what: str) -> None:
        """One row of object ``key`` (a Request, or its ``namespace/name``)."""
        name = str(key)
        ring = self._rings.get(name)
        if ring is None:
            ring = self._rings[name] = collections.deque(maxlen=self.rows)
        ring.append((at, by, handler, what))
        self._counts[name] += 1

    def __contains__(self, key: object) -> bool:
        return str(key) in self._rings

    def about(self, violation: Violation) -> str | None:
        """The object ``violation`` is about: the first ``namespace/name`` its message names that
        has a history (an orphaned child's message names the child first, then its primary)."""
        for match in _KEY.finditer(violation.detail):
            if match[0] in self._rings:
                return match[0]
        return None

    def table(self, key: Any) -> tuple[str, ...]:
        """The rows of ``key`` as an aligned table, under a title line (() when it has none)."""
        name = str(key)
        ring = self._rings.get(name)
        if not ring:
            return ()
        total = self._counts[name]
        kept = f"its last {len(ring)} of {total} rows" if total > len(ring) else f"{total} row(s)"
        by_w = max(len("by"), *(len(r[1]) for r in ring))
        handler_w = max(len("handler"), *(len(r[2] or "-") for r in ring))
        lines = [
            f"the history of {name} ({kept}: the workload's changes, handler calls and their writes):",
            f"  {'t':>10}  {'by':<{by_w}}  {'handler':<{handler_w}}  what",
        ]
        lines += [f"  {at:>10.3f}  {by:<{by_w}}  {handler or '-':<{handler_w}}  {what}" for at, by, handler, what in ring]
        return tuple(lines)

    def report(self, violation: Violation) -> tuple[str, ...]:
        """The table of the object ``violation`` is about (() when it names none with a history)."""
        key = self.about(violation)
        return self.table(key) if key is not None else ()
