"""The controller's outcome table, phase-driven finalizer protocol and worker behaviour, without an
apiserver: a real WorkQueue on a fake clock, a real Store, and a fake transport for the finalizer
patches (the only API calls a controller itself makes)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import declop
from declop.cache.store import Store, Writer
from declop.clock import FakeClock
from declop.reconcile.controller import Controller, Source
from declop.kube.discovery import ResourceInfo
from declop.kube.keys import Request
from declop.logs import ReconcileLogger
from declop.reconcile.mapping import enqueue_self
from declop.reconcile._outcome import settle
from declop.queue.ratelimit import ItemExponential
from declop.queue.workqueue import QueueEmpty, WorkQueue

CM = ResourceInfo(group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True)
KEY = Request("ns", "a")


class FakeInformer:
    def __init__(self) -> None:
        self.store = Store("configmaps")
        self.writer = Writer(self.store)
        self.namespace = ""
        self.name = "configmaps"
        self.synced = asyncio.Event()
        self.last_error = ""
        self.subscribers: list[Any] = []
        self.resource = CM
        self.syncing = False
        self.lists = 1
        self.shard = None

    def subscribe(self, handler: Any) -> None:
        self.subscribers.append(handler)


class FakeTransport:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        self.calls.append((method, path, kw.get("body")))
        return {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "2", "finalizers": ["x.io/f"]}}


class FakeContext:
    def __init__(self) -> None:
        self.transport = FakeTransport()
        self.recorder = None


def make(handler: Any, *, finalizer: str | None = None) -> tuple[Controller, FakeInformer, FakeClock]:
    registry = declop.registry.Registry()
    registry.reconciler("configmaps", finalizer=finalizer)(handler)
    reg = registry.registrations[0]
    informer = FakeInformer()
    c = Controller(reg, CM, [Source((informer,), enqueue_self, primary=True)], FakeContext())  # type: ignore[arg-type]
    clock = FakeClock()
    c.queue = WorkQueue(name=reg.name, rate_limiter=ItemExponential(), clock=clock)
    return c, informer, clock


def cm(name: str = "a", **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1", "uid": "u1", **meta}}


def logger() -> ReconcileLogger:
    return ReconcileLogger(logging.getLogger("test"), {})


# -- the outcome table ---------------------------------------------------------------------------
def queued(c: Controller) -> list[Request]:
    out = []
    while True:
        try:
            item = c.queue.get_nowait()
        except QueueEmpty:
            return out
        out.append(item)
        c.queue.done(item)


@pytest.mark.parametrize("outcome", [None, declop.Result()])
def test_success_forgets_failures_and_does_not_requeue(outcome: Any) -> None:
    c, _, clock = make(lambda **_: None)
    c.queue.add_rate_limited(KEY)  # a previous failure
    assert c.queue.num_requeues(KEY) == 1
    clock.advance(1)
    assert queued(c) == [KEY]
    settle(c, KEY, outcome, None, logger(), 0.0)
    assert c.queue.num_requeues(KEY) == 0
    clock.advance(10_000)
    assert queued(c) == []


def test_requeue_after_forgets_then_adds_after_the_delay() -> None:
    c, _, clock = make(lambda **_: None)
    c.queue.add_rate_limited(KEY)
    clock.advance(1)
    queued(c)
    settle(c, KEY, declop.Result(requeue_after=30), None, logger(), 0.0)
    assert c.queue.num_requeues(KEY) == 0
    clock.advance(29.9)
    assert queued(c) == []
    clock.advance(0.2)
    assert queued(c) == [KEY]


def test_an_exception_requeues_with_growing_backoff() -> None:
    c, _, clock = make(lambda **_: None)
    delays = []
    for _ in range(4):
        settle(c, KEY, None, RuntimeError("x"), logger(), 0.0)
        deadline = c.queue.next_deadline()
        assert deadline is not None
        delays.append(round(deadline - clock(), 6))
        clock.advance(delays[-1])
        assert queued(c) == [KEY]
    assert delays == [0.005, 0.01, 0.02, 0.04]


def test_an_exception_wins_over_a_result() -> None:
    c, _, clock = make(lambda **_: None)
    settle(c, KEY, declop.Result(requeue_after=300), RuntimeError("x"), logger(), 0.0)
    assert c.queue.next_deadline() == pytest.approx(clock() + 0.005)


def test_a_temporary_error_comes_back_after_its_delay_and_keeps_the_backoff(caplog: pytest.LogCaptureFixture) -> None:
    c, _, clock = make(lambda **_: None)
    settle(c, KEY, None, RuntimeError("x"), logger(), 0.0)  # one failure: the next backoff is 10 ms
    clock.advance(0.005)
    queued(c)
    settle(c, KEY, None, declop.TemporaryError("bucket not ready", delay=30), logger(), 0.0)
    clock.advance(29.9)
    assert queued(c) == []
    clock.advance(0.2)
    assert queued(c) == [KEY]
    warning = next(r for r in caplog.records if r.getMessage() == "Temporary error, retrying after its delay")
    assert warning.levelname == "WARNING" and "bucket not ready" in str(getattr(warning, "kv", ""))
    settle(c, KEY, None, RuntimeError("x"), logger(), 0.0)  # the backoff goes on from where it was
    assert c.queue.next_deadline() == pytest.approx(clock() + 0.01)


def test_terminal_error_is_counted_not_retried(caplog: pytest.LogCaptureFixture) -> None:
    c, _, clock = make(lambda **_: None)
    settle(c, KEY, None, declop.TerminalError("bad spec"), logger(), 0.0)
    clock.advance(10_000)
    assert queued(c) == [] and c.queue.num_requeues(KEY) == 0
    assert "terminal" in caplog.text


def test_returning_something_else_is_terminal_with_a_hint(caplog: pytest.LogCaptureFixture) -> None:
    c, _, clock = make(lambda **_: None)
    secret = {"kind": "Secret", "metadata": {"namespace": "ns", "name": "a"}, "data": {"password": "c2VjcmV0"}}
    settle(c, KEY, secret, None, logger(), 0.0)
    clock.advance(10_000)
    assert queued(c) == [] and c.queue.num_requeues(KEY) == 0  # not retried
    assert "returned a Secret object ns/a (contents not shown) for ns/a" in caplog.text
    assert "return None or declop.Result" in caplog.text
    assert "c2VjcmV0" not in caplog.text


def test_returning_a_plain_dict_gets_the_kopf_hint_without_its_contents(caplog: pytest.LogCaptureFixture) -> None:
    """Kopf stores a returned dict in the status; declop says how it is done here."""
    c, _, clock = make(lambda **_: None)
    settle(c, KEY, {"message": "hunter2-s3cr3t", "ready": True}, None, logger(), 0.0)
    clock.advance(10_000)
    assert queued(c) == [] and c.queue.num_requeues(KEY) == 0  # terminal, not retried
    assert "returned a dict (contents not shown) for ns/a; a returned dict is stored in the status only with return_to=" in caplog.text
    assert "client.patch_status(request, {'status': {...}}) and return None" in caplog.text
    assert "hunter2-s3cr3t" not in caplog.text and "message" not in caplog.text


# -- processing a key ----------------------------------------------------------------------------
def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_phase_and_kwargs_reach_the_handler() -> None:
    seen: dict[str, Any] = {}

    def handler(request: Request, name: str, namespace: str, phase: declop.Phase, obj: Any, reconcile_id: str, logger: Any, client: Any) -> None:
        seen.update(request=request, name=name, namespace=namespace, phase=phase, obj=obj, rid=reconcile_id, client=client)

    c, informer, _ = make(handler)
    informer.writer.upsert(cm())
    run(c.process([KEY]))
    assert seen["request"] == KEY and seen["name"] == "a" and seen["namespace"] == "ns"
    assert seen["phase"] is declop.Phase.UPDATED
    assert seen["obj"] == informer.store.get(KEY) and seen["obj"] is not informer.store.get(KEY)
    assert isinstance(seen["client"], declop.Client)
    assert len(seen["rid"]) == 36


def test_missing_object_is_deleted_phase_with_none() -> None:
    seen: list[Any] = []
    c, _, _ = make(lambda phase, obj, **_: seen.append((phase, obj)))
    run(c.process([KEY]))
    assert seen == [(declop.Phase.DELETED, None)]


def test_created_adds_the_finalizer_first_with_a_guarded_json_patch() -> None:
    seen: list[Any] = []
    c, informer, _ = make(lambda phase, **_: seen.append(phase), finalizer="x.io/f")
    informer.writer.upsert(cm())
    run(c.process([KEY]))
    method, path, body = c.ctx.transport.calls[0]  # type: ignore[attr-defined]
    assert method == "PATCH" and path == "/api/v1/namespaces/ns/configmaps/a"
    assert body[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "1"}
    assert body[1] == {"op": "add", "path": "/metadata/finalizers", "value": ["x.io/f"]}
    assert seen == [declop.Phase.CREATED]


def test_deleting_removes_only_our_finalizer_after_success() -> None:
    c, informer, _ = make(lambda **_: None, finalizer="x.io/f")
    informer.writer.upsert(cm(deletionTimestamp="2026-01-01T00:00:00Z", finalizers=["other.io/g", "x.io/f"]))
    run(c.process([KEY]))
    (method, _path, body), = c.ctx.transport.calls  # type: ignore[attr-defined]
    assert method == "PATCH"
    assert body[-1] == {"op": "remove", "path": "/metadata/finalizers/1"}
    assert {"op": "test", "path": "/metadata/finalizers/1", "value": "x.io/f"} in body


def test_deleting_keeps_the_finalizer_when_cleanup_fails() -> None:
    def cleanup(**_: Any) -> None:
        raise RuntimeError("external system down")

    c, informer, _ = make(cleanup, finalizer="x.io/f")
    informer.writer.upsert(cm(deletionTimestamp="2026-01-01T00:00:00Z", finalizers=["x.io/f"]))
    run(c.process([KEY]))
    assert c.ctx.transport.calls == []  # type: ignore[attr-defined]
    assert c.queue.num_requeues(KEY) == 1


def test_our_finalizer_echo_is_not_enqueued_but_real_changes_are() -> None:
    c, informer, _ = make(lambda **_: None, finalizer="x.io/f")
    on_event = c.subscriber(c.sources[0])
    before = cm()
    informer.writer.upsert(before)
    run(c.process([KEY]))  # CREATED: our patch produced resourceVersion "2" (FakeTransport)
    after = cm(finalizers=["x.io/f"])
    after["metadata"]["resourceVersion"] = "2"
    on_event(before, after)
    assert len(c.queue) == 0
    changed = cm(finalizers=["x.io/f"], labels={"a": "b"})
    changed["metadata"]["resourceVersion"] = "3"
    on_event(after, changed)
    assert len(c.queue) == 1


def test_our_echo_arriving_before_the_patch_answer_is_still_dropped() -> None:
    """The watch event of our finalizer patch can come before the PATCH response (both come from
    the apiserver): it is held while the patch is in flight and dropped once the answer shows it
    was ours; a look-alike that was not ours is enqueued then."""
    for echo_rv, expect_queued in (("2", []), ("7", [KEY])):
        c, informer, _ = make(lambda **_: None, finalizer="x.io/f")
        on_event = c.subscriber(c.sources[0])
        before = cm()
        informer.writer.upsert(before)
        transport = c.ctx.transport  # type: ignore[attr-defined]
        answer = transport.request

        async def request(method: str, path: str, **kw: Any) -> Any:
            # the event arrives first; our patch produced resourceVersion "2"
            on_event(before, cm(finalizers=["x.io/f"], resourceVersion=echo_rv))
            return await answer(method, path, **kw)

        transport.request = request

        async def main() -> list[Request]:
            c.queue.add(KEY)
            key = c.queue.get_nowait()
            await c.process([key])
            c.queue.done(key)
            return queued(c)

        assert run(main()) == expect_queued, echo_rv
        assert c.echoes.writing == {}
        # our own event is still to come when the held one was someone else's
        assert c.echoes.own_writes == ({} if echo_rv == "2" else {("ns", "a"): "2"})


def test_a_finalizer_only_change_we_did_not_write_is_not_taken_for_our_echo() -> None:
    """Same shape as our echo, but no patch of ours produced that resourceVersion: it is real."""
    c, _, _ = make(lambda **_: None, finalizer="x.io/f")
    on_event = c.subscriber(c.sources[0])
    on_event(cm(), cm(finalizers=["x.io/f"], resourceVersion="7"))  # someone else added ours
    assert len(c.queue) == 1


def test_one_of_two_copies_of_our_finalizer_removed_by_someone_else_is_reconciled() -> None:
    c, _, _ = make(lambda **_: None, finalizer="x.io/f")
    on_event = c.subscriber(c.sources[0])
    deleting = {"deletionTimestamp": "2026-01-01T00:00:00Z"}
    on_event(cm(finalizers=["x.io/f", "x.io/f"], **deleting), cm(finalizers=["x.io/f"], resourceVersion="8", **deleting))
    assert len(c.queue) == 1


def test_a_release_of_every_duplicate_lets_the_object_go() -> None:
    seen: list[Any] = []
    c, informer, _ = make(lambda phase, **_: seen.append(phase), finalizer="x.io/f")
    informer.writer.upsert(cm(deletionTimestamp="2026-01-01T00:00:00Z", finalizers=["x.io/f", "other.io/g", "x.io/f"]))
    run(c.process([KEY]))
    (method, _path, body), = c.ctx.transport.calls  # type: ignore[attr-defined]
    assert [op["path"] for op in body if op["op"] == "remove"] == ["/metadata/finalizers/2", "/metadata/finalizers/0"]
    assert seen == [declop.Phase.DELETING]


def test_our_finalizer_taken_off_a_live_object_is_enqueued_past_predicates_and_added_back() -> None:
    registry = declop.registry.Registry()
    seen: list[Any] = []
    registry.reconciler("configmaps", finalizer="x.io/f", predicates=[declop.reconcile.predicates.generation_changed])(
        lambda phase, **_: seen.append(phase)
    )
    informer = FakeInformer()
    c = Controller(registry.registrations[0], CM, [Source((informer,), enqueue_self, (declop.reconcile.predicates.generation_changed,), primary=True)], FakeContext())  # type: ignore[arg-type]
    on_event = c.subscriber(c.sources[0])
    old = cm(generation=1, finalizers=["x.io/f"])
    taken = cm(generation=1, finalizers=[], resourceVersion="5")  # generation unchanged: predicate says no
    on_event(old, taken)
    assert queued(c) == [KEY]
    informer.writer.upsert(taken)
    run(c.process([KEY]))
    (method, _path, body), = c.ctx.transport.calls  # type: ignore[attr-defined]
    assert method == "PATCH" and {"op": "add", "path": "/metadata/finalizers", "value": ["x.io/f"]} in body
    assert seen == [declop.Phase.CREATED]
    # our own write of it coming back is still dropped
    back = cm(generation=1, finalizers=["x.io/f"], resourceVersion="2")
    on_event(taken, back)
    assert len(c.queue) == 0


def test_the_release_works_from_the_newest_cached_copy_and_ignores_the_handler_s_write() -> None:
    """The handler patches its object's status during DELETING; the release is not guarded by the
    resourceVersion the handler was given, and uses the newest copy of the same object (uid)."""
    deleting = {"deletionTimestamp": "2026-01-01T00:00:00Z"}

    def handler(**_: Any) -> None:  # someone's finalizer and our status write reach the cache first
        informer.writer.upsert(cm(finalizers=["other.io/g", "x.io/f"], resourceVersion="9", **deleting))

    c, informer, _ = make(handler, finalizer="x.io/f")
    informer.writer.upsert(cm(finalizers=["x.io/f"], **deleting))
    run(c.process([KEY]))
    (method, _path, body), = c.ctx.transport.calls  # type: ignore[attr-defined]
    assert body == [
        {"op": "test", "path": "/metadata/uid", "value": "u1"},
        {"op": "test", "path": "/metadata/finalizers/1", "value": "x.io/f"},
        {"op": "remove", "path": "/metadata/finalizers/1"},
    ]


def test_the_start_of_a_deletion_reaches_the_cleanup_past_predicates() -> None:
    """ConfigMaps have no generation: generation_changed would drop the deletionTimestamp update
    and the object would wait for its cleanup forever."""
    registry = declop.registry.Registry()
    registry.reconciler("configmaps", finalizer="x.io/f", predicates=[declop.reconcile.predicates.generation_changed])(lambda **_: None)
    informer = FakeInformer()
    c = Controller(registry.registrations[0], CM, [Source((informer,), enqueue_self, (declop.reconcile.predicates.generation_changed,), primary=True)], FakeContext())  # type: ignore[arg-type]
    on_event = c.subscriber(c.sources[0])
    live = cm(finalizers=["x.io/f"])
    on_event(live, cm(finalizers=["x.io/f"], deletionTimestamp="2026-01-01T00:00:00Z", resourceVersion="4"))
    assert queued(c) == [KEY]
    on_event(cm(labels={"a": "b"}), cm(labels={"a": "c"}, resourceVersion="5"))  # predicates still apply
    assert queued(c) == []


def test_a_cached_copy_behind_our_own_release_is_not_cleaned_up_twice() -> None:
    """The handler's status write during DELETING wakes the key again; if the cache has not seen
    our release yet, the object still shows our finalizer. It is the same object (uid), and a
    finalizer cannot come back on an object being deleted: the cleanup is not called again."""
    calls: list[Any] = []
    c, informer, _ = make(lambda phase, **_: calls.append(phase), finalizer="x.io/f")
    deleting = cm(finalizers=["x.io/f"], deletionTimestamp="2026-01-01T00:00:00Z")
    informer.writer.upsert(deleting)
    run(c.process([KEY]))
    assert calls == [declop.Phase.DELETING] and len(c.ctx.transport.calls) == 1  # type: ignore[attr-defined]
    informer.writer.upsert(cm(finalizers=["x.io/f"], deletionTimestamp="2026-01-01T00:00:00Z", resourceVersion="3"))
    run(c.process([KEY]))  # stale: the status write arrived before our release did
    assert calls == [declop.Phase.DELETING] and len(c.ctx.transport.calls) == 1  # type: ignore[attr-defined]
    assert c.queue.num_requeues(KEY) == 0
    # a namesake (new uid) being deleted is a different object: its cleanup runs
    informer.writer.upsert(cm(finalizers=["x.io/f"], deletionTimestamp="2026-01-01T00:00:00Z", uid="u2"))
    run(c.process([KEY]))
    assert calls == [declop.Phase.DELETING, declop.Phase.DELETING]


# -- the fence ---------------------------------------------------------------------------------


def test_the_fence_is_checked_before_every_call_inside_a_batch() -> None:
    """Plain handlers run up to 64 keys per thread hop: the fence must stop the batch between two
    calls, not only before the hop."""
    state = {"open": True}
    called: list[str] = []

    def handler(name: str, **_: Any) -> None:
        called.append(name)
        if name == "b":
            state["open"] = False  # the Lease passes its renew deadline while b runs

    c, informer, _ = make(handler)
    c.fence = lambda: state["open"]
    keys = [Request("ns", n) for n in "abcd"]
    for k in keys:
        informer.writer.upsert(cm(k.name))
    run(c.process(keys))
    assert called == ["a", "b"]
    assert c.fenced == 2  # prepared, but c and d never started
    assert c.queue.num_requeues(keys[2]) == 0 and c.queue.next_deadline() is None  # dropped, not retried
    assert c.queue.shutting_down, "a closed fence never reopens: the controller halts"


def test_a_closed_fence_starts_nothing_not_even_the_finalizer_write() -> None:
    called: list[str] = []
    c, informer, _ = make(lambda name, **_: called.append(name), finalizer="x.io/f")
    c.fence = lambda: False
    informer.writer.upsert(cm())
    run(c.process([KEY]))
    assert called == [] and c.ctx.transport.calls == [] and c.fenced == 1  # type: ignore[attr-defined]


def test_the_fence_is_checked_before_every_async_call() -> None:
    state = {"open": True}
    called: list[str] = []

    async def handler(name: str, **_: Any) -> None:
        called.append(name)
        state["open"] = False

    c, informer, _ = make(handler)
    c.fence = lambda: state["open"]
    keys = [Request("ns", n) for n in "ab"]
    for k in keys:
        informer.writer.upsert(cm(k.name))
    run(c.process(keys))
    assert called == ["a"] and c.fenced == 1


def test_predicates_filter_before_the_queue() -> None:
    registry = declop.registry.Registry()
    registry.reconciler("configmaps", predicates=[declop.reconcile.predicates.generation_changed])(lambda **_: None)
    informer = FakeInformer()
    c = Controller(registry.registrations[0], CM, [Source((informer,), enqueue_self, (declop.reconcile.predicates.generation_changed,), primary=True)], FakeContext())  # type: ignore[arg-type]
    on_event = c.subscriber(c.sources[0])
    on_event(cm(generation=1), cm(generation=1, labels={"x": "y"}))
    assert len(c.queue) == 0
    on_event(cm(generation=1), cm(generation=2))
    assert len(c.queue) == 1


def test_async_handlers_run_on_the_loop_with_the_async_client() -> None:
    seen: list[Any] = []

    async def handler(client: Any, **_: Any) -> declop.Result:
        seen.append(client)
        return declop.Result(requeue_after=5)

    c, informer, clock = make(handler)
    informer.writer.upsert(cm())
    run(c.process([KEY]))
    assert isinstance(seen[0], declop.AsyncClient)
    assert c.queue.next_deadline() == pytest.approx(clock() + 5)


def test_a_batch_of_plain_calls_settles_each_key_on_its_own() -> None:
    import threading

    threads: list[int] = []

    def handler(name: str, **_: Any) -> Any:
        threads.append(threading.get_ident())
        if name == "b":
            raise RuntimeError("b fails")
        if name == "c":
            return declop.Result(requeue_after=60)
        return None

    c, informer, clock = make(handler)
    keys = [Request("ns", n) for n in ("a", "b", "c")]
    for k in keys:
        informer.writer.upsert(cm(k.name))
    run(c.process(keys))
    assert len(threads) == 3 and len(set(threads)) == 1  # one hop to one thread for the batch
    assert c.queue.num_requeues(keys[0]) == 0
    assert c.queue.num_requeues(keys[1]) == 1
    assert c.queue.next_deadline() == pytest.approx(clock() + 0.005)  # b's backoff comes first
    clock.advance(59.99)
    assert queued(c) == [keys[1]]
    clock.advance(0.02)
    assert queued(c) == [keys[2]]


def test_workers_take_only_their_share_of_the_backlog() -> None:
    taken: list[list[str]] = []
    registry = declop.registry.Registry()
    registry.reconciler("configmaps", max_concurrent=2)(lambda **_: None)
    informer = FakeInformer()
    c = Controller(registry.registrations[0], CM, [Source((informer,), enqueue_self, primary=True)], FakeContext())  # type: ignore[arg-type]

    async def main() -> None:
        for i in range(11):
            c.queue.add(Request("ns", f"k{i}"))
        c.queue.shutdown()
        while (keys := await c.take()) is not None:
            taken.append([k.name for k in keys])

    asyncio.run(main())
    # the first batch: one key plus half of the 10 still waiting (two workers share them)
    assert taken[0] == ["k0", "k1", "k2", "k3", "k4", "k5"]
    assert sum(len(t) for t in taken) == 11


def test_requeue_after_zero_is_plain_success_not_an_immediate_requeue() -> None:
    c, _, clock = make(lambda **_: None)
    c.queue.add_rate_limited(KEY)
    clock.advance(1)
    queued(c)
    settle(c, KEY, declop.Result(requeue_after=0), None, logger(), 0.0)
    assert c.queue.num_requeues(KEY) == 0
    assert c.queue.next_deadline() is None and queued(c) == []
    assert c.queue.statistics().retries == 1  # only the earlier failure's


# -- no head-of-line blocking in a batch ---------------------------------------------------------
def test_a_stalled_call_gives_the_keys_behind_it_back_and_settles_those_before_it() -> None:
    import threading

    release = threading.Event()
    ran: list[str] = []

    def handler(name: str, **_: Any) -> None:
        ran.append(name)
        if name == "b":
            assert release.wait(10)

    registry = declop.registry.Registry()
    registry.reconciler("configmaps", max_concurrent=2)(handler)
    informer = FakeInformer()
    c = Controller(registry.registrations[0], CM, [Source((informer,), enqueue_self, primary=True)], FakeContext())  # type: ignore[arg-type]
    keys = [Request("ns", n) for n in "abcd"]
    for k in keys:
        informer.writer.upsert(cm(k.name))

    async def main() -> None:
        q = c.queue
        for k in keys:
            q.add(k)
        taken = [q.get_nowait() for _ in keys]
        task = asyncio.ensure_future(c.process(taken))
        for _ in range(500):  # up to 5 s: the stall is noticed after 5 ms
            await asyncio.sleep(0.01)
            if len(q) == 2 and q.statistics().processing == 1:
                break
        assert ran == ["a", "b"]  # b hangs; c and d have not started
        assert q.statistics().processing == 1  # only b is still held: a is settled, c and d are back
        q.add(keys[0])  # a change to a runs at once (a is done, not held behind b)
        assert [q.get_nowait() for _ in range(3)] == [keys[2], keys[3], keys[0]]
        release.set()
        await asyncio.wait_for(task, 10)
        assert q.statistics().processing == 3  # the three this test took; b is done
        assert c.reconciles == 2 and ran == ["a", "b"]

    run(main())


def test_with_one_worker_a_batch_is_never_split() -> None:
    seen: list[str] = []

    def handler(name: str, **_: Any) -> None:
        seen.append(name)
        if name == "a":
            import time

            time.sleep(0.05)  # far past the stall threshold: nobody else could run b anyway

    c, informer, _ = make(handler)
    keys = [Request("ns", n) for n in "ab"]
    for k in keys:
        informer.writer.upsert(cm(k.name))
        c.queue.add(k)
    taken = [c.queue.get_nowait() for _ in keys]
    run(c.process(taken))
    assert seen == ["a", "b"] and c.queue.statistics().processing == 0 and len(c.queue) == 0


def test_a_user_predicate_gets_read_only_views_and_the_builtins_the_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    import declop.reconcile.controller
    from declop.cache.store import ReadOnlyDict, readonly

    views: list[Any] = []
    monkeypatch.setattr(declop.reconcile.controller, "readonly", lambda o: views.append(o) or readonly(o))

    seen: list[Any] = []

    def meddling(old: Any, new: Any) -> bool:
        seen.append(new)
        new["metadata"].setdefault("labels", {})["seen"] = "yes"  # raises: read-only
        return True

    def spy(old: Any, new: Any) -> bool:
        seen.append(new)
        return True

    informer = FakeInformer()
    registry = declop.registry.Registry()
    registry.reconciler("configmaps")(lambda **_: None)
    reg = registry.registrations[0]
    user = Controller(reg, CM, [Source((informer,), enqueue_self, (meddling,), primary=True)], FakeContext())  # type: ignore[arg-type]
    new = cm()
    with pytest.raises(TypeError, match="read-only"):
        user.subscriber(user.sources[0])(None, new)
    assert type(seen[0]) is ReadOnlyDict and new == cm() and len(user.queue) == 0

    builtin = declop.reconcile.predicates.all_of(declop.reconcile.predicates.generation_changed, declop.reconcile.predicates.labels_changed)
    fast = Controller(reg, CM, [Source((informer,), enqueue_self, (builtin,), primary=True)], FakeContext())  # type: ignore[arg-type]
    views.clear()
    fast.subscriber(fast.sources[0])(None, new)
    assert len(fast.queue) == 1 and views == []  # built-ins only: no view is made
    mixed = Controller(reg, CM, [Source((informer,), enqueue_self, (builtin, spy), primary=True)], FakeContext())  # type: ignore[arg-type]
    mixed.subscriber(mixed.sources[0])(None, new)
    assert type(seen[-1]) is ReadOnlyDict and len(mixed.queue) == 1


def test_a_call_that_finished_before_the_last_call_of_its_batch_hangs_is_settled_at_once() -> None:
    import threading

    release = threading.Event()

    def handler(name: str, **_: Any) -> None:
        if name == "b":
            assert release.wait(10)

    registry = declop.registry.Registry()
    registry.reconciler("configmaps", max_concurrent=2)(handler)
    informer = FakeInformer()
    c = Controller(registry.registrations[0], CM, [Source((informer,), enqueue_self, primary=True)], FakeContext())  # type: ignore[arg-type]
    keys = [Request("ns", n) for n in "ab"]
    for k in keys:
        informer.writer.upsert(cm(k.name))

    async def main() -> None:
        q = c.queue
        for k in keys:
            q.add(k)
        task = asyncio.ensure_future(c.process([q.get_nowait() for _ in keys]))
        for _ in range(500):
            await asyncio.sleep(0.01)
            if q.statistics().processing == 1:
                break
        assert q.statistics().processing == 1 and not task.done()  # a is done, b still hangs
        q.add(keys[0])
        assert q.get_nowait() == keys[0]  # a change to a runs now, not after b
        q.done(keys[0])
        release.set()
        await asyncio.wait_for(task, 10)
        assert q.statistics().processing == 0 and c.reconciles == 2

    run(main())


@pytest.mark.parametrize("echo", [True, False], ids=["finalizer-in-cache", "cache-not-yet-updated"])
def test_a_created_call_given_back_after_its_finalizer_was_added_still_sees_created(echo: bool) -> None:
    import threading

    release = threading.Event()
    seen: list[tuple[str, declop.Phase]] = []

    def handler(name: str, phase: declop.Phase, **_: Any) -> None:
        seen.append((name, phase))
        if name == "a":
            assert release.wait(10)

    registry = declop.registry.Registry()
    registry.reconciler("configmaps", max_concurrent=2, finalizer="x.io/f")(handler)
    informer = FakeInformer()
    c = Controller(registry.registrations[0], CM, [Source((informer,), enqueue_self, primary=True)], FakeContext())  # type: ignore[arg-type]
    keys = [Request("ns", n) for n in "abc"]
    for k in keys:
        informer.writer.upsert(cm(k.name))

    async def main() -> None:
        q = c.queue
        for k in keys:
            q.add(k)
        task = asyncio.ensure_future(c.process([q.get_nowait() for _ in keys]))
        for _ in range(500):
            await asyncio.sleep(0.01)
            if len(q) == 2:
                break
        assert len(q) == 2 and len(c.ctx.transport.calls) == 3  # type: ignore[attr-defined]
        if echo:
            for n in "bc":  # our finalizer writes come back through the watch
                informer.writer.upsert(cm(n, finalizers=["x.io/f"]))
        await asyncio.wait_for(c.process([q.get_nowait(), q.get_nowait()]), 10)
        release.set()
        await asyncio.wait_for(task, 10)

    run(main())
    assert sorted(seen) == [("a", declop.Phase.CREATED), ("b", declop.Phase.CREATED), ("c", declop.Phase.CREATED)]
    assert len(c.ctx.transport.calls) == 3  # type: ignore[attr-defined]  # no second finalizer write
    assert c.echoes.added == set()


# -- priorities, provenance, timeouts (issue 16) -------------------------------------------------
from declop.reconcile.controller import ControllerMetrics  # noqa: E402
from declop.errors import ReconcileTimeout  # noqa: E402
from declop.logs import set_trigger_in_context  # noqa: E402
from declop.queue.priority import LOW, NORMAL, PriorityQueue  # noqa: E402
from declop.reconcile.trigger import Trace, Trigger  # noqa: E402


class RecordingControllerMetrics(ControllerMetrics):
    def __init__(self) -> None:
        self.triggers: list[tuple[tuple[str, ...], int]] = []
        self.timeouts: list[str] = []

    def triggered(self, controller: str, trace: Trace) -> None:
        self.triggers.append((tuple(trace.sources), trace.events))

    def timed_out(self, controller: str, kind: str) -> None:
        self.timeouts.append(kind)


def make_pq(handler: Any, recent: int = 0, **options: Any) -> tuple[Controller, FakeInformer, FakeClock]:
    """A controller on a PriorityQueue (FakeClock) that records its trigger metrics."""
    registry = declop.registry.Registry()
    registry.reconciler("configmaps", **options)(handler)
    reg = registry.registrations[0]
    informer = FakeInformer()
    metrics = RecordingControllerMetrics()
    c = Controller(reg, CM, [Source((informer,), enqueue_self, primary=True)], FakeContext(), metrics=metrics, recent=recent)  # type: ignore[arg-type]
    clock = FakeClock()
    aging = reg.priority.aging if reg.priority is not None else 0.0
    c.queue = PriorityQueue(name=reg.name, rate_limiter=ItemExponential(), clock=clock, aging=aging)
    return c, informer, clock


def take_and_process(c: Controller) -> list[Request]:
    """What one worker does for every ready key, in queue order."""
    taken = []
    while True:
        try:
            key = c.queue.get_nowait()
        except QueueEmpty:
            return taken
        taken.append(key)
        run(c.process([key]))


def test_priorities_follow_what_the_event_changed() -> None:
    c, informer, _ = make_pq(lambda **_: None)
    on_event = c.subscriber(c.sources[0])
    informer.syncing = True
    on_event(None, cm("listed"))
    informer.syncing = False
    on_event(None, cm("created"))
    base = cm("churn", labels={"a": "1"})
    on_event(base, {**cm("churn", labels={"a": "1"}, resourceVersion="9", managedFields=[{"m": 1}]), "status": {"ready": True}})
    on_event(cm("label"), cm("label", labels={"a": "2"}, resourceVersion="9"))
    on_event({**cm("spec"), "data": {"k": "1"}}, {**cm("spec", resourceVersion="9"), "data": {"k": "2"}})
    on_event(cm("gone"), None)
    ranks = {key.name: priority for key, priority, _ in c.queue.ranks()}  # type: ignore[attr-defined]
    assert ranks == {"listed": LOW, "churn": LOW, "created": NORMAL, "label": NORMAL, "spec": NORMAL, "gone": NORMAL}
    assert [k.name for k in take_and_process(c)] == ["created", "label", "spec", "gone", "listed", "churn"]


def test_configured_priorities_and_fifo() -> None:
    c, informer, _ = make_pq(lambda **_: None, priority=declop.queue.priority.Priority(listed=-5, unchanged=NORMAL))
    on_event = c.subscriber(c.sources[0])
    informer.syncing = True
    on_event(None, cm("listed"))
    informer.syncing = False
    on_event(cm("churn"), cm("churn", resourceVersion="2"))
    assert {k.name: p for k, p, _ in c.queue.ranks()} == {"listed": -5, "churn": NORMAL}  # type: ignore[attr-defined]
    fifo, _, _ = make(lambda **_: None)
    assert type(fifo.queue) is WorkQueue
    registry = declop.registry.Registry()
    registry.reconciler("configmaps", priority=False)(lambda **_: None)
    c2 = Controller(registry.registrations[0], CM, [], FakeContext())  # type: ignore[arg-type]
    assert type(c2.queue) is WorkQueue


def test_a_hundred_updates_are_one_reconcile_with_one_trigger() -> None:
    seen: list[Trigger] = []
    c, informer, _ = make_pq(lambda trigger, **_: seen.append(trigger))
    on_event = c.subscriber(c.sources[0])
    informer.writer.upsert(cm())
    for i in range(100):
        on_event(cm(labels={"i": str(i)}, resourceVersion=str(100 + i)), cm(labels={"i": str(i + 1)}, resourceVersion=str(101 + i)))
    take_and_process(c)
    assert seen == [Trigger(sources=(("updated", 100),), events=100, resource_versions=("101", "200"))]
    assert str(seen[0]) == "updated*100 rv=101..200"
    assert c.metrics.triggers == [(("updated",), 100)]  # type: ignore[attr-defined]


def test_each_source_kind_is_named() -> None:
    seen: list[Trigger] = []
    c, informer, clock = make_pq(lambda trigger, **_: seen.append(trigger))
    owned = FakeInformer()
    owned.resource = ResourceInfo(group="apps", version="v1", plural="deployments", kind="Deployment", namespaced=True)
    child = Source((owned,), lambda old, new: {KEY}, label="owns:Deployment")  # type: ignore[arg-type]
    watched = Source((owned,), lambda old, new: {KEY}, label="watches:secrets", via="secret_users")  # type: ignore[arg-type]
    informer.writer.upsert(cm())
    deployment = {"metadata": {"name": "d1", "namespace": "ns", "resourceVersion": "5"}}
    informer.syncing = True
    c.subscriber(c.sources[0])(None, cm())
    informer.syncing = False
    c.subscriber(child, owned)(None, deployment)
    c.subscriber(watched, owned)(None, deployment)
    take_and_process(c)
    assert seen[-1].sources == (("initial-list", 1), ("owns:Deployment", 1), ("watches:secrets", 1))
    assert seen[-1].details == ("Deployment ns/d1", "secret_users: Deployment ns/d1")
    informer.lists = 2
    informer.syncing = True
    c.subscriber(c.sources[0])(cm(), cm(resourceVersion="3"))
    informer.syncing = False
    take_and_process(c)
    assert seen[-1].names == ("relist",)


def test_requeue_after_and_retry_are_attributed_to_the_run_they_cause() -> None:
    seen: list[Trigger] = []
    outcomes = [declop.Result(requeue_after=30), None, RuntimeError("boom"), None]

    def handler(trigger: Trigger, **_: Any) -> Any:
        seen.append(trigger)
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    c, informer, clock = make_pq(handler)
    on_event = c.subscriber(c.sources[0])
    informer.writer.upsert(cm())
    on_event(None, cm())
    take_and_process(c)  # created → requeue_after=30
    on_event(cm(), cm(labels={"x": "y"}, resourceVersion="2"))
    take_and_process(c)  # the update runs now: the requeue still waits
    assert seen[1].names == ("updated",)
    clock.advance(30)
    take_and_process(c)  # the requeue: fails
    assert seen[2].names == ("requeue_after",)
    clock.advance(1)
    take_and_process(c)
    assert seen[3].names == ("retry",) and seen[3].details == ("RuntimeError",)


def test_a_given_back_key_keeps_its_trigger() -> None:
    c, informer, _ = make_pq(lambda **_: None)
    on_event = c.subscriber(c.sources[0])
    on_event(None, cm())
    key = c.queue.get_nowait()
    trace = c.keys.take(key, c.queue)
    on_event(cm(), cm(labels={"a": "b"}, resourceVersion="2"))  # arrives while held
    c.keys.restore(key, trace)
    c.queue.give_back(key)
    assert c.keys.traces[key].freeze().sources == (("created", 1), ("updated", 1))


def test_the_trigger_is_on_the_logger_context_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    c, informer, _ = make_pq(lambda logger, **_: logger.info("hello"))
    on_event = c.subscriber(c.sources[0])
    informer.writer.upsert(cm())
    on_event(None, cm())
    set_trigger_in_context(True)
    try:
        with caplog.at_level(logging.INFO):
            take_and_process(c)
    finally:
        set_trigger_in_context(False)
    (record,) = [r for r in caplog.records if r.getMessage() == "hello"]
    assert record.kv["trigger"] == "created rv=1"  # type: ignore[attr-defined]
    on_event(cm(), cm(labels={"a": "b"}, resourceVersion="2"))
    with caplog.at_level(logging.INFO):
        caplog.clear()
        take_and_process(c)
    assert "trigger" not in caplog.records[0].kv  # type: ignore[attr-defined]


def test_recent_reconciles_are_kept_for_the_debug_endpoint() -> None:
    c, informer, _ = make_pq(lambda **_: None, recent=2)
    on_event = c.subscriber(c.sources[0])
    informer.writer.upsert(cm())
    for rv in "234":
        on_event(cm(), cm(labels={"rv": rv}, resourceVersion=rv))
        take_and_process(c)
    assert c.recent is not None and len(c.recent) == 2
    last = c.recent[-1]
    assert (last["key"], last["trigger"], last["outcome"], last["events"]) == ("ns/a", "updated rv=4", "success", 1)


def test_an_async_handler_past_its_timeout_is_cancelled_and_retried() -> None:
    cancelled: list[bool] = []

    async def slow(**_: Any) -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    c, informer, _ = make_pq(slow, timeout=0.05)
    informer.writer.upsert(cm())
    c.queue.add(KEY)
    take_and_process(c)
    assert cancelled == [True]
    assert c.queue.num_requeues(KEY) == 1
    assert c.keys.pending(KEY) == ("retry", "ReconcileTimeout")
    assert c.metrics.timeouts == ["cancelled"]  # type: ignore[attr-defined]


def test_a_timeout_error_of_the_handler_itself_is_its_own() -> None:
    async def own(**_: Any) -> None:
        raise TimeoutError("upstream")

    c, informer, _ = make_pq(own, timeout=5)
    informer.writer.upsert(cm())
    c.queue.add(KEY)
    take_and_process(c)
    assert c.keys.pending(KEY) == ("retry", "TimeoutError")
    assert c.metrics.timeouts == []  # type: ignore[attr-defined]
    assert not issubclass(TimeoutError, ReconcileTimeout)


def test_a_plain_handler_overrun_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    import time as _time

    c, informer, _ = make_pq(lambda **_: _time.sleep(0.05), timeout=0.01)
    informer.writer.upsert(cm())
    c.queue.add(KEY)
    with caplog.at_level(logging.WARNING):
        take_and_process(c)
    assert c.metrics.timeouts == ["overrun"]  # type: ignore[attr-defined]
    (record,) = [r for r in caplog.records if "overran its timeout" in r.getMessage()]
    assert record.kv["timeout"] == 0.01 and record.kv["seconds"] >= 0.05  # type: ignore[attr-defined]
    assert c.queue.num_requeues(KEY) == 0  # it finished: success, not retried


# -- sharded mode: the per-range fence --------------------------------------------------------------
class _Elector:
    """Stands in for a range's LeaderElector: held, and valid while ``open``."""

    def __init__(self) -> None:
        self.is_leader, self.open = False, False
        self.name, self.namespace = "range", "default"

    def valid(self) -> bool:
        return self.is_leader and self.open

    def live(self) -> bool:
        return self.is_leader and self.open


