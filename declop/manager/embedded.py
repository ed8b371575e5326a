"""Operator: run the manager inside another application — from a thread or from its event loop.

From a thread (the application keeps its own main thread, or has no event loop at all)::

    op = declop.Operator(registry, kubeconfig="~/.kube/config")
    op.start()             # returns once every cache synced (op.wait_ready: the same wait)
    ...
    op.stop()              # graceful, as SIGTERM stops `declop run`

or ``with declop.Operator(...) as op: ...``. From a running event loop::

    async with declop.Operator(registry) as op:     # astart(): runs on this loop, until ready
        ...                                         # astop() on the way out
    await declop.Operator(registry).run(stop)       # until the asyncio.Event `stop` is set

docs/embedding.md is the guide. What the host application keeps:

- **signals**: nothing here installs a signal handler, calls ``sys.exit`` or ``os._exit``, or
  configures logging (declop logs to the ``declop.*`` loggers; the host decides where they go);
- **the process**: a lost Lease stops the operator (as it makes ``declop run`` exit 1) and
  raises :class:`LeaseLost` to whoever waits for it (:meth:`Operator.run`, :meth:`Operator.stop`,
  :meth:`Operator.wait`, ``__exit__``/``__aexit__``) — it does not end the process. declop run's
  watchdog (gone within :data:`~declop.leases.watchdog.EXIT_BOUND` whatever still runs) is
  therefore the host's choice: pass ``on_lost=Watchdog(EXIT_BOUND).arm`` to get it. Without it,
  a reconcile's writes stay fenced after the loss, but a stuck thread or a background task
  that ignores cancellation keeps running in the host's process;
- **the interpreter's switch interval**: :attr:`~declop.manager.Options.switch_interval` is
  process-wide; the default options here leave the host's alone (``declop run`` sets 1 ms).

Invariants:
- one run at a time per Operator: a second :meth:`start`/:meth:`astart`/:meth:`run` while one
  runs raises ``RuntimeError``; after it ended, a new start builds a fresh
  :class:`~declop.manager.Manager` (the registry stays frozen, with the same registrations);
- a start that fails (a :class:`~declop.errors.ConfigError`: nothing registered, unreachable
  apiserver, a startup hook that raised) raises that error from the call that started it, and
  the operator is stopped by then;
- :meth:`stop`/:meth:`astop` return once the manager's stop order
  (:mod:`declop.manager.shutdown`) is over: Leases released, watches and servers closed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import TracebackType
from typing import Any, Callable

from declop.errors import DeclopError
from declop.kube.transport import load_configuration
from declop.manager.options import Options
from declop.manager.process import Manager
from declop.registry import Registry, default_registry

__all__ = ["LeaseLost", "Operator"]

#: seconds between two looks at the manager's readiness while a start waits for it
_POLL = 0.02


class LeaseLost(DeclopError):
    """An embedded operator lost its Lease (leader election, or a shard range under a running
    call) and stopped, as ``declop run`` exits 1: another replica may hold it now. Start it
    again (:meth:`Operator.start`) to stand by for the Lease once more."""


class Operator:
    """One operator embedded in the calling application (see the module docstring).

    ``registry``: the handlers to run (default: the default registry, where the decorators put
    them). The apiserver: ``configuration`` (a :class:`~declop.kube.restconfig.RestConfig`), else
    ``kubeconfig``/``context`` found as ``declop run`` finds them ($KUBECONFIG, in-cluster,
    ~/.kube/config), at each start — or, when the registry has an ``@declop.on_login`` function
    and no ``configuration`` is given, what that function returns. ``options``: :class:`~declop.manager.Options` (default: ``declop run``'s,
    except that the interpreter's switch interval is left alone). ``on_lost``: called
    synchronously on the operator's loop, once, the moment a Lease is lost."""

    def __init__(
        self,
        registry: Registry | None = None,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        configuration: Any = None,
        options: Options | None = None,
        on_lost: Callable[[], None] | None = None,
        metrics: Any = None,
    ) -> None:
        self.registry = registry if registry is not None else default_registry
        #: None: read at each start from ``kubeconfig``/``context`` — unless an ``@declop.on_login``
        #: function is registered, which is asked instead (:mod:`declop.kube.login`)
        self.configuration = configuration
        self.kubeconfig, self.context = kubeconfig, context
        self.options = options if options is not None else Options(switch_interval=None)
        self.on_lost = on_lost
        #: a :class:`~declop.serving.metrics.Metrics` to record into (None: only when served)
        self.metrics = metrics
        #: the manager of the current (or last) run; None before the first
        self.manager: Manager | None = None
        #: the loop the current (or last) run runs on
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Future[None] | None = None
        self._thread: threading.Thread | None = None
        self._ended = threading.Event()
        self._ended.set()
        self._error: BaseException | None = None

    # -- state ----------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """A run began and has not ended (it may still be starting, or stopping)."""
        return not self._ended.is_set()

    def ready(self) -> bool:
        """True while the current run's caches are synced (and its webhooks registered)."""
        return self.running and self.manager is not None and self.manager.ready()

    @property
    def exit_code(self) -> int:
        """What ``declop run`` would exit with after the last run: 1 after a lost Lease or a
        failed shutdown hook, else 0."""
        return self.manager.exit_code if self.manager is not None else 0

    # -- from an event loop ---------------------------------------------------------------------
    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Run on the calling loop until ``stop`` is set (or this task is cancelled, or
        :meth:`request_stop`), then stop gracefully and return.

        Raises:
            ConfigError: the start failed (nothing else is left running).
            LeaseLost: a Lease was lost; the operator stopped.
            RuntimeError: this Operator already runs.
        """
        self._begin()
        if stop is not None:
            self._stop = stop
        self._task = asyncio.current_task()
        try:
            await self._run()
        finally:
            self._ended.set()

    async def astart(self, timeout: float | None = 30.0) -> None:
        """Start on the calling loop (as a task) and return once ready; raise the start's error
        if it fails, ``TimeoutError`` (the run is stopped) if not ready in ``timeout`` s."""
        self._begin()
        self.loop = asyncio.get_running_loop()
        self._task = asyncio.ensure_future(self._guarded())
        try:
            await self.await_ready(timeout)
        except BaseException:
            try:
                await self.astop()
            except Exception:  # noqa: S110 - the start's own error is the one raised
                pass
            raise

    async def await_ready(self, timeout: float | None = None) -> None:
        """Wait until the current run is ready; raise the run's error if it ended first. Called
        before a run began (``op.run(stop)`` scheduled as a task, not yet running), it waits for
        that run, up to ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.ready():
            task = self._task
            if task is not None and task.done():
                task.result()  # the start's error
                raise RuntimeError("the operator stopped before it was ready")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"the operator was not ready after {timeout} s (caches syncing, or the start hangs)")
            await asyncio.sleep(_POLL)

    async def astop(self) -> None:
        """Stop the run :meth:`astart` began and wait for its end; raise :class:`LeaseLost` if
        it ended after a loss (and any other error it ended with)."""
        self.request_stop()
        task = self._task
        if task is not None:
            try:
                await asyncio.shield(task)
            finally:
                self._error = None  # raised here: not again by wait() or stop()
                self._task = None

    async def __aenter__(self) -> Operator:
        await self.astart()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.astop()

    # -- from a thread --------------------------------------------------------------------------
    def start(self, timeout: float | None = 30.0) -> None:
        """Run on a new event loop in a daemon thread; return once ready (:meth:`wait_ready`).
        A start that fails raises its error here; a timeout stops the run and raises."""
        self._begin()
        started = threading.Event()
        self.loop = loop = asyncio.new_event_loop()

        async def main() -> None:
            self._task = task = asyncio.ensure_future(self._guarded())
            started.set()
            await asyncio.wait([task])
            if not task.cancelled():
                task.exception()  # kept in self._error for stop()/wait(): retrieved here

        def target() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(main())
            finally:
                loop.close()
                started.set()

        self._thread = threading.Thread(target=target, name="declop-operator", daemon=True)
        self._thread.start()
        started.wait()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self._join(None, raise_error=False)
            raise

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the current run is ready; raise the run's error if it ended first,
        ``TimeoutError`` after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.ready():
            if not self.running:
                self._raise()
                raise RuntimeError("the operator is not running: start() it first")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"the operator was not ready after {timeout} s (caches syncing, or the start hangs)")
            self._ended.wait(_POLL)

    def stop(self, timeout: float | None = None) -> None:
        """Stop gracefully (as SIGTERM stops ``declop run``) and wait for the end; raise
        :class:`LeaseLost` if the run ended after a loss. Stopping what is not running does
        nothing (but still raises a loss nobody saw yet)."""
        self._join(timeout, raise_error=True)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the run ends by itself (a loss, :meth:`request_stop`); raise its error
        (:class:`LeaseLost` …). False when still running after ``timeout`` s."""
        if not self._ended.wait(timeout):
            return False
        self._raise()
        return True

    def request_stop(self) -> None:
        """Ask the current run to stop, from any thread; returns at once."""
        loop, stop = self.loop, self._stop
        if loop is None or stop is None or self._ended.is_set():
            return
        try:
            if _on_loop(loop):
                stop.set()
            else:
                loop.call_soon_threadsafe(stop.set)
        except RuntimeError:  # the loop closed meanwhile: the run is over
            pass

    def __enter__(self) -> Operator:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # -- the run --------------------------------------------------------------------------------
    def _begin(self) -> None:
        if not self._ended.is_set():
            raise RuntimeError("this Operator already runs: stop() it before starting it again")
        self._ended.clear()
        self._error = None
        self._task = None
        self.manager = None  # ready() must not look at the last run's (synced) controllers
        self._stop = asyncio.Event()  # bound to a loop on first use: request_stop works before the run

    async def _guarded(self) -> None:
        """:meth:`_run`, its end recorded (for :meth:`stop`/:meth:`wait`) before it raises."""
        try:
            await self._run()
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            self._ended.set()

    async def _run(self) -> None:
        self.loop = asyncio.get_running_loop()
        stop = self._stop
        assert stop is not None
        configuration = self.configuration
        if configuration is None and not any(h.kind == "login" for h in self.registry.hooks):
            configuration = load_configuration(self.kubeconfig, self.context)
        self.manager = manager = Manager(configuration, self.registry, self.options, metrics=self.metrics)
        manager.on_lost = self.on_lost
        await manager.run(stop)
        if manager.loss.happened:
            raise LeaseLost(
                "the operator lost its Lease and stopped (another replica may hold it now); start it again to stand by"
            )

    def _join(self, timeout: float | None, *, raise_error: bool) -> None:
        self.request_stop()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                raise TimeoutError(f"the operator did not stop within {timeout} s")
            self._thread = None
        if raise_error:
            self._raise()

    def _raise(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
