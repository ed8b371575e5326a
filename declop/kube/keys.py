"""Request: the key a reconciler is called with.

A key says *which* object, never *what happened*. It is a frozen, hashable pair — a named
tuple, so that hashing and comparing it (the queue does both several times per reconcile) run
in C rather than in a generated Python ``__hash__``/``__eq__``; ``str()`` gives ``"namespace/name"`` (or ``"name"`` for cluster-scoped objects) and
:meth:`Request.parse` reads that form back.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

__all__ = ["Request", "key_of"]


class Request(NamedTuple):
    """The namespace/name of one object. ``namespace`` is ``""`` for cluster-scoped objects."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @classmethod
    def parse(cls, text: str) -> Request:
        """``"ns/name"`` → ``Request("ns", "name")``; ``"name"`` → ``Request("", "name")``."""
        namespace, sep, name = text.partition("/")
        if not sep:
            if not namespace:
                raise ValueError("not a key: ''; expected 'namespace/name' or 'name'")
            return cls("", namespace)
        if not name or "/" in name:
            raise ValueError(f"not a key: {text!r}; expected 'namespace/name' or 'name'")
        return cls(namespace, name)


def key_of(obj: Mapping[str, Any]) -> Request:
    """The Request for an object dict (reads only ``metadata.namespace`` and ``metadata.name``)."""
    meta = obj["metadata"]
    return Request(meta.get("namespace") or "", meta["name"])
