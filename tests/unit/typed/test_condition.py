"""declop.Condition: apimachinery's metav1.Condition as a pydantic model, and its CRD schema."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated

import pytest
from pydantic import BaseModel, Field, ValidationError

import declop
from declop.typed.condition import Condition
from declop.typed.dump import as_json
from declop.typed.model import CustomResource, ListType
from declop.typed.schema import openapi_schema

WHEN = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)


class GizmoStatus(BaseModel):
    conditions: Annotated[list[declop.Condition], ListType("map", keys=("type",))] = Field(default_factory=list)


class Gizmo(CustomResource, group="example.com", version="v1", kind="Gizmo"):
    status: GizmoStatus | None = None


def item_schema() -> dict:
    return openapi_schema(Gizmo)["properties"]["status"]["properties"]["conditions"]["items"]


def test_the_front_door_name_is_the_model() -> None:
    assert declop.Condition is Condition


def test_the_crd_requires_what_kubernetes_requires() -> None:
    """metav1.Condition: type, status, lastTransitionTime, reason and message are +required
    (k8s.io/apimachinery/pkg/apis/meta/v1/types.go); observedGeneration is optional."""
    schema = item_schema()
    assert sorted(schema["required"]) == ["lastTransitionTime", "message", "reason", "status", "type"]
    props = schema["properties"]
    assert props["reason"]["minLength"] == 1 and props["reason"]["maxLength"] == 1024
    assert props["reason"]["pattern"] == "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
    assert "minLength" not in props["message"] and props["message"]["maxLength"] == 32768
    assert props["type"]["maxLength"] == 316
    assert props["type"]["pattern"] == (
        r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
    )
    assert props["status"]["enum"] == ["True", "False", "Unknown"]
    assert props["lastTransitionTime"] == {**props["lastTransitionTime"], "type": "string", "format": "date-time"}
    assert props["observedGeneration"]["minimum"] == 0
    assert all("default" not in p for p in props.values())


def test_reason_and_message_are_required_in_python_too() -> None:
    with pytest.raises(ValidationError) as info:
        Condition(type="Ready", status="True", lastTransitionTime=WHEN)  # type: ignore[call-arg]
    assert {e["loc"] for e in info.value.errors()} == {("reason",), ("message",)}


@pytest.mark.parametrize(
    "field, value",
    [("reason", ""), ("reason", "not camel"), ("type", "has space"), ("status", "true"), ("observedGeneration", -1)],
)
def test_what_the_apiserver_refuses_the_model_refuses(field: str, value: object) -> None:
    given = {"type": "Ready", "status": "True", "reason": "Available", "message": "", "lastTransitionTime": WHEN, field: value}
    with pytest.raises(ValidationError):
        Condition(**given)


def test_its_json_form_is_what_the_apiserver_stores() -> None:
    naive = Condition(type="example.com/Synced", status="False", reason="Waiting", message="",
                      lastTransitionTime=datetime(2026, 5, 1, 12, 0))
    assert as_json(naive) == {"type": "example.com/Synced", "status": "False", "lastTransitionTime": "2026-05-01T12:00:00Z",
                              "reason": "Waiting", "message": ""}
