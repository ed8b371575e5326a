"""The fake apiserver's ``fieldSelector`` against the real kube-apiserver's: the same writes give the
same LIST answers, the same watch events and the same refusals. A pod that becomes Running comes to
a ``status.phase=Running`` watch as ADDED, and one that stops running as DELETED, carrying the pod as
it was at the resourceVersion of the change that moved it out; a field label the resource does not
serve is a 400 (issue 42: the fake ignored ``fieldSelector``, so a ``fields=`` informer cached
every object in a unit test or the simulator)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Awaitable, Callable

import pytest

from declop.errors import ApiError
from declop.kube.transport import Transport, load_configuration
from declop.testing.fakes.apiserver import FakeApiServer
from declop.testing.cluster.controlplane import ControlPlane

pytestmark = pytest.mark.integration

MERGE = "application/merge-patch+json"
Write = Callable[..., Awaitable[Any]]
Watch = Callable[[str, dict[str, Any]], AsyncIterator[bytes]]
POD = {
    "apiVersion": "v1", "kind": "Pod",
    "spec": {"nodeName": "node-a", "automountServiceAccountToken": False, "containers": [{"name": "c", "image": "example.invalid/none:1"}]},
}  # fmt: skip


async def refusal(write: Write, path: str, selector: str) -> tuple[int, str]:
    """The status of a LIST with this field selector, and the reason the apiserver gives."""
    try:
        await write("GET", path, params={"fieldSelector": selector})
    except ApiError as exc:
        return exc.status, str(exc)
    return 200, ""


async def scenario(namespace: str, write: Write, watch: Watch) -> dict[str, Any]:
    cms, pods = f"/api/v1/namespaces/{namespace}/configmaps", f"/api/v1/namespaces/{namespace}/pods"
    for name in ("a", "b"):
        await write("POST", cms, body={"metadata": {"name": name}})
    named = await write("GET", cms, params={"fieldSelector": "metadata.name=a"})
    others = await write("GET", cms, params={"fieldSelector": f"metadata.name!=a,metadata.namespace={namespace}"})
    start = (await write("GET", pods, params={"fieldSelector": "status.phase=Running"}))["metadata"]["resourceVersion"]
    await write("POST", pods, body={**POD, "metadata": {"name": "p"}})
    await write("POST", pods, body={**POD, "metadata": {"name": "q"}})  # never Running: never seen
    answers = [
        await write("PATCH", f"{pods}/p/status", body={"status": {"phase": "Running"}}, content_type=MERGE),
        await write("PATCH", f"{pods}/p", body={"metadata": {"labels": {"x": "1"}}}, content_type=MERGE),
        await write("PATCH", f"{pods}/p/status", body={"status": {"phase": "Succeeded"}}, content_type=MERGE),
    ]
    rvs = [a["metadata"]["resourceVersion"] for a in answers]
    seen: list[tuple[str, str, str, bool]] = []
    params = {"watch": "true", "fieldSelector": "status.phase=Running", "resourceVersion": start, "timeoutSeconds": 30}
    async for line in watch(pods, params):
        event = json.loads(line)
        obj = event["object"]
        seen.append((event["type"], obj["metadata"]["name"], obj["status"]["phase"], obj["metadata"]["resourceVersion"] in rvs))
        if len(seen) == 3:
            break
    return {
        "named": [o["metadata"]["name"] for o in named["items"]],
        "others": [o["metadata"]["name"] for o in others["items"] if o["metadata"]["name"] in ("a", "b")],
        "events": seen,
        "configmaps data.colour": await refusal(write, cms, "data.colour=blue"),
        "pods spec.colour": await refusal(write, pods, "spec.colour=blue"),
        "pods spec.nodeName": await refusal(write, pods, "spec.nodeName=node-a"),
    }


EXPECTED = {
    "named": ["a"],
    "others": ["b"],
    "events": [("ADDED", "p", "Running", True), ("MODIFIED", "p", "Running", True), ("DELETED", "p", "Running", True)],
    "configmaps data.colour": (400, '"data.colour" is not a known field selector: only "metadata.name", "metadata.namespace"'),
    "pods spec.colour": (400, "field label not supported: spec.colour"),
    "pods spec.nodeName": (200, ""),
}


def test_the_fake_field_selector_answers_as_the_real_apiserver(control_plane: ControlPlane, namespace: str) -> None:
    async def real() -> dict[str, Any]:
        transport = Transport(load_configuration(control_plane.kubeconfig_path), qps=500, burst=500)
        try:

            async def write(method: str, path: str, **kw: Any) -> Any:
                for _ in range(300):  # a pod waits for the namespace's default ServiceAccount
                    try:
                        return await transport.request(method, path, **kw)
                    except ApiError as exc:
                        if not (exc.status == 403 and "serviceaccount" in str(exc).lower()):
                            raise
                    await asyncio.sleep(0.1)
                raise AssertionError(f"{method} {path}: no default ServiceAccount in 30 s")

            async def watch(path: str, params: dict[str, Any]) -> AsyncIterator[bytes]:
                async for line in transport.stream(path, params):
                    yield line

            return await asyncio.wait_for(scenario(namespace, write, watch), 90)
        finally:
            await transport.close()

    async def fake() -> dict[str, Any]:
        server = FakeApiServer()

        async def write(method: str, path: str, **kw: Any) -> Any:
            return await server.request(method, path, **kw)

        async def watch(path: str, params: dict[str, Any]) -> AsyncIterator[bytes]:
            async for line in server.watch(path, params):
                yield line

        return await asyncio.wait_for(scenario(namespace, write, watch), 10)

    from_real = asyncio.run(real())
    assert from_real == EXPECTED
    assert asyncio.run(fake()) == from_real
