"""Status: the guarded JSON patch of a typed status write (``client.patch_status(request, s)``).

:func:`status_ops` turns the status model a handler passes (``s``) and the stored status it
*read* (the raw JSON of the object it was handed) into an RFC 6902 JSON patch of the object,
under ``/status``, sent to the status subresource.

The law: once the patch is applied, the stored status read back through the model
(``type(s).model_validate(stored.get("status") or {})``) equals ``s`` — except

* (a) a field the CRD's structural defaulting fills: a ``None`` sent to a field the CRD cannot
  hold ``null`` in (an ``Optional`` enum or ``Literal``: no ``nullable`` there) is pruned, or
  replaced by its ``default:``;
* (b) a field ``s`` leaves *unsaid*: one that is not in its model's ``model_fields_set`` (never
  passed to the constructor, read from the object or assigned) **and** whose value still equals
  its default. What is stored there stays (another writer's value, the CRD's default); absent,
  it reads as the default. A field changed in place (``status.conditions.append(...)``, or
  ``status.replicas.ready = 3`` on a sub-model that was not stored) is said.

Invariants:

* the patch holds only what differs, in the model's terms, between ``s`` and the read status
  validated through ``type(s)`` (``seen``): defaults, enums, datetimes, aliases and numbers are
  compared as the model holds them, so a value the apiserver stores in another spelling
  (``1`` for ``1.0``, ``+00:00`` for ``Z``, a default it filled in) does not look changed.
  ``[]`` — nothing to send — when nothing said differs;
* each changed path gets a ``test`` of the value the handler read there (``null`` for an absent
  key: the apiserver's ``test`` takes a missing key for ``null``) before its ``add`` or
  ``remove``. A path another writer changed since the read makes the apiserver refuse the whole
  patch (a bare 422, :func:`refused`), which the client raises as
  :class:`~declop.errors.Conflict`: the reconcile is retried on fresh state. A field only the
  other writer changed is not in the patch, so it stays;
* models are patched field by field where the read status has the object, and a ``dict[str, X]``
  key by key (a key removed is a ``remove``); a list, a scalar, or an object the read status
  lacked is written whole. A model written whole carries its said fields (the apiserver and
  Python fill in the rest); a list carries every field of its items;
* ``None``: a ``remove`` where the field's default is ``None`` (absent reads as ``None``), a
  stored ``null`` where the default is something else (the CRD marks it ``nullable``);
* the JSON form is the model's, by alias: enums by value, a naive ``datetime`` taken as UTC and
  sent with ``Z`` (the apiserver refuses a ``date-time`` without a zone), sets sorted; computed
  fields and ``Field(exclude=True)`` are never sent (the apiserver prunes the former: re-sending
  them would be a write on every reconcile); a model with its own serializers is written with
  them (``model_dump``);
* fields the model does not declare (and an ``extra="allow"`` model does not hold) are never
  touched.
"""

from __future__ import annotations

import decimal
import enum
import inspect
import math
import re
from datetime import datetime, timezone
from typing import Any, Mapping

import pydantic_core
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from declop.errors import ApiError
from declop.typed.model import CustomResource

__all__ = ["encode", "refused", "status_ops", "to_json"]


