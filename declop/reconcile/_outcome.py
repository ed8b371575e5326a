"""Outcome: how a reconcile ends — the outcome table as data, and the end of each call.

The outcome table is :class:`Verdict` (the ``result`` label of the reconcile metrics) and
:data:`QUEUE` (each verdict's queue operations): :func:`classify` is the pure first-match
classification of what a call returned or raised, :func:`apply` the one step that turns a
verdict into queue operations, :func:`settle` both with the log line each row asks for. The
table users read is docs/contract.md §3 (a test checks it against :class:`Verdict`).

Also owns the end of each call (:func:`complete`: counts, the overrun warning, metrics, the
recent-reconciles log, ``queue.done()``), the release of our finalizer after a successful
``DELETING`` call (:func:`finish`) and the terminal error for a handler's return value that is no
outcome (:func:`invalid_outcome`).

Invariants:
- an outcome becomes queue operations only in :func:`apply` — through :func:`settle`, or
  :func:`retry` for the keys of a batch a framework error interrupted. A worker's other queue
  operations are not outcomes: ``done()`` of every key it took, ``give_back()`` of a stalled
  batch's keys (:mod:`declop.reconcile._run`), and ``done()`` of keys dropped at a fence or at
  shutdown;
- every delayed add :func:`apply` makes is noted (``retry`` with the error's type, or
  ``requeue_after``), for the trigger of the run it causes;
- every call that is settled ends with exactly one ``queue.done()`` (:func:`complete`);
- our finalizer is released only after a ``DELETING`` call succeeded (no error, a valid outcome),
  never for a stale copy; a failed release is the call's error (retried with backoff), and the
  object being deleted is remembered (while cached) so a stale copy of it is not reconciled again;
- a call with a fenced write (:mod:`declop.kube.fencing`) is settled as fenced — one WARNING,
  no retry, no finalizer release — even when the handler caught the exception and returned;
- an invalid outcome is named by its type and the key, never by its contents (it may be a Secret);
- an object that fails the handler's typed model is skipped until a new resourceVersion: no
  retry, no backoff. One being deleted keeps our finalizer — cleanup code never runs on data it
  cannot read — and the WARNING says how to unblock it (fix the object, or remove the finalizer
  by hand). Deletion is held, loudly, never silently.
"""

from __future__ import annotations

import asyncio
import enum
import time
from typing import Any, Iterable

from declop.errors import Conflict, Fenced, InvalidObject, InvalidResult, NotFound, TemporaryError, TerminalError
from declop.hints import returned_dict
from declop.kube.fencing import enter, leave
from declop.kube.keys import Request
from declop.logs import ReconcileLogger
from declop.queue.workqueue import WorkQueue
from declop.reconcile._call import Call, ControllerState
from declop.reconcile._filters import in_filter
from declop.reconcile._keys import KeyNotes
from declop.reconcile._preparation import own_write
from declop.reconcile.finalizers import release_finalizer
from declop.reconcile.result import Phase, Result, describe

__all__ = [
    "QUEUE", "Verdict", "apply", "classify", "complete", "finish", "invalid_outcome", "retry", "settle", "was_fenced",
]


class Verdict(enum.Enum):
    """How a reconcile ended. The values are the ``result`` label of the reconcile metrics."""

    SUCCESS = "success"  # returned None or Result() (requeue_after 0 or None)
    ERROR = "error"  # raised: retried with per-key backoff (a Conflict quietly)
    REQUEUE_AFTER = "requeue_after"  # returned Result(requeue_after=s), s > 0: again after s seconds
    TEMPORARY_ERROR = "temporary_error"  # TemporaryError(delay=s): again after s seconds, no backoff counted
    TERMINAL_ERROR = "terminal_error"  # TerminalError, an invalid outcome, an object failing its model
    FENCED = "fenced"  # a write was refused by its Lease: left to the Lease's new owner


#: the queue operations of each verdict, in order (what :func:`apply` does)
QUEUE: dict[Verdict, tuple[str, ...]] = {
    Verdict.SUCCESS: ("forget",),
    Verdict.ERROR: ("add_rate_limited",),
    Verdict.REQUEUE_AFTER: ("forget", "add_after"),
    Verdict.TEMPORARY_ERROR: ("add_after",),
    Verdict.TERMINAL_ERROR: ("forget",),
    Verdict.FENCED: ("forget",),
}

