"""The world's workload derived from the registrations (declop.testing.simulation.workload)."""

from __future__ import annotations

import random
from typing import Any

from pydantic import BaseModel, Field

import declop
from declop.registry import Registry
from declop.testing.simulation.workload import OUTSIDE_EVERY, UNWATCHED, minimal, scope, spec_schema, valid

WORLD = ("ns-a", "ns-b")


def _scope(**options: Any) -> Any:
    registry = Registry()

    @registry.reconciler("configmaps", **options)
    def handler(request: Any) -> None:
        return None

    return scope(registry.registrations, "configmaps", WORLD)


def _obj(namespace: str, labels: dict[str, str] | None = None, **top: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "w000", "namespace": namespace}
    if labels is not None:
        meta["labels"] = labels
    return {"metadata": meta, **top}


def test_without_filters_the_world_namespaces_and_every_object_are_watched() -> None:
    s = _scope()
    assert s.namespaces == WORLD and not s.filtered
    assert s.watched(_obj("anywhere"))
    obj = _obj("ns-a")
    assert s.fill(obj, 3) == _obj("ns-a")  # nothing to satisfy


def test_named_namespaces_are_the_workload_s_plus_one_nobody_watches() -> None:
    s = _scope(namespaces=["default", "prod"])
    assert s.namespaces == ("default", "prod", UNWATCHED)
    assert s.watched(_obj("default")) and s.watched(_obj("prod"))
    assert not s.watched(_obj(UNWATCHED)) and not s.watched(_obj("ns-a"))


def test_a_field_selector_on_the_namespace_counts_as_one() -> None:
    s = _scope(fields="metadata.namespace=default")
    assert s.namespaces == ("default", UNWATCHED)
    assert s.watched(_obj("default")) and not s.watched(_obj(UNWATCHED))


def test_objects_get_the_labels_a_selector_asks_for_except_some_outside_it() -> None:
    s = _scope(labels="app=web,tier in (b,a),managed,!skip")
    inside = s.fill(_obj("ns-a"), 0)
    assert inside["metadata"]["labels"] == {"app": "web", "tier": "a", "managed": "sim"}
    assert s.watched(inside)
    outside = s.fill(_obj("ns-a"), OUTSIDE_EVERY - 1)
    assert "labels" not in outside["metadata"] and not s.watched(outside)


def test_objects_get_the_field_values_a_field_selector_asks_for() -> None:
    s = _scope(fields="spec.nodeName=node-1")
    obj = s.fill(_obj("ns-a", spec={}), 0)
    assert obj["spec"] == {"nodeName": "node-1"} and s.watched(obj)
    assert not s.watched(_obj("ns-a", spec={"nodeName": "node-2"}))


def test_an_object_any_registration_selects_is_watched() -> None:
    registry = Registry()

    @registry.reconciler("configmaps", labels="app=web")
    def web(request: Any) -> None:
        return None

    @registry.reconciler("configmaps", labels="app=db")
    def db(request: Any) -> None:
        return None

    @registry.reconciler("secrets", namespaces=["other"])
    def secrets(request: Any) -> None:
        return None

    s = scope(registry.registrations, "configmaps", WORLD)
    assert s.namespaces == WORLD  # the secrets' registration does not narrow the configmaps'
    first, second = s.fill(_obj("ns-a"), 0), s.fill(_obj("ns-a"), 1)
    assert {first["metadata"]["labels"]["app"], second["metadata"]["labels"]["app"]} == {"web", "db"}
    assert s.watched(first) and s.watched(second)
    assert not s.watched(_obj("ns-a", {"app": "cache"}))


# -- a typed handler's objects: the smallest spec its CRD accepts ------------------------------

SCHEMA = {
    "type": "object",
    "required": ["message", "replicas", "mode", "tags", "size", "when", "nested"],
    "properties": {
        "message": {"type": "string", "minLength": 3},
        "replicas": {"type": "integer", "minimum": 1},
        "mode": {"type": "string", "enum": ["fast", "slow"]},
        "tags": {"type": "array", "minItems": 2, "items": {"type": "string"}},
        "size": {"x-kubernetes-int-or-string": True},
        "when": {"type": "string", "format": "date-time"},
        "nested": {"type": "object", "required": ["on"], "properties": {"on": {"type": "boolean"}, "skip": {"type": "string"}}},
        "key": {"type": "string", "default": "message"},
    },
}


