"""declop.reconcile.client: the sync and async clients show the same signatures, ``delete``
sends DeleteOptions (propagation, grace period) and warns once about a Job's orphaned Pods, a
typed ``patch_status`` sends the guarded JSON patch of only what changed, and nothing when nothing did,
and every write verb of both clients is refused (``declop.Fenced``, nothing sent) under a closed
write fence — also from a plain handler's thread.

The clients run over the fake apiserver (declop.testing.fakes.client): the transport is the unit
boundary; what the real apiserver does with the options is tests/integration/test_client_delete.py.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any, Callable

import pytest
from pydantic import BaseModel

import declop
from declop.kube import fencing
from declop.kube.fencing import WriteFence
from declop.reconcile import client as client_module
from declop.reconcile.client import AsyncClient, AsyncLiveReader, Client, ClientContext, LiveReader
from declop.kube.keys import Request
from declop.cache.informer import InformerPool
from declop.cache.store import Writer
from declop.testing.fakes.apiserver import FakeApiServer
from declop.testing.fakes.client import FakeClient
from declop.typed.model import CustomResource

PUBLIC_WRITES = ("create", "update", "patch", "patch_status", "apply", "delete", "event")


def _public(cls: type) -> set[str]:
    return {n for n, v in vars(cls).items() if not n.startswith("_") and callable(v)}


def test_every_public_write_of_the_async_client_has_a_sync_twin() -> None:
    assert _public(AsyncClient) == set(PUBLIC_WRITES)
    assert _public(Client) == set(PUBLIC_WRITES)
    assert _public(AsyncLiveReader) == _public(LiveReader) == {"get", "list"}


@pytest.mark.parametrize("method", PUBLIC_WRITES)
def test_the_sync_client_has_the_async_clients_signature(method: str) -> None:
    """Spelled-out parameters (help() and editors show them), identical to AsyncClient's."""
    sync, aio = inspect.signature(getattr(Client, method)), inspect.signature(getattr(AsyncClient, method))
    assert sync == aio
    assert not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sync.parameters.values())
    assert inspect.getdoc(getattr(Client, method)) == inspect.getdoc(getattr(AsyncClient, method))  # help() says the same
    assert inspect.getdoc(getattr(Client, method))


@pytest.mark.parametrize("method", ("get", "list"))
def test_the_live_readers_have_the_same_signatures(method: str) -> None:
    assert inspect.signature(getattr(LiveReader, method)) == inspect.signature(getattr(AsyncLiveReader, method))
    assert inspect.getdoc(getattr(LiveReader, method)) == inspect.getdoc(getattr(AsyncLiveReader, method))


def test_help_shows_the_delete_options() -> None:
    text = inspect.signature(Client.delete)
    assert "propagation" in text.parameters and "grace_period" in text.parameters


def _job(name: str) -> dict[str, object]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "default"}, "spec": {}}


def _pod(name: str, finalizers: list[str] | None = None) -> dict[str, object]:
    meta: dict[str, object] = {"name": name, "namespace": "default"}
    if finalizers:
        meta["finalizers"] = finalizers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": []}}


def test_delete_sends_propagation_and_grace_period_as_delete_options() -> None:
    fake = FakeClient([_job("j"), _pod("p", ["example.com/hold"])])
    fake.delete("jobs.batch", "default/j", propagation="Background")
    fake.delete("pods", "default/p", grace_period=30)
    fake.delete("pods", "default/gone", propagation="Foreground", grace_period=0)  # NotFound is done
    assert [(w.verb, w.resource, str(w.key), w.body) for w in fake.writes] == [
        ("delete", "jobs.batch", "default/j", {"propagationPolicy": "Background"}),
        ("delete", "pods", "default/p", {"gracePeriodSeconds": 30}),
        ("delete", "pods", "default/gone", {"propagationPolicy": "Foreground", "gracePeriodSeconds": 0}),
    ]
    assert fake.get("pods", "default/p")["metadata"]["deletionGracePeriodSeconds"] == 30  # the fake honours it
    assert fake.objects("jobs.batch") == []


def test_delete_with_no_options_sends_no_body() -> None:
    fake = FakeClient([_pod("p")])
    fake.delete("pods", "default/p")
    assert fake.writes[0].body is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"propagation": "background"}, r"propagation must be one of \['Background', 'Foreground', 'Orphan'\], got 'background'"),
        ({"grace_period": -1}, "grace_period is whole seconds, 0 or more; got -1"),
        ({"grace_period": 2.5}, "grace_period is whole seconds, 0 or more; got 2.5"),
    ],
)
def test_a_wrong_delete_option_is_refused_before_any_request(kwargs: dict[str, object], message: str) -> None:
    fake = FakeClient([_pod("p")])
    with pytest.raises(ValueError, match=message):
        fake.delete("pods", "default/p", **kwargs)  # type: ignore[arg-type]
    assert fake.writes == []


