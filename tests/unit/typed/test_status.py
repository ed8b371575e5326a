"""The guarded JSON patch of a typed status write (declop.typed.status): what the model says is
what is stored (each case of the law in docs/typed.md), nothing sent when nothing changed, and each
changed path guarded by a ``test`` of the value the handler read. The end-to-end cases go through
the unit-test fake (``run_reconcile``), whose client knows the object the handler read as the
controller's does; tests/integration/test_typed_status.py checks the same against the apiserver."""

from __future__ import annotations

import enum
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, computed_field, field_serializer

import declop
from declop.errors import ApiError, Conflict
from declop.registry import Registry
from declop.testing.fakes.apiserver import _json_patch
from declop.testing.fakes.client import FakeClient, run_reconcile
from declop.typed.crd import definitions
from declop.typed.model import CustomResource, IntOrString, ListType
from declop.typed.status import encode, refused, status_ops, to_json
from declop.typed.view import view

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)


class Condition(BaseModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    lastTransitionTime: datetime


class Replicas(BaseModel):
    ready: int = 0
    desired: int = 0


class Mode(str, enum.Enum):
    FAST = "fast"
    SLOW = "slow"


class DialStatus(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    observedGeneration: int | None = None
    level: int = 0
    conditions: Annotated[list[Condition], ListType("map", keys=("type",))] = Field(default_factory=list)
    replicas: Replicas = Field(default_factory=Replicas)
    workers: dict[str, int] = Field(default_factory=dict)
    limit: int | None = 5
    mode: Mode = Mode.FAST
    port: IntOrString = 80
    seen: datetime | None = None
    display_name: str = Field("", alias="displayName")
    ratio: float = 1.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def summary(self) -> str:
        return f"{self.level}/{len(self.conditions)}"


class Dial(CustomResource, group="example.com", version="v1", kind="Dial"):
    spec: dict[str, int] = Field(default_factory=dict)
    status: DialStatus | None = None


def apply(status: dict[str, Any] | None, ops: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the apiserver would store: ``ops`` applied to an object with ``status``."""
    doc: dict[str, Any] = {} if status is None else {"status": status}
    return _json_patch(doc, ops).get("status")  # type: ignore[no-any-return]


def read_back(stored: dict[str, Any] | None) -> DialStatus:
    return DialStatus.model_validate(stored or {})


def changes(ops: list[dict[str, Any]]) -> list[tuple[str, str, Any]]:
    return [(o["op"], o["path"], o.get("value")) for o in ops if o["op"] != "test"]


# --------------------------------------------------------------------------- the law, case by case


def test_nothing_changed_sends_nothing() -> None:
    stored = {"level": 3, "conditions": [], "replicas": {"ready": 0, "desired": 0}, "workers": {}, "limit": 5,
              "mode": "fast", "port": 80, "displayName": "", "ratio": 1}  # as the apiserver fills CRD defaults
    s = DialStatus.model_validate(stored)
    assert status_ops(s, stored) == []
    assert status_ops(DialStatus(level=3), stored) == []  # said, and equal
    assert status_ops(None, stored) == []


def test_in_place_append_to_a_missing_list_is_sent() -> None:
    """Defect 1: ``status = obj.status or DialStatus()`` then ``.conditions.append(...)``."""
    s = DialStatus()
    s.conditions.append(Condition(type="Ready", status="True", lastTransitionTime=T0))
    ops = status_ops(s, None)
    assert ops == [
        {"op": "test", "path": "/status", "value": None},
        {"op": "add", "path": "/status", "value": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "", "message": "", "lastTransitionTime": "2024-05-01T12:00:00Z"}
        ]}},
    ]
    assert read_back(apply(None, ops)) == s


def test_in_place_change_of_a_sub_model_the_status_lacked_is_sent_alone() -> None:
    """Defect 1: ``status.replicas.ready = 3`` where the stored status has no ``replicas``."""
    stored = {"level": 1}
    s = DialStatus.model_validate(stored)
    s.replicas.ready = 3
    ops = status_ops(s, stored)
    assert changes(ops) == [("add", "/status/replicas", {"ready": 3})]
    assert {"op": "test", "path": "/status/replicas", "value": None} in ops
    assert read_back(apply(stored, ops)) == s


def test_a_removed_map_key_is_removed() -> None:
    """Defect 2: a key removed from a ``dict[str, X]`` field."""
    stored = {"workers": {"a": 1, "b": 2}}
    s = DialStatus.model_validate(stored)
    del s.workers["a"]
    s.workers["c"] = 3
    ops = status_ops(s, stored)
    assert changes(ops) == [("add", "/status/workers/c", 3), ("remove", "/status/workers/a", None)]
    assert apply(stored, ops) == {"workers": {"b": 2, "c": 3}}


def test_a_naive_datetime_is_sent_as_utc_and_then_looks_unchanged() -> None:
    """Defect 5: ``datetime.utcnow()`` is sent with a zone (the apiserver refuses one without)."""
    s = DialStatus(seen=datetime(2024, 5, 1, 12, 0))
    ops = status_ops(s, {})
    assert changes(ops) == [("add", "/status/seen", "2024-05-01T12:00:00Z")]
    stored = apply({}, ops)
    assert read_back(stored).seen == T0
    assert status_ops(DialStatus(seen=datetime(2024, 5, 1, 12, 0)), stored) == []  # naive, same instant: unchanged


def test_computed_fields_are_never_sent() -> None:
    """Suspected: computed fields re-sent on every reconcile (the apiserver prunes them). Real:
    the old merge patch held ``summary`` each time, as it is never stored."""
    stored = {"level": 2}
    s = DialStatus.model_validate(stored)
    assert s.summary == "2/0"
    assert status_ops(s, stored) == []
    s.level = 4
    assert changes(status_ops(s, stored)) == [("add", "/status/level", 4)]


def test_list_items_with_defaults_the_apiserver_filled_are_unchanged() -> None:
    """Suspected: items with unset defaults re-sent once the apiserver fills the CRD defaults.
    Real: the old patch dumped the item without ``reason``/``message``, the stored one has them."""
    stored = {"conditions": [{"type": "Ready", "status": "True", "reason": "", "message": "",
                              "lastTransitionTime": "2024-05-01T12:00:00+00:00"}]}
    s = DialStatus(conditions=[Condition(type="Ready", status="True", lastTransitionTime=T0)])
    assert status_ops(s, stored) == []


def test_a_nullable_field_with_a_default_can_be_set_to_none() -> None:
    """Suspected: a merge patch's null deletes the key and the apiserver fills the default back.
    Real; the JSON patch stores null."""
    stored = {"limit": 7}
    s = DialStatus.model_validate(stored)
    s.limit = None
    ops = status_ops(s, stored)
    assert changes(ops) == [("add", "/status/limit", None)]
    assert read_back(apply(stored, ops)).limit is None


def test_none_removes_a_field_whose_default_is_none_and_absent_is_none() -> None:
    stored = {"observedGeneration": 3, "unknown": "kept"}
    s = DialStatus(observedGeneration=None)
    assert changes(status_ops(s, stored)) == [("remove", "/status/observedGeneration", None)]
    assert apply(stored, status_ops(s, stored)) == {"unknown": "kept"}
    assert status_ops(DialStatus(observedGeneration=None), {}) == []


def test_a_default_never_set_is_not_sent() -> None:
    """``DialStatus(level=1)`` leaves what another writer stored in ``observedGeneration``."""
    stored = {"observedGeneration": 9, "replicas": {"ready": 2, "desired": 2}}
    ops = status_ops(DialStatus(level=1), stored)
    assert changes(ops) == [("add", "/status/level", 1)]
    assert apply(stored, ops) == {"observedGeneration": 9, "replicas": {"ready": 2, "desired": 2}, "level": 1}


def test_a_sub_model_replaced_keeps_what_it_leaves_unsaid() -> None:
    stored = {"replicas": {"ready": 1, "desired": 5}}
    s = DialStatus.model_validate(stored)
    s.replicas = Replicas(ready=3)
    assert changes(status_ops(s, stored)) == [("add", "/status/replicas/ready", 3)]


def test_lists_aliases_enums_int_or_string_and_floats() -> None:
    stored = {"conditions": [], "mode": "fast", "port": 80, "displayName": "a", "ratio": 1}
    s = DialStatus.model_validate(stored)
    s.mode = Mode.SLOW
    s.port = "http"
    s.display_name = "b"
    s.ratio = 1.0  # stored as 1 by the apiserver: the same value
    s.conditions = [Condition(type="A", status="False", lastTransitionTime=T0)]
    ops = status_ops(s, stored)
    assert sorted(changes(ops)) == sorted([
        ("add", "/status/mode", "slow"), ("add", "/status/port", "http"), ("add", "/status/displayName", "b"),
        ("add", "/status/conditions", [{"type": "A", "status": "False", "reason": "", "message": "",
                                        "lastTransitionTime": "2024-05-01T12:00:00Z"}]),
    ])
    assert read_back(apply(stored, ops)) == s


def test_each_changed_path_is_guarded_by_the_value_read() -> None:
    stored = {"level": 1, "workers": {"a": 1}}
    s = DialStatus.model_validate(stored)
    s.level = 2
    s.workers["a"] = 5
    ops = status_ops(s, stored)
    assert [o for o in ops if o["op"] == "test"] == [
        {"op": "test", "path": "/status/level", "value": 1},
        {"op": "test", "path": "/status/workers/a", "value": 1},
    ]
    with pytest.raises(ValueError, match="test failed"):  # another writer set level meanwhile
        apply({**stored, "level": 7}, ops)
    assert apply({**stored, "observedGeneration": 4}, ops) == {"level": 2, "workers": {"a": 5}, "observedGeneration": 4}


def test_json_pointer_escapes_map_keys() -> None:
    s = DialStatus(workers={"a/b~c": 1})
    assert changes(status_ops(s, {"workers": {}})) == [("add", "/status/workers/a~1b~0c", 1)]


def test_a_whole_custom_resource_writes_its_status() -> None:
    w = view(Dial, {"apiVersion": "example.com/v1", "kind": "Dial", "metadata": {"name": "d"}, "status": {"level": 1}})
    assert w.status is not None
    w.status.level = 2
    assert changes(status_ops(w, {"level": 1})) == [("add", "/status/level", 2)]


def test_a_model_with_its_own_serializer_is_written_with_it() -> None:
    class Stamped(BaseModel):
        at: datetime = T0

        @field_serializer("at")
        def _at(self, v: datetime) -> str:
            return v.strftime("%Y-%m-%dT%H:%M:%SZ")

    class S(BaseModel):
        stamp: Stamped | None = None

    assert to_json(S(stamp=Stamped())) == {"stamp": {"at": "2024-05-01T12:00:00Z"}}
    assert changes(status_ops(S(stamp=Stamped()), None)) == [("add", "/status", {"stamp": {"at": "2024-05-01T12:00:00Z"}})]


def test_refused_is_a_bare_422_only() -> None:
    assert refused(ApiError(422, "Invalid", "rejected", {"code": 422, "details": {}}))
    assert not refused(ApiError(422, "Invalid", "x is invalid", {"details": {"name": "d", "causes": [{"field": "status.x"}]}}))
    assert not refused(ApiError(409, "Conflict", "", {}))


# --------------------------------------------------------------------------- through the fake client


registry = Registry()
CRD = definitions([Dial])[0]


@declop.reconciler(Dial, registry=registry)
def dial(request: Any, client: Any, obj: Dial, **_: Any) -> None:
    status = obj.status or DialStatus()
    if not any(c.type == "Ready" for c in status.conditions):
        status.conditions.append(Condition(type="Ready", status="True", lastTransitionTime=T0))
    status.replicas.ready = obj.spec.get("replicas", 0)
    client.patch_status(request, status)


def dial_obj(replicas: int) -> dict[str, Any]:
    return {"apiVersion": "example.com/v1", "kind": "Dial", "metadata": {"name": "d", "namespace": "default"},
            "spec": {"replicas": replicas}}


def test_the_docs_pattern_writes_the_first_condition_then_nothing() -> None:
    out = run_reconcile(dial, "default/d", [CRD, dial_obj(2)], registry=registry)
    assert out.error is None and [w.patch_type for w in out.writes] == ["json"]
    status = out.client.get("dials.example.com", "default/d")["status"]
    assert status == {"conditions": [{"type": "Ready", "status": "True", "reason": "", "message": "",
                                      "lastTransitionTime": "2024-05-01T12:00:00Z"}], "replicas": {"ready": 2}}
    assert run_reconcile(dial, "default/d", client=out.client, registry=registry).writes == ()


def test_the_base_is_what_the_handler_read_and_a_field_both_changed_is_a_conflict() -> None:
    """Suspected: the base was the cache at patch time, so another writer's change to a field
    the handler also set was overwritten. Real; now the write is refused and retried."""
    reg = Registry()

    @declop.reconciler(Dial, registry=reg)
    def racing(request: Any, client: Any, obj: Dial, **_: Any) -> None:
        assert obj.status is not None
        client.patch_status(request, {"status": {"level": 99, "observedGeneration": 7}})  # someone else, meanwhile
        obj.status.level = 2
        client.patch_status(request, obj.status)

    seeded = {**dial_obj(1), "status": {"level": 1}}
    out = run_reconcile(racing, "default/d", [CRD, seeded], registry=reg)
    assert isinstance(out.error, Conflict) and out.action == "retry"
    assert out.client.get("dials.example.com", "default/d")["status"] == {"level": 99, "observedGeneration": 7}


def test_a_field_only_the_other_writer_changed_is_kept() -> None:
    reg = Registry()

    @declop.reconciler(Dial, registry=reg)
    def racing(request: Any, client: Any, obj: Dial, **_: Any) -> None:
        assert obj.status is not None
        client.patch_status(request, {"status": {"observedGeneration": 7}})  # someone else, meanwhile
        obj.status.level = 2
        client.patch_status(request, obj.status)
        obj.status.level = 3  # a second write of the same reconcile builds on the first
        client.patch_status(request, obj.status)

    out = run_reconcile(racing, "default/d", [CRD, {**dial_obj(1), "status": {"level": 1}}], registry=reg)
    assert out.error is None
    assert out.client.get("dials.example.com", "default/d")["status"] == {"level": 3, "observedGeneration": 7}


def test_another_object_is_diffed_against_the_cache_and_unchanged_returns_the_object() -> None:
    c = FakeClient([CRD, {**dial_obj(1), "status": {"level": 1}}])
    assert c.patch_status("dials.example.com", "default/d", DialStatus(level=1))["status"] == {"level": 1}
    assert c.writes == []
    c.patch_status("dials.example.com", "default/d", DialStatus(level=4))
    assert [(w.verb, w.patch_type) for w in c.writes] == [("patch_status", "json")]
    with pytest.raises(ValueError, match="drop type='json'"):
        c.patch_status("dials.example.com", "default/d", DialStatus(level=5), type="json")


def test_encode_writes_json_as_go_does() -> None:
    """The apiserver's ``test`` compares a scalar by the bytes Go writes for the stored value
    (tests/integration/test_typed_status_props.py shows a Python spelling failing it)."""
    assert encode([{"s": "<a>&\u2028\b\x01é", "f": [1.0, 0.1, 1e-5, 1e-7, 1.5e21, 123456789012345680000.0, -0.0], "n": None, "t": True}]) == (
        '[{"s":"\\u003ca\\u003e\\u0026\\u2028\\b\\u0001é","f":[1,0.1,0.00001,1e-7,1.5e+21,123456789012345680000,-0],'
        '"n":null,"t":true}]'
    ).encode()
    with pytest.raises(ValueError):
        encode([float("nan")])


def test_the_fakes_test_compares_as_the_apiserver_does() -> None:
    assert apply({"a": 1}, [{"op": "test", "path": "/status/missing", "value": None}]) == {"a": 1}  # absent tests as null
    with pytest.raises(ValueError):
        apply({"a": 1}, [{"op": "test", "path": "/status/a", "value": True}])  # true is not 1
    with pytest.raises(ValueError):
        apply({"a": {}}, [{"op": "test", "path": "/status/b/c", "value": None}])  # the parent must exist
