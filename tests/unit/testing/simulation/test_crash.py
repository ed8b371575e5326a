"""The crash-safety property (declop.testing.simulation.crash): a replica killed right after a handler
write that its line's calls follow with another; a re-run that duplicates a child the killed call
created, or a cleanup that never completes, is reported with the write's line and the crash."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

import declop
from declop.errors import ApiError
from declop.kube.keys import Request
from declop.reconcile.result import Phase
from declop.registry import Registry
from declop.testing.simulation import world as simworld
from declop.testing.fakes.apiserver import FakeApiServer
from declop.testing.simulation.crash import CRASH_BETWEEN_WRITES, MOST, WITHIN, Crashes, crash_safety
from declop.testing.simulation.props import Call, Write, Writes
from declop.testing.simulation.world import World, run

KEY = Request("ns", "p")
CREATE = ('File "h.py", line 7, in make', "  client.create(...)")
RECORD = ('File "h.py", line 9, in make', "  client.patch(...)")
WORLD = World(handlers="handlers.py", objects=40, duration=45.0, faults=())


def _write(call: Call, at: float, verb: str, target: str, trace: tuple[str, ...] = CREATE) -> Write:
    return Write(at, call, verb, target, True, trace)


def test_each_seed_draws_one_to_most_crash_times_in_its_own_stream() -> None:
    state = random.getstate()
    drawn = [Crashes(seed, 60.0) for seed in range(40)]
    assert random.getstate() == state  # the run's other streams do not move
    assert {len(c.times) for c in drawn} == set(range(1, MOST + 1))
    assert all(c.times == sorted(c.times) and 0 <= c.times[0] and c.times[-1] <= WITHIN * 60.0 for c in drawn)
    assert all(len(c.delays) == len(c.times) and all(1.0 <= d <= 6.0 for d in c.delays) for c in drawn)
    assert Crashes(7, 60.0).times == Crashes(7, 60.0).times != Crashes(8, 60.0).times


def test_a_crash_is_due_only_after_its_time_at_a_line_an_earlier_call_followed_with_a_write() -> None:
    c = Crashes(0, 60.0)
    c.times, c.delays = [10.0], [2.0]
    first, second = Call("make", KEY, 1.0), Call("make", Request("ns", "q"), 11.0)
    assert not c.due(1.0, _write(first, 1.0, "POST", "secrets ns/p-1"))  # before its time, and never followed yet
    assert not c.due(1.1, _write(first, 1.1, "PATCH", "configmaps ns/p", RECORD))  # followed the create
    assert not c.due(12.0, _write(second, 12.0, "PATCH", "configmaps ns/q", RECORD))  # the record: a call's last write
    create = _write(second, 12.1, "POST", "secrets ns/q-1")
    assert c.due(12.1, create)
    assert c.crash(12.1, create, "r0#1", None) == 2.0 and not c.times
    (p,) = c.points
    assert (p.write, p.replica, p.call) == (2, "r0#1", second)
    assert "r0#1 was killed at t=12.100 right after write 2 of handler make for ns/q (POST secrets ns/q-1, " in p.text()
    c.times = [13.0]
    assert not c.due(14.0, _write(second, 14.0, "POST", "secrets ns/q-2"))  # one crash per call
    assert not c.due(14.0, _write(Call("make", KEY, 13.5, extra=True), 14.0, "POST", "secrets ns/p-2"))  # not in the check


def _post(server: FakeApiServer, plural: str, name: str, **meta: Any) -> dict[str, Any]:
    body = {"metadata": {"name": name, "namespace": "ns", **meta}}
    return asyncio.run(server.request("POST", f"/api/v1/namespaces/ns/{plural}", body=body))


def _world(children: dict[str, int]) -> tuple[FakeApiServer, Writes, Crashes]:
    """Primaries ``p`` (crashed after its first child's create, at t=5) and peers, each with
    ``children[name]`` secrets created by one call at t=1 (p: its later ones by a call at t=20)."""
    server, writes, crashes = FakeApiServer(), Writes(), Crashes(0, 60.0)
    for name, n in children.items():
        _post(server, "configmaps", name)
        for i in range(n):
            _post(server, "secrets", f"{name}-{i}")
            at = 5.0 if name == "p" and i == 0 else 20.0 + i if name == "p" else 1.0
            writes.note(_write(Call("make", Request("ns", name), at), at, "POST", f"secrets ns/{name}-{i}"))
    crashed = writes.changed[0] if children.get("p") else _write(Call("make", KEY, 5.0), 5.0, "POST", "secrets ns/p-x")
    crashes.times, crashes.delays = [5.0], [1.0]
    crashes.due(5.0, crashed)
    crashes.crash(5.0, crashed, "r1#1", None)
    return server, writes, crashes


def _check(server: FakeApiServer, writes: Writes, crashes: Crashes, deleted: dict[Any, float] | None = None) -> Any:
    return crash_safety(server, writes, crashes, lambda name: "configmaps" if name == "make" else None, 100.0, deleted or {})


def test_a_child_created_again_after_a_crash_beside_the_first_is_a_duplicate_named_with_its_line() -> None:
    v = _check(*_world({"p": 2, "a": 1, "b": 1}))
    assert v is not None and v.invariant == "crash-safety" and v.trace == CREATE
    assert v.detail.startswith("ns/p has 2 secrets created by make, where a primary no crash touched has at most 1: secrets ns/p-1, created at t=21.000, duplicates secrets ns/p-0, created at t=5.000 by a call killed before its next write (r1#1 was killed at t=5.000 right after write 1 of handler make for ns/p")
    assert "a deterministic name (409 AlreadyExists: it is there)" in v.detail


def test_as_many_children_as_the_peers_have_is_no_duplicate_nor_are_unjudged_or_gone_primaries() -> None:
    assert _check(*_world({"p": 2, "a": 2, "b": 1})) is None  # a handler that makes two per primary
    assert _check(*_world({"p": 2})) is None  # no peer: nothing to judge by
    assert _check(*_world({"p": 1, "a": 1})) is None  # the re-run made nothing
    server, writes, crashes = _world({"p": 2, "a": 1})
    assert _check(server, writes, crashes, {("configmaps", KEY): 30.0}) is None  # p deleted since: ownership's business
    asyncio.run(server.request("DELETE", "/api/v1/namespaces/ns/secrets/p-0"))
    assert _check(server, writes, crashes) is None  # the re-run replaced it: one child


def test_a_cleanup_a_crash_interrupted_that_never_completed_is_lost_cleanup() -> None:
    server, writes, crashes = FakeApiServer(), Writes(), Crashes(0, 60.0)
    uid = _post(server, "configmaps", "p", finalizers=["x/cleanup"])["metadata"]["uid"]
    asyncio.run(server.request("DELETE", "/api/v1/namespaces/ns/configmaps/p"))  # held by its finalizer
    crashes.times, crashes.delays = [5.0], [1.0]
    delete = _write(Call("make", KEY, 5.0), 5.0, "DELETE", "secrets ns/p-0")
    crashes.due(5.0, delete)
    crashes.crash(5.0, delete, "r2#1", uid)
    v = _check(server, writes, crashes)
    assert v is not None and v.invariant == "crash-safety" and v.trace == CREATE
    assert v.detail.startswith(f"the cleanup of ns/p (uid {uid[:8]}) by make never completed after a crash: r2#1 was killed at t=5.000")
    asyncio.run(server.request("PATCH", "/api/v1/namespaces/ns/configmaps/p", body={"metadata": {"finalizers": None}}, content_type="application/merge-patch+json"))
    assert _check(server, writes, crashes) is None  # it went: the cleanup completed


# -- world runs -------------------------------------------------------------------------------


def _registry(handler: Any) -> Registry:
    registry = Registry()
    registry.reconciler("configmaps", owns=["secrets"])(handler)
    return registry


def recorded(request: Any, client: Any, obj: Any) -> None:
    """A child with generateName, its name recorded by a second write (examples/buggy/crash.py)."""
    if obj is None or (obj["metadata"].get("annotations") or {}).get("child"):
        return
    child = {"metadata": {"generateName": f"{request.name}-", "namespace": request.namespace}}
    declop.set_controller_reference(child, obj)
    made = client.create("secrets", child)
    for attempt in range(5):
        try:
            client.patch("configmaps", request, {"metadata": {"annotations": {"child": made["metadata"]["name"]}}})
            return
        except ApiError:
            if attempt == 4:
                raise


def named(request: Any, client: Any, obj: Any) -> None:
    """The child named after its parent, found by the next reconcile (examples/buggy/crash_fixed.py)."""
    if obj is None:
        return
    child = {"metadata": {"name": f"{request.name}-child", "namespace": request.namespace}}
    declop.set_controller_reference(child, obj)
    try:
        client.create("secrets", child)
    except declop.Conflict:
        pass
    if (obj["metadata"].get("annotations") or {}).get("child") != "yes":
        client.patch("configmaps", request, {"metadata": {"annotations": {"child": "yes"}}})


def test_a_handler_that_records_its_child_in_a_second_write_fails_crash_safety_with_its_create_line() -> None:
    result = run(WORLD, 0, _registry(recorded))
    v = result.violations[0]
    assert v.invariant == "crash-safety", result.report()
    assert v.trace[-2].endswith("in recorded") and "client.create" in v.trace[-1]
    assert "right after write 1 of handler recorded for " in v.detail and "replicas killed between two writes" in result.writes


@pytest.mark.parametrize("seed", range(2))
def test_a_handler_that_finds_its_child_by_name_survives_its_crashes(seed: int) -> None:
    result = run(WORLD, seed, _registry(named))
    assert result.ok, result.report()
    assert "replicas killed between two writes of a reconcile: " in result.writes, result.writes


def test_without_the_fault_kind_no_replica_is_killed_and_the_schedule_draws_the_same_faults() -> None:
    kinds = tuple(k for k in simworld.WORLD_KINDS if k != CRASH_BETWEEN_WRITES)
    result = run(World(handlers="handlers.py", objects=40, duration=45.0, faults=(), kinds=kinds), 0, _registry(recorded))
    assert result.ok and "killed" not in result.writes, result.report()
    assert "--faults hang,fail,cut,slow,pause,crash,compact" in result.repro()
    for seed in range(20):  # the kind is never drawn as a fault: a seed's faults do not move
        assert simworld.schedule(World(), random.Random(seed)) == simworld.schedule(World(kinds=simworld.WORLD_FAULTS), random.Random(seed))
    assert simworld.schedule(World(kinds=(CRASH_BETWEEN_WRITES,)), random.Random(0)) == []


def test_the_built_in_world_kills_nobody_between_writes() -> None:
    result = run(World(objects=20, duration=10.0), 0)
    assert "killed" not in result.report()


def abandons(request: Any, client: Any, obj: Any, phase: Any) -> None:
    """A cleanup in two writes that refuses to run again once begun: killed between them, it never completes."""
    if obj is None or phase is not Phase.DELETING:
        return
    if (obj["metadata"].get("annotations") or {}).get("cleaning") == "yes":
        raise declop.TerminalError("a cleanup began before: not again")
    client.patch("configmaps", request, {"metadata": {"annotations": {"cleaning": "yes"}}})
    client.patch("configmaps", request, {"metadata": {"annotations": {"cleaned": "yes"}}})


def test_a_cleanup_that_a_crash_leaves_unfinished_for_ever_is_a_lost_cleanup() -> None:
    registry = Registry()
    registry.reconciler("configmaps", finalizer="sim.example.com/cleanup")(abandons)
    result = run(World(handlers="handlers.py", objects=40, duration=45.0, faults=(), kinds=(CRASH_BETWEEN_WRITES,)), 0, registry)
    v = result.violations[0]
    assert v.invariant == "crash-safety", result.report()
    assert " by abandons never completed after a crash: " in v.detail and "right after write 1 of handler abandons" in v.detail
    assert v.trace[-2].endswith("in abandons") and '"cleaning": "yes"' in v.trace[-1]
    # the object is still being deleted, too: its later cleanups end with TerminalError, so the
    # finalizers property names it (an object stuck without a failed cleanup would be I4's)
    assert any(x.invariant == "finalizers" for x in result.violations[1:]), result.report()
