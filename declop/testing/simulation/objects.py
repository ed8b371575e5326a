"""The bodies of a handlers file's objects in the world's workload, and the updates made to them.

:class:`Objects` gives each object the workload creates its body, and each update its patch:

- a typed handler's objects (its CRD's ``spec`` schema known) get a varied valid ``spec``
  (:func:`~declop.testing.simulation.specs.varied`), except one in :data:`INVALID` that gets a broken one
  (:func:`~declop.testing.simulation.specs.broken`), since objects that fail their model exist in
  clusters; a drawn spec that fails the model is replaced by the minimal one
  (:func:`~declop.testing.simulation.workload.minimal`) unless it was meant to fail;
- a project's own generator (``declop sim --objects-from module:function``,
  ``simulate(..., objects_from=...)``: a function of ``(random.Random, index)`` returning the
  object's body, or a list of bodies to cycle) gives the body instead: its ``spec`` and any other
  top-level field, its labels and annotations (name and namespace are the workload's);
- an update is of one of three kinds: the spec (another drawn spec, or the generator's next
  body), metadata only (an annotation, or labels that move the object into another
  registration's selector or out of every one), or status only (a write of the status
  subresource, :data:`STATUS_KEY`, kept only when the object still passes its model).

Invariants:
- every draw comes from the :class:`Objects`' own ``random.Random`` (seeded by the world's seed
  and nothing else), never the workload's: the built-in world's schedules and the workload's
  timing of a handlers file are those they were without it;
- an object's body is the generator's or the drawn spec, never both; whether it passes its model
  is for the end's checks to ask (``simworkload.valid``), not assumed here;
- a generator's output that is not a JSON object body is refused with one line
  (:class:`~declop.errors.ConfigError`) naming the generator and the object's index.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import random
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from declop.errors import ConfigError
from declop.testing.simulation.specs import broken, varied
from declop.testing.simulation.workload import Scope, minimal

__all__ = ["INVALID", "STATUS_KEY", "Make", "Objects", "label", "maker", "merge_patch"]

#: one drawn spec in this many is broken on purpose (the object fails its model)
INVALID = 10
#: the status field the workload's status-only updates write
STATUS_KEY = "simWorkload"
#: a project's generator: (the workload's random.Random, the object's index) -> the object's body
Make = Callable[[random.Random, int], Mapping[str, Any]]


def label(given: Any) -> str:
    """How ``--objects-from`` names ``given`` in a repro line."""
    if isinstance(given, str):
        return given
    fn = given if callable(given) else None
    return f"{fn.__module__}:{fn.__qualname__}" if fn is not None else "<templates>"


def maker(given: Any) -> Make | None:
    """``given`` (``module:function``, ``file.py:function``, a callable, or a sequence of object
    bodies) as a generator; None for None.

    Raises:
        ConfigError: the name does not resolve, or names neither a callable nor a list of dicts.
    """
    if given is None:
        return None
    if isinstance(given, str):
        given = _resolve(given)
    if callable(given):
        return given  # type: ignore[no-any-return]
    if isinstance(given, (list, tuple)) and given and all(isinstance(t, Mapping) for t in given):
        templates = tuple(given)
        return lambda rng, index: copy.deepcopy(templates[index % len(templates)])
    raise ConfigError(f"--objects-from: {label(given)} is a {type(given).__name__}; give a function (rng, index) -> the object's body, or a non-empty list of bodies")


def _resolve(spec: str) -> Any:
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ConfigError(f"--objects-from {spec}: write module:function or file.py:function")
    from declop.loader import _import_file, load

    try:
        module = _import_file(where) if where.endswith(".py") and os.path.exists(where) else load(modules=[where])[0]
    except ConfigError as exc:
        raise ConfigError(f"--objects-from {spec}: {exc}") from exc
    except Exception as exc:
        raise ConfigError(f"--objects-from {spec}: importing {where} failed: {type(exc).__name__}: {exc}") from exc
    if not hasattr(module, name):
        raise ConfigError(f"--objects-from {spec}: {where} has no {name!r}")
    return getattr(module, name)


def merge_patch(old: Any, new: Any) -> Any:
    """The JSON merge patch that turns ``old`` into ``new`` (a key of ``old`` that ``new`` lacks
    is set to None; lists are replaced)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return copy.deepcopy(new)
    out: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        if k not in old:
            out[k] = copy.deepcopy(v)
        elif old[k] != v:
            out[k] = merge_patch(old[k], v)
    return out


