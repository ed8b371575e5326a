"""The typed view of a cached object.

A handler that declares ``obj: Widget`` (a :class:`~declop.typed.model.CustomResource`
subclass) gets :func:`view` of the cached object instead of a dict copy. (What
``client.patch_status(request, status)`` sends for a model is :mod:`declop.typed.status`.)

Invariants:

* a view shares nothing with the cache, so whatever a handler does to it leaves the cache as it
  was. pydantic builds new lists, dicts and models for typed fields but keeps ``Any`` (free-form)
  values and ``extra="allow"`` fields by reference. So a model made of plain data — every field
  a known type (scalars, enums, literals, unions, lists, dicts, tuples, sets, models, ``Any``) and
  no validator anywhere in it (user code that could see, and change, the cache's objects) — is
  validated from the cached dict directly, and then every value kept by reference (in ``Any``
  fields and extras) is copied (:func:`_own`, which skips subtrees that cannot hold one); any
  other model is validated from the object's JSON (:func:`pydantic_core.to_json`, then
  ``model_validate_json``), where every value is new. The plan is decided once per class;
* a strict model (``strict=True`` in a config, ``Field(strict=True)``, ``Strict`` types) accepts
  exactly what its JSON form accepts: the cache holds JSON-shaped data, and Python-mode
  strictness refuses a string for a datetime, an enum, a UUID or bytes, and a list for a tuple or
  a set, where JSON-mode strictness takes them. So a strict model holding any of those types is
  validated from JSON; for the others (strings, numbers, booleans, lists, dicts, models) the two
  modes agree, and it keeps the direct path;
* an object that fails validation raises :class:`~declop.errors.InvalidObject` with one
  ``"<field path>: <message>"`` line per error (``spec.replicas: Input should be less than or
  equal to 10``), never the object's values;
* :func:`model_of` reads a handler's ``obj`` annotation at registration (strings included, as
  ``from __future__ import annotations`` writes them) and fails there, not at the first call.
"""

from __future__ import annotations

import datetime
import decimal
import enum
import inspect
import types
import typing
import uuid
from typing import Annotated, Any, Callable, Literal, Mapping, Union

import pydantic_core
from pydantic import BaseModel, ValidationError

from declop.errors import InvalidObject, RegistrationError
from declop.typed.model import CustomResource

__all__ = ["model_of", "problems", "view"]


def view(model: type[BaseModel], obj: Mapping[str, Any]) -> BaseModel:
    """``obj`` (a cached object) validated as ``model``: a new model that shares nothing with it.

    Raises:
        InvalidObject: ``obj`` fails validation; its ``problems`` name each field path.
    """
    try:
        if _plain(model):  # model_validate's own checks cost ~0.5 µs a call; the validator is the same
            return _own(model.__pydantic_validator__.validate_python(obj))  # type: ignore[no-any-return]
        return model.__pydantic_validator__.validate_json(pydantic_core.to_json(obj))  # type: ignore[no-any-return]
    except ValidationError as exc:
        meta = obj.get("metadata") or {}
        raise InvalidObject(str(meta.get("resourceVersion") or ""), problems(exc)) from None


#: types whose values pydantic builds anew (or that are immutable)
_ATOMS = (str, int, float, bool, bytes, type(None), datetime.datetime, datetime.date, datetime.time,
          datetime.timedelta, decimal.Decimal, uuid.UUID, enum.Enum)
#: types whose JSON form (a string, a number, a list) strict Python-mode validation refuses
_JSON_DIFFERS = (bytes, datetime.datetime, datetime.date, datetime.time, datetime.timedelta, decimal.Decimal,
                 uuid.UUID, enum.Enum)
_COLLECTIONS = (list, dict, tuple, set, frozenset)
#: collections a JSON array becomes only in lax mode (or in JSON mode)
_ARRAYS_DIFFER = (tuple, set, frozenset)
_VALIDATORS = ("BeforeValidator", "AfterValidator", "WrapValidator", "PlainValidator")

#: model class -> (plain data: validate the cached dict directly, may hold shared values, the
#: fields that may hold one, each with whether it holds JSON only — no model — so a plain copy
#: does, holds a type in :data:`_JSON_DIFFERS` or :data:`_ARRAYS_DIFFER`)
_PLANS: dict[type, tuple[bool, bool, tuple[tuple[str, bool], ...], bool]] = {}
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _plain(cls: type[BaseModel]) -> bool:
    """``cls`` (and every model it holds) is plain data: see the module's invariants."""
    return _plan(cls)[0]


def _plan(cls: type[BaseModel]) -> tuple[bool, bool, tuple[tuple[str, bool], ...], bool]:
    plan = _PLANS.get(cls)
    if plan is not None:
        return plan
    _PLANS[cls] = (True, False, (), False)  # a model that holds itself: decided by its other fields
    decorators = cls.__pydantic_decorators__
    plain = not (decorators.field_validators or decorators.model_validators or decorators.validators
                 or decorators.root_validators)
    differs = False
    walk: list[tuple[str, bool]] = []
    for name, field in cls.model_fields.items():
        if any(type(m).__name__ in _VALIDATORS for m in field.metadata):
            plain = False
        field_plain, field_shares, models, field_differs = _type_plan(field.annotation)
        plain = plain and field_plain
        differs = differs or field_differs
        if field_shares:
            walk.append((name, not models))
    if differs and _strict(_core_schema(cls)):
        plain = False  # strict Python mode would refuse the cached JSON form: validate it as JSON
    plan = (plain, bool(walk) or cls.model_config.get("extra") == "allow", tuple(walk), differs)
    _PLANS[cls] = plan
    return plan


