"""Field changes: ``old``, ``new`` and ``diff`` against the state a handler last handled.

A reconciler that declares ``old``, ``new`` or ``diff``, or registers with ``field=``, is run by
:func:`runner`: a wrapper the ordinary controller calls like any reconciler. It compares the
object's *essence* with a **snapshot** kept on the object itself, in the annotation
``last-handled.declop.dev/<controller name>`` (:func:`snapshot_key`), and writes the snapshot
after the handler returned.

The essence is what Kopf's ``last-handled-configuration`` holds: every top-level field but
``apiVersion``, ``kind``, ``metadata`` and ``status``, plus ``metadata.labels`` and
``metadata.annotations`` without declop's own (keys under ``declop.dev``) and
``kubectl.kubernetes.io/last-applied-configuration``; empty stanzas are dropped. With
``field="spec.size"`` the handler's snapshot holds that one field only (``{"spec":{"size":3}}``);
``field=`` may name any field of the object, ``status`` too, but under ``metadata`` only what
the essence has (labels, annotations without declop's own: its snapshot writes are no change).

Invariants (everything is derived from the object and the snapshot on it, never from an event):

- ``old`` is the snapshot (the field's value in it, with ``field=``), ``None`` when there is none:
  first sighting, or the annotation removed or unreadable; ``new`` is the present state, ``None``
  in ``DELETING`` (where the object is heading) and ``DELETED``; ``diff`` is a tuple of
  ``(op, path, old, new)`` from ``old`` to ``new`` (op ``"add"``, ``"change"`` or ``"remove"``;
  paths relative to the field; lists compared whole), as Kopf's;
- with ``field=`` the handler is called only when the field's value differs from the snapshot's
  and the ``old=``/``new=`` filters pass; a change the filters turn down counts as handled;
- the snapshot is written only after the handler returned without raising, by a merge patch
  from the call's client, so it is fenced like every write of the call. A failing call leaves it
  as it was: the retry sees the same ``old`` (at least once, never "handled" without a success);
- a copy in the cache older than our own snapshot write (same uid, the annotation still as it
  was before our write, an older resourceVersion) is read as if it held what we wrote, so a
  stale cache does not call the handler again for a change it already handled (this memory is
  the process's: a new owner after failover or a handover trusts its cache, a stated bound);
- a handler that asks for none of this is not wrapped and pays nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
from typing import Any, Callable, Mapping, NamedTuple

from declop.cache.store import clone
from declop.errors import NotFound, RegistrationError
from declop.reconcile.registration import CHANGE_NAMES, Registration
from declop.reconcile.result import Phase
from declop.typed.dump import as_json

__all__ = ["PREFIX", "Change", "diff", "essence", "runner", "snapshot_key"]

#: the prefix of the snapshot annotations: ``last-handled.declop.dev/<controller name>``
PREFIX = "last-handled.declop.dev/"
#: annotations never part of the essence besides declop's own
_IGNORED = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
#: what the wrapper asks declop for, besides what the user's function declares
_NEEDS = frozenset({"request", "obj", "client", "phase"})

log = logging.getLogger("declop.changes")


class Change(NamedTuple):
    """One item of ``diff``: ``(op, path, old, new)``; op is ``"add"``, ``"change"`` or ``"remove"``."""

    op: str
    path: tuple[str, ...]
    old: Any
    new: Any


def snapshot_key(name: str) -> str:
    """The annotation that holds the snapshot of controller ``name``.

    Raises:
        RegistrationError: ``name`` is not a valid annotation name (63 characters at most,
            alphanumerics, ``-``, ``_``, ``.``, starting and ending alphanumeric).
    """
    if len(name) > 63 or not _NAME.match(name):
        raise RegistrationError(
            f"controller {name!r} keeps a snapshot in the annotation {PREFIX}<name>, and {name!r} is not a valid "
            "annotation name; pass name='...' (letters, digits, '-', '_', '.'; at most 63)"
        )
    return PREFIX + name


def _ours(key: str) -> bool:
    prefix = key.partition("/")[0] if "/" in key else ""
    return prefix == "declop.dev" or prefix.endswith(".declop.dev") or key in _IGNORED


def essence(obj: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The part of ``obj`` whose changes count (see the module's docstring). Shares structure
    with ``obj``: read only."""
    if obj is None:
        return None
    out = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status") and v not in (None, {})}
    meta = obj.get("metadata") or {}
    kept: dict[str, Any] = {}
    if meta.get("labels"):
        kept["labels"] = meta["labels"]
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if not _ours(k)}
    if annotations:
        kept["annotations"] = annotations
    if kept:
        out["metadata"] = kept
    return out


