"""The priority queue, reconcile provenance and handler timeouts against a real kube-apiserver.

- After a real operator restart with 2,000 existing objects, a newly created object is
  reconciled while most of the backlog (low priority: the initial list) still waits.
- Every source kind is named in the trigger of the reconcile it caused: the initial list, a
  create, 100 updates coalesced into one record (with their resourceVersion range), an owned
  child, a watched object via its map function, a requeue_after, a retry after an error, a
  delete; the same triggers are counted in the metrics and listed on /debug/reconciles.
- An ``async def`` handler past its ``timeout=`` is cancelled and retried with backoff.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import kubernetes.client
import pytest

import declop
from declop.manager import Options
from declop.serving.metrics import Metrics
from declop.testing.cluster.runner import OperatorRunner, wait_for

pytestmark = pytest.mark.integration


def create_cms(api: Any, namespace: str, names: list[str], threads: int = 8) -> None:
    core = kubernetes.client.CoreV1Api(api)

    def create(name: str) -> None:
        core.create_namespaced_config_map(namespace, {"metadata": {"name": name}, "data": {"k": "v"}})

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, names))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Journal:
    """Thread-safe record of reconciles: (name, trigger) in the order they ran."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: list[tuple[str, declop.reconcile.trigger.Trigger]] = []

    def add(self, name: str, trigger: declop.reconcile.trigger.Trigger) -> None:
        with self.lock:
            self.entries.append((name, trigger))

    def names(self) -> list[str]:
        with self.lock:
            return [n for n, _ in self.entries]

    def of(self, name: str) -> list[declop.reconcile.trigger.Trigger]:
        with self.lock:
            return [t for n, t in self.entries if n == name]


def test_a_new_object_is_reconciled_long_before_the_restart_backlog_is_done(kubeconfig, k8s_api, namespace):
    """2,000 objects exist; the operator runs once (all reconciled), stops, and starts again: its
    initial list queues 2,000 keys at low priority. An object created right after the restart is
    reconciled while more than half of them still wait (FIFO would put it behind all 2,000)."""
    registry = declop.registry.Registry()
    journal = Journal()
    slow = threading.Event()
    names = [f"cm-{i:04d}" for i in range(2000)]

    @declop.reconciler("configmaps", registry=registry)
    def backlog(name, trigger, **_):
        journal.add(name, trigger)
        if slow.is_set():
            time.sleep(0.003)  # 2,000 keys: a backlog of 6 s or more

    create_cms(k8s_api, namespace, names)
    options = Options(namespaces=(namespace,), grace_period=2)
    with OperatorRunner(registry, kubeconfig=kubeconfig, options=options):
        wait_for(lambda: set(names) <= set(journal.names()), timeout=120, what="the first run to reconcile all")
    with journal.lock:
        journal.entries.clear()
    slow.set()
    with OperatorRunner(registry, kubeconfig=kubeconfig, options=options):  # the restart
        t0 = time.monotonic()
        create_cms(k8s_api, namespace, ["fresh"], threads=1)
        wait_for(lambda: "fresh" in journal.names(), timeout=30, what="the new object's reconcile")
        waited = time.monotonic() - t0
        order = journal.names()
        before = order.index("fresh")
    backlog_done = len(set(order[:before]) & set(names))
    print(f"new object reconciled {waited:.3f} s after its create, {backlog_done} of 2000 backlog keys before it")
    assert backlog_done < 1000, f"{backlog_done} backlog keys ran before the new object"
    assert journal.of("fresh")[0].names == ("created",)
    assert all(t.names == ("initial-list",) for n, t in journal.entries[:before] if n != "fresh")


