"""Typed mutators and converters (declop.webhooks.typed, through the webhook server): what the
handler sets on the model is what the patch or the converted object says — nothing more (no
unset default injected, no field the model does not carry removed) and nothing less (in-place
changes, removed map keys, a None)."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import datetime
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from pydantic import BaseModel, ConfigDict, Field

import declop
from declop.errors import RegistrationError
from declop.registry import Registry
from declop.typed.model import CustomResource
from declop.webhooks.patch import apply
from declop.webhooks.server import WebhookServer


class Port(BaseModel):
    name: str = "http"
    number: int = 80


class Tls(BaseModel):
    enabled: bool = False
    secret: str | None = None


class GizmoSpec(BaseModel):
    size: int = Field(1, ge=0, le=5)
    image: str = "nginx"
    note: str | None = None
    ports: list[Port] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    tls: Tls = Field(default_factory=Tls)
    expires: datetime | None = None


class Gizmo(CustomResource, group="example.com", version="v1", kind="Gizmo"):
    spec: GizmoSpec = Field(default_factory=GizmoSpec)


class GizmoSpecV2(BaseModel):
    model_config = ConfigDict(extra="forbid")
    replicas: int = 1
    image: str = "nginx"


class GizmoV2(CustomResource, group="example.com", version="v2", kind="Gizmo", storage=False):
    spec: GizmoSpecV2 = Field(default_factory=GizmoSpecV2)


OBJ = {
    "apiVersion": "example.com/v1",
    "kind": "Gizmo",
    "metadata": {"name": "g", "namespace": "ns", "labels": {"app": "x"}, "uid": "u-1"},
    "spec": {"size": 2, "labels": {"a": "1", "b": "2"}, "ports": [{"name": "web", "number": 8080, "unknownToModel": True}]},
    "status": {"whatever": 1},
}


def admission(obj: Any = OBJ, operation: str = "CREATE") -> dict[str, Any]:
    request = {"uid": "u1", "operation": operation, "object": obj, "namespace": "ns", "name": "g"}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def conversion(desired: str, *objects: dict[str, Any]) -> dict[str, Any]:
    request = {"uid": "c1", "desiredAPIVersion": desired, "objects": list(objects)}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", "request": request}


def post(reg: Registry, body: dict[str, Any]) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        server = WebhookServer(reg.webhooks, port=0, ssl_context=None)
        try:
            async with TestClient(TestServer(server.app())) as client:
                resp = await client.post(reg.webhooks[0].path, data=json.dumps(body).encode())
                assert resp.status == 200
                answer: dict[str, Any] = await resp.json()
                return answer
        finally:
            await server.stop()

    return asyncio.run(go())


def mutate(fn: Any, obj: dict[str, Any] = OBJ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Register ``fn`` as a mutator of Gizmo, send ``obj``: (the patch, the patched object)."""
    reg = Registry()
    declop.mutator(Gizmo, registry=reg)(fn)
    response = post(reg, admission(obj))["response"]
    assert response["allowed"] is True, response
    patch = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    return patch, apply(obj, patch)


def test_an_in_place_change_patches_that_field_only() -> None:
    def set_size(obj: Gizmo) -> None:
        obj.spec.size = 4

    patch, after = mutate(set_size)
    assert patch == [{"op": "replace", "path": "/spec/size", "value": 4}]
    # no unset default injected (image, tls, note), the port's unknown field and the status kept
    assert after["spec"] == {**OBJ["spec"], "size": 4} and after["status"] == OBJ["status"]


def test_a_change_to_an_absent_default_is_sent_and_only_the_change() -> None:
    def change(obj: Gizmo) -> None:
        obj.spec.tls.enabled = True  # tls is absent: a default_factory model
        obj.metadata.annotations["seen"] = "yes"  # annotations are absent too

    patch, after = mutate(change)
    assert after["spec"]["tls"] == {"enabled": True}
    assert after["metadata"]["annotations"] == {"seen": "yes"} and after["metadata"]["labels"] == {"app": "x"}
    assert {op["path"] for op in patch} == {"/spec/tls", "/metadata/annotations"}