def resolve(state: Any, path: tuple[str, ...]) -> Any:
    """The value at ``path`` in ``state``, None when any step is missing."""
    for part in path:
        if not isinstance(state, dict):
            return None
        state = state.get(part)
    return state


def _nested(value: Any, path: tuple[str, ...]) -> Any:
    """``value`` at ``path`` in an otherwise empty dict (``{}`` when the value is None)."""
    if value is None:
        return {}
    for part in reversed(path):
        value = {part: value}
    return value


def diff(old: Any, new: Any, path: tuple[str, ...] = ()) -> tuple[Change, ...]:
    """The changes from ``old`` to ``new``: dicts are compared key by key (in sorted order),
    anything else (lists too) as a whole; None is absence."""
    return tuple(_diff(old, new, path))


def _diff(a: Any, b: Any, path: tuple[str, ...]) -> Any:
    if a == b:
        return
    if a is None:
        yield Change("add", path, None, b)
    elif b is None:
        yield Change("remove", path, a, None)
    elif isinstance(a, dict) and isinstance(b, dict):
        for key in sorted({*a, *b}, key=str):
            yield from _diff(a.get(key), b.get(key), (*path, key))
    else:
        yield Change("change", path, a, b)


def _passes(value: Any, want: Any) -> bool:
    """An ``old=``/``new=`` filter: ``...`` passes anything, a callable is asked, else equality."""
    if want is ...:
        return True
    if callable(want):
        return bool(want(value))
    return bool(value == want)


def _encode(state: Any) -> str:
    return json.dumps(state, separators=(",", ":"), sort_keys=True)


