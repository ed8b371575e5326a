"""The bodies and updates of a handlers file's objects (declop.testing.simulation.objects)."""

from __future__ import annotations

import random
import sys
import types
from typing import Any

import pytest

from declop.errors import ConfigError
from declop.registry import Registry
from declop.testing.fakes.apiserver import _merge_patch
from declop.testing.simulation.objects import INVALID, STATUS_KEY, Objects, label, maker, merge_patch
from declop.testing.simulation.workload import Scope, scope

SCHEMA = {
    "type": "object",
    "required": ["size"],
    "properties": {"size": {"type": "integer", "minimum": 1, "maximum": 9}, "name": {"type": "string", "maxLength": 4}},
}
PLAIN = Scope(("ns-a",), ())


def _valid(obj: Any) -> bool:
    spec = obj.get("spec") or {}
    name = spec.get("name", "")
    return isinstance(spec.get("size"), int) and 1 <= spec["size"] <= 9 and isinstance(name, str) and len(name) <= 4


def _new(objects: Objects, index: int = 0) -> dict[str, Any]:
    return objects.new({"apiVersion": "v1", "kind": "Thing", "metadata": {"name": f"w{index:03d}", "namespace": "ns-a"}}, index)


@pytest.mark.parametrize(
    ("old", "new"),
    [({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": 4}, "e": [1]}), ({}, {"a": {"b": 1}}), ({"a": [1, 2]}, {"a": [2]})],
)
def test_a_merge_patch_turns_the_old_value_into_the_new(old: Any, new: Any) -> None:
    assert _merge_patch(old, merge_patch(old, new)) == new


def test_typed_objects_get_varied_specs_and_about_one_in_ten_fails_its_model() -> None:
    objects = Objects(SCHEMA, _valid, random.Random(0))
    bodies = [_new(objects, i) for i in range(1000)]
    bad = sum(not _valid(b) for b in bodies)
    assert bad == objects.broken and 1000 / INVALID / 2 < bad < 1000 / INVALID * 2
    assert {b["spec"]["size"] for b in bodies if _valid(b)} == set(range(1, 10))
    assert all(b["metadata"] == {"name": f"w{i:03d}", "namespace": "ns-a"} for i, b in enumerate(bodies))


def test_updates_are_of_the_spec_the_metadata_or_the_status() -> None:
    registry = Registry()

    @registry.reconciler("things", labels="app=web")
    def thing(request: Any) -> None:
        return None

    filtered = scope(registry.registrations, "things", ("ns-a",))
    objects = Objects(SCHEMA, _valid, random.Random(0), status=True)
    stored = {**_new(objects), "status": {"ready": True}}
    kinds = set()
    for value in range(200):
        sub, patch = objects.update(stored, 0, value, filtered)
        if sub == "status":
            assert patch == {"status": {STATUS_KEY: value}}
            kinds.add("status")
        else:
            assert sub is None and len(patch) == 1
            (top,) = patch
            kinds.add(top if top == "spec" else f"metadata.{next(iter(patch['metadata']))}")
    assert kinds == {"spec", "metadata.annotations", "metadata.labels", "status"}


def test_a_status_update_that_would_fail_the_model_is_a_metadata_one() -> None:
    objects = Objects(None, lambda obj: STATUS_KEY not in (obj.get("status") or {}), random.Random(0), status=True)
    stored = _new(objects)
    assert all(objects.update(stored, 0, v, PLAIN)[0] is None for v in range(100))


def test_a_project_s_generator_gives_the_body_and_its_labels() -> None:
    def make(rng: random.Random, index: int) -> dict[str, Any]:
        return {"metadata": {"name": "ignored", "labels": {"team": "a"}}, "spec": {"n": index}, "data": {"k": str(rng.random())}}

    objects = Objects(None, _valid, random.Random(0), maker(make), label(make))
    obj = _new(objects, 7)
    assert obj["metadata"] == {"name": "w007", "namespace": "ns-a", "labels": {"team": "a"}}
    assert obj["spec"] == {"n": 7} and set(obj["data"]) == {"k"}
    patches = [objects.update(obj, 7, v, PLAIN)[1] for v in range(50)]
    spec = [p for p in patches if "metadata" not in p]
    assert spec and all(set(p) == {"data"} for p in spec)  # the next body: only what changed (spec.n is the same)
    assert label(make).endswith("test_a_project_s_generator_gives_the_body_and_its_labels.<locals>.make")


def test_a_list_of_bodies_is_cycled() -> None:
    make = maker([{"spec": {"n": 0}}, {"spec": {"n": 1}}])
    assert make is not None and [make(random.Random(), i)["spec"]["n"] for i in range(4)] == [0, 1, 0, 1]


def test_a_generator_is_found_by_module_and_function(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("sim_objects_for_test")
    module.bodies = lambda rng, index: {"spec": {"i": index}}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sim_objects_for_test", module)
    make = maker("sim_objects_for_test:bodies")
    assert make is not None and make(random.Random(), 3) == {"spec": {"i": 3}}
    with pytest.raises(ConfigError, match="has no 'nothing'"):
        maker("sim_objects_for_test:nothing")
    with pytest.raises(ConfigError, match="write module:function"):
        maker("sim_objects_for_test")


@pytest.mark.parametrize(
    ("out", "what"),
    [(["spec"], "gave list for object 2"), ({"metadata": "x"}, "metadata that is not a dict"), ({"spec": {1, 2}}, "not JSON for object 2")],
)
def test_a_generator_s_bad_output_is_one_clear_line(out: Any, what: str) -> None:
    objects = Objects(None, _valid, random.Random(0), maker(lambda rng, index: out), "pkg:make")
    with pytest.raises(ConfigError, match=what) as caught:
        _new(objects, 2)
    assert str(caught.value).startswith("--objects-from pkg:make ") and "\n" not in str(caught.value)
