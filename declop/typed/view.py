"""The typed view of a cached object, and the status patch of a typed write.

A handler that declares ``obj: Widget`` (a :class:`~declop.typed.model.CustomResource`
subclass) gets :func:`view` of the cached object instead of a dict copy;
``client.patch_status(request, status)`` with a pydantic model sends :func:`status_patch`.

Invariants:

* a view shares nothing with the cache: it is validated from the object's JSON
  (:func:`pydantic_core.to_json`, then ``model_validate_json``), so every value in it —
  free-form (``Any``) content included, which pydantic keeps by reference when it validates
  Python objects — is new; whatever a handler does to it leaves the cache as it was;
* an object that fails validation raises :class:`~declop.errors.InvalidObject` with one
  ``"<field path>: <message>"`` line per error (``spec.replicas: Input should be less than or
  equal to 10``), never the object's values;
* :func:`status_patch` is a JSON merge patch holding only what differs from the stored status,
  among the fields that are *set* on the model (read from the object, passed to the constructor or
  assigned): a default the handler never set is not sent, so it cannot overwrite another writer's
  value; keys the model does not carry are left as stored; a field set to ``None`` removes a stored
  key; ``{}`` when nothing differs;
* :func:`model_of` reads a handler's ``obj`` annotation at registration (strings included, as
  ``from __future__ import annotations`` writes them) and fails there, not at the first call.
"""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any, Callable, Mapping, Union

import pydantic_core
from pydantic import BaseModel, ValidationError

from declop.errors import InvalidObject, RegistrationError
from declop.typed.model import CustomResource

__all__ = ["model_of", "problems", "status_patch", "view"]


def view(model: type[BaseModel], obj: Mapping[str, Any]) -> BaseModel:
    """``obj`` (a cached object) validated as ``model``: a new model that shares nothing with it.

    Raises:
        InvalidObject: ``obj`` fails validation; its ``problems`` name each field path.
    """
    try:
        return model.model_validate_json(pydantic_core.to_json(obj))
    except ValidationError as exc:
        meta = obj.get("metadata") or {}
        raise InvalidObject(str(meta.get("resourceVersion") or ""), problems(exc)) from None


def problems(error: ValidationError) -> tuple[str, ...]:
    """One ``"spec.items[0].port: Input should be ..."`` line per error of ``error``."""
    return tuple(f"{_path(e['loc'])}: {e['msg']}" for e in error.errors(include_url=False, include_input=False))


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(object)"


def status_patch(status: BaseModel | Mapping[str, Any] | None, stored: Any) -> dict[str, Any]:
    """The merge patch of ``.status`` that turns ``stored`` (the cached status) into ``status``.

    ``status`` is the status model, or a whole :class:`~declop.typed.model.CustomResource`
    (its ``status`` is taken). Only fields set on the model that differ are in it (unset
    defaults are not); ``{}`` when nothing differs.
    """
    if isinstance(status, CustomResource):
        status = getattr(status, "status", None)
    if isinstance(status, BaseModel):
        new: Any = status.model_dump(mode="json", by_alias=True, exclude_unset=True)
    else:
        new = dict(status or {})
    return _diff(stored if isinstance(stored, Mapping) else {}, new)


def _diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    patch: dict[str, Any] = {}
    for k, v in new.items():
        if k not in old:
            if v is not None:
                patch[k] = v
        elif old[k] != v:
            if isinstance(v, Mapping) and isinstance(old[k], Mapping):
                sub = _diff(old[k], v)
                if sub:
                    patch[k] = sub
            else:
                patch[k] = v
    return patch


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
    return models[0]
