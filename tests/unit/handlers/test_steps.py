"""declop.handlers.steps: the record's decisions, its guarded writes against the fake apiserver
(which applies JSON patches and their ``test`` ops as the apiserver does), the memory of our own
writes, and the runner the registry makes of a handler that takes ``steps``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import declop
from declop.errors import Conflict, RegistrationError, TemporaryError, TerminalError
from declop.handlers.steps import CLAIM_HOLD, Memory, Steps, Writer, decide, parse, record_key, wrap
from declop.kube.keys import Request
from declop.registry import Registry
from declop.registry.signatures import wanted_names
from declop.testing import FakeClient, run_reconcile

KEY = Request("ns", "w")
ANNOTATION = "steps.declop.dev/ctl"


def widget(generation: int = 1, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "w", "namespace": "ns", "generation": generation}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {}}


class World:
    """A fake apiserver with one object, and Steps made the way the runner makes them."""

    def __init__(self, obj: dict[str, Any] | None = None, store: str = "annotation") -> None:
        self.client = FakeClient([obj or widget()], request=KEY, primary="configmaps")
        self.memory = Memory()
        self.writer = Writer("ctl", store)
        self.now = 1_000_000.0

    def copy(self) -> dict[str, Any]:
        return self.client.get("configmaps", KEY)

    def steps(self, obj: dict[str, Any] | None = None, memory: Memory | None = None) -> Steps:
        return Steps(self.writer, self.memory if memory is None else memory, KEY, obj if obj is not None else self.copy(), self.client,
                     clock=lambda: self.now)  # fmt: skip

    def record(self) -> dict[str, dict[str, Any]]:
        return parse((self.copy()["metadata"].get("annotations") or {}).get(ANNOTATION))

    def patches(self) -> int:
        return len([w for w in self.client.server.writes if w.verb == "patch"])


# -- the record and its decisions ---------------------------------------------------------


def test_the_annotation_key_is_the_controller_name_when_valid() -> None:
    assert record_key("make_bucket") == "steps.declop.dev/make_bucket"
    odd = record_key("a name with spaces/and a slash" * 3)
    assert odd.startswith("steps.declop.dev/") and len(odd.split("/", 1)[1]) <= 63
    assert odd != record_key("a name with spaces/and a slash")


@pytest.mark.parametrize(
    ("entry", "generation", "once", "retries", "action"),
    [
        (None, 1, "generation", None, "run"),
        ({"generation": 1, "attempts": 1, "done": True}, 1, "generation", None, "skip"),
        ({"generation": 1, "attempts": 1, "done": True}, 2, "generation", None, "run"),  # a new generation
        ({"generation": 1, "attempts": 1, "done": True}, 2, "object", None, "skip"),  # once for good
        ({"generation": 1, "attempts": 3, "failed": "boom"}, 1, "generation", None, "failed"),
        ({"generation": 1, "attempts": 3, "failed": "boom"}, 2, "generation", None, "run"),
        ({"generation": 1, "attempts": 3, "failed": "boom"}, 2, "object", None, "failed"),
        ({"generation": 1, "attempts": 1, "next": "1970-01-12T13:46:50.000Z"}, 1, "generation", None, "wait"),
        ({"generation": 1, "attempts": 1, "next": "1970-01-12T13:46:30.000Z"}, 1, "generation", None, "run"),
        ({"generation": 1, "attempts": 2}, 1, "generation", 2, "give-up"),  # the last claim left no outcome
        ({"generation": 1, "attempts": 2}, 2, "generation", 2, "run"),
    ],
)
def test_decide_is_a_function_of_the_record_the_generation_and_the_clock(
    entry: Any, generation: int, once: Any, retries: Any, action: str
) -> None:
    assert decide(entry, generation, once, retries, 1_000_000.0).action == action  # 1970-01-12T13:46:40Z


def test_a_claim_counts_one_more_attempt_and_drops_the_wait() -> None:
    d = decide({"generation": 1, "attempts": 2, "next": "1970-01-01T00:00:00.000Z", "message": "x"}, 1, "generation", None, 5.0, "me")
    assert d.action == "run" and d.entry == {"generation": 1, "attempts": 3, "message": "x", "by": "me", "at": "1970-01-01T00:00:05.000Z"}
    assert decide(None, 4, "object", None, 0.0, "me").entry == {"generation": 4, "attempts": 1, "by": "me", "at": "1970-01-01T00:00:00.000Z"}


CLAIMED = {"generation": 1, "attempts": 1, "by": "other", "at": "1970-01-01T00:01:40.000Z"}  # at 100 s


@pytest.mark.parametrize(
    ("entry", "me", "now", "retries", "action"),
    [
        (CLAIMED, "me", 100.0, None, "wait"),  # another replica's step is under way: it is left to it
        (CLAIMED, "me", 100.0 + CLAIM_HOLD - 1, 1, "wait"),  # its last attempt, still under way: no give-up
        (CLAIMED, "me", 100.0 + CLAIM_HOLD, None, "run"),  # held too long: its replica died
        (CLAIMED, "me", 100.0 + CLAIM_HOLD, 1, "give-up"),
        (CLAIMED, "other", 100.0, None, "run"),  # our own claim without an outcome: that attempt failed
        ({**CLAIMED, "at": "not a time"}, "me", 100.0, None, "run"),  # unreadable: no hold
        (CLAIMED, "me", 100.0 - CLAIM_HOLD + 1, None, "wait"),  # a clock a little behind the claimer's: held
        (CLAIMED, "me", 100.0 - CLAIM_HOLD, None, "run"),  # stamped a hold or more ahead of us: not trusted
        ({**CLAIMED, "at": "9999-12-31T23:59:59.000Z"}, "me", 100.0, None, "run"),  # garbage far in the future
        ({**CLAIMED, "done": True}, "me", 100.0, None, "skip"),  # (an edit) done wins
    ],
)
def test_a_claim_without_an_outcome_is_held_for_its_replica_then_taken_over(
    entry: Any, me: str, now: float, retries: Any, action: str
) -> None:
    """Two live replicas on one key (a handover's overlap) cannot both run a step: the second
    sees the first's claim and waits for its outcome; only a claim older than the hold is a crash."""
    d = decide(entry, 1, "generation", retries, now, me)
    assert d.action == action
    if action == "wait":
        assert 0 < d.delay <= CLAIM_HOLD and "other" in d.message
    if action == "run":
        assert d.entry["attempts"] == 2 and d.entry["by"] == me


def test_an_outcome_ends_the_claim() -> None:
    """What a step's outcome writes carries no holder: nobody waits on a finished step."""
    steps = Steps(Writer("ctl"), Memory("me"), KEY, None, None)
    claim = {"generation": 1, "attempts": 1, "by": "me", "at": "1970-01-01T00:00:00.000Z"}
    for exc in (None, ValueError("boom"), TerminalError("no")):
        entry, _ = steps._after("s", claim, exc, 5.0, None, ())
        assert entry is not None and "by" not in entry and "at" not in entry


def test_a_wait_is_the_time_left_on_the_wall_clock() -> None:
    d = decide({"attempts": 1, "next": "1970-01-01T00:01:40.000Z"}, 0, "object", None, 70.0)
    assert d.action == "wait" and d.delay == pytest.approx(30.0)


def test_an_unreadable_record_counts_as_none() -> None:
    assert parse("{not json") == {} and parse(None) == {} and parse('{"a": 1, "b": {"done": true}}') == {"b": {"done": True}}


# -- the guarded writes -------------------------------------------------------------------


def test_the_first_claim_tests_that_the_record_is_missing() -> None:
    w = Writer("ctl")
    assert w.ops(widget(), None, "{}") == [
        {"op": "test", "path": "/metadata/annotations", "value": None},
        {"op": "add", "path": "/metadata/annotations", "value": {}},
        {"op": "add", "path": "/metadata/annotations/steps.declop.dev~1ctl", "value": "{}"},
    ]
    assert w.ops(widget(annotations={"a": "b"}), None, "{}")[0] == {
        "op": "test", "path": "/metadata/annotations/steps.declop.dev~1ctl", "value": None,
    }  # fmt: skip
    assert w.ops(widget(), "old", "new") == [
        {"op": "test", "path": "/metadata/annotations/steps.declop.dev~1ctl", "value": "old"},
        {"op": "replace", "path": "/metadata/annotations/steps.declop.dev~1ctl", "value": "new"},
    ]


def test_in_the_status_the_record_is_an_object_under_status_steps() -> None:
    w = Writer("ctl", "status")
    obj = {**widget(), "status": {"ready": True}}
    assert w.ops(obj, None, {"a": {}}) == [
        {"op": "test", "path": "/status/steps", "value": None},
        {"op": "add", "path": "/status/steps", "value": {}},
        {"op": "add", "path": "/status/steps/ctl", "value": {"a": {}}},
    ]
    assert w.read({"status": {"steps": {"ctl": {"a": {"done": True}}}}}) == {"a": {"done": True}}
    assert w.subresource() == "status"


def test_a_step_runs_once_per_generation_and_a_done_step_sends_nothing() -> None:
    world, runs = World(), []
    assert world.steps().run("create", lambda: runs.append(1) or "made") == "made"
    assert runs == [1] and world.patches() == 2  # the claim, then the outcome
    assert world.record() == {"create": {"generation": 1, "attempts": 1, "done": True}}
    assert world.steps().run("create", lambda: runs.append(2)) is None
    assert runs == [1] and world.patches() == 2  # done: no write
    world.client.patch("configmaps", KEY, {"data": {"size": "2"}})  # a change of the body: generation 2
    world.steps().run("create", lambda: runs.append(3))
    assert runs == [1, 3] and world.record()["create"]["generation"] == 2


def test_once_per_object_survives_a_new_generation() -> None:
    world, runs = World(), []
    world.steps().run("init", lambda: runs.append(1), once="object")
    world.client.patch("configmaps", KEY, {"data": {"size": "5"}})
    world.steps().run("init", lambda: runs.append(2), once="object")
    assert runs == [1]


def test_a_stale_copy_after_our_own_write_decides_on_what_we_wrote() -> None:
    world, runs = World(), []
    stale = world.copy()
    world.steps(stale).run("create", lambda: runs.append(1))
    writes = world.patches()
    world.steps(stale).run("create", lambda: runs.append(2))  # the older copy wakes the handler again
    assert runs == [1] and world.patches() == writes  # no second run, no conflict, no write
    world.steps().run("create", lambda: runs.append(3))  # the cache caught up: memory is dropped
    assert runs == [1] and len(world.memory) == 0


def test_a_stale_copy_on_another_replica_is_refused_by_the_guard() -> None:
    world, runs = World(), []
    stale = world.copy()
    world.steps(stale).run("create", lambda: runs.append(1))
    with pytest.raises(Conflict, match="nothing ran"):
        world.steps(stale, memory=Memory()).run("create", lambda: runs.append(2))  # it knows nothing of our write
    assert runs == [1]


def test_an_older_copy_with_a_claim_in_it_is_refused_too() -> None:
    world, runs = World(), []
    claimed: list[dict[str, Any]] = []

    def step() -> None:
        claimed.append(world.copy())  # the object with our claim, before the outcome
        runs.append(1)

    world.steps().run("create", step)
    other = Memory()  # another replica, whose cache still shows our claim without its outcome
    with pytest.raises(TemporaryError, match="claimed by") as waits:  # our step may be under way: it waits
        world.steps(claimed[0], memory=other).run("create", lambda: runs.append(2))
    assert 0 < waits.value.delay <= CLAIM_HOLD
    world.now += CLAIM_HOLD  # held too long (as if we had died): it claims, and the guard refuses the old copy
    with pytest.raises(Conflict):
        world.steps(claimed[0], memory=other).run("create", lambda: runs.append(2))
    assert runs == [1]


def test_two_replicas_at_once_run_a_step_once() -> None:
    """The overlap of a handover: the second replica's copy shows the first's claim (no outcome
    yet) while the first's step runs; it waits for that outcome instead of taking the claim over."""
    world, runs, other = World(), [], Memory()

    def step() -> None:
        with pytest.raises(TemporaryError, match="claimed by"):
            world.steps(memory=other).run("create", lambda: runs.append(2))  # under way here, meanwhile
        runs.append(1)

    world.steps().run("create", step)
    world.steps(memory=other).run("create", lambda: runs.append(3))  # the outcome is in: done
    assert runs == [1] and world.record()["create"] == {"generation": 1, "attempts": 1, "done": True}


def test_give_up_after_n_attempts() -> None:
    world = World()

    def boom() -> None:
        raise RuntimeError("no bucket")

    for attempt in (1, 2):
        with pytest.raises(RuntimeError, match="no bucket"):  # backoff=None: the rate limiter's retry
            world.steps().run("create", boom, retries=3)
        assert world.record()["create"]["attempts"] == attempt
    with pytest.raises(TerminalError, match="failed for good after 3 attempts: no bucket"):
        world.steps().run("create", boom, retries=3)
    assert world.record()["create"]["failed"] == "3 attempts: no bucket"
    with pytest.raises(TerminalError, match="failed for good"):  # and so it stays, without a write
        writes = world.patches()
        world.steps().run("create", boom, retries=3)
    assert world.patches() == writes


def test_a_claim_without_an_outcome_counts_as_an_attempt() -> None:
    record = json.dumps({"create": {"generation": 1, "attempts": 2}})
    world, runs = World(widget(annotations={ANNOTATION: record})), []
    with pytest.raises(TerminalError, match="2 attempts"):
        world.steps().run("create", lambda: runs.append(1), retries=2)
    assert runs == [] and world.record()["create"]["failed"].startswith("2 attempts")


def test_a_backoff_is_recorded_as_wall_clock_time_and_waited_for() -> None:
    world, runs = World(), []

    def flaky() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("not yet")

    with pytest.raises(TemporaryError) as info:
        world.steps().run("create", flaky, backoff=lambda attempt: 10.0 * attempt)
    assert info.value.delay == 10.0 and isinstance(info.value.__cause__, RuntimeError)
    assert world.record()["create"]["next"] == "1970-01-12T13:46:50.000Z"
    world.now += 4  # a restart: new memory, same record
    with pytest.raises(TemporaryError) as waited:
        world.steps(memory=Memory()).run("create", flaky, backoff=10)
    assert waited.value.delay == pytest.approx(6.0) and runs == [1]
    world.now += 6
    world.steps(memory=Memory()).run("create", flaky, backoff=10)
    assert runs == [1, 1] and world.record()["create"] == {"generation": 1, "attempts": 2, "done": True}


def test_a_temporary_error_of_the_step_sets_its_delay() -> None:
    world = World()

    def later() -> None:
        raise TemporaryError("quota", delay=42)

    with pytest.raises(TemporaryError) as info:
        world.steps().run("create", later)
    assert info.value.delay == 42.0 and world.record()["create"]["message"] == "quota"


@pytest.mark.parametrize("error", [ValueError("bad spec"), TerminalError("bad spec")])
def test_a_permanent_error_fails_the_step_for_good_at_once(error: Exception) -> None:
    world = World()

    def bad() -> None:
        raise error

    with pytest.raises(TerminalError, match="failed for good: bad spec"):
        world.steps().run("create", bad, permanent=(ValueError,))
    assert world.record()["create"] == {"generation": 1, "attempts": 1, "failed": "bad spec"}


def test_removing_the_record_runs_every_step_again() -> None:
    world, runs = World(), []
    world.steps().run("a", lambda: runs.append("a"), once="object")
    world.steps().run("a", lambda: runs.append("a2"), once="object")
    world.client.patch("configmaps", KEY, [{"op": "remove", "path": "/metadata/annotations/steps.declop.dev~1ctl"}], type="json")
    world.steps().run("a", lambda: runs.append("a3"), once="object")
    assert runs == ["a", "a3"]


def test_a_failed_step_stops_the_steps_after_it() -> None:
    world, runs = World(), []

    def handler(steps: Steps) -> None:
        steps.run("one", lambda: runs.append(1))
        steps.run("two", lambda: 1 / 0, backoff=5)
        steps.run("three", lambda: runs.append(3))

    with pytest.raises(TemporaryError):
        handler(world.steps())
    assert runs == [1] and set(world.record()) == {"one", "two"}


def test_the_steps_of_a_gone_object_do_not_run() -> None:
    world, runs = World(), []
    assert Steps(world.writer, world.memory, KEY, None, world.client).run("a", lambda: runs.append(1)) is None
    assert runs == []


def test_a_misused_step_says_how() -> None:
    steps = World().steps()
    with pytest.raises(ValueError, match="once="):
        steps.run("a", lambda: None, once="always")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="retries="):
        steps.run("a", lambda: None, retries=0)
    with pytest.raises(TypeError, match="permanent="):
        steps.run("a", lambda: None, permanent=("ValueError",))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="await steps.arun"):
        Steps(Writer("ctl"), Memory(), KEY, widget(), None, is_async=True).run("a", lambda: None)


