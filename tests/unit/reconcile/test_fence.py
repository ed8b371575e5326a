"""declop.reconcile._fence and the controller's fenced writes: once a call has started, every write
made for it — the handler's own through its client, our finalizer add and release — is checked
against the call's Lease just before it is sent (the leader Lease, or the Lease of its range;
draining does not fence). A refused write raises ``declop.Fenced``, nothing is sent, and the
call is settled as fenced: no retry, no backoff, one WARNING, result ``fenced``.

Without an apiserver: a real WorkQueue on a fake clock, a real Store, and a transport that
records requests and applies the write fence as the real one does (its own behaviour is
tests/unit/kube/test_fencing.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

import pytest

import declop
from declop.cache.store import Store, Writer
from declop.clock import FakeClock
from declop.kube import fencing
from declop.kube.discovery import ResourceInfo
from declop.kube.keys import Request
from declop.leases.shards import ShardSet
from declop.queue.ratelimit import ItemExponential
from declop.queue.workqueue import WorkQueue
from declop.reconcile.controller import ControllerMetrics
from declop.reconcile.controller import Controller, Source
from declop.reconcile._fence import lease_of
from declop.reconcile.mapping import enqueue_self

CM = ResourceInfo(group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True)
KEY = Request("ns", "a")
FINALIZER = "x.io/f"
FENCED_LINE = "Write fenced; the call ended and the key is left to the Lease's new owner"


class Informer:
    def __init__(self) -> None:
        self.store = Store("configmaps")
        self.writer = Writer(self.store)
        self.namespace, self.name, self.resource = "", "configmaps", CM
        self.synced = asyncio.Event()
        self.last_error, self.syncing, self.lists = "", False, 1
        self.subscribers: list[Any] = []

    def subscribe(self, handler: Any) -> None:
        self.subscribers.append(handler)


class Transport:
    """Records what is sent; applies the write fence first, as the real transport does."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        if method != "GET":
            fencing.check(method, path)
        self.sent.append((method, path))
        return {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "2", "uid": "u1", "finalizers": [FINALIZER]}}


class Context:
    def __init__(self) -> None:
        self.transport = Transport()
        self.recorder = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the sync client's loop, set by process()


class Metrics(ControllerMetrics):
    def __init__(self) -> None:
        self.results: list[str] = []

    def reconciled(self, controller: str, result: str, seconds: float) -> None:
        self.results.append(result)


class Elector:
    """A range's or the leader's LeaderElector, as far as fences go."""

    def __init__(self, name: str = "ops-leader", is_leader: bool = True, open: bool = True) -> None:
        self.name, self.namespace = name, "ops"
        self.is_leader, self.open = is_leader, open

    def valid(self) -> bool:
        return self.is_leader and self.open

    def live(self) -> bool:
        return self.is_leader and self.open


def make(
    handler: Any, *, finalizer: str | None = None, fence: Callable[[], bool] | None = None,
    shards: Callable[[str], ShardSet] | None = None,
) -> tuple[Controller, Informer]:
    registry = declop.registry.Registry()
    registry.reconciler("configmaps", finalizer=finalizer)(handler)
    reg = registry.registrations[0]
    informer = Informer()
    c = Controller(reg, CM, [Source((informer,), enqueue_self, primary=True)], Context(), metrics=Metrics(), fence=fence, shards=shards and shards(reg.name))  # type: ignore[arg-type]
    c.queue = WorkQueue(name=reg.name, rate_limiter=ItemExponential(), clock=FakeClock())
    return c, informer


def cm(name: str = "a", **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1", "uid": "u1", **meta}}


def process(c: Controller, keys: list[Request]) -> None:
    async def go() -> None:
        c.ctx.loop = asyncio.get_running_loop()
        await c.process(keys)

    asyncio.run(go())


def sent(c: Controller) -> list[tuple[str, str]]:
    return c.ctx.transport.sent  # type: ignore[attr-defined, no-any-return]


def results(c: Controller) -> list[str]:
    return c.metrics.results  # type: ignore[attr-defined, no-any-return]


def fenced_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == FENCED_LINE]


def assert_left(c: Controller, key: Request = KEY) -> None:
    """Not retried here, no backoff: the key is done until an event brings it back."""
    assert c.queue.num_requeues(key) == 0 and c.queue.next_deadline() is None and len(c.queue) == 0


