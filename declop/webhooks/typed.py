"""Typed: what a mutator or converter that declares a typed ``obj`` answers with.

A mutator declares ``obj: Widget`` (a :class:`~declop.typed.model.CustomResource` of its
resource); a converter declares the models of the versions it converts from
(``obj: WidgetV1 | WidgetV2``). The law is the status writes': what the handler sets on the
model is what the apiserver stores.

Invariants:

* a mutator's object is :func:`mutated` from three values: the object as sent, its model's JSON
  form before the call (:func:`snapshot`) and after (the model the handler changed in place or
  returned). Only what differs between the two JSON forms changes the object, key by key:
  fields the model does not carry are kept, an unset default the handler did not touch is not
  added (the CRD's defaulting, which runs before admission, has filled in the CRD's), a key
  removed from a ``dict`` field is removed, a field set to ``None`` is sent as ``null``; a list
  of the same length is merged item by item, one whose length changed is replaced whole; a
  default the object lacked and the handler changed (``obj.spec.tls.enabled = True``) is sent as
  what changed only. A returned model that set no ``metadata`` keeps the object's; ``apiVersion``
  and ``kind`` are never changed;
* a converter's input is the model of the object's version among those it declares
  (:func:`source_view`); a version it does not declare fails the review naming both;
* a converted model is its JSON form (:func:`converted_object`): every value it holds except a
  ``None`` the handler never set; its ``metadata`` gives ``labels`` and ``annotations`` only
  where set or non-empty (the rest is the original's, as
  :func:`declop.webhooks.conversion.finish` keeps it);
* the JSON form (:func:`_json`) is :func:`declop.typed.dump.as_json`'s ``"whole"`` form,
  the one every typed write uses: pydantic's (``mode="json"``, aliases, no computed fields)
  with a naive ``datetime`` taken as UTC (``…Z``): the apiserver refuses a ``date-time``
  without a zone.
"""

from __future__ import annotations

import inspect
import typing
from types import UnionType
from typing import Any, Callable, Mapping, Union

from pydantic import BaseModel

from declop.errors import RegistrationError
from declop.typed.dump import as_json
from declop.typed.model import CustomResource
from declop.typed.view import view

__all__ = ["NoModel", "converted", "converted_object", "converter_models", "mutated", "snapshot", "source_view"]

_ABSENT: Any = object()


class NoModel(ValueError):
    """An object of a version the converter's ``obj`` annotation names no model for."""


def converter_models(fn: Callable[..., Any], name: str, resource: str) -> tuple[type[CustomResource], ...]:
    """The models ``fn``'s ``obj`` annotation names (``obj: WidgetV1 | WidgetV2``), in the
    annotation's order; ``()`` when ``obj`` is not annotated with a model (a dict).

    Raises:
        RegistrationError: the annotation cannot be resolved, names a model of another kind than
            ``resource`` (a CRD name), or two models of one version.
    """
    try:
        param = inspect.signature(fn).parameters.get("obj")
    except (TypeError, ValueError):
        return ()
    if param is None or param.annotation is inspect.Parameter.empty:
        return ()
    annotation = param.annotation
    if isinstance(annotation, str):
        target = inspect.unwrap(fn)
        try:
            annotation = typing.get_type_hints(target).get("obj", annotation)
        except Exception as exc:  # noqa: BLE001 - a name the module does not define
            raise RegistrationError(
                f"@declop.converter {name!r}: cannot resolve the annotation of obj ({param.annotation!r}): "
                f"{type(exc).__name__}: {exc}; define or import the models at module level"
            ) from None
    members = typing.get_args(annotation) if typing.get_origin(annotation) in (Union, UnionType) else (annotation,)
    models = tuple(m for m in members if isinstance(m, type) and issubclass(m, CustomResource))
    seen: dict[str, type[CustomResource]] = {}
    for model in models:
        kind = model.kind_of()
        if resource not in (kind.crd_name, kind.resource):
            raise RegistrationError(
                f"@declop.converter {name!r}: obj names {model.__qualname__} ({kind.crd_name}), which is not a version of "
                f"{resource}; name the models of the kind it converts"
            )
        if kind.api_version in seen:
            raise RegistrationError(
                f"@declop.converter {name!r}: {seen[kind.api_version].__qualname__} and {model.__qualname__} are both "
                f"{kind.api_version}; name each version once"
            )
        seen[kind.api_version] = model
    return models