def sharded(handler: Any, n: int = 4, *, finalizer: str | None = None) -> tuple[Controller, FakeInformer, Any]:
    from declop.leases.shards import ShardSet

    registry = declop.registry.Registry()
    registry.reconciler("configmaps", finalizer=finalizer, shard_by="uid")(handler)
    reg = registry.registrations[0]
    informer = FakeInformer()
    shards = ShardSet(reg.name, n, "uid", [_Elector() for _ in range(n)])  # type: ignore[list-item]
    c = Controller(reg, CM, [Source((informer,), enqueue_self, primary=True)], FakeContext(), shards=shards)  # type: ignore[arg-type]
    c.queue = WorkQueue(name=reg.name, rate_limiter=ItemExponential(), clock=FakeClock())
    return c, informer, shards


def own(shards: Any, *ranges: int) -> None:
    for i in ranges:
        shards.electors[i].is_leader = shards.electors[i].open = True


def uid_in(shards: Any, index: int, avoid: tuple[str, ...] = ()) -> str:
    """A uid that hashes into range ``index``."""
    for i in range(10_000):
        uid = f"uid-{i}"
        if shards.index(uid) == index and uid not in avoid:
            return uid
    raise AssertionError("no uid found")


def test_keys_of_ranges_not_held_are_dropped_before_anything_starts() -> None:
    called: list[str] = []
    c, informer, shards = sharded(lambda name, **_: called.append(name), finalizer="x.io/f")
    own(shards, 0)
    informer.writer.upsert(cm("mine", uid=uid_in(shards, 0)))
    informer.writer.upsert(cm("theirs", uid=uid_in(shards, 1)))
    run(c.process([Request("ns", "mine"), Request("ns", "theirs")]))
    assert called == ["mine"]
    assert c.unowned == 1 and [p for _, p, _ in c.ctx.transport.calls if "theirs" in p] == []  # type: ignore[attr-defined]
    assert c.queue.num_requeues(Request("ns", "theirs")) == 0 and not c.queue.shutting_down  # dropped, not retried, not halted
    assert shards.in_flight == {}, "every in-flight count ends with its batch"