def test_the_first_job_deleted_with_the_default_propagation_logs_a_hint_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(client_module, "_job_hint_logged", False)
    caplog.set_level(logging.INFO, "declop.client")
    fake = FakeClient([_job("a"), _job("b"), _job("c"), _pod("p")])
    fake.delete("pods", "default/p")  # not a Job: no hint
    fake.delete("jobs.batch", "default/a", propagation="Background")  # explicit: no hint
    assert caplog.records == []
    fake.delete("jobs.batch", "default/b")
    fake.aio.sync.delete("jobs.batch", "default/c")  # once per process, whichever client
    hints = [r for r in caplog.records if r.name == "declop.client"]
    assert [r.levelno for r in hints] == [logging.WARNING]
    assert 'orphan their Pods' in hints[0].getMessage() and 'propagation="Background"' in hints[0].getMessage()
    assert hints[0].kv == {"namespace": "default", "name": "b"}  # type: ignore[attr-defined]  # the first such Job



class DialStatus(BaseModel):
    level: int = 0
    observedGeneration: int | None = None


class Dial(CustomResource, group="example.com", version="v1", kind="Dial"):
    spec: dict[str, Any] = {}
    status: DialStatus | None = None


KEY = Request("default", "d")
STORED = {"apiVersion": "example.com/v1", "kind": "Dial", "metadata": {"name": "d", "namespace": "default"},
          "spec": {}, "status": {"level": 2, "observedGeneration": 1, "other": "kept"}}


def client() -> FakeClient:
    return FakeClient([STORED], primary="dials.example.com", request=KEY)


def test_a_typed_status_sends_only_the_changed_fields() -> None:
    c = client()
    returned = c.patch_status(KEY, DialStatus(level=3, observedGeneration=1))
    assert [(w.verb, w.body, w.patch_type) for w in c.writes] == [("patch_status", [
        {"op": "test", "path": "/status/level", "value": 2}, {"op": "add", "path": "/status/level", "value": 3},
    ], "json")]
    assert returned["status"] == {"level": 3, "observedGeneration": 1, "other": "kept"}


def test_an_unchanged_typed_status_sends_nothing_and_returns_the_cached_object() -> None:
    c = client()
    returned = c.patch_status(KEY, DialStatus(level=2))
    assert c.writes == []
    assert returned == c.get(KEY) and returned["status"] == STORED["status"]
    returned["status"]["level"] = 9  # a copy: the cache keeps its own
    assert c.get(KEY)["status"]["level"] == 2


def test_the_whole_typed_object_may_be_passed() -> None:
    c = client()
    dial = Dial.model_validate(STORED)
    assert dial.status is not None
    dial.status.observedGeneration = 2
    c.patch_status(KEY, dial)
    assert [w.body[-1] for w in c.writes] == [{"op": "add", "path": "/status/observedGeneration", "value": 2}]


def test_the_async_client_does_the_same() -> None:
    c = client().aio
    asyncio.run(c.patch_status(KEY, DialStatus(level=5)))
    assert [w.body[-1] for w in c.writes] == [{"op": "add", "path": "/status/level", "value": 5}]


def test_a_typed_status_is_a_patch_declop_makes() -> None:
    with pytest.raises(ValueError, match="a typed status is sent as a guarded JSON patch"):
        client().patch_status(KEY, DialStatus(level=5), type="json")


def test_a_dict_patch_is_sent_as_it_is() -> None:
    c = client()
    c.patch_status(KEY, {"status": {"level": 2}})
    assert [w.body for w in c.writes] == [{"status": {"level": 2}}]


# -- fenced writes (declop.kube.fencing): checked at the transport, for every verb of both clients --

CM_KEY = Request("default", "c")


def _cm(name: str = "c") -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}, "data": {"v": "0"}}