_SUCCESS = (Verdict.SUCCESS, 0.0)
_ERROR = (Verdict.ERROR, 0.0)
_TERMINAL = (Verdict.TERMINAL_ERROR, 0.0)
_FENCED = (Verdict.FENCED, 0.0)
_SUCCESS_LABEL = Verdict.SUCCESS.value


def classify(outcome: Any, error: BaseException | None) -> tuple[Verdict, float]:
    """The outcome table, first matching row: the verdict of a call that returned ``outcome`` or
    raised ``error`` (an invalid outcome already made an error: :func:`invalid_outcome`), and its
    delay — ``requeue_after``'s or the temporary error's seconds; 0 otherwise (a retry's is the
    rate limiter's)."""
    if error is not None:
        if isinstance(error, Fenced):
            return _FENCED
        if isinstance(error, TemporaryError):
            return Verdict.TEMPORARY_ERROR, error.delay
        if isinstance(error, (InvalidObject, TerminalError)):
            return _TERMINAL  # not retried; controller-runtime's result labels have no other
        return _ERROR
    if isinstance(outcome, Result) and outcome.requeue_after:
        # only a positive delay requeues: 0 is plain success, as in controller-runtime
        return Verdict.REQUEUE_AFTER, outcome.requeue_after
    return _SUCCESS


def apply(
    queue: WorkQueue[Request], notes: KeyNotes, key: Request, verdict: Verdict, delay: float, error: BaseException | None
) -> None:
    """Turn ``verdict`` into :data:`QUEUE`'s operations on ``key``, noting the cause of each
    delayed add for the run it causes."""
    if verdict is Verdict.ERROR:
        queue.add_rate_limited(key)
        notes.delay(key, "retry", "Conflict" if isinstance(error, Conflict) else type(error).__name__)
        return
    if verdict is Verdict.TEMPORARY_ERROR:  # the backoff's count stays: a later plain error goes on from it
        queue.add_after(key, delay)
        notes.delay(key, "retry", type(error).__name__)
        return
    queue.forget(key)
    if verdict is Verdict.REQUEUE_AFTER:
        queue.add_after(key, delay)
        notes.delay(key, "requeue_after", None)


def report(logger: ReconcileLogger, verdict: Verdict, error: BaseException | None) -> None:
    """The log line of each row of the table (none for a success)."""
    if verdict is Verdict.SUCCESS or verdict is Verdict.REQUEUE_AFTER:
        return
    if verdict is Verdict.FENCED:
        logger.warning("Write fenced; the call ended and the key is left to the Lease's new owner", error=str(error))
    elif verdict is Verdict.TEMPORARY_ERROR:
        assert isinstance(error, TemporaryError)
        logger.warning("Temporary error, retrying after its delay", error=str(error), delay=error.delay)
    elif isinstance(error, InvalidObject):
        if error.report:
            logger.warning(
                "Object fails its model; skipped until it changes",
                resourceVersion=error.resource_version,
                errors="; ".join(error.problems),
            )
    elif verdict is Verdict.TERMINAL_ERROR:
        logger.error("Reconciler error (terminal, not retried)", exc_info=error)
    elif isinstance(error, Conflict):
        logger.info("Conflict, requeueing", error=str(error))
    else:
        logger.error("Reconciler error", exc_info=error)


def settle(
    c: ControllerState,
    key: Request,
    outcome: Any,
    error: BaseException | None,
    logger: ReconcileLogger,
    seconds: float,
) -> str:
    """Classify the outcome, log it, apply it to the queue and count it. Returns the result (the
    ``result`` label of the reconcile metrics)."""
    if error is None:
        if outcome is None:  # the table's common row, without its steps: nothing to log, forget
            c.queue.forget(key)
            c.metrics.reconciled(c.name, _SUCCESS_LABEL, seconds)
            return _SUCCESS_LABEL
        error = invalid_outcome(c.name, key, outcome)
    verdict, delay = classify(outcome, error)
    report(logger, verdict, error)
    apply(c.queue, c.keys, key, verdict, delay, error)
    result: str = verdict.value
    c.metrics.reconciled(c.name, result, seconds)
    return result


