"""Typed everywhere, against a real apiserver (issue 44, items 6 and 8): a handler that declares
``obj: Part`` hands the typed view to ``client.event`` (an Event is recorded — before, only a log
line "'Part' object has no attribute 'get'"), to ``set_controller_reference`` and
``create_or_update`` (a ConfigMap and a typed child, both owned), sets a ``declop.Condition``
with ``declop.conditions.set`` on its typed status and writes it with ``patch_status``; the CRD
``declop crd`` makes of ``declop.Condition`` requires ``reason`` and ``message``, as Kubernetes'
own condition type does."""

from __future__ import annotations

import subprocess
from typing import Annotated, Any, Iterator

import kubernetes.client
import pytest
from kubernetes.client.rest import ApiException
from pydantic import BaseModel, Field

import declop
from declop.kube.keys import Request
from declop.manager import Options
from declop.testing.cluster.runner import OperatorRunner, wait_for
from declop.typed.crd import definitions, dump
from declop.typed.model import CustomResource, ListType, ObjectMeta

pytestmark = pytest.mark.integration

GROUP, PLURAL = "everywhere.declop.io", "parts"


class PartSpec(BaseModel):
    size: int = Field(1, ge=0, le=10)


class PartStatus(BaseModel):
    observedGeneration: int | None = None
    conditions: Annotated[list[declop.Condition], ListType("map", keys=("type",))] = Field(default_factory=list)


class Part(CustomResource, group=GROUP, version="v1", kind="Part"):
    spec: PartSpec = Field(default_factory=PartSpec)
    status: PartStatus | None = None


@pytest.fixture(scope="module")
def parts(control_plane: Any) -> Iterator[kubernetes.client.CustomObjectsApi]:
    kubectl, env = [control_plane.binary("kubectl")], control_plane.env()
    subprocess.run([*kubectl, "apply", "-f", "-"], input=dump(definitions([Part])), text=True, env=env, check=True, capture_output=True)
    subprocess.run(
        [*kubectl, "wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s"],
        env=env, check=True, capture_output=True,
    )
    yield kubernetes.client.CustomObjectsApi(control_plane.api_client())


def test_a_typed_handler_records_events_owns_children_and_sets_conditions(
    kubeconfig: str, namespace: str, control_plane: Any, parts: kubernetes.client.CustomObjectsApi
) -> None:
    registry = declop.registry.Registry()
    seen: list[type] = []

    @declop.reconciler(Part, owns=["configmaps"], registry=registry)
    def part(request: Request, client: declop.Client, obj: Part | None, **_: Any) -> None:
        if obj is None or obj.metadata.name.endswith("-copy"):
            return
        seen.append(type(client.get(Part, request)))  # a read through the model gives its view
        client.event(obj, "Seen", f"size {obj.spec.size}")
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": obj.metadata.name, "namespace": obj.metadata.namespace}}

        def own(child: dict[str, Any]) -> None:
            declop.set_controller_reference(child, obj)
            child["data"] = {"size": str(obj.spec.size)}

        declop.create_or_update(client, cm, own)
        copy = Part(metadata=ObjectMeta(name=f"{obj.metadata.name}-copy", namespace=obj.metadata.namespace),
                    spec=PartSpec(size=obj.spec.size))
        declop.set_controller_reference(copy, obj)
        declop.create_or_update(client, copy)
        status = obj.status or PartStatus()
        declop.conditions.set(status, "Ready", True, reason="ChildrenInPlace", message="the ConfigMap and the copy are there",
                              observed_generation=obj.metadata.generation)
        status.observedGeneration = obj.metadata.generation
        client.patch_status(request, status)

    parts.create_namespaced_custom_object(GROUP, "v1", namespace, PLURAL,
                                          {"apiVersion": f"{GROUP}/v1", "kind": "Part", "metadata": {"name": "p"}, "spec": {"size": 3}})
    api = control_plane.api_client()
    core, events = kubernetes.client.CoreV1Api(api), kubernetes.client.EventsV1Api(api)

    def stored(name: str) -> dict[str, Any]:
        return parts.get_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, name)  # type: ignore[no-any-return]

    with OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=5)):
        wait_for(lambda: declop.conditions.is_true((stored("p").get("status") or {}), "Ready"), 30, what="p's Ready condition")
        wait_for(lambda: [e for e in events.list_namespaced_event(namespace).items if e.regarding.name == "p"], 30,
                 what="an Event about p")

    uid = stored("p")["metadata"]["uid"]
    (event,) = [e for e in events.list_namespaced_event(namespace).items if e.regarding.name == "p"]
    assert (event.reason, event.note, event.type) == ("Seen", "size 3", "Normal")
    assert (event.regarding.kind, event.regarding.uid, event.reporting_controller) == ("Part", uid, "declop.io/part")

    cm_refs = core.read_namespaced_config_map("p", namespace).metadata.owner_references
    assert [(r.kind, r.name, r.uid, r.controller) for r in cm_refs] == [("Part", "p", uid, True)]
    copy_refs = stored("p-copy")["metadata"]["ownerReferences"]
    assert [(r["kind"], r["name"], r["uid"], r["controller"]) for r in copy_refs] == [("Part", "p", uid, True)]
    assert stored("p-copy")["spec"] == {"size": 3}

    status = stored("p")["status"]
    (ready,) = status["conditions"]
    assert {k: ready[k] for k in ("type", "status", "reason", "message", "observedGeneration")} == {
        "type": "Ready", "status": "True", "reason": "ChildrenInPlace",
        "message": "the ConfigMap and the copy are there", "observedGeneration": 1}
    assert ready["lastTransitionTime"].endswith("Z")
    assert seen and set(seen) == {Part}


def test_the_crd_requires_a_conditions_reason_and_message_as_kubernetes_does(
    namespace: str, parts: kubernetes.client.CustomObjectsApi
) -> None:
    parts.create_namespaced_custom_object(GROUP, "v1", namespace, PLURAL,
                                          {"apiVersion": f"{GROUP}/v1", "kind": "Part", "metadata": {"name": "q"}})
    condition = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-05-01T12:00:00Z"}
    for missing in ("reason", "message"):
        given = {**condition, "reason": "Ok", "message": ""}
        del given[missing]
        with pytest.raises(ApiException) as info:
            parts.patch_namespaced_custom_object_status(GROUP, "v1", namespace, PLURAL, "q", {"status": {"conditions": [given]}})
        assert info.value.status == 422 and f"status.conditions[0].{missing}: Required value" in info.value.body
    with pytest.raises(ApiException) as info:
        parts.patch_namespaced_custom_object_status(GROUP, "v1", namespace, PLURAL, "q",
                                                    {"status": {"conditions": [{**condition, "reason": "", "message": ""}]}})
    assert info.value.status == 422 and "status.conditions[0].reason" in info.value.body
    accepted = {**condition, "reason": "Ok", "message": ""}
    parts.patch_namespaced_custom_object_status(GROUP, "v1", namespace, PLURAL, "q", {"status": {"conditions": [accepted]}})
