"""Preparation: everything a key's reconcile needs before its handler can be called.

On the loop, for each key a worker took (past the fence): :func:`prepare` takes the key's trace
(why it runs), builds its logger, reads the object from the cache, deduces the
:class:`~declop.reconcile.result.Phase` from its state, drops a stale copy, decides whether our
finalizer must be added first, and builds the handler's arguments (its client included). When the
finalizer must be added, the worker awaits :func:`add_finalizer`, which patches it in and then
builds the arguments from the patched object.

Invariants:
- a reconcile reads only the cache: it makes no GET or LIST against the apiserver (our finalizer
  patch is its one write);
- the worker takes a key's :class:`~declop.reconcile.trigger.Trace` with the key, so each reconcile
  knows every cause since its key's previous run; a delayed requeue or retry is noted in the run
  it causes (its delayed add is due), not in one that an event brought forward;
- our finalizer is persisted before the handler can see ``CREATED`` (and cause side effects); a
  ``CREATED`` call given back after we added it is still ``CREATED`` when it runs, whether the
  cache shows our finalizer yet or not — unless the object is being deleted, or gone;
- after our finalizer was released from an object being deleted, a cached copy of that object
  (same uid) still showing it is stale — the apiserver never lets a finalizer be added to an
  object being deleted — so the handler is not called again for it;
- an error while preparing is settled like a handler's error (``call.finished``, never called);
- a typed handler's object is validated before our finalizer is added (an object that fails
  validation never gets it) and again when its view is built; a failure is the call's
  :class:`~declop.errors.InvalidObject`, marked ``report`` only the first time for its
  resourceVersion (:meth:`~declop.reconcile._keys.KeyNotes.first_report`), and the handler is
  not called;
- per key: one :class:`~declop.reconcile._call.Call`, one logger, one client, one write fence
  under a Lease (:meth:`~declop.reconcile._fence.Gate.write_fence`; our finalizer patch is
  checked against it too), and no await unless our finalizer is added;
- each finalizer patch of ours goes through :func:`own_write`, which tells
  :class:`~declop.reconcile._keys.FinalizerWrites` what it produced (so the echo filter drops its
  event and nothing else) and enqueues the key when an event held meanwhile was someone else's.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Awaitable, Callable

from declop.errors import InvalidObject
from declop.kube.fencing import enter, leave
from declop.kube.keys import Request
from declop.logs import ReconcileLogger, trigger_in_context
from declop.reconcile._call import Call, ControllerState
from declop.reconcile._fence import FENCED
from declop.reconcile.client import AsyncClient, Client
from declop.reconcile.finalizers import ensure_finalizer
from declop.reconcile.result import Phase, phase_of

__all__ = ["add_finalizer", "invalid", "own_write", "prepare", "prepare_all"]


async def prepare_all(c: ControllerState, keys: list[Request], ranges: dict[Request, int], calls: list[Call]) -> None:
    """Prepare ``keys`` (a worker's, past :meth:`~declop.reconcile._fence.Gate.owned`) into
    ``calls``, in order, our finalizer added where a call needs it. Before each key's
    preparation (and its finalizer write) the gate is asked: a closed leader fence stops the rest
    (their keys end with done()). Shutdown and a range refused meanwhile stop a call just before
    it starts, not here."""
    gate = c.gate
    log_trigger = trigger_in_context()
    freeze = log_trigger or c.registration.wants_trigger or c.recent is not None
    for key in keys:
        if gate.may_start(ranges[key] if ranges else -1, True) == FENCED:
            gate.closed(len(keys) - len(calls))
            break
        call = prepare(c, key, ranges, freeze, log_trigger)
        if call.add_finalizer:  # CREATED: our finalizer first
            await add_finalizer(c, call)
        calls.append(call)


def prepare(
    c: ControllerState, key: Request, ranges: dict[Request, int], freeze: bool, log_trigger: bool
) -> Call:
    """The call of ``key``: ready to run, or ``finished`` (an error, or a stale copy: nothing to
    call), or with ``add_finalizer`` set — then :func:`add_finalizer` must run before it can.
    ``ranges`` holds the key's range in sharded mode; ``freeze``: someone reads its trigger
    (``log_trigger``: the log context does)."""
    call = Call(key, time.monotonic(), str(uuid.uuid4()))
    call.trace = trace = c.keys.take(key, c.queue)
    context = {"controller": c.name, "namespace": key.namespace, "name": key.name, "reconcileID": call.reconcile_id}
    gate = c.gate
    shards = gate.shards
    if shards is not None:
        call.shard = ranges[key]
        context["shard"] = f"{call.shard}/{shards.n}"
    if shards is not None or gate.leader is not None:
        call.fence = gate.write_fence(key, call.shard)
    if freeze:
        call.trigger = trace.freeze()
        if log_trigger:
            context["trigger"] = str(call.trigger)
    call.logger = ReconcileLogger(c.log, context)
    if log_trigger and c.log.isEnabledFor(logging.DEBUG):
        call.logger.debug("Reconciling")
    try:
        reg = c.registration
        finalizer = reg.finalizer
        obj = c.primary.get(key)
        call.phase = phase = phase_of(obj, finalizer)
        echoes = c.echoes
        if phase is Phase.DELETING and echoes.stale(obj, finalizer):
            call.stale = call.finished = True  # its cleanup already succeeded: the cache lags
            return call
        if echoes.added and echoes.created(key, phase is Phase.UPDATED or phase is Phase.CREATED):
            # a CREATED call was given back after we added the finalizer: it is still
            # CREATED (whether the cache shows our finalizer yet or not) until it runs
            call.phase = Phase.CREATED
        elif phase is Phase.CREATED and finalizer is not None:
            if reg.model is not None:
                reg.view(obj)  # validated before the finalizer: an invalid object never gets it
            call.add_finalizer = True  # persisted before the handler can cause side effects
            call.obj = obj  # the cached copy to patch (add_finalizer)
            return call
        call.obj = obj
        call.kwargs = arguments(c, call, obj)
    except InvalidObject as exc:
        invalid(c, key, exc)
        call.obj = obj
        call.error = exc
        call.finished = True
    except Exception as exc:  # noqa: BLE001 - settled like a handler error
        call.error = exc
        call.finished = True
    return call


def invalid(c: ControllerState, key: Request, exc: InvalidObject) -> None:
    """Mark ``exc`` to be reported only if its resourceVersion was not reported for ``key``."""
    exc.report = c.keys.first_report(key, exc.resource_version)


async def add_finalizer(c: ControllerState, call: Call) -> None:
    """Add our finalizer to ``call.obj`` (the cached copy) and prepare the call on the patched
    object. If the patch fails, the call holds no object and is settled with the error."""
    obj, call.obj = call.obj, None
    reg, key = c.registration, call.key
    try:
        finalizer = reg.finalizer
        assert finalizer is not None
        token = enter(call.fence)  # our finalizer patch is a write of this call
        try:
            obj = await own_write(c, key, obj, lambda: ensure_finalizer(c.ctx.transport, c.resource, obj, finalizer))
        finally:
            leave(token)
        call.obj = obj  # the patched object; then the arguments, as in prepare()
        call.kwargs = arguments(c, call, obj)
    except InvalidObject as exc:  # changed between the finalizer patch and the view
        invalid(c, key, exc)
        call.error = exc
        call.finished = True
    except Exception as exc:  # noqa: BLE001 - settled like a handler error
        call.error = exc
        call.finished = True


def arguments(c: ControllerState, call: Call, obj: Any) -> dict[str, Any]:
    """The handler's keyword arguments for ``call`` on ``obj``, with a client bound to its key
    that knows ``obj`` (the cached dict, never changed in place) as what the handler read: the
    base of its typed status writes."""
    reg, key = c.registration, call.key
    client = (AsyncClient if reg.is_async else Client)(c.ctx, c.resource, key, c.name, c.primary.stores, obj)
    first_seen = reg.wants_first_seen and key not in c.keys.seen
    return reg.arguments(key, obj, call.phase, client, call.logger, call.reconcile_id, call.trigger, first_seen)


async def own_write(c: ControllerState, key: Request, obj: Any, write: Callable[[], Awaitable[Any]]) -> Any:
    """Run one finalizer patch of ours on ``obj`` and note what it produced, so that the echo
    filter drops its event and nothing else. Events that looked like it and arrived while it
    was in flight were held: those that were not ours are enqueued now."""
    echoes = c.echoes
    echoes.begin(obj)
    written: Any = None
    try:
        written = await write()
        return written
    finally:
        theirs = echoes.end(obj, written, c.primary.get(key) is not None)
        if theirs is not None:
            c.queue.add(key)  # someone else's change: it must be reconciled
            c.keys.trace(key).note("updated", theirs)
