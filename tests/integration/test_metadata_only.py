"""Metadata-only watches against a real kube-apiserver: the informer lists and watches
PartialObjectMetadata, the cache holds no spec/data, ``client.get`` returns the metadata, and
``client.live.get`` reads the whole object."""

from __future__ import annotations

import threading
from typing import Any

import kubernetes.client

import declop
from declop.cache.informer import METADATA_ACCEPT, Informer
from declop.manager import Options
from declop.testing.cluster.runner import OperatorRunner, wait_for

SECRET = {"password": "c2VjcmV0"}  # base64 of "secret"


def make_secret(api: Any, namespace: str, name: str, **labels: str) -> None:
    body = {"metadata": {"name": name, "labels": {"declop-test": "yes", **labels}}, "data": SECRET, "type": "Opaque"}
    kubernetes.client.CoreV1Api(api).create_namespaced_secret(namespace, body)


def test_a_metadata_only_cache_holds_metadata_and_the_live_read_gets_the_body(kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()
    seen: dict[str, Any] = {}
    lock = threading.Lock()

    @registry.reconciler("secrets", metadata_only=True)
    def meta(request, client, obj, **_):
        cached = client.get(request)
        live = client.live.get(request)
        with lock:
            seen[request.name] = (obj, cached, live)

    make_secret(k8s_api, namespace, "before")  # listed
    options = Options(namespaces=(namespace,), grace_period=5)
    with OperatorRunner(registry, kubeconfig=kubeconfig, options=options) as op:
        make_secret(k8s_api, namespace, "after")  # watched
        wait_for(lambda: {"before", "after"} <= set(seen), 20, what="both secrets reconciled")
        (informer,) = op.manager.informers  # client.get was served by it: no full informer was started
        assert isinstance(informer, Informer) and informer.metadata_only
        assert informer.name == f"secrets in {namespace} (metadata only)"
        for name in ("before", "after"):
            obj, cached, live = seen[name]
            # what the apiserver answers for as=PartialObjectMetadata: metadata and the meta kind
            assert obj["kind"] == "PartialObjectMetadata" and obj["apiVersion"] == "meta.k8s.io/v1"
            assert set(obj) == {"kind", "apiVersion", "metadata"}, f"{name}: {sorted(obj)}"
            assert obj["metadata"]["name"] == name and obj["metadata"]["labels"]["declop-test"] == "yes"
            assert "managedFields" not in obj["metadata"], "the default transform still applies"
            assert cached == obj
            assert live["kind"] == "Secret" and live["data"] == SECRET and live["type"] == "Opaque"
        # the store itself: no body anywhere
        stored = list(informer.store)
        assert {o["metadata"]["name"] for o in stored} == {"before", "after"}
        assert all("data" not in o and "type" not in o for o in stored)
        # a metadata change arrives through the watch
        kubernetes.client.CoreV1Api(k8s_api).patch_namespaced_secret(
            "after", namespace, {"metadata": {"labels": {"touched": "yes"}}}
        )
        wait_for(
            lambda: (informer.store.get(declop.Request(namespace, "after")) or {})["metadata"].get("labels", {}).get("touched") == "yes",
            10,
            what="the label change in the metadata cache",
        )


def test_both_list_modes_ask_for_partial_object_metadata(kubeconfig, k8s_api, namespace):
    """The paginated LIST (PartialObjectMetadataList) and the streaming list + watch
    (PartialObjectMetadata) both fill the store with metadata only."""
    for mode in ("paged", "stream"):
        make_secret(k8s_api, namespace, f"s-{mode}")
        registry = declop.registry.Registry()

        @registry.reconciler("secrets", metadata_only=True, labels="declop-test=yes", name=f"m-{mode}")
        def handle(**_):
            pass

        options = Options(namespaces=(namespace,), grace_period=5, list_mode=mode)
        with OperatorRunner(registry, kubeconfig=kubeconfig, options=options) as op:
            (informer,) = op.manager.informers
            assert informer.last_sync_mode == mode
            objs = list(informer.store)
            assert objs and all(set(o) == {"kind", "apiVersion", "metadata"} for o in objs), objs
            assert all(o["kind"] == "PartialObjectMetadata" for o in objs)
    assert METADATA_ACCEPT == "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


def test_owns_metadata_only_children_and_a_full_cache_win_for_client_reads(kubeconfig, k8s_api, namespace):
    """An owns= source cached as metadata wakes the owner; a resource cached both ways is read
    whole by client.get; writing a metadata-only object back is refused with one line."""
    core = kubernetes.client.CoreV1Api(k8s_api)
    owner = core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "owner", "labels": {"declop-test": "yes"}}, "data": {"k": "v"}}
    )
    registry = declop.registry.Registry()
    woken: list[str] = []
    refused: list[str] = []

    @registry.reconciler(
        "configmaps", labels="declop-test=yes", owns=[declop.kube.resource.Resource("secrets", metadata_only=True)], name="owner"
    )
    def reconcile_owner(request, client, **_):
        woken.append(request.name)
        for secret in client.list("secrets", namespace=request.namespace):
            if "data" not in secret:
                try:
                    client.update(secret)
                except declop.errors.ConfigError as exc:
                    refused.append(str(exc))

    options = Options(namespaces=(namespace,), grace_period=5)
    with OperatorRunner(registry, kubeconfig=kubeconfig, options=options) as op:
        wait_for(lambda: "owner" in woken, 10, what="the first reconcile")
        woken.clear()
        body = {
            "metadata": {
                "name": "child",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid, "controller": True}
                ],
            },
            "data": SECRET,
        }
        core.create_namespaced_secret(namespace, body)
        wait_for(lambda: "owner" in woken and refused, 10, what="the owner woken by its metadata-only child")
        assert refused[0].startswith("this object holds metadata only (it comes from a metadata_only cache)")
        # a full informer for secrets appears (e.g. another controller): client.get reads it whole
        pool = op.manager.informers
        info = op.manager.discovery.resolve_cached("secrets")

        async def add_full() -> None:
            (full,) = pool.for_resource(info)
            await full.synced.wait()

        op.call(add_full())
        client = declop.Client(op.manager.context)
        assert client.get("secrets", f"{namespace}/child")["data"] == SECRET
