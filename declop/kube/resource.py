"""Resource: a resource name plus how a source caches it — metadata only, or narrowed by fields.

``@declop.reconciler("secrets", metadata_only=True, fields="type=Opaque")`` says it for the primary
resource; ``owns=`` and ``watches=`` take a plain name or a :class:`Resource`::

    @declop.reconciler("widgets.example.com", owns=[declop.kube.resource.Resource("secrets", metadata_only=True)])

Wherever a name goes, a typed model (a :class:`~declop.typed.model.CustomResource` subclass)
may go too: :func:`resource_name` turns ``Widget`` into ``"widgets.v1.example.com"``.

Invariants:
- a :class:`Resource` is frozen and its ``fields`` is normalised (:func:`parse_fields`): two
  declarations that select the same objects compare equal, so they share one informer;
- a class given as a resource is a CustomResource subclass that names its kind, or a one-line
  :class:`~declop.errors.RegistrationError`; checking it never imports pydantic (a model class
  exists only once ``declop.typed.model`` was imported);
- a field selector is checked for *syntax* here (at registration); whether the apiserver supports
  its field labels for that resource is checked by the manager at start, with one request.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any, Mapping

from declop.errors import RegistrationError

__all__ = ["Resource", "parse_fields", "resource_name"]

#: a field label: dotted path segments (``spec.nodeName``, ``metadata.name``, ``status.phase``)
_LABEL = re.compile(r"^[A-Za-z0-9_.\-/]+$")
_OPERATORS = ("!=", "==", "=")


def parse_fields(fields: str | Mapping[str, str] | None) -> str:
    """The canonical field selector for ``fields``: ``"a=x,b!=y"`` (sorted, ``==`` written ``=``).

    Accepts the apiserver's syntax (``"spec.nodeName=node-1,status.phase!=Running"``) or a
    mapping of equalities (``{"spec.nodeName": "node-1"}``); ``None``/``""`` select everything.

    Raises:
        RegistrationError: a term is not ``label=value``, ``label==value`` or ``label!=value``.
    """
    if not fields:
        return ""
    if isinstance(fields, Mapping):
        terms = [(str(k), "=", str(v)) for k, v in fields.items()]
    elif isinstance(fields, str):
        terms = [_term(t.strip()) for t in fields.split(",") if t.strip()]
    else:
        raise RegistrationError(
            f"fields must be a field selector like 'spec.nodeName=node-1' or a dict, got {type(fields).__name__}"
        )
    for label, _op, value in terms:
        if not _LABEL.match(label) or "," in value:
            raise RegistrationError(
                f"fields: {label}={value!r} is not a valid field selector term; write 'spec.nodeName=node-1' "
                "(operators =, ==, !=; terms separated by commas)"
            )
    return ",".join(f"{label}{op}{value}" for label, op, value in sorted(set(terms)))


def resource_name(value: Any, *, what: str = "resource") -> Any:
    """``value`` with a typed model replaced by its resource name (``Widget`` →
    ``"widgets.v1.example.com"``); anything that is not a class is returned as it is.

    Raises:
        RegistrationError: ``value`` is a class but not a CustomResource that names a kind.
    """
    if not isinstance(value, type):
        return value
    model = sys.modules.get("declop.typed.model")
    if model is not None and issubclass(value, model.CustomResource):
        return getattr(value, "kind_of")().resource  # raises for a model without group/version/kind
    raise RegistrationError(
        f"{what}: {value.__qualname__} is a class, not a resource; pass a resource name like 'pods' "
        "or a declop.CustomResource subclass"
    )


def _term(term: str) -> tuple[str, str, str]:
    for op in _OPERATORS:
        label, found, value = term.partition(op)
        if found:
            return label.strip(), "!=" if op == "!=" else "=", value.strip()
    raise RegistrationError(
        f"fields: {term!r} is not a valid field selector term; write 'spec.nodeName=node-1' (operators =, ==, !=)"
    )


@dataclass(frozen=True, slots=True)
class Resource:
    """A resource as one source caches it.

    ``name`` is anything kubectl accepts (``"secrets"``, ``"deployments.apps"``) or a typed model
    (``Widget``: its name is taken). With
    ``metadata_only`` the informer lists and watches ``PartialObjectMetadata``: the cache holds
    each object's ``metadata`` (plus ``kind``/``apiVersion`` ``PartialObjectMetadata`` /
    ``meta.k8s.io/v1``) and nothing else — no ``spec``, ``data`` or ``status``; read the body
    with ``client.live.get(...)``. ``fields`` is a field selector (``"spec.nodeName=node-1"``):
    only matching objects reach the cache and the handler.
    """

    name: str
    metadata_only: bool = False
    fields: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", resource_name(self.name))
        if not isinstance(self.name, str) or not self.name.strip():
            raise RegistrationError(f"resource must be a name like 'pods' or 'widgets.example.com', got {self.name!r}")
        if not isinstance(self.metadata_only, bool):
            raise RegistrationError(f"metadata_only must be True or False, got {self.metadata_only!r}")
        object.__setattr__(self, "name", self.name.strip())
        object.__setattr__(self, "fields", parse_fields(self.fields))

    @classmethod
    def of(cls, value: Any, *, what: str = "resource") -> Resource:
        """``value`` as a Resource: a name becomes ``Resource(name)``; a Resource stays itself."""
        if isinstance(value, Resource):
            return value
        value = resource_name(value, what=what)
        if isinstance(value, str) and value.strip():
            return cls(value)
        raise RegistrationError(
            f"{what} entries are resource names like 'secrets' or declop.kube.resource.Resource('secrets', metadata_only=True), got {value!r}"
        )

    def __str__(self) -> str:
        extra = [*(["metadata only"] if self.metadata_only else []), *([f"fields {self.fields}"] if self.fields else [])]
        return f"{self.name} ({', '.join(extra)})" if extra else self.name
