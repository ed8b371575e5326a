"""declop.typed.schema: a model → the structural schema the apiserver accepts (the apiserver's
own verdict is in tests/integration/test_typed_crd.py)."""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from declop.errors import RegistrationError
from declop.typed.model import CustomResource, FreeForm, IntOrString, ListType, MapType, Rule
from declop.typed.schema import openapi_schema


def field(model: type[BaseModel], name: str) -> dict[str, Any]:
    schema = openapi_schema(model)
    node: dict[str, Any] = schema["properties"][name]
    return node


def walk(node: Any) -> list[dict[str, Any]]:
    """Every schema node under ``node``."""
    found = []
    if isinstance(node, dict):
        found.append(node)
        for key in ("properties", "additionalProperties"):
            sub = node.get(key)
            if key == "properties" and isinstance(sub, dict):
                for child in sub.values():
                    found.extend(walk(child))
            elif isinstance(sub, dict):
                found.extend(walk(sub))
        if isinstance(node.get("items"), dict):
            found.extend(walk(node["items"]))
    return found


class Color(str, Enum):
    RED = "red"
    BLUE = "blue"


class Condition(BaseModel):
    """A condition."""

    type: str
    status: Literal["True", "False", "Unknown"]
    lastTransitionTime: datetime


class Spec(BaseModel):
    """What the widget should be."""

    replicas: int = Field(1, ge=0, le=10, description="Pods to run.")
    ratio: float = Field(0.5, gt=0, lt=1)
    name: str = Field("w", min_length=1, max_length=63, pattern=r"^[a-z]+$")
    tags: list[str] = Field(default_factory=list, min_length=1, max_length=5)
    labels: dict[str, str] = Field(default_factory=dict, max_length=8)
    color: Color = Color.RED
    mode: Literal["fast", "slow"] = "fast"
    only: Literal["one"] = "one"
    port: IntOrString = 80
    limit: IntOrString | None = None
    extra: FreeForm = Field(default_factory=dict)
    owner: Condition | None = None
    conditions: Annotated[list[Condition], ListType("map", keys=("type",))] = Field(default_factory=list)
    unique: set[str] = Field(default_factory=set)
    selector: Annotated[dict[str, str], MapType("atomic")] = Field(default_factory=dict)
    even: Annotated[int, Rule("self % 2 == 0", message="must be even", reason="FieldValueInvalid")] = 0


class Widget(CustomResource, group="example.com", version="v1", kind="Widget", rules=(Rule("self.spec.replicas <= 5", message="at most 5"),)):
    """A widget."""

    spec: Spec
    status: dict[str, int] | None = None


def test_no_ref_no_defs_no_title_anywhere() -> None:
    text = repr(openapi_schema(Widget))
    assert "$ref" not in text and "$defs" not in text and "'title'" not in text and "anyOf" not in text


def test_every_node_has_a_type_unless_int_or_string_or_free_form() -> None:
    for node in walk(openapi_schema(Widget)):
        assert "type" in node or node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields"), node


def test_the_root_keeps_metadata_a_plain_object_and_never_preserves_unknown_fields() -> None:
    schema = openapi_schema(Widget)
    assert schema["type"] == "object" and schema["description"] == "A widget."
    assert schema["properties"]["metadata"] == {"type": "object"}
    assert schema["properties"]["apiVersion"] == {"type": "string"} == schema["properties"]["kind"]
    assert "x-kubernetes-preserve-unknown-fields" not in schema  # the root is extra="allow" in Python
    assert schema["required"] == ["spec"]


def test_class_rules_go_on_the_root() -> None:
    assert openapi_schema(Widget)["x-kubernetes-validations"] == [{"rule": "self.spec.replicas <= 5", "message": "at most 5"}]


def test_descriptions_come_from_docstrings_and_field_descriptions() -> None:
    spec = field(Widget, "spec")
    assert spec["description"] == "What the widget should be."
    assert spec["properties"]["replicas"]["description"] == "Pods to run."
    assert spec["properties"]["owner"]["description"] == "A condition."


