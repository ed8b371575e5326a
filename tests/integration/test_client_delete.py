"""``client.delete(…, propagation=, grace_period=)`` against the real apiserver and its garbage
collector (the control plane's kube-controller-manager): the DeleteOptions a handler passes reach
the server and are honoured, and a batch/v1 Job deleted without ``propagation=`` orphans its Pods
— the apiserver's default for Jobs — with a one-time hint in the log.

No node: the Jobs are suspended (the Job controller makes no Pods) and each test creates the Job's
Pod itself, with an ownerReference to it, as the Job controller would."""

from __future__ import annotations

import logging
from typing import Any

import kubernetes.client
import pytest

import declop
from declop.manager import Options
from declop.reconcile import client as client_module
from declop.testing.cluster.runner import OperatorRunner, wait_for

pytestmark = pytest.mark.integration

LABEL = "delete-test"


def deleter(namespace: str) -> declop.registry.Registry:
    """A reconciler of labelled ConfigMaps that deletes what their data names, with the options
    they name: ``resource``, ``name``, and optionally ``propagation`` and ``grace_period``."""
    registry = declop.registry.Registry()

    @registry.reconciler("configmaps", labels=f"{LABEL}=yes")
    def delete_what_it_says(obj: Any, client: declop.Client, **_: Any) -> None:
        if obj is None:
            return
        data = obj.get("data") or {}
        grace = data.get("grace_period")
        client.delete(
            data["resource"],
            name=data["name"],
            propagation=data.get("propagation"),
            grace_period=int(grace) if grace is not None else None,
        )

    return registry


def order(core: kubernetes.client.CoreV1Api, namespace: str, configmap: str, **data: str) -> None:
    core.create_namespaced_config_map(namespace, {"metadata": {"name": configmap, "labels": {LABEL: "yes"}}, "data": data})


def gone(read: Any) -> bool:
    try:
        read()
    except kubernetes.client.ApiException as exc:
        return exc.status == 404
    return False


def create_pod(core: kubernetes.client.CoreV1Api, namespace: str, body: dict[str, Any]) -> None:
    def create() -> bool | None:
        try:
            core.create_namespaced_pod(namespace, body)
            return True
        except kubernetes.client.ApiException as exc:
            if exc.status == 403 and "serviceaccount" in str(exc.body).lower():
                return None  # the controller-manager has not made the namespace's default one yet
            raise

    wait_for(create, 30, what=f"pod {body['metadata']['name']} created")


def job_with_pod(api: Any, namespace: str, name: str) -> None:
    """A suspended Job and a Pod it owns (unscheduled, so deleting it is immediate)."""
    batch = kubernetes.client.BatchV1Api(api)
    job = batch.create_namespaced_job(namespace, {
        "metadata": {"name": name},
        "spec": {"suspend": True, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "example.invalid/none:1"}]}}},
    })  # fmt: skip
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job.metadata.uid,
             "controller": True, "blockOwnerDeletion": True}  # fmt: skip
    create_pod(kubernetes.client.CoreV1Api(api), namespace, {
        "metadata": {"name": f"{name}-pod", "ownerReferences": [owner]},
        "spec": {"automountServiceAccountToken": False, "containers": [{"name": "c", "image": "example.invalid/none:1"}]},
    })  # fmt: skip


def test_a_job_deleted_with_background_propagation_takes_its_pods_with_it(kubeconfig: str, k8s_api: Any, namespace: str) -> None:
    core, batch = kubernetes.client.CoreV1Api(k8s_api), kubernetes.client.BatchV1Api(k8s_api)
    job_with_pod(k8s_api, namespace, "work")
    options = Options(namespaces=(namespace,), grace_period=2)
    with OperatorRunner(deleter(namespace), kubeconfig=kubeconfig, options=options):
        order(core, namespace, "delete-work", resource="jobs.batch", name="work", propagation="Background")
        wait_for(lambda: gone(lambda: batch.read_namespaced_job("work", namespace)), 30, what="the Job gone")
        wait_for(lambda: gone(lambda: core.read_namespaced_pod("work-pod", namespace)), 30,
                 what="its Pod deleted by the garbage collector")  # fmt: skip


def test_a_job_deleted_with_the_default_orphans_its_pods_and_says_so_once(
    kubeconfig: str, k8s_api: Any, namespace: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(client_module, "_job_hint_logged", False)
    caplog.set_level(logging.INFO, "declop.client")
    core, batch = kubernetes.client.CoreV1Api(k8s_api), kubernetes.client.BatchV1Api(k8s_api)
    job_with_pod(k8s_api, namespace, "first")
    job_with_pod(k8s_api, namespace, "second")
    options = Options(namespaces=(namespace,), grace_period=2)
    with OperatorRunner(deleter(namespace), kubeconfig=kubeconfig, options=options):
        order(core, namespace, "delete-first", resource="jobs.batch", name="first")
        order(core, namespace, "delete-second", resource="jobs.batch", name="second")
        for name in ("first", "second"):
            wait_for(lambda: gone(lambda: batch.read_namespaced_job(name, namespace)), 30, what=f"Job {name} gone")
            # the garbage collector orphans the Pod: it stays, its ownerReference removed
            pod = wait_for(lambda: (p := core.read_namespaced_pod(f"{name}-pod", namespace)) and not p.metadata.owner_references and p,
                           30, what=f"{name}-pod orphaned")  # fmt: skip
            assert pod.metadata.deletion_timestamp is None
    hints = [r.getMessage() for r in caplog.records if r.name == "declop.client"]
    assert len(hints) == 1 and "orphan their Pods" in hints[0]


def test_grace_period_reaches_the_apiserver(kubeconfig: str, k8s_api: Any, namespace: str) -> None:
    """A Pod bound to a node (none runs it) and held by a finalizer: the apiserver records the
    grace period the delete asked for in ``metadata.deletionGracePeriodSeconds``."""
    core = kubernetes.client.CoreV1Api(k8s_api)
    hold = "test.declop.io/hold"
    create_pod(core, namespace, {
        "metadata": {"name": "slow", "finalizers": [hold]},
        "spec": {"nodeName": "nowhere", "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 30,
                 "containers": [{"name": "c", "image": "example.invalid/none:1"}]},
    })  # fmt: skip
    options = Options(namespaces=(namespace,), grace_period=2)
    try:
        with OperatorRunner(deleter(namespace), kubeconfig=kubeconfig, options=options):
            order(core, namespace, "delete-slow", resource="pods", name="slow", grace_period="77")
            pod = wait_for(lambda: (p := core.read_namespaced_pod("slow", namespace)).metadata.deletion_timestamp and p,
                           30, what="the Pod marked for deletion")  # fmt: skip
            assert pod.metadata.deletion_grace_period_seconds == 77
    finally:
        core.patch_namespaced_pod("slow", namespace, {"metadata": {"finalizers": None}})
        try:
            core.delete_namespaced_pod("slow", namespace, grace_period_seconds=0)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
