"""Status conditions: set, get and remove entries of a ``status.conditions`` list.

The Kubernetes convention (``metav1.Condition``), with the semantics of apimachinery's
``meta.SetStatusCondition`` / ``FindStatusCondition`` / ``RemoveStatusCondition`` /
``IsStatusConditionTrue``, on plain dicts — raw JSON objects are declop's model. Read the
names with the module's: ``declop.conditions.set(...)``, ``declop.conditions.is_true(...)``.

    status = declop.clone(obj.get("status") or {})
    declop.conditions.set(status.setdefault("conditions", []), "Ready", True,
                          reason="Available", message="3/3 replicas ready",
                          observed_generation=obj["metadata"]["generation"])
    if status != (obj.get("status") or {}):
        client.patch_status(request, {"status": status})

Invariants:

- one entry per ``type``; :func:`set` updates it in place or appends it, and keeps the order
  and any other entry untouched (fields it does not know are kept too);
- ``lastTransitionTime`` changes **only when** ``status`` **changes** (or is missing): it says
  since when the condition has had its status, so an unchanged reconcile leaves the list equal
  and the caller can skip the status write — :func:`set` returns whether anything changed;
- every other field is replaced by what is given: ``reason``, ``message`` and
  ``observedGeneration`` (left out: removed, as apimachinery's zero value is omitted);
- timestamps are RFC 3339 in UTC with seconds precision (``2026-05-01T12:00:00Z``), as
  ``metav1.Time`` writes them;
- a status, reason, type or generation the apiserver's validation of ``metav1.Condition``
  would refuse raises ``ValueError`` here, before any request, with one line saying which.

Nothing here talks to the apiserver; the functions change only the list they are given.
"""

from __future__ import annotations

import datetime
import re
from typing import Any, Iterable, Mapping, MutableSequence

__all__ = ["get", "is_false", "is_status", "is_true", "remove", "set", "timestamp"]

Condition = dict[str, Any]

#: the three values of ``metav1.ConditionStatus``
STATUSES = ("True", "False", "Unknown")
# metav1.Condition's validation: reason is CamelCase-ish, type a qualified name
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_REASON_MAX = 1024
_MESSAGE_MAX = 32768
_TYPE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"
)
_TYPE_MAX = 316


