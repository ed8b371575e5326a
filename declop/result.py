"""Result and Phase: what a handler returns and which lifecycle phase it is told about.

The outcome table (implemented once, in ``Controller._settle``):

=====================================  ==================================================
the handler…                            the queue…
=====================================  ==================================================
returns ``None`` or ``Result()``        forgets the key's failures; done until the next event
returns ``Result(requeue_after=s)``     forgets failures, re-adds the key after ``s`` seconds
raises any exception                    logs it with traceback, re-adds with per-key backoff
raises ``TerminalError``                logs and counts it, does not retry
=====================================  ==================================================

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
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["Phase", "Result", "phase_of"]


@dataclass(frozen=True, slots=True)
class Result:
    """A successful reconcile. ``requeue_after`` (seconds) asks for another look later."""

    requeue_after: float | None = None

    def __post_init__(self) -> None:
        if self.requeue_after is not None and self.requeue_after < 0:
            raise ValueError(f"requeue_after must be >= 0, got {self.requeue_after}")


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
