"""The simulated world's garbage collector and the ownership property (declop.testing.simulation.gc),
on the fake apiserver alone and in world runs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import declop
from declop.errors import Conflict, NotFound
from declop.kube.keys import Request
from declop.registry import Registry
from declop.testing.fakes.apiserver import FakeApiServer
from declop.testing.simulation import gc as simgc
from declop.testing.simulation.gc import OUTLIVES, ownership, sweep
from declop.testing.simulation.props import Call, Write, Writes
from declop.testing.simulation.world import World, run

#: long enough that the workload deletes primaries after their children were made
WORLD = World(handlers="handlers.py", objects=20, duration=40.0, faults=())
TRACE = ('File "h.py", line 7, in make', "  client.create(...)")


def _post(server: FakeApiServer, plural: str, name: str, *owners: dict[str, Any], **meta: Any) -> dict[str, Any]:
    refs = [{"apiVersion": "v1", "kind": o["kind"], "name": o["metadata"]["name"], "uid": o["metadata"]["uid"]} for o in owners]
    body = {"metadata": {"name": name, "namespace": "ns", **({"ownerReferences": refs} if refs else {}), **meta}}
    return asyncio.run(server.request("POST", f"/api/v1/namespaces/ns/{plural}", body=body))


def _delete(server: FakeApiServer, plural: str, name: str) -> None:
    asyncio.run(server.request("DELETE", f"/api/v1/namespaces/ns/{plural}/{name}"))


def _names(server: FakeApiServer, plural: str) -> set[str]:
    return {o["metadata"]["name"] for o in server.store(plural)}


def test_the_collector_deletes_a_child_once_all_its_owners_are_gone_and_cascades_a_sweep_later() -> None:
    server = FakeApiServer()
    a, b = _post(server, "configmaps", "a"), _post(server, "configmaps", "b")
    c1 = _post(server, "secrets", "c1", a)
    _post(server, "secrets", "c2", a, b)  # two owners
    _post(server, "secrets", "free")  # no owner: never collected
    _post(server, "configmaps", "grandchild", c1)
    assert asyncio.run(sweep(server)) == 0
    _delete(server, "configmaps", "a")
    assert asyncio.run(sweep(server)) == 1
    assert _names(server, "secrets") == {"c2", "free"}  # c2: b still owns it
    assert "grandchild" in _names(server, "configmaps")  # background: the next sweep
    asyncio.run(sweep(server))
    assert _names(server, "configmaps") == {"b"}
    _delete(server, "configmaps", "b")
    asyncio.run(sweep(server))
    assert _names(server, "secrets") == {"free"}


def test_the_collector_deletes_a_child_with_a_finalizer_as_any_delete_does_and_once() -> None:
    server = FakeApiServer()
    a = _post(server, "configmaps", "a")
    _post(server, "secrets", "held", a, finalizers=["example.com/keep"])
    _delete(server, "configmaps", "a")
    assert asyncio.run(sweep(server)) == 1
    (held,) = server.store("secrets")
    assert held["metadata"]["deletionTimestamp"]
    assert asyncio.run(sweep(server)) == 0  # being deleted already


def _created(at: float, primary: str, child: str) -> Write:
    return Write(at, Call("make", Request("ns", primary), at), "POST", f"secrets ns/{child}", True, TRACE)


def _resource(controller: str) -> str | None:
    return "configmaps" if controller == "make" else None


def test_ownership_names_the_first_orphan_its_primary_and_the_line_of_its_create() -> None:
    server = FakeApiServer()
    live = _post(server, "configmaps", "live")
    for name in ("p1-child", "p2-child", "live-child", "kept-child"):
        _post(server, "secrets", name)
    _post(server, "secrets", "owned-child", live)
    _post(server, "secrets", "marked-child", annotations={OUTLIVES: "true"})
    writes = Writes()
    for at, primary, child in [(5.0, "p2", "p2-child"), (3.0, "p1", "p1-child"), (1.0, "live", "live-child"), (2.0, "p3", "owned-child"),
                               (2.5, "p4", "marked-child"), (2.7, "p5", "gone-child")]:  # fmt: skip
        writes.note(_created(at, primary, child))
    writes.note(Write(1.5, Call("other", Request("ns", "p6"), 1.5), "POST", "secrets ns/kept-child", True, TRACE))
    v = ownership(server, writes, _resource, 100.0)
    assert v is not None and v.invariant == "ownership" and v.trace == TRACE
    assert v.detail.startswith("secrets ns/p1-child, created by make for ns/p1 at t=3.000, is left after ns/p1 was deleted")
    assert "(2 orphaned child(ren) in all;" in v.detail and OUTLIVES in v.detail


def test_ownership_holds_when_no_child_is_left_without_its_primary() -> None:
    server = FakeApiServer()
    _post(server, "configmaps", "live")
    _post(server, "secrets", "live-child")
    writes = Writes()
    writes.note(_created(1.0, "live", "live-child"))
    writes.note(_created(2.0, "gone", "gone-child"))  # collected (or deleted by the handler)
    assert ownership(server, writes, _resource, 100.0) is None


# -- world runs -------------------------------------------------------------------------------


def _child(request: Any, client: Any, obj: Any, owned: bool) -> None:
    if obj is None:
        return
    name = f"{request.name}-child"
    try:
        client.get("secrets", Request(request.namespace, name))
        return
    except NotFound:
        pass
    child = {"metadata": {"name": name, "namespace": request.namespace}}
    if owned:
        declop.set_controller_reference(child, obj)
    try:
        client.create("secrets", child)
    except Conflict:
        pass


def orphaning(request: Any, client: Any, obj: Any) -> None:
    _child(request, client, obj, owned=False)


def owning(request: Any, client: Any, obj: Any) -> None:
    _child(request, client, obj, owned=True)


def test_a_child_without_an_owner_fails_ownership_with_the_line_of_its_create() -> None:
    registry = Registry()
    registry.reconciler("configmaps", owns=["secrets"])(orphaning)
    result = run(WORLD, 0, registry)
    (v,) = result.violations
    assert v.invariant == "ownership" and "is left after" in v.detail, result.report()
    assert v.trace[-2].endswith("in _child") and "client.create" in v.trace[-1]
    assert v.trace[-4].endswith("in orphaning")


def test_a_child_with_an_owner_is_collected_with_its_primary_and_ownership_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    collected: list[int] = []
    real = simgc.sweep

    async def counted(server: FakeApiServer) -> int:
        collected.append(await real(server))
        return collected[-1]

    monkeypatch.setattr(simgc, "sweep", counted)
    registry = Registry()
    registry.reconciler("configmaps", owns=["secrets"])(owning)
    result = run(WORLD, 0, registry)
    assert result.ok, result.report()
    assert sum(collected) >= 1  # the workload deleted primaries: their children went with them
