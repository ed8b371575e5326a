"""declop.typed.schema: defaults. A ``default_factory`` whose value can be known when the CRD is
generated is a ``default:`` like a plain default, so the apiserver stores what Python would
read; one that is volatile (a uuid, "now"), fails, or gives a value the field refuses gives
none. (The apiserver's side: tests/integration/test_typed_crd.py.)"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from declop.typed.model import CustomResource, FreeForm, ListType, Rule
from declop.typed.schema import openapi_schema


class Port(BaseModel):
    name: str = "http"
    number: int = Field(80, ge=1)


class Spec(BaseModel):
    replicas: int = Field(1, ge=0)
    image: str = "nginx:1.27"
    secretName: str | None = None
    tier: Literal["gold", "silver"] | None = None
    ports: list[Port] = Field(default_factory=lambda: [Port()])
    labels: dict[str, str] = Field(default_factory=dict)


class Status(BaseModel):
    conditions: Annotated[list[dict[str, str]], ListType("atomic")] = Field(default_factory=list)


class ByFactory(CustomResource, group="example.com", version="v1", kind="ByFactory"):
    spec: Spec = Field(default_factory=Spec)
    status: Status | None = None


class ByValue(CustomResource, group="example.com", version="v1", kind="ByValue"):
    spec: Spec = Spec()
    status: Status | None = None


#: what the apiserver should store for an object sent without ``spec`` (None fields absent)
SPEC_DEFAULT = {"replicas": 1, "image": "nginx:1.27", "ports": [{"name": "http", "number": 80}], "labels": {}}


def props(model: type[BaseModel]) -> dict[str, Any]:
    node: dict[str, Any] = openapi_schema(model)["properties"]
    return node


def test_a_model_valued_factory_is_the_fields_default_with_nones_left_absent() -> None:
    spec = props(ByFactory)["spec"]
    assert spec["default"] == SPEC_DEFAULT
    assert "spec" not in openapi_schema(ByFactory).get("required", ())


def test_a_plain_model_default_and_its_factory_give_the_same_schema() -> None:
    assert props(ByFactory)["spec"] == props(ByValue)["spec"]


def test_container_factories_and_nested_ones_are_defaults_too() -> None:
    spec = props(ByFactory)["spec"]["properties"]
    assert spec["labels"]["default"] == {}
    assert spec["ports"]["default"] == [{"name": "http", "number": 80}]
    assert props(Status)["conditions"]["default"] == []


def test_volatile_failing_and_data_taking_factories_give_no_default() -> None:
    def boom() -> str:
        raise RuntimeError("no")

    class Volatile(BaseModel):
        uid: str = Field(default_factory=lambda: str(uuid.uuid4()))
        token: uuid.UUID = Field(default_factory=uuid.uuid4)
        at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
        fixed: datetime = Field(default_factory=lambda: datetime(2026, 1, 1, tzinfo=timezone.utc))  # a time is taken as "now"
        failing: str = Field(default_factory=boom)
        echo: int = Field(default_factory=lambda data: 1)  # reads the other fields: unknown until then

    p = props(Volatile)
    for name in ("uid", "token", "at", "fixed", "failing", "echo"):
        assert "default" not in p[name], name


def test_a_factory_whose_value_the_field_refuses_gives_no_default() -> None:
    class Holder(BaseModel):
        tags: list[str] = Field(default_factory=list, min_length=1)
        nested: Spec = Field(default_factory=lambda: Spec.model_construct(replicas=-1))

    p = props(Holder)
    assert "default" not in p["tags"] and "default" not in p["nested"]


def test_an_unserialisable_factory_value_gives_no_default() -> None:
    class Holder(BaseModel):
        bag: FreeForm = Field(default_factory=lambda: {"f": object()})

    assert "default" not in props(Holder)["bag"]


def test_a_nested_none_is_kept_where_the_field_defaults_to_something_else_or_is_required() -> None:
    class Inner(BaseModel):
        note: str | None = "hello"
        must: int | None

    class Holder(BaseModel):
        inner: Inner = Field(default_factory=lambda: Inner(note=None, must=None))

    assert props(Holder)["inner"]["default"] == {"note": None, "must": None}


def test_the_default_is_the_full_value_so_rules_on_the_nested_model_see_every_field() -> None:
    """The apiserver validates a default as written, before nested defaults apply: ``{}`` would
    fail a CEL rule reading ``self.replicas``."""

    class Ruled(BaseModel):
        replicas: Annotated[int, Rule("self >= 0")] = 2

    class Holder(BaseModel):
        ruled: Ruled = Field(default_factory=Ruled)

    assert props(Holder)["ruled"]["default"] == {"replicas": 2}


def test_a_naive_datetime_default_is_written_as_utc() -> None:
    """Found by tests/integration/test_typed_status_props.py: a naive default was written with no
    zone, and the apiserver refused the whole CRD (``must be of type date-time``)."""
    from datetime import datetime as dt

    class Stamp(BaseModel):
        at: dt = dt(1983, 3, 18, 3, 24, 35, 24625)

    class Clock(CustomResource, group="example.com", version="v1", kind="Clock"):
        spec: Stamp = Field(default_factory=Stamp)
        stamps: list[Stamp] = [Stamp(at=dt(2020, 1, 1))]

    props = openapi_schema(Clock)["properties"]
    assert props["spec"]["properties"]["at"]["default"] == "1983-03-18T03:24:35.024625Z"
    assert props["stamps"]["default"] == [{"at": "2020-01-01T00:00:00Z"}]
