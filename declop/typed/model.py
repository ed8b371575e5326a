"""The model side of a typed custom resource: :class:`CustomResource` and its markers.

Invariants:

* A :class:`CustomResource` subclass with ``kind=`` is one served version of one kind; its
  identity (:class:`Kind`) is fixed when the class is created and checked then (a bad name
  raises :class:`~declop.errors.RegistrationError` at import, not at run time).
* ``metadata`` is an :class:`ObjectMeta` that keeps every field the apiserver sent
  (``extra="allow"``); ``spec``/``status`` are the author's models. Field names are the JSON
  names (``observedGeneration``), so a model and the stored object read the same.
* Markers (:class:`Rule`, :class:`Column`, :class:`ListType`, :class:`MapType`,
  :data:`IntOrString`, :data:`FreeForm`) carry only what the CRD needs; they change nothing about
  validation in Python. Those used in ``Annotated[...]`` add their ``x-kubernetes-*`` key to the
  field's JSON schema, which :mod:`declop.typed.schema` turns into the CRD's schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, GetJsonSchemaHandler, WithJsonSchema
from pydantic_core import CoreSchema

from declop.errors import RegistrationError

__all__ = ["Column", "CustomResource", "FreeForm", "IntOrString", "Kind", "ListType", "MapType", "ObjectMeta", "Rule"]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_VERSION = re.compile(r"^v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?$")
_KIND = re.compile(r"^[A-Z][A-Za-z0-9]*$")


@dataclass(frozen=True)
class Rule:
    """A CEL validation rule (``x-kubernetes-validations``) on the field it annotates::

        replicas: Annotated[int, Rule("self >= 0", message="replicas cannot be negative")]

    On the model class itself, list rules in ``rules=(Rule(...),)`` among the class keywords.
    """

    rule: str
    message: str = ""
    message_expression: str = ""
    reason: str = ""
    field_path: str = ""

    def validation(self) -> dict[str, str]:
        """The ``x-kubernetes-validations`` entry, with only the keys that are set."""
        entry = {"rule": self.rule}
        for key, value in (("message", self.message), ("messageExpression", self.message_expression),
                           ("reason", self.reason), ("fieldPath", self.field_path)):
            if value:
                entry[key] = value
        return entry

    def __get_pydantic_json_schema__(self, core: CoreSchema, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        schema = dict(handler(core))
        schema["x-kubernetes-validations"] = [*schema.get("x-kubernetes-validations", ()), self.validation()]
        return schema


@dataclass(frozen=True)
class ListType:
    """How server-side apply merges a list (``x-kubernetes-list-type``)::

        tags: Annotated[list[str], ListType("set")]                      # unique scalars
        conditions: Annotated[list[Condition], ListType("map", keys=("type",))]  # keyed items

    ``"atomic"`` (the default for a list): one owner replaces it whole; ``"set"``: unique
    scalars, merged item by item; ``"map"``: objects merged by ``keys`` (each key field must be
    required or have a default). A ``set[str]`` field is a ``"set"`` list without the marker.
    """

    type: Literal["atomic", "set", "map"]
    keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.type not in ("atomic", "set", "map"):
            raise RegistrationError(f"ListType({self.type!r}): the type is 'atomic', 'set' or 'map'")
        if (self.type == "map") != bool(self.keys):
            raise RegistrationError(f"ListType({self.type!r}, keys={self.keys!r}): keys= names the key fields of a 'map' list, and only of one")

    def __get_pydantic_json_schema__(self, core: CoreSchema, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        schema = dict(handler(core))
        schema["x-kubernetes-list-type"] = self.type
        if self.keys:
            schema["x-kubernetes-list-map-keys"] = list(self.keys)
        return schema


@dataclass(frozen=True)
class MapType:
    """How server-side apply merges an object or a ``dict`` (``x-kubernetes-map-type``):
    ``"granular"`` (the default) key by key, ``"atomic"`` replaced whole by one owner::

        selector: Annotated[dict[str, str], MapType("atomic")]
    """

    type: Literal["atomic", "granular"]

    def __post_init__(self) -> None:
        if self.type not in ("atomic", "granular"):
            raise RegistrationError(f"MapType({self.type!r}): the type is 'atomic' or 'granular'")

    def __get_pydantic_json_schema__(self, core: CoreSchema, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        schema = dict(handler(core))
        schema["x-kubernetes-map-type"] = self.type
        return schema


@dataclass(frozen=True)
class Column:
    """An ``additionalPrinterColumns`` entry: what ``kubectl get`` shows.

    ``json_path`` is a simple JSONPath from the object's root (``".spec.replicas"``)."""

    name: str
    json_path: str
    type: Literal["integer", "number", "string", "boolean", "date"] = "string"
    description: str = ""
    priority: int = 0
    format: str = ""


