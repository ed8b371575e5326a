"""Typed handlers against a real apiserver: ``obj: Gizmo`` gets a validated view; an object the
apiserver stored but the model refuses (the CRD's schema is looser than the model) is reported once
per resourceVersion and not retried; fixing it gets it reconciled; a typed ``patch_status`` sends
only the fields that changed, and nothing when nothing did."""

from __future__ import annotations

import logging
import subprocess
from typing import Any, Iterator

import kubernetes.client
import pytest
import yaml
from pydantic import BaseModel, Field

import declop
from declop.kube.keys import Request
from declop.manager import Options
from declop.testing.cluster.runner import OperatorRunner, wait_for
from declop.typed.model import CustomResource, FreeForm

pytestmark = pytest.mark.integration

GROUP, PLURAL = "typed.declop.io", "gizmos"

#: loose on purpose: spec and status keep anything, so an object the model refuses can be stored
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "gizmo", "kind": "Gizmo", "listKind": "GizmoList"},
        "versions": [{
            "name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            }}},
        }],
    },
}


class GizmoSpec(BaseModel):
    replicas: int = Field(1, ge=0, le=10)
    config: FreeForm = Field(default_factory=dict)


class GizmoStatus(BaseModel):
    ready: bool = False
    observedGeneration: int | None = None
    note: str = ""


class Gizmo(CustomResource, group=GROUP, version="v1", kind="Gizmo"):
    spec: GizmoSpec
    status: GizmoStatus | None = None


@pytest.fixture(scope="module")
def gizmos(control_plane: Any) -> Iterator[kubernetes.client.CustomObjectsApi]:
    kubectl, env = [control_plane.binary("kubectl")], control_plane.env()
    subprocess.run([*kubectl, "apply", "-f", "-"], input=yaml.safe_dump(CRD), text=True, env=env, check=True, capture_output=True)
    subprocess.run(
        [*kubectl, "wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s"],
        env=env, check=True, capture_output=True,
    )
    yield kubernetes.client.CustomObjectsApi(control_plane.api_client())


def gizmo(name: str, replicas: int) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1", "kind": "Gizmo", "metadata": {"name": name}, "spec": {"replicas": replicas}}