def test_arun_awaits_the_step() -> None:
    world, runs = World(), []

    async def step() -> str:
        runs.append(1)
        return "ok"

    async def main() -> Any:
        steps = Steps(world.writer, world.memory, KEY, world.copy(), world.client.aio, is_async=True)
        first = await steps.arun("a", step)
        return first, await steps.arun("a", step)

    assert asyncio.run(main()) == ("ok", None) and runs == [1]


# -- the runner the registry makes ----------------------------------------------------------


def test_a_handler_without_steps_is_registered_as_it_is() -> None:
    def plain(request: Any) -> None: ...

    assert wrap(plain, "plain", wanted_names) == (plain, frozenset({"request"}))


def test_a_handler_with_steps_gets_them_and_only_the_names_it_declares() -> None:
    registry, seen = Registry(), []

    @declop.reconciler("configmaps", registry=registry)
    def make(name: str, steps: Steps) -> None:
        seen.append(name)
        steps.run("hello", lambda: seen.append("ran"))

    reg = registry.registrations[0]
    assert make.__name__ == "make" and reg.fn is not make and reg.wants == {"name", "request", "obj", "client", "logger"}
    outcome = run_reconcile(make, "ns/w", [widget()], registry=registry)
    assert outcome.ok and seen == ["w", "ran"] and len(outcome.writes_of("patch")) == 2
    again = run_reconcile(make, "ns/w", registry=registry, client=outcome.client)
    assert again.ok and seen == ["w", "ran", "w"] and again.writes_of("patch") == []


