"""Typed status writes against the real apiserver, through a running operator, on the CRD
``declop crd`` makes of the model: what the handler's model says is what is stored.

* the docs' pattern (``status = obj.status or LampStatus()`` then in-place changes) writes the
  first condition and a sub-model the status lacked; a naive ``datetime`` is stored as UTC; a map
  key removed is removed; a nullable field whose default is not ``None`` stores ``null``; a
  computed field, and list items whose defaults the apiserver filled in, are not re-sent: a
  reconcile that changes nothing sends nothing;
* concurrency: another writer changes a field the handler also changes, between the handler's
  read and its write. The write is refused (a ``test`` fails), raised as Conflict, retried on
  the fresh status; a field only the other writer changed is kept.
"""

from __future__ import annotations

import logging
import subprocess
from datetime import datetime
from typing import Any, Iterator, Literal

import kubernetes.client
import pytest
from pydantic import BaseModel, Field, computed_field

import declop
from declop.kube.keys import Request
from declop.manager import Options
from declop.testing.cluster.runner import OperatorRunner, wait_for
from declop.typed.crd import definitions, dump
from declop.typed.model import CustomResource

pytestmark = pytest.mark.integration

GROUP = "status.declop.example.com"


class Condition(BaseModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    lastTransitionTime: datetime


class Replicas(BaseModel):
    ready: int = 0
    desired: int = 0


class LampSpec(BaseModel):
    replicas: int = 1
    workers: list[str] = Field(default_factory=list)
    limit: int | None = 5
    level: int = 0


class LampStatus(BaseModel):
    conditions: list[Condition] = Field(default_factory=list)
    replicas: Replicas = Field(default_factory=Replicas)
    workers: dict[str, int] = Field(default_factory=dict)
    limit: int | None = 5
    level: int = 0
    note: str = ""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def summary(self) -> str:
        return f"{len(self.conditions)} conditions"


class Lamp(CustomResource, group=GROUP, version="v1", kind="Lamp"):
    spec: LampSpec = Field(default_factory=LampSpec)
    status: LampStatus | None = None


@pytest.fixture(scope="module")
def lamps(control_plane: Any) -> Iterator[kubernetes.client.CustomObjectsApi]:
    kubectl, env = [control_plane.binary("kubectl")], control_plane.env()
    subprocess.run([*kubectl, "apply", "-f", "-"], input=dump(definitions([Lamp])), text=True, env=env, check=True, capture_output=True)
    subprocess.run([*kubectl, "wait", "--for=condition=Established", f"crd/lamps.{GROUP}", "--timeout=60s"],
                   env=env, check=True, capture_output=True)
    with control_plane.api_client() as api:
        yield kubernetes.client.CustomObjectsApi(api)


def test_what_the_model_says_is_stored_and_an_unchanged_status_is_not_sent(
    kubeconfig: str, namespace: str, lamps: kubernetes.client.CustomObjectsApi
) -> None:
    registry = declop.registry.Registry()
    calls: list[int] = []

    @declop.reconciler(Lamp, registry=registry)
    def lamp(request: Request, client: declop.Client, obj: Lamp | None, **_: Any) -> None:
        if obj is None:
            return
        calls.append(obj.metadata.generation or 0)
        status = obj.status or LampStatus()  # the docs' pattern
        if not any(c.type == "Ready" for c in status.conditions):
            status.conditions.append(Condition(type="Ready", status="True", lastTransitionTime=datetime(2024, 1, 1)))  # naive
        status.replicas.ready = obj.spec.replicas
        for name in [n for n in status.workers if n not in obj.spec.workers]:
            del status.workers[name]
        for name in obj.spec.workers:
            status.workers.setdefault(name, 1)
        status.limit = obj.spec.limit
        client.patch_status(request, status)

    def read() -> dict[str, Any]:
        return lamps.get_namespaced_custom_object(GROUP, "v1", namespace, "lamps", "l")  # type: ignore[no-any-return]

    body = {"apiVersion": f"{GROUP}/v1", "kind": "Lamp", "metadata": {"name": "l"},
            "spec": {"replicas": 2, "workers": ["a", "b"], "limit": None}}
    lamps.create_namespaced_custom_object(GROUP, "v1", namespace, "lamps", body)
    with OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=5)) as op:
        wait_for(lambda: "status" in read(), 20, what="the first status")
        assert read()["status"] == {
            "conditions": [{"type": "Ready", "status": "True", "reason": "", "message": "",
                            "lastTransitionTime": "2024-01-01T00:00:00Z"}],
            "replicas": {"ready": 2, "desired": 0},  # desired: the CRD's default
            "workers": {"a": 1, "b": 1},
            "limit": None,  # stored null, not the default 5
            "level": 0, "note": "",  # the CRD's defaults; no summary (computed: never sent)
        }
        lamps.patch_namespaced_custom_object(GROUP, "v1", namespace, "lamps", "l", {"spec": {"workers": ["b"], "limit": 3}})
        wait_for(lambda: read()["status"]["workers"] == {"b": 1}, 20, what="worker a removed from the status")
        assert read()["status"]["limit"] == 3

        wait_for(lambda: len(op.manager.controllers[0].queue) == 0 and calls.count(2) >= 1, 20, what="settled")
        patches = op.statistics().by_verb.get("patch", 0)
        seen = len(calls)
        lamps.patch_namespaced_custom_object(GROUP, "v1", namespace, "lamps", "l", {"metadata": {"labels": {"poke": "1"}}})
        wait_for(lambda: len(calls) > seen, 20, what="the reconcile of the label change")
        assert op.statistics().by_verb.get("patch", 0) == patches, "an unchanged typed status was sent"


