"""CRD: the CustomResourceDefinitions of a set of :class:`~declop.typed.model.CustomResource`
models, as ``declop crd`` prints them and ``declop dev`` applies them.

Invariants:

* one CRD per (group, kind); each model class is one of its versions (two classes for the same
  version are refused); the versions are listed in Kubernetes' priority order (``v2``,
  ``v1``, ``v1beta1``, ``v1alpha1`` …), so the order the classes were defined in does not matter;
* exactly one version has ``storage=True`` — with one version, it; with several, the one whose
  class says so and no other (anything else: one line naming the versions and what to write);
* the names (plural, singular, scope, short names, categories) are the kind's, not a version's:
  versions that disagree are refused; a version that leaves short names or categories out takes
  the others';
* ``spec.conversion`` is written only for a kind given in ``conversions`` (the kind has a
  ``@declop.converter``): ``strategy: Webhook``, ``conversionReviewVersions: ["v1"]`` and the
  ``clientConfig`` the caller computed — without a ``caBundle``, which the operator adds when it
  starts (its CA is its own). Otherwise the field is absent and the apiserver's default
  (``None``) or what the operator set stays;
* :func:`dump` gives the same bytes for the same models, run after run (no timestamps, no
  dict-order or set-order dependence).
"""

from __future__ import annotations

import dataclasses
import re
from types import ModuleType
from typing import Any, Iterable, Mapping

import yaml  # type: ignore[import-untyped]

from declop.errors import RegistrationError
from declop.typed.model import Column, CustomResource, Kind
from declop.typed.schema import openapi_schema

__all__ = ["crd_name_of", "definitions", "dump", "models_in"]

API_VERSION = "apiextensions.k8s.io/v1"
_VERSION = re.compile(r"^v([0-9]+)(?:(alpha|beta)([0-9]+))?$")


def models_in(modules: Iterable[ModuleType], *others: Any) -> list[type[CustomResource]]:
    """The :class:`CustomResource` subclasses that name a kind, defined in or imported into
    ``modules`` (their globals), plus those found among ``others`` or their attributes (the
    registrations, whose resource may be a model). First seen first; each once."""
    found: dict[type[CustomResource], None] = {}

    def consider(value: Any) -> None:
        if isinstance(value, type) and issubclass(value, CustomResource) and "__kind__" in value.__dict__ and value.__kind__ is not None:
            found.setdefault(value, None)

    for module in modules:
        for value in list(vars(module).values()):
            consider(value)
    for other in others:
        consider(other)
        if dataclasses.is_dataclass(other) and not isinstance(other, type):
            for field in dataclasses.fields(other):
                consider(getattr(other, field.name, None))
        else:
            for value in list(getattr(other, "__dict__", {}).values()):
                consider(value)
    return list(found)


def crd_name_of(resource: object, models: Iterable[type[CustomResource]]) -> str | None:
    """The CRD name (``widgets.example.com``) of the model kind ``resource`` names, as a
    decorator spells it: a model class, ``widgets.example.com``, ``widgets.v1.example.com``, or
    unqualified (``widgets``, ``widget``, ``Widget``, a short name) when only one of ``models``
    has that name. None when none does."""
    if isinstance(resource, type) and issubclass(resource, CustomResource):
        return resource.kind_of().crd_name
    kinds = [m.kind_of() for m in models]
    for kind in kinds:
        if resource in (kind.crd_name, kind.resource):
            return kind.crd_name
    named = {k.crd_name for k in kinds if resource in (k.plural, k.singular, k.kind, *k.short_names)}
    return named.pop() if len(named) == 1 else None


def _priority(version: str) -> tuple[int, int, int]:
    """Kubernetes' version priority as a sort key (smaller first): GA before beta before alpha,
    higher numbers first."""
    match = _VERSION.match(version)
    if match is None:
        return (3, 0, 0)
    major, level, minor = match.groups()
    return ({None: 0, "beta": 1, "alpha": 2}[level], -int(major), -int(minor or 0))


def _column(column: Column) -> dict[str, Any]:
    out: dict[str, Any] = {"name": column.name, "type": column.type, "jsonPath": column.json_path}
    if column.description:
        out["description"] = column.description
    if column.format:
        out["format"] = column.format
    if column.priority:
        out["priority"] = column.priority
    return out


def _version(model: type[CustomResource], kind: Kind) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": kind.version,
        "served": kind.served,
        "storage": kind.storage,
        "schema": {"openAPIV3Schema": openapi_schema(model)},
    }
    if kind.status:
        out["subresources"] = {"status": {}}
    if kind.printer_columns:
        out["additionalPrinterColumns"] = [_column(c) for c in kind.printer_columns]
    return out


