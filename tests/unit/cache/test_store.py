"""declop.cache.store: the Store read face, its single Writer, indexes, relists and ``clone``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from declop.cache.store import Store, Writer, clone, readonly, strip_managed_fields
from declop.errors import CacheNotSyncedError
from declop.kube.keys import Request


def pod(
    name: str,
    namespace: str = "default",
    *,
    rv: str = "1",
    labels: dict[str, str] | None = None,
    node: str | None = None,
    **meta: Any,
) -> dict[str, Any]:
    o: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": rv, **meta},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]},
    }
    if labels is not None:
        o["metadata"]["labels"] = labels
    if node is not None:
        o["spec"]["nodeName"] = node
    return o


def by_node(obj: Mapping[str, Any]) -> Iterable[str | None]:
    return [obj["spec"].get("nodeName")]


def make(**indexers: Any) -> tuple[Store, Writer]:
    store = Store("pods", indexers=indexers or None)
    return store, Writer(store)


def names(objs: Iterable[Mapping[str, Any]]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


# -- upsert / delete ------------------------------------------------------------------------


def test_upsert_returns_old_and_new() -> None:
    store, writer = make()
    first = pod("a", rv="1")
    old, new = writer.upsert(first)
    assert old is None
    assert new is first
    second = pod("a", rv="2")
    old, new = writer.upsert(second)
    assert old is first
    assert new is second
    assert store.get(Request("default", "a")) is second
    assert len(store) == 1


def test_transform_strips_managed_fields_by_default() -> None:
    store, writer = make()
    writer.upsert(pod("a", managedFields=[{"manager": "kubectl"}]))
    stored = store.get(Request("default", "a"))
    assert stored is not None
    assert "managedFields" not in stored["metadata"]
    assert stored["metadata"]["name"] == "a"


def test_strip_managed_fields_tolerates_missing_metadata() -> None:
    assert strip_managed_fields({"kind": "X"}) == {"kind": "X"}


def test_custom_and_disabled_transform() -> None:
    store = Store("pods")
    Writer(store, transform=None).upsert(pod("a", managedFields=[{"manager": "m"}]))
    assert store.get(Request("default", "a"))["metadata"]["managedFields"] == [{"manager": "m"}]  # type: ignore[index]

    def tag(o: dict[str, Any]) -> dict[str, Any]:
        return {**o, "tagged": True}

    store2 = Store("pods")
    _, new = Writer(store2, transform=tag).upsert(pod("a"))
    assert new["tagged"] is True
    assert store2.get(Request("default", "a")) is new


def test_delete_returns_last_object_and_none_when_absent() -> None:
    store, writer = make()
    obj = pod("a")
    writer.upsert(obj)
    assert writer.delete(Request("default", "a")) is obj
    assert store.get(Request("default", "a")) is None
    assert Request("default", "a") not in store
    assert writer.delete(Request("default", "a")) is None
    assert len(store) == 0


def test_keys_contains_and_iter() -> None:
    store, writer = make()
    writer.upsert(pod("a"))
    writer.upsert(pod("node-1", namespace=""))
    assert sorted(store.keys()) == [Request("", "node-1"), Request("default", "a")]
    assert Request("default", "a") in store
    assert Request("other", "a") not in store
    assert names(store) == ["a", "node-1"]


# -- list ---------------------------------------------------------------------------------


def test_list_by_namespace() -> None:
    store, writer = make()
    writer.upsert(pod("a", "ns1"))
    writer.upsert(pod("b", "ns1"))
    writer.upsert(pod("c", "ns2"))
    assert names(store.list()) == ["a", "b", "c"]
    assert names(store.list(namespace="ns1")) == ["a", "b"]
    assert names(store.list(namespace="ns2")) == ["c"]
    assert store.list(namespace="nope") == []
    writer.delete(Request("ns1", "a"))
    writer.delete(Request("ns1", "b"))
    assert store.list(namespace="ns1") == []
    assert names(store.list()) == ["c"]


def test_update_keeps_namespace_membership_single() -> None:
    store, writer = make()
    writer.upsert(pod("a", rv="1"))
    writer.upsert(pod("a", rv="2"))
    assert [o["metadata"]["resourceVersion"] for o in store.list(namespace="default")] == ["2"]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", ["a", "c"]),
        ({"app": "web"}, ["a", "c"]),
        ("app=web,tier=db", ["c"]),
        ("!app", ["d"]),
        ("app notin (web)", ["b", "d"]),
        ("", ["a", "b", "c", "d"]),
        (None, ["a", "b", "c", "d"]),
    ],
)
def test_list_by_selector(selector: Any, expected: list[str]) -> None:
    store, writer = make()
    writer.upsert(pod("a", labels={"app": "web"}))
    writer.upsert(pod("b", labels={"app": "api"}))
    writer.upsert(pod("c", labels={"app": "web", "tier": "db"}))
    writer.upsert(pod("d"))
    assert names(store.list(selector=selector)) == expected


def test_list_by_namespace_and_selector() -> None:
    store, writer = make()
    writer.upsert(pod("a", "ns1", labels={"app": "web"}))
    writer.upsert(pod("b", "ns2", labels={"app": "web"}))
    writer.upsert(pod("c", "ns1", labels={"app": "db"}))
    assert names(store.list(namespace="ns1", selector="app=web")) == ["a"]


# -- indexes ------------------------------------------------------------------------------


def test_index_kept_current_on_create_update_delete() -> None:
    store, writer = make(node=by_node)
    writer.upsert(pod("a", node="n1"))
    writer.upsert(pod("b", node="n1"))
    writer.upsert(pod("c", node="n2"))
    writer.upsert(pod("d"))  # None values are not indexed
    assert names(store.list(index=("node", "n1"))) == ["a", "b"]
    assert names(store.list(index=("node", "n2"))) == ["c"]
    assert store.list(index=("node", "None")) == []

    # an update that changes the indexed value moves the object
    writer.upsert(pod("a", rv="2", node="n2"))
    assert names(store.list(index=("node", "n1"))) == ["b"]
    assert names(store.list(index=("node", "n2"))) == ["a", "c"]

    # an update that keeps the value keeps it indexed once
    writer.upsert(pod("a", rv="3", node="n2"))
    assert names(store.list(index=("node", "n2"))) == ["a", "c"]

    writer.delete(Request("default", "b"))
    assert store.list(index=("node", "n1")) == []
    writer.delete(Request("default", "a"))
    writer.delete(Request("default", "c"))
    assert store.list(index=("node", "n2")) == []
    assert store._indexes["node"] == {}  # empty buckets are dropped


def test_index_with_several_values_and_namespace_filter() -> None:
    def by_label_values(obj: Mapping[str, Any]) -> list[str]:
        return sorted((obj["metadata"].get("labels") or {}).values())

    store, writer = make(values=by_label_values)
    writer.upsert(pod("a", "ns1", labels={"x": "red", "y": "blue"}))
    writer.upsert(pod("b", "ns2", labels={"x": "red"}))
    assert names(store.list(index=("values", "red"))) == ["a", "b"]
    assert names(store.list(index=("values", "blue"))) == ["a"]
    assert names(store.list(index=("values", "red"), namespace="ns2")) == ["b"]
    writer.upsert(pod("a", "ns1", rv="2", labels={"x": "green"}))
    assert names(store.list(index=("values", "red"))) == ["b"]
    assert store.list(index=("values", "blue")) == []
    assert names(store.list(index=("values", "green"))) == ["a"]


def test_list_unknown_index_raises_key_error() -> None:
    store, _ = make()
    with pytest.raises(KeyError, match="no index 'node'"):
        store.list(index=("node", "n1"))


def test_add_indexer_indexes_existing_items() -> None:
    store, writer = make()
    writer.upsert(pod("a", node="n1"))
    writer.upsert(pod("b", node="n2"))
    store.add_indexer("node", by_node)
    assert names(store.list(index=("node", "n1"))) == ["a"]
    writer.upsert(pod("c", node="n1"))
    assert names(store.list(index=("node", "n1"))) == ["a", "c"]


def test_add_indexer_same_function_is_idempotent_other_raises() -> None:
    store, writer = make(node=by_node)
    writer.upsert(pod("a", node="n1"))
    store.add_indexer("node", by_node)
    assert names(store.list(index=("node", "n1"))) == ["a"]
    with pytest.raises(ValueError, match="already exists"):
        store.add_indexer("node", lambda o: [])


# -- replace (relist) ---------------------------------------------------------------------


def test_replace_reports_adds_changes_and_synthesised_deletions() -> None:
    store, writer = make(node=by_node)
    a1, b1, c1 = (
        pod("a", rv="1", node="n1"),
        pod("b", rv="1", node="n1"),
        pod("c", rv="1", node="n1"),
    )
    for o in (a1, b1, c1):
        writer.upsert(o)

    a_same = pod("a", rv="1", node="n1")  # unchanged resourceVersion → nothing
    b2 = pod("b", rv="2", node="n2")  # changed
    d1 = pod("d", rv="5", node="n2")  # new
    changes = writer.replace([a_same, b2, d1], resource_version="100")

    assert (b1, b2) in changes
    assert (None, d1) in changes
    assert (c1, None) in changes
    assert len(changes) == 3
    assert all(old is not a1 for old, _ in changes)

    assert names(store) == ["a", "b", "d"]
    assert store.get(Request("default", "a")) is a1  # unchanged object was not replaced
    assert store.get(Request("default", "b")) is b2
    assert names(store.list(index=("node", "n1"))) == ["a"]
    assert names(store.list(index=("node", "n2"))) == ["b", "d"]
    assert store.synced is True
    assert store.resource_version == "100"


def test_replace_into_empty_store_sets_synced() -> None:
    store, writer = make()
    assert store.synced is False
    assert store.resource_version == ""
    changes = writer.replace([pod("a"), pod("b")], resource_version="7")
    assert [(old, new["metadata"]["name"]) for old, new in changes] == [(None, "a"), (None, "b")]  # type: ignore[index]
    assert store.synced is True
    assert store.resource_version == "7"


def test_replace_with_nothing_deletes_everything() -> None:
    store, writer = make()
    a = pod("a")
    writer.upsert(a)
    assert writer.replace([], resource_version="9") == [(a, None)]
    assert len(store) == 0
    assert store.list(namespace="default") == []
    assert store.synced


def test_chunked_replace_keeps_the_old_content_whole_until_commit() -> None:
    """Between the steps of a replace (when the informer yields to the loop) every read face —
    get, len, keys, iteration, list by namespace, by index, by selector — shows the old content
    whole; after the commit, the new content whole; the changes are those of ``replace``, in the
    order of the listed objects, then the synthesised deletions."""
    store, writer = make(node=by_node)
    old = [pod(f"o{i}", rv="1", node="n1", labels={"gen": "old"}) for i in range(10)]
    for o in old:
        writer.upsert(o)
    store.synced, store.resource_version = True, "1"
    new = [pod(f"o{i}", rv="1", node="n1", labels={"gen": "old"}) for i in range(5)]  # unchanged
    new += [pod(f"n{i}", rv="2", node="n2", labels={"gen": "new"}) for i in range(10)]  # added

    def view() -> tuple[Any, ...]:
        return (
            len(store),
            sorted(str(k) for k in store.keys()),  # noqa: SIM118 - Store.keys() gives keys, iter() objects
            names(store),
            names(store.list(namespace="default")),
            names(store.list(index=("node", "n1"))),
            names(store.list(index=("node", "n2"))),
            names(store.list(selector={"gen": "new"})),
            store.get(Request("default", "o7")) is not None,
            store.resource_version,
        )

    before = view()
    job = writer.begin_replace(new, resource_version="2")
    steps = 0
    while not job.step(3):
        steps += 1
        assert view() == before, f"after step {steps}"
    assert steps >= 5  # 15 listed + 10 old keys in steps of 3: many reads in between
    assert view() == before
    changes = job.commit()

    assert names(store) == sorted([f"o{i}" for i in range(5)] + [f"n{i}" for i in range(10)])
    assert names(store.list(index=("node", "n1"))) == [f"o{i}" for i in range(5)]
    assert names(store.list(index=("node", "n2"))) == sorted(f"n{i}" for i in range(10))
    assert store.get(Request("default", "o0")) is old[0]  # unchanged: the old dict stays
    assert store.resource_version == "2"
    assert [(o and o["metadata"]["name"], n and n["metadata"]["name"]) for o, n in changes] == (
        [(None, f"n{i}") for i in range(10)] + [(f"o{i}", None) for i in range(5, 10)]
    )


def test_replace_swaps_atomically_for_readers_on_other_threads() -> None:
    """A reader thread listing by namespace, by index and in full while the writer keeps
    replacing content A by content B and back sees exactly A or exactly B, never a mix: the
    swap of the store's dicts is guarded by a seqlock. The interpreter's thread switch interval
    is set to 1 µs so that the reader is preempted in the middle of its reads all the time."""
    import sys
    import threading

    store, writer = make(node=by_node)
    content = {
        "A": [pod(f"a{i}", rv="1", node="n") for i in range(50)],
        "B": [pod(f"b{i}", rv="1", node="n") for i in range(50)],
    }
    expected = {tuple(names(objs)) for objs in content.values()}
    writer.replace(content["A"], resource_version="1")
    seen: dict[tuple[str, ...], int] = {}
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            for objs in (store.list(namespace="default"), store.list(index=("node", "n")), store.list()):
                got = tuple(names(objs))
                seen[got] = seen.get(got, 0) + 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=reader)
    try:
        thread.start()
        for i in range(400):
            job = writer.begin_replace(content["B" if i % 2 == 0 else "A"], resource_version=str(i))
            while not job.step(7):
                pass
            job.commit()
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    mixed = {k: n for k, n in seen.items() if k not in expected}
    assert not mixed, f"{sum(mixed.values())} reads saw a mix of two contents, e.g. {next(iter(mixed))}"
    assert set(seen) == expected  # the reader did run across both contents


# -- require_synced -----------------------------------------------------------------------


def test_require_synced_raises_until_first_list() -> None:
    store, writer = make()
    with pytest.raises(CacheNotSyncedError, match="pods"):
        store.require_synced()
    writer.upsert(pod("a"))  # an upsert is not a list
    with pytest.raises(CacheNotSyncedError):
        store.require_synced()
    writer.replace([], resource_version="1")
    store.require_synced()


# -- clone --------------------------------------------------------------------------------


def test_clone_is_a_deep_copy() -> None:
    store, writer = make()
    writer.upsert(pod("a", labels={"app": "web"}))
    shared = store.get(Request("default", "a"))
    copy = clone(shared)
    assert copy == shared
    assert copy is not shared

    copy["metadata"]["labels"]["app"] = "changed"
    copy["metadata"]["name"] = "b"
    copy["spec"]["containers"][0]["image"] = "evil"
    copy["spec"]["containers"].append({"name": "d"})
    copy["status"] = {}

    again = store.get(Request("default", "a"))
    assert again == pod("a", labels={"app": "web"})


def test_clone_of_scalars_and_lists() -> None:
    assert clone(3) == 3
    assert clone(None) is None
    nested = [1, [2, {"a": [3]}]]
    copy = clone(nested)
    assert copy == nested
    copy[1][1]["a"].append(4)
    assert nested == [1, [2, {"a": [3]}]]


# -- read-only views: what predicates, map functions and index functions get ----------------------
def cached() -> dict[str, Any]:
    return {
        "metadata": {"name": "a", "namespace": "ns", "labels": {"app": "web"}, "finalizers": ["x.io/f"]},
        "spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80}]}], "replicas": 2},
    }


def test_readonly_reads_like_the_dict() -> None:
    obj = cached()
    view = readonly(obj)
    assert view["metadata"]["labels"]["app"] == "web"
    assert view.get("spec", {}).get("replicas") == 2 and view.get("status") is None
    assert view["spec"]["containers"][0]["ports"][0]["containerPort"] == 80
    assert [c["name"] for c in view["spec"]["containers"]] == ["c"]
    assert "x.io/f" in view["metadata"]["finalizers"] and "metadata" in view
    assert dict(view["metadata"]["labels"]) == {"app": "web"} and len(view) == 2
    assert view == obj and view == readonly(cached()) and view["spec"]["containers"] == obj["spec"]["containers"]
    assert isinstance(view, Mapping) and readonly(None) is None and readonly("s") == "s"


@pytest.mark.parametrize(
    "change",
    [
        lambda v: v.__setitem__("x", 1),
        lambda v: v["metadata"].setdefault("annotations", {}),
        lambda v: v["metadata"]["labels"].update(app="db"),
        lambda v: v["metadata"].pop("name"),
        lambda v: v.__delitem__("spec"),
        lambda v: v["metadata"].clear(),
        lambda v: v["metadata"]["finalizers"].append("y"),
        lambda v: v["metadata"]["finalizers"].__setitem__(0, "y"),
        lambda v: v["spec"]["containers"][0]["ports"].pop(),
        lambda v: v["spec"]["containers"].sort(),
    ],
)
def test_readonly_refuses_every_change_with_a_hint(change: Any) -> None:
    obj = cached()
    with pytest.raises(TypeError, match=r"read-only here; declop.clone\(obj\) gives a mutable copy"):
        change(readonly(obj))
    assert obj == cached()


def test_copies_of_a_view_are_plain_and_mutable() -> None:
    import copy
    import json

    obj = cached()
    view = readonly(obj)
    for mutable in (clone(view), view.copy(), copy.deepcopy(view)):
        assert type(mutable) is dict and mutable == obj
        mutable["metadata"]["labels"]["app"] = "db"
        mutable["spec"]["containers"].append({})
    assert obj == cached()
    assert json.loads(json.dumps(clone(view))) == obj
    assert type(clone(view["metadata"]["finalizers"])) is list


def test_index_functions_get_read_only_views() -> None:
    def greedy(o: Any) -> list[str]:
        o["metadata"].setdefault("annotations", {})["seen"] = "yes"  # a bug in user code
        return ["x"]

    store = Store("configmaps", indexers={"greedy": greedy})
    writer = Writer(store)
    writer.upsert(cached())
    assert "annotations" not in store.get(Request("ns", "a"))["metadata"]  # type: ignore[index]
    assert store.list(index=("greedy", "x")) == []  # left out of the index, logged


# -- guarded user transforms ------------------------------------------------------------------


def _raw(name: str = "a", rv: str = "1") -> dict:
    return {
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv, "managedFields": [{"m": 1}]},
        "spec": {"big": "x" * 100},
    }


def test_a_guarded_transform_replaces_the_default() -> None:
    from declop.cache.store import guarded

    def slim(obj: dict) -> dict:
        obj.pop("spec")
        return obj  # managedFields kept: the user's transform replaces the default

    store = Store("pods")
    Writer(store, guarded(slim, "pods")).upsert(_raw())
    cached = store.get(Request("ns", "a"))
    assert cached == {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "1", "managedFields": [{"m": 1}]}}


@pytest.mark.parametrize(
    ("fn", "why"),
    [
        (lambda o: 1 / 0, "raised ZeroDivisionError"),
        (lambda o: None, "it must return the object with metadata name, namespace and resourceVersion unchanged"),
        (
            lambda o: {"metadata": {"name": "other"}},
            "it must return the object with metadata name, namespace and resourceVersion unchanged",
        ),
    ],
)
def test_a_failing_transform_is_logged_without_contents_and_the_default_applies(fn, why, caplog) -> None:
    from declop.cache.store import guarded

    store = Store("pods")
    with caplog.at_level("ERROR", logger="declop.cache"):
        Writer(store, guarded(fn, "pods")).upsert(_raw())
    cached = store.get(Request("ns", "a"))
    assert cached is not None and "managedFields" not in cached["metadata"]
    assert cached["metadata"]["resourceVersion"] == "1"
    (record,) = caplog.records
    assert record.getMessage() == (
        f"The transform of pods failed on ns/a ({why}); cached with the default transform (managedFields dropped)"
    )
    assert "xxxx" not in caplog.text


@pytest.mark.parametrize("namespace", ["ns", None])
def test_a_transform_that_broke_the_object_in_place_and_raised_leaves_its_identity_whole(namespace) -> None:
    """The fallback puts back exactly the name, namespace and resourceVersion the object came
    with — a cluster-scoped one gets no ``namespace: None`` — so the cache keys it as before."""
    from declop.cache.store import guarded

    def vandal(obj: dict) -> dict:
        obj["metadata"].clear()
        raise RuntimeError("half way")

    raw = _raw()
    if namespace is None:
        del raw["metadata"]["namespace"]
    resource = "nodes" if namespace is None else "pods"
    store = Store(resource)
    Writer(store, guarded(vandal, resource)).upsert(raw)
    cached = store.get(Request(namespace or "", "a"))
    expected = {"name": "a", "resourceVersion": "1"} | ({"namespace": namespace} if namespace else {})
    assert cached is not None and cached["metadata"] == expected


def test_a_relist_keeps_an_unchanged_object_after_a_transform() -> None:
    from declop.cache.store import guarded

    calls = []

    def count(obj: dict) -> dict:
        calls.append(obj["metadata"]["name"])
        return obj

    store = Store("pods")
    writer = Writer(store, guarded(count, "pods"))
    writer.replace([_raw("a"), _raw("b")], "5")
    changes = writer.replace([_raw("a"), _raw("b", rv="2")], "6")
    assert calls == ["a", "b", "b"]  # unchanged "a" is not transformed again
    assert [(old is not None, new["metadata"]["name"]) for old, new in changes] == [(True, "b")]
