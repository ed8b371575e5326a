"""The core against a real kube-apiserver: queue semantics, retries, cache isolation, sharing,
finalizers across restarts, apiserver restarts and 410 relists."""

from __future__ import annotations

import base64
import threading
import time
from typing import Any

import kubernetes.client
import pytest

import declop
from declop.manager import Options
from declop.testing.cluster.runner import OperatorRunner, wait_for

pytestmark = pytest.mark.integration

#: every ConfigMap a test makes carries it; the controller-manager also publishes kube-root-ca.crt
TEST_LABEL = "declop-test=yes"


def make_cm(
    api: Any, namespace: str, name: str, data: dict[str, str] | None = None, **meta: Any
) -> Any:
    labels = {"declop-test": "yes", **meta.pop("labels", {})}
    body = {"metadata": {"name": name, "labels": labels, **meta}, "data": data or {"k": "v"}}
    return kubernetes.client.CoreV1Api(api).create_namespaced_config_map(namespace, body)


def core(api: Any) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(api)


class Calls:
    """Thread-safe record of handler calls: (name, phase, exists, time)."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Any, bool, float]] = []
        self.lock = threading.Lock()

    def add(self, name: str, phase: Any = None, exists: bool = True) -> None:
        with self.lock:
            self.items.append((name, phase, exists, time.monotonic()))

    def of(self, name: str) -> list[tuple[str, Any, bool, float]]:
        with self.lock:
            return [c for c in self.items if c[0] == name]


def idle(op: OperatorRunner, name: str | None = None) -> bool:
    """The controller's queue has nothing ready, delayed or in flight."""

    def check() -> bool:
        for c in op.manager.controllers:
            if name and c.name != name:
                continue
            s = c.queue.statistics()
            if s.depth or s.processing or s.waiting:
                return False
        return True

    return op.call_soon(check)


def runner(registry: declop.registry.Registry, kubeconfig: str, namespace: str, **kw: Any) -> OperatorRunner:
    return OperatorRunner(
        registry,
        kubeconfig=kubeconfig,
        options=Options(namespaces=(namespace,), grace_period=5, **kw),
    )


def test_100_updates_during_a_blocked_reconcile_give_exactly_two_reconciles(
    kubeconfig, k8s_api, namespace
):
    registry = declop.registry.Registry()
    calls = Calls()
    entered, release = threading.Event(), threading.Event()

    @declop.reconciler("configmaps", registry=registry)
    def hot(name, **_):
        calls.add(name)
        if len(calls.of(name)) == 1:
            entered.set()
            assert release.wait(30)

    make_cm(k8s_api, namespace, "hot")
    with runner(registry, kubeconfig, namespace) as op:
        assert entered.wait(10)
        last = None
        for i in range(100):
            last = core(k8s_api).patch_namespaced_config_map(
                "hot", namespace, {"data": {"i": str(i)}}
            )
        rv = last.metadata.resource_version
        store = op.manager.controllers[0].sources[0].informers[0].store
        wait_for(
            lambda: (
                store.resource_version == rv
                or (store.get(declop.Request(namespace, "hot")) or {})
                .get("metadata", {})
                .get("resourceVersion")
                == rv
            ),
            10,
            what="the cache to see the last update",
        )
        release.set()
        wait_for(lambda: len(calls.of("hot")) >= 2 and idle(op), 10, what="the follow-up reconcile")
        assert len(calls.of("hot")) == 2


