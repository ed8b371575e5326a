"""Predicates: event filters applied per source, before any key reaches the queue.

A predicate is any callable ``(old, new) -> bool``: ``old`` is ``None`` for an addition and ``new``
is ``None`` for a deletion. Returning False drops the event. As in controller-runtime, the
``*_changed`` built-ins filter *updates* only: additions and deletions always pass, and so does
an update that replaced the object (another uid: deleted and created again while unwatched).

Every built-in is a small immutable object with a readable ``repr``; combine them with
:func:`all_of`, :func:`any_of` and :func:`not_`.

Predicates see the cache's objects without a copy. The built-ins only read them; when a source
has any other predicate (a user function), every predicate of that source gets read-only views
(:func:`declop.cache.store.readonly`), so a predicate cannot change the cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from declop.kube.labels import parse_selector

__all__ = [
    "Predicate",
    "all_of",
    "annotations_changed",
    "any_of",
    "generation_changed",
    "label_selector",
    "labels_changed",
    "namespace_in",
    "not_",
    "resource_version_changed",
]

Predicate = Callable[[Any, Any], bool]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


@dataclass(frozen=True, slots=True)
class _Changed:
    """Passes additions, deletions, and updates where ``metadata[field]`` differs — or where the
    uid differs: an "update" whose object was deleted and created again under its name (what a
    relist after a missed watch window reports) is a new object, even at the same generation 1."""

    field: str
    name: str

    def __call__(self, old: Any, new: Any) -> bool:
        if old is None or new is None:
            return True
        was, now = _meta(old), _meta(new)
        return was.get(self.field) != now.get(self.field) or was.get("uid") != now.get("uid")

    def __repr__(self) -> str:
        return f"declop.predicates.{self.name}"


#: updates that change ``metadata.generation`` (spec changes; not status-only writes)
generation_changed: Predicate = _Changed("generation", "generation_changed")
#: updates that change labels
labels_changed: Predicate = _Changed("labels", "labels_changed")
#: updates that change annotations
annotations_changed: Predicate = _Changed("annotations", "annotations_changed")
#: updates that change ``resourceVersion`` (drops resync-style no-op updates)
resource_version_changed: Predicate = _Changed("resourceVersion", "resource_version_changed")


@dataclass(frozen=True, slots=True)
class _LabelSelector:
    selector: str

    def __call__(self, old: Any, new: Any) -> bool:
        obj = new if new is not None else old
        return parse_selector(self.selector)(_meta(obj).get("labels"))

    def __repr__(self) -> str:
        return f"label_selector({self.selector!r})"


def label_selector(selector: str | Mapping[str, str]) -> Predicate:
    """Objects whose labels match ``selector`` (``"app=web,tier in (a,b)"``)."""
    parse_selector(selector)  # fail early on a bad selector
    return _LabelSelector(str(parse_selector(selector)))


@dataclass(frozen=True, slots=True)
class _NamespaceIn:
    namespaces: frozenset[str]

    def __call__(self, old: Any, new: Any) -> bool:
        obj = new if new is not None else old
        return (_meta(obj).get("namespace") or "") in self.namespaces

    def __repr__(self) -> str:
        return f"namespace_in({', '.join(map(repr, sorted(self.namespaces)))})"


def namespace_in(*namespaces: str) -> Predicate:
    """Objects in one of ``namespaces``."""
    return _NamespaceIn(frozenset(namespaces))


@dataclass(frozen=True, slots=True)
class _AllOf:
    predicates: tuple[Predicate, ...]

    def __call__(self, old: Any, new: Any) -> bool:
        return all(p(old, new) for p in self.predicates)

    def __repr__(self) -> str:
        return f"all_of({', '.join(map(repr, self.predicates))})"


@dataclass(frozen=True, slots=True)
class _AnyOf:
    predicates: tuple[Predicate, ...]

    def __call__(self, old: Any, new: Any) -> bool:
        return any(p(old, new) for p in self.predicates)

    def __repr__(self) -> str:
        return f"any_of({', '.join(map(repr, self.predicates))})"


@dataclass(frozen=True, slots=True)
class _Not:
    predicate: Predicate

    def __call__(self, old: Any, new: Any) -> bool:
        return not self.predicate(old, new)

    def __repr__(self) -> str:
        return f"not_({self.predicate!r})"


def all_of(*predicates: Predicate) -> Predicate:
    """Passes when every predicate passes (``all_of()`` passes everything)."""
    return _AllOf(tuple(predicates))


def any_of(*predicates: Predicate) -> Predicate:
    """Passes when at least one predicate passes."""
    return _AnyOf(tuple(predicates))


def not_(predicate: Predicate) -> Predicate:
    """Passes when ``predicate`` does not."""
    return _Not(predicate)


_BUILTIN = (_Changed, _LabelSelector, _NamespaceIn)


def is_builtin(predicate: Predicate) -> bool:
    """True for this module's predicates and combinations of only them: they read objects without
    changing them, so they may be given the cache's own objects (framework-internal)."""
    if isinstance(predicate, (_AllOf, _AnyOf)):
        return all(is_builtin(p) for p in predicate.predicates)
    if isinstance(predicate, _Not):
        return is_builtin(predicate.predicate)
    return isinstance(predicate, _BUILTIN)
