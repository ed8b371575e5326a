"""Relations between objects on a real kube-apiserver: owned children, watched resources,
predicates, cache indexes, and the write helpers (create_or_update, retry_on_conflict).

The Widget tests run the examples' own registrations (examples/crd/handlers.py and
examples/watches.py), copied into a fresh registry with a call counter around each handler.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import kubernetes.client
import pytest

import declop
from declop.loader import load
from declop.manager import Options
from declop.registry import Registration, Registry, default_registry
from declop.testing.cluster.runner import OperatorRunner, wait_for

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GROUP, VERSION, PLURAL = "example.com", "v1", "widgets"
WRITES = ("create", "update", "patch", "delete")


# -- helpers --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def widget_crd(control_plane: Any) -> None:
    env = control_plane.env()
    handlers = EXAMPLES / "crd" / "handlers.py"  # the CRD is its Widget model's, as `declop crd` prints it
    crd = subprocess.run([sys.executable, "-m", "declop", "crd", str(handlers)], capture_output=True, text=True, timeout=60, check=True).stdout
    for args in (
        ["apply", "-f", "-"],
        ["wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=30s"],
    ):
        result = subprocess.run(["kubectl", *args], env=env, input=crd, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr


class Calls:
    """Thread-safe record of reconciled names."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.lock = threading.Lock()

    def add(self, name: str) -> None:
        with self.lock:
            self.names.append(name)

    def of(self, name: str) -> int:
        with self.lock:
            return self.names.count(name)

    def set(self) -> set[str]:
        with self.lock:
            return set(self.names)

    def clear(self) -> None:
        with self.lock:
            self.names.clear()


def counted(reg: Registration, calls: Calls) -> Callable[..., Any]:
    """``reg.fn`` with a call counter; it takes every argument and passes on what ``reg.fn`` wants."""

    def pick(kw: dict[str, Any]) -> dict[str, Any]:
        return kw if reg.wants is None else {k: v for k, v in kw.items() if k in reg.wants}

    if reg.is_async:

        async def wrapper(**kw: Any) -> Any:
            calls.add(kw["request"].name)
            return await reg.fn(**pick(kw))

    else:

        def wrapper(**kw: Any) -> Any:  # type: ignore[misc]
            calls.add(kw["request"].name)
            return reg.fn(**pick(kw))

    wrapper.__name__ = reg.name
    if reg.model is not None:  # obj: Widget — the wrapper declares it too, so it gets the typed view
        wrapper.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [
                inspect.Parameter("obj", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=reg.model),
                inspect.Parameter("kw", inspect.Parameter.VAR_KEYWORD),
            ]
        )
    return wrapper


def example_registry(path: Path, calls: Calls) -> Registry:
    """A fresh registry holding the registrations and indexes that ``path`` makes at import."""
    (module,) = load([str(path)])  # registers in the default registry, once per process
    registry = Registry()
    for reg in default_registry.registrations:
        if reg.fn.__module__ == module.__name__:
            registry.reconciler(
                reg.resource,
                name=reg.name,
                finalizer=reg.finalizer,
                namespaces=reg.namespaces,
                labels=reg.labels or None,
                predicates=reg.predicates,
                owns=reg.owns,
                watches=reg.watches,
                max_concurrent=reg.max_concurrent,
            )(counted(reg, calls))
    for ix in default_registry.indexes:
        if ix.fn.__module__ == module.__name__:
            registry.index(ix.resource, ix.name, ix.fn)
    assert registry.registrations, f"{path} registers nothing"
    return registry


def runner(registry: Registry, kubeconfig: str, namespace: str) -> OperatorRunner:
    return OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=5))


def idle(op: OperatorRunner) -> bool:
    """Every controller's queue has nothing ready, delayed or in flight."""

    def check() -> bool:
        for c in op.manager.controllers:
            s = c.queue.statistics()
            if s.depth or s.processing or s.waiting:
                return False
        return True

    return op.call_soon(check)


def settle(op: OperatorRunner, quiet: float = 0.3) -> None:
    """Wait until the queues stay idle for ``quiet`` seconds (echoes of our own writes included)."""

    def calm() -> bool:
        if not idle(op):
            return False
        total = sum(c.reconciles for c in op.manager.controllers)
        time.sleep(quiet)
        return idle(op) and total == sum(c.reconciles for c in op.manager.controllers)

    wait_for(calm, 15, what="the operator to settle")