def _names(crd: str, kinds: list[tuple[type[CustomResource], Kind]]) -> tuple[Kind, tuple[str, ...], tuple[str, ...]]:
    """The kind's names, checked equal across versions; short names and categories may be left
    out on a version."""
    first_model, first = kinds[0]
    for model, kind in kinds[1:]:
        for what in ("plural", "singular", "scope"):
            if getattr(kind, what) != getattr(first, what):
                raise RegistrationError(
                    f"{crd}: {first_model.__name__} ({first.version}) and {model.__name__} ({kind.version}) give "
                    f"different {what} ({getattr(first, what)!r}, {getattr(kind, what)!r}); the names are the kind's: make them equal"
                )
    chosen: dict[str, tuple[str, ...]] = {}
    for what in ("short_names", "categories"):
        given = {getattr(k, what) for _, k in kinds if getattr(k, what)}
        if len(given) > 1:
            raise RegistrationError(
                f"{crd}: the versions give different {what} ({', '.join(repr(list(g)) for g in sorted(given))}); "
                "give them on one version, or the same on every one"
            )
        chosen[what] = given.pop() if given else ()
    return first, chosen["short_names"], chosen["categories"]


def definitions(
    models: Iterable[type[CustomResource]], *, conversions: Mapping[str, Mapping[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The CRDs of ``models``, sorted by name. ``conversions`` maps a CRD name to the
    ``clientConfig`` of its conversion webhook (no ``caBundle``).

    Raises:
        RegistrationError: two classes for one version; not exactly one storage version;
            versions disagreeing on the names; a schema the apiserver would refuse.
    """
    groups: dict[str, list[tuple[type[CustomResource], Kind]]] = {}
    for model in models:
        kind = model.kind_of()
        groups.setdefault(kind.crd_name, []).append((model, kind))
    conversions = conversions or {}
    unknown = sorted(set(conversions) - set(groups))
    if unknown:
        raise RegistrationError(f"a conversion webhook is set for {', '.join(unknown)}, which no model defines")
    out = []
    for crd in sorted(groups):
        kinds = sorted(groups[crd], key=lambda mk: _priority(mk[1].version))
        kinds_by_name = {k.kind for _, k in kinds}
        if len(kinds_by_name) > 1:
            raise RegistrationError(f"{crd}: the models name different kinds ({', '.join(sorted(kinds_by_name))}) with one plural; give each its own plural=")
        seen: dict[str, type[CustomResource]] = {}
        for model, kind in kinds:
            if kind.version in seen:
                raise RegistrationError(
                    f"{crd}: {seen[kind.version].__name__} and {model.__name__} both define version {kind.version}; "
                    "one class per version"
                )
            seen[kind.version] = model
        stored = [k.version for _, k in kinds if k.storage]
        if len(stored) != 1:
            versions = ", ".join(k.version for _, k in kinds)
            if stored:
                raise RegistrationError(
                    f"{crd}: versions {' and '.join(stored)} all say storage=True; exactly one version is stored in etcd: "
                    "pass storage=False to the others (class keyword)"
                )
            raise RegistrationError(f"{crd}: none of the versions {versions} says storage=True; exactly one must be stored")
        if not any(k.served for _, k in kinds):
            raise RegistrationError(f"{crd}: no version is served (served=False on every one); serve at least one")
        names, short_names, categories = _names(crd, kinds)
        spec_names: dict[str, Any] = {
            "kind": names.kind,
            "listKind": f"{names.kind}List",
            "plural": names.plural,
            "singular": names.singular,
        }
        if short_names:
            spec_names["shortNames"] = list(short_names)
        if categories:
            spec_names["categories"] = list(categories)
        spec: dict[str, Any] = {
            "group": names.group,
            "names": spec_names,
            "scope": names.scope,
            "versions": [_version(model, kind) for model, kind in kinds],
        }
        if crd in conversions:
            config = {k: v for k, v in conversions[crd].items() if k != "caBundle"}
            spec["conversion"] = {
                "strategy": "Webhook",
                "webhook": {"conversionReviewVersions": ["v1"], "clientConfig": config},
            }
        out.append({"apiVersion": API_VERSION, "kind": "CustomResourceDefinition", "metadata": {"name": crd}, "spec": spec})
    return out


def dump(crds: Iterable[Mapping[str, Any]]) -> str:
    """``crds`` as YAML documents, each starting with ``---``; keys in the order built."""
    text: str = yaml.dump_all(
        list(crds), Dumper=_Dumper, sort_keys=False, explicit_start=True, default_flow_style=False, allow_unicode=True, width=120
    )
    return text


class _Dumper(yaml.SafeDumper):  # type: ignore[misc]
    """Writes a value met twice (a ``required`` list shared by two inlined uses) twice, never
    as an ``&id001`` anchor and alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