def test_registering_the_same_handler_twice_is_harmless() -> None:
    registry = Registry()

    def h(steps: Steps) -> None: ...

    registry.reconciler("configmaps")(h)
    registry.reconciler("configmaps")(h)
    assert len(registry) == 1


def test_the_default_of_steps_says_where_the_record_is_kept() -> None:
    def in_status(steps: Steps = "status") -> None: ...  # type: ignore[assignment]

    def nowhere(steps: Steps = "etcd") -> None: ...  # type: ignore[assignment]

    runner, _ = wrap(in_status, "s", wanted_names)
    assert runner is not in_status
    with pytest.raises(RegistrationError, match="'annotation' or 'status'"):
        Registry().reconciler("configmaps")(nowhere)


def test_an_async_handler_gets_an_async_runner() -> None:
    registry = Registry()

    @declop.reconciler("configmaps", registry=registry)
    async def make(steps: Steps) -> None:
        await steps.arun("a", asyncio.sleep, once="object")  # returns a coroutine: awaited

    assert registry.registrations[0].is_async
    assert asyncio.iscoroutinefunction(registry.registrations[0].fn)


def test_the_handlers_own_parameters_pass_through_run_reconcile() -> None:
    registry, seen = Registry(), []

    @declop.reconciler("configmaps", registry=registry)
    def make(steps: Steps, now: float = 0.0) -> None:
        steps.run("stamp", lambda: seen.append(now))

    assert run_reconcile(make, "ns/w", [widget()], registry=registry, kwargs={"now": 7.0}).ok and seen == [7.0]
    with pytest.raises(TypeError, match="no parameter 'later'"):
        run_reconcile(make, "ns/w", [widget()], registry=registry, kwargs={"later": 1})