#: every write verb, as a handler of configmaps reconciling default/c calls it
VERBS: dict[str, Callable[[Any], Any]] = {
    "create": lambda c: c.create(_cm("new")),
    "update": lambda c: c.update({**_cm(), "data": {"v": "1"}}),
    "patch": lambda c: c.patch(CM_KEY, {"data": {"v": "1"}}),
    "patch_status": lambda c: c.patch_status(CM_KEY, {"status": {"x": 1}}),
    "apply": lambda c: c.apply({**_cm(), "data": {"v": "1"}}),
    "delete": lambda c: c.delete(CM_KEY),
    "event": lambda c: c.event(_cm(), "Seen", "seen"),
}


def test_every_write_verb_is_covered() -> None:
    assert set(VERBS) == set(PUBLIC_WRITES)


def _fake() -> FakeClient:
    return FakeClient([_cm()], primary="configmaps", request=CM_KEY)


def _fence(valid: bool) -> WriteFence:
    return WriteFence(lambda: valid, "default/leader", CM_KEY)


def _sync_under(fence: WriteFence | None, write: Callable[[], Any]) -> Any:
    token = fencing.enter(fence)
    try:
        return write()
    finally:
        fencing.leave(token)


@pytest.mark.parametrize("verb", VERBS)
def test_a_write_under_a_closed_fence_raises_fenced_and_sends_nothing(verb: str) -> None:
    fake = _fake()
    fence = _fence(False)
    with pytest.raises(declop.Fenced, match="is left to the Lease's new owner"):
        _sync_under(fence, lambda: VERBS[verb](fake))
    assert fake.writes == [] and fake.events == []
    assert fake.get(CM_KEY)["data"] == {"v": "0"}
    assert fence.tripped is not None


@pytest.mark.parametrize("verb", VERBS)
def test_the_async_client_is_fenced_the_same(verb: str) -> None:
    fake = _fake().aio
    fence = _fence(False)

    async def write() -> None:
        token = fencing.enter(fence)
        try:
            await VERBS[verb](fake)
        finally:
            fencing.leave(token)

    with pytest.raises(declop.Fenced):
        asyncio.run(write())
    assert fake.writes == [] and fake.events == []


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("fence", [None, _fence(True)], ids=["outside a call", "open fence"])
def test_a_write_outside_a_call_or_under_an_open_fence_is_sent(verb: str, fence: WriteFence | None) -> None:
    fake = _fake()
    _sync_under(fence, lambda: VERBS[verb](fake))
    assert len(fake.writes) + len(fake.events) == 1


def test_the_sync_client_in_a_worker_thread_carries_the_fence_to_the_loop() -> None:
    """A plain handler runs in an executor thread and its client sends each request as a
    coroutine on the manager's loop: the fence set in the thread must be the one checked there."""
    server = FakeApiServer()
    server.seed(_cm())

    async def main() -> tuple[BaseException | None, Any]:
        loop = asyncio.get_running_loop()
        ctx = ClientContext(server, server.discovery, None, loop, recorder=server)  # type: ignore[arg-type]
        info = server.discovery.resolve_cached("configmaps")
        client = Client(ctx, info, CM_KEY)

        def handler(fence: WriteFence | None) -> BaseException | None:
            try:
                _sync_under(fence, lambda: client.patch(CM_KEY, {"data": {"v": "1"}}))
            except declop.Fenced as exc:
                return exc
            return None

        closed = await loop.run_in_executor(None, handler, _fence(False))
        sent = await loop.run_in_executor(None, handler, None)  # the same thread pool, no fence set
        return closed, sent

    closed, sent = asyncio.run(main())
    assert isinstance(closed, declop.Fenced) and sent is None
    assert [(w.verb, w.body) for w in server.writes] == [("patch", {"data": {"v": "1"}})], "only the unfenced one"


# -- reads of the reconciled object: from what woke the reconcile --------------------------------


def _cached(pool: InformerPool, info: Any, version: str, *, labels: str = "") -> Writer:
    """The writer of the pool's informer of ``info`` (filtered by ``labels``), its store synced and
    holding the ConfigMap c at ``version`` (its data says which)."""
    writer = Writer(pool.get(info, "", label_selector=labels).store)
    writer.upsert(_labelled(version))
    writer.store.synced = True
    return writer


def _labelled(version: str) -> dict[str, object]:
    meta = {"name": "c", "namespace": "default", "labels": {"app": "x"}, "resourceVersion": version}
    return {**_cm(), "metadata": meta, "data": {"v": version}}


