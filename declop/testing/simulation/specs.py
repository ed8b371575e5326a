"""Specs drawn from a CRD's schema: varied valid values for the workload's typed objects, and
broken ones, since objects that fail their model exist in clusters.

The schema is the OpenAPI subset declop writes for a model (:mod:`declop.typed.schema`: ``type``,
``format``, ``nullable``, ``default``, ``enum``, ``minimum``/``maximum`` (``exclusive*``),
``multipleOf``, ``minLength``/``maxLength``, ``pattern``, ``minItems``/``maxItems``,
``minProperties``/``maxProperties``, ``required``, ``properties``, ``additionalProperties``,
``items`` and the ``x-kubernetes-*`` markers). :func:`varied` draws a value from a
``random.Random``: optional properties present half the time, any enum value, numbers within
their bounds, strings within their length limits, arrays within their item counts (list-map and
set lists without duplicates), maps of a few keys, nested objects, to :data:`DEPTH` levels.
:func:`broken` draws one change that makes a valid value fail: a required property left out, a
number past its bound, a string past its length, an array past its item count, an enum value
not in the enum, or a value of the wrong type.

A node with a ``pattern``, a CEL rule (``x-kubernetes-validations``) or an embedded resource is
not drawn (the library reads no regular expression nor CEL): it gets its default, else
:func:`~declop.testing.simulation.workload.minimal`'s value. The workload checks each drawn spec against
the model itself and falls back to the minimal spec when a drawn one fails it.

Invariants:
- a drawn value is a pure function of the schema and the generator's state: the same seed gives
  the same specs;
- :func:`varied` keeps to the schema's bounds (what the apiserver would admit), never draws
  ``null`` (an optional property is left out instead, so a merge patch can carry any spec);
- :func:`broken` changes exactly one node of a :func:`varied` value, and returns ``None`` when
  the schema has nothing to break.
"""

from __future__ import annotations

import copy
import random
import string
from typing import Any, Mapping

from declop.testing.simulation.workload import minimal

__all__ = ["DEPTH", "broken", "varied"]

#: nesting below this depth gets the minimal value
DEPTH = 6
#: how far past a bound of one side only a number is drawn
SPREAD = 10
_CHARS = string.ascii_lowercase + string.digits
#: a valid sample per string format the apiserver checks
_FORMATS = {
    "date-time": "2026-01-0{}T00:00:00Z", "datetime": "2026-01-0{}T00:00:00Z", "date": "2026-01-0{}",
    "email": "user{}@example.com", "hostname": "host{}.example.com", "ipv4": "10.0.0.{}", "ipv6": "fd00::{}",
    "cidr": "10.{}.0.0/16", "mac": "02:00:00:00:00:0{}", "uri": "https://example.com/{}",
    "uuid": "00000000-0000-4000-8000-00000000000{}", "uuid4": "00000000-0000-4000-8000-00000000000{}",
    "byte": "c2ltCg==", "int32": "{}", "int64": "{}", "password": "secret{}",
}  # fmt: skip
_OPAQUE = ("pattern", "x-kubernetes-validations", "x-kubernetes-embedded-resource")


def varied(schema: Mapping[str, Any], rng: random.Random, depth: int = 0) -> Any:
    """A valid value of ``schema``, drawn from ``rng`` (see the module docstring)."""
    if depth >= DEPTH or any(k in schema for k in _OPAQUE):
        return copy.deepcopy(schema["default"]) if "default" in schema else minimal(schema)
    if schema.get("enum"):
        return copy.deepcopy(rng.choice(schema["enum"]))
    if schema.get("x-kubernetes-int-or-string"):
        return rng.randint(0, SPREAD) if rng.random() < 0.5 else f"{rng.randint(0, 100)}%"
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        return _object(schema, rng, depth)
    if kind == "array":
        return _array(schema, rng, depth)
    if kind == "string":
        return _string(schema, rng)
    if kind in ("integer", "number"):
        return _number(schema, rng, kind == "integer")
    if kind == "boolean":
        return rng.random() < 0.5
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return {} if rng.random() < 0.5 else {"k": f"v{rng.randint(0, 9)}"}
    return minimal(schema)


def _object(schema: Mapping[str, Any], rng: random.Random, depth: int) -> dict[str, Any]:
    props = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    out = {k: varied(sub, rng, depth + 1) for k, sub in props.items() if k in required or rng.random() < 0.5}
    extra = schema.get("additionalProperties")
    if isinstance(extra, Mapping) or extra is True or (not props and schema.get("x-kubernetes-preserve-unknown-fields")):
        low = int(schema.get("minProperties") or 0)
        high = max(low, min(int(schema.get("maxProperties", low + 2)), low + 2))
        values = extra if isinstance(extra, Mapping) else {"type": "string"}
        for i in range(rng.randint(low, high)):
            out.setdefault(f"k{i}", varied(values, rng, depth + 1))
    return out


