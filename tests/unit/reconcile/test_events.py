"""The event recorder's spam filter and series folding, with a fake transport and a fake clock."""

from __future__ import annotations

import asyncio
from typing import Any

from declop.clock import FakeClock
from declop.errors import ApiError
from declop.reconcile.events import EventRecorder

OBJ = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "ns", "uid": "u1", "resourceVersion": "7"}}


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.fail = fail

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        self.calls.append((method, path, body))
        if self.fail:
            raise ApiError(500, "boom")
        return {}


def record(rec: EventRecorder, n: int, message: Any = "same") -> None:
    async def go() -> None:
        for i in range(n):
            await rec.record(OBJ, "Reason", message(i) if callable(message) else message, controller="c")

    asyncio.run(go())


def test_an_event_is_posted_with_the_required_fields() -> None:
    t = Recorder()
    record(EventRecorder(t, clock=FakeClock()), 1)
    method, path, body = t.calls[0]
    assert method == "POST" and path == "/apis/events.k8s.io/v1/namespaces/ns/events"
    assert body["reason"] == "Reason" and body["type"] == "Normal" and body["note"] == "same"
    assert body["reportingController"] == "declop.io/c" and body["action"] == "Reconcile"
    assert body["regarding"] == {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "namespace": "ns", "uid": "u1", "resourceVersion": "7"}
    assert body["eventTime"].endswith("Z")


def test_a_hot_loop_is_capped_at_the_burst_per_object() -> None:
    t, clock = Recorder(), FakeClock()
    rec = EventRecorder(t, clock=clock)
    record(rec, 200, message=lambda i: f"m{i}")
    assert len(t.calls) == 25 and rec.dropped == 175
    clock.advance(300)  # one token every five minutes
    record(rec, 5, message=lambda i: f"later{i}")
    assert len(t.calls) == 26


def test_repeats_fold_into_a_series() -> None:
    t, clock = Recorder(), FakeClock()
    rec = EventRecorder(t, clock=clock)
    record(rec, 10)
    assert [c[0] for c in t.calls] == ["POST"]
    clock.advance(11)
    record(rec, 1)
    assert [c[0] for c in t.calls] == ["POST", "PATCH"]
    assert t.calls[1][2]["series"]["count"] == 11


def test_failures_never_raise() -> None:
    t = Recorder(fail=True)
    record(EventRecorder(t, clock=FakeClock()), 3, message=lambda i: f"m{i}")
    assert len(t.calls) == 3


def test_a_fenced_event_ends_the_call_while_other_failures_are_only_logged() -> None:
    """An Event never fails a reconcile — but a call whose Lease is gone must end: the transport's
    ``Fenced`` (nothing sent) passes through the recorder, unlike an ApiError."""
    import pytest

    from declop.errors import Fenced
    from declop.kube import fencing
    from declop.kube.fencing import WriteFence

    class FencedTransport(Recorder):
        async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
            fencing.check(method, path)  # what the real transport does first
            return await super().request(method, path, body)

    t = FencedTransport()
    rec = EventRecorder(t, clock=FakeClock())

    async def go() -> None:
        token = fencing.enter(WriteFence(lambda: False, "ns/leader", "ns/cm"))
        try:
            await rec.record(OBJ, "Reason", "x", controller="c")
        finally:
            fencing.leave(token)

    with pytest.raises(Fenced):
        asyncio.run(go())
    assert t.calls == []
    failing = Recorder(fail=True)
    record(EventRecorder(failing, clock=FakeClock()), 1)  # logged and dropped, as before
    assert len(failing.calls) == 1


def test_the_reporting_controller_is_a_qualified_name() -> None:
    """The apiserver refuses an Event whose reportingController is not a qualified name (a name
    part of at most 63 characters, starting and ending with a letter or digit)."""
    from declop.reconcile.events import reporting_controller

    assert reporting_controller("widget") == "declop.io/widget"
    assert reporting_controller("_private_") == "declop.io/private"
    assert reporting_controller("a b/c") == "declop.io/a-b-c"
    assert reporting_controller("x" * 80) == "declop.io/" + "x" * 63
    assert reporting_controller("__") == "declop.io/declop"


def test_a_typed_object_is_named_by_its_json_identity() -> None:
    from pydantic import Field

    from declop.typed.model import CustomResource, FreeForm

    class Thing(CustomResource, group="example.com", version="v1", kind="Thing"):
        spec: FreeForm = Field(default_factory=dict)

    t = Recorder()
    thing = Thing.model_validate({"apiVersion": "example.com/v1", "kind": "Thing",
                                  "metadata": {"name": "t", "namespace": "ns", "uid": "u2", "resourceVersion": "9"}})

    async def go() -> None:
        await EventRecorder(t, clock=FakeClock()).record(thing, "Seen", "typed", controller="c")

    asyncio.run(go())
    (method, path, body) = t.calls[0]
    assert path == "/apis/events.k8s.io/v1/namespaces/ns/events"
    assert body["regarding"] == {"apiVersion": "example.com/v1", "kind": "Thing", "name": "t", "namespace": "ns", "uid": "u2", "resourceVersion": "9"}
