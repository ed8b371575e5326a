"""write-helpers.md's Pod recipe on a real apiserver (issue 41: "whether create_or_update suits
Pods"): the spec is set only at creation, so later calls compare equal ("unchanged", no write)
despite everything the apiserver defaulted, and an image change — the one spec field a Pod lets
you change — is an update the apiserver accepts."""

from __future__ import annotations

from typing import Any

import kubernetes.client
import pytest

import declop
from declop.manager import Options
from declop.testing.cluster.runner import OperatorRunner, wait_for

pytestmark = pytest.mark.integration


def desired_pod(owner: dict[str, Any]) -> Any:  # the recipe of docs/write-helpers.md, verbatim
    def mutate(pod: dict[str, Any]) -> None:
        pod.setdefault("metadata", {}).setdefault("labels", {})["example.com/widget"] = owner["metadata"]["name"]
        if "uid" not in pod["metadata"]:
            declop.set_controller_reference(pod, owner)
            pod["spec"] = {"containers": [{"name": "main", "image": owner["data"]["image"]}]}
        else:
            pod["spec"]["containers"][0]["image"] = owner["data"]["image"]
    return mutate


def test_the_pod_recipe_creates_once_then_writes_only_an_image_change(control_plane: Any, kubeconfig: str, namespace: str) -> None:
    registry = declop.registry.Registry()
    results: list[tuple[str, str]] = []

    @declop.reconciler("configmaps", registry=registry, labels={"role": "pod-owner"}, owns=["pods"])
    def owner(request: declop.Request, obj: Any, client: declop.Client, **_: Any) -> None:
        if obj is None:
            return
        skeleton = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": request.name, "namespace": request.namespace}}
        results.append((obj["data"]["image"], declop.create_or_update(client, skeleton, desired_pod(obj))))

    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    with OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=5)):
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "w", "labels": {"role": "pod-owner"}}, "data": {"image": "busybox:1.36"}})
        wait_for(lambda: ("busybox:1.36", "created") in results, 20, what="the Pod created")
        wait_for(lambda: ("busybox:1.36", "unchanged") in results, 20, what="the Pod's own event: an unchanged call")
        core.patch_namespaced_config_map("w", namespace, {"data": {"image": "busybox:1.37"}})
        wait_for(lambda: ("busybox:1.37", "updated") in results, 20, what="the image update")
        assert core.read_namespaced_pod("w", namespace).spec.containers[0].image == "busybox:1.37"
        core.patch_namespaced_config_map("w", namespace, {"metadata": {"labels": {"touched": "yes"}}})
        wait_for(lambda: results[-1] == ("busybox:1.37", "unchanged"), 20, what="a later call that changes nothing")
    assert not any(r == "failed" for _, r in results)
    assert [r for _, r in results].count("created") == 1 and [r for _, r in results].count("updated") == 1
