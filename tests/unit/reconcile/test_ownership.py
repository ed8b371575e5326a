"""declop.reconcile.ownership: controller references, create_or_update, retry_on_conflict (no apiserver)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import declop
from declop.reconcile.ownership import (
    AlreadyOwnedError,
    acreate_or_update,
    aretry_on_conflict,
    controller_of,
    create_or_update,
    owner_reference,
    retry_on_conflict,
    set_controller_reference,
)
from declop.testing.fakes.client import FakeClient


def widget(name: str = "w", namespace: str | None = "ns", uid: str = "uid-w", api_version: str = "example.com/v1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": uid}
    if namespace is not None:
        meta["namespace"] = namespace
    return {"apiVersion": api_version, "kind": "Widget", "metadata": meta}


def configmap(name: str = "c", namespace: str | None = "ns", **meta: Any) -> dict[str, Any]:
    m: dict[str, Any] = {"name": name, **meta}
    if namespace is not None:
        m["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": m, "data": {"k": "v"}}


# -- owner references ------------------------------------------------------------------------


def test_owner_reference_shape() -> None:
    assert owner_reference(widget()) == {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "name": "w",
        "uid": "uid-w",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert owner_reference(widget(), controller=False, block_owner_deletion=False)["controller"] is False


def test_owner_reference_needs_a_persisted_owner() -> None:
    owner = widget()
    del owner["metadata"]["uid"]
    with pytest.raises(ValueError, match="metadata.uid"):
        owner_reference(owner)
    with pytest.raises(ValueError, match="apiVersion, kind"):
        owner_reference({"metadata": {"name": "x", "uid": "u"}})


def test_set_controller_reference_adds_once() -> None:
    child = configmap()
    assert set_controller_reference(child, widget()) is True
    assert child["metadata"]["ownerReferences"] == [owner_reference(widget())]
    assert set_controller_reference(child, widget()) is False  # idempotent: no change, no write
    assert controller_of(child) == owner_reference(widget())


def test_a_typed_view_is_an_owner_as_its_dict_is() -> None:
    """``obj: Widget`` handlers pass the model: the reference is the one the dict would give,
    and a namespaced typed owner still refuses a child in another namespace."""
    from declop.typed.model import CustomResource

    class Widget(CustomResource, group="example.com", version="v1", kind="Widget"):
        spec: dict[str, Any] = {}

    typed = Widget.model_validate(widget())
    assert owner_reference(typed) == owner_reference(widget())
    child = configmap()
    assert set_controller_reference(child, typed) is True
    assert set_controller_reference(child, widget()) is False  # the same owner, however spelled
    with pytest.raises(ValueError, match="cross-namespace"):
        set_controller_reference(configmap(namespace="other"), typed)
    with pytest.raises(TypeError, match="a dict or a typed view"):
        owner_reference(42)  # type: ignore[arg-type]


def test_set_controller_reference_keeps_other_references_and_replaces_its_own() -> None:
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": "u2"}
    stale = {"apiVersion": "example.com/v1beta1", "kind": "Widget", "name": "w", "uid": "old-uid"}
    child = configmap(ownerReferences=[other, stale])
    assert set_controller_reference(child, widget()) is True
    assert child["metadata"]["ownerReferences"] == [other, owner_reference(widget())]


def test_set_controller_reference_refuses_a_second_controller() -> None:
    child = configmap()
    set_controller_reference(child, widget("first", uid="1"))
    with pytest.raises(AlreadyOwnedError, match="already controlled by Widget first") as e:
        set_controller_reference(child, widget("second", uid="2"))
    assert e.value.owner["name"] == "first"
    assert isinstance(e.value, declop.errors.DeclopError) and isinstance(e.value, ValueError)
    assert child["metadata"]["ownerReferences"][0]["name"] == "first"  # unchanged


def test_set_controller_reference_same_name_other_group_is_another_owner() -> None:
    child = configmap()
    set_controller_reference(child, widget(api_version="example.com/v1"))
    with pytest.raises(AlreadyOwnedError):
        set_controller_reference(child, widget(api_version="other.io/v1"))


def test_set_controller_reference_rejects_cross_namespace_and_cluster_scoped_children() -> None:
    with pytest.raises(ValueError, match="cross-namespace"):
        set_controller_reference(configmap(namespace="elsewhere"), widget())
    with pytest.raises(ValueError, match="cluster-scoped"):
        set_controller_reference({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}}, widget())
    # a cluster-scoped owner may own anything
    child = configmap()
    assert set_controller_reference(child, widget(namespace=None))


# -- create_or_update --------------------------------------------------------------------------


def set_data(value: str):
    def mutate(cm: dict[str, Any]) -> None:
        cm["data"] = {"k": value}

    return mutate


def test_create_or_update_creates_updates_and_skips_unchanged() -> None:
    fake = FakeClient()
    skeleton = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}}
    assert create_or_update(fake, skeleton, set_data("a")) == "created"
    assert create_or_update(fake, skeleton, set_data("a")) == "unchanged"
    assert create_or_update(fake, skeleton, set_data("b")) == "updated"
    assert [w.verb for w in fake.writes] == ["create", "update"]
    assert fake.get("configmaps", "ns/c")["data"] == {"k": "b"}
    # the update carried the cached resourceVersion (optimistic lock)
    assert fake.writes[1].body["metadata"]["resourceVersion"]


def test_create_or_update_mutates_a_copy_of_the_existing_object() -> None:
    fake = FakeClient([configmap(labels={"theirs": "1"})])
    skeleton = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}}
    seen: list[dict[str, Any]] = []

    def mutate(cm: dict[str, Any]) -> None:
        seen.append(declop.clone(cm))
        cm["metadata"].setdefault("labels", {})["mine"] = "1"

    assert create_or_update(fake, skeleton, mutate) == "updated"
    assert seen[0]["metadata"]["labels"] == {"theirs": "1"}  # mutate saw the existing object
    assert fake.get("configmaps", "ns/c")["metadata"]["labels"] == {"theirs": "1", "mine": "1"}
    assert skeleton == {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}}


def test_create_or_update_accepts_a_returned_object_and_a_resource_name() -> None:
    fake = FakeClient()
    op = create_or_update(fake, {"metadata": {"name": "c", "namespace": "ns"}}, lambda cm: {**cm, "data": {"x": "1"}}, resource="configmaps")
    assert op == "created"
    assert fake.get("configmaps", "ns/c")["data"] == {"x": "1"}


def test_create_or_update_refuses_to_rename() -> None:
    fake = FakeClient([configmap()])
    skeleton = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}}
    with pytest.raises(ValueError, match="metadata.name"):
        create_or_update(fake, skeleton, lambda cm: cm["metadata"].update(name="other"))
    with pytest.raises(ValueError, match="metadata.namespace"):
        create_or_update(fake, skeleton, lambda cm: cm["metadata"].update(namespace="other"))
    assert fake.writes == []


def test_create_or_update_needs_a_name_and_a_kind() -> None:
    with pytest.raises(ValueError, match="metadata.name"):
        create_or_update(FakeClient(), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "x-"}})
    with pytest.raises(ValueError, match="apiVersion and kind"):
        create_or_update(FakeClient(), {"metadata": {"name": "x", "namespace": "ns"}})


def test_create_or_update_with_an_async_client_points_to_the_async_variant() -> None:
    with pytest.raises(TypeError, match="acreate_or_update"):
        create_or_update(FakeClient().aio, configmap())


def test_acreate_or_update() -> None:
    fake = FakeClient()
    skeleton = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}}

    async def run() -> list[str]:
        return [await acreate_or_update(fake.aio, skeleton, set_data(v)) for v in ("a", "a", "b")]

    assert asyncio.run(run()) == ["created", "unchanged", "updated"]
    assert [w.verb for w in fake.writes] == ["create", "update"]


def test_create_or_update_in_a_cluster_scoped_resource() -> None:
    fake = FakeClient()
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    assert create_or_update(fake, ns, lambda n: n["metadata"].setdefault("labels", {}).update(team="a")) == "created"
    assert fake.get("namespaces", "team-a")["metadata"]["labels"] == {"team": "a"}


# -- retry_on_conflict -------------------------------------------------------------------------


def test_retry_on_conflict_retries_conflicts_only_and_returns_the_result() -> None:
    sleeps: list[float] = []
    calls = iter([declop.Conflict("stale"), declop.Conflict("stale"), "done"])

    def fn() -> str:
        value = next(calls)
        if isinstance(value, Exception):
            raise value
        return value

    assert retry_on_conflict(fn, sleep=sleeps.append) == "done"
    assert len(sleeps) == 2 and all(0.01 <= s <= 0.011 for s in sleeps)


def test_retry_on_conflict_gives_up_after_attempts() -> None:
    tries: list[int] = []

    def fn() -> None:
        tries.append(1)
        raise declop.Conflict("always")

    with pytest.raises(declop.Conflict):
        retry_on_conflict(fn, sleep=lambda s: None)
    assert len(tries) == 5
    tries.clear()
    with pytest.raises(declop.Conflict):
        retry_on_conflict(fn, attempts=1, sleep=lambda s: None)
    assert len(tries) == 1
    with pytest.raises(ValueError):
        retry_on_conflict(fn, attempts=0)


def test_retry_on_conflict_does_not_retry_other_errors() -> None:
    tries: list[int] = []

    def fn() -> None:
        tries.append(1)
        raise declop.NotFound("gone")

    with pytest.raises(declop.NotFound):
        retry_on_conflict(fn, sleep=lambda s: None)
    assert len(tries) == 1


def test_retry_on_conflict_backoff_grows_with_factor() -> None:
    sleeps: list[float] = []

    def fn() -> None:
        raise declop.Conflict("x")

    with pytest.raises(declop.Conflict):
        retry_on_conflict(fn, attempts=4, base=0.1, factor=2.0, jitter=0.0, sleep=sleeps.append)
    assert sleeps == [0.1, 0.2, 0.4]


def test_a_stale_update_is_retried_with_a_fresh_read_against_the_fake() -> None:
    fake = FakeClient([configmap()])
    stale = fake.get("configmaps", "ns/c")
    fake.patch("configmaps", "ns/c", {"data": {"k": "theirs"}})  # someone else writes meanwhile
    reads: list[str] = []

    def change() -> dict[str, Any]:
        obj = stale if not reads else fake.live.get("configmaps", "ns/c")
        reads.append(obj["metadata"]["resourceVersion"])
        obj["data"]["mine"] = "1"
        return fake.update(obj)

    result = retry_on_conflict(change, sleep=lambda s: None)
    assert result["data"] == {"k": "theirs", "mine": "1"}
    assert len(reads) == 2


def test_aretry_on_conflict() -> None:
    tries: list[int] = []

    async def fn() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise declop.Conflict("stale")
        return "ok"

    assert asyncio.run(aretry_on_conflict(fn, base=0.001)) == "ok"
    assert len(tries) == 3