def test_a_field_another_writer_changed_since_the_read_is_a_conflict_retried_and_theirs_is_kept(
    kubeconfig: str, namespace: str, lamps: kubernetes.client.CustomObjectsApi, caplog: pytest.LogCaptureFixture
) -> None:
    registry = declop.registry.Registry()
    read_levels: list[int | None] = []
    interfere = ["once"]

    @declop.reconciler(Lamp, registry=registry)
    def lamp(request: Request, client: declop.Client, obj: Lamp | None, **_: Any) -> None:
        if obj is None:
            return
        status = obj.status or LampStatus()
        read_levels.append(obj.status.level if obj.status else None)
        if interfere:  # between this read and the write below, someone else writes level and note
            interfere.clear()
            lamps.patch_namespaced_custom_object_status(
                GROUP, "v1", request.namespace, "lamps", request.name, {"status": {"level": 100, "note": "theirs"}}
            )
        status.level = obj.spec.level + (100 if status.level >= 100 else 0)  # 7 over theirs: 107, and stays
        client.patch_status(request, status)

    def read() -> dict[str, Any]:
        return lamps.get_namespaced_custom_object(GROUP, "v1", namespace, "lamps", "r")  # type: ignore[no-any-return]

    body = {"apiVersion": f"{GROUP}/v1", "kind": "Lamp", "metadata": {"name": "r"}, "spec": {"level": 7}}
    lamps.create_namespaced_custom_object(GROUP, "v1", namespace, "lamps", body)
    lamps.patch_namespaced_custom_object_status(GROUP, "v1", namespace, "lamps", "r", {"status": {"level": 1}})
    caplog.set_level(logging.INFO, logger="declop")
    with OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=5)) as op:
        try:
            wait_for(lambda: read()["status"]["level"] == 107, 20, what="the retried write on the other writer's level")
        except AssertionError:
            q = op.manager.controllers[0].queue
            key = Request(namespace, "r")
            raise AssertionError(f"read {read_levels}, stored {read()['status']}, queue len {len(q)} requeues {q.num_requeues(key)} waiting {q.is_waiting(key)}") from None
        # the first write (level 7 over the 1 it read) was refused: not a silent overwrite of 100
        assert read_levels[:2] == [1, 100], read_levels
        assert read()["status"]["note"] == "theirs"  # only they changed it: kept
        conflicts = [r for r in caplog.records if r.getMessage() == "Conflict, requeueing"]
        assert conflicts and "the status changed since the handler read it" in conflicts[0].__dict__["kv"]["error"]
