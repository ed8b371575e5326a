"""@declop.daemon on the real apiserver, in the test process: a daemon starts when its object is
created, ends before its finalizer is released, ends when the object leaves the label filter,
and is restarted after a crash. (Real processes under SIGKILL, SIGTERM and a black hole:
test_daemon_faults.py.)"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.rest import ApiException

import declop
from declop.testing import OperatorRunner, wait_for

pytestmark = pytest.mark.integration

LABEL = {"daemon-test": "yes"}


class Journal:
    """What the daemons did, in order, shared with the operator's thread."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()

    def add(self, what: str, name: str, retry: int = 0) -> None:
        with self.lock:
            self.lines.append((what, name, retry))

    def of(self, name: str) -> list[str]:
        with self.lock:
            return [w for w, n, _ in self.lines if n == name]


def operator(journal: Journal, **options: Any) -> declop.registry.Registry:
    registry = declop.registry.Registry()

    @declop.daemon("configmaps", labels=LABEL, stop_timeout=5, backoff=0.2, registry=registry, **options)
    async def keeper(name: str, stop: asyncio.Event, retry: int, current: Any) -> None:
        journal.add("start", name, retry)
        if (current()["data"] or {}).get("crash") == "yes" and retry == 0:
            raise RuntimeError("a crash on the first run")
        await stop.wait()
        await asyncio.sleep(0.3)  # ending takes a while: the finalizer must wait for it
        journal.add("stopped", name, retry)

    return registry


def configmap(core: Any, namespace: str, name: str, **data: str) -> None:
    core.create_namespaced_config_map(namespace, {"metadata": {"name": name, "labels": LABEL}, "data": data or {"x": "1"}})


def gone(core: Any, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_config_map(name, namespace)
    except ApiException as exc:
        return exc.status == 404
    return False


def test_a_daemon_starts_on_create_and_ends_before_its_finalizer_goes(kubeconfig: str, namespace: str, k8s_api: Any) -> None:
    journal = Journal()
    core = kubernetes.client.CoreV1Api(k8s_api)
    with OperatorRunner(operator(journal), kubeconfig=kubeconfig, options=declop.manager.Options(namespaces=(namespace,))):
        configmap(core, namespace, "one")
        wait_for(lambda: journal.of("one") == ["start"], timeout=20, what="the daemon to start")
        cm = core.read_namespaced_config_map("one", namespace)
        assert "daemons.declop.dev/keeper" in (cm.metadata.finalizers or [])
        core.delete_namespaced_config_map("one", namespace)
        wait_for(lambda: gone(core, namespace, "one"), timeout=20, what="the object to go")
        # the finalizer went only after the daemon ended (it took 0.3 s after its stop flag)
        assert journal.of("one") == ["start", "stopped"]


def test_a_daemon_ends_when_its_object_leaves_the_label_filter(kubeconfig: str, namespace: str, k8s_api: Any) -> None:
    """Out of the filter: the daemon ends, then its finalizer goes (a later delete must not wait
    on a controller that no longer sees the object); back in it: both return."""
    journal = Journal()
    core = kubernetes.client.CoreV1Api(k8s_api)

    def finalizers() -> list[str]:
        return core.read_namespaced_config_map("two", namespace).metadata.finalizers or []

    with OperatorRunner(operator(journal), kubeconfig=kubeconfig, options=declop.manager.Options(namespaces=(namespace,))):
        configmap(core, namespace, "two")
        wait_for(lambda: journal.of("two") == ["start"], timeout=20, what="the daemon to start")
        assert finalizers() == ["daemons.declop.dev/keeper"]
        core.patch_namespaced_config_map("two", namespace, {"metadata": {"labels": {"daemon-test": "no"}}})
        wait_for(lambda: journal.of("two") == ["start", "stopped"], timeout=20, what="the daemon to stop")
        wait_for(lambda: finalizers() == [], timeout=20, what="the finalizer to go")
        core.patch_namespaced_config_map("two", namespace, {"metadata": {"labels": LABEL}})
        wait_for(lambda: journal.of("two") == ["start", "stopped", "start"], timeout=20, what="a start on its return")
        assert finalizers() == ["daemons.declop.dev/keeper"]
        core.patch_namespaced_config_map("two", namespace, {"metadata": {"labels": {"daemon-test": "no"}}})
        wait_for(lambda: journal.of("two")[-1] == "stopped", timeout=20, what="the daemon to stop again")
        core.delete_namespaced_config_map("two", namespace)
        wait_for(lambda: gone(core, namespace, "two"), timeout=20, what="the object to go, out of the filter")


def test_a_crashed_daemon_is_restarted_with_backoff(kubeconfig: str, namespace: str, k8s_api: Any) -> None:
    journal = Journal()
    core = kubernetes.client.CoreV1Api(k8s_api)
    with OperatorRunner(operator(journal), kubeconfig=kubeconfig, options=declop.manager.Options(namespaces=(namespace,))):
        configmap(core, namespace, "three", crash="yes")
        wait_for(lambda: journal.of("three") == ["start", "start"], timeout=20, what="the restart")
        with journal.lock:
            assert [r for w, n, r in journal.lines if n == "three"] == [0, 1]
    # the stop of the operator ended it (the keeper waits for every daemon)
    assert journal.of("three") == ["start", "start", "stopped"]