def test_a_range_fence_closing_inside_a_batch_skips_only_that_range() -> None:
    called: list[str] = []
    c, informer, shards = sharded(lambda name, **_: (called.append(name), name == "a1" and shards.draining.add(1)))
    own(shards, 1, 2)
    u1 = uid_in(shards, 1)
    informer.writer.upsert(cm("a1", uid=u1))
    informer.writer.upsert(cm("b2", uid=uid_in(shards, 2)))
    informer.writer.upsert(cm("c1", uid=uid_in(shards, 1, avoid=(u1,))))
    run(c.process([Request("ns", n) for n in ("a1", "b2", "c1")]))
    assert called == ["a1", "b2"]  # range 1 started draining while a1 ran: c1 never starts


def test_a_reconcile_is_in_flight_for_its_range_until_its_batch_ends() -> None:
    seen: list[dict[int, int]] = []
    c, informer, shards = sharded(lambda **_: seen.append(dict(shards.in_flight)))
    own(shards, 3)
    informer.writer.upsert(cm("a", uid=uid_in(shards, 3)))
    run(c.process([KEY]))
    assert seen == [{3: 1}] and shards.in_flight == {}


def test_a_deleted_objects_key_keeps_its_range_from_its_last_event() -> None:
    called: list[Any] = []
    c, informer, shards = sharded(lambda obj, **_: called.append(obj))
    own(shards, 2)
    on_event = c.subscriber(c.sources[0])
    gone = cm("a", uid=uid_in(shards, 2))
    on_event(gone, None)  # a deletion: the cache no longer has it
    run(c.process([KEY]))
    assert called == [None] and KEY not in c.gate.book.uids  # type: ignore[operator]


