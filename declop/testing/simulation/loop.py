"""Virtual time for the simulator: an asyncio loop whose clock jumps to the next timer.

:class:`VirtualLoop` is an ordinary :class:`asyncio.SelectorEventLoop` with three changes:

- :meth:`VirtualLoop.time` reads a virtual clock, and where the base loop would ``select(timeout)``
  the clock advances by ``timeout`` instead (no real file descriptor is polled: nothing in a
  simulation does I/O). When nothing is runnable the loop therefore jumps straight to its next timer: a
  minute of Lease renewals runs in milliseconds, and the order of events depends only on the
  order of the callbacks — with no threads, no sockets and seeded randomness, a run is
  deterministic.
- every callback runs under an :class:`Actor` (a replica), taken from a context variable that
  tasks inherit: :meth:`Actor.pause` holds back every callback of that replica's tasks —
  their steps, their timers, the wake-ups of the futures they await — until
  :meth:`Actor.resume`, as SIGSTOP / SIGCONT would, while the clock keeps moving. A dead actor's
  callbacks still run (so its tasks can be cancelled and finish); the simulator refuses its
  requests instead.
- for speed (the loop's own bookkeeping was most of a run's cost) it runs its own
  ``_run_once``, a copy of ``BaseEventLoop._run_once`` step for step — the same purge of
  cancelled timers, the same heap of timers compared by ``when`` alone, the same clock
  resolution, so the same order of callbacks as the base loop gives — without the selector
  call, and with the actor check made there on a handle that carries its actor (set when it
  is scheduled) rather than by a wrapper around every callback; ``call_soon``, ``call_later``
  and ``call_at`` make those handles without the base loop's debug-mode calls.

Why not `looptime <https://pypi.org/project/looptime/>`_: it fakes the time of a loop very much
like this (a patched ``time()`` and ``select()``), but it is a pytest plugin first, has no notion
of pausing part of the loop's tasks, and would be a new test dependency for ~100 lines. The
standard library's hooks (``call_soon``/``call_at`` with a ``context``, the loop's
``_run_once``) are all this needs; the last is private, so :meth:`VirtualLoop._run_once`
follows CPython's ``base_events`` (3.11) and is to be read against it on a Python upgrade.

Invariants:

- ``time()`` never goes backwards; it moves only between turns of the loop, by the select
  timeout the base loop would use (the distance to the next timer), never while a callback runs;
- a callback of a paused actor never runs before the actor is resumed; callbacks held back run
  after the resume in the order they became ready;
- a loop with nothing ready and no timer is deadlocked in virtual time: the turn raises
  :class:`Deadlock` rather than block for ever.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import heapq
import selectors
from asyncio.base_events import _MIN_CANCELLED_TIMER_HANDLES_FRACTION, _MIN_SCHEDULED_TIMER_HANDLES, MAXIMUM_SELECT_TIMEOUT  # type: ignore[attr-defined]
from typing import Any, Callable, Coroutine, Sequence, TypeVar

__all__ = ["Actor", "Deadlock", "VirtualLoop", "actor"]

T = TypeVar("T")

#: the actor (replica) whose task is running; None for the simulator's own code
_ACTOR: contextvars.ContextVar[Actor | None] = contextvars.ContextVar("declop_sim_actor", default=None)


class Deadlock(RuntimeError):
    """Nothing is ready and no timer is set: virtual time cannot move."""


class Actor:
    """One replica's share of the loop: its tasks, and whether they may advance."""

    def __init__(self, loop: VirtualLoop, name: str) -> None:
        self.loop, self.name = loop, name
        self.paused = False
        self.dead = False
        self.tasks: list[asyncio.Task[Any]] = []
        #: the callbacks that became ready while paused, in order, each with a copy of its
        #: context (VirtualLoop._run_once holds them here; resume schedules them again)
        self._held: list[tuple[Callable[..., Any], Sequence[Any], contextvars.Context]] = []

    def __repr__(self) -> str:
        state = "dead" if self.dead else "paused" if self.paused else "running"
        return f"<Actor {self.name} {state}>"

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Start ``coro`` as a task of this actor (its children inherit the actor)."""
        ctx = contextvars.copy_context()
        ctx.run(_ACTOR.set, self)
        task = self.loop.create_task(coro, context=ctx)
        self.tasks.append(task)
        return task

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        """Let the tasks advance again; what became ready meanwhile runs first, in order."""
        self.paused = False
        held, self._held = self._held, []
        for callback, args, ctx in held:
            self.loop.call_soon(callback, *args, context=ctx)

    def kill(self) -> None:
        """The process is gone: cancel every task (their callbacks run again, so they finish)."""
        self.dead = True
        self.resume()
        for task in self.tasks:
            task.cancel()


def actor() -> Actor | None:
    """The actor of the running task (None outside any)."""
    return _ACTOR.get()


def _fill(h: Any, callback: Callable[..., Any], args: tuple[Any, ...], loop: asyncio.AbstractEventLoop, context: contextvars.Context, who: Actor | None) -> None:
    """What ``Handle.__init__`` does when the loop is not in debug mode, without its calls; and
    the actor the callback runs under (None: the simulator's own)."""
    h._context = context
    h._loop = loop
    h._callback = callback
    h._args = args
    h._cancelled = False
    h._repr = None
    h._source_traceback = None
    h._actor = who


class _Carried:
    """What both handle kinds carry (declared for the type checker; each subclass has the slot)."""

    __slots__ = ()
    _actor: Actor | None
    _context: contextvars.Context
    _callback: Callable[..., Any]
    _loop: Any


class _Handle(_Carried, asyncio.Handle):
    """A ready callback and the actor it runs under (None: the simulator's own)."""

    __slots__ = ("_actor",)

    def __init__(self, callback: Callable[..., Any], args: tuple[Any, ...], loop: asyncio.AbstractEventLoop, context: contextvars.Context, who: Actor | None) -> None:
        _fill(self, callback, args, loop, context, who)


class _TimerHandle(_Carried, asyncio.TimerHandle):
    """A timer and the actor it runs under; ordered by ``when`` alone, as a TimerHandle is."""

    __slots__ = ("_actor",)

    def __init__(self, when: float, callback: Callable[..., Any], args: tuple[Any, ...], loop: asyncio.AbstractEventLoop, context: contextvars.Context, who: Actor | None) -> None:
        _fill(self, callback, args, loop, context, who)
        self._when = when
        self._scheduled = False

    def cancel(self) -> None:
        """TimerHandle.cancel, without its calls: counted by the loop while in its heap."""
        if not self._cancelled:
            if self._scheduled:
                self._loop._timer_cancelled_count += 1
            if self._loop.get_debug():
                self._repr = repr(self)
            self._cancelled = True
            self._callback = None  # type: ignore[assignment]
            self._args = None  # type: ignore[assignment]


class _VirtualSelector(selectors.SelectSelector):
    """The selector the base loop is built with; :meth:`VirtualLoop._run_once` never polls it."""

    def __init__(self, loop: VirtualLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        # no real file descriptor is polled: the simulation has no sockets, and the loop's
        # self-pipe only wakes a select that blocks, which this one never does
        if timeout == 0:
            return []
        if timeout is None:
            raise Deadlock(f"nothing ready and no timer at virtual time {self._loop.time():.6f}")
        self._loop.advance(timeout)
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time (see the module docstring). ``start`` is its first ``time()``."""

    # the base loop's own state, which _run_once and the call_* methods use as BaseEventLoop's do
    #: the heap of timers, as ``(when, timer)`` pairs: a pair compares as its timer does
    #: (``when``, and equal ``when``s are neither less — the timers' own ``<``, see _run_once),
    #: with the float comparison done in C rather than by TimerHandle.__lt__
    _scheduled: list[tuple[float, _TimerHandle]]
    _ready: collections.deque[_Handle | _TimerHandle]
    _timer_cancelled_count: int
    _stopping: bool
    _closed: bool
    _debug: bool
    _clock_resolution: float
    _current_handle: asyncio.Handle | None

    def __init__(self, start: float = 0.0) -> None:
        self._virtual_now = float(start)
        super().__init__(selector=_VirtualSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        """Move the clock forward (the loop does it itself when idle)."""
        if seconds < 0:
            raise ValueError("virtual time does not go backwards")
        self._virtual_now += seconds

    # without a context, a handle runs in a copy of the current one: the same actor
    def call_soon(self, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None) -> asyncio.Handle:  # type: ignore[override]
        if self._debug:
            self._check_thread()  # type: ignore[attr-defined]
            self._check_callback(callback, "call_soon")  # type: ignore[attr-defined]
        if self._closed:
            raise RuntimeError("Event loop is closed")
        return self._call_soon(callback, args, context)

    def _call_soon(self, callback: Callable[..., Any], args: tuple[Any, ...], context: contextvars.Context | None) -> asyncio.Handle:
        if context is None:
            context = contextvars.copy_context()
        handle = _Handle(callback, args, self, context, context.get(_ACTOR))
        self._ready.append(handle)
        return handle

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None) -> asyncio.TimerHandle:  # type: ignore[override]
        if delay is None:
            raise TypeError("delay must not be None")
        return self.call_at(self._virtual_now + delay, callback, *args, context=context)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None) -> asyncio.TimerHandle:  # type: ignore[override]
        if when is None:
            raise TypeError("when cannot be None")
        if self._closed:
            raise RuntimeError("Event loop is closed")
        if self._debug:
            self._check_thread()  # type: ignore[attr-defined]
            self._check_callback(callback, "call_at")  # type: ignore[attr-defined]
        if context is None:
            context = contextvars.copy_context()
        timer = _TimerHandle(when, callback, args, self, context, context.get(_ACTOR))
        heapq.heappush(self._scheduled, (when, timer))
        timer._scheduled = True
        return timer

    def _run_once(self) -> None:
        """One turn of the loop: BaseEventLoop._run_once step for step (the same purge of
        cancelled timers, the same heap order, the same clock resolution, so the same order of
        callbacks), with the select replaced by the jump of the clock, and each callback of a
        paused actor held back instead of run."""
        scheduled = self._scheduled
        sched_count = len(scheduled)
        if sched_count > _MIN_SCHEDULED_TIMER_HANDLES and self._timer_cancelled_count / sched_count > _MIN_CANCELLED_TIMER_HANDLES_FRACTION:
            kept = []
            for entry in scheduled:
                timer = entry[1]
                if timer._cancelled:
                    timer._scheduled = False
                else:
                    kept.append(entry)
            heapq.heapify(kept)
            self._scheduled = scheduled = kept
            self._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0][1]._cancelled:
                self._timer_cancelled_count -= 1
                heapq.heappop(scheduled)[1]._scheduled = False
        ready = self._ready
        if not ready and not self._stopping:
            if not scheduled:
                raise Deadlock(f"nothing ready and no timer at virtual time {self._virtual_now:.6f}")
            # the select's timeout, and the clock moved by it (as _VirtualSelector.select would)
            timeout = min(max(0, scheduled[0][0] - self._virtual_now), MAXIMUM_SELECT_TIMEOUT)
            if timeout != 0:
                self._virtual_now += timeout
        end_time = self._virtual_now + self._clock_resolution
        while scheduled:
            if scheduled[0][0] >= end_time:
                break
            timer = heapq.heappop(scheduled)[1]
            timer._scheduled = False
            ready.append(timer)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if handle._cancelled:
                continue
            who = handle._actor
            if who is not None and who.paused and not who.dead:
                who._held.append((handle._callback, handle._args, handle._context.copy()))
                continue
            if self._debug:
                self._current_handle = handle
                try:
                    handle._run()
                finally:
                    self._current_handle = None
            else:
                handle._run()
