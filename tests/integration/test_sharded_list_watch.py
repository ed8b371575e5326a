"""Sharded list and watch against the real kube-apiserver v1.36, gate ``ShardedListAndWatch`` on
(``sharded_control_plane``) and off (``control_plane``): declop's FNV-1a hash selects exactly
what the apiserver selects, server-side and client-side informers hold the same objects, and a
change of owned ranges moves objects in and out of the cache without a DELETED for the ones that
merely left."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from declop.kube.discovery import ResourceInfo
from declop.cache.informer import Informer
from declop.leases.hashing import ShardFilter, selector, split
from declop.testing.cluster.controlplane import ControlPlane
from declop.kube.transport import Transport, load_configuration

pytestmark = pytest.mark.integration

CONFIGMAPS = ResourceInfo(group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True)
OBJECTS = 3000
#: every ConfigMap of these tests carries it, and every LIST and informer selects by it: the
#: controller-manager's kube-root-ca.crt (when it runs) is not part of the data
LABEL = "declop-test=sharding"
SELECT = {"labelSelector": LABEL}
MERGE = "application/merge-patch+json"
RANGES = split(12)


def api(cp: ControlPlane, method: str, path: str, body: Any = None) -> Any:
    status, data = cp.request(method, path, body, timeout=60)
    assert status < 300, (status, data[:300])
    return json.loads(data)


def list_all(cp: ControlPlane, path: str, shard_selector: str = "") -> dict[str, Any]:
    """One unpaged LIST (``shardSelector`` when given): the whole response."""
    query = {**SELECT, **({"shardSelector": shard_selector} if shard_selector else {})}
    return api(cp, "GET", path + "?" + urllib.parse.urlencode(query))  # type: ignore[no-any-return]


async def create_configmaps(transport: Transport, namespace: str, names: list[str]) -> list[dict[str, Any]]:
    """Create ConfigMaps 16 at a time (a few thousand in seconds, even on a loaded machine)."""
    path = CONFIGMAPS.path(namespace=namespace)
    sem = asyncio.Semaphore(16)

    async def one(name: str) -> dict[str, Any]:
        async with sem:
            return await transport.request("POST", path, body={"metadata": {"name": name, "labels": {"declop-test": "sharding"}}, "data": {"v": "0"}})  # type: ignore[no-any-return]

    return list(await asyncio.gather(*(one(n) for n in names)))


def run(cp: ControlPlane, body: Callable[[Transport], Awaitable[Any]], timeout: float = 120) -> Any:
    """Run ``body(transport)`` on a fresh loop with a transport on ``cp``'s admin kubeconfig."""

    async def main() -> Any:
        transport = Transport(load_configuration(cp.kubeconfig_path), qps=500, burst=500)
        try:
            return await asyncio.wait_for(body(transport), timeout)
        finally:
            await transport.close()

    return asyncio.run(main())