def test_a_failing_handler_is_retried_with_growing_delays_and_other_keys_keep_flowing(
    kubeconfig, k8s_api, namespace
):
    registry = declop.registry.Registry()
    calls = Calls()

    @declop.reconciler("configmaps", registry=registry)
    def flaky(name, **_):
        calls.add(name)
        if name == "bad":
            raise RuntimeError("boom")

    make_cm(k8s_api, namespace, "bad")
    with runner(registry, kubeconfig, namespace) as op:
        wait_for(lambda: len(calls.of("bad")) >= 3, 10, what="retries")
        for n in ("good-1", "good-2", "good-3"):
            make_cm(k8s_api, namespace, n)
        wait_for(
            lambda: all(calls.of(n) for n in ("good-1", "good-2", "good-3")), 10, what="other keys"
        )
        wait_for(lambda: len(calls.of("bad")) >= 8, 20, what="more retries")
        times = [c[3] for c in calls.of("bad")]
        gaps = [b - a for a, b in zip(times, times[1:])]
        # 5 ms, 10 ms, 20 ms, ... doubling: the late gaps are clearly longer than the early ones
        assert gaps[6] > gaps[1] * 4, gaps
        assert (
            op.call_soon(
                lambda: op.manager.controllers[0].queue.num_requeues(
                    declop.Request(namespace, "bad")
                )
            )
            >= 7
        )
        for n in ("good-1", "good-2", "good-3"):
            assert len(calls.of(n)) == 1


