"""Field changes (declop.handlers.changes): old/new/diff against the last-handled snapshot, field=
and its old=/new= filters, the snapshot's writes, and what a plain reconciler is spared."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, Field

from declop.errors import RegistrationError
from declop.handlers.changes import Change, diff, essence, snapshot_key
from declop.kube.keys import Request
from declop.reconcile.result import Phase
from declop.registry import Registry
from declop.testing.fakes.client import FakeClient, run_reconcile
from declop.typed.crd import definitions
from declop.typed.model import CustomResource

KEY = "last-handled.declop.dev/handle"


def cm(data: dict[str, str] | None = None, **annotations: str) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "ns", "annotations": dict(annotations)},
    }
    if data is not None:
        obj["data"] = data
    return obj


def edit(client: FakeClient, data: dict[str, Any]) -> None:
    client.patch("configmaps", "ns/c", {"data": data})


def snapshot(client: FakeClient, key: str = KEY) -> Any:
    text = client.get("configmaps", "ns/c")["metadata"].get("annotations", {}).get(key)
    return None if text is None else json.loads(text)


@pytest.fixture
def reg() -> Registry:
    return Registry()


# -- the essence and the diff -------------------------------------------------------------------


def test_essence_keeps_spec_labels_and_foreign_annotations_only() -> None:
    obj = {
        "apiVersion": "v1", "kind": "X", "status": {"a": 1}, "spec": {"size": 1}, "data": {},
        "metadata": {"name": "x", "uid": "u", "resourceVersion": "3", "labels": {"app": "a"}, "annotations": {
            "team": "t", KEY: "{}", "steps.declop.dev/x": "1", "declop.dev/y": "2",
            "kubectl.kubernetes.io/last-applied-configuration": "{}",
        }},
    }  # fmt: skip
    assert essence(obj) == {"spec": {"size": 1}, "metadata": {"labels": {"app": "a"}, "annotations": {"team": "t"}}}
    assert essence({"metadata": {"annotations": {KEY: "{}"}}}) == {}
    assert essence(None) is None


def test_diff_is_kopfs_tuple_of_op_path_old_new() -> None:
    assert diff(None, None) == ()
    assert diff(None, {"a": 1}) == (("add", (), None, {"a": 1}),)
    assert diff({"a": 1}, None) == (("remove", (), {"a": 1}, None),)
    assert diff({"a": 1, "b": [1], "c": {"d": 1}}, {"a": 2, "b": [1, 2], "e": 3}) == (
        Change("change", ("a",), 1, 2),
        Change("change", ("b",), [1], [1, 2]),  # lists are compared whole
        Change("remove", ("c",), {"d": 1}, None),
        Change("add", ("e",), None, 3),
    )
    op, path, old, new = diff(1, 2)[0]
    assert (op, path, old, new) == ("change", (), 1, 2)


# -- registration ------------------------------------------------------------------------------


def test_a_plain_reconciler_is_not_wrapped_nor_granted_patch(reg: Registry) -> None:
    def plain(obj: Any, **kwargs: Any) -> None: ...

    reg.reconciler("configmaps")(plain)
    (r,) = reg.registrations
    assert r.fn is plain and r.records == ()
    assert not [g for g in reg.grants() if g.resource == "configmaps" and g.verb == "patch"]


def test_declaring_old_new_or_diff_wraps_and_grants_patch(reg: Registry) -> None:
    def handle(old: Any) -> None: ...

    assert reg.reconciler("configmaps")(handle) is handle  # the decorator returns it unchanged
    (r,) = reg.registrations
    assert r.fn.__wrapped__ is handle  # type: ignore[attr-defined]
    assert r.records == (KEY,) and r.wants is not None and "old" not in r.wants
    assert [g.verb for g in reg.grants() if g.resource == "configmaps" and g.verb == "patch"] == ["patch"]
    reg.reconciler("configmaps")(handle)  # the same module imported twice: harmless
    assert len(reg) == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"old": 1}, "old= and new= filter the value of one field: pass field='spec.size' too"),
        ({"new": str.isdigit}, "old= and new= filter the value of one field"),
        ({"field": "spec.x=1"}, "a field selector (which objects are cached) is fields='spec.x=y'"),
        ({"field": ""}, "field= names the one field"),
        ({"field": "spec..x"}, "field= names the one field"),
        ({"field": 3}, "field= names the one field"),
    ],
)
def test_bad_field_options_are_refused_in_one_line(reg: Registry, options: dict[str, Any], message: str) -> None:
    with pytest.raises(RegistrationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        reg.reconciler("configmaps", **options)


def test_a_name_that_cannot_name_an_annotation_is_refused(reg: Registry) -> None:
    def _private(old: Any) -> None: ...

    with pytest.raises(RegistrationError, match=r"controller '_private' keeps a snapshot .* pass name='...'"):
        reg.reconciler("configmaps")(_private)
    assert snapshot_key("a.b-c_d") == "last-handled.declop.dev/a.b-c_d"


def test_a_field_may_be_in_status_or_labels_but_never_our_own_annotations(reg: Registry) -> None:
    seen: list[tuple[str, Any, Any]] = []

    @reg.reconciler("configmaps", name="status", field="status.phase")
    def status(old: Any, new: Any) -> None:
        seen.append(("status", old, new))

    @reg.reconciler("configmaps", name="notes", field="metadata.annotations")
    def notes(old: Any, new: Any) -> None:
        seen.append(("notes", old, new))

    body = {**cm({"size": "1"}, team="a"), "status": {"phase": "Ready"}}
    out = run_reconcile(status, "ns/c", [body], registry=reg)
    run_reconcile(notes, "ns/c", client=out.client, registry=reg)
    run_reconcile(status, "ns/c", client=out.client, registry=reg)
    run_reconcile(notes, "ns/c", client=out.client, registry=reg)  # the snapshots written are no change
    assert seen == [("status", None, "Ready"), ("notes", None, {"team": "a"})]


def test_a_tuple_field_may_hold_dotted_keys(reg: Registry) -> None:
    reg.reconciler("configmaps", name="app", field=("metadata", "labels", "app.kubernetes.io/name"))(lambda: None)
    assert reg.registrations[0].field == ("metadata", "labels", "app.kubernetes.io/name")


# -- old, new, diff ----------------------------------------------------------------------------


def test_old_new_diff_follow_the_snapshot_written_after_success(reg: Registry) -> None:
    seen: list[tuple[Any, Any, Any]] = []

    @reg.reconciler("configmaps")
    def handle(old: Any, new: Any, diff: Any) -> None:
        seen.append((old, new, diff))

    first = run_reconcile(handle, "ns/c", [cm({"size": "1"})], registry=reg)
    assert first.ok and seen[-1] == (None, {"data": {"size": "1"}}, (("add", (), None, {"data": {"size": "1"}}),))
    assert [(w.verb, w.patch_type) for w in first.writes] == [("patch", "merge")]
    assert snapshot(first.client) == {"data": {"size": "1"}}

    again = run_reconcile(handle, "ns/c", client=first.client, registry=reg)
    assert seen[-1] == ({"data": {"size": "1"}}, {"data": {"size": "1"}}, ())  # called (a reconciler), nothing changed
    assert again.writes == ()  # snapshot == state: no write, so no echo to wake it again

    edit(first.client, {"size": "2"})
    run_reconcile(handle, "ns/c", client=first.client, registry=reg)
    assert seen[-1] == ({"data": {"size": "1"}}, {"data": {"size": "2"}}, (("change", ("data", "size"), "1", "2"),))


def test_a_failing_call_leaves_the_snapshot_and_the_retry_sees_the_same_old(reg: Registry) -> None:
    olds: list[Any] = []
    fail = [True]

    @reg.reconciler("configmaps", field="data.size")
    def handle(old: Any, new: Any) -> None:
        olds.append((old, new))
        if fail[0]:
            raise RuntimeError("boom")

    out = run_reconcile(handle, "ns/c", [cm({"size": "1"})], registry=reg)
    assert out.action == "retry" and out.writes == () and snapshot(out.client) is None
    retry = run_reconcile(handle, "ns/c", client=out.client, registry=reg)
    assert olds == [(None, "1"), (None, "1")] and retry.writes == ()
    fail[0] = False
    ok = run_reconcile(handle, "ns/c", client=out.client, registry=reg)
    assert ok.ok and snapshot(out.client) == {"data": {"size": "1"}}


def test_async_handlers_get_the_same(reg: Registry) -> None:
    seen: list[Any] = []

    @reg.reconciler("configmaps", field="data.size")
    async def handle(old: Any, new: Any, diff: Any, client: Any) -> None:
        seen.append((old, new, diff))

    out = run_reconcile(handle, "ns/c", [cm({"size": "1"})], registry=reg)
    assert out.ok and seen == [(None, "1", (("add", (), None, "1"),))]
    assert snapshot(out.client) == {"data": {"size": "1"}}


def test_kwargs_alone_does_not_ask_for_changes_but_field_gives_them(reg: Registry) -> None:
    got: list[dict[str, Any]] = []

    @reg.reconciler("configmaps", name="plain")
    def plain(**kwargs: Any) -> None:
        got.append(kwargs)

    @reg.reconciler("configmaps", name="field", field="data.size")
    def field(**kwargs: Any) -> None:
        got.append(kwargs)

    assert reg.registrations[0].fn is plain
    run_reconcile(plain, "ns/c", [cm({"size": "1"})], registry=reg)
    assert not {"old", "new", "diff"} & set(got[-1])
    run_reconcile(field, "ns/c", [cm({"size": "1"})], registry=reg)
    assert (got[-1]["old"], got[-1]["new"], got[-1]["obj"]["data"]) == (None, "1", {"size": "1"})


def test_new_shares_nothing_with_obj(reg: Registry) -> None:
    @reg.reconciler("configmaps")
    def handle(obj: Any, new: Any, diff: Any) -> None:
        obj["data"]["size"] = "mutated"
        assert new == {"data": {"size": "1"}} and diff[0].new == {"data": {"size": "1"}}

    out = run_reconcile(handle, "ns/c", [cm({"size": "1"})], registry=reg)
    assert out.ok and snapshot(out.client) == {"data": {"size": "1"}}  # what it handled, not what it mutated


# -- field= and the filters --------------------------------------------------------------------


def test_field_calls_only_when_that_field_changed(reg: Registry) -> None:
    calls: list[tuple[Any, Any]] = []

    @reg.reconciler("configmaps", field="data.size")
    def handle(old: Any, new: Any) -> None:
        calls.append((old, new))

    out = run_reconcile(handle, "ns/c", [cm({"size": "1", "other": "a"})], registry=reg)
    client = out.client
    assert calls == [(None, "1")] and snapshot(client) == {"data": {"size": "1"}}  # the field only: compact
    edit(client, {"other": "b"})
    quiet = run_reconcile(handle, "ns/c", client=client, registry=reg)
    assert calls == [(None, "1")] and quiet.writes == ()  # another field changed: not called, nothing written
    edit(client, {"size": "2"})
    run_reconcile(handle, "ns/c", client=client, registry=reg)
    assert calls == [(None, "1"), ("1", "2")]
    edit(client, {"size": None})
    run_reconcile(handle, "ns/c", client=client, registry=reg)
    assert calls[-1] == ("2", None) and snapshot(client) == {}


def test_a_field_absent_from_the_start_is_no_change(reg: Registry) -> None:
    @reg.reconciler("configmaps", field="data.size")
    def handle() -> None:
        raise AssertionError("not called")

    out = run_reconcile(handle, "ns/c", [cm({"other": "a"})], registry=reg)
    assert out.ok and out.writes == ()


@pytest.mark.parametrize(
    ("old", "new", "called"),
    [
        (..., "2", [("1", "2")]),
        (..., "3", []),
        ("1", ..., [("1", "2")]),
        (None, ..., []),
        (..., lambda v: int(v) > 1, [("1", "2")]),
        (lambda v: v is None, ..., []),
    ],
)
def test_old_and_new_filter_the_field_and_a_turned_down_change_counts_as_handled(
    reg: Registry, old: Any, new: Any, called: list[Any]
) -> None:
    calls: list[tuple[Any, Any]] = []

    @reg.reconciler("configmaps", field="data.size", old=old, new=new)
    def handle(old: Any, new: Any) -> None:
        calls.append((old, new))

    out = run_reconcile(handle, "ns/c", [cm({"size": "1"}, **{KEY: '{"data":{"size":"1"}}'})], registry=reg)
    edit(out.client, {"size": "2"})
    moved = run_reconcile(handle, "ns/c", client=out.client, registry=reg)
    assert calls == called
    assert [w.verb for w in moved.writes] == ["patch"] and snapshot(out.client) == {"data": {"size": "2"}}


def test_old_none_is_first_sighting_and_new_none_is_going_away(reg: Registry) -> None:
    calls: list[str] = []

    @reg.reconciler("configmaps", name="created", field="data", old=None)
    def created() -> None:
        calls.append("created")

    @reg.reconciler("configmaps", name="deleted", field="data", new=None, finalizer="example.com/deleted")
    def deleted() -> None:
        calls.append("deleted")

    out = run_reconcile(created, "ns/c", [cm({"size": "1"})], registry=reg)
    run_reconcile(deleted, "ns/c", client=out.client, registry=reg)
    assert calls == ["created"]
    edit(out.client, {"size": "2"})
    run_reconcile(created, "ns/c", client=out.client, registry=reg)
    run_reconcile(deleted, "ns/c", client=out.client, registry=reg)
    assert calls == ["created"]
    out.client.delete("configmaps", "ns/c")  # held by the finalizer: DELETING
    gone = run_reconcile(deleted, "ns/c", client=out.client, registry=reg)
    assert gone.phase is Phase.DELETING and calls == ["created", "deleted"]


def test_deleted_without_a_finalizer_calls_no_field_handler(reg: Registry) -> None:
    @reg.reconciler("configmaps", field="data", new=None)
    def handle() -> None:
        raise AssertionError("no object, no snapshot: nothing to compare")

    out = run_reconcile(handle, "ns/c", [], registry=reg)
    assert out.phase is Phase.DELETED and out.ok and out.writes == ()


# -- someone else's edits and our stale cache ---------------------------------------------------


def test_a_removed_or_garbled_snapshot_reads_as_never_handled(reg: Registry) -> None:
    calls: list[Any] = []

    @reg.reconciler("configmaps", field="data.size")
    def handle(old: Any, new: Any) -> None:
        calls.append((old, new))

    out = run_reconcile(handle, "ns/c", [cm({"size": "1"})], registry=reg)
    out.client.patch("configmaps", "ns/c", {"metadata": {"annotations": {KEY: None}}})
    run_reconcile(handle, "ns/c", client=out.client, registry=reg)
    out.client.patch("configmaps", "ns/c", {"metadata": {"annotations": {KEY: "not json"}}})
    run_reconcile(handle, "ns/c", client=out.client, registry=reg)
    out.client.patch("configmaps", "ns/c", {"metadata": {"annotations": {KEY: '{"data":{"size":"0"}}'}}})
    run_reconcile(handle, "ns/c", client=out.client, registry=reg)
    assert calls == [(None, "1"), (None, "1"), (None, "1"), ("0", "1")]


def test_a_stale_copy_behind_our_own_write_does_not_call_again(reg: Registry) -> None:
    calls: list[Any] = []

    @reg.reconciler("configmaps", field="data.size")
    def handle(old: Any, new: Any) -> None:
        calls.append((old, new))

    (r,) = reg.registrations
    stale = cm({"size": "1"})
    stale["metadata"].update(uid="u1", resourceVersion="10")

    class Patching:
        def patch(self, resource: str, key: Any, body: Any) -> Any:
            return {"metadata": {"resourceVersion": "12", "annotations": body["metadata"]["annotations"]}}

    def call(obj: Any) -> None:
        r.fn(request=Request("ns", "c"), obj=json.loads(json.dumps(obj)), client=Patching(), phase=Phase.UPDATED)

    call(stale)
    call(stale)  # the cache has not caught up with our write (rv 12)
    later = json.loads(json.dumps(stale))
    later["metadata"]["resourceVersion"] = "11"  # e.g. the echo of another write of ours, before the snapshot's
    call(later)
    assert calls == [(None, "1")]
    removed = json.loads(json.dumps(stale))
    removed["metadata"]["resourceVersion"] = "13"  # past our write, and someone removed the snapshot
    call(removed)
    assert calls == [(None, "1"), (None, "1")]


def test_several_handlers_keep_a_snapshot_each(reg: Registry) -> None:
    @reg.reconciler("configmaps", name="a", field="data.size")
    def a() -> None: ...

    @reg.reconciler("configmaps", name="b", field="data.size")
    def b() -> None:
        raise RuntimeError("not yet")

    out = run_reconcile(a, "ns/c", [cm({"size": "1"})], registry=reg)
    run_reconcile(b, "ns/c", client=out.client, registry=reg)
    assert snapshot(out.client, snapshot_key("a")) == {"data": {"size": "1"}}
    assert snapshot(out.client, snapshot_key("b")) is None  # handled by a, not by b


class ThingSpec(BaseModel):
    size: int = Field(1, ge=0)


class Thing(CustomResource, group="example.com", version="v1", kind="Thing"):
    spec: ThingSpec = Field(default_factory=ThingSpec)


def test_a_typed_obj_is_compared_in_its_json_form(reg: Registry) -> None:
    seen: list[tuple[Any, Any, int]] = []

    @reg.reconciler(Thing, field="spec.size")
    def handle(obj: Thing, old: Any, new: Any) -> None:
        seen.append((old, new, obj.spec.size))

    body = {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t", "namespace": "ns"}, "spec": {"size": 2}}
    out = run_reconcile(handle, "ns/t", [definitions([Thing])[0], body], registry=reg)
    assert out.ok and seen == [(None, 2, 2)]
    assert run_reconcile(handle, "ns/t", client=out.client, registry=reg).writes == ()
    assert seen == [(None, 2, 2)]


def test_deleting_is_new_none_once_then_handled(reg: Registry) -> None:
    calls: list[tuple[str, Any, Any]] = []

    @reg.reconciler("configmaps", name="whole", finalizer="example.com/whole")
    def whole(old: Any, new: Any, phase: Phase) -> None:
        calls.append(("whole", old, new))

    @reg.reconciler("configmaps", name="size", field="data.size", finalizer="example.com/size")
    def size(old: Any, new: Any) -> None:
        calls.append(("size", old, new))

    out = run_reconcile(whole, "ns/c", [cm({"size": "1"})], registry=reg)
    run_reconcile(size, "ns/c", client=out.client, registry=reg)
    out.client.delete("configmaps", "ns/c")  # both finalizers hold it
    calls.clear()
    run_reconcile(size, "ns/c", client=out.client, registry=reg)
    assert calls == [("size", "1", None)]
    assert snapshot(out.client, snapshot_key("size")) is None  # "null": handled the going away
    run_reconcile(size, "ns/c", client=out.client, registry=reg)  # DELETING again (whole holds it)
    assert calls == [("size", "1", None)]
    last = run_reconcile(whole, "ns/c", client=out.client, registry=reg)
    assert calls[-1] == ("whole", {"data": {"size": "1"}}, None)
    assert last.writes[0].body == {"metadata": {"annotations": {snapshot_key("whole"): "null"}}}  # then the finalizer goes


def test_a_fenced_snapshot_write_fails_the_call_and_marks_nothing_handled(reg: Registry) -> None:
    from declop.errors import Fenced

    calls: list[Any] = []

    @reg.reconciler("configmaps", field="data.size")
    def handle(old: Any, new: Any) -> None:
        calls.append((old, new))

    (r,) = reg.registrations

    class Lost:
        def patch(self, resource: str, key: Any, body: Any) -> Any:
            raise Fenced("the Lease is not known valid")

    obj = cm({"size": "1"})
    obj["metadata"].update(uid="u1", resourceVersion="10")
    with pytest.raises(Fenced):
        r.fn(request=Request("ns", "c"), obj=obj, client=Lost(), phase=Phase.UPDATED)
    with pytest.raises(Fenced):  # the same copy again (here, or on the new owner): still not handled
        r.fn(request=Request("ns", "c"), obj=obj, client=Lost(), phase=Phase.UPDATED)
    assert calls == [(None, "1"), (None, "1")]


def test_a_handler_changing_its_obj_does_not_confuse_the_stale_copy_memory(reg: Registry) -> None:
    calls: list[Any] = []

    @reg.reconciler("configmaps", field="data.size")
    def handle(obj: Any, old: Any, new: Any) -> None:
        calls.append((old, new))
        obj["metadata"]["uid"] = "other"
        obj["metadata"]["annotations"][KEY] = "mine now"

    (r,) = reg.registrations

    class Patching:
        def patch(self, resource: str, key: Any, body: Any) -> Any:
            return {"metadata": {"resourceVersion": "12"}}

    stale = cm({"size": "1"})
    stale["metadata"].update(uid="u1", resourceVersion="10")
    for _ in range(2):
        r.fn(request=Request("ns", "c"), obj=json.loads(json.dumps(stale)), client=Patching(), phase=Phase.UPDATED)
    assert calls == [(None, "1")]
