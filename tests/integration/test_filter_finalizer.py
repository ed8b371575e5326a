"""A ``labels=`` controller with a finalizer, on a real kube-apiserver: an object that leaves the
filter while it carries our finalizer gets its ``DELETED`` call, then declop releases the
finalizer — otherwise no controller of that finalizer would ever see the object again, and a
later ``kubectl delete`` would wait for ever (found by ``declop sim examples/finalizer.py``).

Three ways the object can leave: while the handler reads nothing of its resource (declop reads
the object from the apiserver, once), while the handler reads it (from the unfiltered cache its
reads start), and while no operator ran (an unfiltered cache lists it outside the filter with our
finalizer on)."""

from __future__ import annotations

import threading
from typing import Any

import kubernetes.client
import pytest

import declop
from declop.manager import Options
from declop.testing.cluster.runner import OperatorRunner, wait_for

FINALIZER = "declop.test/filter-finalizer"


def _registry(reads: bool, phases: list[tuple[str, str]], lock: threading.Lock) -> declop.registry.Registry:
    registry = declop.registry.Registry()

    @registry.reconciler("configmaps", labels="app=web", finalizer=FINALIZER)
    async def backup(request: declop.Request, client: Any, phase: declop.Phase, **_: Any) -> None:
        if reads:
            client.list("configmaps")  # starts the unfiltered cache of configmaps
        with lock:
            phases.append((request.name, phase.value))

    return registry


def _finalizers(core: Any, namespace: str, name: str) -> list[str] | None:
    try:
        return list(core.read_namespaced_config_map(name, namespace).metadata.finalizers or [])
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _label(core: Any, namespace: str, name: str, app: str) -> None:
    core.patch_namespaced_config_map(name, namespace, {"metadata": {"labels": {"app": app}}})


@pytest.mark.parametrize("reads", [False, True], ids=["no-reads", "reads"])
def test_an_object_that_leaves_the_filter_loses_our_finalizer_after_its_deleted_call(
    kubeconfig: str, k8s_api: Any, namespace: str, reads: bool
) -> None:
    core = kubernetes.client.CoreV1Api(k8s_api)
    phases: list[tuple[str, str]] = []
    lock = threading.Lock()
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "a", "labels": {"app": "web"}}})
    registry = _registry(reads, phases, lock)
    with OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=5)):
        wait_for(lambda: _finalizers(core, namespace, "a") == [FINALIZER], 20, what="our finalizer on a")
        _label(core, namespace, "a", "db")  # out of the filter
        wait_for(lambda: _finalizers(core, namespace, "a") == [], 20, what="our finalizer released from a")
        with lock:
            assert ("a", "deleted") in phases, phases  # the cleanup call ran before the release
        core.delete_namespaced_config_map("a", namespace)
        wait_for(lambda: _finalizers(core, namespace, "a") is None, 20, what="a gone once deleted")
        # back in the filter, a new object of the name is ours again, and its deletion waits for us
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "a", "labels": {"app": "web"}}})
        wait_for(lambda: _finalizers(core, namespace, "a") == [FINALIZER], 20, what="our finalizer on the new a")
        core.delete_namespaced_config_map("a", namespace)
        wait_for(lambda: _finalizers(core, namespace, "a") is None, 20, what="the new a gone once cleaned up")
        with lock:
            assert ("a", "deleting") in phases, phases


def test_an_object_that_left_the_filter_while_no_operator_ran_loses_our_finalizer(
    kubeconfig: str, k8s_api: Any, namespace: str
) -> None:
    core = kubernetes.client.CoreV1Api(k8s_api)
    phases: list[tuple[str, str]] = []
    lock = threading.Lock()
    for name in ("a", "b"):
        core.create_namespaced_config_map(namespace, {"metadata": {"name": name, "labels": {"app": "web"}}})
    options = Options(namespaces=(namespace,), grace_period=5)
    with OperatorRunner(_registry(True, phases, lock), kubeconfig=kubeconfig, options=options):
        for name in ("a", "b"):
            wait_for(lambda: _finalizers(core, namespace, name) == [FINALIZER], 20, what=f"our finalizer on {name}")
    _label(core, namespace, "a", "db")  # nobody watches: no DELETED event will ever tell of it
    assert _finalizers(core, namespace, "a") == [FINALIZER]
    with OperatorRunner(_registry(True, phases, lock), kubeconfig=kubeconfig, options=options):
        wait_for(lambda: _finalizers(core, namespace, "a") == [], 20, what="our finalizer released from a")
        with lock:
            assert ("a", "deleted") in phases, phases  # the cleanup call ran before the release
        assert _finalizers(core, namespace, "b") == [FINALIZER]  # still in the filter: still ours
        for name in ("a", "b"):
            core.delete_namespaced_config_map(name, namespace)
            wait_for(lambda: _finalizers(core, namespace, name) is None, 20, what=f"{name} gone once deleted")