#: A field that holds an int or a string (``x-kubernetes-int-or-string``), like a port or "50%".
IntOrString = Annotated[int | str, WithJsonSchema({"x-kubernetes-int-or-string": True})]

#: A free-form object kept as the apiserver stores it (``x-kubernetes-preserve-unknown-fields``).
FreeForm = Annotated[
    dict[str, Any], WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True})
]


class ObjectMeta(BaseModel):
    """An object's metadata. Names the fields handlers read most; keeps every other one."""

    model_config = ConfigDict(extra="allow")

    name: str = ""
    namespace: str | None = None
    uid: str = ""
    resourceVersion: str = ""
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)
    deletionTimestamp: str | None = None
    ownerReferences: list[dict[str, Any]] = Field(default_factory=list)


@dataclass(frozen=True)
class Kind:
    """One version of one kind, as the class keywords of a :class:`CustomResource` named it."""

    group: str
    version: str
    kind: str
    plural: str
    singular: str
    scope: Literal["Namespaced", "Cluster"]
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    printer_columns: tuple[Column, ...] = ()
    rules: tuple[Rule, ...] = ()
    storage: bool = True
    served: bool = True
    status: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def resource(self) -> str:
        """The name a decorator and the informer use: ``widgets.v1.example.com``."""
        return f"{self.plural}.{self.version}.{self.group}"

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{self.group}"


class CustomResource(BaseModel):
    """Base class of a typed custom resource. One subclass per served version::

        class Widget(CustomResource, group="example.com", version="v1", kind="Widget"):
            spec: WidgetSpec
            status: WidgetStatus | None = None

    Class keywords: ``group``, ``version``, ``kind`` (required); ``plural`` (default: the kind in
    lower case plus ``s``), ``singular``, ``scope`` (``"Namespaced"``), ``short_names``,
    ``categories``, ``printer_columns`` (:class:`Column`), ``rules`` (:class:`Rule` on ``spec``'s
    parent object), ``storage`` (which version etcd keeps; one per kind), ``served``, ``status``
    (the status subresource; default on when the model has a ``status`` field).

    Unknown top-level fields are kept (``extra="allow"``), as the apiserver may add some.
    """

    model_config = ConfigDict(extra="allow")

    __kind__: ClassVar[Kind | None] = None

    apiVersion: str = ""
    kind: str = ""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)

    def __init_subclass__(
        cls,
        *,
        group: str | None = None,
        version: str | None = None,
        kind: str | None = None,
        plural: str | None = None,
        singular: str | None = None,
        scope: Literal["Namespaced", "Cluster"] = "Namespaced",
        short_names: tuple[str, ...] | list[str] = (),
        categories: tuple[str, ...] | list[str] = (),
        printer_columns: tuple[Column, ...] | list[Column] = (),
        rules: tuple[Rule, ...] | list[Rule] = (),
        storage: bool = True,
        served: bool = True,
        status: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        if kind is None and group is None and version is None:
            return  # an abstract intermediate base; its subclasses name the kind
        where = f"{cls.__module__}.{cls.__qualname__}"
        if not (group and version and kind):
            raise RegistrationError(f"{where}: a CustomResource needs group=, version= and kind= class keywords")
        if not _DNS_SUBDOMAIN.match(group) or "." not in group:
            raise RegistrationError(f"{where}: group {group!r} must be a DNS subdomain with a dot, like 'example.com'")
        if not _VERSION.match(version):
            raise RegistrationError(f"{where}: version {version!r} must look like 'v1', 'v1beta2' or 'v2alpha1'")
        if not _KIND.match(kind):
            raise RegistrationError(f"{where}: kind {kind!r} must be CamelCase, like 'Widget'")
        plural = plural or kind.lower() + "s"
        singular = singular or kind.lower()
        for what, value in (("plural", plural), ("singular", singular), *(("short name", s) for s in short_names)):
            if not _DNS_LABEL.match(value):
                raise RegistrationError(f"{where}: {what} {value!r} must be lower case letters, digits and '-'")
        if scope not in ("Namespaced", "Cluster"):
            raise RegistrationError(f"{where}: scope must be 'Namespaced' or 'Cluster', got {scope!r}")
        cls.__kind__ = Kind(
            group=group,
            version=version,
            kind=kind,
            plural=plural,
            singular=singular,
            scope=scope,
            short_names=tuple(short_names),
            categories=tuple(categories),
            printer_columns=tuple(printer_columns),
            rules=tuple(rules),
            storage=storage,
            served=served,
            status=status if status is not None else "status" in getattr(cls, "__annotations__", {}),
        )

    @classmethod
    def kind_of(cls) -> Kind:
        """This class's :class:`Kind`; raises for an abstract base."""
        if cls.__kind__ is None or "__kind__" not in cls.__dict__:
            raise RegistrationError(f"{cls.__qualname__} names no kind; give it group=, version= and kind= class keywords")
        return cls.__kind__
