"""Strict models (``strict=True`` in the config, ``Field(strict=True)``, ``Strict`` types) read
through a view accept exactly what their JSON form accepts (issue 44, defect 3): the cache holds
JSON-shaped data (a datetime is a string, a set a list), which pydantic's Python-mode strictness
refuses and its JSON-mode strictness takes. Both the reconciler's view and a typed validator's."""

from __future__ import annotations

import asyncio
import copy
import datetime
import enum
import json
from typing import Annotated, Any

import pydantic_core
import pytest
from aiohttp.test_utils import TestClient, TestServer
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

import declop
from declop.errors import InvalidObject
from declop.registry import Registry
from declop.typed.model import CustomResource
from declop.typed.view import _plain, problems, view
from declop.webhooks.server import WebhookServer


class Color(str, enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Window(BaseModel):
    model_config = ConfigDict(strict=True)

    start: datetime.datetime
    length: datetime.timedelta = datetime.timedelta(0)
    color: Color = Color.RED


class StrictSpec(BaseModel):
    model_config = ConfigDict(strict=True)

    replicas: int = 1
    when: datetime.datetime
    day: datetime.date | None = None
    color: Color
    level: Level = Level.LOW
    tags: set[str] = Field(default_factory=set)
    frozen: frozenset[int] = frozenset()
    pair: tuple[int, str] = (0, "")
    ports: tuple[int, ...] = ()
    window: Window | None = None
    windows: list[Window] = Field(default_factory=list)
    free: dict[str, Any] = Field(default_factory=dict)


class StrictThing(CustomResource, group="example.com", version="v1", kind="StrictThing"):
    model_config = ConfigDict(strict=True, extra="allow")

    spec: StrictSpec


class FieldStrictSpec(BaseModel):
    """Strictness per field: ``Field(strict=True)`` and an ``Annotated[..., Strict()]`` type."""

    when: datetime.datetime = Field(strict=True)
    color: Annotated[Color, Strict()]
    count: int = Field(0, strict=True)


class FieldStrict(CustomResource, group="example.com", version="v1", kind="FieldStrict"):
    spec: FieldStrictSpec


class JsonNativeSpec(BaseModel):
    """Strict, but every field a JSON type: Python-mode and JSON-mode strictness agree on it."""

    model_config = ConfigDict(strict=True)

    replicas: int = 1
    name: str = ""
    ratio: float = 0.0
    items: list[dict[str, int]] = Field(default_factory=list)


class JsonNative(CustomResource, group="example.com", version="v1", kind="JsonNative"):
    spec: JsonNativeSpec


META = {"name": "s", "namespace": "default", "uid": "u1", "resourceVersion": "9"}

STRICT: dict[str, Any] = {
    "apiVersion": "example.com/v1", "kind": "StrictThing", "metadata": META,
    "spec": {
        "replicas": 2, "when": "2026-12-05T10:00:00Z", "day": "2026-12-05", "color": "blue", "level": 2,
        "tags": ["a", "b"], "frozen": [1, 2], "pair": [1, "x"], "ports": [80, 443],
        "window": {"start": "2026-12-05T11:00:00+01:00", "length": "PT30M", "color": "red"},
        "windows": [{"start": "2026-12-05T12:00:00Z"}],
        "free": {"deep": {"list": [1, {"k": "v"}]}},
    },
}


def test_a_strict_model_reads_datetimes_enums_sets_tuples_and_nested_strict_models_from_the_cached_dict() -> None:
    cached = copy.deepcopy(STRICT)
    thing = view(StrictThing, cached)
    spec = thing.spec
    assert spec.when == datetime.datetime(2026, 12, 5, 10, tzinfo=datetime.timezone.utc)
    assert spec.day == datetime.date(2026, 12, 5)
    assert spec.color is Color.BLUE and spec.level is Level.HIGH
    assert spec.tags == {"a", "b"} and spec.frozen == frozenset({1, 2})
    assert spec.pair == (1, "x") and spec.ports == (80, 443)
    assert spec.window is not None and spec.window.length == datetime.timedelta(minutes=30)
    assert spec.window.start == datetime.datetime(2026, 12, 5, 10, tzinfo=datetime.timezone.utc)
    assert spec.windows[0].color is Color.RED
    # what the view gives is what the JSON form gives
    assert thing == StrictThing.model_validate_json(json.dumps(STRICT))
    # and it shares nothing with the cache
    spec.free["deep"]["list"][1]["k"] = "changed"
    thing.metadata.labels["x"] = "y"
    assert cached == STRICT


def test_per_field_strictness_reads_the_json_form_too() -> None:
    obj = {"apiVersion": "example.com/v1", "kind": "FieldStrict", "metadata": META,
           "spec": {"when": "2026-12-05T10:00:00Z", "color": "red", "count": 3}}
    spec = view(FieldStrict, obj).spec
    assert spec.when.year == 2026 and spec.color is Color.RED and spec.count == 3


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("replicas", "2", "spec.replicas: Input should be a valid integer"),
        ("replicas", 2.0, "spec.replicas: Input should be a valid integer"),
        ("color", "green", "spec.color: Input should be 'red' or 'blue'"),
        ("when", 1733392800, "spec.when: Input should be a valid datetime"),  # JSON-strict takes only strings
        ("tags", "a", "spec.tags: Input should be a valid array"),
    ],
)
def test_a_strict_model_still_refuses_what_its_json_form_refuses(field: str, value: Any, problem: str) -> None:
    bad = copy.deepcopy(STRICT)
    bad["spec"][field] = value
    with pytest.raises(ValidationError):
        StrictThing.model_validate_json(json.dumps(bad))  # the reference: pydantic's JSON-mode strictness
    with pytest.raises(InvalidObject) as caught:
        view(StrictThing, bad)
    assert caught.value.problems == (problem,)


