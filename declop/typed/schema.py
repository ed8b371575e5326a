"""Schema: a pydantic model as the **structural** OpenAPI v3 schema of a CRD version.

:func:`openapi_schema` starts from pydantic's JSON schema (``model_json_schema``) and rewrites it
into what the apiserver accepts (apiextensions ``validateStructural`` and friends):

* no ``$ref``: every ``$defs`` entry is inlined where it is used; a model that contains itself
  (directly or not) cannot be inlined and is refused, naming the field;
* ``X | None`` (``anyOf [X, {type: null}]``) becomes ``X`` with ``nullable: true`` — but an
  enum gets no ``nullable``, as the apiserver refuses a null that is not among the enum's values
  (and a null enum value too), while it prunes a null sent to a field that is not nullable; a
  ``None`` default is dropped (absent and null read the same); any other union is refused,
  naming the field, except :data:`~declop.typed.model.IntOrString` (``x-kubernetes-int-or-string``);
* every node has a ``type``, except an int-or-string and a free-form node
  (``x-kubernetes-preserve-unknown-fields``); ``typing.Any`` or ``dict[str, Any]`` without
  :data:`~declop.typed.model.FreeForm` is refused, naming the field;
* ``x-kubernetes-preserve-unknown-fields`` only where asked: :data:`FreeForm`, or a nested model
  with ``extra="allow"`` — never on the CustomResource root, whose ``metadata`` is
  ``{type: object}`` and ``apiVersion``/``kind`` plain strings;
* ``title`` and ``examples`` go; ``description`` comes from docstrings and
  ``Field(description=)``; ``const`` becomes a one-value ``enum``; JSON Schema 2020's numeric
  ``exclusiveMinimum: n`` becomes OpenAPI's ``minimum: n`` + ``exclusiveMinimum: true``;
  ``uniqueItems`` (a ``set[...]``) becomes ``x-kubernetes-list-type: set`` (the apiserver
  forbids ``uniqueItems``); ``additionalProperties: false`` goes (unknown fields are pruned);
  a ``format`` the apiserver does not know goes;
* the key order of every node is fixed, so the same model always gives the same bytes.

Defaults (``default:``) are what Python would fill in, so that the apiserver stores what a
handler reads (its structural defaulting applies a property's default when the key is absent,
then recurses into the value, nested defaults included):

* a plain default is its JSON form; a ``default_factory`` is called when the schema is made and
  gives a default the same way — unless it reads the other fields (``lambda data: ...``), raises,
  gives a value that holds a date, time or UUID (taken as "now" or "new": ``datetime.now``,
  ``uuid4``), gives different values on two calls, has no JSON form, or gives a value the field
  itself refuses (``Field(default_factory=list, min_length=1)``); then there is no default, as
  before: the field is optional to the apiserver and Python fills it in on read;
* an object's default is its full value, not ``{}``: the apiserver validates a default as
  written (required fields, CEL rules), before nested defaults apply; a ``None`` in it is left
  out where the nested field has no other default and is not required (absent and null read
  the same, and an enum refuses a null), so ``= Spec()`` and ``Field(default_factory=Spec)``
  give the same schema;

Every refusal is a :class:`~declop.errors.RegistrationError` of one line naming the model and
the field path (``Widget: spec.owner: …``) and what to write instead.
"""

from __future__ import annotations

import json
import uuid
from datetime import date, datetime, time, timezone
from typing import Any, Mapping

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue, NoDefault
from pydantic_core import CoreSchema, SchemaValidator, core_schema

from declop.errors import RegistrationError
from declop.typed.model import CustomResource

__all__ = ["openapi_schema"]