@dataclass
class Objects:
    """The bodies and updates of one run's workload (see the module docstring)."""

    #: the primary resource's ``spec`` schema (a typed handler's CRD), or None
    schema: Mapping[str, Any] | None
    #: whether an object passes every typed registration's model
    check: Callable[[Mapping[str, Any]], bool]
    rng: random.Random
    make: Make | None = None
    #: the generator as given (for its error messages)
    source: str = ""
    #: the resource has a status subresource
    status: bool = False
    #: objects given a broken spec on purpose, and drawn specs replaced by the minimal one
    broken: int = 0
    fallbacks: int = 0

    def body(self, index: int) -> dict[str, Any]:
        """The generator's body for the ``index``-th object, checked."""
        assert self.make is not None
        try:
            got = self.make(self.rng, index)
        except Exception as exc:
            raise ConfigError(f"--objects-from {self.source} raised {type(exc).__name__} for object {index}: {exc}") from exc
        if not isinstance(got, Mapping) or not isinstance(got.get("metadata", {}), Mapping):
            what = type(got).__name__ if not isinstance(got, Mapping) else "metadata that is not a dict"
            raise ConfigError(f"--objects-from {self.source} gave {what} for object {index}; return the object's body, a dict such as {{'spec': {{...}}}}")
        try:
            json.dumps(got)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"--objects-from {self.source} gave a body that is not JSON for object {index}: {exc}") from exc
        return copy.deepcopy(dict(got))

    def spec(self, obj: Mapping[str, Any]) -> Any:
        """A drawn ``spec`` for ``obj``: varied and valid, or broken (one in :data:`INVALID`)."""
        assert self.schema is not None
        spec = varied(self.schema, self.rng)
        if self.rng.randrange(INVALID) == 0:
            bad = broken(self.schema, spec, self.rng)
            if bad is not None:
                self.broken += 1
                return bad
        if not self.check({**obj, "spec": spec}):
            self.fallbacks += 1
            spec = minimal(self.schema)
        return spec

    def new(self, obj: dict[str, Any], index: int) -> dict[str, Any]:
        """``obj`` (apiVersion, kind, name, namespace, the scope's labels) with its body."""
        if self.make is not None:
            body = self.body(index)
            meta = body.pop("metadata", None) or {}
            obj.update({k: v for k, v in body.items() if k not in ("apiVersion", "kind")})
            for field in ("labels", "annotations"):
                if meta.get(field):
                    obj["metadata"][field] = {**obj["metadata"].get(field, {}), **meta[field]}
            return obj
        obj["spec"] = self.spec(obj) if self.schema is not None else {}
        return obj

    def update(self, stored: Mapping[str, Any], index: int, value: int, scope: Scope) -> tuple[str | None, dict[str, Any]]:
        """One update of ``stored``: the subresource to write (``"status"`` or None) and the
        merge patch."""
        draw = self.rng.random()
        if draw < 0.4 and (self.make is not None or self.schema is not None):
            if self.make is not None:
                body = self.body(index)
                body.pop("metadata", None)
                old = {k: v for k, v in stored.items() if k in body}
                return None, merge_patch(old, {k: v for k, v in body.items() if k not in ("apiVersion", "kind")})
            return None, {"spec": merge_patch(stored.get("spec"), self.spec(stored))}
        if draw >= 0.75 and self.status:
            status = {**(stored.get("status") or {}), STATUS_KEY: value}
            if self.check({**stored, "status": status}):
                return "status", {"status": {STATUS_KEY: value}}
        if scope.filtered and self.rng.random() < 0.5:  # into another registration's selector, or out of all
            labels = dict((stored.get("metadata") or {}).get("labels") or {})
            filters = [f for f in scope.filters if f.labels]
            want = self.rng.choice(filters).labels_for() if filters and self.rng.random() < 0.7 else {}
            return None, {"metadata": {"labels": merge_patch(labels, want)}}
        return None, {"metadata": {"annotations": {"sim.declop.dev/value": str(value)}}}