def test_a_failed_call_of_a_deleted_objects_key_is_retried_in_its_range() -> None:
    # issue 42's filtered world, sharded by uid: the call that saw the object gone failed, and
    # the book had already forgotten the key's uid, so its retry had no range and was dropped at
    # the fence as not ours — the deletion was never handled. The uid goes once a call of the
    # gone object succeeds.
    called: list[Any] = []

    def handler(obj: Any, **_: Any) -> None:
        called.append(obj)
        if len(called) == 1:
            raise RuntimeError("the first try fails")

    c, informer, shards = sharded(handler)
    own(shards, 2)
    c.subscriber(c.sources[0])(cm("a", uid=uid_in(shards, 2)), None)
    run(c.process([KEY]))
    assert called == [None] and c.queue.num_requeues(KEY) == 1
    run(c.process([KEY]))  # the retry
    assert called == [None, None] and c.unowned == 0
    assert KEY not in c.gate.book.uids  # type: ignore[operator]


def test_a_sharded_controller_woken_by_its_unfiltered_cache_finds_the_keys_range() -> None:
    # issue 42's filtered world, sharded by uid (simworld seed 19): a left the filter; the call of
    # the filtered DELETED read the lagging unfiltered cache and succeeded, so the book forgot a's
    # uid. That cache catching up woke the controller, but the key had no range any more and
    # was dropped at the fence: the handler's last look at a stayed the stale one.
    called: list[Any] = []
    c, _informer, shards = sharded(lambda obj, **_: called.append(obj))
    own(shards, 2)
    was = cm("a", uid=uid_in(shards, 2), labels={"app": "x"})
    left = {**was, "metadata": {**was["metadata"], "resourceVersion": "2", "labels": {}}}
    c.unfiltered_subscriber(lambda obj: obj["metadata"]["labels"].get("app") == "x")(was, left)
    assert queued(c) == [KEY]
    run(c.process([KEY]))
    assert called == [None] and c.unowned == 0


