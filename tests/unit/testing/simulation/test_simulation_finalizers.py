"""The finalizers property (declop.testing.simulation.finalizers): a cleanup runs to success under faults,
and the object goes away. The record of cleanup calls and the lost answers of deletes alone, then
world runs of a cleanup that fails when repeated and of one that does not."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

import declop
from declop.errors import ApiError, NotFound
from declop.kube.keys import Request
from declop.registry import Registry
from declop.testing.simulation import world as simworld
from declop.testing.simulation.finalizers import Cleanups, raised_frames
from declop.testing.simulation.world import World, run

FINALIZER = "example.com/release"
KEY = Request("ns-a", "w000")
#: long enough that the workload deletes objects whose records were made
WORLD = World(handlers="handlers.py", objects=40, duration=45.0, faults=())


def _parse(text: str) -> Any:
    return json.loads(text)  # the standard library raises beneath this line


def _read_config(text: str) -> Any:
    return _parse(text)


def _raised(fn: Any, *args: Any) -> BaseException:
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - the exception under test
        return exc
    raise AssertionError("did not raise")


def _terminating(uid: str, *finalizers: str, name: str = "w000") -> dict[str, Any]:
    meta = {"name": name, "namespace": "ns-a", "uid": uid, "finalizers": list(finalizers), "deletionTimestamp": "2027-01-15T08:00:00Z"}
    return {"metadata": meta}


# -- the record alone ------------------------------------------------------------------------


def test_raised_frames_keep_the_innermost_run_of_user_code_without_the_library_beneath() -> None:
    trace = raised_frames(_raised(_read_config, "{"))
    assert trace[-2].endswith("in _parse") and trace[-1] == "  return json.loads(text)  # the standard library raises beneath this line"
    assert trace[-4].endswith("in _read_config") and "test_simulation_finalizers.py" in trace[-2]
    assert all("json/" not in line for line in trace)
    assert len(raised_frames(_raised(_read_config, "{"), limit=1)) == 2


def test_only_deletes_lose_their_answer_drawn_from_the_seed() -> None:
    always = Cleanups(7, rate=1.0)
    assert {always.lose(m, "secrets ns-a/x") for m in ("POST", "PUT", "PATCH")} == {None}
    lost = always.lose("DELETE", "secrets ns-a/x")
    assert isinstance(lost, ApiError) and (lost.status, lost.reason) == (0, "Timeout") and "applied" in str(lost)
    assert always.lost == 1 and Cleanups(7, rate=0.0).lose("DELETE", "t") is None
    a, b = Cleanups(3), Cleanups(3)
    draws = [x.lose("DELETE", "t") is None for x in (a, b) for _ in range(200)]
    assert draws[:200] == draws[200:] and 10 < draws.count(False) < 80  # the same per seed; ~20%


def test_a_stuck_object_whose_last_cleanup_raised_is_reported_with_the_exception_and_its_line() -> None:
    c = Cleanups(0)
    c.ended(30.0, "release", KEY, "uid-a", NotFound("secrets ns-a/w000-record not found"))
    c.ended(31.0, "release", KEY, "uid-a", _raised(_read_config, "{"))
    c.ended(32.0, "release", Request("ns-a", "w001"), "uid-b", NotFound("x"))
    objects = [_terminating("uid-b", FINALIZER, name="w001"), _terminating("uid-a", FINALIZER, "other.io/keep")]
    v = c.stuck("configmaps", objects, {FINALIZER}, {"uid-a": 20.0, "uid-b": 25.0}, 120.0, 60.0)
    assert v is not None and v.invariant == "finalizers", v
    assert v.detail.startswith("configmaps ns-a/w000 (uid uid-a), deleted at t=20.000, is still being deleted 60.000 s after the faults healed")
    assert f"held by finalizer {FINALIZER}:" in v.detail and "other.io" not in v.detail  # only the handlers' own
    assert "its cleanup (release, DELETING) raised 2 time(s), the last at t=31.000: JSONDecodeError: Expecting" in v.detail
    assert "treat NotFound (404) of what it deletes as done" in v.detail and "(2 object(s) stuck in all)" in v.detail
    assert v.trace[-2].endswith("in _parse")  # the line the last attempt raised through
    assert c.failed == 3


def test_a_terminal_error_says_it_is_never_retried() -> None:
    c = Cleanups(0)
    c.ended(30.0, "release", KEY, "uid-a", declop.TerminalError("no"))
    v = c.stuck("configmaps", [_terminating("uid-a", FINALIZER)], {FINALIZER}, {}, 120.0, 60.0)
    assert v is not None and "ended with TerminalError, never retried" in v.detail and "TerminalError: no" in v.detail
    assert "deleted by someone else" in v.detail  # not one of the workload's deletes


def test_a_stuck_object_without_a_failed_cleanup_is_left_to_declop_s_invariant() -> None:
    c = Cleanups(0)
    c.ended(30.0, "release", KEY, "uid-a", NotFound("x"))
    c.returned(31.0, "", KEY, "uid-a")  # the last attempt returned: declop's to release (I4, I8)
    assert not c.failing("uid-a") and not c.failing("never-called") and not c.failing(None)
    objects = [_terminating("uid-a", FINALIZER), _terminating("never-called", FINALIZER)]
    assert c.stuck("configmaps", objects, {FINALIZER}, {}, 120.0, 60.0) is None
    c.ended(32.0, "release", KEY, "uid-c", NotFound("x"))
    held_by_another = [_terminating("uid-c", "other.io/keep")]
    assert c.stuck("configmaps", held_by_another, {FINALIZER}, {}, 120.0, 60.0) is None
    gone = [{"metadata": {"name": "w000", "namespace": "ns-a", "uid": "uid-c", "finalizers": [FINALIZER]}}]
    assert c.stuck("configmaps", gone, {FINALIZER}, {}, 120.0, 60.0) is None  # not being deleted


# -- world runs -------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def often(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small world deletes few objects: lose the answer of every handler delete."""
    monkeypatch.setattr(simworld, "Cleanups", functools.partial(Cleanups, rate=1.0))