def test_the_reconciled_object_is_read_from_the_informer_that_woke_the_controller() -> None:
    """A ``labels=`` controller is woken by its filtered informer; an unfiltered cache of the same
    resource is a second watch that may lag. Reading the object from the lagging one would show
    the handler the state before the event that woke it, and nothing wakes it again when that
    cache catches up: the update would be lost. ``get(request)`` reads the filtered store."""
    server = FakeApiServer()
    info = server.discovery.resolve_cached("configmaps")
    pool = InformerPool(transport=None)  # type: ignore[arg-type]
    _cached(pool, info, "1")  # the unfiltered cache: not yet seen the update
    woke = _cached(pool, info, "2", labels="app=x")  # delivered it, and woke the controller
    ctx = ClientContext(server, server.discovery, pool, None)  # type: ignore[arg-type]
    for flavour in (Client, AsyncClient):
        client = flavour(ctx, info, CM_KEY, "copy", (woke.store,))
        assert client.get(CM_KEY)["data"] == {"v": "2"}
        assert client.get()["data"] == {"v": "2"}
        assert client.get("configmaps", "default/c")["data"] == {"v": "2"}
        # the reconciled object once it left the filter: the unfiltered cache, as any other read
        woke.delete(CM_KEY)
        assert client.get(CM_KEY)["data"] == {"v": "1"}
        woke.upsert(_labelled("2"))
    assert Client(ctx, info, CM_KEY, "copy").get(CM_KEY)["data"] == {"v": "1"}, "no own stores: the shared cache"


def test_a_list_of_the_primary_shows_the_reconciled_object_as_get_reads_it() -> None:
    """Issue 42: ``client.list()`` of the primary resource reads the unfiltered cache, which may
    lag the filtered one that woke the reconcile; the reconciled object in it is the one
    ``get(request)`` reads — newer, gone when it no longer matches the list's selector, there when
    the lagging cache has not seen it yet — and every other object is the unfiltered cache's."""
    server = FakeApiServer()
    info = server.discovery.resolve_cached("configmaps")
    pool = InformerPool(transport=None)  # type: ignore[arg-type]
    shared = _cached(pool, info, "1")  # the unfiltered cache: not yet seen the update
    other = {**_labelled("7"), "metadata": {**_labelled("7")["metadata"], "name": "d"}}
    shared.upsert(other)
    woke = _cached(pool, info, "2", labels="app=x")
    ctx = ClientContext(server, server.discovery, pool, None)  # type: ignore[arg-type]

    def listed(client: Any, **kw: Any) -> dict[str, str]:
        return {o["metadata"]["name"]: o["data"]["v"] for o in client.list(**kw)}

    for flavour in (Client, AsyncClient):
        client = flavour(ctx, info, CM_KEY, "copy", (woke.store,))
        assert listed(client) == {"c": "2", "d": "7"}
        assert listed(client, labels="app=x") == {"c": "2", "d": "7"}
        assert listed(client, namespace="default") == {"c": "2", "d": "7"}
        newer = _labelled("3")
        newer["metadata"]["labels"] = {"app": "x", "tier": "web"}
        woke.upsert(newer)
        assert listed(client, labels="tier=web") == {"c": "3"}, "the unfiltered copy has no tier label"
        assert listed(client, labels="tier=db") == {}
        shared.delete(CM_KEY)  # the lagging cache has not seen c at all
        assert listed(client) == {"c": "3", "d": "7"}
        # left the filter: the unfiltered cache's copy, as any other read
        woke.delete(CM_KEY)
        assert listed(client) == {"d": "7"}
        shared.upsert(_labelled("1"))
        assert listed(client) == {"c": "1", "d": "7"}
        woke.upsert(_labelled("2"))
    assert listed(Client(ctx, info, CM_KEY, "copy")) == {"c": "1", "d": "7"}, "no own stores: the shared cache"


def test_a_list_with_an_index_keeps_the_reconciled_object_only_if_its_newer_version_is_indexed() -> None:
    server = FakeApiServer()
    info = server.discovery.resolve_cached("configmaps")
    pool = InformerPool(transport=None)  # type: ignore[arg-type]
    pool.add_indexer(info, "by_v", lambda o: [o["data"]["v"]])
    shared = _cached(pool, info, "1")
    woke = _cached(pool, info, "2", labels="app=x")
    ctx = ClientContext(server, server.discovery, pool, None)  # type: ignore[arg-type]
    client = AsyncClient(ctx, info, CM_KEY, "copy", (woke.store,))
    assert [o["data"]["v"] for o in client.list(index=("by_v", "1"))] == []
    assert [o["data"]["v"] for o in client.list(index=("by_v", "2"))] == ["2"]
    assert shared.store.get(CM_KEY)["data"] == {"v": "1"}  # type: ignore[index]