def test_a_sharded_controller_woken_while_the_call_of_a_gone_object_runs_keeps_the_keys_range() -> None:
    # simworld seed 2 of the filtered world, sharded by uid, no fault: the unfiltered cache's
    # DELETED woke the controller while the call of the filtered one ran (and read the stale
    # copy); that call succeeded, the book forgot the uid, and the wake found no range
    called: list[Any] = []

    def handler(obj: Any, **_: Any) -> None:
        called.append(obj)
        if len(called) == 1:  # the unfiltered cache's DELETED, while this call runs
            c.unfiltered_subscriber(lambda obj: True)(was, None)

    c, _informer, shards = sharded(handler)
    own(shards, 2)
    was = cm("a", uid=uid_in(shards, 2), labels={"app": "x"})
    c.subscriber(c.sources[0])(was, None)  # the filtered DELETED
    run(c.process([KEY]))
    assert called == [None] and queued(c) == [KEY]
    run(c.process([KEY]))
    assert called == [None, None] and c.unowned == 0
    assert KEY not in c.gate.book.uids  # type: ignore[operator]


def test_a_deletion_dropped_at_the_fence_is_delivered_when_the_range_is_gained_again() -> None:
    # defect 3 (simworld seed 307): the range was lost when the deletion arrived; taken back, the
    # replica's list no longer has the object, so only the tombstone can bring the key back
    called: list[Any] = []
    c, informer, shards = sharded(lambda obj, **_: called.append(obj))
    on_event = c.subscriber(c.sources[0])
    on_event(cm("a", uid=uid_in(shards, 2)), None)  # deleted while range 2 is not ours
    run(c.process([KEY]))
    assert called == [] and c.unowned == 1 and c.gate.book.tombstones == {2: {KEY}}
    own(shards, 2)
    c.gained(2)
    assert queued(c) == [KEY] and c.gate.book.tombstones == {}
    run(c.process([KEY]))
    assert called == [None]  # delivered: the handler sees the object gone


