"""Field selectors evaluated on a cached object: ``metadata.name=a,status.phase!=Running``.

The apiserver evaluates a field selector (``fieldSelector``) against the fields each resource
declares; for every field it serves, that is the object's value at the same dotted path, as a
string. declop evaluates one client-side for a single purpose: to tell whether an object seen by
an unfiltered cache matched a controller's ``fields=`` filter
(:func:`declop.reconcile._filters.left_filter`).

Invariants:
- ``=``, ``==`` and ``!=`` terms joined by commas, all of which must hold (the apiserver's
  syntax); ``\\,``, ``\\=`` and ``\\\\`` escape those characters in a value;
- a missing field, or one that is not a scalar, is the empty string; ``true``/``false`` for
  booleans and decimal digits for numbers, as the apiserver prints them;
- a :class:`FieldSelector` is immutable; the empty one matches everything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["FieldSelector", "parse_fields"]

# a term's separator: a comma or operator not escaped by a backslash
_COMMA = re.compile(r"(?<!\\),")
_TERM = re.compile(r"^\s*(?P<path>[A-Za-z0-9_.\-]+)\s*(?P<op>==|!=|=)(?P<value>.*)$")
_UNESCAPE = re.compile(r"\\([\\,=])")


def _text(value: Any) -> str:
    if value is None or isinstance(value, (dict, list)):
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True, slots=True)
class FieldSelector:
    """A conjunction of ``(path, equal, value)`` terms: ``equal`` False is ``!=``."""

    terms: tuple[tuple[tuple[str, ...], bool, str], ...]

    def __call__(self, obj: Mapping[str, Any]) -> bool:
        for path, equal, value in self.terms:
            node: Any = obj
            for part in path:
                node = node.get(part) if isinstance(node, Mapping) else None
            if (_text(node) == value) != equal:
                return False
        return True

    def __bool__(self) -> bool:
        return bool(self.terms)


def parse_fields(text: str | None) -> FieldSelector:
    """Parse ``"metadata.name=a,status.phase!=Running"``; ValueError names a malformed term."""
    terms = []
    for term in _COMMA.split(text or ""):
        if not term.strip():
            continue
        m = _TERM.match(term)
        if m is None:
            raise ValueError(f"invalid field selector {text!r}: {term!r} is not field=value or field!=value")
        value = _UNESCAPE.sub(r"\1", m["value"].strip())
        terms.append((tuple(m["path"].split(".")), m["op"] != "!=", value))
    return FieldSelector(tuple(terms))
