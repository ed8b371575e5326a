"""Call: one reconcile of one key — what the handler gets, how it is called, what came of it.

Owns :class:`Call` (a key's reconcile from the moment a worker takes it until it is settled), the
call of an ``async def`` handler (:func:`call_async`; :func:`call_with_timeout` with a timeout),
the hooks a controller reports to (:class:`ControllerMetrics`) and :class:`ControllerState`, the
controller as the steps of a key's life (:mod:`declop.reconcile._fence`,
:mod:`declop.reconcile._preparation`, :mod:`declop.reconcile._run`,
:mod:`declop.reconcile._outcome`) see it. Plain handlers' batches are :mod:`declop.reconcile._run`'s.

Invariants:
- a call is "held" (its worker owes its key exactly one ``queue.done()``) until it is settled or
  given back; :func:`held` names the keys still owed;
- ``call.finished`` is written last (in a batch's thread), once everything else of the call is
  final: the loop may settle a call only when it sees it;
- a handler's own ``TimeoutError`` stays its error; only an expired ``timeout`` becomes
  :class:`~declop.errors.ReconcileTimeout`;
- a handler runs with its call's write fence current (``call.fence``, :mod:`declop.kube.fencing`;
  in the worker's task, or in the executor thread around each call of a batch), and never with
  another call's.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any, Protocol

from declop.errors import ReconcileTimeout
from declop.kube.discovery import ResourceInfo
from declop.kube.fencing import WriteFence, enter, leave
from declop.kube.keys import Request
from declop.logs import ReconcileLogger
from declop.queue.workqueue import QueueMetrics, WorkQueue
from declop.reconcile._fence import Gate
from declop.reconcile._keys import FinalizerWrites, KeyNotes, PrimaryCache
from declop.reconcile.client import ClientContext
from declop.reconcile.registration import Registration
from declop.reconcile.result import Phase
from declop.reconcile.trigger import Trace, Trigger

__all__ = ["Call", "ControllerMetrics", "ControllerState", "call_async", "call_with_timeout", "held"]


class ControllerMetrics:
    """Hooks for reconcile metrics; the base class records nothing (probes.py has the real one)."""

    def queue(self, controller: str) -> QueueMetrics | None:
        return None

    def reconciled(self, controller: str, result: str, seconds: float) -> None:
        pass

    def active(self, controller: str, delta: int) -> None:
        pass

    def started(self, controller: str, max_concurrent: int) -> None:
        pass

    def triggered(self, controller: str, trace: Trace) -> None:
        """One reconcile settled; ``trace`` holds its sources and coalesced event count."""
        pass

    def timed_out(self, controller: str, kind: str) -> None:
        """A handler call passed its timeout: ``kind`` is "cancelled" (async) or "overrun"."""
        pass


class ControllerState(Protocol):
    """What the steps of a key's life read and write on their controller
    (:class:`~declop.reconcile.controller.Controller`; a protocol, so that the steps sit below it).
    Per-key state is only reached through its owners: ``keys``, ``echoes`` and ``gate``."""

    name: str
    registration: Registration
    resource: ResourceInfo
    ctx: ClientContext
    metrics: ControllerMetrics
    queue: WorkQueue[Request]
    recent: collections.deque[dict[str, Any]] | None
    reconciles: int
    log: logging.Logger
    #: the caches of the informers whose events wake this controller (its primary informers)
    primary: PrimaryCache
    keys: KeyNotes
    echoes: FinalizerWrites
    gate: Gate

    def halt(self) -> None: ...


class Call:
    """One reconcile: what the handler gets and what came of it."""

    __slots__ = (
        "key", "started", "reconcile_id", "logger", "phase", "obj", "kwargs", "add_finalizer", "called",
        "finished", "held", "outcome", "error", "stale", "trace", "trigger", "ran", "shard", "fence",
    )

    def __init__(self, key: Request, started: float, reconcile_id: str) -> None:
        self.key, self.started, self.reconcile_id = key, started, reconcile_id
        self.logger: ReconcileLogger
        self.phase: Phase = Phase.DELETED
        self.obj: Any = None
        self.kwargs: dict[str, Any] = {}
        self.add_finalizer = False
        self.called = False  # the handler was called
        self.finished = False  # prepared with an error, or the handler returned: ready to settle
        self.held = True  # the worker still owes its key a done() (False: done, or given back)
        self.outcome: Any = None
        self.error: BaseException | None = None
        self.stale = False  # a cached copy behind our own finalizer release: nothing to call
        self.trace: Trace  # why it runs (taken from the controller with the key)
        self.trigger: Trigger | None = None  # the frozen trace, when someone reads it
        self.ran = 0.0  # seconds a plain handler ran (measured only with a timeout)
        self.shard = -1  # the key's range in sharded mode
        self.fence: WriteFence | None = None  # the Lease its writes are checked against (None: no Lease)


def held(keys: list[Request], calls: list[Call]) -> list[Request]:
    """Keys a worker still owes a ``done()``: calls neither settled nor given back, and keys it
    took but had not prepared yet."""
    return [c.key for c in calls if c.held] + keys[len(calls):]


async def call_with_timeout(c: ControllerState, call: Call, timeout: float) -> None:
    """Await an async handler for at most ``timeout`` seconds; past it, the handler is
    cancelled and the call fails with :class:`~declop.errors.ReconcileTimeout` (retried with
    backoff). A ``TimeoutError`` the handler raises itself stays its own error."""
    try:
        async with asyncio.timeout(timeout) as scope:
            call.outcome = await c.registration.fn(**call.kwargs)
    except TimeoutError as exc:
        if not scope.expired():
            call.error = exc
            return
        c.metrics.timed_out(c.name, "cancelled")
        call.error = ReconcileTimeout(
            f"handler {c.name!r} did not finish within timeout={timeout:g} s for {call.key}; "
            "it was cancelled and the key is retried with backoff"
        )
    except Exception as exc:  # noqa: BLE001
        call.error = exc


async def call_async(c: ControllerState, call: Call) -> None:
    """Await an ``async def`` handler with its call's write fence current, within the
    registration's ``timeout`` if it has one (:func:`call_with_timeout`)."""
    token = enter(call.fence)
    try:
        timeout = c.registration.timeout
        if timeout is None:
            call.outcome = await c.registration.fn(**call.kwargs)
        else:
            await call_with_timeout(c, call, timeout)
    except Exception as exc:  # noqa: BLE001 - the outcome table handles every exception
        call.error = exc
    finally:
        leave(token)


