"""Call: one reconcile of one key — what the handler gets, how it is called, what came of it.

Owns :class:`Call` (a key's reconcile from the moment a worker takes it until it is settled),
the handler's calls themselves — :func:`call_async` (:func:`call_with_timeout` with a timeout)
for an ``async def`` handler, :func:`run_batch` for the plain calls a worker runs in one executor
job (:func:`hand_off`: the thread wakes the loop itself) — and the stall watch of such a batch
(:class:`Watch`, :func:`watch`): once a call has run for :data:`~declop.queue.batches.STALL_AFTER`,
the calls behind it go back to the queue. Also the
hooks a controller reports to (:class:`ControllerMetrics`) and :class:`ControllerState`, the
controller as the steps of a key's life (:mod:`declop.reconcile._fence`,
:mod:`declop.reconcile._preparation`, :mod:`declop.reconcile._outcome`) see it.

Invariants:
- a call is "held" (its worker owes its key exactly one ``queue.done()``) until it is settled or
  given back; :func:`held` names the keys still owed;
- ``call.finished`` is written last, in the thread, once everything else of the call is final:
  the loop may settle a call only when it sees it;
- in a batch, shutdown stops the calls after the first (it was taken before the stop); a closed
  ``fence`` stops every call, the first included, checked just before each; a call whose range
  the shard fence refuses is skipped (never called: its key is done() by the worker);
- a given-back call keeps its trace (its causes go back ahead of newer ones) and, when we added
  our finalizer for its CREATED call, its key is remembered so the next run still sees CREATED;
- a handler's own ``TimeoutError`` stays its error; only an expired ``timeout`` becomes
  :class:`~declop.errors.ReconcileTimeout`;
- a handler runs with its call's write fence current (``call.fence``, :mod:`declop.kube.fencing`;
  in the worker's task, or in the executor thread around each call of a batch), and never with
  another call's.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import time
from typing import Any, Callable, Iterable, Protocol

from declop.errors import ReconcileTimeout
from declop.kube.discovery import ResourceInfo
from declop.kube.fencing import WriteFence, enter, leave
from declop.kube.keys import Request
from declop.leases.shards import ShardSet
from declop.logs import ReconcileLogger
from declop.queue.batches import STALL_AFTER, Batch
from declop.queue.workqueue import QueueMetrics, WorkQueue
from declop.reconcile.client import ClientContext
from declop.reconcile.registration import Registration
from declop.reconcile.result import Phase
from declop.reconcile.trigger import Trace, Trigger

__all__ = [
    "Call", "ControllerMetrics", "ControllerState", "Watch", "call_async", "call_with_timeout", "hand_off", "held",
    "returned", "run_batch", "watch",
]


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
    (:class:`~declop.reconcile.controller.Controller`; a protocol, so that the steps sit below it)."""

    name: str
    registration: Registration
    resource: ResourceInfo
    ctx: ClientContext
    metrics: ControllerMetrics
    queue: WorkQueue[Request]
    recent: collections.deque[dict[str, Any]] | None
    reconciles: int
    fence: Callable[[], bool] | None
    #: the stores of the informers whose events wake this controller (its primary informers)
    own_stores: tuple[Any, ...]
    fence_lease: str
    fenced: int
    shards: ShardSet | None
    unowned: int
    _log: logging.Logger
    _traces: dict[Request, Trace]
    _delayed: dict[Request, tuple[str, str | None]]
    _created: set[Request]
    _uids: dict[Request, str] | None
    _tombstones: dict[int, set[Request]]
    _own_writes: dict[tuple[str | None, str], str]
    _writing: dict[tuple[str | None, str], list[str]]
    _released: dict[tuple[str | None, str], str]
    _invalid: dict[Request, str]

    def _lookup(self, key: Request) -> Any: ...

    def _trace(self, key: Request) -> Trace: ...

    def _restore(self, key: Request, trace: Trace) -> None: ...

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


def run_batch(
    fn: Callable[..., Any],
    calls: Iterable[Call],
    stopping: Callable[[], bool],
    fence: Callable[[], bool] | None = None,
    timed: bool = False,
    shard_fence: Callable[[int], bool] | None = None,
) -> None:
    """In a worker thread: call ``fn`` for each prepared call, in order — from a list, or from a
    :class:`~declop.queue.batches.Batch` the loop may take calls back from; stop early at shutdown (the
    first call always runs: it was taken before the stop) and as soon as ``fence()`` is False
    (checked just before *every* call, the first one included). A call whose range
    ``shard_fence`` refuses is skipped (not called: its key is done() by the worker). The
    executor's future of this job is done exactly when it returns: a worker cancelled meanwhile
    cannot stop the thread, and until then the Leases its calls run under must not be released
    (issue 22, invariant I6; see ``Controller._abandoned``)."""
    for i, call in enumerate(calls):
        if (i and stopping()) or (fence is not None and not fence()):
            return
        if shard_fence is not None and not shard_fence(call.shard):
            continue
        call.called = True
        began = time.monotonic() if timed else 0.0
        token = None if call.fence is None else enter(call.fence)  # the sync client's requests carry it
        try:
            call.outcome = fn(**call.kwargs)
        except Exception as exc:  # noqa: BLE001 - the outcome table handles every exception
            call.error = exc
        finally:
            if token is not None:
                leave(token)
        if timed:
            call.ran = time.monotonic() - began
        call.finished = True  # last: everything above is final when the loop sees it


