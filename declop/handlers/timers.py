"""Timers: call a function every ``interval`` seconds per object, on the replica that owns it.

``@declop.timer("widgets", interval=60, idle=None, initial_delay=None)`` wraps the user's function
in a :class:`TimerRunner`, whose :attr:`~TimerRunner.handler` is the ``fn`` of an ordinary
:class:`~declop.reconcile.registration.Registration`: the controller runs it like any reconciler,
so filters, predicates, priority, key ownership (the leader, or the owner of the key's shard
range), the write fence and rate-limited retries apply unchanged. On each reconcile of a key the
runner decides from state alone — the cached object, what it remembers of the key, the clock —
whether a tick is due, calls the function only then, and returns
``Result(requeue_after=...)`` for the next one. An event between two ticks only re-arms.

The schedule (:class:`Schedule`, :meth:`Schedule.decide`):

- ticks sit on a grid anchored on the object's ``metadata.creationTimestamp`` (wall clock, whole
  seconds) plus ``initial_delay``: tick ``k`` (``k >= 0``) is due at ``anchor + k * interval``.
  Lateness never shifts the grid, so drift does not accumulate; each tick's lateness (seconds
  from the moment it became eligible to the call) is logged and kept (:attr:`TimerRunner.lateness`);
- a replica fires a tick only if its grid point is at or after the moment it *took* the key (its
  first reconcile of it, or the first after it gained the key's shard range again): ticks due
  while no replica owned the key are not replayed;
- it remembers, in memory, the last grid index it fired per key; a reconcile fires the newest
  due index only if it is greater, so a spurious or duplicated reconcile never fires a tick twice;
- with ``idle``, a due tick waits until the object has been unchanged for ``idle`` seconds,
  counted from the last change this replica saw (a fingerprint of the object without ``status``,
  ``resourceVersion`` and ``managedFields``) or from when it took the key; then the newest due
  tick fires at once;
- a tick whose function raises is not counted as fired: the exception goes to the controller,
  which retries the key with its backoff; a retry after the next grid point fires that one
  instead (the failed tick is skipped). :class:`~declop.errors.TerminalError` ends the tick: it
  is logged, counted as fired, and the next tick is armed;
- no tick while ``metadata.deletionTimestamp`` is set; none once the object is gone (what the
  runner remembers of the key is dropped then).

Why no tick is doubled across replicas: a replica fires a tick only if its Lease's fence is
still open *after* it read the clock that made the tick due (the call's write fence,
:mod:`declop.kube.fencing`, checked again here: a process stopped between the controller's
:meth:`~declop.reconcile._fence.Gate.may_start` and the decision fires nothing), and that fence
closes a margin (``lease_duration - renew_deadline``) before another replica can take the Lease;
the new owner fires only grid points at or after it took the key. The bound assumes the
replicas' wall clocks differ by less than that margin. docs/timers.md states the guarantees and bounds.
"""

from __future__ import annotations

import collections
import contextvars
import hashlib
import inspect
import json
import math
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Mapping

from declop import clock as clocks
from declop.clock import Clock
from declop.errors import RegistrationError, TerminalError
from declop.kube import fencing
from declop.reconcile.result import Result

__all__ = ["Schedule", "TimerRunner", "current_tick", "fingerprint"]

#: the trigger source a controller notes on every key of a shard range it gained
GAINED = "shard-gained"
#: the shortest re-arm: ``Result(requeue_after=0)`` would mean "no requeue"
_MIN_DELAY = 0.001
#: grid arithmetic tolerance: a wake-up a hair before its grid point still counts as on it
_EPSILON = 1e-6

_TICK: contextvars.ContextVar[int | None] = contextvars.ContextVar("declop_timer_tick", default=None)


def current_tick() -> int | None:
    """The grid index of the tick being run (inside a timer's function), else None."""
    return _TICK.get()


