"""Returns: a handler's return value written to the object's status (``return_to=``), Kopf's habit.

A reconciler registered with ``return_to="status.summary"`` (or ``return_to=True``, which means
``status.<controller name>`` as Kopf does) is run by :func:`runner`: a wrapper the ordinary
controller calls like any reconciler. ``None`` and a :class:`~declop.reconcile.result.Result` mean
what they always mean; any other return value is JSON (a dict, list, string, number, bool) that
the wrapper writes at that path of the status, then the call settles as a success.

Invariants (everything is derived from the object the handler read, never from an event):

- the value is written only when it differs from what the object the handler read holds at that
  path, so a converged object costs no write and a status-only echo does not loop;
- the write is one JSON merge patch of that path alone through the status subresource, from the
  call's client (fenced like every write of the call): other status fields — a handler's own
  ``patch_status``, a condition another controller sets — are never touched. The path itself
  belongs to the return value: a handler that also writes it there is overwritten by its return;
- the write happens after the handler returned without raising: a call that raises writes
  nothing; one whose write fails (a 409 cannot happen to a merge patch; a 5xx or a lost Lease
  can) fails the call like any write of it, and the retry returns and compares again;
- a value that is not JSON is refused before anything is sent, as an
  :class:`~declop.errors.InvalidResult` naming the path (terminal, like any other bad return);
- a registration without ``return_to=`` is not wrapped and pays nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

from declop.cache.store import clone
from declop.errors import InvalidResult, NotFound, RegistrationError
from declop.reconcile.registration import Registration
from declop.reconcile.result import Result, describe
from declop.typed.dump import as_json

__all__ = ["path_of", "runner"]

#: what the wrapper asks declop for, besides what the user's function declares
_NEEDS = frozenset({"request", "obj", "client"})


def path_of(return_to: object, controller: str) -> tuple[str, ...]:
    """``return_to=`` as the path of keys under the object: ``("status", "summary")``; ``()`` for none.

    Raises:
        RegistrationError: not ``None``, ``True`` or a path under ``status``.
    """
    if return_to is None or return_to is False:
        return ()
    if return_to is True:
        return ("status", controller)
    parts = tuple(return_to.split(".")) if isinstance(return_to, str) else ()
    if len(parts) < 2 or parts[0] != "status" or not all(parts):
        raise RegistrationError(
            f"return_to= names where the return value goes in the status, as 'status.summary' (or True for "
            f"status.<controller name>, as Kopf does), got {return_to!r}"
        )
    return parts


def _json(value: Any, where: str) -> Any:
    """``value`` as JSON (typed models dumped), or :class:`InvalidResult` naming ``where``."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
    elif isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: _json(v, where) for k, v in value.items()}
    elif isinstance(value, (list, tuple)):
        return [_json(v, where) for v in value]
    elif hasattr(value, "model_dump"):
        return as_json(value, "whole")
    raise InvalidResult(
        f"the return value goes to {where} (return_to=), so it must be JSON: a dict with string keys, a list, "
        f"a string, a number or a bool; got {describe(value)}"
    )


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    node = as_json(obj, "whole") if obj is not None and not isinstance(obj, dict) else obj
    for part in path:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _patch(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    body: Any = value
    for part in reversed(path):
        body = {part: body}
    return body


def runner(reg: Registration) -> Registration:
    """``reg`` as it runs: unchanged without ``return_to=``, else wrapped (the module's invariants)."""
    path = reg.return_to
    if not path:
        return reg
    fn, resource = reg.fn, reg.resource
    where = ".".join(path)
    wants = reg.wants
    run_wants = None if wants is None else frozenset(wants | _NEEDS)

    def own(kwargs: dict[str, Any]) -> dict[str, Any]:
        return dict(kwargs) if wants is None else {k: v for k, v in kwargs.items() if k in wants}

    def write_of(result: Any, before: Any, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The merge patch a return value needs, or None (nothing to write)."""
        if result is None or isinstance(result, Result) or kwargs["obj"] is None:
            return None
        value = _json(result, where)
        if before == value:
            return None
        return _patch(path, value)

    if reg.is_async:

        @functools.wraps(fn)
        async def run_async(**kwargs: Any) -> Any:
            before = clone(_at(kwargs["obj"], path))  # read before the handler may change its obj
            result = await fn(**own(kwargs))
            patch = write_of(result, before, kwargs)
            if patch is not None:
                try:
                    await kwargs["client"].patch_status(resource, kwargs["request"], patch)
                except NotFound:
                    pass  # gone meanwhile: nothing left to report on
            return result if isinstance(result, Result) else None

        wrapped: Callable[..., Any] = run_async
    else:

        @functools.wraps(fn)
        def run(**kwargs: Any) -> Any:
            before = clone(_at(kwargs["obj"], path))  # read before the handler may change its obj
            result = fn(**own(kwargs))
            patch = write_of(result, before, kwargs)
            if patch is not None:
                try:
                    kwargs["client"].patch_status(resource, kwargs["request"], patch)
                except NotFound:
                    pass
            return result if isinstance(result, Result) else None

        wrapped = run
    return dataclasses.replace(reg, fn=wrapped, wants=run_wants)