def test_a_typed_handler_skips_an_invalid_object_once_per_resource_version_and_writes_only_changed_status(
    kubeconfig: str, namespace: str, gizmos: kubernetes.client.CustomObjectsApi, caplog: pytest.LogCaptureFixture
) -> None:
    registry = declop.registry.Registry()
    calls: list[tuple[str, int]] = []
    interfere: list[str] = ["good"]  # the first call of "good": someone else writes status.note meanwhile

    def read(name: str) -> dict[str, Any]:
        return gizmos.get_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, name)  # type: ignore[no-any-return]

    def patch(name: str, body: dict[str, Any], status: bool = False) -> dict[str, Any]:
        fn = gizmos.patch_namespaced_custom_object_status if status else gizmos.patch_namespaced_custom_object
        return fn(GROUP, "v1", namespace, PLURAL, name, body)  # type: ignore[no-any-return]

    @declop.reconciler(Gizmo, registry=registry)
    def reconcile(request: Request, client: declop.Client, obj: Gizmo | None, **_: Any) -> None:
        if obj is None:
            return
        assert isinstance(obj, Gizmo)
        calls.append((request.name, obj.spec.replicas))
        status = obj.status or GizmoStatus()
        status.ready = True
        status.observedGeneration = obj.metadata.generation
        if request.name in interfere:
            interfere.remove(request.name)
            patch(request.name, {"status": {"note": "written by someone else"}}, status=True)
        client.patch_status(request, status)

    caplog.set_level(logging.WARNING, logger="declop")
    bad = gizmos.create_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, gizmo("bad", 30))
    gizmos.create_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, gizmo("good", 2))

    def reports(rv: str) -> list[logging.LogRecord]:
        return [
            r for r in caplog.records
            if r.getMessage() == "Object fails its model; skipped until it changes"
            and r.__dict__.get("kv", {}).get("name") == "bad" and r.__dict__.get("kv", {}).get("resourceVersion") == rv
        ]

    with OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=5)) as op:
        controller = op.manager.controllers[0]
        key = Request(namespace, "bad")
        wait_for(lambda: read("good").get("status", {}).get("ready") is True, 20, what="good's status")
        wait_for(lambda: reports(bad["metadata"]["resourceVersion"]), 20, what="the report of bad")

        # only the changed fields were sent: the note written meanwhile by someone else survives
        assert read("good")["status"] == {"ready": True, "observedGeneration": 1, "note": "written by someone else"}
        # that other write is an event: good is reconciled again, and its status, unchanged, is not sent
        wait_for(lambda: calls.count(("good", 2)) >= 2, 20, what="good's second reconcile")
        rv_after = read("good")["metadata"]["resourceVersion"]
        patches = op.statistics().by_verb.get("patch", 0)
        patch("good", {"metadata": {"labels": {"poke": "1"}}})
        wait_for(lambda: calls.count(("good", 2)) >= 3, 20, what="good's third reconcile")
        assert op.statistics().by_verb.get("patch", 0) == patches, "an unchanged typed status was sent"
        assert read("good")["metadata"]["resourceVersion"] != rv_after  # (only our label poke)

        # bad: never handed to the handler, reported once, not retried (no backoff, nothing waiting)
        rv1 = bad["metadata"]["resourceVersion"]
        assert [r.__dict__["kv"]["errors"] for r in reports(rv1)] == ["spec.replicas: Input should be less than or equal to 10"]
        assert all(name != "bad" for name, _ in calls)
        assert controller.queue.num_requeues(key) == 0 and not controller.queue.is_waiting(key)
        events = kubernetes.client.EventsV1Api(gizmos.api_client)
        wait_for(
            lambda: [e for e in events.list_namespaced_event(namespace).items
                     if e.reason == "InvalidObject" and e.type == "Warning" and e.regarding.name == "bad"],
            20, what="the Warning Event on bad",
        )

        # a new resourceVersion that is still invalid is reported again, once
        rv2 = patch("bad", {"spec": {"replicas": 40}})["metadata"]["resourceVersion"]
        wait_for(lambda: reports(rv2), 20, what="the report of bad's second version")
        # a fix is reconciled
        patch("bad", {"spec": {"replicas": 3}})
        wait_for(lambda: ("bad", 3) in calls, 20, what="the fixed bad to be reconciled")
        wait_for(lambda: read("bad").get("status", {}).get("ready") is True, 20, what="bad's status")
        assert len(reports(rv1)) == 1 and len(reports(rv2)) == 1
        assert controller.queue.num_requeues(key) == 0



def test_an_object_being_deleted_that_fails_its_model_keeps_our_finalizer_loudly_until_fixed(
    kubeconfig: str, namespace: str, gizmos: kubernetes.client.CustomObjectsApi, caplog: pytest.LogCaptureFixture
) -> None:
    """Cleanup never runs on an object the handler cannot read: our finalizer stays, the report
    says so, and a fix lets cleanup run and the object go."""
    finalizer = "typed.declop.io/cleanup"
    registry = declop.registry.Registry()
    phases: list[tuple[declop.Phase, int]] = []

    @declop.reconciler(Gizmo, registry=registry, finalizer=finalizer)
    def cleanup(phase: declop.Phase, obj: Gizmo | None, **_: Any) -> None:
        if obj is not None:
            phases.append((phase, obj.spec.replicas))

    def read() -> dict[str, Any] | None:
        try:
            return gizmos.get_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, "doomed")  # type: ignore[no-any-return]
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def waits() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith("Deletion waits") and r.__dict__["kv"]["name"] == "doomed"]

    caplog.set_level(logging.WARNING, logger="declop")
    gizmos.create_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, gizmo("doomed", 2))
    with OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=5)):
        wait_for(lambda: (declop.Phase.CREATED, 2) in phases, 20, what="the CREATED call")
        gizmos.patch_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, "doomed", {"spec": {"replicas": 50}})
        gizmos.delete_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, "doomed")
        wait_for(waits, 20, what="the report that deletion waits")
        assert waits()[0].__dict__["kv"]["command"] == f"kubectl edit {PLURAL}.{GROUP} doomed -n {namespace}"
        held = read()
        assert held is not None and finalizer in held["metadata"]["finalizers"]
        assert all(phase is not declop.Phase.DELETING for phase, _ in phases)
        gizmos.patch_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, "doomed", {"spec": {"replicas": 1}})
        wait_for(lambda: read() is None, 20, what="the fixed object to be cleaned up and go")
        assert phases[-1] == (declop.Phase.DELETING, 1) and len(waits()) == 1