def _decode(text: str | None) -> Any:
    """The snapshot in an annotation; None when absent or unreadable (never handled)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _older(rv: str, than: str) -> bool:
    """resourceVersion ``rv`` precedes ``than``; taken as True when they are not integers."""
    try:
        return int(rv) < int(than)
    except ValueError:
        return True


class _Written(NamedTuple):
    """Our last snapshot write of one key, until the cache shows it (or moves past it)."""

    uid: str
    before: str | None
    text: str
    rv: str


class _Plan(NamedTuple):
    call: bool
    write: str | None  # the snapshot to write after success (None: nothing to write)
    kwargs: dict[str, Any]
    uid: str = ""  # the object's uid and our annotation as the cache had them (before the handler ran)
    before: str | None = None


class _Changes:
    """The per-registration state: the snapshot key, the options, our writes not yet seen."""

    def __init__(self, reg: Registration, user_wants: frozenset[str] | None) -> None:
        self.key = snapshot_key(reg.name)
        self.resource = reg.resource
        self.field = reg.field
        self.old, self.new = reg.old, reg.new
        self.wants = user_wants
        self.written: dict[Any, _Written] = {}

    def plan(self, kwargs: dict[str, Any]) -> _Plan:
        """Decide, from the object and its snapshot, whether to call and what to write after."""
        request, phase = kwargs["request"], kwargs["phase"]
        obj = kwargs["obj"]
        raw = obj if obj is None or isinstance(obj, dict) else as_json(obj)
        meta = (raw or {}).get("metadata") or {}
        text = (meta.get("annotations") or {}).get(self.key)
        mine = self.written.get(request)
        if mine is not None:
            if raw is not None and meta.get("uid") == mine.uid and text == mine.before and _older(
                str(meta.get("resourceVersion") or ""), mine.rv
            ):
                text = mine.text  # the cache is behind our own write: read what we wrote
                log.debug("%s: the cached copy of %s is behind our snapshot write; reading that", self.key, request)
            else:
                del self.written[request]
        gone = raw is None or phase is Phase.DELETING
        field = self.field
        if field:
            old = resolve(_decode(text), field)
            new = None if gone else self.value(raw)
            if old == new:
                return _Plan(False, None, {})
            call = _passes(old, self.old) and _passes(new, self.new)
            after = None if gone else _nested(new, field)
        else:
            old = _decode(text)
            new = after = None if gone else essence(raw)
            call = True
        write = None if raw is None or (not field and old == after) else _encode(after)
        seen = str(meta.get("uid") or ""), (meta.get("annotations") or {}).get(self.key)
        if not call:
            return _Plan(False, write, {}, *seen)
        own = self._user_kwargs(kwargs)
        wants = self.wants
        new = clone(new)  # shares nothing with obj
        if wants is None or "old" in wants:
            own["old"] = old
        if wants is None or "new" in wants:
            own["new"] = new
        if wants is None or "diff" in wants:
            own["diff"] = diff(old, new)
        return _Plan(True, write, own, *seen)

    def value(self, raw: dict[str, Any]) -> Any:
        """The field's present value: read from the object, but under ``metadata`` from its
        essence (labels and annotations only, without declop's own)."""
        head = self.field[0]
        if head == "metadata":
            return resolve(essence(raw), self.field)
        return None if head in ("apiVersion", "kind") else resolve(raw, self.field)

    def _user_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        wants = self.wants
        if wants is None:
            return dict(kwargs)
        return {k: v for k, v in kwargs.items() if k in wants}

    def noted(self, request: Any, plan: _Plan, written: Mapping[str, Any] | None) -> None:
        """Remember our write of ``plan``'s snapshot until the cache shows it (read from what
        ``plan`` saw: the handler may have changed its ``obj``)."""
        rv = str(((written or {}).get("metadata") or {}).get("resourceVersion") or "")
        self.written[request] = _Written(plan.uid, plan.before, plan.write or "", rv)

    def patch(self, snapshot: str) -> dict[str, Any]:
        return {"metadata": {"annotations": {self.key: snapshot}}}


def runner(reg: Registration) -> Registration:
    """``reg`` as it runs: unchanged when its handler asks for no change (no ``old``, ``new``,
    ``diff`` declared, no ``field=``), else wrapped (see the module's invariants).

    Raises:
        RegistrationError: the controller's name cannot name an annotation.
    """
    wants = reg.wants
    if not reg.field and not (wants and wants & CHANGE_NAMES):
        return reg
    state = _Changes(reg, wants)
    fn = reg.fn
    run_wants = None if wants is None else frozenset((wants - CHANGE_NAMES) | _NEEDS)

    if reg.is_async:

        @functools.wraps(fn)
        async def run_async(**kwargs: Any) -> Any:
            plan = state.plan(kwargs)
            result = await fn(**plan.kwargs) if plan.call else None
            if plan.write is not None:
                try:
                    written = await kwargs["client"].patch(state.resource, kwargs["request"], state.patch(plan.write))
                except NotFound:
                    return result
                state.noted(kwargs["request"], plan, written)
            return result

        wrapped: Callable[..., Any] = run_async
    else:

        @functools.wraps(fn)
        def run(**kwargs: Any) -> Any:
            plan = state.plan(kwargs)
            result = fn(**plan.kwargs) if plan.call else None
            if plan.write is not None:
                try:
                    written = kwargs["client"].patch(state.resource, kwargs["request"], state.patch(plan.write))
                except NotFound:
                    return result
                state.noted(kwargs["request"], plan, written)
            return result

        wrapped = run
    return dataclasses.replace(reg, fn=wrapped, wants=run_wants, records=(state.key,))
