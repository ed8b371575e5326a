"""Workers against a real kube-apiserver: no head-of-line blocking behind a slow call in a batch,
and ``Result(requeue_after=0)`` as plain success."""

from __future__ import annotations

import threading
import time
from typing import Any

import kubernetes.client
import pytest

import declop
from declop.manager import Options
from declop.testing.cluster.runner import OperatorRunner, wait_for

pytestmark = pytest.mark.integration


def create_cms(api: Any, namespace: str, names: list[str]) -> None:
    core = kubernetes.client.CoreV1Api(api)
    for name in names:
        core.create_namespaced_config_map(namespace, {"metadata": {"name": name}, "data": {"k": "v"}})


def runner(registry: declop.registry.Registry, kubeconfig: str, namespace: str) -> OperatorRunner:
    return OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=5))


class Ledger:
    """Thread-safe record of reconciles: per key the calls, and whether two ever overlapped."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[str, list[tuple[float, int]]] = {}
        self.running: set[str] = set()
        self.overlaps: list[str] = []
        self.max_running = 0

    def enter(self, name: str) -> None:
        with self.lock:
            if name in self.running:
                self.overlaps.append(name)
            self.running.add(name)
            self.max_running = max(self.max_running, len(self.running))
            self.calls.setdefault(name, []).append((time.monotonic(), threading.get_ident()))

    def leave(self, name: str) -> None:
        with self.lock:
            self.running.discard(name)

    def count(self, name: str) -> int:
        with self.lock:
            return len(self.calls.get(name, ()))

    def reconciled(self, names: list[str]) -> bool:
        with self.lock:
            return all(n in self.calls for n in names)


def test_a_hanging_call_holds_no_other_key_of_a_backlog(kubeconfig, k8s_api, namespace):
    """max_concurrent=4, 201 objects before the start, one call hangs: the other 200 are
    reconciled within 5 s, each exactly once, never two calls of one key at once."""
    registry = declop.registry.Registry()
    ledger = Ledger()
    hanging, release = threading.Event(), threading.Event()
    names = [f"cm-{i:03d}" for i in range(201)]
    stuck = names[1]  # second in list order: the worker that takes it has a batch around it

    @declop.reconciler("configmaps", registry=registry, max_concurrent=4)
    def backlog(name, **_):
        ledger.enter(name)
        try:
            if name == stuck:
                hanging.set()
                release.wait(60)
        finally:
            ledger.leave(name)

    create_cms(k8s_api, namespace, names)
    others = [n for n in names if n != stuck]
    with runner(registry, kubeconfig, namespace) as op:
        assert hanging.wait(30), "the hanging call never started"
        t0 = time.monotonic()
        try:
            wait_for(lambda: ledger.reconciled(others), timeout=5, what="the 200 other keys while one call hangs")
            elapsed = time.monotonic() - t0
            assert not release.is_set() and stuck in ledger.running  # still hanging meanwhile
            # the keys behind the hanging call were really batched with it (the case being tested)
            assert ledger.calls[names[0]][0][1] == ledger.calls[stuck][0][1]
        finally:
            release.set()
        wait_for(lambda: op.call_soon(lambda: op.manager.controllers[0].queue.statistics().processing == 0), 30)
        assert ledger.overlaps == []
        assert ledger.max_running <= 4
        assert all(ledger.count(n) == 1 for n in names), {n: ledger.count(n) for n in names if ledger.count(n) != 1}
    print(f"200 keys reconciled {elapsed:.3f} s after the hang began")


def test_a_key_finished_before_a_hanging_call_in_its_batch_runs_again_on_change(kubeconfig, k8s_api, namespace):
    """The settle of a call that finished is not held back by a later call of its batch that hangs:
    a change to that key is reconciled while the hang goes on."""
    registry = declop.registry.Registry()
    ledger = Ledger()
    hanging, release = threading.Event(), threading.Event()
    names = [f"a{i}" for i in range(10)]

    @declop.reconciler("configmaps", registry=registry, max_concurrent=2)
    def batchmates(name, **_):
        ledger.enter(name)
        try:
            if name == "a1" and ledger.count("a1") == 1:
                hanging.set()
                release.wait(60)
        finally:
            ledger.leave(name)

    create_cms(k8s_api, namespace, names)
    with runner(registry, kubeconfig, namespace):
        try:
            assert hanging.wait(30)
            (t_a0, thread_a0), = ledger.calls["a0"]
            assert thread_a0 == ledger.calls["a1"][0][1] and t_a0 <= ledger.calls["a1"][0][0]  # one batch
            kubernetes.client.CoreV1Api(k8s_api).patch_namespaced_config_map("a0", namespace, {"data": {"k": "changed"}})
            wait_for(lambda: ledger.count("a0") == 2, timeout=5, what="a0 to be reconciled again during the hang")
            assert not release.is_set() and "a1" in ledger.running
        finally:
            release.set()
        wait_for(lambda: "a1" not in ledger.running, 30)
    assert ledger.overlaps == []


def test_requeue_after_zero_is_plain_success(kubeconfig, k8s_api, namespace):
    """``Result(requeue_after=0)`` does not requeue (controller-runtime's RequeueAfter: 0): the
    handler runs once, not in a hot loop."""
    registry = declop.registry.Registry()
    ledger = Ledger()

    @declop.reconciler("configmaps", registry=registry)
    def zero(name, **_):
        ledger.enter(name)
        ledger.leave(name)
        return declop.Result(requeue_after=0)

    create_cms(k8s_api, namespace, ["z"])
    with runner(registry, kubeconfig, namespace) as op:
        wait_for(lambda: ledger.count("z") >= 1, 10)
        controller = op.manager.controllers[0]

        def settled() -> bool:
            s = controller.queue.statistics()
            return not (s.depth or s.processing or s.waiting)

        wait_for(lambda: op.call_soon(settled), 10, what="the key to be settled")
        # a hot spin would have run it thousands of times by now; a marker object proves the
        # operator is still reconciling (so the count below is not just a stopped operator)
        create_cms(k8s_api, namespace, ["marker"])
        wait_for(lambda: ledger.count("marker") == 1, 10)
        assert ledger.count("z") == 1
        assert op.call_soon(lambda: controller.queue.statistics().retries) == 0