def retry(c: ControllerState, keys: Iterable[Request], error: BaseException) -> None:
    """A framework error interrupted the batch of ``keys``: each is retried with backoff."""
    for key in keys:
        apply(c.queue, c.keys, key, Verdict.ERROR, 0.0, error)


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
    error = call.error
    bad = error if error is not None and isinstance(error, InvalidObject) else None
    if bad is None and c.keys.invalid:
        c.keys.valid(call.key)  # valid again, or gone
    if call.called:
        c.reconciles += 1
        if call.phase is Phase.CREATED and error is not None and bad is None and not isinstance(error, Fenced):
            c.echoes.given_back(call.key)  # CREATED until a call succeeds (contract.md §4)
        elif c.echoes.added:
            c.echoes.ran(call.key)
        if c.registration.wants_first_seen:
            if call.obj is None:
                c.keys.seen.discard(call.key)
            elif error is None:
                c.keys.seen.add(call.key)  # first_seen: False from now on, in this process
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
    book = c.gate.book
    if book is not None and call.obj is None and result == _SUCCESS_LABEL and call.key not in c.keys.traces:
        book.gone(call.key)  # not before, nor while a newer cause waits: the uid places its range
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
    elif c.echoes.left:
        if call.obj is not None:
            if c.primary.get(call.key) is not None:  # back in the filter (or a namesake): ours again
                c.echoes.left.pop(call.key, None)
            # else it left while this call ran: its DELETED event queued the key again
        elif call.error is None and not was_fenced(call) and (call.outcome is None or isinstance(call.outcome, Result)):
            try:  # the DELETED call of an object that left the filter succeeded
                await _release_left(c, call)
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
    latest = c.primary.get(call.key)
    base = latest if latest is not None and (latest.get("metadata") or {}).get("uid") == uid else call.obj
    token = enter(call.fence)  # the release is a write of this call
    try:
        await own_write(c, call.key, base, lambda: release_finalizer(c.ctx.transport, c.resource, base, finalizer))
    finally:
        leave(token)
    if uid and c.primary.get(call.key) is not None:  # (its deletion event pops it)
        c.echoes.release(call.obj, uid)


async def _release_left(c: ControllerState, call: Call) -> None:
    """Remove our finalizer from an object that left the ``labels=``/``fields=`` filter with it
    (``c.echoes.left``), now that its ``DELETED`` call succeeded: no controller of that finalizer
    would see the object again, so a later delete would wait for ever. Reads the object as an
    unfiltered cache has it, or, with none, from the apiserver (once per object that left). A
    copy still in the filter (a lagging cache, or the object came back) keeps the entry: the
    cache catching up, or the filtered informer, wakes the key again. A failed release is the
    call's error (retried with backoff)."""
    uid = c.echoes.left.get(call.key)
    finalizer = c.registration.finalizer
    if uid is None or finalizer is None:
        return
    key, resource = call.key, c.resource
    current: Any = None
    informers = c.ctx.informers.existing(resource)
    if informers:
        for informer in informers:
            if not informer.namespace or informer.namespace == key.namespace:
                current = informer.store.get(key)
                if current is not None:
                    break
    else:
        try:
            current = await c.ctx.transport.request("GET", resource.path(namespace=key.namespace or None, name=key.name))
        except NotFound:
            current = None
    meta = (current or {}).get("metadata") or {}
    if current is None or (uid and meta.get("uid") != uid) or finalizer not in (meta.get("finalizers") or ()):
        c.echoes.left.pop(key, None)  # gone, a namesake, or released already
        return
    reg = c.registration
    if in_filter(reg.labels or "", reg.fields or "")(current):
        return  # still (or again) in the filter as far as this copy knows
    token = enter(call.fence)  # the release is a write of this call
    try:
        await release_finalizer(c.ctx.transport, resource, current, finalizer)
    finally:
        leave(token)
    c.echoes.left.pop(key, None)
    call.logger.info("Released our finalizer from an object that left the filter", finalizer=finalizer)
