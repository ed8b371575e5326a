"""Run: the two runners of prepared calls — one per handler kind — and the workers' crew.

A worker's prepared calls go to its controller's runner (:class:`Runner`): :class:`AsyncRunner`
awaits an ``async def`` handler's calls one by one on the loop, :class:`BatchRunner` runs a plain
handler's calls in one executor job (:func:`run_batch`; :func:`hand_off`: the thread wakes the
loop itself) and watches it for stalls (:class:`Watch`, :func:`watch`): once a call has run for
:data:`~declop.queue.batches.STALL_AFTER`, the calls behind it go back to the queue. Both settle
each call they ran (:mod:`declop.reconcile._outcome`), and both ask
:meth:`~declop.reconcile._fence.Gate.may_start` just before each call. :class:`Crew` holds what
the workers share: their tasks, the executor and the batches a stop abandoned.

Invariants:
- every call starts only if :meth:`~declop.reconcile._fence.Gate.may_start` says :data:`GO` at
  that moment; :data:`SKIP` skips that call (its range is not ours: dropped), :data:`STOPPING`
  drops it and the rest (never the first call a worker took), :data:`FENCED` drops it and the
  rest and halts the controller (:meth:`~declop.reconcile._fence.Gate.closed`);
- an async call is settled as soon as it returns; a batch's calls once the batch returns, or,
  when it stalls, those that finished before the slow call at once;
- a given-back call keeps its trace (its causes go back ahead of newer ones) and, when we added
  our finalizer for its CREATED call, its key is remembered so the next run still sees CREATED;
- a batch's job is done exactly when its thread returned: a worker cancelled meanwhile cannot
  stop the thread, so the batch is *abandoned* (:meth:`Crew.abandon`) — it counts as running and
  keeps its ranges in flight until the thread returns (the Leases it runs under must not be
  released meanwhile). A job cancelled before a thread took it is done: none of its calls runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any, Callable, Iterable, Protocol, TypeVar

from declop.clock import Clock
from declop.kube.fencing import enter, leave
from declop.kube.keys import Request
from declop.leases.shards import ShardSet
from declop.queue.batches import STALL_AFTER, Batch
from declop.reconcile._call import Call, ControllerState, call_async
from declop.reconcile._fence import FENCED, GO, SKIP, Gate
from declop.reconcile._outcome import complete, finish
from declop.reconcile.result import Phase

__all__ = [
    "AsyncRunner", "BatchRunner", "Crew", "Runner", "Watch", "hand_off", "returned", "run_batch",
    "watch",
]

T = TypeVar("T")


class Runner(Protocol):
    """Runs a worker's prepared ``calls`` (``ranges``: their keys' ranges in flight, sharded) and
    settles each one it ran; the calls it did not start stay held (their keys are done())."""

    async def run(self, c: ControllerState, calls: list[Call], ranges: dict[Request, int]) -> None: ...


class AsyncRunner:
    """An ``async def`` handler's calls, awaited one by one on the loop, each settled at once."""

    __slots__ = ()

    async def run(self, c: ControllerState, calls: list[Call], ranges: dict[Request, int]) -> None:
        gate = c.gate
        for i, call in enumerate(calls):
            if call.error is None and not call.stale:
                verdict = gate.may_start(call.shard, not i)
                if verdict:
                    if verdict == SKIP:
                        assert gate.book is not None
                        gate.book.skipped()
                        continue  # its range is draining or lost: dropped (done() by the worker)
                    if verdict == FENCED:
                        gate.closed(len(calls) - i)
                    break  # the rest are dropped, like keys still queued
                call.called = True
                await call_async(c, call)  # with its write fence current
            await finish(c, call)


