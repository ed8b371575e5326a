"""Virtual time for the simulator: an asyncio loop whose clock jumps to the next timer.

:class:`VirtualLoop` is an ordinary :class:`asyncio.SelectorEventLoop` with two changes:

- :meth:`VirtualLoop.time` reads a virtual clock, and the selector's ``select(timeout)`` advances
  that clock by ``timeout`` instead of sleeping (no real file descriptor is polled: nothing in a
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

Why not `looptime <https://pypi.org/project/looptime/>`_: it fakes the time of a loop very much
like this (a patched ``time()`` and ``select()``), but it is a pytest plugin first, has no notion
of pausing part of the loop's tasks, and would be a new test dependency for ~100 lines. The
standard library's hooks (``SelectorEventLoop(selector=...)``, ``call_soon``/``call_at`` with
a ``context``) are all this needs.

Invariants:

- ``time()`` never goes backwards; it moves only inside ``select()``, by the loop's own timeout
  (the distance to the next timer), never while a callback runs;
- a callback of a paused actor never runs before the actor is resumed; callbacks held back run
  after the resume in the order they became ready;
- a loop with nothing ready and no timer is deadlocked in virtual time: ``select`` raises
  :class:`Deadlock` rather than block for ever.
"""

from __future__ import annotations

import asyncio
import contextvars
import selectors
from typing import Any, Callable, Coroutine, TypeVar

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
        self._held: list[tuple[Callable[..., Any], tuple[Any, ...], contextvars.Context]] = []

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

    def _run(self, callback: Callable[..., Any], *args: Any) -> None:
        if self.paused and not self.dead:
            self._held.append((callback, args, contextvars.copy_context()))
            return
        callback(*args)


def actor() -> Actor | None:
    """The actor of the running task (None outside any)."""
    return _ACTOR.get()


class _VirtualSelector(selectors.SelectSelector):
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
        who = _ACTOR.get() if context is None else context.get(_ACTOR)
        if who is None:
            return super().call_soon(callback, *args, context=context)
        return super().call_soon(who._run, callback, *args, context=context)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None) -> asyncio.TimerHandle:  # type: ignore[override]
        who = _ACTOR.get() if context is None else context.get(_ACTOR)
        if who is None:
            return super().call_at(when, callback, *args, context=context)
        return super().call_at(when, who._run, callback, *args, context=context)
