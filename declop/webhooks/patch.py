"""Patch: the RFC 6902 JSON Patch that turns one JSON document into another.

:func:`diff` is what a mutating webhook answers with: the operations from the object the
apiserver sent to the object the mutator left.

Invariants:
- ``apply(a, diff(a, b)) == b`` for any JSON values ``a`` and ``b`` (dicts, lists, strings,
  numbers, booleans, ``None``); ``diff(a, a) == []``;
- only ``add``, ``remove`` and ``replace`` are emitted; paths are JSON Pointers (RFC 6901:
  ``~`` → ``~0``, ``/`` → ``~1``), so ``metadata.annotations["example.com/x"]`` is
  ``/metadata/annotations/example.com~1x``;
- objects are compared key by key; a list of the same length element by element, a list whose
  length changed is replaced whole (simple and always correct; lists in Kubernetes objects are
  short);
- ``1`` and ``1.0`` are equal, ``True`` and ``1`` are not (JSON's types, not Python's);
- :func:`diff` recurses one frame per level of the shallower document (values are copied with
  :func:`~declop.cache.store.clone`, one frame per level), so objects of
  :data:`declop.webhooks.decode.MAX_DEPTH` levels fit Python's default recursion limit.
"""

from __future__ import annotations

import copy
from typing import Any

from declop.cache.store import clone

__all__ = ["apply", "diff", "pointer"]


def pointer(parts: list[str | int]) -> str:
    """The JSON Pointer of a path: ``["metadata", "a/b"]`` → ``/metadata/a~1b``."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):  # loops, not all(...): one frame per level, so deep objects fit
        if a.keys() != b.keys():
            return False
        for k in a:
            if not _same(a[k], b[k]):
                return False
        return True
    if isinstance(a, list):
        if len(a) != len(b):
            return False
        for x, y in zip(a, b):
            if not _same(x, y):
                return False
        return True
    return bool(a == b)


def diff(old: Any, new: Any) -> list[dict[str, Any]]:
    """The operations that turn ``old`` into ``new`` (``[]`` when they are equal)."""
    ops: list[dict[str, Any]] = []
    _diff(old, new, [], ops)
    return ops


def _diff(old: Any, new: Any, path: list[str | int], ops: list[dict[str, Any]]) -> None:
    if _same(old, new):
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old:
            if key not in new:
                ops.append({"op": "remove", "path": pointer([*path, key])})
        for key, value in new.items():
            if key in old:
                _diff(old[key], value, [*path, key], ops)
            else:
                ops.append({"op": "add", "path": pointer([*path, key]), "value": clone(value)})
        return
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (x, y) in enumerate(zip(old, new)):
            _diff(x, y, [*path, i], ops)
        return
    ops.append({"op": "replace", "path": pointer(path), "value": clone(new)})


def apply(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """Apply ``add``/``remove``/``replace`` operations to a copy of ``doc`` (for tests and checks)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        path = op["path"]
        if path == "":
            if op["op"] == "remove":
                raise ValueError("cannot remove the whole document")
            doc = copy.deepcopy(op["value"])
            continue
        parts = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last: Any = parts[-1]
        if isinstance(parent, list):
            last = len(parent) if last == "-" else int(last)
        if op["op"] == "remove":
            del parent[last]
        elif op["op"] == "replace":
            parent[last] = copy.deepcopy(op["value"])
        elif op["op"] == "add":
            if isinstance(parent, list):
                parent.insert(last, copy.deepcopy(op["value"]))
            else:
                parent[last] = copy.deepcopy(op["value"])
        else:
            raise ValueError(f"unsupported operation {op['op']!r}")
    return doc
