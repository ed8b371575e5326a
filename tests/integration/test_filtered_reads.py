"""A ``labels=`` controller that reads its own object with ``client.get(request)`` on a real
kube-apiserver (issue 42): two informers of one resource — the filtered one that wakes it, and the
unfiltered one its reads start once the object left the filter. Whatever order the two watches
deliver a change in, the handler's last read of the object is the object as it is now, so what
it did last (keep or delete a child ConfigMap) matches the object's labels: the simulator's I10
(declop.testing.simulation.world, ``World(filtered=True)``) on a real cluster.

Two watches of one local apiserver seldom disagree long enough to matter: with the unfiltered
cache's wake disabled this test still passed 3 runs of 3. What fails without it is the simulator's
seed (tests/unit/testing/simulation/test_world_filtered.py), whose watches have delays of their own; this
test shows the whole path — both informers, the reads, the writes — end to end."""

from __future__ import annotations

import threading
from typing import Any

import kubernetes.client

import declop
from declop.errors import NotFound
from declop.manager import Options
from declop.testing.cluster.runner import OperatorRunner, wait_for


def test_an_object_moved_in_and_out_of_the_filter_is_last_read_as_it_is(kubeconfig: str, k8s_api: Any, namespace: str) -> None:
    registry = declop.registry.Registry()
    reads: list[tuple[int, str | None]] = []  # (resourceVersion, app label) of each read of a
    lock = threading.Lock()

    @registry.reconciler("configmaps", labels="app=web")
    async def keep_child(request: declop.Request, client: Any, **_: Any) -> None:
        if request.name.endswith("-child"):
            return
        try:
            obj = client.get(request)  # from the filtered cache, or the unfiltered one once it left
        except NotFound:
            obj = None
        app = ((obj or {}).get("metadata", {}).get("labels") or {}).get("app")
        with lock:
            reads.append((int(obj["metadata"]["resourceVersion"]) if obj else 0, app))
        child = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{request.name}-child", "namespace": request.namespace}}
        if app == "web":
            await client.apply(child)
        else:
            await client.delete("configmaps", f"{request.namespace}/{request.name}-child")

    core = kubernetes.client.CoreV1Api(k8s_api)

    def child() -> bool:
        names = [c.metadata.name for c in core.list_namespaced_config_map(namespace).items]
        return "a-child" in names

    def label(app: str) -> int:
        done = core.patch_namespaced_config_map("a", namespace, {"metadata": {"labels": {"app": app}}})
        return int(done.metadata.resource_version)

    def settled(rv: int, app: str) -> bool:
        with lock:
            last = reads[-1] if reads else (0, None)
        return last[0] >= rv and last[1] == app and child() == (app == "web")

    core.create_namespaced_config_map(namespace, {"metadata": {"name": "a", "labels": {"app": "web"}}})
    with OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=5)):
        wait_for(child, 20, what="the child of a")
        rv = label("db")  # out of the filter: the filtered watch sends DELETED
        wait_for(lambda: settled(rv, "db"), 20, what="a read as it is after leaving the filter, its child gone")
        for round in range(10):  # in and out quickly: the two watches race
            rv = label("web" if round % 2 == 0 else "db")
        wait_for(lambda: settled(rv, "db"), 20, what="a read as it is after the last move out")
        rv = label("web")
        wait_for(lambda: settled(rv, "web"), 20, what="a read as it is back in the filter, its child there")