def _seconds(value: Any, what: str, *, zero: bool) -> float | None:
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero):
        floor = ">= 0" if zero else "> 0"
        raise RegistrationError(f"{what} must be a number of seconds {floor}, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class Schedule:
    """A timer's schedule: ``interval`` (seconds > 0), ``idle`` and ``initial_delay`` (seconds
    >= 0, or None). Checked when made: a bad value raises :class:`~declop.errors.RegistrationError`."""

    interval: float
    idle: float | None = None
    initial_delay: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "interval", _seconds(self.interval, "interval", zero=False))
        object.__setattr__(self, "idle", _seconds(self.idle, "idle", zero=True))
        object.__setattr__(self, "initial_delay", _seconds(self.initial_delay, "initial_delay", zero=True))

    def anchor(self, created: float) -> float:
        """The wall-clock time of tick 0 for an object created at ``created``."""
        return created + (self.initial_delay or 0.0)

    def index(self, anchor: float, now: float) -> int:
        """The newest grid index due at ``now`` (-1 before tick 0)."""
        if now + _EPSILON < anchor:
            return -1
        return math.floor((now - anchor) / self.interval + _EPSILON)

    def first(self, anchor: float, took: float) -> int:
        """The first grid index at or after ``took``: the first a replica that took the key then may fire."""
        if took <= anchor:
            return 0
        return math.ceil((took - anchor) / self.interval - _EPSILON)

    def decide(self, anchor: float, fired: int, changed: float, now: float) -> tuple[int | None, float, float]:
        """``(tick, wake, eligible)``: the grid index to fire now (None: none is due) given the last
        fired index ``fired`` and the last change at ``changed``; when to look again (the wall-clock
        time of the next possible tick, assuming ``tick`` fires); and when ``tick`` became eligible
        (its grid point, or the end of the idle wait), to measure its lateness."""
        due = self.index(anchor, now)
        idle_end = -math.inf if self.idle is None else changed + self.idle
        if due > fired:
            grid = anchor + due * self.interval
            if now + _EPSILON >= idle_end:
                nxt = anchor + (due + 1) * self.interval
                return due, max(nxt, idle_end), max(grid, idle_end)
            return None, idle_end, math.inf
        nxt = anchor + (fired + 1) * self.interval
        return None, max(nxt, idle_end), math.inf


def fingerprint(obj: Mapping[str, Any]) -> str:
    """What counts as a change for ``idle``: the object without ``status``,
    ``metadata.resourceVersion`` and ``metadata.managedFields`` (so a status write, the timer's own
    included, is not a change)."""
    body = {k: v for k, v in obj.items() if k != "status"}
    meta = body.get("metadata")
    if isinstance(meta, Mapping):
        body["metadata"] = {k: v for k, v in meta.items() if k not in ("resourceVersion", "managedFields")}
    raw = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(raw.encode(), digest_size=16).hexdigest()