#: the order of the keys in every schema node (any other key is refused)
_ORDER = (
    "description", "type", "format", "nullable", "default", "enum",
    "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "multipleOf",
    "minLength", "maxLength", "pattern", "minItems", "maxItems", "minProperties", "maxProperties",
    "required", "properties", "additionalProperties", "items",
    "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type", "x-kubernetes-validations",
)  # fmt: skip
#: JSON Schema keys with no CRD meaning: dropped
_DROPPED = {"title", "examples", "deprecated", "readOnly", "writeOnly", "$schema", "$comment"}
#: the formats the apiserver validates (k8s.io/apiextensions-apiserver supported formats) whose
#: syntax is the one pydantic writes; ``duration`` is not among them (Go's ``1h30m`` there,
#: ISO 8601's ``PT1H30M`` in pydantic), so a ``timedelta`` is a plain string
_FORMATS = {
    "bsonobjectid", "uri", "email", "hostname", "ipv4", "ipv6", "cidr", "mac", "uuid", "uuid3", "uuid4", "uuid5",
    "isbn", "isbn10", "isbn13", "creditcard", "ssn", "hexcolor", "rgbcolor", "byte", "password", "date",
    "datetime", "date-time", "int32", "int64", "float", "double",
}  # fmt: skip
_RULE_ORDER = ("rule", "message", "messageExpression", "reason", "fieldPath", "optionalOldSelf")


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural ``openAPIV3Schema`` of ``model``: a :class:`CustomResource` subclass (its
    root: ``apiVersion``, ``kind``, ``metadata`` and its own fields; the class keyword ``rules=``
    as the root's ``x-kubernetes-validations``) or any other pydantic model (an object node).

    Raises:
        RegistrationError: one line naming the model and field the apiserver would refuse.
    """
    try:
        raw = model.model_json_schema(schema_generator=_Generator)
    except Exception as exc:  # pydantic's own refusal (a type with no JSON schema)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RegistrationError(f"{model.__name__}: pydantic cannot describe it as JSON schema: {first}") from None
    converter = _Converter(model.__name__, raw.pop("$defs", {}))
    if not issubclass(model, CustomResource):
        return converter.node(raw, "", ())
    properties: dict[str, Any] = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
    }
    for name, node in (raw.get("properties") or {}).items():
        if name not in properties:
            properties[name] = converter.node(node, name, ())
    root: dict[str, Any] = {}
    if raw.get("description"):
        root["description"] = raw["description"]
    root["type"] = "object"
    required = [r for r in raw.get("required") or () if r not in ("apiVersion", "kind", "metadata")]
    if required:
        root["required"] = required
    root["properties"] = properties
    rules = model.kind_of().rules if "__kind__" in model.__dict__ and model.__kind__ is not None else ()
    if rules:
        root["x-kubernetes-validations"] = [_ordered_rule(r.validation()) for r in rules]
    return root


class _Generator(GenerateJsonSchema):
    """pydantic's JSON schema, with the value of a ``default_factory`` as the field's default
    where it can be known when the schema is made (the module's docstring says when)."""

    def generate(self, schema: CoreSchema, mode: JsonSchemaMode = "validation") -> JsonSchemaValue:
        # the model's shared definitions, for the validators that check a factory's value
        self._core_definitions = list(schema.get("definitions") or ()) if schema.get("type") == "definitions" else []
        return super().generate(schema, mode)

    def encode_default(self, dft: Any) -> Any:
        """A default's JSON form, a naive ``datetime`` in it taken as UTC (``…Z``): the
        apiserver refuses a ``date-time`` without a zone in a CRD's ``default:``, and a status
        write sends a naive one as UTC (:mod:`declop.typed.status`)."""
        return super().encode_default(_aware(dft))

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is None:
            return super().get_default_value(schema)
        if schema.get("default_factory_takes_data"):
            return NoDefault
        try:
            first, second = factory(), factory()  # type: ignore[call-arg]
        except Exception:
            return NoDefault
        if _volatile(first):
            return NoDefault
        try:
            encoded = self.encode_default(first)
            if encoded != self.encode_default(second):
                return NoDefault
            validator = SchemaValidator(core_schema.definitions_schema(schema["schema"], self._core_definitions))
            validator.validate_json(json.dumps(encoded))
        except Exception:  # no JSON form, or a value the field itself refuses
            return NoDefault
        return first


def _aware(value: Any) -> Any:
    """``value`` with every naive ``datetime`` in it made UTC (the same object where there is none)."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value
    if isinstance(value, BaseModel):
        update = {k: a for k, v in value.__dict__.items() if (a := _aware(v)) is not v}
        return value.model_copy(update=update) if update else value
    if isinstance(value, dict):
        pairs = {k: _aware(v) for k, v in value.items()}
        return pairs if any(pairs[k] is not v for k, v in value.items()) else value
    if isinstance(value, (list, tuple)):
        items = [_aware(v) for v in value]
        return type(value)(items) if any(a is not b for a, b in zip(items, value)) else value
    return value


def _volatile(value: Any) -> bool:
    """Whether ``value`` holds a date, a time or a UUID: a factory that gives one is taken as
    "now" or "new", never as a constant to write into a CRD."""
    if isinstance(value, (date, time, uuid.UUID)):
        return True
    if isinstance(value, BaseModel):
        return any(_volatile(v) for v in (*value.__dict__.values(), *(value.__pydantic_extra__ or {}).values()))
    if isinstance(value, Mapping):
        return any(_volatile(k) or _volatile(v) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_volatile(v) for v in value)
    return False


def _settled(value: Any, node: Mapping[str, Any]) -> Any:
    """``value``, the default of ``node``, without the ``None`` of a nested field that has no
    default of its own and is not required (the apiserver would store a null that reads as
    absent, or refuse it in an enum)."""
    if isinstance(value, dict):
        properties = node.get("properties")
        if isinstance(properties, Mapping):
            required = set(node.get("required") or ())
            return {
                k: _settled(v, properties[k]) if k in properties else v
                for k, v in value.items()
                if not (v is None and k in properties and "default" not in properties[k] and k not in required)
            }
        values = node.get("additionalProperties")
        if isinstance(values, Mapping):
            return {k: _settled(v, values) for k, v in value.items()}
    elif isinstance(value, list) and isinstance(node.get("items"), Mapping):
        return [_settled(v, node["items"]) for v in value]
    return value


def _ordered_rule(rule: Mapping[str, Any]) -> dict[str, Any]:
    return {k: rule[k] for k in (*_RULE_ORDER, *sorted(set(rule) - set(_RULE_ORDER))) if k in rule}


class _Converter:
    """Rewrites the nodes of one model's JSON schema, with its ``$defs`` to inline."""

    def __init__(self, model: str, defs: Mapping[str, Any]) -> None:
        self.model = model
        self.defs = defs

    def error(self, where: str, what: str) -> RegistrationError:
        return RegistrationError(f"{self.model}: {where or '(the model itself)'}: {what}")

    def resolve(self, node: Mapping[str, Any], where: str, stack: tuple[str, ...]) -> tuple[dict[str, Any], tuple[str, ...]]:
        """``node`` with its ``$ref`` (or one-element ``allOf``) replaced by the definition, the
        node's own keys (description, default, markers) winning."""
        node = dict(node)
        while True:
            if "$ref" in node:
                ref = str(node.pop("$ref"))
            elif isinstance(node.get("allOf"), list) and len(node["allOf"]) == 1 and set(node["allOf"][0]) == {"$ref"}:
                ref = str(node.pop("allOf")[0]["$ref"])
            else:
                return node, stack
            name = ref.rpartition("/")[2]
            if name in stack:
                raise self.error(where, f"{name} contains itself; a CRD schema cannot be recursive (use FreeForm for the recursive part)")
            if name not in self.defs:
                raise self.error(where, f"cannot resolve {ref}")
            target = dict(self.defs[name])
            for key, value in node.items():
                if key == "x-kubernetes-validations":  # rules on the field and on the model: both
                    value = [*target.get(key, ()), *value]
                target[key] = value
            node, stack = target, (*stack, name)

    def node(self, raw: Mapping[str, Any], where: str, stack: tuple[str, ...]) -> dict[str, Any]:
        node, stack = self.resolve(raw, where, stack)
        nullable = False
        for union in ("anyOf", "oneOf"):
            if union not in node:
                continue
            every = list(node.pop(union))
            members = [m for m in every if m != {"type": "null"}]
            nullable = nullable or len(members) < len(every)
            if node.get("x-kubernetes-int-or-string") and all(m.get("type") in ("integer", "string") for m in members):
                continue
            if len(members) != 1:
                kinds = ", ".join(_describe(m) for m in members)
                raise self.error(
                    where,
                    f"a union of {kinds} cannot be a CRD field (structural schemas have one type per field); "
                    "use one type, IntOrString for int | str, or FreeForm",
                )
            merged, stack = self.resolve(members[0], where, stack)
            for key, value in node.items():
                if key == "x-kubernetes-validations":
                    value = [*merged.get(key, ()), *value]
                merged[key] = value
            node, stack = self.resolve(merged, where, stack)
        if node.get("type") == "null":
            raise self.error(where, "a field that can only be None has no place in a CRD; give it a type")
        return self.clean(node, where, stack, nullable)

    def clean(self, node: dict[str, Any], where: str, stack: tuple[str, ...], nullable: bool) -> dict[str, Any]:
        out: dict[str, Any] = {}
        free = bool(node.get("x-kubernetes-preserve-unknown-fields"))
        for key, value in node.items():
            if key in _DROPPED:
                continue
            if key == "const":
                out["enum"] = [value]
            elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
                out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
                out[key] = True
            elif key == "uniqueItems":
                if value:
                    out.setdefault("x-kubernetes-list-type", "set")
            elif key == "format":
                if value in _FORMATS:
                    out["format"] = value
            elif key == "default":
                if value is not None:
                    out["default"] = value
            elif key == "properties":
                prefix = f"{where}." if where else ""
                out["properties"] = {name: self.node(sub, prefix + name, stack) for name, sub in value.items()}
            elif key == "items":
                if not isinstance(value, Mapping):
                    raise self.error(where, "a tuple cannot be a CRD field; use list[X]")
                out["items"] = self.node(value, f"{where}[]", stack)
            elif key == "additionalProperties":
                if value is True:
                    if "properties" in node:  # a model with extra="allow": it asked to keep unknown fields
                        out["x-kubernetes-preserve-unknown-fields"] = True
                    elif not free:
                        raise self.error(where, "a dict of Any has no schema; use FreeForm (kept as sent) or dict[str, X]")
                elif isinstance(value, Mapping):
                    out["additionalProperties"] = self.node(value, f"{where}[*]", stack)
            elif key == "x-kubernetes-validations":
                out[key] = [_ordered_rule(r) for r in value]
            elif key in ("prefixItems", "patternProperties", "propertyNames", "not", "allOf", "discriminator", "$ref"):
                raise self.error(where, f"JSON schema {key!r} has no structural CRD equivalent; use a plainer type (or FreeForm)")
            elif key in _ORDER:
                out[key] = value
            else:
                raise self.error(where, f"JSON schema key {key!r} is not part of a CRD schema")
        if nullable and "enum" not in out:
            # an enum stays without: the apiserver checks a null against the enum and refuses it
            # (null in the enum too); without nullable a null is pruned, read back as None
            out["nullable"] = True
        if "type" not in out and not (out.get("x-kubernetes-int-or-string") or out.get("x-kubernetes-preserve-unknown-fields")):
            if "enum" in out:
                raise self.error(where, "an enum of values of different types cannot be a CRD field; use values of one type")
            raise self.error(where, "a field of type Any has no schema; use FreeForm for free-form data, or give it a type")
        if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out and not free:
            if not out.get("x-kubernetes-preserve-unknown-fields"):
                raise self.error(where, "an object with no fields and no value type; use FreeForm, dict[str, X] or a model with fields")
        if out.get("x-kubernetes-list-type") == "set" and out.get("items", {}).get("type") in ("object", "array"):
            raise self.error(where, "a set of objects or lists is not allowed; use a list with ListType('map', keys=(...)) for objects")
        if "default" in out:
            out["default"] = _settled(out["default"], out)
        return {k: out[k] for k in _ORDER if k in out}


def _describe(member: Mapping[str, Any]) -> str:
    if "$ref" in member:
        return str(member["$ref"]).rpartition("/")[2]
    if "x-kubernetes-int-or-string" in member:
        return "IntOrString"
    return {"integer": "int", "string": "str", "number": "float", "boolean": "bool", "array": "list", "object": "dict"}.get(
        str(member.get("type")), str(member.get("type", "Any"))
    )
