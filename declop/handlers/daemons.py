"""Daemons: one long-running task per object, kept by an ordinary reconciler (``@declop.daemon``).

A daemon registration is a :class:`~declop.reconcile.registration.Registration` whose handler is
the *supervisor step* of :class:`DaemonRunner` (:meth:`DaemonRunner.step`), run by the ordinary
:class:`~declop.reconcile.controller.Controller`: filters, predicates, key ownership (the leader,
or the owner of the key's shard range), the write fence and retries are the controller's. The
step looks at the cached object alone (never at the event): while the object exists, is not being
deleted and is in the filter, it makes sure the key's daemon runs; otherwise (``DELETING``, gone,
left the ``labels=``/``fields=`` filter) it sets the daemon's stop flag, waits up to
``stop_timeout``, cancels an ``async def`` daemon, and returns only once the daemon has ended —
so the controller releases the finalizer only after that. A daemon that will not end (a thread
ignoring its flag) makes the step raise :class:`DaemonStillRunning`: retried with backoff, the
finalizer stays.

A *keeper* (a background hook on every replica, :meth:`DaemonRunner.keep`) opens the runner when
the caches synced and, at the stop's drain (before any Lease is released), stops every daemon and
ends only when they ended: while one runs, the manager counts it as left running and does not
release the leader Lease. No daemon starts before the keeper runs or after it began to stop.

Invariants (per manager; docs/daemons.md says why they give "at most one per object"):
- at most one daemon per key runs in a manager: a key's record is replaced only once its daemon
  has ended (task done and, for a plain ``def``, its thread returned);
- a daemon runs in the context of a :class:`~declop.kube.fencing.WriteFence` of its own over
  the Lease of the call that started it: its writes are refused once that Lease is not known
  valid, as a reconcile's are;
- sharded, a running daemon counts as a call in flight in its key's range from its start until
  it ended (``ShardSet.begin``/``end``), so a drained range is released only after its daemons
  ended; a range that starts draining or is lost stops its daemons at once (``on_dropped``);
- a daemon that raises is restarted in place after ``backoff`` seconds (an exception's own
  ``delay`` attribute wins), as long as its stop flag is not set; one that returns is done until
  the object's ``metadata.generation`` changes (counted per replica: a restart or a handover
  starts it again).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import math
import threading
import weakref
from typing import Any, Callable

from declop.errors import DeclopError, NotFound, RegistrationError
from declop.hints import did_you_mean
from declop.kube import fencing
from declop.kube.fencing import WriteFence
from declop.kube.keys import Request
from declop.kube.labels import parse_selector
from declop.lifecycle import Hook, make_hook
from declop.logs import ReconcileLogger
from declop.reconcile.client import AsyncClient, Client
from declop.reconcile.finalizers import contains_finalizer, release_finalizer
from declop.reconcile.registration import Registration
from declop.reconcile.result import Phase, Result

__all__ = ["DAEMON_INJECTABLE", "DaemonRunner", "DaemonStillRunning", "check_timing", "daemon_wants", "default_finalizer", "make_daemon"]

#: keyword arguments a daemon may declare
DAEMON_INJECTABLE = frozenset({"request", "name", "namespace", "client", "logger", "stop", "retry", "current"})

#: seconds an ``async def`` daemon gets to return once cancelled (after ``stop_timeout``)
CANCEL_SETTLE = 1.0

#: the prefix of a daemon's default finalizer: ``daemons.declop.dev/<name>``
FINALIZER_PREFIX = "daemons.declop.dev/"

log = logging.getLogger("declop.daemons")


class DaemonStillRunning(DeclopError):
    """A daemon did not end within ``stop_timeout`` (and, async, the cancellation that followed):
    the supervisor step fails, so the finalizer stays and the key is retried with backoff."""


def default_finalizer(name: str) -> str:
    """``daemons.declop.dev/<name>``: the finalizer a daemon named ``name`` holds by default."""
    return FINALIZER_PREFIX + name


class Daemon:
    """One key's daemon in one manager: its task (and thread), stop flag, fence and range."""

    __slots__ = ("key", "generation", "task", "thread", "halt", "flag", "gone", "scope", "retry", "finished", "book", "observer")

    def __init__(self, key: Request, generation: Any, is_async: bool, scope: Any, book: _Book | None = None) -> None:
        self.key, self.generation, self.scope, self.book = key, generation, scope, book
        self.task: asyncio.Task[None] | None = None
        self.thread: threading.Thread | None = None  # a plain def's, while it runs
        #: set when the daemon should end (also ends a backoff or initial delay at once)
        self.halt = asyncio.Event()
        #: the flag the function gets as ``stop``: ``halt`` itself, or a threading.Event for a thread
        self.flag: asyncio.Event | threading.Event = self.halt if is_async else threading.Event()
        #: set once the task is done and no thread of it runs
        self.gone = asyncio.Event()
        self.retry = 0  # crashes in a row
        self.finished = False  # the function returned: done for this generation
        self.observer: Callable[[str, Request], None] | None = None

    def request_stop(self) -> None:
        self.halt.set()
        if self.flag is not self.halt:
            self.flag.set()  # type: ignore[union-attr]

    @property
    def stopping(self) -> bool:
        return self.halt.is_set()