def test_a_key_of_a_cached_object_dropped_at_the_fence_leaves_no_tombstone() -> None:
    c, informer, shards = sharded(lambda **_: None)
    informer.writer.upsert(cm("a", uid=uid_in(shards, 1)))
    run(c.process([KEY]))
    assert c.unowned == 1 and c.gate.book.tombstones == {}  # its next owner lists it


def test_a_gained_range_queues_every_cached_object_of_it(caplog: pytest.LogCaptureFixture) -> None:
    c, informer, shards = sharded(lambda **_: None)
    inside = [f"in-{i}" for i in range(3)]
    used: tuple[str, ...] = ()
    for name in inside:
        uid = uid_in(shards, 0, avoid=used)
        used += (uid,)
        informer.writer.upsert(cm(name, uid=uid))
    informer.writer.upsert(cm("out", uid=uid_in(shards, 1)))
    with caplog.at_level(logging.INFO):
        c.gained(0)
    assert sorted(k.name for k in queued(c)) == inside
    assert any(getattr(r, "kv", {}).get("keys") == 3 for r in caplog.records)


def test_the_shard_is_on_every_reconcile_log_line(caplog: pytest.LogCaptureFixture) -> None:
    c, informer, shards = sharded(lambda logger, **_: logger.info("hello"))
    own(shards, 2)
    informer.writer.upsert(cm("a", uid=uid_in(shards, 2)))
    with caplog.at_level(logging.INFO):
        run(c.process([KEY]))
    assert [r.kv["shard"] for r in caplog.records if r.getMessage() == "hello"] == ["2/4"]  # type: ignore[attr-defined]


def test_a_sharded_controller_forgets_the_uids_of_keys_whose_range_was_released() -> None:
    """Sharded by uid, the controller remembers each primary key's uid (a deleted object's key
    still finds its range). Keys that left the cache with a released range are forgotten, or the
    map would grow with every object that ever passed through the replica; keys still cached stay."""
    from declop.leases.shards import ShardSet

    registry = declop.registry.Registry()
    registry.reconciler("configmaps", shard_by="uid")(lambda **_: None)
    informer = FakeInformer()
    shards = ShardSet("configmaps", 4, "uid", [])
    c = Controller(registry.registrations[0], CM, [Source((informer,), enqueue_self, primary=True)], FakeContext(), shards=shards)  # type: ignore[arg-type]
    on_event = c.subscriber(c.sources[0], informer)  # type: ignore[arg-type]
    for name in ("a", "b", "c"):
        obj = cm(name, uid=f"uid-{name}")
        on_event(*informer.writer.upsert(obj))
    assert c.gate.book.uids == {Request("ns", n): f"uid-{n}" for n in "abc"}
    informer.writer.delete(Request("ns", "a"))  # left with its range: no event
    informer.writer.delete(Request("ns", "b"))
    assert c.forget(informer, [Request("ns", "a"), Request("ns", "b"), Request("ns", "c")]) == 2
    assert c.gate.book.uids == {Request("ns", "c"): "uid-c"}  # still cached: kept
    assert c.forget(FakeInformer(), [Request("ns", "c")]) == 0  # not a primary informer of this controller
    assert c.gate.book.uids == {Request("ns", "c"): "uid-c"}


