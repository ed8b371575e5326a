"""declop.typed.dump.as_json: the JSON form every dict-taking call site asks of a typed model."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone

import pytest
from pydantic import BaseModel, Field, computed_field

from declop.typed.dump import as_json, is_model
from declop.typed.model import CustomResource, ObjectMeta


class PartSpec(BaseModel):
    size: int = 1
    label: str | None = None
    at: datetime | None = None


class Part(CustomResource, group="example.com", version="v1", kind="Part"):
    spec: PartSpec = Field(default_factory=PartSpec)


def test_a_mapping_is_returned_as_it_is_in_every_form() -> None:
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    assert all(as_json(obj, form) is obj for form in ("whole", "set", "identity"))


def test_whole_is_every_value_but_a_none_never_set_and_names_the_kind() -> None:
    part = Part(metadata=ObjectMeta(name="p", namespace="ns"), spec=PartSpec(size=2))
    out = as_json(part)
    assert (out["apiVersion"], out["kind"]) == ("example.com/v1", "Part")  # from the class
    assert out["spec"] == {"size": 2}  # label and at: None, never set
    assert out["metadata"]["name"] == "p" and out["metadata"]["namespace"] == "ns"
    part.spec.label = None  # set to None on purpose: sent as null
    assert as_json(part)["spec"] == {"size": 2, "label": None}


def test_set_is_only_the_fields_set() -> None:
    part = Part(spec=PartSpec(size=3))
    assert as_json(part, "set") == {"apiVersion": "example.com/v1", "kind": "Part", "spec": {"size": 3}}
    assert as_json(PartSpec(), "set") == {}


def test_identity_is_api_version_kind_and_metadata() -> None:
    view = Part.model_validate({"apiVersion": "example.com/v1", "kind": "Part", "spec": {"size": 1},
                                "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
                                             "creationTimestamp": "2026-05-01T12:00:00Z"}})
    out = as_json(view, "identity")
    assert set(out) == {"apiVersion", "kind", "metadata"}
    assert {k: out["metadata"][k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")} == {
        "name": "p", "namespace": "ns", "uid": "u-1", "resourceVersion": "7", "creationTimestamp": "2026-05-01T12:00:00Z"}


def test_a_naive_datetime_is_sent_as_utc_and_the_model_is_not_changed() -> None:
    spec = PartSpec(at=datetime(2026, 5, 1, 12, 0))
    assert as_json(spec)["at"] == "2026-05-01T12:00:00Z"
    assert as_json(spec, "set")["at"] == "2026-05-01T12:00:00Z"
    assert spec.at is not None and spec.at.tzinfo is None
    aware = PartSpec(at=datetime(2026, 5, 1, 14, 0, tzinfo=timezone.utc))
    assert as_json(aware)["at"] == "2026-05-01T14:00:00Z"


def test_computed_fields_are_left_out_where_pydantic_can() -> None:
    class Sized(BaseModel):
        size: int = 1

        @computed_field  # type: ignore[prop-decorator]
        @property
        def double(self) -> int:
            return self.size * 2

    import inspect

    if "exclude_computed_fields" in inspect.signature(BaseModel.model_dump).parameters:
        assert as_json(Sized()) == {"size": 1}


@pytest.mark.parametrize("bad", [None, "ns/name", 3, [1]])
def test_anything_else_is_one_clear_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match=r"^expected the object as read \(a dict, or a typed model such as obj: Widget\), got "):
        as_json(bad)


def test_a_wrong_form_is_refused() -> None:
    with pytest.raises(ValueError, match="form must be one of whole, set, identity"):
        as_json({}, "all")  # type: ignore[arg-type]


def test_is_model_and_the_module_import_pydantic_never() -> None:
    assert is_model(PartSpec()) and not is_model({}) and not is_model(PartSpec)
    code = "import sys, declop.typed.dump as d; assert not d.is_model({}); assert 'pydantic' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