def test_list_and_map_edits_in_place() -> None:
    def edit(obj: Gizmo) -> None:
        del obj.spec.labels["a"]
        obj.spec.labels["c"] = "3"
        obj.spec.ports[0].number = 9090

    patch, after = mutate(edit)
    assert after["spec"]["labels"] == {"b": "2", "c": "3"}
    assert after["spec"]["ports"] == [{"name": "web", "number": 9090, "unknownToModel": True}]  # same length: item by item
    assert {"op": "remove", "path": "/spec/labels/a"} in patch

    def grow(obj: Gizmo) -> None:
        obj.spec.ports.append(Port())

    _, after = mutate(grow)
    assert after["spec"]["ports"] == [{"name": "web", "number": 8080}, {"name": "http", "number": 80}]  # replaced whole


def test_none_is_sent_as_null_and_a_naive_datetime_as_utc() -> None:
    def clear(obj: Gizmo) -> None:
        obj.spec.note = None
        obj.spec.expires = datetime(2026, 1, 2, 3, 4, 5)

    obj = {**OBJ, "spec": {**OBJ["spec"], "note": "hello"}}
    _, after = mutate(clear, obj)
    assert after["spec"]["note"] is None
    assert after["spec"]["expires"] == "2026-01-02T03:04:05Z"


def test_a_handler_that_changes_nothing_sends_no_patch() -> None:
    def look(obj: Gizmo) -> None:
        assert obj.spec.image == "nginx"  # the default, read but not written

    assert mutate(look)[0] == []
    odd = {**OBJ, "spec": {"size": 2.0, "expires": "2026-01-02T03:04:05+00:00"}}  # the model reads them as 2 and a UTC time
    assert mutate(look, odd)[0] == []


def test_a_returned_model_replaces_what_it_carries_and_keeps_the_rest() -> None:
    def replace(obj: Gizmo) -> Gizmo:
        return Gizmo(spec=GizmoSpec(size=5, labels={"a": "1"}))

    _, after = mutate(replace)
    assert after["metadata"] == OBJ["metadata"]  # the new model set no metadata: the object's stays
    assert (after["apiVersion"], after["kind"]) == ("example.com/v1", "Gizmo")
    assert after["spec"]["size"] == 5 and after["spec"]["labels"] == {"a": "1"} and after["spec"]["ports"] == []
    assert after["status"] == OBJ["status"]

    def as_dict(obj: Gizmo) -> dict[str, Any]:
        return {**OBJ, "spec": {"size": 1}}

    _, after = mutate(as_dict)
    assert after["spec"] == {"size": 1}  # a dict is the new object, as for an untyped mutator


def test_an_object_the_model_refuses_is_denied_by_field_without_calling() -> None:
    called = []
    reg = Registry()

    @declop.mutator(Gizmo, registry=reg)
    def never(obj: Gizmo) -> None:
        called.append(obj)

    response = post(reg, admission({**OBJ, "spec": {"size": 9}}))["response"]
    assert response["allowed"] is False and response["status"]["code"] == 422
    assert response["status"]["message"] == "spec.size: Input should be less than or equal to 5" and called == []


def test_a_typed_mutator_returning_something_else_is_denied() -> None:
    reg = Registry()

    @declop.mutator(Gizmo, registry=reg)
    def wrong(obj: Gizmo) -> Any:
        return 42

    response = post(reg, admission())["response"]
    assert response["allowed"] is False and response["status"]["code"] == 500


# --------------------------------------------------------------------------- converters


def register_converter(fn: Any) -> Registry:
    reg = Registry()
    declop.converter(Gizmo, registry=reg)(fn)
    return reg


def both_ways(obj: Gizmo | GizmoV2, desired_api_version: str) -> Gizmo | GizmoV2:
    if isinstance(obj, Gizmo):
        return GizmoV2(spec=GizmoSpecV2(replicas=obj.spec.size, image=obj.spec.image))
    return Gizmo(metadata=obj.metadata, spec=GizmoSpec(size=obj.spec.replicas, image=obj.spec.image))