# -- typed handlers (obj: Model): an invalid object is skipped, reported once per resourceVersion --

from declop.typed.model import CustomResource  # noqa: E402 - the typed section's own import


class Counts(CustomResource, group="example.com", version="v1", kind="Counts"):
    data: dict[str, int] = {}


def make_typed(seen: list[Any], *, finalizer: str | None = None) -> tuple[Controller, FakeInformer, FakeClock]:
    def handler(phase: declop.Phase, obj: Counts | None, **_: Any) -> None:
        seen.append((phase, obj))

    c, informer, clock = make(handler, finalizer=finalizer)
    assert c.registration.model is Counts
    return c, informer, clock


def reports(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.__dict__["kv"] for r in caplog.records if r.getMessage() == "Object fails its model; skipped until it changes"]


def test_a_typed_handler_gets_its_model() -> None:
    seen: list[Any] = []
    c, informer, _ = make_typed(seen)
    informer.writer.upsert({**cm(), "data": {"a": "1"}})
    run(c.process([KEY]))
    assert seen == [(declop.Phase.UPDATED, Counts.model_validate({**cm(), "data": {"a": 1}}))]
    assert isinstance(seen[0][1], Counts)


def test_an_invalid_object_is_skipped_reported_once_per_resource_version_and_never_retried(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[Any] = []
    c, informer, clock = make_typed(seen)
    informer.writer.upsert({**cm(), "data": {"a": "one"}})
    run(c.process([KEY]))
    run(c.process([KEY]))  # the same resourceVersion again (a resync, a child's event)
    assert seen == [] and c.queue.num_requeues(KEY) == 0
    clock.advance(10_000)
    assert queued(c) == []  # nothing waits: not retried
    assert [(r["resourceVersion"], r["errors"]) for r in reports(caplog)] == [
        ("1", "data.a: Input should be a valid integer, unable to parse string as an integer")
    ]
    informer.writer.upsert({**cm(resourceVersion="2"), "data": {"a": "two"}})
    run(c.process([KEY]))
    assert [r["resourceVersion"] for r in reports(caplog)] == ["1", "2"]
    informer.writer.upsert({**cm(resourceVersion="3"), "data": {"a": "3"}})
    run(c.process([KEY]))
    assert [phase for phase, _ in seen] == [declop.Phase.UPDATED] and c.keys.invalid == {}


def test_an_invalid_new_object_never_gets_our_finalizer() -> None:
    seen: list[Any] = []
    c, informer, _ = make_typed(seen, finalizer="x.io/f")
    informer.writer.upsert({**cm(), "data": {"a": "one"}})
    run(c.process([KEY]))
    assert seen == [] and c.ctx.transport.calls == []  # type: ignore[attr-defined]


def test_an_invalid_object_being_deleted_keeps_our_finalizer_and_says_how_to_unblock_it(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[Any] = []
    c, informer, _ = make_typed(seen, finalizer="x.io/f")
    informer.writer.upsert({**cm(deletionTimestamp="2026-01-01T00:00:00Z", finalizers=["x.io/f"]), "data": {"a": "one"}})
    run(c.process([KEY]))
    assert seen == [] and c.ctx.transport.calls == []  # type: ignore[attr-defined]
    waits = [r.__dict__["kv"] for r in caplog.records if r.getMessage().startswith("Deletion waits")]
    assert [(w["finalizer"], w["command"]) for w in waits] == [("x.io/f", "kubectl edit configmaps a -n ns")]


def in_range_3(handler: Any, executor: Any) -> Any:
    """A sharded controller with ``handler`` and ``executor`` that owns range 3, and object "a" in it."""
    c, informer, shards = sharded(handler)
    c.executor = executor
    own(shards, 3)
    informer.writer.upsert(cm("a", uid=uid_in(shards, 3)))
    return c, informer, shards


async def start_with_key(c: Any, informer: Any) -> None:
    informer.synced.set()
    await c.start()
    c.queue.add(KEY)


def test_a_plain_call_abandoned_by_a_stop_keeps_its_range_in_flight_until_its_thread_returns() -> None:
    """Issue 22, defect 2 (sharded): the grace period ends with a plain handler still running in
    its thread; the worker is cancelled, but the thread is not. Its range stays in flight — so
    ShardLeases.release_all() leaves its Lease to expire — until the thread returns; before, the
    cancelled worker ended the count at once and the range was released under the running call."""
    import concurrent.futures
    import threading

    started, release = threading.Event(), threading.Event()
    c, informer, shards = in_range_3(lambda **_: (started.set(), release.wait()), concurrent.futures.ThreadPoolExecutor(2))

    async def main() -> None:
        await start_with_key(c, informer)
        assert await asyncio.to_thread(started.wait, 10)
        assert not await c.stop(0.05), "the grace period ended with the call running"
        assert shards.in_flight == {3: 1} and c.running() == 1
        release.set()
        while c.running():  # the thread returns, then its end is noted on the loop
            await asyncio.sleep(0.01)
        assert shards.in_flight == {}

    try:
        run(main())
    finally:
        release.set()
        c.executor.shutdown(wait=True)  # type: ignore[union-attr]


@pytest.mark.parametrize("cut_at", ["grace", "settle"])
def test_a_stop_cancelled_from_outside_still_counts_the_call_it_gave_up_on(cut_at: str) -> None:
    """The manager bounds the drain (``grace + 2`` s); after a pause (SIGSTOP) that bound and the
    stop's own timers are due at once, and the bound may cancel :meth:`Controller.stop` inside
    its grace or its settle. The workers must still be cancelled and a call that ignores it
    counted by ``running()`` (and its range kept in flight), or the Lease is released under it
    (I6; world leader seed 4384: term-in-call, then pause-holder)."""
    started, release = asyncio.Event(), asyncio.Event()

    async def deaf(**_: Any) -> None:  # a call that cancellation does not stop
        started.set()
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                pass

    c, informer, shards = in_range_3(deaf, None)

    async def main() -> None:
        await start_with_key(c, informer)
        await asyncio.wait_for(started.wait(), 5)
        grace, settle, cut = (10.0, 0.1, 0.05) if cut_at == "grace" else (0.01, 10.0, 0.1)
        try:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(c.stop(grace, settle), cut)
            assert c.running() == 1 and shards.in_flight == {3: 1}, "the call still runs"
        finally:
            release.set()  # the call ends, pass or fail
        while c.running():
            await asyncio.sleep(0.01)
        assert shards.in_flight == {}

    run(main())


def test_a_batch_cancelled_before_a_thread_took_it_is_not_left_running() -> None:
    """A stop that cancels a worker whose batch still waits for a free thread cancels the batch:
    none of its calls ever runs, so nothing is left running and its range is free at once. (When
    the controller tracked batches by a flag the thread set, such a batch stayed "running" for
    ever: its thread never came, and ``running()`` never reached 0 — every Lease was then left to
    expire instead of being released.)"""
    import concurrent.futures
    import threading

    release = threading.Event()
    calls: list[str] = []
    c, informer, shards = in_range_3(lambda name, **_: calls.append(name), concurrent.futures.ThreadPoolExecutor(1))
    busy = c.executor.submit(release.wait)  # type: ignore[union-attr]  # the only thread is taken

    async def main() -> None:
        await start_with_key(c, informer)
        while shards.in_flight != {3: 1}:  # the worker took the key and queued its batch
            await asyncio.sleep(0.001)
        assert not await c.stop(0.05)
        assert c.running() == 0 and shards.in_flight == {}

    try:
        run(main())
        release.set()
        busy.result(10)
        c.executor.shutdown(wait=True)  # type: ignore[union-attr]
        assert calls == []
    finally:
        release.set()


# -- two caches of the primary resource: the filtered one that wakes, an unfiltered one it reads ---


def _labelled(rv: str, app: str | None = "x", name: str = "a") -> dict[str, Any]:
    return cm(name, resourceVersion=rv, labels={"app": app} if app else {})


async def _two_caches(handler: Any, **options: Any) -> tuple[Controller, Any, Any, Any]:
    """A ``labels="app=x"`` controller over real informers of one pool (fed by hand: each cache
    gets its events when the test says, as two watch streams with their own delays would), the
    object a in both caches, labelled; the controller started."""
    from declop.cache.informer import InformerPool
    from declop.reconcile.client import ClientContext
    from declop.testing.fakes.apiserver import FakeApiServer

    server = FakeApiServer()
    info = server.discovery.resolve_cached("configmaps")
    pool = InformerPool(transport=None)  # type: ignore[arg-type]
    filtered = pool.get(info, "", "app=x")
    unfiltered = pool.get(info, "")
    for informer in (filtered, unfiltered):
        Writer(informer.store).upsert(_labelled("1"))
        informer.store.synced = True
        informer.synced.set()
    registry = declop.registry.Registry()
    registry.reconciler("configmaps", labels="app=x", **options)(handler)
    reg = registry.registrations[0]
    ctx = ClientContext(server, server.discovery, pool, asyncio.get_running_loop())  # type: ignore[arg-type]
    c = Controller(reg, info, [Source((filtered,), enqueue_self, primary=True)], ctx)
    await c.start()
    return c, pool, filtered, unfiltered


def _deliver(informer: Any, old: Any, new: Any) -> None:
    """One watch event reaching ``informer``: its store changes, then its subscribers hear it."""
    writer = Writer(informer.store)
    if new is None:
        writer.delete(Request("ns", old["metadata"]["name"]))
    else:
        writer.upsert(new)
    informer._emit(old, new)


async def _until(condition: Any, what: str) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never happened: {what}")


@pytest.mark.parametrize("read", ["get", "list"])
def test_an_object_that_left_the_filter_is_reconciled_again_when_the_lagging_cache_catches_up(read: str) -> None:
    """Issue 42: the object a loses the label ``app=x``. The filtered informer delivers it first
    (DELETED, as the apiserver sends it) and wakes the controller; the handler reads a from the
    unfiltered cache, which has not seen the change: still labelled. When that cache catches up,
    the controller must be woken again, or the handler's last look at a is the stale one."""
    seen: list[Any] = []

    async def handler(request: Any, client: Any, **_: Any) -> None:
        if read == "get":
            obj = client.get(request)
        else:
            obj = next(o for o in client.list() if o["metadata"]["name"] == request.name)
        seen.append((obj["metadata"]["resourceVersion"], obj["metadata"]["labels"]))

    async def main() -> list[Any]:
        c, _pool, filtered, unfiltered = await _two_caches(handler)
        try:
            await _until(lambda: len(seen) == 1, "the initial list's reconcile")
            # the change: rv 2 takes the label off; the filtered stream delivers it first
            _deliver(filtered, _labelled("2"), None)
            await _until(lambda: len(seen) == 2, "the reconcile of the DELETED")
            assert seen[1] == ("1", {"app": "x"}), "read from the lagging cache: still labelled"
            _deliver(unfiltered, _labelled("1"), _labelled("2", app=None))
            await _until(lambda: len(seen) == 3, "a reconcile once the unfiltered cache caught up")
            return seen
        finally:
            await c.stop(grace=1)

    assert asyncio.run(main())[-1] == ("2", {})


def test_changes_of_objects_outside_the_filter_or_still_in_it_wake_nothing_through_the_unfiltered_cache() -> None:
    """Only the unfiltered cache's view of an object that matched the filter, while the filtered
    cache no longer holds it, wakes the controller; an unfiltered informer created after the
    controller started (here a metadata-only one) is followed as well."""
    calls: list[str] = []
    triggers: list[Any] = []

    async def handler(request: Any, trigger: Any, **_: Any) -> None:
        calls.append(request.name)
        triggers.append(trigger.names)

    async def main() -> list[str]:
        c, pool, filtered, unfiltered = await _two_caches(handler)
        try:
            await _until(lambda: calls == ["a"], "the initial list's reconcile")
            # an object that never matched: created, changed, deleted — all unfiltered
            _deliver(unfiltered, None, _labelled("2", app="y", name="b"))
            _deliver(unfiltered, _labelled("2", app="y", name="b"), _labelled("3", app="y", name="b"))
            _deliver(unfiltered, _labelled("3", app="y", name="b"), None)
            # a, still in the filtered cache, changed in the unfiltered one first
            _deliver(unfiltered, _labelled("1"), _labelled("4"))
            for _ in range(50):
                await asyncio.sleep(0)
            assert len(c.queue) == 0 and calls == ["a"]
            # a late unfiltered informer is followed too: a leaves the filter, it lags
            late = pool.get(unfiltered.resource, "", metadata_only=True)
            Writer(late.store).upsert(_labelled("4"))
            _deliver(filtered, _labelled("5"), None)
            await _until(lambda: len(calls) == 2, "the DELETED's reconcile")
            _deliver(late, _labelled("4"), _labelled("5", app=None))
            await _until(lambda: len(calls) == 3, "the late cache's catching up")
            return calls
        finally:
            await c.stop(grace=1)

    assert asyncio.run(main()) == ["a", "a", "a"]
    assert triggers[1:] == [("deleted",), ("left-filter",)]


# -- a CREATED call that fails stays CREATED (issue 41) ------------------------------------------
@pytest.mark.parametrize("error", [RuntimeError("boom"), declop.TerminalError("no")], ids=["retried", "terminal"])
def test_a_created_call_that_raises_is_called_again_as_created_until_one_succeeds(error: Exception) -> None:
    """Kopf's ``on.create`` maps to CREATED: a first call that raises must not turn the create
    into an UPDATED on its retry (the finalizer it added is on the object by then). After the
    first success the next call is UPDATED."""
    seen: list[declop.Phase] = []

    def handler(phase: declop.Phase, **_: Any) -> None:
        seen.append(phase)
        if len(seen) <= 2:
            raise error

    c, informer, _ = make(handler, finalizer="x.io/f")
    informer.writer.upsert(cm())

    async def once(with_finalizer: bool) -> None:
        if with_finalizer:  # our finalizer write came back through the watch
            informer.writer.upsert(cm(finalizers=["x.io/f"], resourceVersion="2"))
        c.queue.add(KEY)
        await c.process([c.queue.get_nowait()])

    async def main() -> None:
        await once(False)  # finalizer added, handler called as CREATED, raises
        await once(True)  # the retry: CREATED again, raises again
        await once(True)  # CREATED again, succeeds
        await once(True)  # now UPDATED

    run(main())
    assert seen == [declop.Phase.CREATED, declop.Phase.CREATED, declop.Phase.CREATED, declop.Phase.UPDATED]
    assert c.echoes.added == set()


def test_a_failed_created_call_whose_object_is_deleted_forgets_the_note() -> None:
    seen: list[declop.Phase] = []

    def handler(phase: declop.Phase, **_: Any) -> None:
        seen.append(phase)
        if phase is declop.Phase.CREATED:
            raise RuntimeError("boom")

    c, informer, _ = make(handler, finalizer="x.io/f")
    informer.writer.upsert(cm())

    async def main() -> None:
        c.queue.add(KEY)
        await c.process([c.queue.get_nowait()])
        informer.writer.delete(KEY)
        c.queue.add(KEY)
        await c.process([c.queue.get_nowait()])

    run(main())
    assert seen == [declop.Phase.CREATED, declop.Phase.DELETED]
    assert c.echoes.added == set()


# -- first_seen (issue 41: Kopf's on.resume) -------------------------------------------------------
def test_first_seen_is_true_until_a_call_on_the_object_succeeds_in_this_process() -> None:
    seen: list[bool] = []
    fail = [True]

    def handler(first_seen: bool, obj: Any, **_: Any) -> None:
        seen.append(first_seen)
        if obj is not None and fail[0]:
            fail[0] = False
            raise RuntimeError("re-attaching failed")

    c, informer, _ = make(handler)
    informer.writer.upsert(cm())

    async def once() -> None:
        c.queue.add(KEY)
        await c.process([c.queue.get_nowait()])

    async def main() -> None:
        await once()  # first sighting, fails: still first seen
        await once()  # first sighting, succeeds
        await once()  # seen
        informer.writer.delete(KEY)
        await once()  # gone: DELETED (seen before), and forgotten
        informer.writer.upsert(cm())
        await once()  # re-created: first seen again

    run(main())
    assert seen == [True, True, False, False, True]  # the DELETED call: seen before; then forgotten
    restarted, informer2, _ = make(handler)  # a new process: everything is first seen again
    informer2.writer.upsert(cm())
    restarted.queue.add(KEY)
    run(restarted.process([restarted.queue.get_nowait()]))
    assert seen[-1] is True


def test_a_handler_without_first_seen_keeps_no_note() -> None:
    c, informer, _ = make(lambda **_: None)
    informer.writer.upsert(cm())
    c.queue.add(KEY)
    run(c.process([c.queue.get_nowait()]))
    assert c.keys.seen == set()