class Crew:
    """What a controller's workers share: the sync gate, their tasks, the executor of plain handlers' batches
    (None: the loop's default executor, which only tests use: its jobs are not tracked for a stop),
    the clock of a batch's stall watch, and the batches a stop abandoned."""

    __slots__ = ("executor", "clock", "shards", "synced", "tasks", "cancelled", "abandoned", "runner")

    def __init__(
        self, executor: concurrent.futures.Executor | None, clock: Clock, shards: ShardSet | None, is_async: bool
    ) -> None:
        self.executor = executor
        self.clock = clock
        self.shards = shards
        #: set once every informer of every source listed once: workers start only then
        self.synced = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        #: workers a stop cancelled that have not returned yet (a handler ignoring cancellation)
        self.cancelled: list[asyncio.Task[None]] = []
        #: batches whose worker was cancelled while their thread runs -> the ranges they keep in
        #: flight (sharded mode) until the thread returns
        self.abandoned: dict[concurrent.futures.Future[None], list[int]] = {}
        self.runner: Runner = AsyncRunner() if is_async else BatchRunner(self)

    def running(self) -> int:
        """Batches of calls still running although a stop gave up on them."""
        self.cancelled = [t for t in self.cancelled if not t.done()]
        return len(self.abandoned) + len(self.cancelled)

    def submit(self, loop: asyncio.AbstractEventLoop, *args: Any) -> tuple[concurrent.futures.Future[None] | None, asyncio.Future[int]]:
        """Hand a batch to the executor: its job (None on the loop's default executor) and the
        future the worker awaits (:func:`run_batch`'s answer)."""
        if self.executor is None:
            return None, loop.run_in_executor(None, run_batch, *args)
        return hand_off(self.executor, loop, run_batch, *args)

    def abandon(self, job: concurrent.futures.Future[None], ranges: dict[Request, int]) -> None:
        """The worker of ``job`` leaves while its thread runs: its calls go on, and so do their
        ranges' in-flight counts (taken over from ``ranges``) until the thread returns."""
        self.abandoned[job] = list(ranges.values())
        ranges.clear()
        job.add_done_callback(_on_loop(asyncio.get_running_loop(), self._job_ended))

    def _job_ended(self, job: concurrent.futures.Future[None]) -> None:
        """On the loop, once the thread of an abandoned batch returned: its ranges are free."""
        ranges = self.abandoned.pop(job, [])
        if self.shards is not None:
            for r in ranges:
                self.shards.end(r)


class BatchRunner:
    """A plain handler's calls, run in one executor job and settled once it returns. With more
    than one worker, a timer gives the calls that have not started back (their keys to the
    queue) once a call has run STALL_AFTER; the calls that finished are settled then."""

    __slots__ = ("crew",)

    def __init__(self, crew: Crew) -> None:
        self.crew = crew

    async def run(self, c: ControllerState, calls: list[Call], ranges: dict[Request, int]) -> None:
        runnable = [call for call in calls if call.error is None and not call.stale]
        if len(runnable) < len(calls):
            for call in calls:
                if call.finished:  # a failed preparation: settled now, not after the batch
                    complete(c, call)
        if runnable:
            verdict = await self._batch(c, calls, runnable, ranges)
            if verdict == FENCED and not c.gate.stopping:
                c.gate.closed(sum(not call.called for call in runnable))
        deleting = c.registration.finalizer is not None
        for call in calls:
            if call.finished and call.held:
                if deleting and (call.phase is Phase.DELETING or c.echoes.left):  # a release to make
                    await finish(c, call)
                else:
                    complete(c, call)
        # calls not started (stopped at shutdown or by a fence) stay held: their keys are done()

    async def _batch(self, c: ControllerState, calls: list[Call], runnable: list[Call], ranges: dict[Request, int]) -> int:
        """Run ``runnable`` in one job; returns why it stopped (:data:`GO`: it ran to the end)."""
        reg, crew = c.registration, self.crew
        loop = asyncio.get_running_loop()
        timed = reg.timeout is not None
        # one call, or one worker: nothing to give back, or nobody to give it to — no timer
        split = len(runnable) > 1 and reg.max_concurrent > 1
        batch: Iterable[Call] = Batch(runnable, crew.clock) if split else runnable
        job, thread = crew.submit(loop, reg.fn, batch, c.gate, timed)
        try:
            if split:
                assert isinstance(batch, Batch)
                w = Watch(batch, calls, loop.create_future(), batch.started_at)
                thread.add_done_callback(w.wake)
                w.timer = loop.call_later(STALL_AFTER, watch, c, w)
                try:
                    await w.woken
                finally:
                    w.timer.cancel()
                if not thread.done():  # stalled: settle what finished before the slow call
                    for call in calls:
                        if call.finished and call.held:
                            await finish(c, call)
            return await thread
        finally:
            if job is not None and not returned(job, thread):
                crew.abandon(job, ranges)


def run_batch(fn: Callable[..., Any], calls: Iterable[Call], gate: Gate, timed: bool = False) -> int:
    """In a worker thread: call ``fn`` for each prepared call, in order — from a list, or from a
    :class:`~declop.queue.batches.Batch` the loop may take calls back from — each only if
    :meth:`~declop.reconcile._fence.Gate.may_start` says so just before it (a call it skips is
    not called: its key is done() by the worker). Returns why it stopped (:data:`GO`: it ran every
    call). The executor's job is done exactly when it returns."""
    may_start = gate.may_start
    for i, call in enumerate(calls):
        verdict = may_start(call.shard, not i)
        if verdict:
            if verdict == SKIP:
                continue
            return verdict
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
    return GO


