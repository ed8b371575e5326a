"""Runnables: the manager's long-running work, one protocol and one group.

Every piece of work the manager keeps running besides the controllers' workers — each
controller's start, the optional permission review, the Lease tasks, the background-task
starters, the shard filter moves — is a :class:`Runnable` started in the :class:`RunGroup`.
Leader-only work says so (:attr:`Runnable.leader_only`): the group starts it once leadership is
ours (at once without leader election). The group stops work by name, in the order
:mod:`declop.manager.shutdown` gives: that order matters (the Lease is renewed until the drain
is over), so the group has no "stop everything".
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable, Protocol

__all__ = ["RunGroup", "Runnable", "Task"]


class Runnable(Protocol):
    """One piece of long-running work."""

    #: the task's name, unique in its group
    name: str
    #: start only once this replica leads (with leader election)
    leader_only: bool

    async def run(self) -> None: ...


@dataclass
class Task:
    """A runnable of one coroutine function."""

    name: str
    fn: Callable[[], Awaitable[None]]
    leader_only: bool = False

    async def run(self) -> None:
        await self.fn()


class RunGroup:
    """The running runnables of one manager, one asyncio task each."""

    def __init__(self) -> None:
        #: set once this replica leads (None: no leader election, leader-only work starts at once)
        self.leadership: asyncio.Event | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, runnable: Runnable) -> None:
        self._tasks[runnable.name] = asyncio.get_running_loop().create_task(self._run(runnable), name=runnable.name)

    async def _run(self, runnable: Runnable) -> None:
        if runnable.leader_only and self.leadership is not None:
            await self.leadership.wait()
        await runnable.run()

    def running(self, name: str) -> bool:
        task = self._tasks.get(name)
        return task is not None and not task.done()

    def task(self, name: str) -> asyncio.Task[None] | None:
        return self._tasks.get(name)

    def cancel(self, names: Iterable[str]) -> None:
        for name in names:
            task = self._tasks.get(name)
            if task is not None:
                task.cancel()

    def names(self, prefix: str = "") -> list[str]:
        return [name for name in self._tasks if name.startswith(prefix)]

    def pop(self, name: str) -> asyncio.Task[None] | None:
        """Cancel the runnable and forget it; its task, to wait for (None: never started)."""
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
        return task