def test_a_typed_converter_gets_the_source_versions_model_and_returns_the_targets() -> None:
    reg = register_converter(both_ways)
    assert reg.webhooks[0].model == (Gizmo, GizmoV2)
    v2 = {"apiVersion": "example.com/v2", "kind": "Gizmo", "metadata": {"name": "g", "labels": {"app": "x"}}, "spec": {"replicas": 3}}
    response = post(reg, conversion("example.com/v2", OBJ, v2))["response"]
    assert response["result"]["status"] == "Success", response
    to_v2, untouched = response["convertedObjects"]
    assert untouched == v2  # already at the desired version: not given to the converter
    (from_v2,) = post(reg, conversion("example.com/v1", v2))["response"]["convertedObjects"]
    # the source model set no metadata: kind and metadata are the object's; no None the handler never set
    assert to_v2 == {"apiVersion": "example.com/v2", "kind": "Gizmo", "metadata": OBJ["metadata"], "spec": {"replicas": 2, "image": "nginx"}}
    assert from_v2["apiVersion"] == "example.com/v1" and from_v2["metadata"] == {"name": "g", "labels": {"app": "x"}}
    assert from_v2["spec"] == {"size": 3, "image": "nginx", "ports": [], "labels": {}, "tls": {"enabled": False}}


def test_a_typed_converter_may_return_a_dict_or_change_obj_in_place() -> None:
    def in_place(obj: Gizmo | GizmoV2, desired_api_version: str) -> None:
        obj.metadata.labels["converted"] = "yes"

    same = {**OBJ, "apiVersion": "example.com/v2", "spec": {"replicas": 1, "image": "x"}}
    response = post(register_converter(in_place), conversion("example.com/v1", same))["response"]
    (out,) = response["convertedObjects"]
    assert out["metadata"]["labels"] == {"app": "x", "converted": "yes"} and out["spec"] == {"replicas": 1, "image": "x"}

    def as_dict(obj: Gizmo | GizmoV2, desired_api_version: str) -> dict[str, Any]:
        return {"spec": {"replicas": 7}}

    (out,) = post(register_converter(as_dict), conversion("example.com/v2", OBJ))["response"]["convertedObjects"]
    assert out["spec"] == {"replicas": 7}


def test_a_typed_converter_fails_the_review_for_an_invalid_object_or_a_version_without_a_model() -> None:
    reg = register_converter(both_ways)
    response = post(reg, conversion("example.com/v2", {**OBJ, "spec": {"size": 9}}))["response"]
    assert response["result"]["status"] == "Failure"
    assert response["result"]["message"] == "converting ns/g from example.com/v1 to example.com/v2: spec.size: Input should be less than or equal to 5"

    def only_v1(obj: Gizmo, desired_api_version: str) -> None: ...

    v3 = {**OBJ, "apiVersion": "example.com/v3"}
    response = post(register_converter(only_v1), conversion("example.com/v1", v3))["response"]
    assert response["result"]["status"] == "Failure"
    assert "obj is annotated with Gizmo (example.com/v1), not a model of example.com/v3" in response["result"]["message"]


class Other(CustomResource, group="other.example.com", version="v1", kind="Other"):
    pass


class GizmoAgain(CustomResource, group="example.com", version="v1", kind="Gizmo"):
    pass


def test_a_converter_annotation_is_checked_at_registration() -> None:
    def wrong_kind(obj: Gizmo | Other) -> None: ...

    def twice(obj: Gizmo | GizmoAgain) -> None: ...

    with pytest.raises(RegistrationError, match=r"Other \(others.other.example.com\), which is not a version of gizmos.example.com"):
        register_converter(wrong_kind)
    with pytest.raises(RegistrationError, match="Gizmo and GizmoAgain are both example.com/v1; name each version once"):
        register_converter(twice)
    assert register_converter(lambda obj: None).webhooks[0].model is None  # untyped: dicts, as before


def test_a_typed_converter_returning_something_else_fails_the_review() -> None:
    def wrong(obj: Gizmo | GizmoV2, desired_api_version: str) -> Any:
        return 42

    response = post(register_converter(wrong), conversion("example.com/v2", OBJ))["response"]
    assert response["result"]["status"] == "Failure" and "raised TypeError" in response["result"]["message"]