class _Absent:
    """A key the read status does not have (distinct from a stored ``null``)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()
_SCALARS = (str, int, float, bool, type(None))
_SERIALIZERS = ("PlainSerializer", "WrapSerializer")


def status_ops(status: BaseModel | None, read: Any) -> list[dict[str, Any]]:
    """The guarded JSON patch that makes the stored status say what ``status`` says.

    ``status`` is the status model, or a whole :class:`~declop.typed.model.CustomResource` (its
    ``status`` is taken; ``None`` says nothing). ``read`` is the stored status the handler read
    (raw JSON; ``None`` when the object had none). ``[]`` when nothing differs.
    """
    if isinstance(status, CustomResource):
        status = getattr(status, "status", None)
    if status is None:
        return []
    raw = read if isinstance(read, dict) else ABSENT
    try:
        seen: Any = type(status).model_validate(raw if raw is not ABSENT else {})
    except ValidationError:
        seen = ABSENT  # the read status does not fit the model (or it lacks required fields)
    if seen is not ABSENT and _eq(status, seen):
        return []  # the common case: one comparison (a difference only in spelling is found by the walk)
    tests: list[dict[str, Any]] = []
    changes: list[dict[str, Any]] = []
    _node(("status",), status, seen, raw, True, tests, changes)
    return tests + changes if changes else []


def refused(error: ApiError) -> bool:
    """``error`` is the apiserver refusing to apply a JSON patch — a ``test`` that failed, or a
    path that is gone — rather than the patched object failing validation: a bare 422 with no
    ``details.causes`` (the other writer got there first)."""
    if error.status != 422:
        return False
    body = error.body if isinstance(error.body, Mapping) else {}
    details = body.get("details") or {}
    return not details.get("causes") and not details.get("name")


def encode(ops: Any) -> bytes:
    """``ops`` as the JSON bytes Go's ``encoding/json`` would write for the same values.

    The apiserver's ``test`` compares a scalar by its bytes: the JSON of the stored object as Go
    writes it against the test value as sent, compacted. So a value is sent as Go writes it —
    a float in Go's shortest form (``0.00001``, ``1e-7``, ``1e+21``; an integral one without
    ``.0``), strings in UTF-8 with ``<``, ``>``, ``&``, U+2028 and U+2029 escaped as ``\u003c``
    … and control characters as Go escapes them — or an unchanged value would fail its test.
    """
    out: list[str] = []
    _encode(ops, out)
    return "".join(out).encode()


def _encode(value: Any, out: list[str]) -> None:
    t = type(value)
    if t is str:
        out.append(_go_string(value))
    elif value is None:
        out.append("null")
    elif t is bool:
        out.append("true" if value else "false")
    elif t is int:
        out.append(str(value))
    elif t is float:
        out.append(_go_float(value))
    elif t is dict:
        out.append("{")
        for i, (k, v) in enumerate(value.items()):
            if i:
                out.append(",")
            out.append(_go_string(k))
            out.append(":")
            _encode(v, out)
        out.append("}")
    elif t is list:
        out.append("[")
        for i, v in enumerate(value):
            if i:
                out.append(",")
            _encode(v, out)
        out.append("]")
    elif isinstance(value, (str, int, float, dict, list)):  # a subclass (an enum's value is plain)
        _encode((str if isinstance(value, str) else bool if isinstance(value, bool) else int if isinstance(value, int)
                 else float if isinstance(value, float) else dict if isinstance(value, dict) else list)(value), out)
    else:
        raise TypeError(f"not a JSON value: {type(value).__name__}")


#: Go's escapes (encoding/json with HTML escaping, as the apiserver encodes objects)
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f",
            "<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_ESCAPES.update({chr(c): f"\\u{c:04x}" for c in range(0x20) if chr(c) not in _ESCAPES})
_NEEDS = re.compile("[\"\\\\<>&\u2028\u2029\x00-\x1f]")


def _go_string(s: str) -> str:
    return '"' + _NEEDS.sub(lambda m: _ESCAPES[m.group()], s) + '"'


def _go_float(f: float) -> str:
    """``strconv.AppendFloat(f, 'f' or 'e', -1, 64)`` as encoding/json picks (and trims) it."""
    if f != f or f in (math.inf, -math.inf):
        raise ValueError(f"{f} has no JSON form")
    a = abs(f)
    if a != 0 and (a < 1e-6 or a >= 1e21):
        mantissa, _, exp = repr(f).partition("e")  # shortest digits; Python writes e-07, Go e-7
        if exp.startswith("-0"):
            exp = "-" + exp[2:]
        return f"{mantissa.removesuffix('.0')}e{exp}"
    text = format(decimal.Decimal(repr(f)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


# --------------------------------------------------------------------------- the walk


def _node(path: tuple[str, ...], now: Any, seen: Any, raw: Any, none_default: bool,
          tests: list[dict[str, Any]], changes: list[dict[str, Any]]) -> None:
    """Ops at ``path``, where ``now`` (the model's value) differs from ``seen`` (the read value
    as the model holds it); ``raw`` is the read JSON there (or ABSENT)."""
    if now is None:
        if none_default:
            if raw is not ABSENT and raw is not None:
                _guard(path, raw, tests)
                changes.append({"op": "remove", "path": _pointer(path)})
            return
        _set(path, None, raw, tests, changes)
        return
    if isinstance(now, BaseModel) and isinstance(raw, dict) and not _custom(type(now)):
        same = isinstance(seen, BaseModel) and type(seen) is type(now)
        fields = type(now).model_fields
        for name, info in fields.items():
            if info.exclude or not _said(now, name, info):
                continue
            value = getattr(now, name)
            before = getattr(seen, name) if same else ABSENT
            if before is not ABSENT and _unchanged(value, before):
                continue
            key = _alias(name, info)
            _node((*path, key), value, before, raw.get(key, ABSENT), _none_default(info), tests, changes)
        extra = now.__pydantic_extra__
        if extra is not None:
            _entries(path, extra, (seen.__pydantic_extra__ or {}) if same else {}, raw, set(fields), tests, changes)
        return
    if isinstance(now, dict) and isinstance(raw, dict):
        _entries(path, now, seen if isinstance(seen, dict) else {}, raw, set(), tests, changes)
        return
    if isinstance(now, (BaseModel, dict)) and seen is not ABSENT and _equal(now, seen):
        return  # written whole, but the same in JSON (a naive datetime against its UTC form)
    form = _form(now, said_only=True)
    if form == {} and raw is ABSENT and isinstance(now, BaseModel):
        return  # nothing said in an object that is not stored: absent reads the same
    _set(path, form, raw, tests, changes)


def _entries(path: tuple[str, ...], now: Mapping[Any, Any], seen: Mapping[Any, Any], raw: Mapping[str, Any],
             declared: set[str], tests: list[dict[str, Any]], changes: list[dict[str, Any]]) -> None:
    """A map key by key: changed and new keys, and removed keys the read JSON has."""
    keys = {}
    for k, value in now.items():
        key = _key(k)
        keys[key] = value
        before = _lookup(seen, k)
        if before is not ABSENT and _unchanged(value, before):
            continue
        _node((*path, key), value, before, raw.get(key, ABSENT), False, tests, changes)  # a key's None is stored
    for k in seen:
        key = _key(k)
        if key not in keys and key not in declared and key in raw:
            _guard((*path, key), raw[key], tests)
            changes.append({"op": "remove", "path": _pointer((*path, key))})


def _lookup(seen: Mapping[Any, Any], k: Any) -> Any:
    return seen[k] if k in seen else ABSENT


def _set(path: tuple[str, ...], value: Any, raw: Any, tests: list[dict[str, Any]], changes: list[dict[str, Any]]) -> None:
    _guard(path, None if raw is ABSENT else raw, tests)
    changes.append({"op": "add", "path": _pointer(path), "value": value})


def _guard(path: tuple[str, ...], raw: Any, tests: list[dict[str, Any]]) -> None:
    tests.append({"op": "test", "path": _pointer(path), "value": raw})


def _pointer(path: tuple[str, ...]) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in path)


# --------------------------------------------------------------------------- said, equal, JSON


def _said(model: BaseModel, name: str, info: FieldInfo) -> bool:
    """``name`` is set on ``model``, or its value is no longer its default (changed in place)."""
    if name in model.model_fields_set:
        return True
    try:
        if _DATA_FACTORIES:
            default = info.get_default(call_default_factory=True, validated_data=dict(model.__dict__))
        else:
            default = info.get_default(call_default_factory=True)
    except Exception:  # noqa: BLE001 - a factory that fails: the value cannot be its default
        return True
    return not _equal(getattr(model, name), default)


#: pydantic passes the other fields to a ``default_factory`` that takes them (2.10 on)
_DATA_FACTORIES = "validated_data" in inspect.signature(FieldInfo.get_default).parameters


def _none_default(info: FieldInfo) -> bool:
    """``None`` is what the field reads as when absent: its default is ``None``."""
    return info.default_factory is None and not info.is_required() and info.default is None


def _eq(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an odd __eq__: not known equal
        return False


def _unchanged(a: Any, b: Any) -> bool:
    """Whether a field need not be visited: a model or a map that ``==`` finds different is
    walked (its parts compared one by one); anything else is compared by :func:`_equal`."""
    if isinstance(a, (BaseModel, dict)) and type(a) is type(b):
        return _eq(a, b) and (type(a) is not dict or _same(a, b))
    return _equal(a, b)


def _equal(a: Any, b: Any) -> bool:
    """``a`` and ``b`` have the same JSON form (Python's ``==`` first: the common case)."""
    try:
        if _same(a, b) if type(a) in (dict, list) else a == b:  # free-form JSON: True is not 1
            return True
    except Exception:  # noqa: BLE001 - an odd __eq__: compare the JSON forms
        pass
    return _same(to_json(a), to_json(b))


def _same(a: Any, b: Any) -> bool:
    """JSON equality: ``1 == 1.0``, but ``True`` is not ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _alias(name: str, info: FieldInfo) -> str:
    return info.serialization_alias or info.alias or name


def _key(k: Any) -> str:
    if isinstance(k, str):
        return k
    if isinstance(k, enum.Enum):
        k = k.value
    return str(pydantic_core.to_jsonable_python(k))


def _custom(cls: type[BaseModel]) -> bool:
    """``cls`` has a serializer of its own (then its JSON form is ``model_dump``'s)."""
    plan = _CUSTOM.get(cls)
    if plan is None:
        d = cls.__pydantic_decorators__
        plan = bool(d.field_serializers or d.model_serializers) or any(
            type(m).__name__ in _SERIALIZERS for info in cls.model_fields.values() for m in info.metadata
        )
        _CUSTOM[cls] = plan
    return plan


_CUSTOM: dict[type, bool] = {}
#: computed fields are left out where pydantic can (2.12 on; setup.cfg allows 2.6)
_NO_COMPUTED = {"exclude_computed_fields": True} if "exclude_computed_fields" in inspect.signature(BaseModel.model_dump).parameters else {}


def to_json(value: Any) -> Any:
    """``value``'s JSON form, every field of every model included (what a list item is sent as)."""
    return _form(value, said_only=False)


def _form(value: Any, said_only: bool) -> Any:
    """The JSON form of ``value``; ``said_only``: a model holds its said fields only (a list's
    items hold every field)."""
    t = type(value)
    if t in _SCALARS:
        return value
    if isinstance(value, BaseModel):
        cls = type(value)
        if _custom(cls):
            return value.model_dump(mode="json", by_alias=True, **_NO_COMPUTED)
        out: dict[str, Any] = {}
        for name, info in cls.model_fields.items():
            if info.exclude or (said_only and not _said(value, name, info)):
                continue
            v = getattr(value, name)
            if v is None and _none_default(info):
                continue  # absent reads as None
            out[_alias(name, info)] = _form(v, said_only)
        for k, v in (value.__pydantic_extra__ or {}).items():
            out[k] = _form(v, said_only)
        return out
    if isinstance(value, enum.Enum):
        return _form(value.value, said_only)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)  # naive: taken as UTC
        return pydantic_core.to_jsonable_python(value)
    if isinstance(value, dict):
        return {_key(k): _form(v, said_only) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        items = [_form(v, False) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(value, (list, tuple)):
        return [_form(v, False) for v in value]
    if isinstance(value, (str, int, float, bool)):  # subclasses
        return value
    return pydantic_core.to_jsonable_python(value)

