"""Status conditions: set, get and remove entries of a ``status.conditions`` list.

The Kubernetes convention (``metav1.Condition``), with the semantics of apimachinery's
``meta.SetStatusCondition`` / ``FindStatusCondition`` / ``RemoveStatusCondition`` /
``IsStatusConditionTrue``, on plain dicts or on a typed status. Read the names with the
module's: ``declop.conditions.set(...)``, ``declop.conditions.is_true(...)``.

    status = declop.clone(obj.get("status") or {})
    declop.conditions.set(status, "Ready", True,
                          reason="Available", message="3/3 replicas ready",
                          observed_generation=obj["metadata"]["generation"])
    if status != (obj.get("status") or {}):
        client.patch_status(request, {"status": status})

What the functions take, as ``conditions``:

- the list itself (of dicts, or of condition models: changed in place);
- a status dict: its ``conditions`` list (created by :func:`set` when missing);
- a typed status — a pydantic model with a ``conditions`` field (``list[declop.Condition]``, or a
  list of any condition model): :func:`set` and :func:`remove` work on the JSON form of its
  entries and, when something changed, **assign** the new list back (entries of the field's
  item class), so the field counts as set and a typed ``client.patch_status(request, status)``
  sends it. The readers return the model's own entry.

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

Nothing here talks to the apiserver; the functions change only the list (or status) they are
given. pydantic is never imported here: a typed status exists only once it is loaded.
"""

from __future__ import annotations

import datetime
import re
import typing
from typing import Any, Callable, Iterable, Mapping, MutableMapping, MutableSequence

from declop.typed.dump import as_json, is_model

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
    conditions: Any,
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

    ``conditions`` is the list, a status dict or a typed status (see the module's docstring: a
    typed status gets its changed list assigned back). ``status`` is ``"True"``, ``"False"``,
    ``"Unknown"`` or a bool. ``observed_generation`` is the ``metadata.generation`` the
    condition describes (None, or 0, leaves it out).

    Raises:
        TypeError: ``conditions`` is none of those (``None``: pass the status, or
            ``status.setdefault("conditions", [])``).
        ValueError: a type, status, reason, message or generation the apiserver would refuse.
    """
    new_status = _status(status)
    _check(type, reason, message, observed_generation)
    entries, put_back = _editable(conditions)
    changed = _set(entries, type, new_status, reason, message, _generation(observed_generation), last_transition_time)
    if changed and put_back is not None:
        put_back(entries)
    return changed


def _set(
    conditions: MutableSequence[Condition],
    type: str,  # noqa: A002
    new_status: str,
    reason: str,
    message: str,
    generation: int | None,
    last_transition_time: datetime.datetime | str | None,
) -> bool:
    """:func:`set` on a list of dicts, its arguments checked."""
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


def get(conditions: Any, type: str) -> Any:  # noqa: A002
    """The condition of this ``type`` (the entry in the list itself — a dict, or the model of
    a typed status — not a copy), or None.

    ``conditions`` is the list, a status dict or a typed status, and may be None (an object
    with no status yet): ``get(obj.get("status"), "Ready")``, ``get(obj.status, "Ready")``.
    """
    for condition in _entries(conditions):
        if _field(condition, "type") == type:
            return condition
    return None


def remove(conditions: Any, type: str) -> bool:  # noqa: A002
    """Remove every condition of this ``type`` (in place, or assigned back to a typed status);
    True if one was there."""
    entries, put_back = _editable(conditions)
    keep = [c for c in entries if _field(c, "type") != type]
    if len(keep) == len(entries):
        return False
    entries[:] = keep
    if put_back is not None:
        put_back(entries)
    return True


def is_status(conditions: Any, type: str, status: str | bool) -> bool:  # noqa: A002
    """True when the condition ``type`` is present and its status is ``status``."""
    condition = get(conditions, type)
    return condition is not None and _field(condition, "status") == _status(status)


def is_true(conditions: Any, type: str) -> bool:  # noqa: A002
    """True when the condition ``type`` is present with status ``"True"``."""
    return is_status(conditions, type, "True")


def is_false(conditions: Any, type: str) -> bool:  # noqa: A002
    """True when the condition ``type`` is present with status ``"False"``."""
    return is_status(conditions, type, "False")


# -- what the functions take: a list, a status dict, a typed status ---------------------------


def _field(condition: Any, name: str) -> Any:
    """One field of an entry: a dict's key, a model's attribute (an enum read as its value)."""
    if isinstance(condition, Mapping):
        return condition.get(name)
    value = getattr(condition, name, None)
    return getattr(value, "value", value)


def _entries(conditions: Any) -> Iterable[Any]:
    """The entries to read, whatever form ``conditions`` comes in."""
    if conditions is None:
        return ()
    if is_model(conditions):
        return _typed_list(conditions) or ()
    if isinstance(conditions, Mapping):
        return conditions.get("conditions") or ()
    return conditions  # type: ignore[no-any-return]


def _typed_list(status: Any) -> Any:
    if "conditions" not in type(status).model_fields:
        raise TypeError(
            f"{type(status).__name__} has no conditions field; pass the status model that has one "
            "(conditions: list[declop.Condition])"
        )
    return status.conditions


def _editable(conditions: Any) -> tuple[MutableSequence[Condition], Callable[[list[Any]], None] | None]:
    """The list of dicts to change, and what puts it back where it came from (None: it is the
    list itself, changed in place)."""
    if is_model(conditions):
        status = conditions
        entries = [dict(as_json(c)) for c in _typed_list(status) or ()]
        item = _item_class(type(status))

        def assign(changed: list[Any]) -> None:
            status.conditions = [_rebuilt(item, c) for c in changed]  # assigned: the field is set

        return entries, assign
    if isinstance(conditions, MutableMapping):
        if conditions.get("conditions") is None:
            conditions["conditions"] = []
        conditions = conditions["conditions"]
    if not isinstance(conditions, MutableSequence):
        raise TypeError(
            f"conditions must be the list to change or the status that holds it, not {_type_name(conditions)}; "
            "pass the status (obj.status, or status.setdefault('conditions', []) for a dict)"
        )
    models = [type(c) for c in conditions if is_model(c)]
    if not models:
        return conditions, None
    given = conditions
    entries = [dict(as_json(c)) for c in given]

    def replace(changed: list[Any]) -> None:
        given[:] = [_rebuilt(models[0], c) for c in changed]

    return entries, replace


def _rebuilt(item: Any, entry: Condition) -> Any:
    return entry if item is None else item.model_validate(entry)


def _item_class(model: Any) -> Any:
    """The model class of the entries of ``model``'s ``conditions`` field (``list[Condition]``,
    ``Annotated[...]``, ``... | None``), or None when they are dicts."""
    tp = model.model_fields["conditions"].annotation
    for _ in range(8):
        origin = typing.get_origin(tp)
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if origin is None or not args:
            break
        tp = args[0]
    return tp if isinstance(tp, type) and hasattr(tp, "model_validate") else None
