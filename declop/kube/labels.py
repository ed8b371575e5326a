"""Label selectors: parse kubectl's selector syntax once, match dicts of labels many times.

Supports ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a`` and ``!a``,
comma-separated (all must hold). A parsed :class:`Selector` is immutable and callable on a
labels mapping. Its ``str()`` is the canonical form sent to the apiserver.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

__all__ = ["Selector", "parse_selector"]

_TERM = re.compile(
    r"""\s*(?:
        (?P<not>!)\s*(?P<nkey>[\w./-]+) |
        (?P<skey>[\w./-]+)\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\) |
        (?P<key>[\w./-]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[\w.-]*))?
    )\s*(?:,|$)""",
    re.VERBOSE,
)


@dataclass(frozen=True, slots=True)
class _Requirement:
    key: str
    op: str  # "in", "notin", "exists", "!exists"
    values: frozenset[str]

    def __call__(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "in":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values

    def __str__(self) -> str:
        if self.op == "exists":
            return self.key
        if self.op == "!exists":
            return f"!{self.key}"
        vals = ",".join(sorted(self.values))
        if len(self.values) == 1:
            return f"{self.key}={vals}" if self.op == "in" else f"{self.key}!={vals}"
        return f"{self.key} {self.op} ({vals})"


@dataclass(frozen=True, slots=True)
class Selector:
    """A conjunction of requirements; the empty selector matches everything."""

    requirements: tuple[_Requirement, ...]

    def __call__(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r(labels) for r in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)

    def __bool__(self) -> bool:
        return bool(self.requirements)


def parse_selector(text: str | Mapping[str, str] | Selector | None) -> Selector:
    """Parse ``"app=web,tier!=db"`` (or a ``{key: value}`` dict) into a :class:`Selector`."""
    if isinstance(text, Selector):
        return text
    if text is None:
        return Selector(())
    if isinstance(text, Mapping):
        return Selector(tuple(_Requirement(k, "in", frozenset([v])) for k, v in sorted(text.items())))
    reqs: list[_Requirement] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TERM.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"invalid label selector {text!r} near {text[pos:]!r}")
        pos = m.end()
        if m["nkey"]:
            reqs.append(_Requirement(m["nkey"], "!exists", frozenset()))
        elif m["skey"]:
            values = frozenset(v.strip() for v in m["values"].split(",") if v.strip())
            reqs.append(_Requirement(m["skey"], m["setop"], values))
        elif m["op"]:
            op = "notin" if m["op"] == "!=" else "in"
            reqs.append(_Requirement(m["key"], op, frozenset([m["value"]])))
        else:
            reqs.append(_Requirement(m["key"], "exists", frozenset()))
    return Selector(tuple(reqs))
