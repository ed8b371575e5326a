"""Typed everywhere a dict is accepted (issue 44, item 6): the typed ``obj`` a handler gets goes
to ``client.event``, owner references, ``create_or_update``, the client's writes and reads — in
the unit-test fake exactly as against an apiserver (tests/integration/test_typed_everywhere_apiserver.py)."""

from __future__ import annotations

import logging
from typing import Annotated

import pytest
from pydantic import BaseModel, Field

import declop
from declop.registry import Registry
from declop.testing.fakes.client import FakeClient, run_reconcile
from declop.typed.crd import definitions
from declop.typed.model import CustomResource, ListType, ObjectMeta


class GadgetSpec(BaseModel):
    size: int = Field(1, ge=0, le=10)


class GadgetStatus(BaseModel):
    observedGeneration: int | None = None
    conditions: Annotated[list[declop.Condition], ListType("map", keys=("type",))] = Field(default_factory=list)


class Gadget(CustomResource, group="example.com", version="v1", kind="Gadget"):
    spec: GadgetSpec = Field(default_factory=GadgetSpec)
    status: GadgetStatus | None = None


CRD = definitions([Gadget])[0]
registry = Registry()


def gadget(name: str = "g", size: int = 3) -> dict:
    return {"apiVersion": "example.com/v1", "kind": "Gadget",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"size": size}}


@declop.reconciler(Gadget, owns=["configmaps"], registry=registry)
def reconcile_gadget(request, client, obj: Gadget, **_):
    client.event(obj, "Seen", f"size {obj.spec.size}")
    child = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": obj.metadata.name, "namespace": obj.metadata.namespace}}

    def mutate(cm):
        declop.set_controller_reference(cm, obj)
        cm["data"] = {"size": str(obj.spec.size)}

    declop.create_or_update(client, child, mutate)
    status = obj.status or GadgetStatus()
    declop.conditions.set(status, "Ready", True, reason="ChildInPlace", message="the ConfigMap is there",
                          observed_generation=obj.metadata.generation)
    client.patch_status(request, status)


