"""declop.reconcile.predicates: built-ins filter updates only; composition; readable reprs."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from declop.reconcile import predicates as p
from declop.reconcile.predicates import (
    all_of,
    annotations_changed,
    any_of,
    generation_changed,
    label_selector,
    labels_changed,
    namespace_in,
    not_,
    resource_version_changed,
)


def obj(
    *,
    namespace: str | None = "default",
    generation: int = 1,
    rv: str = "1",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "x", "generation": generation, "resourceVersion": rv}
    if namespace is not None:
        meta["namespace"] = namespace
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"replicas": 1}, "status": status or {}}


CHANGED = [generation_changed, labels_changed, annotations_changed, resource_version_changed]


@pytest.mark.parametrize("pred", CHANGED, ids=repr)
def test_changed_builtins_pass_additions_and_deletions(pred: Any) -> None:
    assert pred(None, obj()) is True
    assert pred(obj(), None) is True


@pytest.mark.parametrize("pred", CHANGED, ids=repr)
def test_changed_builtins_drop_identical_updates(pred: Any) -> None:
    assert pred(obj(), obj()) is False


@pytest.mark.parametrize(
    ("pred", "old", "new"),
    [
        (generation_changed, obj(generation=1), obj(generation=2)),
        (labels_changed, obj(labels={"a": "1"}), obj(labels={"a": "2"})),
        (labels_changed, obj(), obj(labels={"a": "1"})),
        (labels_changed, obj(labels={"a": "1"}), obj()),
        (annotations_changed, obj(annotations={"a": "1"}), obj(annotations={"a": "2"})),
        (annotations_changed, obj(), obj(annotations={"a": "1"})),
        (resource_version_changed, obj(rv="1"), obj(rv="2")),
    ],
)
def test_changed_builtins_pass_relevant_updates(pred: Any, old: Any, new: Any) -> None:
    assert pred(old, new) is True


def test_generation_changed_ignores_status_only_updates() -> None:
    old = obj(generation=3, rv="10", status={"ready": False})
    new = obj(generation=3, rv="11", status={"ready": True})
    assert generation_changed(old, new) is False
    assert resource_version_changed(old, new) is True


@pytest.mark.parametrize("pred", CHANGED)
def test_an_update_that_replaced_the_object_passes_every_changed_predicate(pred: Any) -> None:
    """A name deleted and created again while the watch was down reaches the informer as an update
    (its relist) at the same generation 1, labels and annotations: the new object must still be
    reconciled (the simulator's examples/crd seeds 193 and 610 never reconciled it)."""
    old, new = obj(), obj()
    old["metadata"]["uid"], new["metadata"]["uid"] = "uid-1", "uid-2"
    assert pred(old, new) is True
    new["metadata"]["uid"] = "uid-1"
    assert pred is resource_version_changed or pred(old, new) is False


@pytest.mark.parametrize(
    ("pred", "old", "new"),
    [
        (generation_changed, obj(labels={"a": "1"}, rv="1"), obj(labels={"a": "2"}, rv="2")),
        (
            labels_changed,
            obj(generation=1, annotations={"a": "1"}),
            obj(generation=2, annotations={"a": "2"}),
        ),
        (
            annotations_changed,
            obj(labels={"a": "1"}, generation=1),
            obj(labels={"a": "2"}, generation=2),
        ),
    ],
)
def test_changed_builtins_ignore_other_fields(pred: Any, old: Any, new: Any) -> None:
    assert pred(old, new) is False


def test_changed_builtin_tolerates_missing_metadata() -> None:
    assert generation_changed({}, {}) is False
    assert generation_changed({"metadata": None}, obj()) is True


def test_label_selector_checks_the_new_object_or_the_old_one_on_delete() -> None:
    pred = label_selector("app=web")
    web, db = obj(labels={"app": "web"}), obj(labels={"app": "db"})
    assert pred(None, web) is True
    assert pred(None, db) is False
    assert pred(web, None) is True  # deletion: judged on the last known object
    assert pred(db, None) is False
    assert pred(db, web) is True  # update: judged on the new object
    assert pred(web, db) is False
    assert pred(None, obj()) is False


def test_label_selector_dict_and_set_forms() -> None:
    assert label_selector({"app": "web"})(None, obj(labels={"app": "web"}))
    pred = label_selector("tier in (a,b),!canary")
    assert pred(None, obj(labels={"tier": "b"}))
    assert not pred(None, obj(labels={"tier": "b", "canary": "1"}))
    assert not pred(None, obj(labels={"tier": "c"}))


def test_label_selector_rejects_a_bad_selector_early() -> None:
    with pytest.raises(ValueError, match="invalid label selector"):
        label_selector("app in (web")


def test_namespace_in() -> None:
    pred = namespace_in("a", "b")
    assert pred(None, obj(namespace="a")) is True
    assert pred(obj(namespace="b"), None) is True
    assert pred(obj(namespace="a"), obj(namespace="c")) is False
    assert pred(None, obj(namespace="c")) is False
    assert pred(None, obj(namespace=None)) is False
    assert namespace_in("")(None, obj(namespace=None)) is True  # cluster-scoped


def test_all_of() -> None:
    pred = all_of(generation_changed, namespace_in("a"))
    assert pred(obj(namespace="a", generation=1), obj(namespace="a", generation=2)) is True
    assert pred(obj(namespace="a"), obj(namespace="a")) is False
    assert pred(None, obj(namespace="b")) is False
    assert all_of()(obj(), obj()) is True


def test_any_of() -> None:
    pred = any_of(generation_changed, labels_changed)
    assert pred(obj(), obj(generation=2)) is True
    assert pred(obj(), obj(labels={"a": "b"})) is True
    assert pred(obj(), obj(rv="2")) is False
    assert any_of()(obj(), obj()) is False


def test_not() -> None:
    pred = not_(namespace_in("kube-system"))
    assert pred(None, obj(namespace="default")) is True
    assert pred(None, obj(namespace="kube-system")) is False
    assert not_(not_(generation_changed))(obj(), obj(generation=2)) is True


def test_nested_composition() -> None:
    pred = all_of(any_of(generation_changed, labels_changed), not_(namespace_in("kube-system")))
    assert pred(obj(), obj(generation=2)) is True
    assert pred(obj(namespace="kube-system"), obj(namespace="kube-system", generation=2)) is False
    assert pred(obj(), obj(rv="9")) is False


def test_plain_callables_compose() -> None:
    def always(old: Any, new: Any) -> bool:
        return True

    assert all_of(always, not_(always))(None, obj()) is False
    assert any_of(always, not_(always))(None, obj()) is True


@pytest.mark.parametrize(
    ("pred", "text"),
    [
        (generation_changed, "declop.predicates.generation_changed"),
        (labels_changed, "declop.predicates.labels_changed"),
        (annotations_changed, "declop.predicates.annotations_changed"),
        (resource_version_changed, "declop.predicates.resource_version_changed"),
        (label_selector("app==web"), "label_selector('app=web')"),
        (label_selector({"b": "2", "a": "1"}), "label_selector('a=1,b=2')"),
        (namespace_in("b", "a"), "namespace_in('a', 'b')"),
        (not_(generation_changed), "not_(declop.predicates.generation_changed)"),
        (
            all_of(generation_changed, namespace_in("a")),
            "all_of(declop.predicates.generation_changed, namespace_in('a'))",
        ),
        (
            any_of(labels_changed, not_(label_selector("x"))),
            "any_of(declop.predicates.labels_changed, not_(label_selector('x')))",
        ),
        (all_of(), "all_of()"),
    ],
)
def test_readable_reprs(pred: Any, text: str) -> None:
    assert repr(pred) == text


def test_builtins_are_immutable_and_equal_by_value() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        namespace_in("a").namespaces = frozenset()  # type: ignore[attr-defined]
    assert namespace_in("a", "b") == namespace_in("b", "a")
    assert label_selector("app=web") == label_selector({"app": "web"})
    assert hash(all_of(generation_changed)) == hash(all_of(generation_changed))


def test_module_all_is_exported() -> None:
    for name in p.__all__:
        assert hasattr(p, name)


def test_is_builtin_tells_the_builtins_and_their_combinations_from_user_functions() -> None:
    def mine(old: Any, new: Any) -> bool:
        return True

    assert p.is_builtin(generation_changed) and p.is_builtin(all_of(label_selector("a=b"), not_(namespace_in("x"))))
    assert not p.is_builtin(mine) and not p.is_builtin(any_of(generation_changed, mine))
    assert not p.is_builtin(not_(mine))
