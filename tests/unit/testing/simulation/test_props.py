"""Properties of the user's handlers (declop.testing.simulation.props) and the world runs that check
them (declop.testing.simulation.world): quiescence, idempotence, the bounds of a seed."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from declop.kube.keys import Request
from declop.registry import Registry
from declop.testing.simulation import world as simworld
from declop.testing.simulation.leases import Fault
from declop.testing.simulation.props import Call, Write, Writes, user_frames
from declop.testing.simulation.world import World, run

QUIET = World(handlers="handlers.py", objects=20, duration=10.0, faults=())
KEY = Request("ns-a", "w000")


def _frames() -> tuple[str, ...]:
    return user_frames()


def test_user_frames_are_the_innermost_run_of_user_code_innermost_last() -> None:
    trace = _frames()
    assert trace[-2].startswith('File "tests/unit/testing/simulation/test_props.py", line ') and trace[-2].endswith(", in _frames")
    assert trace[-1] == "  return user_frames()"
    assert trace[-4].endswith("in test_user_frames_are_the_innermost_run_of_user_code_innermost_last")
    assert not any("_pytest" in line or "pluggy" in line for line in trace)  # site-packages: not user code


def _write(at: float, key: Request = KEY, target: str = "configmaps ns-a/w000", changed: bool = True, extra: bool = False) -> Write:
    return Write(at, Call("stamp", key, at, extra), "PATCH", target, changed, ('File "h.py", line 9, in stamp', "  client.patch(...)"))


def test_quiescence_names_the_cycle_and_its_period_per_object() -> None:
    writes = Writes()
    for i in range(5):
        writes.note(_write(100.0 + 2 * i))
        writes.note(_write(101.0 + 4 * i, key=Request("ns-a", "w001"), target="configmaps ns-a/w001"))
    writes.note(_write(105.0, changed=False))
    v = writes.quiescence(120.0, 90.0, "the why")
    assert v.invariant == "quiescence" and v.detail.startswith("the why; the cycle: handler stamp → PATCH configmaps, the object itself")
    assert "10 time(s) on 2 object(s) since t=100.000, one every 3.000 virtual s per object" in v.detail
    assert v.trace == ('File "h.py", line 9, in stamp', "  client.patch(...)")
    assert writes.counts() == "handler writes: 10 changed something, 1 changed nothing"


def test_idempotence_reports_the_first_changing_write_of_the_extra_reconciles_only() -> None:
    writes = Writes()
    writes.note(_write(10.0))  # before the check: not its business
    writes.note(_write(50.0, changed=False, extra=True))
    assert writes.idempotence(60.0) is None
    writes.note(_write(51.0, target="secrets ns-a/w000-x7k2p", extra=True))
    v = writes.idempotence(60.0)
    assert v is not None and v.invariant == "idempotence"
    assert "sent PATCH secrets ns-a/w000-x7k2p at t=51.000, which changed it" in v.detail
    assert "1 write(s) that changed nothing, allowed" in v.detail


# -- world runs -------------------------------------------------------------------------------


def _registry(handler: Any, **options: Any) -> Registry:
    registry = Registry()
    registry.reconciler("configmaps", **options)(handler)
    return registry


def hot(request: Any, client: Any, obj: Any) -> None:
    if obj is not None:
        n = int((obj["metadata"].get("annotations") or {}).get("n", "0"))
        client.patch("configmaps", request, {"metadata": {"annotations": {"n": str(n + 1)}}})


async def hot_async(request: Any, client: Any, obj: Any) -> None:
    if obj is not None:
        n = int((obj["metadata"].get("annotations") or {}).get("n", "0"))
        await client.patch("configmaps", request, {"metadata": {"annotations": {"n": str(n + 1)}}})


@pytest.mark.parametrize("handler", [hot, hot_async], ids=["def", "async def"])
def test_a_hot_loop_fails_quiescence_after_the_bound_in_virtual_time(handler: Any) -> None:
    """A plain handler used to take no virtual time (its waiter came back through
    call_soon_threadsafe at once): this one ran for ever at one instant."""
    result = run(QUIET, 0, _registry(handler))
    assert result.ended == "quiescence", result.report()
    (v,) = result.violations
    calm = simworld.calm(QUIET, [])
    assert v.invariant == "quiescence" and v.at >= calm + 4 * QUIET.lease_duration
    assert "→ PATCH configmaps, the object itself, changing it → event →" in v.detail
    assert v.trace[-2].endswith(f"in {handler.__name__}") and "client.patch" in v.trace[-1]


def test_a_run_that_never_quiets_ends_at_its_step_bound_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simworld, "STEPS_PER_REPLICA", 1)
    monkeypatch.setattr(simworld, "STEPS_PER_OBJECT", 0.5)
    result = run(QUIET, 0, _registry(hot))
    assert result.ended == "steps" and result.bounds is not None
    assert result.steps >= result.bounds.steps
    assert "the step bound" in result.violations[0].detail and result.violations[0].invariant == "quiescence"
    assert f"ended: steps, at {result.steps:,} of {result.bounds.steps:,} steps" in result.report()


def child_per_call(request: Any, client: Any, obj: Any) -> None:
    if obj is None:
        return
    owner = [{"apiVersion": "v1", "kind": "ConfigMap", "name": request.name, "uid": obj["metadata"]["uid"]}]  # ownership holds
    client.create("secrets", {"metadata": {"generateName": f"{request.name}-", "namespace": request.namespace, "ownerReferences": owner}})


def test_a_child_per_reconcile_fails_idempotence_with_its_line() -> None:
    result = run(QUIET, 0, _registry(child_per_call))
    assert result.ended == "end"
    (v,) = result.violations
    assert v.invariant == "idempotence" and "sent POST secrets ns-" in v.detail
    assert v.trace[-2].endswith("in child_per_call") and "client.create" in v.trace[-1]


def same_annotation(request: Any, client: Any, obj: Any) -> None:
    if obj is not None:
        client.patch("configmaps", request, {"metadata": {"annotations": {"seen": "yes"}}})


def test_writes_that_change_nothing_are_allowed_and_counted() -> None:
    result = run(QUIET, 0, _registry(same_annotation))
    assert result.ok, result.report()
    changed, unchanged = (int(n) for n in result.writes.removeprefix("handler writes: ").replace(" changed something", "").replace(" changed nothing", "").split(", "))
    assert changed >= 1 and unchanged >= 20  # the idempotence check's reconciles at least
    assert "ended: end" in result.report()


def noted(request: Any, client: Any, obj: Any) -> None:
    if obj is not None and (obj["metadata"].get("labels") or {}).get("seen") != "yes":
        client.patch("configmaps", request, {"metadata": {"labels": {"seen": "yes"}}})


def test_objects_outside_the_handlers_namespaces_are_not_owed_a_reconcile() -> None:
    world = dataclasses.replace(QUIET, faults=(Fault(3.0, "crash", 0, 2.0),))
    result = run(world, 0, _registry(noted, namespaces=["default"]))
    assert result.ok, result.report()


def test_a_daemon_s_periodic_writes_are_neither_a_hot_loop_nor_a_non_idempotent_reconcile() -> None:
    import asyncio

    registry = Registry()

    @registry.daemon("configmaps", stop_timeout=1.0)
    async def beat(request: Any, stop: asyncio.Event, client: Any) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            await client.patch("configmaps", request, {"metadata": {"annotations": {"beat": str(n)}}})
            try:
                await asyncio.wait_for(stop.wait(), 5.0)
            except asyncio.TimeoutError:
                pass

    result = run(QUIET, 0, registry)
    assert result.ok, result.report()
    assert result.writes == "handler writes: 0 changed something, 0 changed nothing"
    assert result.bounds is not None and result.steps < result.bounds.steps