def test_a_typed_handler_records_its_event_owns_its_child_and_sets_its_condition() -> None:
    """Before: ``client.event(obj, ...)`` raised "'Gadget' object has no attribute 'get'" in the
    fake and the reconcile was retried for ever."""
    out = run_reconcile(reconcile_gadget, "default/g", [CRD, gadget()], registry=registry)
    assert out.error is None and out.action == "done"
    (event,) = out.events
    assert event.verb == "event" and event.key == declop.Request("default", "g")
    assert (event.body["reason"], event.body["note"], event.body["type"]) == ("Seen", "size 3", "Normal")
    assert event.body["regarding"]["kind"] == "Gadget" and event.body["regarding"]["uid"]
    assert [w.verb for w in out.writes] == ["create", "patch_status"]
    cm = out.client.get("configmaps", "default/g")
    (ref,) = cm["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["controller"]) == ("Gadget", "g", True)
    stored = out.client.get(Gadget, "default/g")
    assert declop.conditions.is_true(stored.status, "Ready")
    again = run_reconcile(reconcile_gadget, "default/g", client=out.client, registry=registry)
    assert again.writes == () and again.events == ()  # converged; the repeat Event is folded, as in a cluster


def test_a_repeat_event_is_folded_into_a_series_as_the_real_recorder_folds_it() -> None:
    fake = FakeClient([CRD, gadget()])
    obj = fake.get(Gadget, "default/g")
    fake.event(obj, "Seen", "same")
    fake.event(obj, "Seen", "same")
    assert [e.verb for e in fake.events] == ["event"]
    fake.server.clock.advance(11)
    fake.event(obj, "Seen", "same")
    assert [e.verb for e in fake.events] == ["event", "patch"]
    assert fake.events[1].body["series"]["count"] == 3


def test_an_event_the_apiserver_refuses_is_logged_and_not_recorded(caplog: pytest.LogCaptureFixture) -> None:
    """As in a cluster: never raised, never in ``events`` (the apiserver's 422 is logged)."""
    fake = FakeClient([CRD, gadget()])
    with caplog.at_level(logging.WARNING, logger="declop.events"):
        fake.event(fake.get(Gadget, "default/g"), "", "no reason")
    assert fake.events == []
    assert any("reason: Required value" in r.getMessage() or "reason: Required value" in str(getattr(r, "kv", "")) for r in caplog.records)


def test_an_awkward_controller_name_still_reports_a_qualified_name() -> None:
    from declop.reconcile.client import Client

    fake = FakeClient([CRD, gadget()])

    client = Client(fake.server.context, controller="_" + "x" * 80 + "_")
    client._run = fake._run  # type: ignore[method-assign]
    client.event(fake.get(Gadget, "default/g"), "Seen", "ok")
    (event,) = fake.events
    assert event.body["reportingController"] == "declop.io/" + "x" * 62


def test_client_reads_through_a_model_class_give_views() -> None:
    fake = FakeClient([CRD, gadget("a", 1), gadget("b", 2)])
    a = fake.get(Gadget, "default/a")
    assert isinstance(a, Gadget) and a.spec.size == 1
    assert sorted(g.spec.size for g in fake.list(Gadget, namespace="default")) == [1, 2]
    assert fake.live.get(Gadget, "default/b").spec.size == 2
    assert [g.metadata.name for g in fake.live.list(Gadget, namespace="default")] == ["a", "b"]
    with pytest.raises(declop.NotFound):
        fake.get(Gadget, "default/missing")


def test_client_writes_take_typed_models() -> None:
    fake = FakeClient([CRD])
    made = Gadget(metadata=ObjectMeta(name="n", namespace="default"), spec=GadgetSpec(size=4))
    fake.create(made)
    (create,) = fake.writes
    assert create.body["apiVersion"] == "example.com/v1" and create.body["kind"] == "Gadget"
    assert create.body["spec"] == {"size": 4}
    view = fake.get(Gadget, "default/n")
    view.spec.size = 5
    fake.update(view)
    assert fake.get(Gadget, "default/n").spec.size == 5
    fake.patch(Gadget, "default/n", Gadget(spec=GadgetSpec(size=6)))
    assert fake.writes[-1].body == {"apiVersion": "example.com/v1", "kind": "Gadget", "spec": {"size": 6}}
    fake.apply(Gadget(metadata=ObjectMeta(name="n", namespace="default"), spec=GadgetSpec(size=7)))
    assert fake.get(Gadget, "default/n").spec.size == 7
    fake.delete(fake.get(Gadget, "default/n"))
    assert fake.objects(Gadget.kind_of().resource) == []


def test_create_or_update_takes_a_typed_object_and_a_mutate_that_returns_a_model() -> None:
    fake = FakeClient([CRD])
    wanted = Gadget(metadata=ObjectMeta(name="n", namespace="default"), spec=GadgetSpec(size=2))
    assert declop.create_or_update(fake, wanted) == "created"
    assert declop.create_or_update(fake, wanted) == "unchanged"

    def grow(current: dict) -> Gadget:
        model = Gadget.model_validate(current)
        model.spec.size = 3
        return model

    assert declop.create_or_update(fake, wanted, grow) == "updated"
    assert fake.get(Gadget, "default/n").spec.size == 3


def test_owner_references_on_a_typed_child_and_from_a_typed_owner() -> None:
    fake = FakeClient([CRD, gadget("owner"), gadget("child")])
    owner, child = fake.get(Gadget, "default/owner"), fake.get(Gadget, "default/child")
    assert declop.set_controller_reference(child, owner) is True
    assert "ownerReferences" in child.metadata.model_fields_set
    (ref,) = child.metadata.ownerReferences
    assert (ref["name"], ref["uid"]) == ("owner", owner.metadata.uid)
    assert declop.set_controller_reference(child, owner) is False
    from declop.reconcile.ownership import controller_of

    assert controller_of(child) == ref
