"""What a typed view costs a handler (issues 26 and 44): ``obj: Widget`` instead of the dict, and
what a typed ``patch_status`` costs to diff.

Shapes: ``many fields`` — a ~6 KB Widget of ~70 small nested models (metadata, a spec of four
containers with ports and env, a free-form map, a status); ``few fields`` — ~6 KB in six
1000-character strings in a typed map (the shape of the main benchmark's objects); ``small`` — the
docs' Widget (a spec of two fields, a status of two), ~0.3 KB.

Per call, the median over many runs of:

* ``dict clone``: what an untyped ``obj`` costs (``declop.clone`` of the cached dict);
* ``typed view``: what declop does for a model of plain data (``declop.typed.view.view``: the
  model's validator on the cached dict, then a copy of only the values pydantic kept by reference —
  ``Any`` fields and extras; shares nothing with the cache);
* ``typed view, JSON path``: what declop does for a model with validators (user code must not see
  the cache's objects) and for a strict model holding datetimes, enums, sets or tuples (strict
  Python-mode validation refuses their JSON form): ``pydantic_core.to_json``, then ``validate_json``;
* the floor: ``validate_python`` of the cached dict alone (unsafe: ``Any`` values and extras are the
  cache's own), and — many fields — the same data validated as TypedDicts, i.e. without the ~70
  model instances, which is what the instances themselves cost;
* the levers tried, each with why it is or is not used:
  ``validate a clone`` (safe, slower than the JSON path); ``from_json + validate``; ``validate
  cached JSON`` (bytes kept per resourceVersion: a second copy of every object in memory); ``copy in
  Rust`` (the model's core schema with every ``Any`` and the extras replaced by a JSON-value schema
  that builds new lists and dicts, so nothing is left to copy in Python — it needs pydantic-core's
  reuse of a class's prebuilt validator switched off while it is built, an internal); ``copy a
  cached view`` (``model_copy(deep=True)``); ``share a cached view`` (unsafe);
* ``status_ops``: :func:`declop.typed.status.status_ops` (what ``patch_status`` sends for a model)
  of the view's status against the status read, unchanged (``[]``: one validation of the read
  status and one model comparison) and with one field changed (the walk, then the guarded
  ``add``), plus :func:`~declop.typed.status.encode` of the changed ops; for the object's own status and for a
  ``wide`` status holding the spec's ~60 models again (the cost follows the status's size).

    python bench/typed_view.py [--runs 15] [--number 2000]

It prints the machine's conditions and a Markdown table (bench/FINDINGS.md keeps the figures).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import platform
import statistics
import timeit
from typing import Annotated, Any, Callable

import pydantic
import pydantic_core
from pydantic import BaseModel, Field, TypeAdapter
from pydantic_core import SchemaValidator, core_schema

from declop.cache.store import clone
from declop.typed.model import CustomResource, FreeForm
from declop.typed.status import encode, status_ops
from declop.typed.view import view


class Port(BaseModel):
    name: str
    port: int = Field(ge=1, le=65535)
    protocol: str = "TCP"


class Env(BaseModel):
    name: str
    value: str = ""


class Container(BaseModel):
    name: str
    image: str
    ports: list[Port] = Field(default_factory=list)
    env: list[Env] = Field(default_factory=list)
    args: list[str] = Field(default_factory=list)


class WidgetSpec(BaseModel):
    replicas: int = Field(1, ge=0, le=10)
    containers: list[Container]
    config: FreeForm = Field(default_factory=dict)


class WidgetStatus(BaseModel):
    observedGeneration: int | None = None
    phase: str = ""
    conditions: list[dict[str, Any]] = Field(default_factory=list)


class Widget(CustomResource, group="example.com", version="v1", kind="Widget"):
    spec: WidgetSpec
    status: WidgetStatus | None = None


def container(n: int) -> dict[str, Any]:
    return {
        "name": f"c{n}", "image": "registry.k8s.io/nginx:1.27",
        "ports": [{"name": "http", "port": 80}, {"name": "metrics", "port": 9090}],
        "env": [{"name": f"VAR_{i}", "value": f"value-{i}-" + "x" * 40} for i in range(12)],
        "args": ["--listen=:80", "--metrics=:9090", "--verbose"],
    }


OBJ: dict[str, Any] = {
    "apiVersion": "example.com/v1", "kind": "Widget",
    "metadata": {"name": "w", "namespace": "default", "uid": "6f1c2a9e-0000-4000-8000-000000000001",
                 "resourceVersion": "98765", "generation": 4, "creationTimestamp": "2026-11-30T00:00:00Z",
                 "labels": {"app": "web", "tier": "frontend"}, "annotations": {"example.com/note": "n" * 700},
                 "finalizers": ["example.com/cleanup"]},
    "spec": {"replicas": 3, "containers": [container(i) for i in range(4)],
             "config": {"feature": {"flags": ["a" * 60] * 4, "limits": {"cpu": "500m"}}}},
    "status": {"observedGeneration": 3, "phase": "Ready",
               "conditions": [{"type": "Ready", "status": "True", "reason": "Ok", "message": "m" * 60,
                               "lastTransitionTime": "2026-11-30T00:00:00Z"}]},
}


class PayloadSpec(BaseModel):
    replicas: int = Field(1, ge=0, le=10)
    data: dict[str, str] = Field(default_factory=dict)


class Payload(CustomResource, group="example.com", version="v1", kind="Payload"):
    spec: PayloadSpec
    status: WidgetStatus | None = None


FEW: dict[str, Any] = {
    "apiVersion": "example.com/v1", "kind": "Payload",
    "metadata": {k: v for k, v in OBJ["metadata"].items() if k != "annotations"},
    "spec": {"replicas": 1, "data": {f"k{i}": "0123456789abcdef" * 62 for i in range(6)}},
    "status": OBJ["status"],
}


class Small(CustomResource, group="example.com", version="v1", kind="Small"):
    spec: PayloadSpec
    status: WidgetStatus | None = None


SMALL: dict[str, Any] = {
    "apiVersion": "example.com/v1", "kind": "Small",
    "metadata": {k: v for k, v in OBJ["metadata"].items() if k not in ("annotations", "finalizers")},
    "spec": {"replicas": 2}, "status": {"observedGeneration": 3, "phase": "Ready"},
}


class WideStatus(WidgetStatus):
    containers: list[Container] = Field(default_factory=list)


class Wide(CustomResource, group="example.com", version="v1", kind="Wide"):
    spec: WidgetSpec
    status: WideStatus | None = None


WIDE: dict[str, Any] = {**OBJ, "kind": "Wide", "status": {**OBJ["status"], "containers": OBJ["spec"]["containers"]}}


def as_typed_dicts() -> Callable[[Any], Any]:
    """The many-fields shape validated as TypedDicts: the same checks, no model instances."""
    from typing_extensions import NotRequired, TypedDict

    class PortT(TypedDict):
        name: str
        port: Annotated[int, Field(ge=1, le=65535)]
        protocol: NotRequired[str]

    class EnvT(TypedDict):
        name: str
        value: NotRequired[str]

    class ContainerT(TypedDict):
        name: str
        image: str
        ports: NotRequired[list[PortT]]
        env: NotRequired[list[EnvT]]
        args: NotRequired[list[str]]

    class SpecT(TypedDict):
        replicas: NotRequired[Annotated[int, Field(ge=0, le=10)]]
        containers: list[ContainerT]
        config: NotRequired[dict[str, Any]]

    class MetaT(TypedDict, total=False):
        name: str
        namespace: str | None
        uid: str
        resourceVersion: str
        generation: int | None
        creationTimestamp: str
        labels: dict[str, str]
        annotations: dict[str, str]
        finalizers: list[str]

    class StatusT(TypedDict, total=False):
        observedGeneration: int | None
        phase: str
        conditions: list[dict[str, Any]]

    class WidgetT(TypedDict):
        apiVersion: str
        kind: str
        metadata: MetaT
        spec: SpecT
        status: NotRequired[StatusT | None]

    return TypeAdapter(WidgetT).validate_python


def copy_in_rust(model: type[BaseModel]) -> Callable[[Any], Any]:
    """``model``'s validator with every ``Any`` and every model's extras validated as JSON values
    (new lists and dicts), so the result shares nothing with its input and needs no copy after."""
    ref = "bench-json-value"
    value = core_schema.definition_reference_schema(ref)
    json_value = core_schema.nullable_schema(core_schema.union_schema([
        core_schema.str_schema(strict=True), core_schema.bool_schema(strict=True), core_schema.int_schema(strict=True),
        core_schema.float_schema(strict=True), core_schema.list_schema(value, strict=True),
        core_schema.dict_schema(core_schema.str_schema(strict=True), value, strict=True),
    ]), ref=ref)
    classes: set[type] = set()

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            if node.get("type") == "any":
                return dict(value)
            out = {k: rewrite(v) for k, v in node.items()}
            if out.get("type") == "model":
                classes.add(out["cls"])
                if (out.get("config") or {}).get("extra_fields_behavior") == "allow":
                    out["schema"]["extras_schema"] = dict(value)
            return out
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        return node

    schema = core_schema.definitions_schema(rewrite(model.__pydantic_core_schema__), [json_value])
    for cls in classes:  # else pydantic-core reuses each class's own validator, Any and all
        type.__setattr__(cls, "__pydantic_complete__", False)
    try:
        validator = SchemaValidator(schema)
    finally:
        for cls in classes:
            type.__setattr__(cls, "__pydantic_complete__", True)
    return validator.validate_python


def median_us(fn: Callable[[], Any], runs: int, number: int) -> float:
    return statistics.median(timeit.repeat(fn, number=number, repeat=runs)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="repeats; the median is printed")
    parser.add_argument("--number", type=int, default=2000, help="calls per repeat")
    args = parser.parse_args()
    n = args.number
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.2f} at start; Python {platform.python_version()}, "
          f"pydantic {pydantic.VERSION}, pydantic-core {pydantic_core.__version__}; median of {args.runs} runs")
    shapes = [("many fields", Widget, OBJ), ("few fields", Payload, FEW), ("small", Small, SMALL)]
    cells: dict[str, dict[str, float]] = {}
    for shape, model, obj in shapes:
        cached_json = pydantic_core.to_json(obj)
        cached_view = view(model, obj)
        validator = model.__pydantic_validator__
        rows: list[tuple[str, Callable[[], Any], int]] = [
            ("dict clone (untyped obj)", lambda: clone(obj), n),
            ("**typed view** (what declop does)", lambda: view(model, obj), n),
            ("typed view, JSON path (validators; strict with datetimes, enums, sets)",
             lambda: validator.validate_json(pydantic_core.to_json(obj)), n),
            ("floor: validate_python of the cached dict [unsafe: shares]", lambda: validator.validate_python(obj), n),
            ("lever: copy in Rust (schema rewrite)", functools.partial(copy_in_rust(model), obj), n),
            ("lever: validate a clone", lambda: validator.validate_python(clone(obj)), n),
            ("lever: from_json + validate", lambda: validator.validate_python(pydantic_core.from_json(cached_json)), n),
            ("lever: validate cached JSON (+1 copy/object)", lambda: validator.validate_json(cached_json), n),
            ("lever: copy a cached view (deep)", lambda: cached_view.model_copy(deep=True), max(1, n // 10)),
            ("lever: share a cached view [unsafe]", lambda: cached_view, n),
        ]
        if model is Widget:
            rows.insert(4, ("floor: the same checks as TypedDicts (no model instances)", functools.partial(as_typed_dicts(), obj), n))
        for label, fn, number in rows:
            cells.setdefault(label, {})[shape] = median_us(fn, args.runs, number)
        sizes = cells.setdefault("(JSON bytes)", {})
        sizes[shape] = len(cached_json)
    for shape, model, obj in (("many fields", Widget, OBJ), ("wide status", Wide, WIDE)):
        stored = obj["status"]
        status = view(model, obj).status
        changed = view(model, obj).status
        changed.phase = "Degraded"
        ops = status_ops(changed, stored)
        assert status_ops(status, stored) == [] and len(ops) == 2
        cells.setdefault("status_ops, unchanged", {})[shape] = median_us(lambda: status_ops(status, stored), args.runs, n)
        cells.setdefault("status_ops, one field changed", {})[shape] = median_us(lambda: status_ops(changed, stored), args.runs, n)
        cells.setdefault("encode of those ops", {})[shape] = median_us(lambda: encode(ops), args.runs, n)
        cells.setdefault("(status JSON bytes)", {})[shape] = len(pydantic_core.to_json(stored))
    columns = ["many fields", "few fields", "small", "wide status"]
    print(f"\n| µs per call | {' | '.join(columns)} |")
    print(f"|---|{'---:|' * len(columns)}")
    for label, row in cells.items():
        shown = [("" if c not in row else f"{row[c]:.0f}" if label.startswith("(") else f"{row[c]:.1f}") for c in columns]
        print(f"| {label} | {' | '.join(shown)} |")
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