def test_each_source_kind_is_named_in_the_trigger(kubeconfig, k8s_api, namespace):
    core = kubernetes.client.CoreV1Api(k8s_api)
    registry = declop.registry.Registry()
    journal = Journal()
    hold, holding = threading.Event(), threading.Event()
    plan: dict[str, list[Any]] = {"p": []}  # what the next reconciles of "p" do

    def by_annotation(obj, **_):
        target = ((obj.get("metadata") or {}).get("annotations") or {}).get("example.com/for")
        return [f"{obj['metadata']['namespace']}/{target}"] if target else []

    @declop.reconciler("configmaps", registry=registry, owns=["secrets"], watches=[("serviceaccounts", by_annotation)])
    def provenance(name, trigger, **_):
        journal.add(name, trigger)
        if name != "p" or not plan["p"]:
            return None
        step = plan["p"].pop(0)
        if step == "hold":
            holding.set()
            hold.wait(30)
            return None
        if isinstance(step, Exception):
            raise step
        return step

    create_cms(k8s_api, namespace, ["existing"], threads=1)
    port = free_port()
    # plain mode, as under declop dev: with secure metrics /debug/reconciles wants a token
    # (tests/integration/test_metrics_auth.py); this test is about what it lists
    options = Options(namespaces=(namespace,), grace_period=2, health_port=port, debug_reconciles=50, metrics_secure=False)
    with OperatorRunner(registry, kubeconfig=kubeconfig, options=options, metrics=Metrics()) as op:
        controller = op.manager.controllers[0]
        wait_for(lambda: journal.of("existing"), 10)
        assert journal.of("existing")[-1].names == ("initial-list",)

        # a create, whose reconcile holds while 100 updates arrive: one record of 100 events
        plan["p"] = ["hold"]
        create_cms(k8s_api, namespace, ["p"], threads=1)
        assert holding.wait(10)
        assert journal.of("p")[-1].names == ("created",)
        rvs = []
        for i in range(100):
            cm = core.patch_namespaced_config_map("p", namespace, {"metadata": {"labels": {"i": str(i)}}})
            rvs.append(cm.metadata.resource_version)
        wait_for(
            lambda: op.call_soon(lambda: controller.primary.get(declop.Request(namespace, "p"))["metadata"]["resourceVersion"]) == rvs[-1],
            10,
            what="the cache to see the 100th update",
        )
        hold.set()
        wait_for(lambda: len(journal.of("p")) == 2, 10)
        coalesced = journal.of("p")[-1]
        assert coalesced.sources == (("updated", 100),) and coalesced.events == 100
        assert coalesced.resource_versions == (rvs[0], rvs[-1])

        # an owned child
        uid = core.read_namespaced_config_map("p", namespace).metadata.uid
        owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "p", "uid": uid, "controller": True}
        core.create_namespaced_secret(namespace, {"metadata": {"name": "child", "ownerReferences": [owner]}})
        wait_for(lambda: len(journal.of("p")) == 3, 10)
        assert journal.of("p")[-1].names == ("owns:Secret",)
        assert journal.of("p")[-1].details == (f"Secret {namespace}/child",)

        # a watched object, via its map function
        core.create_namespaced_service_account(namespace, {"metadata": {"name": "sa", "annotations": {"example.com/for": "p"}}})
        wait_for(lambda: len(journal.of("p")) == 4, 10)
        assert journal.of("p")[-1].names == ("watches:serviceaccounts",)
        assert journal.of("p")[-1].details == (f"by_annotation: ServiceAccount {namespace}/sa",)

        # requeue_after, then a retry after an error
        plan["p"] = [declop.Result(requeue_after=0.2), RuntimeError("flaky"), None]
        core.patch_namespaced_config_map("p", namespace, {"data": {"k": "changed"}})
        wait_for(lambda: len(journal.of("p")) == 7, 10, what="update → requeue_after → retry")
        assert [t.names for t in journal.of("p")[-3:]] == [("updated",), ("requeue_after",), ("retry",)]
        assert journal.of("p")[-1].details == ("RuntimeError",)

        # a delete (the garbage collector then deletes the child: another owns:Secret may follow)
        runs = len(journal.of("p"))
        core.delete_namespaced_config_map("p", namespace)
        wait_for(lambda: any("deleted" in t.names for t in journal.of("p")[runs:]), 10, what=f"the delete's reconcile: {journal.of('p')[runs:]}")

        recent = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/reconciles", timeout=5).read())
        mine = recent["provenance"]
        assert any(r["key"] == f"{namespace}/p" and r["trigger"].startswith("deleted") for r in mine)
        assert any(r["trigger"].startswith("updated*100") and r["events"] == 100 for r in mine)
        assert any(r["outcome"] == "error" and r["error"] == "RuntimeError" for r in mine)
        text = op.manager.metrics.exposition().decode()
    for source in ("initial-list", "created", "updated", "owns:Secret", "watches:serviceaccounts", "requeue_after", "retry", "deleted"):
        assert f'declop_reconcile_triggers_total{{controller="provenance",source="{source}"}}' in text, source
    assert 'declop_reconcile_coalesced_events_bucket{controller="provenance",le="100.0"}' in text


def test_debug_reconciles_is_off_by_default(kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()
    declop.reconciler("configmaps", registry=registry)(lambda **_: None)
    port = free_port()
    with OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), health_port=port)):
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read() == b"ok"
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/reconciles", timeout=5)
        assert info.value.code == 404


def test_an_async_handler_past_its_timeout_is_cancelled_and_retried(kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()
    journal = Journal()
    cancelled = threading.Event()

    @declop.reconciler("configmaps", registry=registry, timeout=0.3, rate_limit=declop.queue.ratelimit.RateLimit(base=0.1))
    async def slow_once(name, trigger, **_):
        journal.add(name, trigger)
        if name == "slow" and len(journal.of(name)) == 1:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise

    with OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=2), metrics=Metrics()) as op:
        t0 = time.monotonic()
        create_cms(k8s_api, namespace, ["slow"], threads=1)
        wait_for(lambda: len(journal.of("slow")) == 2, 10, what="the retry after the timeout")
        elapsed = time.monotonic() - t0
        assert cancelled.is_set()
        retry = journal.of("slow")[1]
        assert retry.names == ("retry",) and retry.details == ("ReconcileTimeout",)
        assert 0.3 + 0.1 <= elapsed < 5
        text = op.manager.metrics.exposition().decode()
    assert 'declop_reconcile_timeouts_total{controller="slow_once",kind="cancelled"} 1.0' in text
