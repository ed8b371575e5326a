"""The fake apiserver's label-selected watch against the real kube-apiserver's: the same writes
give the same events. An object that starts to match the selector comes as ADDED, one that stops
matching as DELETED — carrying the object as it was (still matching) at the resourceVersion of
the change that made it leave — and a deletion as DELETED (issue 42: the fake sent nothing when an
object stopped matching, so the simulator could not model a filtered informer's cache)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Awaitable, Callable

import pytest

from declop.kube.transport import Transport, load_configuration
from declop.testing.fakes.apiserver import FakeApiServer
from declop.testing.cluster.controlplane import ControlPlane

pytestmark = pytest.mark.integration

MERGE = "application/merge-patch+json"
Write = Callable[..., Awaitable[Any]]
Watch = Callable[[str, dict[str, Any]], AsyncIterator[bytes]]


async def scenario(namespace: str, write: Write, watch: Watch) -> list[tuple[str, str, str | None, bool]]:
    """Writes that move ConfigMaps in and out of ``app=web``, then the selected watch from before
    them: per event (type, name, its app label, whether its resourceVersion is the one the write
    that caused it answered with)."""
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    start = (await write("GET", path, params={"labelSelector": "app=web"}))["metadata"]["resourceVersion"]
    answers = [
        await write("POST", path, body={"metadata": {"name": "a", "labels": {"app": "web"}}}),
        await write("POST", path, body={"metadata": {"name": "b"}}),  # never seen: not selected
        await write("PATCH", f"{path}/a", body={"metadata": {"labels": {"app": "db"}}}, content_type=MERGE),
        await write("PATCH", f"{path}/b", body={"metadata": {"labels": {"app": "web"}}}, content_type=MERGE),
        await write("PATCH", f"{path}/b", body={"data": {"k": "v"}}, content_type=MERGE),
        await write("PATCH", f"{path}/a", body={"data": {"k": "v"}}, content_type=MERGE),  # not selected
    ]
    await write("DELETE", f"{path}/b")
    rvs = [a["metadata"]["resourceVersion"] for a in answers]
    seen: list[tuple[str, str, str | None, bool]] = []
    async for line in watch(path, {"watch": "true", "labelSelector": "app=web", "resourceVersion": start, "timeoutSeconds": 30}):
        event = json.loads(line)
        meta = event["object"]["metadata"]
        seen.append((event["type"], meta["name"], (meta.get("labels") or {}).get("app"), meta["resourceVersion"] in rvs))
        if len(seen) == 5:
            break
    return seen


def expected() -> list[tuple[str, str, str | None, bool]]:
    return [
        ("ADDED", "a", "web", True),
        ("DELETED", "a", "web", True),  # as it was, at the change's resourceVersion
        ("ADDED", "b", "web", True),
        ("MODIFIED", "b", "web", True),
        ("DELETED", "b", "web", False),  # a deletion's resourceVersion is in no answer above
    ]


def test_the_fake_label_watch_sends_what_the_real_apiserver_sends(control_plane: ControlPlane, namespace: str) -> None:
    async def real() -> list[Any]:
        transport = Transport(load_configuration(control_plane.kubeconfig_path), qps=500, burst=500)
        try:

            async def write(method: str, path: str, **kw: Any) -> Any:
                return await transport.request(method, path, **kw)

            async def watch(path: str, params: dict[str, Any]) -> AsyncIterator[bytes]:
                async for line in transport.stream(path, params):
                    yield line

            return await asyncio.wait_for(scenario(namespace, write, watch), 60)
        finally:
            await transport.close()

    async def fake() -> list[Any]:
        server = FakeApiServer()

        async def write(method: str, path: str, **kw: Any) -> Any:
            return await server.request(method, path, **kw)

        async def watch(path: str, params: dict[str, Any]) -> AsyncIterator[bytes]:
            async for line in server.watch(path, params):
                yield line

        return await asyncio.wait_for(scenario(namespace, write, watch), 10)

    from_real = asyncio.run(real())
    assert from_real == expected()
    assert asyncio.run(fake()) == from_real
