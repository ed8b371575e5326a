"""Lifecycle: hooks around the operator's run — ``@declop.on_startup``, ``@declop.on_shutdown`` and
``@declop.background`` tasks — and the :class:`Lifecycle` that runs them for the manager.

When each runs (docs/lifecycle.md):

1. **startup** hooks, in registration order, after discovery and before any informer starts
   (caches are empty: read with ``client.live``). One that raises fails the start: the manager
   raises :class:`~declop.errors.ConfigError` naming the hook and the error, ``declop run``
   prints that one line and exits 1; no controller ever starts, and no shutdown hook runs.
2. **background** tasks (``async def`` only: a thread cannot be cancelled) start once every
   controller's caches have synced — by default only while this replica leads (at once without
   leader election; in sharded mode, while it holds the ``--leader-election-id`` Lease), with
   ``every_replica=True`` on every replica. They are cancelled on
   shutdown (the ``stop`` event is set first and they get the drain's grace period to return)
   and, for leader-only tasks, **at once** when the Lease is lost; a task that ignores the
   cancellation is waited for a bounded time only, then left to the process exit. A task that raises is logged
   with its traceback and restarted after a backoff (0.8 s doubling to 30 s, reset after 2 quiet
   minutes); one that returns is done and not restarted.
3. **shutdown** hooks, in registration order, after the controllers drained and the background
   tasks ended, while the client still works (before the Lease is released and the watches
   close). One that raises is logged with its traceback, the others still run, and the process
   exits 1.

Invariants:
- a hook's declared keyword arguments are checked at registration: ``client``, ``logger``,
  ``stop`` (or ``**kwargs`` for all); anything else, or something that is not a function, is a
  :class:`~declop.errors.RegistrationError` naming the hook;
- ``client`` is an :class:`~declop.reconcile.client.AsyncClient` for ``async def`` hooks and a blocking
  :class:`~declop.reconcile.client.Client` for plain ones (run in the handler thread pool); ``stop`` is an
  ``asyncio.Event`` for ``async def`` hooks, a ``threading.Event`` for plain ones, set when the
  operator stops (or, for a leader-only task, loses the Lease);
- a background task never runs twice at once in one process; no leader-only task runs while
  this replica does not hold the Lease, as far as the manager knows;
- a leader-only task's writes through declop's client are fenced like a reconcile's
  (:mod:`declop.kube.fencing`): each is checked against the Lease the task runs under — the
  leader Lease, or in sharded mode the background Lease — just before it is sent, and raises
  :class:`~declop.errors.Fenced`, unsent, once that Lease is not known valid. So a task that runs
  on after the loss (a process resumed after SIGSTOP before its elector saw the loss, a task that
  ignores its cancellation) cannot change the cluster. A task that ends with ``Fenced`` is not
  restarted: the loss stops it, and the next holder runs it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Literal

from declop.reconcile.client import AsyncClient, Client, ClientContext
from declop.errors import ConfigError, Fenced, RegistrationError
from declop.kube import fencing
from declop.cache.informer import Backoff
from declop.logs import ReconcileLogger

__all__ = ["HOOK_INJECTABLE", "LOGIN_INJECTABLE", "Hook", "HookKind", "Lifecycle", "login_function", "make_hook"]

log = logging.getLogger("declop.lifecycle")

HookKind = Literal["startup", "shutdown", "background", "probe", "login"]

#: keyword arguments a hook may declare
HOOK_INJECTABLE = frozenset({"client", "logger", "stop"})
#: a login function's: it runs before there is a connection to make a client of
LOGIN_INJECTABLE = frozenset({"logger"})

_DECORATOR = {"startup": "@declop.on_startup", "shutdown": "@declop.on_shutdown", "background": "@declop.background", "probe": "@declop.on_probe", "login": "@declop.on_login"}


@dataclass(frozen=True, slots=True)
class Hook:
    """One lifecycle hook as declared by its decorator."""

    fn: Callable[..., Any]
    name: str
    kind: HookKind
    is_async: bool
    #: background only: run on every replica, not only on the leader
    every_replica: bool = False
    #: the injectable names the hook declares; None when it takes **kwargs (gets them all)
    wants: frozenset[str] | None = None
    #: probe only: seconds a call may take, and seconds its outcome is reused
    #: (:mod:`declop.handlers.probing`)
    timeout: float = 0.0
    cache: float = 0.0

    def arguments(self, client: Any, logger: Any, stop: Any) -> dict[str, Any]:
        available = {"client": client, "logger": logger, "stop": stop}
        if self.wants is None:
            return available
        return {k: v for k, v in available.items() if k in self.wants}


def make_hook(
    fn: Any, kind: HookKind, *, name: str | None = None, every_replica: bool = False, timeout: float = 0.0, cache: float = 0.0
) -> Hook:
    """Check ``fn`` for use as a ``kind`` hook and describe it.

    Raises:
        RegistrationError: ``fn`` is not a function, a background task is not ``async def``,
            ``every_replica`` is given outside ``@declop.background`` or is not a bool, or ``fn``
            declares an argument declop cannot pass.
    """
    decorator = _DECORATOR[kind]
    if not callable(fn) or isinstance(fn, type):
        raise RegistrationError(f"{decorator} decorates a function, got {fn!r}")
    hook_name: str = name or str(getattr(fn, "__name__", None) or repr(fn))
    is_async = inspect.iscoroutinefunction(fn)
    if kind == "background" and not is_async:
        raise RegistrationError(
            f"{decorator} task {hook_name!r} must be an 'async def' function: a thread cannot be cancelled "
            "on shutdown or when leadership is lost"
        )
    if not isinstance(every_replica, bool):
        raise RegistrationError(f"every_replica must be True or False, got {every_replica!r}")
    if every_replica and kind != "background":
        raise RegistrationError(f"every_replica= is an option of @declop.background only, not of {decorator}")
    for what, value in (("timeout", timeout), ("cache", cache)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != value:
            raise RegistrationError(f"{decorator} {hook_name!r}: {what}= must be a number of seconds >= 0, got {value!r}")
    if kind == "probe" and timeout <= 0:
        raise RegistrationError(f"{decorator} {hook_name!r}: timeout= must be > 0 (an unbounded probe would hang /probes)")
    if kind != "probe" and (timeout or cache):
        raise RegistrationError(f"timeout= and cache= are options of @declop.on_probe only, not of {decorator}")
    allowed = LOGIN_INJECTABLE if kind == "login" else HOOK_INJECTABLE
    return Hook(fn, hook_name, kind, is_async, every_replica, _wanted(fn, hook_name, decorator, allowed), float(timeout), float(cache))


def _wanted(fn: Callable[..., Any], name: str, decorator: str, allowed: frozenset[str] = HOOK_INJECTABLE) -> frozenset[str] | None:
    wants: set[str] = set()
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            return None
        if p.kind is p.VAR_POSITIONAL or (p.name not in allowed and p.default is not p.empty):
            continue
        if p.name not in allowed:
            raise RegistrationError(
                f"{decorator} hook {name!r} takes an unknown argument {p.name!r}; declop passes only "
                f"{', '.join(sorted(allowed))} (add **_ to accept the rest)"
            )
        if p.kind is p.POSITIONAL_ONLY:
            raise RegistrationError(f"{decorator} hook {name!r}: {p.name!r} must not be positional-only")
        wants.add(p.name)
    return frozenset(wants)


class _Task:
    """One running background hook: its asyncio task and its stop event."""

    def __init__(self, hook: Hook, stop: asyncio.Event, task: asyncio.Task[None]) -> None:
        self.hook, self.stop, self.task = hook, stop, task


class Lifecycle:
    """Runs the hooks of one manager (see the module docstring for when)."""

    def __init__(
        self,
        hooks: list[Hook],
        ctx: ClientContext,
        executor: concurrent.futures.Executor | None,
        *,
        backoff: Callable[[], Backoff] = Backoff,
    ) -> None:
        self.hooks = list(hooks)
        self.ctx = ctx
        self.executor = executor
        self._backoff = backoff
        self._tasks: list[_Task] = []
        self._threads_stop = threading.Event()  # the stop event of plain startup/shutdown hooks
        #: background hooks started so far (name -> times started), for tests and statistics
        self.starts: dict[str, int] = {}

    def of(self, kind: HookKind) -> list[Hook]:
        return [h for h in self.hooks if h.kind == kind]

    @property
    def running(self) -> list[str]:
        """Names of the background tasks running now."""
        return [t.hook.name for t in self._tasks if not t.task.done()]

    def _logger(self, hook: Hook) -> ReconcileLogger:
        return ReconcileLogger(logging.getLogger(f"declop.hook.{hook.name}"), {"hook": hook.name})

    async def _call(self, hook: Hook, stop: Any) -> Any:
        logger = self._logger(hook)
        if hook.is_async:
            return await hook.fn(**hook.arguments(AsyncClient(self.ctx), logger, stop))
        loop = asyncio.get_running_loop()
        kwargs = hook.arguments(Client(self.ctx), logger, self._threads_stop)
        return await loop.run_in_executor(self.executor, lambda: hook.fn(**kwargs))

    async def call(self, hook: Hook) -> Any:
        """Call ``hook`` once and return what it returned (``async def`` on the loop, a plain
        one in the handler thread pool); ``stop`` is the operator's stop (a probe's)."""
        stop = asyncio.Event()
        if self._threads_stop.is_set():
            stop.set()
        return await self._call(hook, stop)

    # -- startup / shutdown --------------------------------------------------------------------
    async def startup(self) -> None:
        """Run every startup hook in order; the first failure raises ConfigError."""
        for hook in self.of("startup"):
            log.info("Running startup hook", extra={"kv": {"hook": hook.name}})
            try:
                await self._call(hook, asyncio.Event())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise ConfigError(
                    f"startup hook {hook.name!r} failed: {type(exc).__name__}: {exc}; the operator did not start"
                ) from exc

    async def shutdown(self) -> bool:
        """Run every shutdown hook in order; True if none failed (each failure is logged)."""
        self._threads_stop.set()
        ok = True
        for hook in self.of("shutdown"):
            log.info("Running shutdown hook", extra={"kv": {"hook": hook.name}})
            stop = asyncio.Event()
            stop.set()
            try:
                await self._call(hook, stop)
            except asyncio.CancelledError:
                raise
            except Exception:
                ok = False
                log.exception("Shutdown hook failed", extra={"kv": {"hook": hook.name}})
        return ok

    # -- background ----------------------------------------------------------------------------
    def start_background(self, *, every_replica: bool, lease: tuple[Callable[[], bool], str] | None = None) -> None:
        """Start the background tasks with this ``every_replica`` setting (once each).

        ``lease``: the Lease leader-only tasks run under — its ``valid`` and its
        ``namespace/name`` — whose fence every write of theirs is checked against (None: no
        Lease, nothing fenced)."""
        loop = asyncio.get_running_loop()
        running = {t.hook.name for t in self._tasks if not t.task.done()}
        for hook in self.of("background"):
            if hook.every_replica is every_replica and hook.name not in running:
                stop = asyncio.Event()
                context = contextvars.copy_context()
                fence = None
                if lease is not None and not every_replica:
                    fence = fencing.WriteFence(lease[0], lease[1], f"background task {hook.name!r}")
                    context.run(fencing.enter, fence)
                task = loop.create_task(self._supervise(hook, stop, fence), name=f"background {hook.name}", context=context)
                self._tasks.append(_Task(hook, stop, task))

    async def _supervise(self, hook: Hook, stop: asyncio.Event, fence: fencing.WriteFence | None = None) -> None:
        """Run ``hook`` until it returns; restart it with backoff after each crash — a
        leader-only one (``fence``: its Lease's) only while that Lease is known valid: a process
        resumed after a pause may run this before its elector has seen the loss."""
        backoff = self._backoff()
        kv = {"hook": hook.name}
        while not stop.is_set():
            if fence is not None and not fence.valid():
                log.warning("Not starting the background task: its Lease is not known valid; left to the Lease's next holder", extra={"kv": {**kv, "lease": fence.lease}})
                return
            self.starts[hook.name] = self.starts.get(hook.name, 0) + 1
            log.info("Starting background task", extra={"kv": kv})
            try:
                await self._call(hook, stop)
            except asyncio.CancelledError:
                raise
            except Fenced as exc:  # the Lease is lost: the loss stops us, the next holder runs it
                log.warning("Write fenced; the background task ended and is left to the Lease's next holder", extra={"kv": {**kv, "error": str(exc)}})
                return
            except Exception:
                if stop.is_set():
                    log.exception("Background task failed while stopping", extra={"kv": kv})
                    return
                delay = backoff.next()
                log.exception(f"Background task failed; restarting in {delay:.1f} s", extra={"kv": {**kv, "retryIn": round(delay, 2)}})
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                except asyncio.TimeoutError:
                    pass
                continue
            log.info("Background task finished", extra={"kv": kv})
            return

    async def stop_background(self, *, grace: float, leader_only: bool = False, settle: float = 1.0) -> list[str]:
        """Set the stop event of the background tasks (only leader-only ones with ``leader_only``),
        give them ``grace`` seconds to return, then cancel the rest and wait ``settle`` seconds
        more for them. With ``grace <= 0`` they are cancelled first, then the event is set.

        Returns the names of the tasks still running (they ignored the cancellation: left to
        the process exit, logged once, and never started a second time)."""
        chosen = [t for t in self._tasks if not (leader_only and t.hook.every_replica)]
        tasks = [t.task for t in chosen if not t.task.done()]
        if grace <= 0:  # cancelled at once (leadership lost): before the event, so no race lets one go on
            for task in tasks:
                task.cancel()
        for t in chosen:
            t.stop.set()
        if tasks and grace > 0:
            await asyncio.wait(tasks, timeout=grace)
        for task in tasks:
            if not task.done():
                task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=max(settle, 0.001))
        for t in chosen:
            if not t.task.cancelled() and t.task.done() and t.task.exception() is not None:
                log.error("Background task ended with an error", extra={"kv": {"hook": t.hook.name}})
        left = [t.hook.name for t in chosen if not t.task.done()]
        if left:
            log.warning("Background tasks still run after being cancelled; left to the process exit", extra={"kv": {"hooks": left}})
        self._tasks = [t for t in self._tasks if t not in chosen or not t.task.done()]
        return left


def login_function(hooks: list[Hook]) -> Callable[[], Any]:
    """The ``@declop.on_login`` functions as one coroutine function: each in registration order
    (an ``async def`` on the loop, a plain one in a worker thread) until one returns something
    other than None; that answer (None if none did). :mod:`declop.kube.login` says when it runs."""
    logins = [h for h in hooks if h.kind == "login"]

    async def login() -> Any:
        for hook in logins:
            logger = ReconcileLogger(logging.getLogger(f"declop.hook.{hook.name}"), {"hook": hook.name})
            kwargs = hook.arguments(None, logger, None)
            value = await hook.fn(**kwargs) if hook.is_async else await asyncio.to_thread(hook.fn, **kwargs)
            if value is not None:
                return value
        return None

    return login
