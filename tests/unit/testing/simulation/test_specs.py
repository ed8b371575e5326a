"""Specs drawn from a CRD's schema (declop.testing.simulation.specs): varied valid ones, and broken ones."""

from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import BaseModel, Field

import declop
from declop.registry import Registry
from declop.testing.simulation.specs import broken, varied
from declop.testing.simulation.workload import spec_schema, valid
from declop.typed.crd import definitions


class Inner(BaseModel):
    on: bool
    note: str | None = Field(None, max_length=5)


class Port(BaseModel):
    name: str = Field(min_length=1, max_length=8)
    port: int = Field(ge=1, le=65535)


class Spec(BaseModel):
    message: str = Field(min_length=3, max_length=20)
    replicas: int = Field(1, ge=0, le=5)
    ratio: float = Field(0.5, gt=0, lt=1)
    mode: Literal["fast", "slow", "off"] = "fast"
    tags: list[str] = Field(default_factory=list, max_length=3)
    ports: list[Port] = Field(default_factory=list, min_length=1, max_length=4)
    inner: Inner
    extra: dict[str, int] = Field(default_factory=dict)
    when: str | None = Field(None, json_schema_extra={"format": "date-time"})


class Thing(declop.CustomResource, group="example.com", version="v1", kind="Thing", plural="things"):
    spec: Spec


def _setup() -> tuple[Any, Any, str]:
    registry = Registry()

    @registry.reconciler(Thing)
    def thing(obj: Thing) -> None:
        return None

    (resource,) = {r.resource for r in registry.registrations}
    schema = spec_schema(definitions([Thing]), resource)
    assert schema is not None
    return registry.registrations, schema, resource


def _obj(spec: Any) -> dict[str, Any]:
    return {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "w", "namespace": "n"}, "spec": spec}


def test_varied_specs_pass_the_model_and_vary_every_field_within_its_bounds() -> None:
    regs, schema, resource = _setup()
    rng = random.Random(1)
    specs = [varied(schema, rng) for _ in range(300)]
    assert all(valid(regs, resource, _obj(s)) for s in specs)
    assert len({repr(s) for s in specs}) == 300
    assert {s.get("mode") for s in specs} == {None, "fast", "slow", "off"}  # optional: sometimes absent
    assert {s["replicas"] for s in specs if "replicas" in s} == set(range(6))
    assert {len(s["ports"]) for s in specs if "ports" in s} == {1, 2, 3, 4}
    assert all(3 <= len(s["message"]) <= 20 for s in specs)
    assert any("note" in s["inner"] for s in specs) and any(s.get("extra") for s in specs)


def test_the_same_seed_draws_the_same_specs() -> None:
    _regs, schema, _resource = _setup()
    one, two = random.Random("x"), random.Random("x")
    assert [varied(schema, one) for _ in range(20)] == [varied(schema, two) for _ in range(20)]


def test_a_broken_spec_fails_the_model_and_changes_one_field() -> None:
    regs, schema, resource = _setup()
    rng = random.Random(2)
    kinds = set()
    for _ in range(300):
        spec = varied(schema, rng)
        bad = broken(schema, spec, rng)
        assert bad is not None and not valid(regs, resource, _obj(bad)), bad
        changed = {k for k in set(spec) | set(bad) if spec.get(k) != bad.get(k)}
        assert len(changed) == 1
        kinds.add(changed.pop())
    assert {"message", "inner"} <= kinds  # a required field's value, a nested required field


def test_a_schema_with_nothing_to_break_gives_none() -> None:
    free = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert broken(free, varied(free, random.Random(0)), random.Random(0)) is None


def test_a_pattern_is_not_drawn_its_default_is_kept() -> None:
    schema = {"type": "object", "required": ["key"], "properties": {"key": {"type": "string", "default": "message", "pattern": "^[a-z]+$"}}}
    assert {varied(schema, random.Random(i))["key"] for i in range(20)} == {"message"}