async def until(condition: Callable[[], Any], timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        await asyncio.sleep(0.02)


def apiserver_metric(text: str, name: str, label: str) -> float:
    """The sum of the series ``name`` with ``label`` in a Prometheus text exposition."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{") and label in line]
    assert values, f"no {name}{{{label}}} in the apiserver's /metrics"
    return sum(values)


def names_in(objs: list[dict[str, Any]], shard: ShardFilter) -> set[str]:
    return {o["metadata"]["name"] for o in objs if shard.matches(o)}


def store_names(informer: Informer) -> set[str]:
    return {k.name for k in informer.store.keys()}


@pytest.fixture(scope="module")
def populated(sharded_control_plane: ControlPlane) -> Iterator[tuple[ControlPlane, str]]:
    """A namespace with 3,000 ConfigMaps on the gate-on control plane (created once)."""
    cp = sharded_control_plane
    ns = f"shard-{int(time.time() * 1000) % 10**8}"
    api(cp, "POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    run(cp, lambda t: create_configmaps(t, ns, [f"cm-{i:04d}" for i in range(OBJECTS)]))
    yield cp, ns


def test_feature_gate_exists_and_the_server_echoes_shard_info(populated: tuple[ControlPlane, str]) -> None:
    cp, ns = populated
    sel = selector("uid", [RANGES[0]])
    answer = list_all(cp, CONFIGMAPS.path(namespace=ns), sel)
    assert answer["metadata"]["shardInfo"] == {"selector": sel}


def test_client_hash_equals_the_servers_for_every_range(populated: tuple[ControlPlane, str]) -> None:
    """For each of 12 ranges: the server-filtered LIST is exactly the client-filtered full LIST,
    by uid over 3,000 objects; the ranges partition the objects."""
    cp, ns = populated
    path = CONFIGMAPS.path(namespace=ns)
    everything = list_all(cp, path)["items"]
    assert len(everything) == OBJECTS
    total = 0
    for r in RANGES:
        served = {o["metadata"]["name"] for o in list_all(cp, path, selector("uid", [r]))["items"]}
        assert served == names_in(everything, ShardFilter("uid", (r,))), f"range {r}"
        total += len(served)
    assert total == OBJECTS
    # several ranges in one selector: the || of them
    some = (RANGES[1], RANGES[5], RANGES[6], RANGES[11])
    served = {o["metadata"]["name"] for o in list_all(cp, path, selector("uid", some))["items"]}
    assert served == names_in(everything, ShardFilter("uid", some))


def test_client_hash_equals_the_servers_by_namespace(sharded_control_plane: ControlPlane) -> None:
    """By namespace: 24 namespaces, one ConfigMap each; each range's cluster-wide LIST. The names
    differ at the front: names that differ only at the end share their hash's high bits and
    would all fall into one range (docs/sharding.md), which would test nothing."""
    cp = sharded_control_plane
    stem = f"nsh-{int(time.time() * 1000) % 10**8}"
    names = [f"n{i:02d}-{stem}" for i in range(24)]
    for name in names:
        api(cp, "POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        api(cp, "POST", f"/api/v1/namespaces/{name}/configmaps", {"metadata": {"name": "one", "labels": {"declop-test": "sharding"}}})
    everything = [o for o in list_all(cp, "/api/v1/configmaps")["items"] if o["metadata"]["namespace"] in names]
    quarters = split(4)
    seen: list[int] = []
    for r in quarters:
        served = list_all(cp, "/api/v1/configmaps", selector("namespace", [r]))["items"]
        got = {o["metadata"]["namespace"] for o in served if o["metadata"]["namespace"] in names}
        want = {o["metadata"]["namespace"] for o in everything if ShardFilter("namespace", (r,)).matches(o)}
        assert got == want, f"range {r}"
        seen.append(len(got))
    assert sum(seen) == len(names) and sum(1 for n in seen if n) >= 2, seen


@pytest.mark.parametrize("list_mode", ["auto", "paged"])
def test_server_side_and_client_side_informers_hold_the_same_objects(
    populated: tuple[ControlPlane, str], list_mode: str
) -> None:
    """Same ranges, one informer filtered by the apiserver and one filtering itself: the same
    objects after the sync and after creates, updates and deletes; the server-side one received
    only the events of its ranges, the client-side one all of them. Both ways to sync: a
    streaming list (a watch with sendInitialEvents carries the selector too) and paged LISTs."""
    cp, ns = populated
    suffix = list_mode
    owned = (RANGES[0], RANGES[4], RANGES[8])  # a quarter of the space, 3 ranges out of 12

    async def body(transport: Transport) -> None:
        mode: Any = list_mode
        kw: Any = {"namespace": ns, "label_selector": LABEL, "list_mode": mode}
        server = Informer(transport, CONFIGMAPS, shard=ShardFilter("uid", owned), **kw)
        client = Informer(transport, CONFIGMAPS, shard=ShardFilter("uid", owned), shard_filtering="client", **kw)
        everything = (await transport.request("GET", CONFIGMAPS.path(namespace=ns), params=SELECT))["items"]
        server.start()
        client.start()
        try:
            await asyncio.wait_for(asyncio.gather(server.synced.wait(), client.synced.wait()), 60)
            assert server.shard_mode == "server" and client.shard_mode == "client"
            assert server.last_sync_mode == client.last_sync_mode == ("stream" if list_mode == "auto" else "paged")
            expected = names_in(everything, ShardFilter("uid", owned))
            assert store_names(server) == store_names(client) == expected
            assert server.objects_listed == len(expected) and client.objects_listed == len(everything)
            assert server.dropped == 0 and client.dropped == len(everything) - len(expected)

            # churn: 120 creates, 120 updates of them, 40 deletes
            created = await create_configmaps(transport, ns, [f"new-{suffix}-{i:03d}" for i in range(120)])
            path = CONFIGMAPS.path(namespace=ns)
            for obj in created:
                name = obj["metadata"]["name"]
                await transport.request("PATCH", f"{path}/{name}", body={"data": {"v": "1"}}, content_type=MERGE)
            for obj in created[:40]:
                await transport.request("DELETE", f"{path}/{obj['metadata']['name']}")
            sent = 120 + 120 + 40
            # what the apiserver must send the server-side informer: ADDED + MODIFIED for each
            # created object in range, + DELETED for the deleted ones in range
            mine = [i for i, o in enumerate(created) if ShardFilter("uid", owned).matches(o)]
            expected_events = sum(3 if i < 40 else 2 for i in mine)
            await until(lambda: client.events_received >= sent, 60, "every event at the client-side informer")
            await until(lambda: server.events_received >= expected_events, 60, "the owned events at the server-side one")
            now = (await transport.request("GET", path, params=SELECT))["items"]
            want = names_in(now, ShardFilter("uid", owned))
            assert store_names(server) == store_names(client) == want
            assert client.events_received == sent
            assert server.events_received == expected_events < sent
            assert server.dropped == 0 and client.dropped == len(everything) - len(expected) + sent - expected_events
            # the apiserver's side: at least the events this informer did not receive counted as
            # filtered (other tests' sharded watches add theirs). Not apiserver_watch_shards_total:
            # v1.36.3 decrements it twice per closed sharded watch (docs/sharding.md)
            status, text = cp.request("GET", "/metrics", timeout=30)
            assert status == 200
            filtered = apiserver_metric(text.decode(), "apiserver_watch_filtered_events_total", 'resource="configmaps"')
            assert filtered >= sent - expected_events
            for obj in created[40:]:  # leave the namespace as it was (3,000 ConfigMaps)
                await transport.request("DELETE", f"{path}/{obj['metadata']['name']}")
        finally:
            await server.stop()
            await client.stop()

    run(cp, body)


@pytest.mark.parametrize("gate", ["on", "off"])
def test_a_range_change_moves_objects_without_reporting_deletions(
    gate: str, request: pytest.FixtureRequest
) -> None:
    """Own ranges A; then A minus one range plus another: the released objects leave the store
    with no deletion emitted, the gained ones arrive as additions; a narrowing alone does not
    re-list; a real deletion in an owned range is still a deletion; an object of a released
    range changing afterwards reaches nobody."""
    cp: ControlPlane = request.getfixturevalue("sharded_control_plane" if gate == "on" else "control_plane")
    # DECLOP_TEST_FEATURE_GATES may have turned the gate on for control_plane too: then the "off"
    # case forces client-side filtering, so that both paths are still covered
    filtering: Any = "client" if gate == "off" and cp.feature_gates.get("ShardedListAndWatch") else "auto"
    ns = f"move-{gate}-{int(time.time() * 1000) % 10**8}"
    api(cp, "POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    p = split(4)

    async def body(transport: Transport) -> None:
        await create_configmaps(transport, ns, [f"cm-{i:03d}" for i in range(200)])
        path = CONFIGMAPS.path(namespace=ns)
        everything = (await transport.request("GET", path, params=SELECT))["items"]
        events: list[tuple[str, str]] = []

        def handler(old: Any, new: Any) -> None:
            kind = "added" if old is None else "deleted" if new is None else "modified"
            events.append((kind, (new or old)["metadata"]["name"]))

        informer = Informer(
            transport, CONFIGMAPS, namespace=ns, label_selector=LABEL, shard=ShardFilter("uid", (p[0], p[1])), shard_filtering=filtering
        )
        informer.subscribe(handler)
        informer.start()
        try:
            await asyncio.wait_for(informer.synced.wait(), 60)
            assert informer.shard_mode == ("server" if gate == "on" else "client")
            assert store_names(informer) == names_in(everything, ShardFilter("uid", (p[0], p[1])))
            events.clear()

            # move: release p[1], gain p[2]
            listed = informer.objects_listed
            change = await informer.set_shard((p[0], p[2]))
            released = names_in(everything, ShardFilter("uid", (p[1],)))
            gained = names_in(everything, ShardFilter("uid", (p[2],)))
            assert {k.name for k in change.released} == released and change.relisted
            assert change.gained == (p[2],)
            want = names_in(everything, ShardFilter("uid", (p[0], p[2])))
            await until(lambda: store_names(informer) == want, 60, "the gained objects in the store")
            await until(lambda: len(events) >= len(gained), 30, "the gained objects' additions")
            assert sorted(events) == sorted(("added", n) for n in gained), "only additions, for the gained"
            # the cost of the re-list with the new selector: everything owned server-side, all client-side
            relisted = informer.objects_listed - listed
            assert relisted == (len(want) if gate == "on" else len(everything))

            # narrowing only: no sync, the watch goes on from the store's resourceVersion
            events.clear()
            listed = informer.objects_listed
            change = await informer.set_shard((p[2],))
            assert not change.relisted and {k.name for k in change.released} == names_in(everything, ShardFilter("uid", (p[0],)))
            assert store_names(informer) == gained

            # a change in a released range reaches nobody; a deletion in an owned one is reported
            gone_elsewhere = sorted(released)[0]
            deleted_here = sorted(gained)[0]
            await transport.request("DELETE", f"{path}/{gone_elsewhere}")
            await transport.request("DELETE", f"{path}/{deleted_here}")
            await until(lambda: ("deleted", deleted_here) in events, 30, "the owned object's deletion")
            assert events == [("deleted", deleted_here)]
            assert informer.objects_listed == listed, "a narrowing re-lists nothing"

            # owning nothing: the store empties, silently
            change = await informer.set_shard(())
            assert store_names(informer) == set() and len(change.released) == len(gained) - 1
            assert events == [("deleted", deleted_here)]
        finally:
            await informer.stop()

    run(cp, body)
