"""declop.testing.fakes.apiserver: LISTs and watches filtered by ``labelSelector`` and ``fieldSelector``
as the apiserver filters them — a watch sends ADDED when a change moves an object into its
selectors and DELETED (the object as it was, at the change's resourceVersion) when one moves it
out; a field label the resource does not serve is a 400 (issue 42: the fake ignored
``fieldSelector``, so a ``fields=`` informer in a unit test or the simulator cached everything)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from declop.errors import ApiError
from declop.testing.fakes.apiserver import FakeApiServer

CMS = "/api/v1/namespaces/ns/configmaps"
PODS = "/api/v1/namespaces/ns/pods"
MERGE = "application/merge-patch+json"


def _cm(name: str, namespace: str = "ns", **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace, "labels": labels}}


def _names(listed: dict[str, Any]) -> list[str]:
    return [f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in listed["items"]]


async def _watch(server: FakeApiServer, path: str, params: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """The first ``count`` events of a watch."""
    out = []
    async for line in server.watch(path, {"watch": "true", "timeoutSeconds": 5, **params}):
        out.append(json.loads(line))
        if len(out) == count:
            break
    return out


async def _events(server: FakeApiServer, path: str, params: dict[str, Any], count: int) -> list[tuple[str, str, str]]:
    """The first ``count`` events of a watch: (type, name, resourceVersion)."""
    events = await _watch(server, path, params, count)
    return [(e["type"], e["object"]["metadata"]["name"], e["object"]["metadata"]["resourceVersion"]) for e in events]


def test_a_list_honours_metadata_name_and_namespace_field_selectors() -> None:
    async def main() -> None:
        server = FakeApiServer()
        for ns in ("ns", "other"):
            for name in ("a", "b"):
                server.seed(_cm(name, ns))
        everywhere = "/api/v1/configmaps"
        assert _names(await server.request("GET", everywhere, params={"fieldSelector": "metadata.name=a"})) == ["ns/a", "other/a"]
        assert _names(await server.request("GET", everywhere, params={"fieldSelector": "metadata.namespace==other"})) == ["other/a", "other/b"]
        both = {"fieldSelector": "metadata.name!=a,metadata.namespace=ns"}
        assert _names(await server.request("GET", everywhere, params=both)) == ["ns/b"]
        assert _names(await server.request("GET", CMS, params={"fieldSelector": "metadata.name=b"})) == ["ns/b"]

    asyncio.run(main())


def test_a_field_label_the_resource_does_not_serve_is_a_400_worded_as_the_apiservers() -> None:
    async def main() -> None:
        server = FakeApiServer()
        with pytest.raises(ApiError) as generic:
            await server.request("GET", CMS, params={"fieldSelector": "data.colour=blue"})
        assert generic.value.status == 400
        assert '"data.colour" is not a known field selector: only "metadata.name", "metadata.namespace"' in str(generic.value)
        with pytest.raises(ApiError) as pods:
            await server.request("GET", PODS, params={"fieldSelector": "spec.colour=blue"})
        assert pods.value.status == 400 and "field label not supported: spec.colour" in str(pods.value)
        with pytest.raises(ApiError) as watched:  # a watch refuses it before its first event
            await _events(server, PODS, {"fieldSelector": "spec.colour=blue"}, 1)
        assert watched.value.status == 400
        with pytest.raises(ApiError):  # a node serves no metadata.namespace (it has none)
            await server.request("GET", "/api/v1/nodes", params={"fieldSelector": "metadata.namespace=x"})

    asyncio.run(main())


def test_a_crd_serves_its_selectable_fields() -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced", "names": {"plural": "widgets", "kind": "Widget"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "selectableFields": [{"jsonPath": ".spec.colour"}]}]},
    }  # fmt: skip

    async def main() -> None:
        server = FakeApiServer([crd])
        for name, colour in (("a", "blue"), ("b", "red")):
            server.seed({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name, "namespace": "ns"}, "spec": {"colour": colour}})
        path = "/apis/example.com/v1/namespaces/ns/widgets"
        assert _names(await server.request("GET", path, params={"fieldSelector": "spec.colour=red"})) == ["ns/b"]
        with pytest.raises(ApiError) as refused:
            await server.request("GET", path, params={"fieldSelector": "spec.size=1"})
        assert refused.value.status == 400

    asyncio.run(main())


def test_a_field_selected_watch_sends_added_and_deleted_as_an_object_moves_in_and_out() -> None:
    """``status.phase=Running`` on pods: a pod that becomes Running comes as ADDED, a change while
    Running as MODIFIED, and one that leaves Running as DELETED carrying the pod as it was (still
    Running) at the resourceVersion of the change that moved it out."""

    async def main() -> None:
        server = FakeApiServer()
        start = server._last_rv
        server.seed({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}, "status": {"phase": "Pending"}})
        server.seed({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q", "namespace": "ns"}, "status": {"phase": "Pending"}})
        rvs = []
        for sub, patch in (("/status", {"status": {"phase": "Running"}}), ("", {"metadata": {"labels": {"x": "1"}}}),
                           ("/status", {"status": {"phase": "Succeeded"}})):
            done = await server.request("PATCH", f"{PODS}/p{sub}", body=patch, content_type=MERGE)
            rvs.append(done["metadata"]["resourceVersion"])
        events = await _events(server, PODS, {"fieldSelector": "status.phase=Running", "resourceVersion": start}, 3)
        assert events == [("ADDED", "p", rvs[0]), ("MODIFIED", "p", rvs[1]), ("DELETED", "p", rvs[2])]
        gone = await _watch(server, PODS, {"fieldSelector": "status.phase=Running", "resourceVersion": rvs[1]}, 1)
        assert gone[0]["object"]["status"]["phase"] == "Running", "DELETED carries the object as it was"

    asyncio.run(main())


def test_a_label_selected_watch_sends_added_and_deleted_as_an_object_moves_in_and_out() -> None:
    async def main() -> None:
        server = FakeApiServer()
        start = server._last_rv
        server.seed(_cm("a", app="web"))
        server.seed(_cm("b"))
        left = await server.request("PATCH", f"{CMS}/a", body={"metadata": {"labels": {"app": "db"}}}, content_type=MERGE)
        came = await server.request("PATCH", f"{CMS}/b", body={"metadata": {"labels": {"app": "web"}}}, content_type=MERGE)
        events = await _events(server, CMS, {"labelSelector": "app=web", "resourceVersion": start}, 3)
        assert [(t, n) for t, n, _ in events] == [("ADDED", "a"), ("DELETED", "a"), ("ADDED", "b")]
        assert events[1][2] == left["metadata"]["resourceVersion"] and events[2][2] == came["metadata"]["resourceVersion"]
        # both selectors at once: b is web but not named a
        both = await _events(server, CMS, {"labelSelector": "app=web", "fieldSelector": "metadata.name=a", "resourceVersion": start}, 2)
        assert [(t, n) for t, n, _ in both] == [("ADDED", "a"), ("DELETED", "a")]

    asyncio.run(main())