def source_view(models: tuple[type[CustomResource], ...], obj: Mapping[str, Any]) -> CustomResource:
    """``obj`` as the model of its version among ``models``.

    Raises:
        NoModel: no model is of ``obj``'s ``apiVersion``.
        InvalidObject: ``obj`` fails its model (each field path named).
    """
    version = obj.get("apiVersion")
    for model in models:
        if model.kind_of().api_version == version:
            return view(model, obj)  # type: ignore[return-value]
    named = ", ".join(f"{m.__qualname__} ({m.kind_of().api_version})" for m in models)
    raise NoModel(f"obj is annotated with {named}, not a model of {version}; add its model to the annotation")


def snapshot(model: BaseModel) -> Any:
    """The JSON form of ``model`` before the mutator runs (the base :func:`mutated` compares to)."""
    return _json(model)


def mutated(original: Mapping[str, Any], before: Any, given: BaseModel, result: Any) -> dict[str, Any] | None:
    """The object as sent (``original``) with what the handler changed on its model: the
    difference between ``before`` (:func:`snapshot` of ``given``, the view the handler got) and
    ``result`` — the model it returned, or ``given`` as it left it (``None`` returned). A dict
    returned is the new object as it is; anything else gives None (the handler's error)."""
    if isinstance(result, dict):
        return result
    if result is not None and not isinstance(result, BaseModel):
        return None
    returned = result is not None and result is not given
    result = given if result is None else result
    after = _json(result)
    _keep_unsaid(after, before, result)
    if returned and "metadata" not in result.model_fields_set:
        after["metadata"] = before.get("metadata")
    for key in ("apiVersion", "kind"):
        after[key] = before.get(key)
    merged: dict[str, Any] = _merge(original, before, after)
    return merged


def _keep_unsaid(after: Any, before: Any, value: Any) -> None:
    """Put back into ``after`` what the model does not say: a ``None`` field it never set, and
    a key it does not declare (an extra a new model lacks), from ``before``."""
    if isinstance(value, BaseModel) and isinstance(after, dict) and isinstance(before, dict):
        declared = set()
        for name, info in type(value).model_fields.items():
            key = info.serialization_alias or info.alias or name
            declared.add(key)
            field = getattr(value, name, None)
            if field is None and name not in value.model_fields_set:
                if key in before:
                    after[key] = before[key]
            elif key in after and key in before:
                _keep_unsaid(after[key], before[key], field)
        for key in before:
            if key not in after and key not in declared:
                after[key] = before[key]
    elif isinstance(value, (list, tuple)) and isinstance(after, list) and isinstance(before, list) and len(after) == len(before):
        for item, a, b in zip(value, after, before):
            _keep_unsaid(a, b, item)
    elif isinstance(value, dict) and isinstance(after, dict) and isinstance(before, dict):
        for key, item in value.items():
            if key in after and key in before:
                _keep_unsaid(after[key], before[key], item)


def _merge(sent: Any, before: Any, after: Any) -> Any:
    """``sent`` with the changes from ``before`` to ``after`` (the module's invariants)."""
    if before == after and type(before) is type(after):
        return sent
    if isinstance(before, dict) and isinstance(after, dict):
        if sent is _ABSENT:
            sent = {}  # a default the object lacked: only what changed in it is sent
        if isinstance(sent, dict):
            out = dict(sent)
            for key in before:
                if key not in after:
                    out.pop(key, None)
            for key, value in after.items():
                if key not in before:
                    out[key] = value
                elif not (before[key] == value and type(before[key]) is type(value)):
                    out[key] = _merge(out.get(key, _ABSENT), before[key], value)
            return out
    if (
        isinstance(before, list) and isinstance(after, list) and isinstance(sent, list)
        and len(before) == len(after) == len(sent)
    ):
        return [_merge(s, b, a) for s, b, a in zip(sent, before, after)]
    return after


def converted(given: CustomResource, result: Any) -> dict[str, Any] | None:
    """What a typed converter's answer stands for: the converted object when ``result`` is a
    model (or None: ``given``, changed in place) or a dict; None for anything else."""
    if result is None:
        result = given
    if isinstance(result, BaseModel):
        return converted_object(result)
    return result if isinstance(result, dict) else None


def converted_object(model: BaseModel) -> dict[str, Any]:
    """What a typed converter returned (or left in ``obj``), as the converted object for
    :func:`~declop.webhooks.conversion.finish`."""
    out: dict[str, Any] = _json(model)
    metadata = getattr(model, "metadata", None)
    if isinstance(metadata, BaseModel):
        kept = {}
        for key in ("labels", "annotations"):
            value = getattr(metadata, key, None)
            if key in metadata.model_fields_set or value:
                kept[key] = out.get("metadata", {}).get(key)
        out["metadata"] = kept
    return out


def _json(model: BaseModel) -> Any:
    """``model``'s JSON form: every value except a ``None`` never set; naive datetimes as UTC."""
    return as_json(model, "whole")