def test_terminal_error_is_not_retried(kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()
    calls = Calls()

    @declop.reconciler("configmaps", registry=registry)
    def terminal(name, **_):
        calls.add(name)
        raise declop.TerminalError("spec is invalid")

    make_cm(k8s_api, namespace, "t")
    with runner(registry, kubeconfig, namespace) as op:
        wait_for(lambda: calls.of("t") and idle(op), 10)
        assert len(calls.of("t")) == 1


def test_requeue_after_reconciles_again_later(kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()
    calls = Calls()

    @declop.reconciler("configmaps", registry=registry)
    def periodic(name, **_):
        calls.add(name)
        return declop.Result(requeue_after=0.2)

    make_cm(k8s_api, namespace, "p")
    with runner(registry, kubeconfig, namespace):
        wait_for(lambda: len(calls.of("p")) >= 3, 10)
        times = [c[3] for c in calls.of("p")]
        assert times[2] - times[1] >= 0.18


def test_no_reconcile_reads_from_the_apiserver(kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()
    calls = Calls()

    @declop.reconciler("configmaps", registry=registry)
    def reader(request, client, **_):
        client.get(request)
        client.list(namespace=request.namespace)
        client.list(labels="app=x")
        calls.add(request.name)

    with runner(registry, kubeconfig, namespace) as op:
        before = op.statistics()
        for i in range(20):
            make_cm(k8s_api, namespace, f"r{i}")
        wait_for(lambda: all(calls.of(f"r{i}") for i in range(20)), 15)
        after = op.statistics()
        assert after.by_verb.get("get", 0) == before.by_verb.get("get", 0)
        assert after.by_verb.get("list", 0) == before.by_verb.get("list", 0)
        # the one sync: a streaming list (a watch request) where the apiserver has WatchList
        assert after.by_verb.get("watch", 0) == before.by_verb.get("watch", 0) == 1


@pytest.mark.parametrize(("mode", "lists"), [("auto", 0), ("paged", 1)])
def test_two_controllers_on_one_resource_share_one_list_and_watch(kubeconfig, k8s_api, namespace, mode, lists):
    """One sync and one watch for both; with a streaming list (the default on this apiserver)
    they are the same request."""
    registry = declop.registry.Registry()
    calls = Calls()

    @declop.reconciler("configmaps", registry=registry)
    def first(name, **_):
        calls.add("first:" + name)

    @declop.reconciler("cm", registry=registry)
    def second(name, **_):
        calls.add("second:" + name)

    with runner(registry, kubeconfig, namespace, list_mode=mode) as op:
        make_cm(k8s_api, namespace, "shared")
        wait_for(lambda: calls.of("first:shared") and calls.of("second:shared"), 10)
        stats = op.statistics().by_verb
        assert stats.get("watch") == 1
        assert stats.get("list", 0) == lists
        informer = op.manager.controllers[0].sources[0].informers[0]
        assert informer.last_sync_mode == ("stream" if mode == "auto" else "paged")


def test_a_handler_mutating_its_object_does_not_change_the_cache(kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()
    seen: list[dict[str, Any]] = []

    @declop.reconciler("configmaps", registry=registry)
    def mutator(request, client, obj, **_):
        if request.name != "m":  # e.g. kube-root-ca.crt, published into every namespace
            return
        got = client.get(request)
        seen.append({"obj": dict(obj["data"]), "got": dict(got["data"])})
        obj["data"]["k"] = "mutated-obj"
        got["data"]["k"] = "mutated-get"
        got["metadata"]["labels"] = {"evil": "yes"}

    make_cm(k8s_api, namespace, "m")
    with runner(registry, kubeconfig, namespace) as op:
        wait_for(lambda: seen, 10)
        core(k8s_api).patch_namespaced_config_map(
            "m", namespace, {"metadata": {"labels": {"again": "1"}}}
        )
        wait_for(lambda: len(seen) >= 2, 10)
        assert seen[1] == {"obj": {"k": "v"}, "got": {"k": "v"}}
        cached = (
            op.manager.controllers[0]
            .sources[0]
            .informers[0]
            .store.get(declop.Request(namespace, "m"))
        )
        assert cached["data"] == {"k": "v"} and cached["metadata"]["labels"] == {"declop-test": "yes", "again": "1"}


def test_async_handlers_use_the_async_client(kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()
    calls = Calls()

    @declop.reconciler("configmaps", registry=registry)
    async def annotate(request, client, obj, **_):
        calls.add(request.name)
        if obj and "seen" not in (obj["metadata"].get("annotations") or {}):
            await client.patch(request, {"metadata": {"annotations": {"seen": "yes"}}})

    make_cm(k8s_api, namespace, "a")
    with runner(registry, kubeconfig, namespace):
        wait_for(
            lambda: (
                (
                    core(k8s_api).read_namespaced_config_map("a", namespace).metadata.annotations
                    or {}
                ).get("seen")
                == "yes"
            ),
            10,
        )


def test_finalizer_phases_in_order_and_one_created(kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()
    phases: list[declop.Phase] = []

    @declop.reconciler("configmaps", registry=registry, finalizer="test.declop.io/cleanup", labels=TEST_LABEL)
    def fin(phase, **_):
        phases.append(phase)

    make_cm(k8s_api, namespace, "f")
    with runner(registry, kubeconfig, namespace) as op:
        wait_for(lambda: phases and idle(op), 10)
        cm = core(k8s_api).read_namespaced_config_map("f", namespace)
        assert cm.metadata.finalizers == ["test.declop.io/cleanup"]
        assert phases == [declop.Phase.CREATED]  # our own finalizer write does not wake us again
        core(k8s_api).patch_namespaced_config_map(
            "f", namespace, {"metadata": {"labels": {"x": "y"}}}
        )
        wait_for(lambda: declop.Phase.UPDATED in phases, 10)
        core(k8s_api).delete_namespaced_config_map("f", namespace)
        wait_for(lambda: declop.Phase.DELETED in phases, 10)
        assert phases.index(declop.Phase.DELETING) < phases.index(declop.Phase.DELETED)
        with pytest.raises(kubernetes.client.ApiException) as e:
            core(k8s_api).read_namespaced_config_map("f", namespace)
        assert e.value.status == 404


def test_finalizer_keeps_other_finalizers(kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()
    phases: list[declop.Phase] = []

    @declop.reconciler("configmaps", registry=registry, finalizer="test.declop.io/mine", labels=TEST_LABEL)
    def fin(phase, **_):
        phases.append(phase)

    make_cm(k8s_api, namespace, "multi", finalizers=["other.io/theirs"])
    with runner(registry, kubeconfig, namespace):
        wait_for(
            lambda: (
                core(k8s_api).read_namespaced_config_map("multi", namespace).metadata.finalizers
                == ["other.io/theirs", "test.declop.io/mine"]
            ),
            10,
        )
        core(k8s_api).delete_namespaced_config_map("multi", namespace)
        wait_for(
            lambda: (
                core(k8s_api).read_namespaced_config_map("multi", namespace).metadata.finalizers
                == ["other.io/theirs"]
            ),
            10,
        )
        core(k8s_api).patch_namespaced_config_map(
            "multi", namespace, [{"op": "remove", "path": "/metadata/finalizers/0"}]
        )
        wait_for(lambda: declop.Phase.DELETED in phases, 10)


def test_cleanup_runs_after_restart_for_an_object_deleted_while_stopped(
    kubeconfig, k8s_api, namespace
):
    registry = declop.registry.Registry()
    phases: list[tuple[str, declop.Phase]] = []

    @declop.reconciler("configmaps", registry=registry, finalizer="test.declop.io/cleanup", labels=TEST_LABEL)
    def fin(name, phase, **_):
        phases.append((name, phase))

    make_cm(k8s_api, namespace, "gone-while-down")
    with runner(registry, kubeconfig, namespace):
        wait_for(
            lambda: (
                core(k8s_api)
                .read_namespaced_config_map("gone-while-down", namespace)
                .metadata.finalizers
            ),
            10,
        )
    core(k8s_api).delete_namespaced_config_map("gone-while-down", namespace)
    held = core(k8s_api).read_namespaced_config_map("gone-while-down", namespace)
    assert held.metadata.deletion_timestamp is not None  # the finalizer holds it while we are down
    phases.clear()
    with runner(registry, kubeconfig, namespace):
        wait_for(lambda: ("gone-while-down", declop.Phase.DELETED) in phases, 15)
        assert phases[0] == ("gone-while-down", declop.Phase.DELETING)


def test_apiserver_restart_under_a_running_operator(control_plane, kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()
    calls = Calls()

    @declop.reconciler("configmaps", registry=registry)
    def watcher(name, obj, **_):
        calls.add(name, exists=obj is not None, phase=(obj or {}).get("data"))

    make_cm(k8s_api, namespace, "steady")
    make_cm(k8s_api, namespace, "changed")
    with runner(registry, kubeconfig, namespace) as op:
        wait_for(lambda: calls.of("steady") and calls.of("changed") and idle(op), 10)
        control_plane.restart_apiserver()
        # the operator is still reconnecting (backing off) when this change lands
        core(control_plane.api_client()).patch_namespaced_config_map(
            "changed", namespace, {"data": {"k": "new"}}
        )
        wait_for(
            lambda: any(c[1] == {"k": "new"} for c in calls.of("changed")),
            30,
            what="the change made during the outage",
        )
        wait_for(lambda: idle(op), 10)
        assert len(calls.of("changed")) == 2
        assert len(calls.of("steady")) == 1  # nothing unchanged is reconciled twice


@pytest.mark.parametrize("mode", ["stream", "paged"])
def test_expired_watch_relists_and_an_object_deleted_in_the_gap_is_seen_as_gone(
    control_plane, kubeconfig, k8s_api, namespace, mode
):
    registry = declop.registry.Registry()
    calls = Calls()

    @declop.reconciler("configmaps", registry=registry)
    def watcher(name, obj, **_):
        calls.add(name, exists=obj is not None)

    make_cm(k8s_api, namespace, "stays")
    make_cm(k8s_api, namespace, "vanishes")
    with runner(registry, kubeconfig, namespace, list_mode=mode) as op:
        wait_for(lambda: calls.of("stays") and calls.of("vanishes") and idle(op), 10)
        informer = op.manager.controllers[0].sources[0].informers[0]
        lists_before = informer.lists
        control_plane.stop_apiserver()
        # delete behind the apiserver's back, then compact: the operator's resourceVersion is history
        key = base64.b64encode(f"/registry/configmaps/{namespace}/vanishes".encode()).decode()
        control_plane._etcd_post("/v3/kv/deleterange", {"key": key})
        control_plane.compact_etcd()
        control_plane.start_apiserver()
        wait_for(
            lambda: any(not c[2] for c in calls.of("vanishes")), 40, what="the synthesised deletion"
        )
        assert informer.lists > lists_before  # it relisted (410), it did not replay
        assert informer.last_sync_mode == mode
        assert all(c[2] for c in calls.of("stays"))