def test_bounds_and_defaults() -> None:
    p = field(Widget, "spec")["properties"]
    assert p["replicas"] == {"description": "Pods to run.", "type": "integer", "default": 1, "minimum": 0, "maximum": 10}
    assert p["ratio"] == {"type": "number", "default": 0.5, "minimum": 0, "exclusiveMinimum": True, "maximum": 1, "exclusiveMaximum": True}
    assert p["name"] == {"type": "string", "default": "w", "minLength": 1, "maxLength": 63, "pattern": "^[a-z]+$"}
    assert (p["tags"]["minItems"], p["tags"]["maxItems"]) == (1, 5)
    assert p["labels"]["maxProperties"] == 8
    assert "default" not in p["tags"]  # default_factory: nothing for the apiserver to fill in


def test_enums_from_literal_and_enum_and_a_single_literal() -> None:
    p = field(Widget, "spec")["properties"]
    assert p["color"] == {"type": "string", "default": "red", "enum": ["red", "blue"]}
    assert p["mode"] == {"type": "string", "default": "fast", "enum": ["fast", "slow"]}
    assert p["only"]["enum"] == ["one"]


def test_an_optional_enum_is_not_nullable_so_that_a_null_is_pruned_not_refused() -> None:
    class Holder(BaseModel):
        tier: Literal["gold", "silver"] | None = None
        color: Color | None = None

    p = openapi_schema(Holder)["properties"]
    assert p["tier"] == {"type": "string", "enum": ["gold", "silver"]}
    assert p["color"] == {"type": "string", "enum": ["red", "blue"]}


def test_formats_the_apiserver_reads_as_pydantic_writes_them_are_kept_the_others_dropped() -> None:
    from datetime import date, time, timedelta
    from uuid import UUID

    class Times(BaseModel):
        at: datetime
        on: date
        clock: time
        every: timedelta
        id: UUID

    p = openapi_schema(Times)["properties"]
    assert (p["at"]["format"], p["on"]["format"], p["id"]["format"]) == ("date-time", "date", "uuid")
    assert p["clock"] == {"type": "string"} and p["every"] == {"type": "string"}  # ISO 8601, not Go's 1h30m


def test_int_or_string_and_optional_int_or_string() -> None:
    p = field(Widget, "spec")["properties"]
    assert p["port"] == {"default": 80, "x-kubernetes-int-or-string": True}
    assert p["limit"] == {"nullable": True, "x-kubernetes-int-or-string": True}


def test_optional_model_is_inlined_and_nullable() -> None:
    owner = field(Widget, "spec")["properties"]["owner"]
    assert owner["type"] == "object" and owner["nullable"] is True and "default" not in owner
    assert owner["properties"]["lastTransitionTime"] == {"type": "string", "format": "date-time"}
    assert owner["properties"]["status"]["enum"] == ["True", "False", "Unknown"]
    assert owner["required"] == ["type", "status", "lastTransitionTime"]


def test_free_form_only_where_asked() -> None:
    p = field(Widget, "spec")["properties"]
    assert p["extra"] == {"type": "object", "default": {}, "x-kubernetes-preserve-unknown-fields": True}  # default_factory=dict
    asked = [n for n in walk(openapi_schema(Widget)) if n.get("x-kubernetes-preserve-unknown-fields")]
    assert asked == [p["extra"]]


def test_a_nested_model_with_extra_allow_keeps_unknown_fields_and_forbid_adds_nothing() -> None:
    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")
        a: int = 0

    class Closed(BaseModel):
        model_config = ConfigDict(extra="forbid")
        a: int = 0

    class Holder(BaseModel):
        open: Open
        closed: Closed

    p = openapi_schema(Holder)["properties"]
    assert p["open"]["x-kubernetes-preserve-unknown-fields"] is True and "additionalProperties" not in p["open"]
    assert "additionalProperties" not in p["closed"] and "x-kubernetes-preserve-unknown-fields" not in p["closed"]


def test_dict_is_additional_properties() -> None:
    assert field(Widget, "status") == {"type": "object", "nullable": True, "additionalProperties": {"type": "integer"}}


