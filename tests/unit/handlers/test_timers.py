"""Timers (declop/handlers/timers.py): the grid, idle, first sighting, failures — with a fake wall clock."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest

import declop
from declop.clock import FakeClock
from declop.errors import Fenced, RegistrationError, TerminalError
from declop.kube import fencing
from declop.kube.fencing import WriteFence
from declop.handlers.timers import Schedule, TimerRunner, current_tick, fingerprint
from declop.kube.keys import Request
from declop.reconcile.result import Result
from declop.reconcile.trigger import Trigger
from declop.registry import Registry
from declop.testing import run_reconcile

CREATED = 1_800_000_000.0  # a whole second, as creationTimestamp has it
KEY = Request("default", "w1")


def widget(uid: str = "u1", created: float = CREATED, **extra: Any) -> dict[str, Any]:
    stamp = datetime.datetime.fromtimestamp(created, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    obj: dict[str, Any] = {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w1", "namespace": "default", "uid": uid, "creationTimestamp": stamp, "resourceVersion": "1"},
        "spec": {"size": 1},
    }
    obj.update(extra)
    return obj


def delay(seconds: float) -> Any:
    """Matches the Result of a re-arm after ``seconds``."""

    class Delay:
        def __eq__(self, other: object) -> bool:
            return isinstance(other, Result) and other.requeue_after == pytest.approx(seconds)

        def __repr__(self) -> str:
            return f"Result(requeue_after~{seconds})"

    return Delay()


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def _add(self, level: str, msg: str, **pairs: Any) -> None:
        self.lines.append((level, msg, pairs))

    def debug(self, msg: str, **pairs: Any) -> None:
        self._add("debug", msg, **pairs)

    def warning(self, msg: str, **pairs: Any) -> None:
        self._add("warning", msg, **pairs)

    def error(self, msg: str, **pairs: Any) -> None:
        self._add("error", msg, **pairs)


class Harness:
    """A runner around a recording function, called as the controller calls it."""

    def __init__(self, clock: FakeClock, fail: Any = None, **schedule: Any) -> None:
        self.ticks: list[tuple[int | None, float]] = []
        self.fail = fail
        self.clock = clock

        def fn(name: str, obj: dict[str, Any]) -> None:
            self.ticks.append((current_tick(), clock()))
            if self.fail is not None:
                raise self.fail

        self.runner = TimerRunner(fn, Schedule(**schedule), name="t", wants=frozenset({"name", "obj"}), clock=clock)
        self.log = Log()

    def reconcile(self, obj: dict[str, Any] | None, trigger: Trigger | None = None) -> Any:
        return self.runner.handler(request=KEY, name=KEY.name, obj=obj, logger=self.log, trigger=trigger or Trigger())

    def fired(self) -> list[int | None]:
        return [k for k, _ in self.ticks]


def test_ticks_sit_on_the_grid_anchored_on_creation_and_the_delay_is_to_the_next_point() -> None:
    clock = FakeClock(CREATED + 0.5)
    h = Harness(clock, interval=10)
    result = h.reconcile(widget())
    assert h.fired() == []  # tick 0 (at creation) was before this replica took the key
    assert result == delay(9.5)
    clock.advance(9.5)
    result = h.reconcile(widget())
    assert h.fired() == [1]
    assert result == delay(10)


def test_initial_delay_moves_the_anchor_and_tick_zero_fires_then() -> None:
    clock = FakeClock(CREATED + 0.2)
    h = Harness(clock, interval=10, initial_delay=3)
    assert h.reconcile(widget()) == delay(2.8)
    clock.advance(2.8)
    h.reconcile(widget())
    assert h.fired() == [0]


def test_lateness_does_not_shift_the_grid() -> None:
    clock = FakeClock(CREATED + 1)
    h = Harness(clock, interval=10)
    h.reconcile(widget())
    clock.now = CREATED + 13  # 3 s late
    result = h.reconcile(widget())
    assert h.fired() == [1]
    assert result == delay(7)  # the next point is still CREATED + 20
    assert list(h.runner.lateness) == [pytest.approx(3)]


def test_a_spurious_or_duplicated_reconcile_never_fires_a_tick_twice() -> None:
    clock = FakeClock(CREATED + 1)
    h = Harness(clock, interval=10)
    h.reconcile(widget())
    clock.now = CREATED + 10
    for _ in range(5):
        h.reconcile(widget())
        clock.advance(1)
    assert h.fired() == [1]


def test_events_between_ticks_only_rearm() -> None:
    clock = FakeClock(CREATED + 1)
    h = Harness(clock, interval=10)
    h.reconcile(widget())
    clock.now = CREATED + 5
    changed = widget(spec={"size": 2})
    assert h.reconcile(changed) == delay(5)
    assert h.fired() == []


def test_missed_points_are_not_replayed_only_the_newest_due_fires() -> None:
    clock = FakeClock(CREATED + 1)
    h = Harness(clock, interval=10)
    h.reconcile(widget())
    clock.now = CREATED + 45  # points 1, 2, 3, 4 passed
    h.reconcile(widget())
    assert h.fired() == [4]


def test_first_sighting_fires_the_first_point_at_or_after_it() -> None:
    clock = FakeClock(CREATED + 20)  # a replica taking over exactly on a grid point
    h = Harness(clock, interval=10)
    h.reconcile(widget())
    assert h.fired() == [2]
    clock.now = CREATED + 300.5  # another replica takes over between points
    h2 = Harness(clock, interval=10)
    assert h2.reconcile(widget()) == delay(9.5)
    assert h2.fired() == []


def test_a_gained_shard_range_takes_the_key_over_afresh() -> None:
    clock = FakeClock(CREATED + 1)
    h = Harness(clock, interval=10)
    h.reconcile(widget())
    clock.now = CREATED + 10
    h.reconcile(widget())
    # the range went to another replica and came back at 35.5: ticks 2 and 3 were the other's
    clock.now = CREATED + 35.5
    h.reconcile(widget(), Trigger(sources=(("shard-gained", 1),)))
    assert h.fired() == [1]
    clock.now = CREATED + 40
    h.reconcile(widget())
    assert h.fired() == [1, 4]


def test_a_recreated_object_starts_a_new_grid() -> None:
    clock = FakeClock(CREATED + 1)
    h = Harness(clock, interval=10)
    h.reconcile(widget())
    clock.now = CREATED + 100
    h.reconcile(widget(uid="u2", created=CREATED + 99))
    assert h.fired() == []  # its tick 0 was before the sighting; tick 1 at CREATED + 109
    clock.now = CREATED + 109
    h.reconcile(widget(uid="u2", created=CREATED + 99))
    assert h.fired() == [1]


def test_idle_waits_for_the_object_to_be_unchanged_then_fires_at_once() -> None:
    clock = FakeClock(CREATED + 1)
    h = Harness(clock, interval=10, idle=15)
    # idle counts from the first sighting: the earliest tick is at 1 + 15
    assert h.reconcile(widget()) == delay(15)
    clock.now = CREATED + 10
    h.reconcile(widget())
    assert h.fired() == []
    clock.now = CREATED + 16
    assert h.reconcile(widget()) == delay(4)
    assert h.fired() == [1]
    assert list(h.runner.lateness) == [pytest.approx(0)]  # eligible at the end of the idle wait


def test_a_change_restarts_the_idle_wait_but_status_and_resource_version_do_not() -> None:
    clock = FakeClock(CREATED + 1)
    h = Harness(clock, interval=1, idle=5)
    clock.now = CREATED + 3
    h.reconcile(widget())
    clock.now = CREATED + 6
    noise = widget(status={"ticks": 3})
    noise["metadata"]["resourceVersion"] = "9"
    noise["metadata"]["managedFields"] = [{"manager": "x"}]
    assert h.reconcile(noise) == delay(2)  # still from 3
    assert fingerprint(noise) == fingerprint(widget())
    changed = widget(spec={"size": 2})
    assert h.reconcile(changed) == delay(5)  # from 6 now
    clock.now = CREATED + 11
    h.reconcile(changed)
    assert h.fired() == [11]


def test_no_ticks_while_deleting_and_the_key_is_forgotten_once_gone() -> None:
    clock = FakeClock(CREATED + 1)
    h = Harness(clock, interval=10)
    h.reconcile(widget())
    clock.now = CREATED + 30
    deleting = widget()
    deleting["metadata"]["deletionTimestamp"] = "2027-01-15T08:00:30Z"
    assert h.reconcile(deleting) is None
    assert h.reconcile(None) is None
    assert h.fired() == []
    assert KEY not in h.runner.keys


def test_a_failing_tick_raises_for_backoff_and_is_retried_until_it_succeeds() -> None:
    clock = FakeClock(CREATED + 1)
    h = Harness(clock, RuntimeError("flaky"), interval=10)
    h.reconcile(widget())
    clock.now = CREATED + 10
    with pytest.raises(RuntimeError):
        h.reconcile(widget())
    clock.now = CREATED + 11
    h.fail = None
    h.reconcile(widget())
    assert h.fired() == [1, 1]  # the retry is the same tick
    clock.now = CREATED + 12
    h.reconcile(widget())
    assert h.fired() == [1, 1]


def test_a_tick_failing_until_the_next_point_is_skipped_into_it() -> None:
    clock = FakeClock(CREATED + 1)
    h = Harness(clock, RuntimeError("down"), interval=10)
    h.reconcile(widget())
    clock.now = CREATED + 10
    with pytest.raises(RuntimeError):
        h.reconcile(widget())
    clock.now = CREATED + 21
    h.fail = None
    h.reconcile(widget())
    assert h.fired() == [1, 2]


def test_a_terminal_error_ends_the_tick_and_arms_the_next() -> None:
    clock = FakeClock(CREATED + 1)
    h = Harness(clock, TerminalError("no"), interval=10)
    h.reconcile(widget())
    clock.now = CREATED + 10
    assert h.reconcile(widget()) == delay(10)
    assert h.reconcile(widget()) == delay(10)
    assert h.fired() == [1]
    assert [line[1] for line in h.log.lines if line[0] == "error"] == ["Timer tick failed (terminal, not retried)"]


def test_a_tick_whose_lease_is_no_longer_valid_when_it_is_due_does_not_fire() -> None:
    clock = FakeClock(CREATED + 1)
    h = Harness(clock, interval=10)
    h.reconcile(widget())
    clock.now = CREATED + 10
    valid = [False]
    fence = WriteFence(lambda: valid[0], "ns/lease", KEY)
    token = fencing.enter(fence)
    try:
        with pytest.raises(Fenced, match="timer tick 1 of default/w1 was not sent"):
            h.reconcile(widget())
        assert h.fired() == [] and fence.tripped is not None  # the controller settles it as fenced
        valid[0] = True
        h.reconcile(widget())
    finally:
        fencing.leave(token)
    assert h.fired() == [1]


def test_an_async_function_runs_as_a_coroutine() -> None:
    clock = FakeClock(CREATED + 10)
    seen: list[int | None] = []

    async def fn(obj: dict[str, Any]) -> None:
        seen.append(current_tick())

    runner = TimerRunner(fn, Schedule(interval=5), name="t", wants=frozenset({"obj"}), clock=clock)
    result = asyncio.run(runner.handler(request=KEY, obj=widget(), logger=Log(), trigger=Trigger()))
    assert seen == [2]
    assert result == delay(5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"interval": 0}, "interval must be a number of seconds > 0"),
        ({"interval": -1}, "interval must be a number of seconds > 0"),
        ({"interval": 1, "idle": -1}, "idle must be a number of seconds >= 0"),
        ({"interval": 1, "initial_delay": float("nan")}, "initial_delay must be"),
        ({"interval": 1, "finalizer": "x/y"}, "@timer got an unknown option finalizer="),
        ({"interval": 1, "intervall": 2}, "intervall"),
    ],
)
def test_bad_options_are_refused_in_one_line(options: dict[str, Any], message: str) -> None:
    with pytest.raises(RegistrationError, match=message.replace("(", r"\(")):
        declop.timer("widgets", registry=Registry(), **options)


def test_the_decorator_returns_the_function_and_registers_a_runner() -> None:
    registry = Registry()

    @declop.timer("widgets", interval=60, idle=5, labels={"app": "x"}, registry=registry)
    def tick(name: str, logger: Any) -> None:
        pass

    (first,) = registry.registrations
    assert first.labels == "app=x"
    again = registry.timer("widgets", interval=60, idle=5)(tick)  # a module imported twice: the newest is kept
    assert tick.__name__ == "tick" and again is tick
    (reg,) = registry.registrations
    assert reg.name == "tick" and reg.resource == "widgets" and reg.labels == "" and not reg.is_async
    runner = reg.fn.__self__
    assert isinstance(runner, TimerRunner) and runner.fn is tick and runner.wants == {"name", "logger"}
    assert reg.wants == {"name", "logger", "request", "obj", "trigger"}  # the function's and the runner's own
    assert runner.schedule == Schedule(60, 5, None)


def test_another_function_under_a_timer_name_taken_is_refused() -> None:
    registry = Registry()
    registry.timer("widgets", interval=1, name="t")(lambda name: None)
    with pytest.raises(RegistrationError, match="a controller named 't' is already registered"):
        registry.timer("widgets", interval=1, name="t")(lambda name, obj: None)


def test_a_timer_refuses_arguments_declop_does_not_pass() -> None:
    with pytest.raises(RegistrationError, match="takes 'spec', which Kopf passes and declop does not"):
        declop.timer("widgets", interval=1, registry=Registry())(lambda spec: None)


def test_through_the_controller_the_tick_runs_and_the_key_is_requeued() -> None:
    registry = Registry()
    calls: list[str] = []
    obj = widget(created=1_000_000_000.0)

    @registry.timer("widgets", interval=3600)
    def hourly(name: str) -> None:
        calls.append(name)

    outcome = run_reconcile(registry.registrations[0], KEY, [obj], resources=[_WIDGETS])
    assert outcome.action == "requeue_after" and 0 < (outcome.requeue_after or 0) <= 3600
    assert calls == []  # a first sighting between two points fires nothing


_WIDGETS = {"name": "widgets", "group": "example.com", "version": "v1", "kind": "Widget", "namespaced": True}