def test_the_smallest_spec_has_every_required_field_within_its_bounds() -> None:
    assert minimal(SCHEMA) == {
        "message": "sss", "replicas": 1, "mode": "fast", "tags": ["s", "s"], "size": 0,
        "when": "2026-01-01T00:00:00Z", "nested": {"on": False},
    }


class WidgetSpec(BaseModel):
    message: str = Field(min_length=1)


class Widget(declop.CustomResource, group="example.com", version="v1", kind="Widget", plural="widgets"):
    spec: WidgetSpec


def test_the_scaffolded_model_gets_a_spec_it_accepts_and_a_bad_one_is_owed_nothing() -> None:
    """`declop new`'s Widget requires spec.message: with an empty spec every object failed its
    model, was skipped, and every seed of `declop sim handlers.py` failed I3 for all of them."""
    from declop.typed.crd import definitions

    registry = Registry()

    @registry.reconciler(Widget)
    def widget(obj: Widget) -> None:
        return None

    (resource,) = {r.resource for r in registry.registrations}
    schema = spec_schema(definitions([Widget]), resource)
    assert schema is not None and minimal(schema) == {"message": "s"}
    good = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "namespace": "n"}, "spec": minimal(schema)}
    assert valid(registry.registrations, resource, good)
    assert not valid(registry.registrations, resource, {**good, "spec": {}})
    assert valid(registry.registrations, "configmaps", {**good, "spec": {}})  # another resource: no model


def _typed_world(make: Any) -> tuple[Any, list[tuple[str, str]], Any]:
    """A typed handler (the scaffold's Widget) that records the (name, message) of each call."""
    from declop.typed.crd import definitions
    from declop.testing.simulation.world import World

    registry = Registry()
    calls: list[tuple[str, str]] = []

    @registry.reconciler(Widget)
    def widget(request: Any, obj: Widget | None) -> None:
        if obj is not None:
            calls.append((request.name, obj.spec.message))

    world = World(handlers="widgets.py", objects=24, duration=20.0, objects_from=make)
    return registry, calls, (world, definitions([Widget]))


def test_an_object_that_fails_its_model_is_owed_no_reconcile_and_the_run_passes() -> None:
    from declop.testing.simulation.world import run

    registry, calls, (world, crds) = _typed_world(lambda rng, index: {"spec": {} if index == 0 else {"message": f"m{index}"}})
    result = run(world, 3, registry, crds)
    assert result.ok, result.report()
    names = {name for name, _message in calls}
    assert "w000" not in names  # it failed its model every time: skipped, never owed a call
    assert names >= {"w001", "w002", "w003"}


def test_an_update_that_makes_an_invalid_object_valid_makes_it_owed_a_reconcile() -> None:
    """Every object is created invalid; the generator's later bodies (the workload's spec
    updates) are valid: those objects are reconciled with them, and I3 holds the run to it."""
    from declop.testing.simulation.world import run

    made: dict[int, int] = {}

    def make(rng: random.Random, index: int) -> dict[str, Any]:
        made[index] = made.get(index, 0) + 1
        return {"spec": {} if made[index] == 1 else {"message": f"m{index}-{made[index]}"}}

    registry, calls, (world, crds) = _typed_world(make)
    result = run(world, 5, registry, crds)
    assert result.ok, result.report()
    revived = {i for i, n in made.items() if n > 1}
    reconciled = {int(name[1:]) for name, _message in calls}
    assert reconciled and reconciled <= revived  # reconciled, and only once an update made them valid
    assert all(message.startswith("m") for _name, message in calls)


def test_the_project_s_generator_gives_the_objects_the_handler_sees() -> None:
    from declop.testing.simulation.world import run

    registry, calls, (world, crds) = _typed_world(lambda rng, index: {"spec": {"message": f"from-generator-{index}-{rng.randint(0, 9)}"}})
    result = run(world, 1, registry, crds)
    assert result.ok, result.report()
    assert calls and all(message.startswith(f"from-generator-{int(name[1:])}-") for name, message in calls)
    assert "--objects-from" in result.repro()