def test_list_and_map_types() -> None:
    p = field(Widget, "spec")["properties"]
    assert (p["conditions"]["x-kubernetes-list-type"], p["conditions"]["x-kubernetes-list-map-keys"]) == ("map", ["type"])
    assert p["unique"]["x-kubernetes-list-type"] == "set" and "uniqueItems" not in p["unique"]
    assert p["selector"]["x-kubernetes-map-type"] == "atomic"


def test_a_field_rule_is_x_kubernetes_validations_with_its_keys_in_order() -> None:
    even = field(Widget, "spec")["properties"]["even"]
    assert even["x-kubernetes-validations"] == [{"rule": "self % 2 == 0", "message": "must be even", "reason": "FieldValueInvalid"}]
    assert list(even["x-kubernetes-validations"][0]) == ["rule", "message", "reason"]


def test_rules_on_a_model_field_and_on_its_model_both_stay() -> None:
    class Inner(BaseModel):
        model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{"rule": "self.a < 3"}]})
        a: int = 0

    class Outer(BaseModel):
        inner: Annotated[Inner, Rule("self.a > 0")]

    rules = openapi_schema(Outer)["properties"]["inner"]["x-kubernetes-validations"]
    assert rules == [{"rule": "self.a < 3"}, {"rule": "self.a > 0"}]


def test_markers_refuse_a_wrong_shape() -> None:
    with pytest.raises(RegistrationError, match="keys= names the key fields"):
        ListType("map")
    with pytest.raises(RegistrationError, match="keys= names the key fields"):
        ListType("set", keys=("a",))
    with pytest.raises(RegistrationError, match="'atomic' or 'granular'"):
        MapType("whole")  # type: ignore[arg-type]


# -- refusals: one line naming the field --------------------------------------------------------


def refused(model: type[BaseModel]) -> str:
    with pytest.raises(RegistrationError) as caught:
        openapi_schema(model)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_union_is_refused_naming_the_field() -> None:
    class A(BaseModel):
        x: int = 0

    class B(BaseModel):
        y: int = 0

    class Spec(BaseModel):
        value: int | str = 0
        either: A | B | None = None

    class Thing(CustomResource, group="example.com", version="v1", kind="Thing"):
        spec: Spec

    message = refused(Thing)
    assert message.startswith("Thing: spec.value: a union of int, str cannot be a CRD field") and "IntOrString" in message


def test_a_union_of_models_is_refused() -> None:
    class A(BaseModel):
        x: int = 0

    class B(BaseModel):
        y: int = 0

    class Holder(BaseModel):
        either: A | B | None = None

    assert refused(Holder).startswith("Holder: either: a union of A, B cannot be a CRD field")


def test_a_recursive_model_is_refused_naming_the_field() -> None:
    message = refused(Node)
    assert message.startswith("Node: children[]: Node contains itself; a CRD schema cannot be recursive")


class Node(BaseModel):
    name: str = ""
    children: list[Node] = Field(default_factory=list)


def test_any_and_dict_of_any_are_refused_with_free_form_named() -> None:
    class Loose(BaseModel):
        anything: Any = None

    class Bag(BaseModel):
        bag: dict[str, Any] = Field(default_factory=dict)

    assert refused(Loose).startswith("Loose: anything: a field of type Any has no schema; use FreeForm")
    assert refused(Bag).startswith("Bag: bag: a dict of Any has no schema; use FreeForm")


def test_a_tuple_and_an_enum_of_mixed_types_are_refused() -> None:
    class Pair(BaseModel):
        pair: tuple[int, str] = (0, "")

    class Mixed(BaseModel):
        value: Literal[1, "one"] = 1

    assert "Pair: pair:" in refused(Pair)
    assert refused(Mixed).startswith("Mixed: value:")


def test_a_set_of_objects_is_refused() -> None:
    class Item(BaseModel):
        model_config = ConfigDict(frozen=True)
        a: int = 0

    class Bag(BaseModel):
        items: Annotated[list[Item], ListType("set")] = Field(default_factory=list)

    assert "use a list with ListType('map'" in refused(Bag)


def test_the_same_model_gives_the_same_schema() -> None:
    assert repr(openapi_schema(Widget)) == repr(openapi_schema(Widget))