def created_at(obj: Mapping[str, Any]) -> float | None:
    """``metadata.creationTimestamp`` as seconds since the epoch (None when absent or unreadable)."""
    raw = (obj.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class _Key:
    """What one replica remembers of one key: the object's uid, when it took the key, the last
    fired grid index, and the last change it saw (fingerprint and when)."""

    __slots__ = ("uid", "anchor", "took", "fired", "print", "changed")

    def __init__(self, uid: str, anchor: float, took: float, fired: int, print_: str) -> None:
        self.uid, self.anchor, self.took, self.fired = uid, anchor, took, fired
        self.print, self.changed = print_, took


class TimerRunner:
    """One timer: the user's function ``fn`` and its :class:`Schedule`, run per key.

    :attr:`handler` is the registration's ``fn``: ``async def`` when ``fn`` is, else plain (the
    controller runs it in its executor). It takes every injectable keyword and passes ``fn`` only
    those in ``wants`` (None: all), with ``obj`` as the typed view of ``model`` when one is given.
    ``clock`` is the wall clock (seconds since the epoch), injectable for tests.

    Invariants: per key, the fired index only grows while the runner remembers the key; a tick
    is fired at most once per replica; what the runner remembers of a key is dropped when its
    object is gone and reset when the key's shard range is gained again.
    """

    #: the injectable names the runner itself reads (its registration declares them and the function's)
    NEEDS = frozenset({"request", "obj", "logger", "trigger"})

    def __init__(
        self,
        fn: Callable[..., Any],
        schedule: Schedule,
        *,
        name: str,
        wants: frozenset[str] | None = None,
        model: Any = None,
        clock: Clock | None = None,
        keep: int = 100_000,
    ) -> None:
        self.fn, self.schedule, self.name = fn, schedule, name
        self.wants, self.model = wants, model
        self._clock = clock
        self.keys: dict[Any, _Key] = {}
        #: the lateness (seconds) of the most recent ticks fired, newest last
        self.lateness: collections.deque[float] = collections.deque(maxlen=keep)
        self.fired = 0  # ticks whose function was called
        self._lock = threading.Lock()  # plain handlers' calls run in several executor threads
        self.handler: Callable[..., Any] = self._async if inspect.iscoroutinefunction(fn) else self._sync

    def now(self) -> float:
        return self._clock() if self._clock is not None else clocks.WALL_CLOCK()

    # -- the decision ---------------------------------------------------------------------------
    def plan(self, key: Any, obj: Mapping[str, Any] | None, gained: bool = False) -> tuple[int | None, float | None, float]:
        """``(tick, delay, lateness)`` for one reconcile of ``key`` with its cached ``obj``: the
        grid index to fire now (None: none), the seconds until the next look (None: no requeue),
        and the tick's lateness. ``gained``: the key's shard range was just gained (it is taken
        over afresh)."""
        now = self.now()
        if obj is None:
            with self._lock:
                self.keys.pop(key, None)
            return None, None, 0.0
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return None, None, 0.0
        created = created_at(obj)
        if created is None:
            return None, None, 0.0
        schedule = self.schedule
        anchor = schedule.anchor(created)
        uid = str(meta.get("uid") or "")
        print_ = fingerprint(obj) if schedule.idle is not None else ""
        with self._lock:
            state = self.keys.get(key)
            if state is None or gained or state.uid != uid:
                state = self.keys[key] = _Key(uid, anchor, now, schedule.first(anchor, now) - 1, print_)
            elif print_ != state.print:
                state.print, state.changed = print_, now
            tick, wake, eligible = schedule.decide(anchor, state.fired, state.changed, now)
        return tick, max(wake - now, _MIN_DELAY), (now - eligible if tick is not None else 0.0)

    def fired_tick(self, key: Any, tick: int, lateness: float) -> None:
        """Record that ``tick`` of ``key`` ran (succeeded, or ended with a TerminalError)."""
        with self._lock:
            state = self.keys.get(key)
            if state is not None and tick > state.fired:
                state.fired = tick
            self.fired += 1
            self.lateness.append(lateness)

    def next_delay(self, key: Any) -> float | None:
        """Seconds until the next possible tick of ``key`` after the one just fired."""
        with self._lock:
            state = self.keys.get(key)
            if state is None:
                return None
            now = self.now()
            tick, wake, _ = self.schedule.decide(state.anchor, state.fired, state.changed, now)
        return _MIN_DELAY if tick is not None else max(wake - now, _MIN_DELAY)  # a grid point passed meanwhile

    # -- the call -------------------------------------------------------------------------------
    def _begin(self, kwargs: dict[str, Any]) -> tuple[Any, int | None, float | None, float, dict[str, Any]]:
        key, obj = kwargs["request"], kwargs.get("obj")
        trigger = kwargs.get("trigger")
        gained = trigger is not None and GAINED in trigger.names
        tick, delay, lateness = self.plan(key, obj, gained)
        if tick is None:
            return key, None, delay, 0.0, {}
        fence = fencing.current()
        if fence is not None:  # the clock was read under a valid Lease, or the tick is not ours
            fence.check("timer tick", f"{tick} of {key}")
        wants = self.wants
        given = kwargs if wants is None else {k: v for k, v in kwargs.items() if k in wants}
        if self.model is not None and "obj" in given and obj is not None:
            from declop.typed.view import view  # pydantic: loaded only by typed timers

            given["obj"] = view(self.model, obj)
        return key, tick, delay, lateness, given

    def _end(self, key: Any, tick: int, lateness: float, logger: Any, outcome: Any, error: TerminalError | None) -> Result | None:
        self.fired_tick(key, tick, lateness)
        if error is not None:
            logger.error("Timer tick failed (terminal, not retried)", exc_info=error, timer=self.name, tick=tick)
        else:
            logger.debug("Timer tick", timer=self.name, tick=tick, lateness=round(lateness, 4))
        if outcome is not None:
            logger.warning("A timer's return value is not used; return None", timer=self.name, tick=tick)
        delay = self.next_delay(key)
        return None if delay is None else Result(requeue_after=delay)

    def _sync(self, **kwargs: Any) -> Result | None:
        key, tick, delay, lateness, given = self._begin(kwargs)
        if tick is None:
            return None if delay is None else Result(requeue_after=delay)
        token = _TICK.set(tick)
        try:
            outcome = self.fn(**given)
        except TerminalError as exc:
            return self._end(key, tick, lateness, kwargs["logger"], None, exc)
        finally:
            _TICK.reset(token)
        return self._end(key, tick, lateness, kwargs["logger"], outcome, None)

    async def _async(self, **kwargs: Any) -> Result | None:
        key, tick, delay, lateness, given = self._begin(kwargs)
        if tick is None:
            return None if delay is None else Result(requeue_after=delay)
        token = _TICK.set(tick)
        try:
            outcome = await self.fn(**given)
        except TerminalError as exc:
            return self._end(key, tick, lateness, kwargs["logger"], None, exc)
        finally:
            _TICK.reset(token)
        return self._end(key, tick, lateness, kwargs["logger"], outcome, None)