def _array(schema: Mapping[str, Any], rng: random.Random, depth: int) -> list[Any]:
    low = int(schema.get("minItems") or 0)
    high = max(low, min(int(schema.get("maxItems", low + 3)), low + 3))
    items = [varied(schema.get("items") or {}, rng, depth + 1) for _ in range(rng.randint(low, high))]
    keys = schema.get("x-kubernetes-list-map-keys")
    if schema.get("x-kubernetes-list-type") in ("set", "map"):  # no two items alike (by their keys)
        unique: dict[str, Any] = {}
        for item in items:
            ident = repr([item.get(k) for k in keys]) if keys and isinstance(item, dict) else repr(item)
            unique.setdefault(ident, item)
        items = list(unique.values())
    return items


def _string(schema: Mapping[str, Any], rng: random.Random) -> str:
    sample = _FORMATS.get(schema.get("format") or "")
    if sample is not None:
        return sample.format(rng.randint(1, 9))
    low = int(schema.get("minLength") or 0)
    high = max(low, min(int(schema.get("maxLength", low + 12)), low + 12))
    return "".join(rng.choice(_CHARS) for _ in range(rng.randint(max(low, 1) if high else 0, high)))


def _number(schema: Mapping[str, Any], rng: random.Random, integer: bool) -> int | float:
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is None:
        low = min(0, high) if high is not None else 0
    if high is None:
        high = low + SPREAD
    step = schema.get("multipleOf")
    if integer:
        lo = int(low) + (1 if schema.get("exclusiveMinimum") and int(low) == low else 0)
        hi = int(high) - (1 if schema.get("exclusiveMaximum") and int(high) == high else 0)
        value: int | float = rng.randint(lo, max(lo, hi))
    else:
        value = round(rng.uniform(float(low), float(high)), 2)
        if (schema.get("exclusiveMinimum") and value <= low) or (schema.get("exclusiveMaximum") and value >= high):
            value = (float(low) + float(high)) / 2
    if step:
        value = type(value)((value // step) * step)
        if value < low or (schema.get("exclusiveMinimum") and value <= low):
            value = type(value)(value + step)
    return value


def broken(schema: Mapping[str, Any], valid: Any, rng: random.Random) -> Any | None:
    """``valid`` (a value of ``schema``) with one node changed so that it fails the schema, or
    ``None`` when no node can be (see the module docstring)."""
    spots: list[tuple[tuple[str | int, ...], Any]] = []
    _spots(schema, valid, (), spots, 0)
    if not spots:
        return None
    path, change = rng.choice(spots)
    out = copy.deepcopy(valid)
    if not path:
        return change(out)
    node = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = change(node[path[-1]])
    if node[path[-1]] is _MISSING:
        del node[path[-1]]
    return out


#: a change's result that means "leave the node out"
_MISSING = object()


def _spots(schema: Mapping[str, Any], value: Any, path: tuple[str | int, ...], out: list[Any], depth: int) -> None:
    """The nodes of ``value`` one change can break, with that change."""
    if depth >= DEPTH or any(k in schema for k in _OPAQUE) or schema.get("x-kubernetes-int-or-string"):
        return
    kind = schema.get("type")
    if schema.get("enum"):
        out.append((path, lambda v: f"not-{v}"))
    elif kind in ("integer", "number"):
        if "maximum" in schema:
            out.append((path, lambda v: schema["maximum"] + 1))
        if "minimum" in schema:
            out.append((path, lambda v: schema["minimum"] - 1))
        out.append((path, lambda v: "not-a-number"))
    elif kind == "string":
        if "maxLength" in schema:
            out.append((path, lambda v: "x" * (int(schema["maxLength"]) + 1)))
        if int(schema.get("minLength") or 0) > 0:
            out.append((path, lambda v: ""))
        out.append((path, lambda v: {"not": "a string"}))
    elif kind == "array" and isinstance(value, list):
        if "maxItems" in schema and value:
            out.append((path, lambda v: v + [copy.deepcopy(v[0])] * (int(schema["maxItems"]) + 1 - len(v))))
        if int(schema.get("minItems") or 0) > 0:
            out.append((path, lambda v: []))
        for i, item in enumerate(value):
            _spots(schema.get("items") or {}, item, (*path, i), out, depth + 1)
    elif (kind == "object" or "properties" in schema) and isinstance(value, dict):
        props = schema.get("properties") or {}
        for name in schema.get("required") or ():
            if name in value and "default" not in props.get(name, {}):
                out.append(((*path, name), lambda v: _MISSING))
        for name, sub in props.items():
            if name in value:
                _spots(sub, value[name], (*path, name), out, depth + 1)