def hand_off(
    executor: concurrent.futures.Executor, loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any
) -> tuple[concurrent.futures.Future[None], asyncio.Future[None]]:
    """Run ``fn(*args)`` in ``executor``; return its job and a future on ``loop`` that the thread
    resolves itself, with one ``call_soon_threadsafe``, the moment ``fn`` returns or raises.

    This is the plain handler's thread hop. ``asyncio.wrap_future`` of the job would resolve the
    loop's future through the job's own completion (its lock, its callbacks, a state copy) and
    costs ~20 µs more per hop, a third of it, on the 2-core VM (bench/FINDINGS.md).

    Invariants: the returned future ends normally (result or ``fn``'s exception) only once ``fn``
    has returned, so nothing of ``fn`` still runs; cancelling it cancels the job, which then never
    runs if no thread took it yet (``job.done()`` tells); a job cancelled before it ran (the
    executor's ``shutdown(cancel_futures=True)``) cancels the future, so no worker waits for ever.
    """
    waiter: asyncio.Future[None] = loop.create_future()

    def in_thread() -> None:
        error: BaseException | None = None
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the worker, as wrap_future would
            error = exc
        try:
            loop.call_soon_threadsafe(_resolve, waiter, error)
        except RuntimeError:  # the loop is closed: the process is exiting
            pass

    job = executor.submit(in_thread)

    def job_ended(j: concurrent.futures.Future[None]) -> None:
        if j.cancelled():
            try:
                loop.call_soon_threadsafe(_cancel, waiter)
            except RuntimeError:
                pass

    def waiter_ended(w: asyncio.Future[None]) -> None:
        if w.cancelled():
            job.cancel()

    job.add_done_callback(job_ended)
    waiter.add_done_callback(waiter_ended)
    return job, waiter


def _resolve(waiter: asyncio.Future[None], error: BaseException | None) -> None:
    if not waiter.done():
        if error is None:
            waiter.set_result(None)
        else:
            waiter.set_exception(error)


def _cancel(waiter: asyncio.Future[None]) -> None:
    waiter.cancel()


def returned(job: concurrent.futures.Future[None], waiter: asyncio.Future[None]) -> bool:
    """No call of a handed-off batch (:func:`hand_off`) can still run: its thread returned (the
    waiter ended normally, maybe a moment before the job itself is marked done) or the job is done."""
    return job.done() or (waiter.done() and not waiter.cancelled())


class Watch:
    """A running batch, watched from the loop for stalls (see :func:`watch`)."""

    __slots__ = ("batch", "calls", "timer", "woken")

    def __init__(
        self, batch: Batch[Call], calls: list[Call], woken: asyncio.Future[None]
    ) -> None:
        self.batch, self.calls, self.woken = batch, calls, woken
        self.timer: asyncio.TimerHandle

    def wake(self, _: object = None) -> None:
        if not self.woken.done():
            self.woken.set_result(None)


def watch(c: ControllerState, w: Watch) -> None:
    """Timer on the loop while a batch runs. Once a call has run for ``STALL_AFTER``, the calls
    waiting behind it are given back (their keys to the head of the queue), and the worker is
    woken to settle the calls that finished before it; then the timer stops (nothing is left
    but the slow call)."""
    if w.woken.done():
        return
    batch = w.batch
    running = batch.running_for()
    if running < STALL_AFTER:
        w.timer = asyncio.get_running_loop().call_later(STALL_AFTER - running, watch, c, w)
        return
    back = batch.take_back()
    if back:
        for call in back:
            call.held = False
            if call.add_finalizer:  # we added it for a CREATED call that has not run
                c._created.add(call.key)
            c._restore(call.key, call.trace)
        c.queue.give_back(*(call.key for call in back))
        c._log.debug(
            "A call is slow; the keys behind it go back to the queue",
            extra={"kv": {"controller": c.name, "running_seconds": round(running, 3), "keys": len(back)}},
        )
    if back or any(call.finished and call.held for call in w.calls):
        w.wake()