class _Book:
    """The daemons of one registration in one manager (keyed by its client context)."""

    __slots__ = ("daemons", "open", "closed", "hooked", "stoppers", "__weakref__")

    def __init__(self) -> None:
        self.daemons: dict[Request, Daemon] = {}
        self.open = False  # the keeper runs: daemons may start
        self.closed = False  # the keeper began to stop: none starts any more
        self.hooked: list[Any] = []  # ShardSets whose on_dropped we listen to
        self.stoppers: set[asyncio.Task[Any]] = set()


class DaemonRunner:
    """Runs one ``@declop.daemon`` function: the supervisor step and the keeper."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        *,
        wants: frozenset[str] | None,
        stop_timeout: float,
        backoff: float,
        initial_delay: float | None,
        finalizer: str | None = None,
        selector: Callable[[Any], bool] | None = None,
        client_for: Callable[[Any, Request, bool], Any] | None = None,
    ) -> None:
        self.fn, self.name, self.wants = fn, name, wants
        #: the registration's finalizer: released here when the object left the filter
        self.finalizer = finalizer
        #: the ``labels=`` filter (None without one, or with ``fields=``: then the finalizer of
        #: an object that left the filter is not released)
        self.selector = selector
        #: the daemon's client, made from the step's: ``(client, key, is_async)``
        self.client_for = client_for or _client_for
        self.is_async = inspect.iscoroutinefunction(fn)
        self.stop_timeout, self.backoff, self.initial_delay = stop_timeout, backoff, initial_delay
        self._books: weakref.WeakKeyDictionary[Any, _Book] = weakref.WeakKeyDictionary()
        #: daemons started so far, for tests and statistics
        self.starts = 0
        #: called with ("start", key) as each run of the function begins (in the daemon's task)
        #: and ("end", key) once a daemon ended: the simulator's check that no two run at once
        self.observer: Callable[[str, Request], None] | None = None

    def book(self, ctx: Any) -> _Book:
        b = self._books.get(ctx)
        if b is None:
            b = self._books[ctx] = _Book()
        return b

    def running(self, ctx: Any) -> list[Request]:
        """Keys whose daemon has not ended, in the manager of ``ctx``."""
        return [k for k, d in self.book(ctx).daemons.items() if not d.gone.is_set()]

    # -- the supervisor step (the Registration's handler) ------------------------------------------
    async def step(self, request: Request, obj: Any, phase: Phase, client: Any, logger: Any) -> Result | None:
        """Make the key's daemon match the cached object: running while it exists, is not being
        deleted and is in the filter (``obj`` is None once it left it); ended otherwise, before
        this returns."""
        book = self.book(client._ctx)
        d = book.daemons.get(request)
        if obj is None or phase in (Phase.DELETING, Phase.DELETED):
            if d is not None and not await self.stop_one(d):
                raise DaemonStillRunning(
                    f"daemon {self.name!r} of {request} did not end within stop_timeout={self.stop_timeout:g} s"
                    + (" and its cancellation" if self.is_async else " (a thread: it must return when stop is set)")
                    + "; retried with backoff, the finalizer stays until it ends"
                )
            if d is not None and book.daemons.get(request) is d:
                del book.daemons[request]  # also a finished one: its object is gone
            if obj is None and self.finalizer is not None and self.selector is not None:
                await self._release_left(request, client)
            return None
        if not book.open or book.closed:
            return Result(requeue_after=1.0)  # the keeper is not running (starting, or stopping)
        generation = (obj.get("metadata") or {}).get("generation")
        if d is not None:
            if not d.gone.is_set():
                return Result(requeue_after=0.5) if d.stopping else None  # runs, or is still ending
            if d.finished and d.generation == generation:
                return None  # returned: done until the generation changes
            if book.daemons.get(request) is d:
                del book.daemons[request]
        self._start(book, request, generation, client)
        return None

    async def _release_left(self, request: Request, client: Any) -> None:
        """The object may have left the ``labels=`` filter, and its daemon ended: read it (one GET,
        not a cache, which a sharded replica may not hold whole) and, when it exists out of the
        filter, release our finalizer, or a later delete would wait for ever on a controller that
        no longer sees the object. Back in the filter, it is added again."""
        assert self.finalizer is not None and self.selector is not None
        try:
            left = await client.live.get(request)
        except NotFound:
            return  # deleted: the finalizer went with it
        if self.selector((left.get("metadata") or {}).get("labels")):
            return  # still in the filter (our cache lags, or it was deleted meanwhile): not ours to judge
        if contains_finalizer(left, self.finalizer):
            await release_finalizer(client._ctx.transport, client.primary, left, self.finalizer)

    def _start(self, book: _Book, key: Request, generation: Any, client: Any) -> Daemon:
        """Start the daemon of ``key`` under a write fence of its own over the current call's Lease."""
        call_fence = fencing.current()
        scope = None if call_fence is None else call_fence.scope
        d = Daemon(key, generation, self.is_async, scope, book)
        book.daemons[key] = d
        if scope is not None:
            shards, index = scope
            shards.begin(index)  # a daemon is a call in flight of its range until it ended
            self._listen(book, shards)
        own = None if call_fence is None else WriteFence(call_fence.valid, call_fence.lease, key, scope)
        ctx = contextvars.copy_context()
        ctx.run(fencing.enter, own)
        logger = ReconcileLogger(
            logging.getLogger(f"declop.daemon.{self.name}"),
            {"daemon": self.name, "namespace": key.namespace, "name": key.name},
        )
        dclient = self.client_for(client, key, self.is_async)
        self.starts += 1
        d.task = asyncio.get_running_loop().create_task(self._life(d, dclient, logger), name=f"daemon {self.name} {key}", context=ctx)
        d.task.add_done_callback(lambda _: _maybe_gone(d))
        d.observer = self.observer
        return d

    async def _life(self, d: Daemon, client: Any, logger: Any) -> None:
        """Run the function until it returns or its stop flag is set; restart it after a crash."""
        if self.initial_delay and await _stopped_within(d, self.initial_delay):
            return
        key = d.key

        def current() -> Any:
            try:
                return client.get(key)
            except NotFound:
                return None

        available = {
            "request": key, "name": key.name, "namespace": key.namespace, "client": client,
            "logger": logger, "stop": d.flag, "current": current,
        }  # fmt: skip
        while not d.stopping:
            available["retry"] = d.retry
            kwargs = available if self.wants is None else {k: v for k, v in available.items() if k in self.wants}
            logger.info("Daemon starting", retry=d.retry)
            if self.observer is not None:
                self.observer("start", key)
            try:
                if self.is_async:
                    await self.fn(**kwargs)
                else:
                    await self._in_thread(d, kwargs)
            except asyncio.CancelledError:
                logger.info("Daemon cancelled")
                raise
            except Exception as exc:  # noqa: BLE001 - a daemon's crash is logged and restarted
                if d.stopping:
                    logger.exception("Daemon failed while stopping")
                    return
                d.retry += 1
                delay = getattr(exc, "delay", None)
                if not (isinstance(delay, (int, float)) and not isinstance(delay, bool) and 0 <= delay < math.inf):
                    delay = self.backoff
                logger.exception(f"Daemon failed; restarting in {delay:g} s", retryIn=delay)
                if await _stopped_within(d, delay):
                    return
                continue
            d.finished = not d.stopping
            logger.info("Daemon stopped" if d.stopping else "Daemon finished; it starts again when the generation changes")
            return

    async def _in_thread(self, d: Daemon, kwargs: dict[str, Any]) -> None:
        """Run the plain function in a thread of its own (not the handlers' executor: it is long)
        with the task's context (its write fence); ``d.thread`` is set until it returned."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        ctx = contextvars.copy_context()
        fn = self.fn

        def run() -> None:
            error: BaseException | None = None
            try:
                ctx.run(fn, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the task
                error = exc
            try:
                loop.call_soon_threadsafe(_thread_ended, d, done, error)
            except RuntimeError:  # the loop is closed: the process is exiting
                pass

        d.thread = threading.Thread(target=run, name=f"daemon {self.name} {d.key}", daemon=True)
        d.thread.start()
        await done

    async def stop_one(self, d: Daemon) -> bool:
        """Set the stop flag, wait up to ``stop_timeout``, cancel an async daemon and wait
        :data:`CANCEL_SETTLE` more; True once it ended."""
        d.request_stop()
        if not await _within(d.gone.wait(), self.stop_timeout):
            if self.is_async and d.task is not None:
                d.task.cancel()
            await _within(d.gone.wait(), CANCEL_SETTLE)
        return d.gone.is_set()

    # -- handover: a range drained or lost ---------------------------------------------------------
    def _listen(self, book: _Book, shards: Any) -> None:
        """Hear of ``shards``' ranges that start draining or are lost (once per ShardSet)."""
        if any(s is shards for s in book.hooked):
            return
        book.hooked.append(shards)
        before = shards.on_dropped

        def dropped(index: int) -> None:
            if before is not None:
                before(index)
            self._dropped(book, shards, index)

        shards.on_dropped = dropped

    def _dropped(self, book: _Book, shards: Any, index: int) -> None:
        """Range ``index`` is draining or lost: stop its daemons now (the drain waits for them)."""
        for d in list(book.daemons.values()):
            if d.scope is not None and d.scope[0] is shards and d.scope[1] == index and not d.gone.is_set():
                task = asyncio.get_running_loop().create_task(self._handed_over(book, d))
                book.stoppers.add(task)
                task.add_done_callback(book.stoppers.discard)

    async def _handed_over(self, book: _Book, d: Daemon) -> None:
        await self.stop_one(d)
        await d.gone.wait()
        if book.daemons.get(d.key) is d:
            del book.daemons[d.key]  # also a finished one: the range's next owner decides

    # -- the keeper (a background hook on every replica) -------------------------------------------
    async def keep(self, client: Any, stop: asyncio.Event) -> None:
        """Open the runner; at the stop, close it, stop every daemon and return once all ended."""
        book = self.book(client._ctx)
        book.open, book.closed = True, False
        try:
            await stop.wait()
        except asyncio.CancelledError:  # a Lease was lost: cancelled at once, like background tasks
            book.closed = True
            await self._cancel_all(book)
            raise
        book.closed = True
        await self._stop_all(book)

    async def _stop_all(self, book: _Book) -> None:
        daemons = [d for d in book.daemons.values() if not d.gone.is_set()]
        try:
            await asyncio.gather(*(self.stop_one(d) for d in daemons))
        except asyncio.CancelledError:  # the stop's grace is over (or a Lease was lost): cancel now
            await self._cancel_all(book)
            raise
        await self._cancel_all(book)  # also any a drain's stop still waits for

    async def _cancel_all(self, book: _Book) -> None:
        """Stop and cancel every daemon at once; return once all ended. Until then the manager
        counts the keeper as running and leaves the leader Lease to expire rather than release it."""
        daemons = [d for d in book.daemons.values() if not d.gone.is_set()]
        for d in daemons:
            d.request_stop()
            if d.task is not None and self.is_async:
                d.task.cancel()
        while True:
            left = [d for d in daemons if not d.gone.is_set()]
            if not left:
                break
            try:
                await left[0].gone.wait()
            except asyncio.CancelledError:
                # a thread (or a task deaf to cancellation) still runs: the keeper must keep
                # counting as running, so the stop leaves the Lease to expire (then exits)
                log.warning("A daemon does not end; its Lease is left to expire", extra={"kv": {"daemon": self.name, "key": str(left[0].key)}})
        book.daemons.clear()


