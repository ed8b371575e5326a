"""Filters: which events of the primary resource carry news.

Owns the questions the controller's subscriber asks of an update before the predicates
(:func:`finalizer_work`; our own finalizer echoes are
:meth:`~declop.reconcile._keys.FinalizerWrites.is_echo`'s) and before choosing its priority
(:func:`only_churn`), :func:`only_our_finalizer`, the shape of our echo, and
:func:`in_filter`, the question a ``labels=``/``fields=`` controller asks of the changes an
unfiltered cache of its resource sees (:meth:`~declop.reconcile.controller.Controller.unfiltered_subscriber`).

Invariants:
- the finalizer protocol does not depend on predicates: our finalizer taken off a live object
  (it is added back before a delete can skip the cleanup) and the start of the deletion of an
  object that carries it always enqueue the key;
- an update that changed only ``resourceVersion``/``managedFields`` (and ``status``, for the
  primary) is churn: nothing a handler of the object acts on changed;
- the filters only read the objects they are given (the cache's own: they are never copied).
"""

from __future__ import annotations

from typing import Any, Callable

from declop.kube.fields import parse_fields
from declop.kube.labels import parse_selector

__all__ = ["finalizer_work", "ident", "in_filter", "only_churn", "only_our_finalizer"]


def in_filter(labels: str, fields: str) -> Callable[[Any], bool]:
    """Whether an object is selected by a ``labels=``/``fields=`` filter, as the apiserver
    selects it for the filtered informer (fields: :mod:`declop.kube.fields`)."""
    by_labels, by_fields = parse_selector(labels), parse_fields(fields)

    def selected(obj: Any) -> bool:
        if by_labels and not by_labels((obj.get("metadata") or {}).get("labels")):
            return False
        return not by_fields or by_fields(obj)

    return selected


def ident(obj: Any) -> tuple[str | None, str]:
    """``(namespace, name)`` of ``obj``: the key of the echo filter's maps."""
    meta = obj.get("metadata") or {}
    return meta.get("namespace"), meta.get("name") or ""


def finalizer_work(old: Any, new: Any, finalizer: str) -> bool:
    """The finalizer protocol must act: the deletion of an object carrying our finalizer began,
    or our finalizer was taken off an object that is not being deleted."""
    om, nm = old.get("metadata") or {}, new.get("metadata") or {}
    if nm.get("deletionTimestamp"):
        return not om.get("deletionTimestamp") and finalizer in (nm.get("finalizers") or ())
    return finalizer in (om.get("finalizers") or ()) and finalizer not in (nm.get("finalizers") or ())


_CHURN = frozenset({"resourceVersion", "managedFields"})


def only_churn(old: Any, new: Any, status: bool) -> bool:
    """``new`` differs from ``old`` at most in ``metadata.resourceVersion``/``managedFields``
    (and in ``status``, when ``status``): nothing a handler of the object acts on changed.
    Metadata first: labels and annotations are small and the likeliest to differ."""
    om, nm = old.get("metadata") or {}, new.get("metadata") or {}
    if om.get("annotations") != nm.get("annotations") or om.get("labels") != nm.get("labels"):
        return False  # the common real change of a ConfigMap-like object, found in two lookups
    for k, v in nm.items():
        if k not in _CHURN and om.get(k, _MISSING) != v:
            return False
    for k in om:
        if k not in nm and k not in _CHURN:
            return False
    for k, v in new.items():
        if k == "metadata" or (status and k == "status"):
            continue
        if old.get(k, _MISSING) != v:
            return False
    for k in old:
        if k not in new and k != "metadata" and not (status and k == "status"):
            return False
    return True


_MISSING = object()


def only_our_finalizer(old: Any, new: Any, finalizer: str) -> bool:
    """True when ``new`` differs from ``old`` only by our finalizer being added or removed."""
    om, nm = old.get("metadata") or {}, new.get("metadata") or {}
    of, nf = list(om.get("finalizers") or ()), list(nm.get("finalizers") or ())
    if of == nf:
        return False
    if [f for f in of if f != finalizer] != [f for f in nf if f != finalizer]:
        return False
    if nm.get("deletionTimestamp") != om.get("deletionTimestamp"):
        return False
    ignore = {"resourceVersion", "finalizers", "managedFields"}
    if {k: v for k, v in om.items() if k not in ignore} != {k: v for k, v in nm.items() if k not in ignore}:
        return False
    return all(old.get(k) == new.get(k) for k in set(old) | set(new) if k != "metadata")
