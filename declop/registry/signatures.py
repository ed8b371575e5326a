"""What a handler's signature declares: the injectable names it takes, and its typed ``obj``.

Invariants:
- argument names are checked at registration (:func:`wanted_names`): a parameter without a default
  must be one of the injectable names (:data:`~declop.reconcile.registration.INJECTABLE`), with
  or without ``**kwargs``, which never fills a name declop does not have; a parameter with a
  default is the handler's own unless its name is within a typo of an injectable one
  (``loger=None``), which is refused. Refusals say "did you mean" or, for Kopf's arguments
  (``spec``, ``body``, ``patch`` …), what declop does instead;
- a handler whose ``obj`` is annotated with a typed model (``obj: Widget``, also as a string
  under ``from __future__ import annotations``) is resolved here (:func:`typed_model`); an annotation
  that cannot be resolved, a model of another resource than the one reconciled, or a model on a
  metadata-only primary is refused. pydantic is never imported here: a model can only be named
  once ``declop.typed.model`` is loaded.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from typing import Any, Callable

from declop.errors import RegistrationError
from declop.hints import KOPF_KWARGS, did_you_mean
from declop.kube.resource import Resource
from declop.reconcile.registration import INJECTABLE

__all__ = ["INJECTABLE", "TYPO_CUTOFF", "location", "typed_model", "wanted_names"]  # INJECTABLE: the names a handler may declare

#: a defaulted parameter this close to an injectable name (difflib ratio) is taken for a typo
TYPO_CUTOFF = 0.8


def location(fn: Callable[..., Any]) -> str:
    """`` (handlers.py:12)``: the file and first line of the function, when it has code."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    code = getattr(inspect.unwrap(target), "__code__", None)
    if code is None:
        return ""
    return f" ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"


def wanted_names(fn: Callable[..., Any], name: str) -> frozenset[str] | None:
    """The injectable names ``fn`` declares (``None`` when it takes ``**kwargs``: it gets all).

    Raises:
        RegistrationError: a parameter without a default that declop cannot fill (whether or
            not there is ``**kwargs``: that never fills it); a defaulted one whose name is a
            typo of an injectable name (ratio >= :data:`TYPO_CUTOFF`, e.g. ``loger=None``)
            unless ``functools.partial`` bound it; or an injectable that is positional-only.
    """
    sig = inspect.signature(fn)
    bound = set(fn.keywords) if isinstance(fn, functools.partial) else set()
    wants: set[str] = set()
    takes_all = False
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            takes_all = True
            continue
        if p.kind is p.VAR_POSITIONAL:
            continue
        if p.name in INJECTABLE:
            if p.kind is p.POSITIONAL_ONLY:
                raise RegistrationError(
                    f"handler {name!r}{location(fn)}: {p.name!r} must not be positional-only; remove the '/'"
                )
            wants.add(p.name)
            continue
        if p.default is p.empty:
            raise RegistrationError(_unknown_required(fn, name, p.name))
        typo = did_you_mean(p.name, INJECTABLE, cutoff=TYPO_CUTOFF)
        if typo and p.name not in bound:
            raise RegistrationError(
                f"handler {name!r}{location(fn)} takes an unknown argument {p.name!r}, which would always "
                f"keep its default: {typo} declop passes only {', '.join(sorted(INJECTABLE))}"
            )
    return None if takes_all else frozenset(wants)


def typed_model(fn: Callable[..., Any], name: str, primary: Resource) -> Any:
    """The typed model of ``fn``'s ``obj`` annotation (``obj: Widget``), or None for a dict.

    Raises:
        RegistrationError: the annotation cannot be resolved, the model is of another resource
            than ``primary``, or ``primary`` is cached as metadata only (there is no body to type).
    """
    if "declop.typed.model" not in sys.modules:
        return None  # no model class exists yet: obj cannot be annotated with one
    from declop.typed.view import model_of

    found = model_of(fn, name)
    if found is None:
        return None
    kind = found.kind_of()
    where = f"handler {name!r}{location(fn)}"
    if "." in primary.name and primary.name not in (kind.resource, kind.crd_name):
        raise RegistrationError(
            f"{where} declares obj: {found.__qualname__} ({kind.resource}) but reconciles {primary.name!r}; "
            f"pass the model itself: @declop.reconciler({found.__qualname__})"
        )
    if primary.metadata_only:
        raise RegistrationError(
            f"{where} declares obj: {found.__qualname__} but its cache holds metadata only; drop metadata_only=True "
            "or annotate obj as a dict"
        )
    return found


def _unknown_required(fn: Callable[..., Any], name: str, param: str) -> str:
    """The one-line refusal of a parameter without a default that declop cannot fill."""
    where = f"handler {name!r}{location(fn)}"
    if param in KOPF_KWARGS:
        return f"{where} takes {param!r}, which Kopf passes and declop does not: {KOPF_KWARGS[param]}"
    if param in ("kwargs", "kw", "_"):
        return f"{where} takes a plain argument {param!r}: did you mean **{param}?"
    hint = did_you_mean(param, INJECTABLE)
    lead = f"{hint} " if hint else ""
    return (
        f"{where} takes an unknown argument {param!r}: {lead}declop passes only "
        f"{', '.join(sorted(INJECTABLE))}; rename it, or give it a default if it is your own"
    )