# -- the handler's own writes ----------------------------------------------------------------------


def test_a_plain_handler_s_write_after_its_lease_expired_is_not_sent_and_the_call_is_settled_as_fenced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The call started under a valid Lease; the process then stood still past the renew deadline
    (the fence closes on its own clock) and the handler goes on to write: refused, not sent."""
    leader = Elector()
    errors: list[BaseException] = []

    def handler(client: declop.Client, **_: Any) -> None:
        leader.open = False  # frozen here past the renew deadline
        try:
            client.patch(KEY, {"data": {"v": "1"}})
        except declop.Fenced as exc:
            errors.append(exc)
            raise

    c, informer = make(handler, fence=leader.valid)
    informer.writer.upsert(cm())
    with caplog.at_level(logging.WARNING):
        process(c, [KEY])
    assert sent(c) == []
    assert "Lease ops/ops-leader is not known valid" in str(errors[0]) and "ns/a is left" in str(errors[0])
    assert results(c) == ["fenced"] and c.reconciles == 1
    assert_left(c)
    lines = fenced_lines(caplog)
    assert len(lines) == 1 and lines[0].kv["error"] == str(errors[0])  # type: ignore[attr-defined]


def test_several_fenced_writes_of_one_call_log_one_line_even_when_the_handler_swallows_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A handler that catches broadly changes nothing: every later write is refused too, and the
    call is still settled as fenced, once — not retried as an error, not a success."""
    leader = Elector()

    async def handler(client: declop.AsyncClient, **_: Any) -> None:
        leader.open = False
        for v in ("1", "2", "3"):
            try:
                await client.patch(KEY, {"data": {"v": v}})
            except Exception:  # noqa: BLE001 - the careless handler under test
                pass
        await client.event(cm(), "Done", "done")  # no recorder here: nothing to send

    c, informer = make(handler, fence=leader.valid)
    informer.writer.upsert(cm())
    with caplog.at_level(logging.WARNING):
        process(c, [KEY])
    assert sent(c) == []
    assert results(c) == ["fenced"] and len(fenced_lines(caplog)) == 1
    assert_left(c)


def test_writes_before_the_fence_closed_were_sent_and_the_rest_were_not() -> None:
    leader = Elector()

    def handler(client: declop.Client, **_: Any) -> None:
        client.patch(KEY, {"data": {"v": "1"}})
        leader.open = False
        client.patch(KEY, {"data": {"v": "2"}})
        client.patch(KEY, {"data": {"v": "3"}})  # never reached

    c, informer = make(handler, fence=leader.valid)
    informer.writer.upsert(cm())
    process(c, [KEY])
    assert sent(c) == [("PATCH", "/api/v1/namespaces/ns/configmaps/a")]
    assert results(c) == ["fenced"]


def test_an_open_fence_lets_every_write_through() -> None:
    leader = Elector()

    def handler(client: declop.Client, **_: Any) -> None:
        client.patch(KEY, {"data": {"v": "1"}})
        client.delete(Request("ns", "other"))

    c, informer = make(handler, fence=leader.valid)
    informer.writer.upsert(cm())
    process(c, [KEY])
    assert [m for m, _ in sent(c)] == ["PATCH", "DELETE"] and results(c) == ["success"]


def test_without_leader_election_or_shards_a_call_has_no_fence_and_nothing_is_checked() -> None:
    seen: list[Any] = []

    def handler(client: declop.Client, **_: Any) -> None:
        seen.append(fencing.current())
        client.patch(KEY, {"data": {"v": "1"}})

    c, informer = make(handler)
    informer.writer.upsert(cm())
    process(c, [KEY])
    assert seen == [None] and len(sent(c)) == 1 and results(c) == ["success"]


def test_each_call_of_a_batch_writes_under_its_own_fence_and_none_leaks_after_it() -> None:
    """Plain handlers run several keys per thread hop: the fence is set around each call and
    reset after it, so the thread carries none once the batch is over."""
    leader = Elector()
    seen: list[Any] = []

    def handler(name: str, **_: Any) -> None:
        seen.append(fencing.current())

    c, informer = make(handler, fence=leader.valid)
    keys = [Request("ns", n) for n in "abc"]
    for k in keys:
        informer.writer.upsert(cm(k.name))

    async def go() -> Any:
        c.ctx.loop = asyncio.get_running_loop()
        await c.process(keys)
        return await asyncio.get_running_loop().run_in_executor(None, fencing.current)

    after = asyncio.run(go())
    assert [f.key for f in seen] == keys and len({id(f) for f in seen}) == 3
    assert after is None