def timestamp(when: datetime.datetime | str | None = None) -> str:
    """``when`` (default: now) as ``metav1.Time`` writes it: RFC 3339, UTC, whole seconds.

    A string is parsed (``2026-05-01T14:00:00+02:00`` → ``2026-05-01T12:00:00Z``), so a bad one
    fails here rather than at the apiserver. A naive datetime is refused: its zone is unknown.
    """
    if when is None:
        when = datetime.datetime.now(datetime.timezone.utc)
    elif isinstance(when, str):
        try:
            when = datetime.datetime.fromisoformat(when)
        except ValueError:
            raise ValueError(
                f"lastTransitionTime {when!r} is not an RFC 3339 time; write it like 2026-05-01T12:00:00Z"
            ) from None
    if not isinstance(when, datetime.datetime):
        raise TypeError(f"a time must be a datetime or an RFC 3339 string, not {type(when).__name__}")
    if when.tzinfo is None:
        raise ValueError(
            f"the datetime {when.isoformat()} has no time zone; use an aware one, e.g. "
            "datetime.now(timezone.utc)"
        )
    return when.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _type_name(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _status(status: str | bool) -> str:
    if status is True or status is False:
        return "True" if status else "False"
    if status not in STATUSES:
        raise ValueError(f"condition status {status!r} is not one of True, False, Unknown (or a bool)")
    return str(status)


def _check(type: str, reason: str, message: str, observed_generation: int | None) -> None:
    if not isinstance(type, str) or len(type) > _TYPE_MAX or not _TYPE.match(type):
        raise ValueError(
            f"condition type {type!r} is not a valid type; use a CamelCase word such as 'Ready' "
            "(optionally prefixed by a DNS subdomain and '/')"
        )
    if not isinstance(reason, str) or len(reason) > _REASON_MAX or not _REASON.match(reason):
        raise ValueError(
            f"condition reason {reason!r} is not valid; use a CamelCase word such as 'Available' "
            "(letters, digits, '_', ',' or ':'; starting with a letter; required)"
        )
    if not isinstance(message, str) or len(message) > _MESSAGE_MAX:
        raise ValueError(f"condition message must be a string of at most {_MESSAGE_MAX} characters")
    if observed_generation is not None and (
        isinstance(observed_generation, bool) or not isinstance(observed_generation, int) or observed_generation < 0
    ):
        raise ValueError(
            f"observed_generation {observed_generation!r} must be an int >= 0: "
            "pass obj['metadata']['generation']"
        )


def _generation(value: Any) -> Any:
    """``observedGeneration`` as apimachinery compares it: absent, null and 0 are the same."""
    return value or None


def set(  # noqa: A001 - read as declop.conditions.set
    conditions: MutableSequence[Condition],
    type: str,  # noqa: A002 - the field's name
    status: str | bool,
    *,
    reason: str,
    message: str = "",
    observed_generation: int | None = None,
    last_transition_time: datetime.datetime | str | None = None,
) -> bool:
    """Set the condition ``type`` in ``conditions`` (in place); True if the list changed.

    - Absent: appended with ``lastTransitionTime`` = ``last_transition_time`` or now.
    - Present: ``status``, ``reason``, ``message`` and ``observedGeneration`` are replaced;
      ``lastTransitionTime`` moves (to ``last_transition_time`` or now) only when ``status``
      changes — or when the entry has none. Fields not listed here are kept.

    ``status`` is ``"True"``, ``"False"``, ``"Unknown"`` or a bool. ``observed_generation`` is
    the ``metadata.generation`` the condition describes (None, or 0, leaves it out).

    Raises:
        TypeError: ``conditions`` is not a list (``None``: pass ``status.setdefault("conditions", [])``).
        ValueError: a type, status, reason, message or generation the apiserver would refuse.
    """
    if not isinstance(conditions, MutableSequence):
        raise TypeError(
            f"conditions must be the list to change, not {_type_name(conditions)}; "
            "pass status.setdefault('conditions', [])"
        )
    new_status = _status(status)
    _check(type, reason, message, observed_generation)
    generation = _generation(observed_generation)
    existing = get(conditions, type)
    if existing is None:
        condition: Condition = {
            "type": type,
            "status": new_status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": timestamp(last_transition_time),
        }
        if generation is not None:
            condition["observedGeneration"] = generation
        conditions.append(condition)
        return True

    changed = False
    if existing.get("status") != new_status or not existing.get("lastTransitionTime"):
        existing["status"] = new_status
        existing["lastTransitionTime"] = timestamp(last_transition_time)
        changed = True
    for field, value in (("reason", reason), ("message", message)):
        if existing.get(field) != value:
            existing[field] = value
            changed = True
    if _generation(existing.get("observedGeneration")) != generation:
        changed = True
        if generation is None:
            existing.pop("observedGeneration", None)
        else:
            existing["observedGeneration"] = generation
    return changed


def get(conditions: Iterable[Mapping[str, Any]] | None, type: str) -> Any:  # noqa: A002
    """The condition of this ``type`` (the dict in the list itself, not a copy), or None.

    ``conditions`` may be None (an object with no status yet): ``get((obj.get("status") or
    {}).get("conditions"), "Ready")``.
    """
    for condition in conditions or ():
        if condition.get("type") == type:
            return condition
    return None


def remove(conditions: MutableSequence[Condition], type: str) -> bool:  # noqa: A002
    """Remove every condition of this ``type`` (in place); True if one was there."""
    keep = [c for c in conditions if c.get("type") != type]
    if len(keep) == len(conditions):
        return False
    conditions[:] = keep
    return True


def is_status(conditions: Iterable[Mapping[str, Any]] | None, type: str, status: str | bool) -> bool:  # noqa: A002
    """True when the condition ``type`` is present and its status is ``status``."""
    condition = get(conditions, type)
    return condition is not None and condition.get("status") == _status(status)


def is_true(conditions: Iterable[Mapping[str, Any]] | None, type: str) -> bool:  # noqa: A002
    """True when the condition ``type`` is present with status ``"True"``."""
    return is_status(conditions, type, "True")


def is_false(conditions: Iterable[Mapping[str, Any]] | None, type: str) -> bool:  # noqa: A002
    """True when the condition ``type`` is present with status ``"False"``."""
    return is_status(conditions, type, "False")
