"""Hints: the "did you mean" and "coming from Kopf" parts of declop's error messages.

Owns :func:`did_you_mean` (the closest known names to a misspelt one), the Kopf habits declop
recognises — handler keyword arguments (:data:`KOPF_KWARGS`), decorator options
(:data:`KOPF_OPTIONS`), a decorator given the resource in parts (:func:`resource_in_parts`) and
a handler returning a dict (:func:`returned_dict`) — each mapped to what declop does instead.

Invariants:

* Every function returns a fragment for a one-line message (no newline, no trailing full
  stop) or ``None`` when it has nothing useful to say; callers decide the rest of the line.
* A hint never contains a value the user passed at run time (an object, a returned dict): only
  names written in the source code — a parameter, an option, a resource name — are quoted.
* Pure and dependency-free: anything from ``errors`` up to ``cli`` may import it.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Iterable, Mapping, Sequence

__all__ = [
    "KOPF_KWARGS",
    "KOPF_OPTIONS",
    "close_matches",
    "did_you_mean",
    "resource_in_parts",
    "returned_dict",
    "suggestion",
]

_NEAR_BEST = 0.05  # how much less close than the best match another suggestion may be

_WORD = re.compile(r"[a-z][a-z0-9]*")
_VERSION = re.compile(r"v\d+(?:alpha\d+|beta\d+)?")
_GROUP = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")

_OBJ = "declare obj (a copy of the cached object, None once it is gone) and read"
_RETRIES = (
    "declop does not count retries: raise to be retried with per-key backoff, raise "
    "declop.TerminalError to stop, or return declop.Result(requeue_after=seconds); to count attempts, "
    "take a `steps` argument and run the work as steps.run(name, fn, retries=N) (docs/steps.md)"
)
_WEBHOOK = (
    "that is an admission-webhook argument: declop passes it to @declop.validator and "
    "@declop.mutator handlers (docs/webhooks.md), not to reconcilers"
)

#: Kopf's handler keyword arguments that declop does not pass → what to use instead.
#: (``name``, ``namespace`` and ``logger`` are injectable in declop too.)
KOPF_KWARGS: Mapping[str, str] = {
    "body": "declare obj instead: a copy of the cached object (None once it is gone)",
    "spec": f"{_OBJ} obj['spec']",
    "meta": f"{_OBJ} obj['metadata']",
    "metadata": f"{_OBJ} obj['metadata']",
    "status": f"{_OBJ} obj.get('status'); write it with client.patch_status(request, {{'status': {{...}}}})",
    "uid": f"{_OBJ} obj['metadata']['uid']",
    "labels": f"{_OBJ} obj['metadata'].get('labels', {{}})",
    "annotations": f"{_OBJ} obj['metadata'].get('annotations', {{}})",
    "patch": (
        "declop applies no patch after the handler: write changes yourself with "
        "client.patch(request, {...}) or client.patch_status(request, {'status': {...}})"
    ),
    "memo": (
        "declop has no per-object memo: keep state in the object (status, annotations) or in "
        "module-level variables"
    ),
    "reason": "declare phase instead: declop.Phase.CREATED, UPDATED, DELETING or DELETED",
    "event": "declop never passes watch events: declare phase and obj for the present state",
    "type": "declop never passes watch events: declare phase and obj for the present state",
    "retry": _RETRIES,
    "started": _RETRIES,
    "runtime": _RETRIES,
    "stopped": (
        "a reconciler is called again with declop.Result(requeue_after=seconds); long-running work "
        "belongs in an @declop.background task, which declares stop (docs/lifecycle.md)"
    ),
    "param": "register the function once per value, each with its own name= and a closure or functools.partial",
    "resource": "the resource is the one named in @declop.reconciler(...); request says which object",
    "settings": "configure declop with declop run options (declop run --help) or declop.manager.Options",
    "indices": "read an index with client.list(resource, index=(name, value)) (docs/indexes.md)",
    "warnings": _WEBHOOK,
    "userinfo": _WEBHOOK + " (as user_info)",
    "sslpeer": "declop passes no TLS peer to handlers; webhooks are called by the apiserver only",
    "headers": "declop passes no HTTP headers to handlers; webhooks get user_info and request_uid",
    "dryrun": _WEBHOOK + " (as dry_run)",
    "operation": _WEBHOOK,
    "subresource": _WEBHOOK,
}

_FILTER = "filter events with predicates=[...] (declop.predicates, docs/predicates.md)"
_RETRY_OPTION = (
    "declop retries every failure with per-key backoff (pace it with rate_limit=declop.queue.ratelimit.RateLimit(...)); "
    "raise declop.TerminalError to stop"
)
_PARTS = "name the resource in the first argument, e.g. @declop.reconciler('widgets.example.com')"

#: Kopf's decorator options that declop spells differently or does without → what to use.
KOPF_OPTIONS: Mapping[str, str] = {
    "id": "use name= to name the controller, hook or probe",
    "when": _FILTER,
    "value": "use field='spec.x' with new= (a value, or a callable value -> bool; docs/changes.md)",
    "annotations": _FILTER,
    "group": _PARTS,
    "version": _PARTS,
    "plural": _PARTS,
    "kind": _PARTS,
    "retries": _RETRY_OPTION,
    "backoff": _RETRY_OPTION,
    "errors": _RETRY_OPTION,
    "param": "register the function once per value, each with its own name= and a closure or functools.partial",
    "requires_finalizer": "use finalizer='my.domain/name'",
    "optional": "use finalizer='my.domain/name' only when the handler must clean up",
    "initial": "declop always starts from the full current state: every object is reconciled once at start",
    "deleted": "declop calls the handler with phase=DELETED once an object is gone",
}


def close_matches(word: str, candidates: Iterable[str], *, n: int = 3, cutoff: float = 0.6) -> list[str]:
    """The candidates closest to ``word``, best first, compared case-insensitively.

    A candidate must reach ``cutoff`` (:class:`difflib.SequenceMatcher`'s ratio, 0..1) and be
    nearly as close as the best one (within :data:`_NEAR_BEST`): ``widgts.example.com`` gets
    ``widgets.example.com``, not every name ending in ``.example.com``; equally close ones
    (``things.a.example.com``, ``things.b.example.com``) all come, at most ``n``. Candidates
    are returned as given; ties keep their order.
    """
    by_lower: dict[str, str] = {}
    for c in candidates:
        by_lower.setdefault(c.lower(), c)
    matcher = difflib.SequenceMatcher()
    matcher.set_seq2(word.lower())
    scored: list[tuple[float, str]] = []
    for lower, given in by_lower.items():
        matcher.set_seq1(lower)
        if matcher.real_quick_ratio() >= cutoff and matcher.quick_ratio() >= cutoff:
            ratio = matcher.ratio()
            if ratio >= cutoff:
                scored.append((ratio, given))
    if not scored:
        return []
    scored.sort(key=lambda pair: -pair[0])
    best = scored[0][0]
    return [given for ratio, given in scored if ratio >= best - _NEAR_BEST][:n]


def did_you_mean(word: str, candidates: Iterable[str], *, n: int = 3, cutoff: float = 0.6) -> str | None:
    """``"did you mean 'request'?"`` (or ``"'a' or 'b'"``) for the close matches, else ``None``."""
    return suggestion(close_matches(word, candidates, n=n, cutoff=cutoff))


def suggestion(names: Sequence[str]) -> str | None:
    """``"did you mean 'a'?"``, ``"did you mean 'a' or 'b'?"`` … for ``names``; ``None`` if empty."""
    if not names:
        return None
    quoted = [repr(n) for n in names]
    listed = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
    return f"did you mean {listed}?"


def resource_in_parts(parts: tuple[Any, ...]) -> str:
    """The hint for ``@reconciler("example.com", "v1", "widgets")`` — Kopf's (group, version,
    plural) — or any other extra positional argument: declop takes the resource as one string.

    ``parts`` are all the positional arguments. When they read as Kopf's
    ``(group, version, plural)``, ``(group/version, plural)`` or ``(group, plural)`` the hint
    names the one string declop accepts (``plural.version.group`` keeps a pinned version);
    otherwise it says that options are keyword arguments.
    """
    found = _kopf_resource(parts)
    if found is not None:
        name, pinned = found
        also = f" (or {pinned!r} to pin that version)" if pinned else ""
        return f"declop takes the resource as one string: @declop.reconciler({name!r}){also}"
    return (
        "declop takes one positional argument, the resource ('pods', 'widgets.example.com'); "
        "pass options by keyword, e.g. finalizer='my.domain/name'"
    )


def _kopf_resource(parts: tuple[Any, ...]) -> tuple[str, str] | None:
    """``(plural.group, plural.version.group or "")`` for Kopf-style parts, else ``None``."""
    if not all(isinstance(p, str) for p in parts):
        return None
    if len(parts) == 3:
        group, version, plural = parts
    elif len(parts) == 2:
        first, plural = parts
        group, _, version = first.partition("/")
        if "." not in group and not version:
            return None  # ("pods", "web"): more likely an option given by position than a group
    else:
        return None
    if not _WORD.fullmatch(plural) or (version and not _VERSION.fullmatch(version)):
        return None
    if group and not _GROUP.fullmatch(group):
        return None
    name = f"{plural}.{group}" if group else plural
    pinned = ".".join(p for p in (plural, version, group) if p) if version else ""
    return name, pinned


def returned_dict(value: Any) -> str | None:
    """The Kopf hint for a handler that returned a plain dict (Kopf stores it in the status),
    or ``None`` when ``value`` is not such a dict. The dict's contents are never looked at
    beyond telling an API object (``kind`` and ``metadata``) from a plain dict."""
    if not isinstance(value, Mapping):
        return None
    if isinstance(value.get("kind"), str) and isinstance(value.get("metadata"), Mapping):
        return None  # an API object, say what client.patch() returned: not Kopf's habit
    return (
        "a returned dict is stored in the status only with return_to='status.<field>' (or return_to=True, "
        "as Kopf does); else write it with client.patch_status(request, {'status': {...}}) and return None"
    )