# -- the finalizer writes the controller makes for the call ----------------------------------------


def test_our_finalizer_patch_is_fenced_too() -> None:
    """The start check passed; by the time the finalizer patch goes out the Lease is not valid:
    the patch is not sent and the handler never sees CREATED."""
    answers = iter([True])  # the start check; every later one finds the Lease expired
    called: list[str] = []
    c, informer = make(lambda name, **_: called.append(name), finalizer=FINALIZER, fence=lambda: next(answers, False))
    informer.writer.upsert(cm())
    process(c, [KEY])
    assert called == [] and sent(c) == []
    assert results(c) == ["fenced"]
    assert_left(c)


def test_the_release_after_a_cleanup_whose_lease_expired_is_not_sent_and_not_retried() -> None:
    """The cleanup ran, but the Lease expired before our finalizer release: the object keeps it,
    and the new owner runs the cleanup again (it must be idempotent anyway)."""
    leader = Elector()

    def cleanup(**_: Any) -> None:
        leader.open = False

    c, informer = make(cleanup, finalizer=FINALIZER, fence=leader.valid)
    informer.writer.upsert(cm(finalizers=[FINALIZER], deletionTimestamp="2026-01-01T00:00:00Z"))
    process(c, [KEY])
    assert sent(c) == [] and results(c) == ["fenced"]
    assert_left(c)


def test_a_fenced_cleanup_that_returned_normally_does_not_release_the_finalizer() -> None:
    """A handler that swallowed ``Fenced`` returns None: the call is still fenced, and the release
    is not even attempted."""
    leader = Elector()
    checks: list[bool] = []

    def valid() -> bool:
        checks.append(leader.valid())
        return checks[-1]

    def cleanup(client: declop.Client, **_: Any) -> None:
        leader.open = False
        try:
            client.patch(KEY, {"data": {"cleaned": "yes"}})
        except declop.Fenced:
            pass

    c, informer = make(cleanup, finalizer=FINALIZER, fence=valid)
    informer.writer.upsert(cm(finalizers=[FINALIZER], deletionTimestamp="2026-01-01T00:00:00Z"))
    process(c, [KEY])
    assert sent(c) == [] and results(c) == ["fenced"]


# -- sharded mode: the range's Lease -------------------------------------------------------------


def sharded(handler: Any) -> tuple[Controller, Informer, ShardSet]:
    electors = [Elector(f"ops-widgets-shard-{i}-of-4", is_leader=False) for i in range(4)]
    c, informer = make(handler, shards=lambda name: ShardSet(name, 4, "uid", electors))  # type: ignore[arg-type]
    assert c.shards is not None
    shards = c.shards
    return c, informer, shards


def uid_in(shards: ShardSet, index: int) -> str:
    return next(f"uid-{i}" for i in range(10_000) if shards.index(f"uid-{i}") == index)


def test_a_draining_range_lets_its_call_write_and_a_lost_one_does_not() -> None:
    """Draining only stops new calls (the in-flight ones finish, then the Lease is released):
    their writes go out. A lost range's Lease is not valid: its call's writes are refused."""
    outcome: dict[str, Any] = {}

    def handler(name: str, client: declop.Client, **_: Any) -> None:
        elector = shards.electors[shards.index(uid)]
        if name == "drained":
            shards.draining.add(shards.index(uid))
        else:
            elector.open = False  # type: ignore[attr-defined]
        client.patch(Request("ns", name), {"data": {"v": "1"}})

    c, informer, shards = sharded(handler)
    uid = uid_in(shards, 2)
    shards.electors[2].is_leader = True
    informer.writer.upsert(cm("drained", uid=uid))
    process(c, [Request("ns", "drained")])
    outcome["drained"] = (list(sent(c)), list(results(c)))
    informer.writer.upsert(cm("lost", uid=uid))
    shards.draining.clear()
    process(c, [Request("ns", "lost")])
    assert outcome["drained"] == ([("PATCH", "/api/v1/namespaces/ns/configmaps/drained")], ["success"])
    assert sent(c) == [("PATCH", "/api/v1/namespaces/ns/configmaps/drained")], "the lost range's write was not sent"
    assert results(c) == ["success", "fenced"]
    assert shards.in_flight == {}