def _record(request: Request) -> Request:
    return Request(request.namespace, f"{request.name}-record")


def _ensure(client: Any, request: Request) -> None:
    try:
        client.get("secrets", _record(request))
    except NotFound:
        try:
            client.create("secrets", {"metadata": {"name": _record(request).name, "namespace": request.namespace}})
        except declop.Conflict:
            pass


def strict(request: Any, client: Any, obj: Any, phase: Any) -> None:
    if obj is None:
        return
    if phase is declop.Phase.DELETING:
        client.get("secrets", _record(request))  # NotFound once an attempt deleted it
        client.delete("secrets", _record(request))
        return
    _ensure(client, request)


def tolerant(request: Any, client: Any, obj: Any, phase: Any) -> None:
    if obj is None:
        return
    if phase is declop.Phase.DELETING:
        client.delete("secrets", _record(request))  # NotFound is success
        return
    _ensure(client, request)


def _registry(handler: Any) -> Registry:
    registry = Registry()
    registry.reconciler("configmaps", finalizer=FINALIZER)(handler)
    return registry


def test_a_cleanup_that_fails_when_repeated_fails_finalizers_with_its_line_not_i4(monkeypatch: pytest.MonkeyPatch) -> None:
    result = run(WORLD, 1, _registry(strict))
    v = result.violations[0]
    assert v.invariant == "finalizers", result.report()
    assert "NotFound" in v.detail and f"held by finalizer {FINALIZER}" in v.detail
    assert v.trace[-2].endswith("in strict") and 'client.get("secrets", _record(request))' in v.trace[-1]
    assert not [x for x in result.violations if x.invariant == "I4"], result.report()
    # the lost answers are what found it: this seed's records were all made before their deletes
    monkeypatch.setattr(simworld, "Cleanups", functools.partial(Cleanups, rate=0.0))
    assert run(WORLD, 1, _registry(strict)).ok


def test_a_cleanup_that_treats_not_found_as_done_passes_though_every_delete_s_answer_is_lost() -> None:
    result = run(WORLD, 0, _registry(tolerant))
    assert result.ok, result.report()
    assert "handler deletes whose answer was lost: " in result.writes and "lost: 0;" not in result.writes, result.writes


def test_a_delete_whose_answer_is_lost_was_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    applied: list[str] = []
    lost: list[str] = []

    class Recording(simworld.FakeApiServer):
        async def request(self, method: str, path: str, **kw: Any) -> Any:
            out = await super().request(method, path, **kw)
            if method == "DELETE":
                applied.append(path)
            return out

    class Losing(Cleanups):
        def lose(self, method: str, target: str) -> ApiError | None:
            error = super().lose(method, target)
            if error is not None:
                assert applied and applied[-1] == target  # the apiserver applied it just before
                lost.append(target)
            return error

    monkeypatch.setattr(simworld, "FakeApiServer", Recording)
    monkeypatch.setattr(simworld, "Cleanups", functools.partial(Losing, rate=1.0))
    result = run(WORLD, 0, _registry(tolerant))
    assert lost and all("/secrets/" in p for p in lost), lost
    assert result.ok, result.report()
