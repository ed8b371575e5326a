"""declop.testing.fakes.client: the fake apiserver/clients and run_reconcile, with no apiserver at all."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field

import declop
from declop.kube.discovery import ResourceInfo
from declop.loader import load
from declop.reconcile.mapping import enqueue_mapped
from declop.registry import default_registry
from declop.testing.fakes.client import (
    FakeApiServer,
    FakeClient,
    ReconcileOutcome,
    Write,
    arun_reconcile,
    run_reconcile,
)
from declop.typed.crd import definitions
from declop.typed.model import CustomResource, FreeForm

EXAMPLES = Path(__file__).resolve().parents[4] / "examples"


class WidgetModel(CustomResource, group="example.com", version="v1", kind="Widget", short_names=("wg",)):
    spec: FreeForm = Field(default_factory=dict)
RID = "00000000-0000-4000-8000-000000000000"


def cm(name: str = "c", namespace: str = "ns", labels: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = labels
    meta.update(extra.pop("meta", {}))
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": "v"}, **extra}


def widget(name: str = "w", namespace: str = "ns", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


# -- reads ------------------------------------------------------------------------------------


def test_reads_come_from_stores_and_are_copies() -> None:
    fake = FakeClient([cm("a", labels={"app": "x"}), cm("b"), cm("c", namespace="other")])
    got = fake.get("configmaps", "ns/a")
    assert got["metadata"]["uid"] and got["metadata"]["resourceVersion"]
    got["data"]["k"] = "mutated"
    assert fake.get("configmaps", "ns/a")["data"] == {"k": "v"}
    assert sorted(o["metadata"]["name"] for o in fake.list("configmaps", namespace="ns")) == ["a", "b"]
    assert [o["metadata"]["name"] for o in fake.list("cm", labels="app=x")] == ["a"]
    assert len(fake.list("configmaps")) == 3
    with pytest.raises(declop.NotFound):
        fake.get("configmaps", "ns/nope")
    assert fake.writes == []


def test_a_bound_client_reads_like_a_handlers_client() -> None:
    fake = FakeClient([cm("a"), widget("w")], primary="widgets.example.com", request="ns/w")
    assert fake.get(declop.Request("ns", "w"))["kind"] == "Widget"  # the primary, by Request
    assert fake.get()["metadata"]["name"] == "w"  # the object being reconciled
    assert fake.get("configmaps", "a")["metadata"]["name"] == "a"  # a bare name: this namespace
    assert fake.get("configmaps", name="a")["metadata"]["namespace"] == "ns"


def test_unknown_resources_are_refused_like_discovery_would() -> None:
    with pytest.raises(declop.errors.ConfigError, match="does not know 'gizmos'"):
        FakeClient().get("gizmos", "ns/x")


def test_resources_from_a_crd_object_and_from_resource_infos() -> None:
    (crd,) = definitions([WidgetModel])  # what `declop crd examples/crd/handlers.py` prints
    fake = FakeClient([crd, widget()])
    assert fake.get("wg", "ns/w")["kind"] == "Widget"  # the short name comes from the CRD
    info = ResourceInfo("example.com", "v1", "gadgets", "Gadget", False)
    fake = FakeClient([{"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"}}], resources=[info])
    assert fake.get("gadgets", "g")["metadata"]["name"] == "g"


def test_unknown_kinds_and_names_are_guessed() -> None:
    fake = FakeClient([widget()])
    assert fake.get("widgets.example.com", "ns/w")["kind"] == "Widget"
    assert fake.get("widget.v1.example.com", "ns/w")["kind"] == "Widget"
    fake.create({"apiVersion": "example.com/v1", "kind": "Policy", "metadata": {"name": "p", "namespace": "ns"}})
    assert fake.get("policies.example.com", "ns/p")["kind"] == "Policy"


def test_seeded_objects_need_identity() -> None:
    with pytest.raises(ValueError, match="apiVersion and kind"):
        FakeClient([{"metadata": {"name": "x"}}])
    with pytest.raises(ValueError, match="namespaced"):
        FakeClient([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}])


# -- writes -----------------------------------------------------------------------------------


def test_create_sets_server_fields_and_refuses_duplicates() -> None:
    fake = FakeClient(primary="configmaps", request="ns/x")
    made = fake.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})
    assert made["metadata"]["namespace"] == "ns"  # the namespace being reconciled
    assert made["metadata"]["uid"] and made["metadata"]["creationTimestamp"]
    assert "generation" not in made["metadata"]  # ConfigMaps have none
    with pytest.raises(declop.Conflict, match="already exists"):
        fake.create("configmaps", {"metadata": {"name": "x", "namespace": "ns"}})
    gen = fake.create("configmaps", {"metadata": {"generateName": "x-", "namespace": "ns"}})
    assert gen["metadata"]["name"].startswith("x-") and len(gen["metadata"]["name"]) == 7
    assert [(w.verb, w.resource) for w in fake.writes] == [("create", "configmaps")] * 3


def test_update_is_guarded_by_the_resource_version_and_keeps_status() -> None:
    fake = FakeClient([{**widget(), "status": {"ready": True}}])
    w = fake.get("widgets.example.com", "ns/w")
    assert w["metadata"]["generation"] == 1
    w["spec"] = {"size": 2}
    w["status"] = {"ready": False}  # the status subresource is not written by an update
    updated = fake.update(w)
    assert updated["spec"] == {"size": 2} and updated["status"] == {"ready": True}
    assert updated["metadata"]["generation"] == 2
    with pytest.raises(declop.Conflict, match="has been modified"):
        fake.update(w)  # w still carries the old resourceVersion
    # an update that changes nothing is still sent, but the object does not move
    same = fake.update(fake.get("widgets.example.com", "ns/w"))
    assert same["metadata"]["resourceVersion"] == updated["metadata"]["resourceVersion"]
    assert [w.verb for w in fake.writes] == ["update", "update", "update"]


def test_patch_types() -> None:
    fake = FakeClient([cm(labels={"a": "1"})])
    fake.patch("configmaps", "ns/c", {"metadata": {"labels": {"a": None, "b": "2"}}})
    assert fake.get("configmaps", "ns/c")["metadata"]["labels"] == {"b": "2"}
    fake.patch("configmaps", "ns/c", [{"op": "add", "path": "/data/x", "value": "y"}], type="json")
    assert fake.get("configmaps", "ns/c")["data"] == {"k": "v", "x": "y"}
    with pytest.raises(declop.errors.ApiError) as e:
        fake.patch("configmaps", "ns/c", [{"op": "test", "path": "/data/x", "value": "z"}], type="json")
    assert e.value.status == 422
    rv = fake.get("configmaps", "ns/c")["metadata"]["resourceVersion"]
    with pytest.raises(declop.Conflict):  # an optimistic-lock merge patch
        fake.patch("configmaps", "ns/c", {"metadata": {"resourceVersion": "1"}, "data": {"k": "w"}})
    assert fake.get("configmaps", "ns/c")["metadata"]["resourceVersion"] == rv
    assert [(w.verb, w.patch_type) for w in fake.writes] == [("patch", "merge"), ("patch", "json"), ("patch", "json"), ("patch", "merge")]


def test_strategic_patch_merges_lists_of_objects_by_name() -> None:
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "ns"},
        "spec": {"template": {"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}}},
    }
    fake = FakeClient([deploy])
    fake.patch("deployments.apps", "ns/d", {"spec": {"template": {"spec": {"containers": [{"name": "b", "image": "z"}]}}}}, type="strategic")
    containers = fake.get("deployments.apps", "ns/d")["spec"]["template"]["spec"]["containers"]
    assert containers == [{"name": "a", "image": "x"}, {"name": "b", "image": "z"}]


def test_apply_creates_then_merges() -> None:
    fake = FakeClient()
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}, "data": {"a": "1"}}
    fake.apply(body, field_manager="me")
    fake.apply({**body, "data": {"b": "2"}})
    assert fake.get("configmaps", "ns/c")["data"] == {"a": "1", "b": "2"}  # approximation: no field ownership
    assert [(w.verb, w.patch_type) for w in fake.writes] == [("apply", "apply"), ("apply", "apply")]


def test_patch_status_touches_only_status() -> None:
    fake = FakeClient([widget(size=1)], primary="widgets.example.com", request="ns/w")
    fake.patch_status(declop.Request("ns", "w"), {"status": {"ready": True}, "spec": {"size": 9}})
    w = fake.get()
    assert w["status"] == {"ready": True} and w["spec"] == {"size": 1}
    assert w["metadata"]["generation"] == 1
    assert fake.writes[-1].verb == "patch_status"


def test_delete_honours_finalizers_and_not_found_is_success() -> None:
    fake = FakeClient([cm("held", meta={"finalizers": ["x.io/f"]}), cm("free")])
    fake.delete("configmaps", "ns/free")
    fake.delete("configmaps", "ns/free")  # already gone: fine
    with pytest.raises(declop.NotFound):
        fake.get("configmaps", "ns/free")
    fake.delete("configmaps", "ns/held")
    held = fake.get("configmaps", "ns/held")
    assert held["metadata"]["deletionTimestamp"]
    with pytest.raises(declop.errors.ApiError, match="no new finalizers"):
        fake.patch("configmaps", "ns/held", {"metadata": {"finalizers": ["x.io/f", "y.io/g"]}})
    fake.patch("configmaps", "ns/held", {"metadata": {"finalizers": None}})
    assert fake.objects("configmaps") == []


def test_events_and_live_reads() -> None:
    fake = FakeClient([cm()])
    fake.event(fake.get("configmaps", "ns/c"), "Synced", "all good")
    assert fake.events == [Write("event", "events.events.k8s.io", declop.Request("ns", "c"), fake.events[0].body)]
    assert fake.events[0].body["reason"] == "Synced"
    assert fake.writes == []
    assert fake.live.get("configmaps", "ns/c")["data"] == {"k": "v"}
    assert [o["metadata"]["name"] for o in fake.live.list("configmaps", namespace="ns")] == ["c"]


def test_writes_must_be_json() -> None:
    with pytest.raises(TypeError):
        FakeClient().create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "ns"}, "data": {"k": {1, 2}}})


def test_the_async_client_shares_the_fake() -> None:
    fake = FakeClient([cm()])

    async def change() -> None:
        await fake.aio.patch("configmaps", "ns/c", {"data": {"k": "async"}})

    asyncio.run(change())
    assert fake.get("configmaps", "ns/c")["data"] == {"k": "async"}
    assert fake.aio.sync.get("configmaps", "ns/c")["data"] == {"k": "async"}


# -- indexes ----------------------------------------------------------------------------------


def test_indexes_follow_creates_updates_and_deletes() -> None:
    registry = declop.registry.Registry()
    declop.index("configmaps", "by_color", lambda o: [(o["metadata"].get("labels") or {}).get("color")], registry=registry)
    fake = FakeClient([cm("a", labels={"color": "red"})], registry=registry)

    def names(color: str) -> list[str]:
        return sorted(o["metadata"]["name"] for o in fake.list("configmaps", index=("by_color", color)))

    assert names("red") == ["a"]
    fake.create(cm("b", labels={"color": "red"}))
    assert names("red") == ["a", "b"]
    fake.patch("configmaps", "ns/b", {"metadata": {"labels": {"color": "blue"}}})
    assert (names("red"), names("blue")) == (["a"], ["b"])
    fake.delete("configmaps", "ns/a")
    assert names("red") == []
    fake.index("configmaps", "by_name", lambda o: [o["metadata"]["name"]])
    assert [o["metadata"]["name"] for o in fake.list("configmaps", index=("by_name", "b"))] == ["b"]


def test_a_map_function_with_a_client_runs_against_the_fake() -> None:
    registry = declop.registry.Registry()
    declop.index("widgets.example.com", "by_secret", lambda w: [w["spec"].get("secretName")], registry=registry)
    fake = FakeClient([widget("a", secretName="s"), widget("b", secretName="s"), widget("c", secretName="t")], registry=registry)

    def widgets_for(secret: dict[str, Any], client: Any) -> list[dict[str, Any]]:
        return client.list("widgets.example.com", index=("by_secret", secret["metadata"]["name"]))

    mapper = enqueue_mapped(widgets_for, fake)
    secret = {"metadata": {"name": "s", "namespace": "ns"}}
    assert mapper(None, secret) == {declop.Request("ns", "a"), declop.Request("ns", "b")}

    def not_synced(secret: dict[str, Any], client: Any) -> list[Any]:
        raise declop.errors.CacheNotSyncedError("still listing")

    assert enqueue_mapped(not_synced, fake)(None, secret) == set()  # the primary's list covers it
    assert enqueue_mapped(lambda o: ["ns/x"], fake)(None, secret) == {declop.Request("ns", "x")}


# -- run_reconcile ----------------------------------------------------------------------------


def test_phases_and_the_finalizer_protocol() -> None:
    registry = declop.registry.Registry()
    seen: list[tuple[declop.Phase, bool]] = []

    @declop.reconciler("configmaps", finalizer="x.io/cleanup", registry=registry)
    def handler(phase, obj, **_):
        seen.append((phase, obj is not None and "x.io/cleanup" in (obj["metadata"].get("finalizers") or ())))

    out = run_reconcile(handler, "ns/c", [cm()], registry=registry)
    assert out.phase is declop.Phase.CREATED and seen[-1] == (declop.Phase.CREATED, True)
    assert [(w.verb, w.patch_type) for w in out.writes] == [("patch", "json")]  # the finalizer, before the handler
    out = run_reconcile(handler, "ns/c", client=out.client, registry=registry)
    assert out.phase is declop.Phase.UPDATED and out.writes == ()
    out.client.delete("configmaps", "ns/c")
    out = run_reconcile(handler, "ns/c", client=out.client, registry=registry)
    assert out.phase is declop.Phase.DELETING and [w.verb for w in out.writes] == ["patch"]
    assert out.client.objects("configmaps") == []  # our finalizer released: the object is gone
    out = run_reconcile(handler, "ns/c", client=out.client, registry=registry)
    assert out.phase is declop.Phase.DELETED and seen[-1] == (declop.Phase.DELETED, False)


def test_a_failing_cleanup_keeps_the_finalizer() -> None:
    def handler(phase, **_):
        if phase is declop.Phase.DELETING:
            raise RuntimeError("external system down")

    fake = FakeClient([cm(meta={"finalizers": ["x.io/f"], "deletionTimestamp": "2024-01-01T00:00:00Z"})])
    out = run_reconcile(handler, "ns/c", client=fake, resource="configmaps", finalizer="x.io/f")
    assert out.phase is declop.Phase.DELETING and out.action == "retry"
    assert fake.get("configmaps", "ns/c")["metadata"]["finalizers"] == ["x.io/f"]


def test_only_declared_arguments_are_injected() -> None:
    got: dict[str, Any] = {}

    def narrow(name, namespace):
        got.update(name=name, namespace=namespace)

    def wide(**kwargs):
        got.update(kwargs)

    run_reconcile(narrow, "ns/c", [cm()], resource="configmaps")
    assert got == {"name": "c", "namespace": "ns"}
    got.clear()
    out = run_reconcile(wide, "ns/c", [cm()], resource="configmaps", reconcile_id=RID)
    assert set(got) == {"request", "name", "namespace", "client", "logger", "reconcile_id", "phase", "obj", "trigger"}
    assert got["request"] == declop.Request("ns", "c") and got["reconcile_id"] == RID
    assert isinstance(got["client"], declop.Client) and got["obj"]["data"] == {"k": "v"}
    assert out.reconcile_id == RID
    with pytest.raises(declop.errors.RegistrationError, match=r"takes 'spec', which Kopf passes and declop does not: .*obj\['spec'\]"):
        run_reconcile(lambda spec: None, "ns/c", resource="configmaps")


def test_kwargs_fill_the_handlers_own_defaulted_parameters() -> None:
    """The test seam of docs/contract.md §2: a parameter with a default is the handler's own;
    ``kwargs=`` gives it a value for one reconcile, and only such a parameter may be given."""
    import datetime

    def stamp(request, client, now=datetime.datetime.now, limit: int = 3):
        client.patch(request, {"metadata": {"annotations": {"stamped": now().isoformat(), "limit": str(limit)}}})

    fixed = datetime.datetime(2030, 1, 2, 3, 4, 5)
    out = run_reconcile(stamp, "ns/c", [cm()], resource="configmaps", kwargs={"now": lambda: fixed})
    assert out.ok
    assert out.client.get("configmaps", "ns/c")["metadata"]["annotations"] == {"stamped": "2030-01-02T03:04:05", "limit": "3"}

    with pytest.raises(TypeError, match=r"kwargs=\{'client': …\}: declop passes 'client' itself"):
        run_reconcile(stamp, "ns/c", [cm()], resource="configmaps", kwargs={"client": None})
    with pytest.raises(TypeError, match=r"stamp has no parameter 'nwo' with a default \(its own: limit, now\)"):
        run_reconcile(stamp, "ns/c", [cm()], resource="configmaps", kwargs={"nwo": fixed})

    async def astamp(request, client, now=datetime.datetime.now):
        await client.patch(request, {"metadata": {"annotations": {"stamped": now().isoformat()}}})

    async def in_a_test() -> ReconcileOutcome:
        return await arun_reconcile(astamp, "ns/c", [cm()], resource="configmaps", kwargs={"now": lambda: fixed})

    assert asyncio.run(in_a_test()).client.get("configmaps", "ns/c")["metadata"]["annotations"] == {"stamped": "2030-01-02T03:04:05"}


@pytest.mark.parametrize(
    "behaviour, action, requeue, error",
    [
        (lambda: None, "done", None, None),
        (lambda: declop.Result(), "done", None, None),
        (lambda: declop.Result(requeue_after=2.5), "requeue_after", 2.5, None),
        (lambda: declop.Result(requeue_after=0), "done", None, None),
        (lambda: declop.Result(requeue_after=-1), "terminal", None, declop.errors.InvalidResult),
        (lambda: (_ for _ in ()).throw(RuntimeError("boom")), "retry", None, RuntimeError),
        (lambda: (_ for _ in ()).throw(declop.Conflict("stale")), "retry", None, declop.Conflict),
        (lambda: (_ for _ in ()).throw(declop.TerminalError("bad spec")), "terminal", None, declop.TerminalError),
        (lambda: True, "terminal", None, declop.errors.InvalidResult),
    ],
)
def test_the_outcome_table(behaviour: Any, action: str, requeue: float | None, error: type | None) -> None:
    def handler(**_):
        return behaviour()

    out = run_reconcile(handler, "ns/c", [cm()], resource="configmaps")
    assert (out.action, out.requeue_after) == (action, requeue)
    assert (type(out.error) if out.error else None) is error
    assert out.ok is (error is None)
    if error is not None:
        with pytest.raises(error):
            out.raise_error()


def test_logs_have_the_seed_shape_and_reach_pytest(caplog: pytest.LogCaptureFixture) -> None:
    def handler(logger, **_):
        logger.info("Pod created")
        logger.debug("hidden at INFO")
        raise declop.Conflict("stale")

    with caplog.at_level(logging.INFO):
        out = run_reconcile(handler, "ns/c", [cm()], resource="configmaps", reconcile_id=RID)
    assert out.logs == (
        f'INFO Pod created {{"controller": "handler", "namespace": "ns", "name": "c", "reconcileID": "{RID}"}}',
        f'INFO Conflict, requeueing {{"controller": "handler", "namespace": "ns", "name": "c", "reconcileID": "{RID}", "error": "stale"}}',
    )
    assert out.messages == ("Pod created", "Conflict, requeueing")
    assert "Pod created" in caplog.text
    out = run_reconcile(handler, "ns/c", [cm()], resource="configmaps", log_level=logging.DEBUG)
    assert "hidden at INFO" in out.messages


def test_registered_functions_are_found_in_their_registry() -> None:
    registry = declop.registry.Registry()

    @declop.reconciler("configmaps", registry=registry, name="custom-name")
    def handler(**_):
        pass

    out = run_reconcile(handler, "ns/c", [cm()], registry=registry)
    assert out.logs == () and out.ok
    out = run_reconcile(registry.registrations[0], "ns/c", [cm()])
    assert out.ok
    with pytest.raises(TypeError, match="not registered"):
        run_reconcile(handler, "ns/c")  # not in the default registry
    with pytest.raises(ValueError, match="namespace/name"):
        run_reconcile(handler, "c", registry=registry)


def test_the_request_may_be_the_object() -> None:
    out = run_reconcile(lambda name, **_: None, cm("x"), [cm("x")], resource="configmaps")
    assert out.phase is declop.Phase.UPDATED


def test_async_handlers() -> None:
    async def handler(request, client, **_):
        await asyncio.sleep(0)
        assert isinstance(client, declop.AsyncClient)
        await client.patch(request, {"data": {"k": "async"}})

    out = run_reconcile(handler, "ns/c", [cm()], resource="configmaps")
    assert out.ok and out.client.get("configmaps", "ns/c")["data"] == {"k": "async"}

    async def in_a_test() -> ReconcileOutcome:
        with pytest.raises(RuntimeError, match="arun_reconcile"):
            run_reconcile(handler, "ns/c", [cm()], resource="configmaps")
        return await arun_reconcile(handler, "ns/c", [cm()], resource="configmaps")

    assert asyncio.run(in_a_test()).ok


def test_continuing_from_a_previous_outcome_reports_only_new_writes() -> None:
    def handler(request, client, **_):
        client.patch(request, {"data": {"k": "set"}})

    first = run_reconcile(handler, "ns/c", [cm()], resource="configmaps")
    second = run_reconcile(handler, "ns/c", client=first.client, resource="configmaps")
    assert len(first.writes) == 1 and len(second.writes) == 1
    assert len(second.client.writes) == 2
    assert isinstance(first.client.server, FakeApiServer)


def test_the_examples_reconcilers_run_without_an_apiserver_in_under_a_second() -> None:
    started = time.perf_counter()
    crd_example, watches_example = load([str(EXAMPLES / "crd" / "handlers.py"), str(EXAMPLES / "watches.py")])
    (crd,) = definitions([crd_example.Widget])
    w = {**widget("hello", namespace="default", message="hi", replicas=1, secretName="db")}
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db", "namespace": "default"}, "data": {"p": "eA=="}}
    runs = 0
    out = run_reconcile(crd_example.widget, "default/hello", [crd, w, secret])
    runs += 1
    assert [w.verb for w in out.writes] == ["create", "create", "patch_status"], out.writes
    for _ in range(3):
        again = run_reconcile(crd_example.widget, "default/hello", client=out.client)
        runs += 1
        assert again.writes == ()
    out.client.delete("services", "default/hello")
    assert [w.verb for w in run_reconcile(crd_example.widget, "default/hello", client=out.client).writes] == ["create"]
    out2 = run_reconcile(watches_example.secret_checksum, "default/hello", client=out.client)
    runs += 2
    assert out2.messages == ("Secret checksum recorded",)
    assert {r.name for r in default_registry.registrations} >= {"widget", "secret_checksum"}
    for _ in range(20):
        run_reconcile(crd_example.widget, "default/hello", client=out.client)
        run_reconcile(watches_example.secret_checksum, "default/hello", client=out.client)
        runs += 2
    elapsed = time.perf_counter() - started
    print(f"{runs} reconciles of the examples through the kit: {elapsed * 1000:.1f} ms")
    assert elapsed < 1.0


def test_run_reconcile_gives_a_metadata_only_handler_what_its_cache_would_hold() -> None:
    registry = declop.registry.Registry()
    seen: list[Any] = []

    @declop.reconciler("configmaps", metadata_only=True, registry=registry)
    def handler(request: Any, obj: Any, client: Any, **_: Any) -> None:
        seen.append((obj, client.live.get(request)["data"]))

    run_reconcile(handler, "ns/c", [cm(meta={"managedFields": [{"manager": "kubectl"}]})], registry=registry)
    ((obj, data),) = seen
    assert obj["kind"] == "PartialObjectMetadata" and obj["apiVersion"] == "meta.k8s.io/v1"
    assert set(obj) == {"kind", "apiVersion", "metadata"}
    assert obj["metadata"]["name"] == "c" and "managedFields" not in obj["metadata"]
    assert data == {"k": "v"}


# --------------------------------------------------------------------------- typed handlers (issue 26)

from pydantic import BaseModel, Field  # noqa: E402 - the typed section's own imports

from declop.errors import InvalidObject  # noqa: E402
from declop.registry import Registry  # noqa: E402
from declop.typed.model import CustomResource, FreeForm  # noqa: E402


class ThingSpec(BaseModel):
    size: int = Field(1, ge=0, le=10)
    config: FreeForm = Field(default_factory=dict)


class ThingStatus(BaseModel):
    ready: bool = False
    observedGeneration: int | None = None
    note: str = ""


class Thing(CustomResource, group="example.com", version="v1", kind="Thing"):
    spec: ThingSpec
    status: ThingStatus | None = None


def thing(name: str, size: int, status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "example.com/v1", "kind": "Thing",
                           "metadata": {"name": name, "namespace": "default", "generation": 1}, "spec": {"size": size}}
    if status is not None:
        obj["status"] = status
    return obj


def typed_registry(seen: list[Any]) -> tuple[Registry, Any]:
    reg = Registry()

    @reg.reconciler(Thing, finalizer="example.com/cleanup")
    def things(request: declop.Request, client: declop.Client, obj: Thing | None, **_: Any) -> None:
        seen.append(obj)
        if obj is None:
            return
        status = obj.status or ThingStatus()
        status.ready = obj.spec.size > 0
        status.observedGeneration = obj.metadata.generation
        client.patch_status(request, status)

    return reg, things


def test_run_reconcile_hands_a_typed_handler_its_model_and_sends_only_the_changed_status() -> None:
    seen: list[Any] = []
    reg, things = typed_registry(seen)
    out = run_reconcile(things, "default/t", [thing("t", 3, {"note": "someone else's"})], registry=reg)
    assert out.ok and isinstance(seen[0], Thing) and seen[0].spec.size == 3
    assert [(w.verb, w.patch_type) for w in out.writes_of("patch_status")] == [("patch_status", "json")]
    assert out.client.get("things.example.com", "default/t")["status"] == {
        "note": "someone else's", "ready": True, "observedGeneration": 1,  # the note: not the model's, kept
    }
    again = run_reconcile(things, "default/t", client=out.client, registry=reg)
    assert again.ok and again.writes == ()  # nothing differs: nothing sent


def test_run_reconcile_reports_an_invalid_object_and_skips_it() -> None:
    seen: list[Any] = []
    reg, things = typed_registry(seen)
    out = run_reconcile(things, "default/t", [thing("t", 30)], registry=reg)
    assert out.action == "invalid" and isinstance(out.error, InvalidObject)
    assert out.error.problems == ("spec.size: Input should be less than or equal to 10",)
    assert seen == [] and out.writes == ()  # not called, and no finalizer added to an object it cannot read
    assert out.messages == ("Object fails its model; skipped until it changes",)
    assert "spec.size: Input should be less than or equal to 10" in out.logs[0]


def test_an_async_typed_handler_gets_its_model_too() -> None:
    reg = Registry()
    seen: list[Any] = []

    @reg.reconciler(Thing)
    async def athings(request: declop.Request, client: declop.AsyncClient, obj: Thing, **_: Any) -> None:
        seen.append(obj)
        await client.patch_status(request, ThingStatus(ready=True))

    out = run_reconcile(athings, "default/a", [thing("a", 1)], registry=reg)
    assert out.ok and isinstance(seen[0], Thing)
    assert [w.verb for w in out.writes] == ["patch_status"]
    assert out.client.get("things.example.com", "default/a")["status"] == {"ready": True}


def test_a_typed_view_leaves_the_fake_cache_intact() -> None:
    reg = Registry()

    @reg.reconciler(Thing)
    def mutates(obj: Thing, **_: Any) -> None:
        obj.spec.config["deep"]["list"].append("x")
        obj.metadata.labels["changed"] = "yes"

    stored = thing("m", 1)
    stored["spec"]["config"] = {"deep": {"list": [1]}}
    out = run_reconcile(mutates, "default/m", [stored], registry=reg)
    assert out.ok
    after = out.client.get("things.example.com", "default/m")
    assert after["spec"]["config"] == {"deep": {"list": [1]}} and "labels" not in after["metadata"]


def test_an_empty_registry_passed_is_the_one_named_when_the_handler_is_not_in_it() -> None:
    """An empty Registry used to be falsy, so ``registry or default`` swapped it for the default
    one and the error named "the default registry" (issue 41)."""
    from declop.testing import run_reconcile

    def stray(**_: Any) -> None:
        return None

    empty = declop.registry.Registry()
    assert empty and len(empty) == 0
    with pytest.raises(TypeError, match="not registered in the given registry"):
        run_reconcile(stray, "default/x", registry=empty)


def test_an_event_type_kubernetes_refuses_fails_the_call_in_the_fake_as_in_a_cluster() -> None:
    """The fake used to record ``type="SomeType"``, which the real client refuses (issue 41); now
    the handler is told, with the fix in the message, whichever client it has."""
    from declop.testing import run_reconcile

    def handler(obj: Any, client: Any, **_: Any) -> None:
        client.event(obj, "Made", "made it", type="SomeType")

    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default"}}
    out = run_reconcile(handler, "default/x", resource="configmaps", objects=[cm])
    assert out.action == "retry" and out.events == ()
    assert isinstance(out.error, ValueError) and "'Normal' or 'Warning', got 'SomeType'" in str(out.error)


def test_the_verbs_unit_testing_md_lists_are_client_methods_or_the_status_replace() -> None:
    """unit-testing.md once listed an ``update_status`` verb as a client method that
    ``declop.Client`` does not have (issue 41): every verb the page calls a method is one."""
    import re

    from declop.testing import run_reconcile

    page = (Path(__file__).resolve().parents[4] / "docs" / "unit-testing.md").read_text()
    sentence = page[page.index("`verb` names the request"):]
    sentence = sentence[: sentence.index(";")]
    methods = re.findall(r"`([a-z_]+)`", sentence.split("— and")[0])[1:]
    assert methods and all(callable(getattr(declop.Client, m, None)) for m in methods), methods
    assert not hasattr(declop.Client, "update_status")

    def handler(obj: Any, client: Any, **_: Any) -> None:
        obj["status"] = {"ok": True}
        client.update(obj, subresource="status")

    out = run_reconcile(handler, "default/t", [*definitions([Thing]), thing("t", 1)], resource="things.example.com")
    assert [w.verb for w in out.writes] == ["update_status"], out