def _client_for(client: Any, key: Request, is_async: bool) -> Any:
    """A client of the daemon's flavour bound to the same key and caches as the step's — with
    no object read (the step's was a snapshot: a typed status write reads the cache instead)."""
    return (AsyncClient if is_async else Client)(client._ctx, client.primary, key, client.controller, client._own, None)


def _maybe_gone(d: Daemon) -> None:
    """Once the task is done and no thread of it runs: the daemon ended (its range is free of
    it; a finished one stays in its book, to be started again only for a new generation)."""
    if d.gone.is_set() or d.task is None or not d.task.done() or d.thread is not None:
        return
    d.gone.set()
    if d.observer is not None:
        d.observer("end", d.key)
    if d.scope is not None:
        shards, index = d.scope
        shards.end(index)
    book = d.book
    if book is not None and book.daemons.get(d.key) is d and not d.finished:
        del book.daemons[d.key]


def _thread_ended(d: Daemon, done: asyncio.Future[None], error: BaseException | None) -> None:
    d.thread = None
    if not done.done():
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)
    _maybe_gone(d)


async def _within(aw: Any, seconds: float) -> bool:
    try:
        await asyncio.wait_for(aw, seconds)
        return True
    except asyncio.TimeoutError:
        return False


async def _stopped_within(d: Daemon, seconds: float) -> bool:
    """Wait ``seconds`` unless the daemon is told to stop first; True if it was."""
    return await _within(d.halt.wait(), seconds)