@pytest.mark.parametrize(
    "spec",
    [
        {"replicas": 1, "name": "n", "ratio": 1, "items": [{"a": 1}]},  # an int is a float in both modes
        {"replicas": True},
        {"replicas": "1"},
        {"replicas": 1.0},
        {"name": 3},
        {"items": [{"a": "1"}]},
        {"items": {"a": 1}},
    ],
)
def test_a_strict_model_of_json_types_keeps_the_direct_path_and_agrees_with_its_json_form(spec: dict[str, Any]) -> None:
    """Only the types whose Python form differs from their JSON form (datetimes, enums, sets,
    tuples, ...) need the JSON path; for the rest, Python-mode strictness is the same, and cheaper."""
    assert _plain(JsonNative) and not _plain(StrictThing) and not _plain(FieldStrict)
    obj = {"apiVersion": "example.com/v1", "kind": "JsonNative", "metadata": META, "spec": spec}
    try:
        expected: Any = JsonNative.model_validate_json(pydantic_core.to_json(obj))
    except ValidationError as exc:
        expected = len(exc.errors())
    try:
        got: Any = view(JsonNative, obj)
    except InvalidObject as exc:
        got = len(exc.problems)
    assert got == expected


# --------------------------------------------------------------------------- a typed validator


def test_a_typed_validator_on_a_strict_model_admits_the_stored_form_and_denies_by_field() -> None:
    """Before: every request was denied with 422 (``spec.when: Input should be a valid datetime``)
    and the handler never ran."""
    reg = Registry()
    seen: list[StrictThing] = []

    @declop.validator(StrictThing, registry=reg)
    def check(obj: StrictThing, **_: Any) -> None:
        seen.append(obj)

    path = f"/validate/{reg.webhooks[0].name}"
    bad = copy.deepcopy(STRICT)
    bad["spec"]["color"] = "green"

    async def go() -> list[dict[str, Any]]:
        server = WebhookServer(reg.webhooks, port=0, ssl_context=None)
        try:
            async with TestClient(TestServer(server.app())) as client:
                answers = []
                for uid, obj in (("u1", STRICT), ("u2", bad)):
                    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                              "request": {"uid": uid, "operation": "CREATE", "object": obj, "namespace": "default", "name": "s"}}
                    resp = await client.post(path, data=json.dumps(review).encode())
                    answers.append((await resp.json())["response"])
                return answers
        finally:
            await server.stop()

    allowed, denied = asyncio.run(go())
    assert allowed == {"uid": "u1", "allowed": True}
    assert len(seen) == 1 and seen[0].spec.color is Color.BLUE and seen[0].spec.tags == {"a", "b"}
    assert denied["allowed"] is False and denied["status"]["code"] == 422
    assert denied["status"]["message"] == "spec.color: Input should be 'red' or 'blue'"


class DeferredStrictSpec(BaseModel):
    model_config = ConfigDict(strict=True, defer_build=True)

    when: datetime.datetime


class DeferredStrict(CustomResource, group="example.com", version="v1", kind="DeferredStrict"):
    model_config = ConfigDict(defer_build=True, extra="allow")

    spec: DeferredStrictSpec


def test_a_strict_model_built_on_first_use_is_seen_as_strict() -> None:
    """``defer_build=True``: the core schema is a placeholder until the class is built, so the plan
    builds it rather than read the placeholder as "not strict"."""
    obj = {"apiVersion": "example.com/v1", "kind": "DeferredStrict", "metadata": META, "spec": {"when": "2026-12-05T10:00:00Z"}}
    assert view(DeferredStrict, obj).spec.when.day == 5


# --------------------------------------------------------------------------- the law, over generated objects

from hypothesis import given, settings  # noqa: E402 - this section's own imports
from hypothesis import strategies as st  # noqa: E402

#: JSON values, with the string forms the strict models' types take, so both outcomes are common
_FORMS = st.sampled_from(["2026-12-05T10:00:00Z", "2026-12-05", "PT30M", "red", "blue", "x", "1", "", "true"])
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2, allow_nan=False) | _FORMS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_FORMS | st.sampled_from(["a", "start", "color"]), inner, max_size=3),
    max_leaves=6,
)


def _outcome(model: type[BaseModel], obj: dict[str, Any], through_view: bool) -> Any:
    if through_view:
        try:
            return view(model, obj)  # type: ignore[arg-type]
        except InvalidObject as exc:
            return exc.problems
    try:
        return model.model_validate_json(pydantic_core.to_json(obj))
    except ValidationError as exc:
        return problems(exc)


@settings(max_examples=150, deadline=None)
@given(model=st.sampled_from([StrictThing, JsonNative, FieldStrict]),
       spec=st.dictionaries(st.sampled_from(sorted({*StrictSpec.model_fields, *JsonNativeSpec.model_fields, *FieldStrictSpec.model_fields})),
                            _JSON, max_size=6))
def test_a_view_of_a_strict_model_accepts_exactly_what_its_json_form_accepts(model: type[CustomResource], spec: dict[str, Any]) -> None:
    """Whatever path the plan picks (JSON for StrictThing and FieldStrict, the dict for
    JsonNative), the view is what the JSON form gives, or is refused at the same field paths
    (the direct path's wording may differ: "a valid list" where JSON says "a valid array")."""
    obj = {"apiVersion": "example.com/v1", "kind": model.kind_of().kind, "metadata": META, "spec": spec}
    got, expected = _outcome(model, obj, True), _outcome(model, obj, False)
    if isinstance(expected, tuple):
        assert isinstance(got, tuple), f"the view took what the JSON form refuses: {expected}"
        assert [p.split(": ")[0] for p in got] == [p.split(": ")[0] for p in expected]
    else:
        assert got == expected
