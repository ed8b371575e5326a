"""declop.reconcile.mapping: events → keys, looking only at the objects given."""

from __future__ import annotations

from typing import Any

import pytest

from declop.kube.keys import Request
from declop.reconcile.mapping import enqueue_mapped, enqueue_owner, enqueue_self, to_request


def obj(
    name: str = "x", namespace: str | None = "default", owners: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    if owners is not None:
        meta["ownerReferences"] = owners
    return {"metadata": meta}


def ref(
    kind: str, name: str, api_version: str = "apps/v1", controller: bool | None = True
) -> dict[str, Any]:
    r: dict[str, Any] = {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": f"uid-{name}",
    }
    if controller is not None:
        r["controller"] = controller
    return r


# -- enqueue_self ---------------------------------------------------------------------------


def test_enqueue_self_add_update_delete() -> None:
    a = obj("a")
    assert enqueue_self(None, a) == {Request("default", "a")}
    assert enqueue_self(a, a) == {Request("default", "a")}
    assert enqueue_self(a, None) == {Request("default", "a")}
    assert enqueue_self(None, obj("node-1", namespace=None)) == {Request("", "node-1")}


# -- enqueue_owner --------------------------------------------------------------------------


def test_enqueue_owner_picks_the_controller_owner_of_matching_group_and_kind() -> None:
    child = obj(
        "web-abc",
        owners=[
            ref("ReplicaSet", "not-controller", controller=False),
            ref("ReplicaSet", "no-flag", controller=None),
            ref("Deployment", "wrong-kind"),
            ref("ReplicaSet", "wrong-group", api_version="example.com/v1"),
            ref("ReplicaSet", "web"),
        ],
    )
    mapper = enqueue_owner("apps", "ReplicaSet")
    assert mapper(None, child) == {Request("default", "web")}


def test_enqueue_owner_core_group_is_empty_string() -> None:
    child = obj(
        "pod-x",
        owners=[
            ref("ConfigMap", "core-owner", api_version="v1"),
            ref("ConfigMap", "apps-owner", api_version="apps/v1"),
        ],
    )
    # only one may have controller=true in reality; the mapper still filters on group
    assert enqueue_owner("", "ConfigMap")(None, child) == {Request("default", "core-owner")}
    assert enqueue_owner("apps", "ConfigMap")(None, child) == {Request("default", "apps-owner")}


def test_enqueue_owner_group_with_dots_and_versions() -> None:
    child = obj(owners=[ref("Widget", "w", api_version="widgets.example.com/v1beta1")])
    assert enqueue_owner("widgets.example.com", "Widget")(None, child) == {Request("default", "w")}
    assert enqueue_owner("example.com", "Widget")(None, child) == set()


def test_enqueue_owner_without_controller_only() -> None:
    child = obj(owners=[ref("ReplicaSet", "a", controller=False), ref("ReplicaSet", "b")])
    assert enqueue_owner("apps", "ReplicaSet", controller_only=False)(None, child) == {
        Request("default", "a"),
        Request("default", "b"),
    }


def test_enqueue_owner_enqueues_both_old_and_new_owners() -> None:
    old = obj("child", owners=[ref("Deployment", "before")])
    new = obj("child", owners=[ref("Deployment", "after")])
    mapper = enqueue_owner("apps", "Deployment")
    assert mapper(old, new) == {Request("default", "before"), Request("default", "after")}
    assert mapper(old, None) == {Request("default", "before")}
    assert mapper(None, new) == {Request("default", "after")}


def test_enqueue_owner_cluster_scoped_owner_gets_empty_namespace() -> None:
    child = obj(
        "pod", namespace="default", owners=[ref("Widget", "w", api_version="example.com/v1")]
    )
    mapper = enqueue_owner("example.com", "Widget", namespaced=False)
    assert mapper(None, child) == {Request("", "w")}


def test_enqueue_owner_no_owners() -> None:
    mapper = enqueue_owner("apps", "Deployment")
    assert mapper(None, obj()) == set()
    assert mapper(None, obj(owners=[])) == set()
    assert mapper(None, {"metadata": {"name": "x", "ownerReferences": None}}) == set()


def test_enqueue_owner_qualname() -> None:
    assert enqueue_owner("", "ConfigMap").__qualname__ == "enqueue_owner(core/ConfigMap)"
    assert enqueue_owner("apps", "Deployment").__qualname__ == "enqueue_owner(apps/Deployment)"


# -- enqueue_mapped / to_request -------------------------------------------------------------


@pytest.mark.parametrize(
    "returned",
    [
        [Request("ns", "a")],
        ["ns/a"],
        [{"metadata": {"namespace": "ns", "name": "a"}}],
        [("ns", "a")],
        (Request("ns", "a"),),
        {"ns/a"},
    ],
)
def test_enqueue_mapped_accepts_every_key_form(returned: Any) -> None:
    mapper = enqueue_mapped(lambda o: returned)
    assert mapper(None, obj()) == {Request("ns", "a")}


def test_enqueue_mapped_mixed_forms_and_cluster_scoped() -> None:
    def fn(o: Any) -> list[Any]:
        return [
            Request("", "n1"),
            "n2",
            ("", "n3"),
            (None, "n4"),
            {"metadata": {"name": "n5"}},
            "ns/a",
        ]

    assert enqueue_mapped(fn)(None, obj()) == {
        Request("", "n1"),
        Request("", "n2"),
        Request("", "n3"),
        Request("", "n4"),
        Request("", "n5"),
        Request("ns", "a"),
    }


def test_enqueue_mapped_runs_on_old_and_new() -> None:
    seen: list[str] = []

    def fn(o: Any) -> list[str]:
        seen.append(o["metadata"]["name"])
        return [f"ns/{o['metadata']['name']}-target"]

    mapper = enqueue_mapped(fn)
    assert mapper(obj("old"), obj("new")) == {
        Request("ns", "old-target"),
        Request("ns", "new-target"),
    }
    assert seen == ["old", "new"]
    seen.clear()
    assert mapper(obj("gone"), None) == {Request("ns", "gone-target")}
    assert seen == ["gone"]


def test_enqueue_mapped_none_means_nothing() -> None:
    assert enqueue_mapped(lambda o: None)(None, obj()) == set()
    assert enqueue_mapped(lambda o: [])(obj(), obj()) == set()


@pytest.mark.parametrize("bad", [42, ("a", "b", "c"), ["ns", "a"], object()])
def test_enqueue_mapped_bad_return_type_raises(bad: Any) -> None:
    mapper = enqueue_mapped(lambda o: [bad])
    with pytest.raises(TypeError, match="return Requests, 'ns/name' strings or objects"):
        mapper(None, obj())


def test_enqueue_mapped_bad_string_raises_value_error() -> None:
    with pytest.raises(ValueError, match="not a key"):
        enqueue_mapped(lambda o: ["a/b/c"])(None, obj())


def test_enqueue_mapped_qualname() -> None:
    def find_parents(o: Any) -> list[str]:
        return []

    assert enqueue_mapped(find_parents).__qualname__ == "enqueue_mapped(find_parents)"


def test_to_request_passes_a_request_through() -> None:
    r = Request("a", "b")
    assert to_request(r) is r


def test_a_map_function_gets_read_only_views_and_cannot_change_the_cache() -> None:
    seen: list[Any] = []

    def sloppy(o: Any) -> list[str]:
        seen.append(o)
        o["metadata"].setdefault("labels", {})["mapped"] = "yes"
        return []

    cached = obj("a")
    mapper = enqueue_mapped(sloppy)
    with pytest.raises(TypeError, match="read-only"):
        mapper(None, cached)
    assert "labels" not in cached["metadata"] and cached == obj("a")


def test_a_map_function_may_return_the_view_itself() -> None:
    assert enqueue_mapped(lambda o: [o])(None, obj("a", "ns")) == {Request("ns", "a")}