def _type_plan(tp: Any) -> tuple[bool, bool, bool, bool]:
    """(plain data, may hold a value kept by reference, may hold a model, may hold a type whose
    JSON form strict Python-mode validation refuses) for one annotation."""
    if tp is Any:
        return True, True, False, False
    origin = typing.get_origin(tp)
    if origin is Annotated:
        inner, *metadata = typing.get_args(tp)
        plain, shares, models, differs = _type_plan(inner)
        return plain and not any(type(m).__name__ in _VALIDATORS for m in metadata), shares, models, differs
    if origin is Literal:
        return True, False, False, any(type(a) not in _SCALARS for a in typing.get_args(tp))
    if origin in (Union, types.UnionType) or origin in _COLLECTIONS:
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if not args:  # a bare list or dict holds anything: kept by reference
            return True, True, False, origin in _ARRAYS_DIFFER
        plans = [_type_plan(a) for a in args]
        return (all(p[0] for p in plans), any(p[1] for p in plans), any(p[2] for p in plans),
                origin in _ARRAYS_DIFFER or any(p[3] for p in plans))
    if tp in _COLLECTIONS:
        return True, True, False, tp in _ARRAYS_DIFFER
    if isinstance(tp, type):
        if issubclass(tp, BaseModel):
            plain, shares, _, differs = _plan(tp)
            return plain, shares, True, differs
        if issubclass(tp, _ATOMS):
            return True, False, False, issubclass(tp, _JSON_DIFFERS)
    return False, True, True, True  # anything else: validated from JSON


def _core_schema(cls: type[BaseModel]) -> Any:
    """``cls``'s core schema, built first if it was deferred (``defer_build=True``), where it is a
    placeholder until first use."""
    if not cls.__pydantic_complete__:
        cls.model_rebuild()
    return cls.__pydantic_core_schema__


def _strict(schema: Any) -> bool:
    """Some part of the core ``schema`` is strict (a model's config, a field, a ``Strict`` type)."""
    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if node.get("strict") is True:
                return True
            todo.extend(node.values())
        elif isinstance(node, (list, tuple)):
            todo.extend(node)
    return False


def _own(value: Any) -> Any:
    """``value`` with every list and dict that pydantic kept by reference replaced by a copy.
    Only the fields that may hold one are visited (:func:`_plan`), and every extra field."""
    t = type(value)
    if t is dict:
        return {k: v if type(v) in _SCALARS else _own(v) for k, v in value.items()}
    if t is list:
        return [v if type(v) in _SCALARS else _own(v) for v in value]
    plan = _PLANS.get(t)
    if plan is not None and plan[1]:
        fields = value.__dict__
        for name, json_only in plan[2]:
            v = fields[name]
            if type(v) not in _SCALARS:
                fields[name] = _copy(v) if json_only else _own(v)
        extra = value.__pydantic_extra__
        if extra:
            for k, v in extra.items():
                if type(v) not in _SCALARS:
                    extra[k] = _copy(v)  # extras are the JSON as sent
    return value


def _copy(value: Any) -> Any:
    """A deep copy of JSON-shaped data (what ``declop.clone`` does; this layer sits above it)."""
    t = type(value)
    if t is dict:
        return {k: (_copy(v) if type(v) in (dict, list) else v) for k, v in value.items()}
    if t is list:
        return [(_copy(v) if type(v) in (dict, list) else v) for v in value]
    return value


def problems(error: ValidationError) -> tuple[str, ...]:
    """One ``"spec.items[0].port: Input should be ..."`` line per error of ``error``."""
    return tuple(f"{_path(e['loc'])}: {e['msg']}" for e in error.errors(include_url=False, include_input=False))


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(object)"


def model_of(fn: Callable[..., Any], handler: str) -> type[CustomResource] | None:
    """The :class:`~declop.typed.model.CustomResource` subclass ``fn``'s ``obj`` parameter is
    annotated with (``obj: Widget`` or ``obj: Widget | None``), or ``None`` when it is not.

    Raises:
        RegistrationError: the annotation cannot be resolved (a name not importable at module
            level), or names a model without a kind.
    """
    try:
        param = inspect.signature(fn).parameters.get("obj")
    except (TypeError, ValueError):
        return None
    if param is None or param.annotation is inspect.Parameter.empty:
        return None
    annotation = param.annotation
    if isinstance(annotation, str):
        target = inspect.unwrap(fn.func if hasattr(fn, "func") else fn)
        try:
            annotation = typing.get_type_hints(target).get("obj", annotation)
        except Exception:  # noqa: BLE001 - another parameter's annotation may be unresolvable
            try:
                annotation = eval(annotation, getattr(target, "__globals__", {}))  # noqa: S307 - the author's own annotation
            except Exception as exc:  # noqa: BLE001
                raise RegistrationError(
                    f"handler {handler!r}: cannot resolve the annotation of obj ({param.annotation!r}): "
                    f"{type(exc).__name__}: {exc}; define or import the model at module level"
                ) from None
    candidates = typing.get_args(annotation) if typing.get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    models = [a for a in candidates if isinstance(a, type) and issubclass(a, CustomResource)]
    if not models:
        return None
    if len(models) > 1:
        raise RegistrationError(f"handler {handler!r}: obj is annotated with several models; declare one")
    models[0].kind_of()  # a model without a kind raises here, naming it
    _plan(models[0])  # how its views are made: decided once, here rather than at the first call
    return models[0]