def test_declop_rbac_grants_the_writes_of_the_record() -> None:
    registry = Registry()

    @declop.reconciler("configmaps", registry=registry)
    def annotated(steps: Steps) -> None: ...

    @declop.reconciler("widgets.example.com", registry=registry)
    def in_status(steps: Steps = "status") -> None: ...  # type: ignore[assignment]

    @declop.reconciler("secrets", registry=registry)
    def plain(request: Any) -> None: ...

    verbs = {(g.resource, g.verb) for g in registry.grants()}
    assert ("configmaps", "patch") in verbs and ("widgets/status", "patch") in verbs
    assert ("secrets", "patch") not in verbs


from declop.typed.crd import definitions  # noqa: E402 - the typed case below loads pydantic
from declop.typed.model import CustomResource  # noqa: E402


class Knob(CustomResource, group="example.com", version="v1", kind="Knob"):
    spec: dict[str, str] = {}


KNOBS = Registry()
turned: list[int | None] = []


@declop.reconciler(Knob, registry=KNOBS)
def turn(obj: Knob, steps: Steps) -> None:
    steps.run("turn", lambda: turned.append(obj.metadata.generation))


def test_a_typed_handler_keeps_its_record_as_a_dict_handler_does() -> None:
    knob = {"apiVersion": "example.com/v1", "kind": "Knob", "metadata": {"name": "k", "namespace": "ns"}, "spec": {}}
    first = run_reconcile(turn, "ns/k", [definitions([Knob])[0], knob], registry=KNOBS)
    again = run_reconcile(turn, "ns/k", registry=KNOBS, client=first.client)
    assert first.ok and again.ok and turned == [1] and again.writes == ()
    stored = first.client.get("knobs.example.com", "ns/k")["metadata"]["annotations"]["steps.declop.dev/turn"]
    assert json.loads(stored) == {"turn": {"generation": 1, "attempts": 1, "done": True}}


class Lines:
    def __init__(self) -> None:
        self.errors: list[tuple[str, Any]] = []

    def error(self, msg: str, *, exc_info: Any = None, **pairs: Any) -> None:
        self.errors.append((msg, exc_info))


def test_a_failure_retried_after_its_backoff_is_logged_with_its_traceback_once() -> None:
    world, lines = World(), Lines()

    def boom() -> None:
        raise RuntimeError("no bucket")

    def steps() -> Steps:
        return Steps(world.writer, world.memory, KEY, world.copy(), world.client, lines, clock=lambda: world.now)

    with pytest.raises(TemporaryError):
        steps().run("a", boom, backoff=5)
    assert [m for m, _ in lines.errors] == ["Step 'a' failed"] and isinstance(lines.errors[0][1], RuntimeError)
    with pytest.raises(RuntimeError):
        steps().run("b", boom)  # backoff=None: the outcome table logs it, with its traceback
    with pytest.raises(TerminalError):
        steps().run("c", boom, retries=1)  # logged there too: the TerminalError chains it
    assert len(lines.errors) == 1
