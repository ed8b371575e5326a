"""Outcome: how a reconcile ends — the one place where outcomes become queue operations.

Owns the outcome table (:func:`settle`), the end of each call (:func:`complete`: counts, the
overrun warning, metrics, the recent-reconciles log, ``queue.done()``), the release of our
finalizer after a successful ``DELETING`` call (:func:`finish`) and the terminal error for a
handler's return value that is no outcome (:func:`invalid_outcome`).

The outcome table (:func:`settle`; the first row that matches):

==========================================  ========================================================
the call…                                   the queue… (the ``result`` label)
==========================================  ========================================================
had a write refused (``Fenced``)            ``forget``: not retried here, no backoff — the Lease's
                                            new owner reconciles the key; one WARNING naming the
                                            Lease and the refused request (``fenced``); also when
                                            the handler caught ``Fenced`` and returned
failed its typed model (``InvalidObject``)  ``forget``: not retried, the handler was not called; one
                                            WARNING per resourceVersion naming the fields, and a
                                            Warning Event ``InvalidObject`` on the object
                                            (``terminal_error``)
raised ``TerminalError``                    ``forget``: not retried; logged with traceback
                                            (``terminal_error``)
returned neither ``None`` nor a ``Result``  the same, with an ``InvalidResult`` naming the type
raised ``Conflict``                         ``add_rate_limited``; logged at info (``error``)
raised any other exception                  ``add_rate_limited``; logged with traceback (``error``)
returned ``Result(requeue_after=s)``, s>0   ``forget``, then ``add_after(s)`` (``requeue_after``)
returned ``None`` or ``Result()``           ``forget``: done until the next event (``success``)
==========================================  ========================================================

Invariants:
- :func:`settle` is the only place where outcomes become queue operations; every delayed add it
  makes is noted (``retry`` with the error's type, or ``requeue_after``), for the trigger of the
  run it causes;
- every call that is settled ends with exactly one ``queue.done()`` (:func:`complete`);
- our finalizer is released only after a ``DELETING`` call succeeded (no error, a valid outcome),
  never for a stale copy; a failed release is the call's error (retried with backoff), and the
  object being deleted is remembered (while cached) so a stale copy of it is not reconciled again;
- a call with a fenced write (:mod:`declop.kube.fencing`) is settled as fenced — one WARNING,
  no retry, no finalizer release — even when the handler caught the exception and returned;
- an invalid outcome is named by its type and the key, never by its contents (it may be a Secret);
- an object that fails the handler's typed model (``obj: Widget``) is skipped until a new
  resourceVersion: no retry, no backoff. The next event (a fix) validates it again. An object
  being deleted (``DELETING``, our finalizer on it) that fails validation keeps our finalizer —
  cleanup code never runs on data it cannot read — and the WARNING says so and how to unblock
  it: fix the object, or remove the finalizer by hand (``kubectl patch``). Deletion is held, loudly,
  never silently.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from declop.errors import Conflict, Fenced, InvalidObject, InvalidResult, TerminalError
from declop.hints import returned_dict
from declop.kube.fencing import enter, leave
from declop.kube.keys import Request
from declop.logs import ReconcileLogger
from declop.reconcile._call import Call, ControllerState
from declop.reconcile._filters import ident, own_write
from declop.reconcile.finalizers import release_finalizer
from declop.reconcile.result import Phase, Result, describe

__all__ = ["complete", "finish", "invalid_outcome", "settle", "was_fenced"]


def settle(
    c: ControllerState,
    key: Request,
    outcome: Any,
    error: BaseException | None,
    logger: ReconcileLogger,
    seconds: float,
) -> str:
    """The outcome table of design §2 — the one place outcomes become queue operations.
    Returns the result (the ``result`` label of the reconcile metrics)."""
    queue = c.queue
    if error is None:
        error = invalid_outcome(c.name, key, outcome)
    if isinstance(error, Fenced):
        logger.warning("Write fenced; the call ended and the key is left to the Lease's new owner", error=str(error))
        queue.forget(key)
        result = "fenced"
    elif isinstance(error, InvalidObject):
        if error.report:
            logger.warning(
                "Object fails its model; skipped until it changes",
                resourceVersion=error.resource_version,
                errors="; ".join(error.problems),
            )
        queue.forget(key)
        result = "terminal_error"  # not retried; controller-runtime's result labels have no other
    elif isinstance(error, TerminalError):
        logger.error("Reconciler error (terminal, not retried)", exc_info=error)
        queue.forget(key)
        result = "terminal_error"
    elif isinstance(error, Conflict):
        logger.info("Conflict, requeueing", error=str(error))
        queue.add_rate_limited(key)
        c._delayed[key] = ("retry", "Conflict")
        result = "error"
    elif error is not None:
        logger.error("Reconciler error", exc_info=error)
        queue.add_rate_limited(key)
        c._delayed[key] = ("retry", type(error).__name__)
        result = "error"
    elif isinstance(outcome, Result) and outcome.requeue_after:
        # only a positive delay requeues: 0 is plain success, as in controller-runtime
        queue.forget(key)
        queue.add_after(key, outcome.requeue_after)
        c._delayed[key] = ("requeue_after", None)
        result = "requeue_after"
    else:
        queue.forget(key)
        result = "success"
    c.metrics.reconciled(c.name, result, seconds)
    return result


def invalid_outcome(controller: str, key: Request, outcome: Any) -> InvalidResult | None:
    """The terminal error for a handler that returned neither ``None`` nor a ``Result``, naming
    the type and the key — never the object itself: ``return client.patch(...)`` returns a Secret."""
    if outcome is None or isinstance(outcome, Result):
        return None
    what = f"handler {controller!r} returned {describe(outcome)} for {key}"
    kopf = returned_dict(outcome)
    if kopf is not None:  # Kopf's habit: a returned dict lands in the status
        return InvalidResult(f"{what}; {kopf} (or declop.Result(requeue_after=seconds))")
    return InvalidResult(
        f"{what}; return None or "
        "declop.Result(requeue_after=seconds) — e.g. call client.patch(...) and then return None"
    )


def was_fenced(call: Call) -> bool:
    """A write of ``call`` was refused by its fence: that is its error, whatever the handler
    raised or returned (it may have caught :class:`~declop.errors.Fenced`)."""
    fence = call.fence
    if fence is None or fence.tripped is None:
        return False
    call.error = fence.tripped
    return True


def complete(c: ControllerState, call: Call) -> None:
    """Settle the outcome and mark the key done."""
    if call.fence is not None:
        was_fenced(call)
    if c._uids is not None and call.obj is None:
        c._uids.pop(call.key, None)  # gone: its next event (a new object) brings a new uid
    error = call.error
    bad = error if error is not None and isinstance(error, InvalidObject) else None
    if bad is None and c._invalid:
        c._invalid.pop(call.key, None)  # valid again, or gone
    if call.called:
        c.reconciles += 1
        if c._created:
            c._created.discard(call.key)
        timeout = c.registration.timeout
        if timeout is not None and call.ran > timeout:  # a plain handler (a thread cannot be killed)
            c.metrics.timed_out(c.name, "overrun")
            call.logger.warning(
                "Reconcile overran its timeout (a plain handler cannot be cancelled)",
                seconds=round(call.ran, 3),
                timeout=timeout,
            )
    seconds = time.monotonic() - call.started
    result = settle(c, call.key, call.outcome, call.error, call.logger, seconds)
    if bad is not None and bad.report:
        _report(c, call, bad)
    c.metrics.triggered(c.name, call.trace)
    if c.recent is not None:
        c.recent.append(
            {
                "key": str(call.key),
                "reconcileID": call.reconcile_id,
                "trigger": str(call.trigger),
                "events": call.trace.events,
                "finished": time.time(),
                "seconds": round(seconds, 6),
                "outcome": result,
                **({"error": type(call.error).__name__} if call.error is not None else {}),
            }
        )
    call.held = False
    c.queue.done(call.key)


#: Event tasks in flight (a task needs a reference until it ends)
_EVENTS: set[asyncio.Task[None]] = set()


def _report(c: ControllerState, call: Call, error: InvalidObject) -> None:
    """The Warning Event of an object that fails the typed model, and, for one being deleted,
    the way out (our finalizer stays until it validates)."""
    if call.phase is Phase.DELETING and c.registration.finalizer is not None:
        ns = f" -n {call.key.namespace}" if call.key.namespace else ""
        call.logger.warning(
            "Deletion waits: our finalizer stays until the object validates (cleanup never runs on an object "
            "it cannot read); fix the object, or remove the finalizer by hand",
            finalizer=c.registration.finalizer,
            command=f"kubectl edit {c.resource.group_resource} {call.key.name}{ns}",
        )
    recorder = c.ctx.recorder
    if recorder is None or call.obj is None:
        return
    message = "; ".join(error.problems)
    task = asyncio.get_running_loop().create_task(
        recorder.record(call.obj, "InvalidObject", message, "Warning", controller=c.name)
    )
    _EVENTS.add(task)
    task.add_done_callback(_EVENTS.discard)


async def finish(c: ControllerState, call: Call) -> None:
    """After the handler: release the finalizer after a successful DELETING call, then
    :func:`complete`."""
    if (
        not was_fenced(call)
        and call.phase is Phase.DELETING
        and call.error is None
        and not call.stale
        and c.registration.finalizer is not None
        and (call.outcome is None or isinstance(call.outcome, Result))
    ):
        try:  # cleanup succeeded: only now may the object go
            await _release(c, call)
        except Exception as exc:  # noqa: BLE001
            call.error = exc
    complete(c, call)


async def _release(c: ControllerState, call: Call) -> None:
    """Remove our finalizer after a successful DELETING call. Works from the newest cached
    copy of the same object (the handler may have written it meanwhile, and the entries'
    indices must be current). If another controller changed the list first (a failed
    ``test``), :class:`~declop.errors.Conflict` retries the key with backoff."""
    finalizer = c.registration.finalizer
    assert finalizer is not None and call.obj is not None
    uid = (call.obj.get("metadata") or {}).get("uid")
    latest = c._lookup(call.key)
    base = latest if latest is not None and (latest.get("metadata") or {}).get("uid") == uid else call.obj
    token = enter(call.fence)  # the release is a write of this call
    try:
        await own_write(c, call.key, base, lambda: release_finalizer(c.ctx.transport, c.resource, base, finalizer))
    finally:
        leave(token)
    if uid and c._lookup(call.key) is not None:  # (its deletion event pops it)
        c._released[ident(call.obj)] = uid
