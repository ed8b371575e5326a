"""The typed view of a cached object (declop.typed.view): validated, sharing nothing with the
cache, failures named by field path; the ``obj`` annotation read at
registration (this module uses ``from __future__ import annotations``, so every annotation below
is a string until it is resolved)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, model_validator

from declop.cache.store import clone
from declop.errors import InvalidObject, RegistrationError
from declop.typed.model import CustomResource, FreeForm
from declop.typed.view import model_of, view


class Port(BaseModel):
    name: str
    port: int = Field(ge=1, le=65535)


class WidgetSpec(BaseModel):
    replicas: int = Field(1, ge=0, le=10)
    ports: list[Port] = Field(default_factory=list)
    config: FreeForm = Field(default_factory=dict)
    extra: list[dict[str, Any]] = Field(default_factory=list)


class WidgetStatus(BaseModel):
    ready: bool = False
    observedGeneration: int | None = None
    phase: str = ""
    inner: dict[str, Any] = Field(default_factory=dict)


class Widget(CustomResource, group="example.com", version="v1", kind="Widget"):
    spec: WidgetSpec
    status: WidgetStatus | None = None


class Abstract(CustomResource):
    pass


OBJ: dict[str, Any] = {
    "apiVersion": "example.com/v1",
    "kind": "Widget",
    "metadata": {"name": "w", "namespace": "default", "uid": "u1", "resourceVersion": "7", "generation": 2,
                 "labels": {"app": "w"}, "creationTimestamp": "2026-01-01T00:00:00Z"},
    "spec": {"replicas": 3, "ports": [{"name": "http", "port": 80}],
             "config": {"nested": {"list": [1, {"deep": "x"}]}}, "extra": [{"any": {"k": ["v"]}}]},
    "status": {"ready": False, "phase": "Pending", "unknown": "kept by the apiserver"},
}


def test_a_view_is_the_model_validated_from_the_object() -> None:
    w = view(Widget, OBJ)
    assert isinstance(w, Widget)
    assert w.spec.replicas == 3 and w.spec.ports[0].port == 80
    assert w.metadata.name == "w" and w.metadata.resourceVersion == "7"
    assert w.metadata.creationTimestamp == "2026-01-01T00:00:00Z"  # type: ignore[attr-defined]  # extra metadata kept


def test_mutating_nested_free_form_content_of_the_view_leaves_the_cache_unchanged() -> None:
    """pydantic keeps ``Any`` values by reference when it validates Python objects; the view is
    validated from JSON, so even the deepest free-form value is a new object."""
    cached = copy.deepcopy(OBJ)
    w = view(Widget, cached)
    w.spec.config["nested"]["list"][1]["deep"] = "changed"  # type: ignore[index]
    w.spec.config["nested"]["list"].append("more")  # type: ignore[index]
    w.spec.extra[0]["any"]["k"].append("w")
    w.spec.ports[0].port = 8080
    w.metadata.labels["app"] = "changed"
    assert w.status is not None
    w.status.phase = "Ready"
    assert cached == OBJ


def test_an_invalid_object_raises_with_every_field_path_and_message() -> None:
    bad = clone(OBJ)
    bad["spec"]["replicas"] = 30
    bad["spec"]["ports"][0]["port"] = 0
    with pytest.raises(InvalidObject) as caught:
        view(Widget, bad)
    assert caught.value.problems == (
        "spec.replicas: Input should be less than or equal to 10",
        "spec.ports[0].port: Input should be greater than or equal to 1",
    )
    assert caught.value.resource_version == "7" and caught.value.report


def test_a_missing_required_field_is_named() -> None:
    bad = {k: v for k, v in OBJ.items() if k != "spec"}
    with pytest.raises(InvalidObject) as caught:
        view(Widget, bad)
    assert caught.value.problems == ("spec: Field required",)


def test_the_message_never_holds_the_value() -> None:
    bad = clone(OBJ)
    bad["spec"]["replicas"] = "s3cr3t-value"
    with pytest.raises(InvalidObject) as caught:
        view(Widget, bad)
    assert "s3cr3t" not in str(caught.value)


# --------------------------------------------------------------------------- model_of


def typed(obj: Widget, **_: Any) -> None: ...


def optional(obj: Widget | None, **_: Any) -> None: ...


def plain(obj: dict[str, Any], **_: Any) -> None: ...


def untyped(obj, **_):  # type: ignore[no-untyped-def]
    ...


def test_model_of_resolves_string_annotations() -> None:
    assert model_of(typed, "typed") is Widget
    assert model_of(optional, "optional") is Widget


def test_model_of_is_none_for_a_dict_or_no_annotation() -> None:
    assert model_of(plain, "plain") is None
    assert model_of(untyped, "untyped") is None


def test_an_unresolvable_annotation_is_one_line_naming_obj() -> None:
    def local(obj: NotDefinedAnywhere, **_: Any) -> None: ...  # type: ignore[name-defined]  # noqa: F821

    with pytest.raises(RegistrationError, match=r"^handler 'local': cannot resolve the annotation of obj \('NotDefinedAnywhere'\).*module level$"):
        model_of(local, "local")


def test_a_model_without_a_kind_is_refused() -> None:
    def abstract(obj: Abstract, **_: Any) -> None: ...

    with pytest.raises(RegistrationError, match="names no kind"):
        model_of(abstract, "abstract")


# --------------------------------------------------------------------------- the two validation paths


class Mutating(CustomResource, group="example.com", version="v1", kind="Mutating"):
    """A before-validator sees its input: were it the cached dict, it could change the cache."""

    spec: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def scribble(cls, data: Any) -> Any:
        data["spec"]["scribbled"] = True
        return data


def test_a_plain_data_model_is_validated_from_the_cached_dict_and_its_shared_values_copied() -> None:
    from declop.typed.view import _plain

    assert _plain(Widget)  # so the aliasing test above covers the direct path
    cached = clone(OBJ)
    cached["unknown"] = {"top": ["level"]}  # extra="allow": kept by reference by pydantic
    cached["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    cached["metadata"]["ownerReferences"] = [{"name": "o", "extra": {"deep": [1]}}]
    before = copy.deepcopy(cached)
    w = view(Widget, cached)
    w.unknown["top"].append("changed")  # type: ignore[attr-defined]
    w.metadata.managedFields[0]["manager"] = "changed"  # type: ignore[attr-defined]
    w.metadata.ownerReferences[0]["extra"]["deep"].append(2)
    assert cached == before


def test_a_model_with_a_validator_is_validated_from_json_so_the_validator_cannot_touch_the_cache() -> None:
    from declop.typed.view import _plain

    assert not _plain(Mutating)
    cached = {"apiVersion": "example.com/v1", "kind": "Mutating", "metadata": {"name": "m"}, "spec": {"a": 1}}
    before = copy.deepcopy(cached)
    m = view(Mutating, cached)
    assert m.spec == {"a": 1, "scribbled": True} and cached == before


class DeferredSpec(BaseModel):
    model_config = ConfigDict(defer_build=True)

    replicas: int = 1
    config: FreeForm = Field(default_factory=dict)


class Deferred(CustomResource, group="example.com", version="v1", kind="Deferred"):
    model_config = ConfigDict(defer_build=True, extra="allow")

    spec: DeferredSpec


def test_a_model_built_on_first_use_is_viewed_and_shares_nothing() -> None:
    """``defer_build=True``: the class's validator is a placeholder until first use; the view,
    which calls the validator directly, builds it as ``model_validate`` would."""
    cached = {"apiVersion": "example.com/v1", "kind": "Deferred", "metadata": {"name": "d"},
              "spec": {"replicas": 2, "config": {"deep": [1]}}}
    before = copy.deepcopy(cached)
    d = view(Deferred, cached)
    assert isinstance(d, Deferred) and d.spec.replicas == 2
    d.spec.config["deep"].append(2)
    assert cached == before