def cached(op: OperatorRunner, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
    """The object as the operator's cache holds it (framework-internal: do not mutate)."""

    def read() -> dict[str, Any] | None:
        info = op.manager.context.resolve(resource)
        for informer in op.manager.informers.existing(info):
            obj = informer.store.get(declop.Request(namespace, name))
            if obj is not None:
                return obj  # type: ignore[no-any-return]
        return None

    return op.call_soon(read)


def seen(op: OperatorRunner, resource: str, namespace: str, name: str, rv: str) -> None:
    """Wait until the cache holds this resourceVersion of the object, or a later one (the test
    knows etcd's resourceVersions are increasing integers; declop itself never compares them)."""

    def caught_up() -> bool:
        obj = cached(op, resource, namespace, name)
        return obj is not None and int(obj["metadata"]["resourceVersion"]) >= int(rv)

    wait_for(caught_up, 10, what=f"the cache to see {name} at {rv}")


def custom(api: Any) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(api)


def core(api: Any) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(api)


def apps(api: Any) -> kubernetes.client.AppsV1Api:
    return kubernetes.client.AppsV1Api(api)


def create_widget(api: Any, namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Widget", "metadata": {"name": name}, "spec": spec}
    return custom(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)  # type: ignore[no-any-return]


def patch_widget(api: Any, namespace: str, name: str, patch: dict[str, Any], status: bool = False) -> dict[str, Any]:
    fn = custom(api).patch_namespaced_custom_object_status if status else custom(api).patch_namespaced_custom_object
    return fn(GROUP, VERSION, namespace, PLURAL, name, patch)  # type: ignore[no-any-return]


def read_or_none(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def make_secret(api: Any, namespace: str, name: str, value: str) -> Any:
    body = {"metadata": {"name": name}, "stringData": {"password": value}}
    return core(api).create_namespaced_secret(namespace, body)


def writes(op: OperatorRunner) -> dict[str, int]:
    by_verb = op.statistics().by_verb
    return {v: by_verb.get(v, 0) for v in WRITES}


# -- owns= -----------------------------------------------------------------------------------


def test_an_owned_child_deleted_or_edited_by_hand_is_repaired_within_a_second(
    widget_crd, kubeconfig, k8s_api, namespace
):
    calls = Calls()
    registry = example_registry(EXAMPLES / "crd" / "handlers.py", calls)
    # replicas=0 throughout this file: the controller-manager would create Pods for a Deployment
    # (nothing runs them), and Pods left behind show up in other tests that watch all namespaces
    create_widget(k8s_api, namespace, "hello", message="hi", replicas=0)
    with runner(registry, kubeconfig, namespace) as op:
        deployment = wait_for(lambda: read_or_none(lambda: apps(k8s_api).read_namespaced_deployment("hello", namespace)), 10)
        service = wait_for(lambda: read_or_none(lambda: core(k8s_api).read_namespaced_service("hello", namespace)), 10)
        ref = deployment.metadata.owner_references[0]
        assert (ref.kind, ref.name, ref.controller, ref.block_owner_deletion) == ("Widget", "hello", True, True)
        assert service.metadata.owner_references[0].controller is True
        settle(op)

        for kind, read, delete in (
            ("Deployment", apps(k8s_api).read_namespaced_deployment, apps(k8s_api).delete_namespaced_deployment),
            ("Service", core(k8s_api).read_namespaced_service, core(k8s_api).delete_namespaced_service),
        ):
            old_uid = read("hello", namespace).metadata.uid
            started = time.monotonic()
            delete("hello", namespace)
            def recreated(read: Callable[..., Any] = read, old_uid: str = old_uid) -> Any:
                obj = read_or_none(lambda: read("hello", namespace))
                return obj if obj is not None and obj.metadata.uid != old_uid else None

            fresh = wait_for(recreated, 5, interval=0.01, what=f"the {kind} to be recreated")
            elapsed = time.monotonic() - started
            assert elapsed < 1.0, f"{kind} repaired after {elapsed:.2f} s"
            assert fresh.metadata.owner_references[0].name == "hello"

        # edited by hand: scaled to 4, the Widget says 0
        started = time.monotonic()
        apps(k8s_api).patch_namespaced_deployment("hello", namespace, {"spec": {"replicas": 4}})
        wait_for(
            lambda: apps(k8s_api).read_namespaced_deployment("hello", namespace).spec.replicas == 0,
            5,
            interval=0.01,
            what="the replicas to be put back",
        )
        assert time.monotonic() - started < 1.0


def test_a_child_that_changes_owner_wakes_the_old_and_the_new_owner(widget_crd, kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()
    calls = Calls()

    @declop.reconciler("widgets.example.com", owns=["configmaps"], registry=registry)
    def parent(name, **_):
        calls.add(name)

    one = create_widget(k8s_api, namespace, "one")
    two = create_widget(k8s_api, namespace, "two")

    def ref(widget: dict[str, Any], controller: bool = True) -> dict[str, Any]:
        return {"apiVersion": widget["apiVersion"], "kind": "Widget", "name": widget["metadata"]["name"],
                "uid": widget["metadata"]["uid"], "controller": controller}

    with runner(registry, kubeconfig, namespace) as op:
        wait_for(lambda: calls.of("one") and calls.of("two"), 10)
        core(k8s_api).create_namespaced_config_map(
            namespace, {"metadata": {"name": "child", "ownerReferences": [ref(one)]}, "data": {"k": "v"}}
        )
        wait_for(lambda: calls.of("one") >= 2, 10, what="the owner to hear of its new child")
        settle(op)
        calls.clear()
        core(k8s_api).patch_namespaced_config_map(
            "child", namespace, [{"op": "replace", "path": "/metadata/ownerReferences", "value": [ref(two)]}]
        )
        wait_for(lambda: calls.of("one") and calls.of("two"), 10, what="both owners")
        settle(op)
        calls.clear()
        # a non-controller reference does not wake anyone
        cm = core(k8s_api).patch_namespaced_config_map(
            "child", namespace, [{"op": "add", "path": "/metadata/ownerReferences/-", "value": ref(one, controller=False)}]
        )
        seen(op, "configmaps", namespace, "child", cm.metadata.resource_version)
        settle(op)
        assert calls.set() == {"two"}, "only the controller owner is enqueued"


# -- watches= with an index ------------------------------------------------------------------


def test_editing_a_watched_secret_enqueues_exactly_the_widgets_that_reference_it(
    widget_crd, kubeconfig, k8s_api, namespace
):
    calls = Calls()
    registry = example_registry(EXAMPLES / "watches.py", calls)
    make_secret(k8s_api, namespace, "s1", "one")
    make_secret(k8s_api, namespace, "s2", "two")
    create_widget(k8s_api, namespace, "a", secretName="s1")
    create_widget(k8s_api, namespace, "b", secretName="s1")
    create_widget(k8s_api, namespace, "c", secretName="s2")
    create_widget(k8s_api, namespace, "d")

    def checksum(name: str) -> str | None:
        w = custom(k8s_api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        return (w.get("status") or {}).get("secretChecksum")

    def edit_secret(name: str, value: str) -> None:
        s = core(k8s_api).patch_namespaced_secret(name, namespace, {"stringData": {"password": value}})
        seen(op, "secrets", namespace, name, s.metadata.resource_version)

    def echoed(op: OperatorRunner, *names: str) -> None:
        """The cache holds each widget's latest write (the handler's own status write included), so
        its echo cannot reach the handler after the next ``calls.clear()``."""
        for n in names:
            w = custom(k8s_api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, n)
            seen(op, "widgets.example.com", namespace, n, w["metadata"]["resourceVersion"])

    with runner(registry, kubeconfig, namespace) as op:
        wait_for(lambda: all(checksum(n) for n in "abc") and calls.of("d"), 10)
        assert checksum("a") == checksum("b") != checksum("c")
        echoed(op, *"abcd")
        settle(op)

        calls.clear()
        before = checksum("a")
        edit_secret("s1", "changed")
        wait_for(lambda: checksum("a") != before and checksum("b") != before, 10)
        echoed(op, "a", "b")
        settle(op)
        assert calls.set() == {"a", "b"}

        # the index follows an update of the indexed value: b now names s2
        patch_widget(k8s_api, namespace, "b", {"spec": {"secretName": "s2"}})
        wait_for(lambda: checksum("b") == checksum("c"), 10)
        echoed(op, "b")
        settle(op)
        calls.clear()
        edit_secret("s1", "again")
        settle(op)
        assert calls.set() == {"a"}
        calls.clear()
        edit_secret("s2", "new")
        settle(op)
        assert calls.set() == {"b", "c"}

        # …and a delete: nobody references s1 any more
        custom(k8s_api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "a")
        wait_for(lambda: cached(op, "widgets.example.com", namespace, "a") is None, 10)
        settle(op)
        calls.clear()
        edit_secret("s1", "unused")
        settle(op)
        assert calls.set() == set()


# -- predicates ------------------------------------------------------------------------------


def test_generation_changed_filters_status_only_updates(widget_crd, kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()
    filtered, unfiltered = Calls(), Calls()

    @declop.reconciler("widgets.example.com", predicates=[declop.reconcile.predicates.generation_changed], registry=registry)
    def spec_only(name, **_):
        filtered.add(name)

    @declop.reconciler("widgets.example.com", registry=registry)
    def everything(name, **_):
        unfiltered.add(name)

    create_widget(k8s_api, namespace, "g", message="one")
    with runner(registry, kubeconfig, namespace) as op:
        wait_for(lambda: filtered.of("g") == 1 and unfiltered.of("g") == 1, 10)
        settle(op)

        w = patch_widget(k8s_api, namespace, "g", {"status": {"readyReplicas": 3}}, status=True)
        seen(op, "widgets.example.com", namespace, "g", w["metadata"]["resourceVersion"])
        settle(op)
        w = patch_widget(k8s_api, namespace, "g", {"metadata": {"labels": {"tier": "web"}}})
        seen(op, "widgets.example.com", namespace, "g", w["metadata"]["resourceVersion"])
        settle(op)
        assert filtered.of("g") == 1, "a status-only (and a label-only) update went through"
        assert unfiltered.of("g") == 3

        patch_widget(k8s_api, namespace, "g", {"spec": {"message": "two"}})
        wait_for(lambda: filtered.of("g") == 2, 10, what="the spec change")
        custom(k8s_api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "g")
        wait_for(lambda: filtered.of("g") == 3, 10, what="the deletion (always passes)")


# -- indexes ---------------------------------------------------------------------------------


def test_an_index_lookup_follows_creates_updates_and_deletes(kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()
    declop.index("configmaps", "by_color", lambda cm: [(cm["metadata"].get("labels") or {}).get("color")], registry=registry)

    @declop.reconciler("configmaps", registry=registry)
    def noop(**_):
        pass

    def make(name: str, color: str) -> None:
        core(k8s_api).create_namespaced_config_map(namespace, {"metadata": {"name": name, "labels": {"color": color}}})

    with runner(registry, kubeconfig, namespace) as op:
        client = declop.AsyncClient(op.manager.context)

        def lookup(color: str) -> list[str]:
            objs = op.call_soon(lambda: client.list("configmaps", namespace=namespace, index=("by_color", color)))
            return sorted(o["metadata"]["name"] for o in objs)

        def expect(color: str, names: list[str]) -> None:
            wait_for(lambda: lookup(color) == names, 10, what=f"{color} == {names} (now {lookup(color)})")

        make("red-1", "red")
        make("red-2", "red")
        make("blue-1", "blue")
        expect("red", ["red-1", "red-2"])
        expect("blue", ["blue-1"])

        core(k8s_api).patch_namespaced_config_map("red-2", namespace, {"metadata": {"labels": {"color": "blue"}}})
        expect("red", ["red-1"])
        expect("blue", ["blue-1", "red-2"])

        core(k8s_api).delete_namespaced_config_map("red-1", namespace)
        expect("red", [])
        core(k8s_api).patch_namespaced_config_map("blue-1", namespace, {"metadata": {"labels": {"color": None}}})
        expect("blue", ["red-2"])
        assert lookup("green") == []


# -- write helpers ---------------------------------------------------------------------------


def test_create_or_update_on_an_unchanged_object_sends_no_write(widget_crd, kubeconfig, k8s_api, namespace):
    calls = Calls()
    registry = example_registry(EXAMPLES / "crd" / "handlers.py", calls)
    create_widget(k8s_api, namespace, "steady", message="hi", replicas=0)
    with runner(registry, kubeconfig, namespace) as op:
        wait_for(lambda: read_or_none(lambda: core(k8s_api).read_namespaced_service("steady", namespace)), 10)
        # Ready flips to True (one more status write) only once kube-controller-manager has
        # observed the Deployment, which can come after any quiet window: wait for that state
        wait_for(
            lambda: any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in (custom(k8s_api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "steady").get("status") or {}).get("conditions", [])
            ),
            30, what="the Widget to be Ready (its Deployment observed)",
        )
        settle(op)
        before, reconciles = writes(op), calls.of("steady")
        # someone else labels and annotates the Service: each edit wakes the Widget, which finds
        # its children as it wants them (those are not its fields) and sends nothing
        for i in range(3):
            svc = core(k8s_api).patch_namespaced_service(
                "steady", namespace, {"metadata": {"annotations": {"note": str(i)}, "labels": {"team": str(i)}}}
            )
        seen(op, "services", namespace, "steady", svc.metadata.resource_version)
        settle(op)
        assert calls.of("steady") > reconciles
        assert writes(op) == before

        # and the helper itself, called directly: "unchanged" is decided from the cache
        client = declop.Client(op.manager.context)
        skeleton = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "steady", "namespace": namespace}}
        before = op.statistics().by_verb
        assert declop.create_or_update(client, skeleton, lambda s: s["spec"].update(type="ClusterIP")) == "unchanged"
        assert op.statistics().by_verb == before
        assert declop.create_or_update(client, skeleton, lambda s: s["metadata"].setdefault("labels", {}).update(x="y")) == "updated"
        assert op.statistics().by_verb.get("update", 0) == before.get("update", 0) + 1


def test_a_conflict_is_retried_with_a_fresh_read_and_wins(kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()

    @declop.reconciler("configmaps", registry=registry, labels="never=matches")
    def noop(**_):
        pass

    core(k8s_api).create_namespaced_config_map(namespace, {"metadata": {"name": "counter"}, "data": {"n": "0"}})
    with runner(registry, kubeconfig, namespace) as op:
        client = declop.Client(op.manager.context)
        key = f"{namespace}/counter"
        stale = client.live.get("configmaps", key)
        core(k8s_api).patch_namespaced_config_map("counter", namespace, {"data": {"n": "10"}})  # someone else

        tries: list[str] = []

        def bump() -> dict[str, Any]:
            obj = stale if not tries else client.live.get("configmaps", key)  # re-read on every retry
            tries.append(obj["metadata"]["resourceVersion"])
            obj["data"]["n"] = str(int(obj["data"]["n"]) + 1)
            return client.update(obj)

        before = op.statistics().by_verb.get("update", 0)
        result = declop.retry_on_conflict(bump)
        assert result["data"]["n"] == "11"  # the other writer's 10, plus ours
        assert len(tries) == 2 and tries[0] != tries[1]
        assert op.statistics().by_verb["update"] == before + 2  # one 409, one success

        # every try conflicting: the last Conflict comes out after `attempts` tries
        with pytest.raises(declop.Conflict):
            declop.retry_on_conflict(lambda: client.update(declop.clone(stale)), attempts=3)
        assert op.statistics().by_verb["update"] == before + 5

        # the async flavour, on the operator's loop with an AsyncClient
        aclient = declop.AsyncClient(op.manager.context)
        stale = client.live.get("configmaps", key)
        core(k8s_api).patch_namespaced_config_map("counter", namespace, {"data": {"n": "20"}})
        atries: list[int] = []

        async def abump() -> dict[str, Any]:
            obj = declop.clone(stale) if not atries else await aclient.live.get("configmaps", key)
            atries.append(1)
            obj["data"]["n"] = str(int(obj["data"]["n"]) + 1)
            return await aclient.update(obj)

        result = op.call(declop.aretry_on_conflict(abump))
        assert result["data"]["n"] == "21" and len(atries) == 2
