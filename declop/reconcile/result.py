"""Result and Phase: what a handler returns and which lifecycle phase it is told about.

What the queue does with each outcome is the outcome table: :class:`~declop.reconcile._outcome.Verdict`
and its queue operations, documented in docs/contract.md §3.

The phase is deduced from the cached object's state only, never from the event type:

===============================================  =============
state in the cache                               phase
===============================================  =============
no such object                                   ``DELETED``
``metadata.deletionTimestamp`` set               ``DELETING``
the controller's finalizer is not on the object  ``CREATED``
otherwise                                        ``UPDATED``
===============================================  =============
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Mapping

from declop.errors import InvalidResult

__all__ = ["Phase", "Result", "describe", "phase_of"]


@dataclass(frozen=True, slots=True)
class Result:
    """A successful reconcile. ``requeue_after`` (seconds) asks for another look later.

    - ``None`` (the default) or ``0``: plain success, no requeue — as controller-runtime's
      ``RequeueAfter: 0``. ``0`` never means "again at once": that would be a hot loop.
    - ``s > 0``: the key is re-added after ``s`` seconds (earlier events still run it sooner).
    - negative, NaN, infinite or not a number: :class:`~declop.errors.InvalidResult` here, when
      the handler builds the Result (it is a ``ValueError`` or ``TypeError`` too). It is terminal:
      logged once with what to return instead, not retried — the handler's side effects would
      repeat and the same line would fail again. (controller-runtime silently treats a negative
      duration as success.) For a computed deadline, do the overdue work now and return the
      next delay, or use ``max(s, 1)``.
    """

    requeue_after: float | None = None

    def __post_init__(self) -> None:
        s = self.requeue_after
        if s is None:
            return
        if isinstance(s, bool) or not isinstance(s, (int, float)):
            raise InvalidResult(
                f"requeue_after must be a number of seconds or None, got {describe(s)}; "
                "e.g. Result(requeue_after=30) or Result(requeue_after=float(text))"
            )
        if not 0 <= s < math.inf:  # also NaN
            raise InvalidResult(
                f"requeue_after must be a finite number of seconds >= 0, got {s!r}; "
                "return Result() for no requeue, or a positive delay such as max(seconds, 1)"
            )


class Phase(enum.Enum):
    """Where the object is in its life, as far as the cache shows."""

    CREATED = "created"
    UPDATED = "updated"
    DELETING = "deleting"
    DELETED = "deleted"

    def __repr__(self) -> str:
        return f"Phase.{self.name}"


def phase_of(obj: Mapping[str, Any] | None, finalizer: str | None) -> Phase:
    """The phase table above. Without a ``finalizer`` there is no ``CREATED``: it reads ``UPDATED``."""
    if obj is None:
        return Phase.DELETED
    meta = obj.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return Phase.DELETING
    if finalizer is not None and finalizer not in (meta.get("finalizers") or ()):
        return Phase.CREATED
    return Phase.UPDATED


def describe(value: Any) -> str:
    """A value for an error message without its contents: numbers, ``None`` and short
    single-line strings are shown; anything else by its type only (a dict with a ``kind`` and
    ``metadata.name`` as ``a Secret object ns/name``) — a handler's return value may be a Secret."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 20 and value.isprintable() else f"a str of {len(value)} characters"
    if isinstance(value, Mapping):
        kind = value.get("kind")
        meta = value.get("metadata")
        if isinstance(kind, str) and isinstance(meta, Mapping):
            ns, name = meta.get("namespace"), meta.get("name")
            key = f"{ns}/{name}" if ns else f"{name}"
            return f"a {kind} object {key} (contents not shown)"
    return f"a {type(value).__name__} (contents not shown)"
