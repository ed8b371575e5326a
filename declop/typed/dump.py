"""The JSON form of an object a handler holds: a dict as it is, a typed model as the apiserver reads it.

Every place that takes an object as read from the cache — the client's writes, Events, owner
references, ``create_or_update``, ``declop.conditions`` — takes a typed view (``obj: Widget``)
too, by asking :func:`as_json` for the form it needs:

- ``"whole"``: every value the model holds, except a ``None`` it never set (absent and null
  read the same) — the body of a create, an update, an apply;
- ``"set"``: only the fields set on the model (read from the object, passed to the constructor
  or assigned), at every depth — a merge patch;
- ``"identity"``: ``apiVersion``, ``kind`` and ``metadata`` — what names the object (an Event's
  ``regarding``, an ownerReference, a delete).

Invariants:

* a mapping is returned as it is — the same object, never copied — whatever the form;
* a model's form is pydantic's JSON mode (``mode="json"``, aliases) with computed fields left
  out where pydantic can (2.12 on; the apiserver prunes them anyway), and every naive
  ``datetime`` taken as UTC (``…Z``): the apiserver refuses a ``date-time`` without a zone;
* a :class:`~declop.typed.model.CustomResource` whose ``apiVersion`` or ``kind`` is empty (one
  built in code, ``Widget(metadata=..., spec=...)``) names its class's, in every form;
* anything else is a ``TypeError`` naming its type, in one line;
* pydantic is never imported here (a model exists only once pydantic is loaded), so the client
  and the base modules import this at no cost.
"""

from __future__ import annotations

import inspect
import sys
from datetime import datetime, timezone
from typing import Any, Literal, Mapping

__all__ = ["Form", "as_json", "is_model"]

#: which part of a model :func:`as_json` gives
Form = Literal["whole", "set", "identity"]
FORMS = ("whole", "set", "identity")


def is_model(obj: Any) -> bool:
    """``obj`` is a pydantic model (without importing pydantic)."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(obj, pydantic.BaseModel)


def as_json(obj: Any, form: Form = "whole") -> Any:
    """``obj``'s JSON form (see the module's invariants); a mapping is returned as it is.

    Raises:
        TypeError: ``obj`` is neither a mapping nor a pydantic model.
        ValueError: ``form`` is not one of ``"whole"``, ``"set"``, ``"identity"``.
    """
    if form not in FORMS:
        raise ValueError(f"form must be one of {', '.join(FORMS)}, got {form!r}")
    if isinstance(obj, Mapping):
        return obj
    if not is_model(obj):
        raise TypeError(
            f"expected the object as read (a dict, or a typed model such as obj: Widget), got {type(obj).__name__}"
        )
    model = _utc(obj)
    if form == "set":
        out = model.model_dump(mode="json", by_alias=True, exclude_unset=True, **_no_computed())
    elif form == "identity":
        meta = getattr(model, "metadata", None)
        out = {
            "apiVersion": getattr(model, "apiVersion", ""),
            "kind": getattr(model, "kind", ""),
            "metadata": as_json(meta, "whole") if meta is not None else {},
        }
    else:
        out = model.model_dump(mode="json", by_alias=True, exclude=_unset_nones(obj) or None, **_no_computed())
    return _named(obj, out)


def _named(model: Any, out: Any) -> Any:
    """``out`` with a CustomResource's empty ``apiVersion``/``kind`` taken from its class."""
    kind = getattr(type(model), "__kind__", None)
    if kind is None or not isinstance(out, dict):
        return out
    if not out.get("apiVersion"):
        out["apiVersion"] = kind.api_version
    if not out.get("kind"):
        out["kind"] = kind.kind
    return out


_NO_COMPUTED: dict[str, bool] | None = None


def _no_computed() -> dict[str, bool]:
    """``model_dump``'s keyword that leaves computed fields out, where pydantic has it (2.12 on)."""
    global _NO_COMPUTED
    if _NO_COMPUTED is None:
        dump = sys.modules["pydantic"].BaseModel.model_dump
        _NO_COMPUTED = {"exclude_computed_fields": True} if "exclude_computed_fields" in inspect.signature(dump).parameters else {}
    return _NO_COMPUTED


def _unset_nones(value: Any) -> Any:
    """pydantic's ``exclude`` for the ``None`` fields that were never set, at any depth."""
    if is_model(value):
        spec: dict[Any, Any] = {}
        for name in type(value).model_fields:
            field = getattr(value, name, None)
            if field is None:
                if name not in value.model_fields_set:
                    spec[name] = True
            else:
                sub = _unset_nones(field)
                if sub:
                    spec[name] = sub
        return spec
    if isinstance(value, (list, tuple)):
        return {i: sub for i, item in enumerate(value) if (sub := _unset_nones(item))}
    if isinstance(value, dict):
        return {k: sub for k, item in value.items() if (sub := _unset_nones(item))}
    return None


def _utc(value: Any) -> Any:
    """``value`` with every naive ``datetime`` made UTC; the same object where there is none
    (a model with one is copied, never changed)."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value
    if is_model(value):
        fields = {k: _utc(v) for k, v in value.__dict__.items()}
        extra = {k: _utc(v) for k, v in (value.__pydantic_extra__ or {}).items()}
        if all(fields[k] is v for k, v in value.__dict__.items()) and all(
            extra[k] is v for k, v in (value.__pydantic_extra__ or {}).items()
        ):
            return value
        copy = value.model_copy()
        copy.__dict__.update(fields)
        if copy.__pydantic_extra__ is not None:
            copy.__pydantic_extra__.update(extra)
        return copy
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_utc(v) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
    if isinstance(value, dict):
        pairs = {k: _utc(v) for k, v in value.items()}
        return value if all(pairs[k] is v for k, v in value.items()) else pairs
    return value
