"""Filters: which events of the primary resource carry news — and our own finalizer writes,
which must not.

Owns the questions the controller's subscriber asks of an update before the predicates
(:func:`is_our_echo`, :func:`finalizer_work`) and before choosing its priority
(:func:`only_churn`), and :func:`own_write`, which runs each finalizer patch of ours and notes the
resourceVersion it produced, so that the echo filter knows it.

Invariants:
- the echo filter drops an event only when its resourceVersion is one our own finalizer patch
  produced *and* it differs from the previous state by our finalizer alone (an event that arrives
  while the patch is in flight is held until the answer tells whose it was: those that were not
  ours are enqueued then);
- the finalizer protocol does not depend on predicates: our finalizer taken off a live object
  (it is added back before a delete can skip the cleanup) and the start of the deletion of an
  object that carries it always enqueue the key;
- an update that changed only ``resourceVersion``/``managedFields`` (and ``status``, for the
  primary) is churn: nothing a handler of the object acts on changed;
- the filters only read the objects they are given (the cache's own: they are never copied).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from declop.kube.keys import Request
from declop.reconcile._call import ControllerState

__all__ = ["finalizer_work", "ident", "is_our_echo", "only_churn", "only_our_finalizer", "own_write"]


def ident(obj: Any) -> tuple[str | None, str]:
    """``(namespace, name)`` of ``obj``: the key of the echo filter's maps."""
    meta = obj.get("metadata") or {}
    return meta.get("namespace"), meta.get("name") or ""


async def own_write(c: ControllerState, key: Request, obj: Any, write: Callable[[], Awaitable[Any]]) -> Any:
    """Run one finalizer patch of ours on ``obj`` and note what it produced, so that the echo
    filter drops its event and nothing else. Events that looked like it and arrived while it
    was in flight were held: those that were not ours are enqueued now."""
    key_of = ident(obj)
    c._writing[key_of] = []
    written: Any = None
    try:
        written = await write()
        return written
    finally:
        held = c._writing.pop(key_of, [])
        meta = written.get("metadata") if isinstance(written, dict) and written is not obj else None
        rv = meta.get("resourceVersion") if meta else None
        if rv and rv not in held and c._lookup(key) is not None:
            c._own_writes[key_of] = rv  # its event is still to come
        if any(r != rv for r in held):
            c.queue.add(key)  # someone else's change: it must be reconciled
            c._trace(key).note("updated", next(r for r in held if r != rv))


def is_our_echo(
    own_writes: dict[tuple[str | None, str], str],
    writing: dict[tuple[str | None, str], list[str]],
    old: Any,
    new: Any,
    finalizer: str,
) -> bool:
    """``new`` is the object one of our finalizer patches produced and nothing else changed — or
    it may be (a patch of that object is in flight and only our finalizer changed): then its
    resourceVersion is held for :func:`own_write` to decide, and True is returned."""
    key_of = ident(new)
    rv: str | None = (new.get("metadata") or {}).get("resourceVersion")
    held = writing.get(key_of) if writing else None
    if held is not None:
        if not only_our_finalizer(old, new, finalizer):
            return False
        held.append(rv or "")
        return True
    if own_writes.get(key_of) != rv or rv is None:
        return False
    del own_writes[key_of]
    return only_our_finalizer(old, new, finalizer)


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
