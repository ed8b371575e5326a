"""``declop.Condition``: one entry of a typed ``status.conditions``, as Kubernetes' ``metav1.Condition``.

    class WidgetStatus(BaseModel):
        conditions: Annotated[list[declop.Condition], ListType("map", keys=("type",))] = Field(default_factory=list)

    declop.conditions.set(status, "Ready", True, reason="Available", message="3/3 ready",
                          observed_generation=obj.metadata.generation)

Invariants:

* the fields, their JSON names, bounds and patterns are apimachinery's ``metav1.Condition``
  (``k8s.io/apimachinery/pkg/apis/meta/v1/types.go``): ``type``, ``status``, ``reason``,
  ``message`` and ``lastTransitionTime`` are required — in Python and in the CRD ``declop crd``
  writes — and ``observedGeneration`` is optional, at least 0;
* ``reason`` may not be empty (the apiserver's ``minLength: 1``); ``message`` may;
* a naive ``lastTransitionTime`` is sent as UTC (:mod:`declop.typed.dump`); ``declop.conditions``
  writes whole seconds in UTC, as ``metav1.Time`` does.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["Condition"]

#: apimachinery's ``+kubebuilder:validation:Pattern`` of ``type`` and of ``reason``
TYPE_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class Condition(BaseModel):
    """One aspect of the object's state, as Kubernetes' metav1.Condition: what kubectl wait --for=condition=Ready reads."""

    type: str = Field(
        max_length=316,
        pattern=TYPE_PATTERN,
        description="The type of the condition, in CamelCase or in foo.example.com/CamelCase.",
    )
    status: Literal["True", "False", "Unknown"] = Field(description="The status of the condition: True, False or Unknown.")
    observedGeneration: int | None = Field(
        None, ge=0, description="The .metadata.generation that the condition was set based upon."
    )
    lastTransitionTime: datetime = Field(
        description="The last time the condition transitioned from one status to another."
    )
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=REASON_PATTERN,
        description="A programmatic identifier of the reason for the last transition, in CamelCase.",
    )
    message: str = Field(
        max_length=32768, description="A human readable message with details about the transition; may be empty."
    )
