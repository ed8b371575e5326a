"""The finalizer protocol against a real apiserver: an object being deleted always gets its
cleanup and goes away — also when the handler writes its own object during DELETING, when our
finalizer is on it twice, and when someone else took our finalizer off a live object."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

import declop
from declop.manager import Options
from declop.testing.cluster.runner import OperatorRunner, wait_for

pytestmark = pytest.mark.integration

FINALIZER = "test.declop.io/cleanup"
LABEL = "finalizer-test=yes"
HANDLERS = Path(__file__).resolve().parents[2] / "examples" / "crd" / "handlers.py"


def core(api: Any) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(api)


def runner(registry: declop.registry.Registry, kubeconfig: str, namespace: str) -> OperatorRunner:
    return OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=5))


def gone(read: Any) -> bool:
    try:
        read()
    except kubernetes.client.ApiException as exc:
        return exc.status == 404
    return False


@pytest.fixture(scope="module")
def widgets(control_plane: Any) -> kubernetes.client.CustomObjectsApi:
    """The Widget CRD of examples/crd (with a status subresource), installed once."""
    kubectl = [control_plane.binary("kubectl")]
    env = control_plane.env()
    crd = subprocess.run([sys.executable, "-m", "declop", "crd", str(HANDLERS)], check=True, capture_output=True, text=True).stdout
    subprocess.run([*kubectl, "apply", "-f", "-"], input=crd, env=env, check=True, capture_output=True, text=True)
    subprocess.run(
        [*kubectl, "wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=60s"],
        env=env, check=True, capture_output=True,
    )
    return kubernetes.client.CustomObjectsApi(control_plane.api_client())


def test_a_handler_writing_status_during_deleting_sees_the_object_gone_after_that_one_reconcile(
    kubeconfig: str, namespace: str, widgets: kubernetes.client.CustomObjectsApi
) -> None:
    """The most common cleanup pattern: set a condition, clean up, return. The release used to be
    guarded by the resourceVersion from before the handler, so it conflicted on every attempt."""
    registry = declop.registry.Registry()
    calls: list[tuple[str, declop.Phase]] = []

    @declop.reconciler("widgets.example.com", registry=registry, finalizer=FINALIZER)
    def widget(request: Any, phase: declop.Phase, client: Any, **_: Any) -> None:
        calls.append((request.name, phase))
        if phase is declop.Phase.DELETING:  # writes its own object on every DELETING call
            client.patch_status(request, {"status": {"conditions": [
                {"type": "Ready", "status": "False", "reason": "Deleting", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ]}})

    body = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"message": "hi"}}
    widgets.create_namespaced_custom_object("example.com", "v1", namespace, "widgets", body)
    read = lambda: widgets.get_namespaced_custom_object("example.com", "v1", namespace, "widgets", "w")  # noqa: E731
    with runner(registry, kubeconfig, namespace):
        wait_for(lambda: FINALIZER in (read()["metadata"].get("finalizers") or ()), 20, what="our finalizer")
        widgets.delete_namespaced_custom_object("example.com", "v1", namespace, "widgets", "w")
        wait_for(lambda: gone(read), 20, what="the widget to go")
        wait_for(lambda: ("w", declop.Phase.DELETED) in calls, 20, what="the DELETED call")
    deleting = [c for c in calls if c[1] is declop.Phase.DELETING]
    assert deleting == [("w", declop.Phase.DELETING)], f"cleanup ran more than once: {calls}"


def test_every_copy_of_our_finalizer_is_removed(kubeconfig: str, k8s_api: Any, namespace: str) -> None:
    registry = declop.registry.Registry()
    calls: list[declop.Phase] = []

    @declop.reconciler("configmaps", registry=registry, finalizer=FINALIZER, labels=LABEL)
    def twice(phase: declop.Phase, **_: Any) -> None:
        calls.append(phase)

    core(k8s_api).create_namespaced_config_map(namespace, {"metadata": {
        "name": "dup", "labels": {"finalizer-test": "yes"}, "finalizers": [FINALIZER, "other.io/keep", FINALIZER],
    }})
    read = lambda: core(k8s_api).read_namespaced_config_map("dup", namespace)  # noqa: E731
    with runner(registry, kubeconfig, namespace):
        wait_for(lambda: calls, 20, what="the first reconcile")
        core(k8s_api).delete_namespaced_config_map("dup", namespace)
        wait_for(lambda: read().metadata.finalizers == ["other.io/keep"], 20, what="both copies of ours removed")
        assert calls.count(declop.Phase.DELETING) == 1
        # someone else's finalizer goes: the object goes, and we see it gone
        core(k8s_api).patch_namespaced_config_map("dup", namespace, [{"op": "remove", "path": "/metadata/finalizers/0"}])
        wait_for(lambda: gone(read) and declop.Phase.DELETED in calls, 20, what="the object to go")


def test_one_copy_removed_by_someone_else_is_a_real_change(kubeconfig: str, k8s_api: Any, namespace: str) -> None:
    """Removing one of two copies of our finalizer looks exactly like our own finalizer write; the
    old echo filter dropped it. It must reach the handler like any other change."""
    registry = declop.registry.Registry()
    calls: list[tuple[declop.Phase, tuple[str, ...]]] = []

    @declop.reconciler("configmaps", registry=registry, finalizer=FINALIZER, labels=LABEL)
    def seen(phase: declop.Phase, obj: Any, **_: Any) -> None:
        calls.append((phase, tuple(obj["metadata"].get("finalizers") or ())))

    core(k8s_api).create_namespaced_config_map(namespace, {"metadata": {
        "name": "two", "labels": {"finalizer-test": "yes"}, "finalizers": [FINALIZER, FINALIZER],
    }})
    with runner(registry, kubeconfig, namespace):
        wait_for(lambda: calls, 20, what="the first reconcile")
        core(k8s_api).patch_namespaced_config_map("two", namespace, [
            {"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
            {"op": "remove", "path": "/metadata/finalizers/1"},
        ])
        wait_for(lambda: (declop.Phase.UPDATED, (FINALIZER,)) in calls, 20, what="the change to reach the handler")


def test_our_finalizer_removed_from_a_live_object_is_added_back(kubeconfig: str, k8s_api: Any, namespace: str) -> None:
    """Someone takes our finalizer off a live object (a cleanup script, another tool): it is added
    back and the object reconciled, so a later delete still runs the cleanup — even with a
    predicate that ignores metadata-only changes."""
    registry = declop.registry.Registry()
    calls: list[tuple[str, declop.Phase]] = []

    @declop.reconciler("configmaps", registry=registry, finalizer=FINALIZER, labels=LABEL,
                       predicates=[declop.reconcile.predicates.generation_changed])
    def guarded(name: str, phase: declop.Phase, **_: Any) -> None:
        calls.append((name, phase))

    core(k8s_api).create_namespaced_config_map(namespace, {"metadata": {"name": "live", "labels": {"finalizer-test": "yes"}}})
    read = lambda: core(k8s_api).read_namespaced_config_map("live", namespace)  # noqa: E731
    with runner(registry, kubeconfig, namespace):
        wait_for(lambda: read().metadata.finalizers == [FINALIZER], 20, what="our finalizer")
        # the finalizer is written before the CREATED call runs: wait for that one call
        wait_for(lambda: calls == [("live", declop.Phase.CREATED)], 20, what="exactly one CREATED call")
        core(k8s_api).patch_namespaced_config_map("live", namespace, [{"op": "remove", "path": "/metadata/finalizers"}])
        wait_for(lambda: calls.count(("live", declop.Phase.CREATED)) == 2, 20, what="a reconcile after the removal")
        wait_for(lambda: read().metadata.finalizers == [FINALIZER], 20, what="our finalizer back")
        core(k8s_api).delete_namespaced_config_map("live", namespace)
        wait_for(lambda: gone(read), 20, what="the object to go")
        wait_for(lambda: ("live", declop.Phase.DELETED) in calls, 20, what="the DELETED call")
        assert ("live", declop.Phase.DELETING) in calls, "the cleanup must run before the object goes"