def test_a_sharded_call_is_fenced_by_its_own_range_s_lease() -> None:
    c, informer, shards = sharded(lambda **_: None)
    for e in shards.electors:
        e.is_leader = True
    call_fence = c.gate.write_fence(KEY, 3)
    assert call_fence is not None and call_fence.lease == "ops/ops-widgets-shard-3-of-4"
    assert call_fence.valid() is True
    shards.electors[3].open = False  # type: ignore[attr-defined]
    assert call_fence.valid() is False and c.gate.write_fence(KEY, 2).valid() is True  # type: ignore[union-attr]


def test_the_leader_fence_names_the_elector_s_lease() -> None:
    leader = Elector()
    assert lease_of(leader.valid) == "ops/ops-leader"
    assert lease_of(lambda: True) == "of the leader"
    assert lease_of(None) == "of the leader"
    half = Elector()
    half.namespace = None  # type: ignore[assignment]  # a name alone does not make a Lease's name
    assert lease_of(half.valid) == "of the leader"
    c, _ = make(lambda **_: None)
    assert c.gate.write_fence(KEY, -1) is None, "no Lease: nothing to check"


class _Range:
    """A range's elector: held and valid while ``open``."""

    def __init__(self, open_: bool) -> None:
        self.open, self.name, self.namespace = open_, "range", "default"

    def valid(self) -> bool:
        return self.open


@pytest.mark.parametrize("shard_by", ["namespace", "uid"])
def test_a_key_dropped_at_the_fence_owes_a_deletion_only_when_its_object_is_not_cached(shard_by: str) -> None:
    """Gate.owned: a key of a range not ours is dropped; when its object is gone from the cache
    (a deletion), the range keeps a tombstone, owed to it if it becomes ours again; an object
    still cached owes nothing (its owner reconciles it)."""
    from declop.reconcile._fence import Gate
    from declop.reconcile._keys import KeyNotes, PrimaryCache

    shards = ShardSet("c", 4, shard_by, [_Range(False) for _ in range(4)])  # type: ignore[arg-type]
    gate = Gate(None, shards, shard_by == "uid", lambda: None, logging.getLogger("t"), "c")
    informer = Informer()
    cached, gone = Request("ns-a", "cached"), Request("ns-b", "gone")
    Writer(informer.store).upsert({"apiVersion": "v1", "kind": "ConfigMap",
                                   "metadata": {"name": "cached", "namespace": "ns-a", "uid": "u1", "resourceVersion": "1"}})
    assert gate.book is not None
    if gate.book.uids is not None:  # by uid: both uids were seen in events before
        gate.book.uids.update({cached: "u1", gone: "u2"})
    queue: WorkQueue[Request] = WorkQueue(name="c", rate_limiter=ItemExponential(), clock=FakeClock())
    ranges: dict[Request, int] = {}
    kept = gate.owned([cached, gone], ranges, PrimaryCache([informer]), KeyNotes(), queue)
    assert kept == [] and ranges == {}
    owed = {k for keys in gate.book.tombstones.values() for k in keys}
    assert owed == {gone}


def test_the_gate_s_four_answers_are_told_apart_a_stop_is_not_a_fence() -> None:
    """Gate.may_start: callers dispatch on the answer (a FENCED one logs the closed leader fence
    and counts the keys it stopped; a STOPPING one only drops them), so the four differ, and a
    stopping gate says STOPPING even when the leader fence has closed meanwhile."""
    from declop.reconcile._fence import FENCED, GO, SKIP, STOPPING, Gate

    assert len({GO, SKIP, STOPPING, FENCED}) == 4 and GO == 0  # GO is the only falsy answer
    open_ = [True]
    gate = Gate(lambda: open_[0], None, False, lambda: None, logging.getLogger("t"), "c")
    assert gate.may_start(-1, False) == GO
    open_[0] = False
    assert gate.may_start(-1, False) == FENCED
    gate.stopping = True
    assert gate.may_start(-1, False) == STOPPING
    assert gate.may_start(-1, True) == FENCED  # the first call a worker took is judged by the fence