def hand_off(
    executor: concurrent.futures.Executor, loop: asyncio.AbstractEventLoop, fn: Callable[..., T], *args: Any
) -> tuple[concurrent.futures.Future[None], asyncio.Future[T]]:
    """Run ``fn(*args)`` in ``executor``; return its job and a future on ``loop`` that the thread
    resolves itself (with ``fn``'s result), with one ``call_soon_threadsafe``, the moment ``fn``
    returns or raises.

    This is the plain handler's thread hop. ``asyncio.wrap_future`` of the job would resolve the
    loop's future through the job's own completion (its lock, its callbacks, a state copy), which
    costs a good part of the hop (bench/FINDINGS.md).

    Invariants: the returned future ends normally (result or ``fn``'s exception) only once ``fn``
    has returned, so nothing of ``fn`` still runs; cancelling it cancels the job, which then never
    runs if no thread took it yet (``job.done()`` tells); a job cancelled before it ran (the
    executor's ``shutdown(cancel_futures=True)``) cancels the future, so no worker waits for ever.
    """
    waiter: asyncio.Future[T] = loop.create_future()

    def in_thread() -> None:
        error: BaseException | None = None
        result: Any = None
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the worker, as wrap_future would
            error = exc
        try:
            loop.call_soon_threadsafe(_resolve, waiter, error, result)
        except RuntimeError:  # the loop is closed: the process is exiting
            pass

    job = executor.submit(in_thread)

    def job_ended(j: concurrent.futures.Future[None]) -> None:
        if j.cancelled():
            try:
                loop.call_soon_threadsafe(_cancel, waiter)
            except RuntimeError:
                pass

    def waiter_ended(w: asyncio.Future[T]) -> None:
        if w.cancelled():
            job.cancel()

    job.add_done_callback(job_ended)
    waiter.add_done_callback(waiter_ended)
    return job, waiter


def _resolve(waiter: asyncio.Future[Any], error: BaseException | None, result: Any) -> None:
    if not waiter.done():
        if error is None:
            waiter.set_result(result)
        else:
            waiter.set_exception(error)


def _cancel(waiter: asyncio.Future[Any]) -> None:
    waiter.cancel()


def returned(job: concurrent.futures.Future[None], waiter: asyncio.Future[Any]) -> bool:
    """No call of a handed-off batch (:func:`hand_off`) can still run: its thread returned (the
    waiter ended normally, maybe a moment before the job itself is marked done) or the job is done."""
    return job.done() or (waiter.done() and not waiter.cancelled())


class Watch:
    """A running batch, watched from the loop for stalls (see :func:`watch`)."""

    __slots__ = ("batch", "calls", "since", "timer", "woken")

    def __init__(
        self, batch: Batch[Call], calls: list[Call], woken: asyncio.Future[None], since: float
    ) -> None:
        self.batch, self.calls, self.woken = batch, calls, woken
        #: the start (``batch.started_at``) of the call the timer was armed for
        self.since = since
        self.timer: asyncio.TimerHandle

    def wake(self, _: object = None) -> None:
        if not self.woken.done():
            self.woken.set_result(None)


def watch(c: ControllerState, w: Watch) -> None:
    """Timer on the loop while a batch runs. Once a call has run for ``STALL_AFTER``, the calls
    waiting behind it are given back (their keys to the head of the queue), and the worker is
    woken to settle the calls that finished before it; then the timer stops (nothing is left
    but the slow call).

    A timer armed for a call that is still the running one is a stall by itself, without reading
    the clock again: re-arming for ``STALL_AFTER - running`` would, on a clock that only moves
    when timers fire (``declop sim``'s), meet a ``running`` a rounding error short of
    ``STALL_AFTER`` at every firing and spin at one instant for ever."""
    if w.woken.done():
        return
    batch = w.batch
    started, running = batch.started_at, batch.running_for()
    if started != w.since and running < STALL_AFTER:  # a later call started: its own time counts
        w.since = started
        w.timer = asyncio.get_running_loop().call_later(STALL_AFTER - running, watch, c, w)
        return
    back = batch.take_back()
    if back:
        for call in back:
            call.held = False
            if call.add_finalizer:  # we added it for a CREATED call that has not run
                c.echoes.given_back(call.key)
            c.keys.restore(call.key, call.trace)
        c.queue.give_back(*(call.key for call in back))
        c.log.debug(
            "A call is slow; the keys behind it go back to the queue",
            extra={"kv": {"controller": c.name, "running_seconds": round(running, 3), "keys": len(back)}},
        )
    if back or any(call.finished and call.held for call in w.calls):
        w.wake()


def _on_loop(
    loop: asyncio.AbstractEventLoop, fn: Callable[[concurrent.futures.Future[None]], None]
) -> Callable[[concurrent.futures.Future[None]], None]:
    """A done-callback for an executor job that runs ``fn(job)`` on ``loop`` (called in the
    thread, or at once if the job is done already; nothing if the loop is closed: the process is
    exiting)."""

    def later(job: concurrent.futures.Future[None]) -> None:
        try:
            loop.call_soon_threadsafe(fn, job)
        except RuntimeError:
            pass

    return later
