"""A strict model (``strict=True``) on a real apiserver (issue 44, defect 3): the handler gets the
stored object — whose datetimes, enums and sets are JSON strings and lists — as its model, and an
object its JSON form refuses is skipped and reported, as for any model. Before, every object was
refused and the handler never ran."""

from __future__ import annotations

import datetime
import enum
import json
import logging
import subprocess
from typing import Any, Iterator

import kubernetes.client
import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field

import declop
from declop.kube.keys import Request
from declop.manager import Options
from declop.testing.cluster.runner import OperatorRunner, wait_for
from declop.typed.model import CustomResource

pytestmark = pytest.mark.integration

GROUP, PLURAL = "strict.declop.io", "timers"

#: loose on purpose, so an object the model refuses can be stored
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "timer", "kind": "Timer", "listKind": "TimerList"},
        "versions": [{
            "name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            }}},
        }],
    },
}


class Mode(str, enum.Enum):
    ONCE = "Once"
    REPEAT = "Repeat"


class Slot(BaseModel):
    model_config = ConfigDict(strict=True)

    at: datetime.datetime
    mode: Mode = Mode.ONCE


class TimerSpec(BaseModel):
    model_config = ConfigDict(strict=True)

    start: datetime.datetime
    mode: Mode
    days: set[str] = Field(default_factory=set)
    slots: list[Slot] = Field(default_factory=list)


class TimerStatus(BaseModel):
    model_config = ConfigDict(strict=True)

    seen: datetime.datetime | None = None
    mode: Mode | None = None


class Timer(CustomResource, group=GROUP, version="v1", kind="Timer"):
    model_config = ConfigDict(strict=True, extra="allow")

    spec: TimerSpec
    status: TimerStatus | None = None


@pytest.fixture(scope="module")
def timers(control_plane: Any) -> Iterator[kubernetes.client.CustomObjectsApi]:
    kubectl, env = [control_plane.binary("kubectl")], control_plane.env()
    subprocess.run([*kubectl, "apply", "-f", "-"], input=yaml.safe_dump(CRD), text=True, env=env, check=True, capture_output=True)
    subprocess.run(
        [*kubectl, "wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s"],
        env=env, check=True, capture_output=True,
    )
    yield kubernetes.client.CustomObjectsApi(control_plane.api_client())


def timer(name: str, mode: str) -> dict[str, Any]:
    spec = {"start": "2026-12-05T10:00:00Z", "mode": mode, "days": ["mon", "tue"],
            "slots": [{"at": "2026-12-05T11:30:00+01:00", "mode": "Repeat"}]}
    return {"apiVersion": f"{GROUP}/v1", "kind": "Timer", "metadata": {"name": name}, "spec": spec}


def test_a_strict_model_reads_stored_objects_and_its_status_write_round_trips(
    kubeconfig: str, namespace: str, timers: kubernetes.client.CustomObjectsApi, caplog: pytest.LogCaptureFixture
) -> None:
    registry = declop.registry.Registry()
    seen: list[tuple[str, Any]] = []

    def read(name: str) -> dict[str, Any]:
        return timers.get_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, name)  # type: ignore[no-any-return]

    @declop.reconciler(Timer, registry=registry)
    def reconcile(request: Request, client: declop.Client, obj: Timer | None, **_: Any) -> None:
        if obj is None:
            return
        seen.append((request.name, obj.spec))
        client.patch_status(request, TimerStatus(seen=obj.spec.start, mode=obj.spec.mode))

    caplog.set_level(logging.WARNING, logger="declop")
    timers.create_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, timer("good", "Repeat"))
    bad = timers.create_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, timer("bad", "Never"))

    def reported() -> list[logging.LogRecord]:
        return [r for r in caplog.records
                if r.getMessage() == "Object fails its model; skipped until it changes"
                and r.__dict__.get("kv", {}).get("name") == "bad"
                and r.__dict__.get("kv", {}).get("resourceVersion") == bad["metadata"]["resourceVersion"]]

    with OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=5)):
        wait_for(lambda: read("good").get("status", {}).get("mode") == "Repeat", 20, what="good's status")
        wait_for(reported, 20, what="the report of bad")

    name, spec = seen[0]
    assert name == "good"
    assert spec.start == datetime.datetime(2026, 12, 5, 10, tzinfo=datetime.timezone.utc)
    assert spec.mode is Mode.REPEAT and spec.days == {"mon", "tue"}
    assert spec.slots[0].at == datetime.datetime(2026, 12, 5, 10, 30, tzinfo=datetime.timezone.utc)
    assert spec.slots[0].mode is Mode.REPEAT
    stored = Timer.model_validate_json(json.dumps(read("good")))  # the status as stored, read through the model
    assert stored.status == TimerStatus(seen=spec.start, mode=Mode.REPEAT)
    assert [r.__dict__["kv"]["errors"] for r in reported()] == ["spec.mode: Input should be 'Once' or 'Repeat'"]
    assert all(n != "bad" for n, _ in seen)
