"""What a typed view costs a handler (issue 26 item 1): ``obj: Widget`` instead of the dict.

Per call, for two ~6 KB Widgets — ``many fields`` (metadata, a spec of four typed containers with
ports and env: ~70 nested models, a free-form map, a status) and ``few fields`` (the shape of the
benchmark's 6 KB objects: six 1000-character strings in a typed map) — the median over many runs of:

* ``dict clone``: what an untyped ``obj`` costs (``declop.clone`` of the cached dict);
* ``typed view``: what declop does for a model of plain data (``declop.typed.view.view``:
  ``Widget.model_validate`` of the cached dict, then a copy of only the values pydantic kept by
  reference — ``Any`` fields and extras; shares nothing with the cache);
* ``typed view, JSON path``: what declop does for a model with validators (user code must not see
  the cache's objects): ``pydantic_core.to_json`` of the cached dict, then ``model_validate_json``;
and the levers tried, each with why it is or is not used:
* ``validate the cached dict``: ``model_validate(obj)`` alone — pydantic keeps ``Any`` (free-form)
  values and extras by reference: a handler's change would reach the cache. Unsafe alone; what
  declop does is this plus a copy of exactly those values;
* ``validate a clone``: ``model_validate(clone(obj))`` — safe, slower than the JSON path;
* ``from_json + validate``: parse cached JSON bytes in Rust, then validate Python objects;
* ``validate cached JSON``: ``model_validate_json`` of bytes kept per (uid, resourceVersion) —
  saves the ``to_json`` step at the price of a second copy of every object in memory;
* ``copy a cached view``: keep one validated view per (uid, resourceVersion) and hand out
  ``model_copy(deep=True)`` — deepcopy of a model tree is much slower than validating again;
* ``share a cached view``: hand out the same instance — nearly free, but a handler's change would
  show in the next call's view. Unsafe.

    python bench/typed_view.py [--runs 15] [--number 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit
from typing import Any, Callable

import pydantic_core
from pydantic import BaseModel, Field

from declop.cache.store import clone
from declop.typed.model import CustomResource, FreeForm
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


def median_us(fn: Callable[[], Any], runs: int, number: int) -> float:
    return statistics.median(timeit.repeat(fn, number=number, repeat=runs)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="repeats; the median is printed")
    parser.add_argument("--number", type=int, default=2000, help="calls per repeat")
    args = parser.parse_args()
    for shape, model, obj in (("many fields", Widget, OBJ), ("few fields", Payload, FEW)):
        size = len(json.dumps(obj, separators=(",", ":")))
        cached_json = pydantic_core.to_json(obj)
        cached_view = view(model, obj)
        rows: list[tuple[str, Callable[[], Any], int]] = [
            ("dict clone (untyped obj)", lambda: clone(obj), args.number),
            ("typed view (what declop does)", lambda: view(model, obj), args.number),
            ("typed view, JSON path (models with validators)", lambda: model.model_validate_json(pydantic_core.to_json(obj)), args.number),
            ("lever: validate the cached dict [unsafe]", lambda: model.model_validate(obj), args.number),
            ("lever: validate a clone", lambda: model.model_validate(clone(obj)), args.number),
            ("lever: from_json + validate", lambda: model.model_validate(pydantic_core.from_json(cached_json)), args.number),
            ("lever: validate cached JSON (+6 KB/object)", lambda: model.model_validate_json(cached_json), args.number),
            ("lever: copy a cached view (deep)", lambda: cached_view.model_copy(deep=True), max(1, args.number // 10)),
            ("lever: share a cached view [unsafe]", lambda: cached_view, args.number),
        ]
        print(f"{shape}: {size} bytes of JSON; median of {args.runs} runs")
        for label, fn, number in rows:
            print(f"  {label:50s} {median_us(fn, args.runs, number):8.1f} µs")


if __name__ == "__main__":
    main()
