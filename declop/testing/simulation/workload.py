"""The world's workload, derived from the handlers' own registrations: which objects of the
primary resource to create, and which of them the handlers watch.

A handlers file (``declop sim handlers.py``) says what it watches: the resource, ``namespaces=``,
``labels=`` and ``fields=`` of each registration. :func:`scope` reads them into a :class:`Scope`:

- the workload's namespaces are the ones the handlers watch when every registration of the
  primary resource names some (plus :data:`UNWATCHED`, a namespace nobody watches), else the
  world's eight;
- each object gets the labels and field values that satisfy one registration's selectors (in
  turn), except one in :data:`OUTSIDE_EVERY` that gets none — so filtered-out objects exist too;
- :meth:`Scope.watched` tells whether any registration selects an object (namespace, labels and
  fields, with the parsers the informers use). An object no registration selects is never
  owed a reconcile (I3), nor checked for idempotence;
- a typed handler's objects get varied specs its CRD's schema accepts, and some it does not
  (:mod:`declop.testing.simulation.objects`, :mod:`declop.testing.simulation.specs`; :func:`minimal` is the
  fallback); one that fails the model (:func:`valid`) is owed no reconcile either.

Invariants:
- a scope is a pure function of the registrations: the same file gives the same workload;
- an object :meth:`Scope.fill` gave a registration's labels and fields, in one of its
  namespaces, is :meth:`Scope.watched` (unless its field selector names ``metadata.name``, which
  the workload's names cannot satisfy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from declop.errors import InvalidObject
from declop.kube.fields import FieldSelector, parse_fields
from declop.kube.labels import Selector, parse_selector
from declop.reconcile.registration import Registration

__all__ = ["OUTSIDE_EVERY", "UNWATCHED", "Scope", "minimal", "scope", "spec_schema", "valid"]

#: the namespace of the workload's objects that no registration watches (when they name theirs)
UNWATCHED = "sim-unwatched"
#: one object in this many gets no labels or fields (outside every selector)
OUTSIDE_EVERY = 8


@dataclass(frozen=True, slots=True)
class _Filter:
    namespaces: frozenset[str] | None
    labels: Selector
    fields: FieldSelector

    def __call__(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespaces is not None and meta.get("namespace") not in self.namespaces:
            return False
        return self.labels(meta.get("labels")) and self.fields(obj)

    def labels_for(self) -> dict[str, str]:
        """Labels that satisfy the selector (``in``: its first value; exists: ``"sim"``)."""
        out = {}
        for r in self.labels.requirements:
            if r.op == "in":
                out[r.key] = sorted(r.values)[0]
            elif r.op == "exists":
                out[r.key] = "sim"
        return out

    def fields_for(self) -> dict[tuple[str, ...], str]:
        """Field values that satisfy the field selector's ``=`` terms (metadata ones excepted)."""
        return {path: value for path, equal, value in self.fields.terms if equal and path[0] != "metadata"}


@dataclass(frozen=True, slots=True)
class Scope:
    """The primary resource's workload: its namespaces, and the filters of the registrations."""

    namespaces: tuple[str, ...]
    filters: tuple[_Filter, ...]

    @property
    def filtered(self) -> bool:
        """Some objects of the workload are outside every registration's filter."""
        return any(f.namespaces is not None or f.labels or f.fields for f in self.filters)

    def watched(self, obj: Mapping[str, Any]) -> bool:
        """Some registration of the primary resource selects ``obj``."""
        return not self.filters or any(f(obj) for f in self.filters)

    def fill(self, obj: dict[str, Any], index: int) -> dict[str, Any]:
        """``obj`` (the ``index``-th of the workload) with the labels and fields of one
        registration's selectors, or none (one in :data:`OUTSIDE_EVERY`)."""
        if not self.filtered or not self.filters or index % OUTSIDE_EVERY == OUTSIDE_EVERY - 1:
            return obj
        f = self.filters[index % len(self.filters)]
        labels = f.labels_for()
        if labels:
            obj["metadata"]["labels"] = {**(obj["metadata"].get("labels") or {}), **labels}
        for path, value in f.fields_for().items():
            node = obj
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = value
        return obj


def minimal(schema: Mapping[str, Any]) -> Any:
    """The smallest value the OpenAPI ``schema`` (a CRD's structural schema) accepts: its
    default or first enum value, else its required properties, ``minItems`` items, ``minLength``
    characters, its ``minimum``. A ``pattern`` is not read (the object may then fail its model:
    :func:`valid` tells). Used for the ``spec`` of a typed handler's objects, so they pass their
    model instead of all being skipped as invalid."""
    if "default" in schema:
        return schema["default"]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        return 0
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        return {k: minimal(props[k]) for k in schema.get("required") or () if k in props}
    if kind == "array":
        return [minimal(schema.get("items") or {}) for _ in range(int(schema.get("minItems") or 0))]
    if kind == "string":
        if schema.get("format") == "date-time":
            return "2026-01-01T00:00:00Z"
        return "s" * max(1, int(schema.get("minLength") or 0))
    if kind in ("integer", "number"):
        low = schema.get("minimum", 0)
        low = low + 1 if schema.get("exclusiveMinimum") else low
        return int(low) if kind == "integer" else float(low)
    if kind == "boolean":
        return False
    return {}


def spec_schema(crds: Sequence[Mapping[str, Any]], resource: str) -> Mapping[str, Any] | None:
    """The ``spec`` schema of ``resource`` (``plural.group``, or ``plural.version.group`` for that
    version; else the storage version) among ``crds``."""
    for crd in crds:
        spec = crd.get("spec") or {}
        plural, group = (spec.get("names") or {}).get("plural"), spec.get("group")
        for version in spec.get("versions") or ():
            if resource == f"{plural}.{version.get('name')}.{group}" or (resource == f"{plural}.{group}" and version.get("storage")):
                root = ((version.get("schema") or {}).get("openAPIV3Schema") or {}).get("properties") or {}
                return root.get("spec")  # type: ignore[no-any-return]
    return None


def valid(registrations: Sequence[Registration], resource: str, obj: Mapping[str, Any]) -> bool:
    """``obj`` passes the model of every typed registration of ``resource``: one that fails is
    skipped by design ("Object fails its model; skipped until it changes") and owed no reconcile."""
    for reg in registrations:
        if reg.resource == resource and reg.model is not None:
            try:
                reg.view(obj)
            except InvalidObject:
                return False
    return True


def scope(registrations: Sequence[Registration], resource: str, namespaces: Sequence[str]) -> Scope:
    """The scope of the registrations of ``resource`` (``namespaces``: the world's own, used when
    some registration watches every namespace)."""
    filters = []
    for reg in registrations:
        if reg.resource != resource:
            continue
        fields = parse_fields(reg.fields)
        names = set(reg.namespaces) if reg.namespaces is not None else None
        for path, equal, value in fields.terms:
            if equal and path == ("metadata", "namespace"):
                names = {value} if names is None else names & {value}
        filters.append(_Filter(frozenset(names) if names is not None else None, parse_selector(reg.labels), fields))
    if filters and all(f.namespaces is not None for f in filters):
        watched = sorted({n for f in filters for n in (f.namespaces or ())})
        return Scope((*watched, UNWATCHED), tuple(filters))
    return Scope(tuple(namespaces), tuple(filters))