def daemon_wants(fn: Callable[..., Any], name: str) -> frozenset[str] | None:
    """The names ``fn`` declares among :data:`DAEMON_INJECTABLE` (None with ``**kwargs``)."""
    wants: set[str] = set()
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            return None
        if p.kind is p.VAR_POSITIONAL:
            continue
        if p.name in DAEMON_INJECTABLE:
            wants.add(p.name)
        elif p.default is p.empty:
            hint = {"stopped": "declop passes stop", "obj": "read it with current() (the latest cached copy)",
                    "body": "read it with current() (the latest cached copy)", "spec": "read current()['spec']"}.get(p.name)
            hint = hint or did_you_mean(p.name, DAEMON_INJECTABLE) or ""
            raise RegistrationError(
                f"daemon {name!r} takes an unknown argument {p.name!r}: {hint + '; ' if hint else ''}"
                f"a daemon may declare {', '.join(sorted(DAEMON_INJECTABLE))}"
            )
    return frozenset(wants)


def check_timing(stop_timeout: Any, backoff: Any, initial_delay: Any) -> None:
    """Refuse a ``stop_timeout``, ``backoff`` or ``initial_delay`` that is not a number of seconds >= 0."""
    for what, value in (("stop_timeout", stop_timeout), ("backoff", backoff), ("initial_delay", initial_delay)):
        if value is None and what == "initial_delay":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise RegistrationError(f"@daemon: {what} must be a finite number of seconds >= 0, got {value!r}")


def make_daemon(
    fn: Callable[..., Any],
    name: str,
    resource: str,
    settled: dict[str, Any],
    *,
    stop_timeout: float,
    backoff: float,
    initial_delay: float | None,
) -> tuple[Registration, Hook]:
    """The Registration (its handler: the supervisor step) and the keeper hook of a daemon.

    ``settled`` is :meth:`~declop.registry.options.ReconcilerOptions.settled`'s canonical options
    (``finalizer`` among them: a string or None)."""
    check_timing(stop_timeout, backoff, initial_delay)
    runner = DaemonRunner(
        fn, name, wants=daemon_wants(fn, name), stop_timeout=float(stop_timeout), backoff=float(backoff),
        initial_delay=None if initial_delay is None else float(initial_delay), finalizer=settled.get("finalizer"),
        selector=parse_selector(settled["labels"]) if settled.get("labels") and not settled.get("fields") else None,
    )  # fmt: skip
    registration = Registration(
        fn=runner.step, name=name, resource=resource, is_async=True,
        wants=frozenset({"request", "obj", "phase", "client", "logger"}), **settled,
    )  # fmt: skip
    hook = make_hook(runner.keep, "background", name=f"daemons of {name}", every_replica=True)
    return registration, hook
